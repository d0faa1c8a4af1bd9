"""What the kubelet's pod resources API said, as plain data.

:func:`view_from` turns the answers of ``v1.PodResourcesLister`` (``List`` and
``GetAllocatableResources``) into a :class:`KubeletView`: the CPUs the kubelet may hand
out exclusively, the containers holding devices (:class:`Holder`), the other exclusive
containers, and the memory per NUMA node. The plugin's live counts
(:mod:`numa_device_plugin.plugin.counts.capacity`) and its pages read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2


class Holder(NamedTuple):
    """One container as ``List()`` reports it: its exclusive ``cpus`` (CPU ids; empty
    for shared-pool containers), ``devices`` (resource name -> device ids) and
    ``memory`` ((NUMA node, memory type) -> bytes of its memory blocks naming the
    node, Memory Manager ``Static``).
    A named tuple: a poll builds one per container, so it must be cheap."""

    namespace: str
    pod: str
    container: str
    cpus: frozenset[int]
    devices: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    memory: Mapping[tuple[int, str], int] = MappingProxyType({})


@dataclass(frozen=True)
class KubeletView:
    """What the pod resources API said at one moment.

    ``allocatable_cpus``: ``GetAllocatableResources().cpu_ids`` (empty unless the
    CPU manager policy is ``static``); ``holders``: the containers of ``List()``
    that hold devices (others may be listed too); ``foreign_cpus``: exclusive CPUs
    of the containers left out of ``holders``; ``others``: those containers that have
    exclusive CPUs, as holders without devices (the node page names them); ``memory``:
    per NUMA node id and memory type (``memory``, ``hugepages-2Mi``...), allocatable
    bytes (only under the Memory Manager's ``Static`` policy; empty otherwise);
    ``assigned_memory``:
    the same shape, the bytes of every container's memory blocks (a block naming
    several NUMA nodes counts in full on each).
    """

    allocatable_cpus: frozenset[int]
    holders: tuple[Holder, ...] = ()
    memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    foreign_cpus: frozenset[int] = frozenset()
    assigned_memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    others: tuple[Holder, ...] = ()

    @cached_property
    def assigned_cpus(self) -> frozenset[int]:
        """Every exclusive CPU assigned to any container."""
        return self.foreign_cpus.union(*(holder.cpus for holder in self.holders))

    @property
    def cpu_manager_static(self) -> bool:
        """False when the kubelet hands out no exclusive CPUs (CPU manager ``none``)."""
        return bool(self.allocatable_cpus)


def view_from(
    pods: pr_pb2.ListPodResourcesResponse, allocatable: pr_pb2.AllocatableResourcesResponse
) -> KubeletView:
    """The :class:`KubeletView` of a ``List`` and a ``GetAllocatableResources`` answer."""
    holders = []
    others = []
    foreign: set[int] = set()
    assigned: dict[int, dict[str, int]] = {}
    for pod in pods.pod_resources:
        for container in pod.containers:
            own: dict[tuple[int, str], int] = {}
            for block in container.memory:
                for node in block.topology.nodes:
                    key = (node.ID, block.memory_type)
                    own[key] = own.get(key, 0) + block.size
                    per_type = assigned.setdefault(node.ID, {})
                    per_type[block.memory_type] = per_type.get(block.memory_type, 0) + block.size
            cpus = frozenset(container.cpu_ids)
            if not container.devices:
                if cpus:  # an exclusive container without devices: named on the node page
                    foreign.update(cpus)
                    others.append(Holder(pod.namespace, pod.name, container.name, cpus))
                continue
            listed: dict[str, list[str]] = {}
            for entry in container.devices:  # one list per name: linear in the entries
                listed.setdefault(entry.resource_name, []).extend(entry.device_ids)
            devices = {name: tuple(ids) for name, ids in listed.items()}
            held: Mapping[tuple[int, str], int] = own or MappingProxyType({})
            holders.append(Holder(pod.namespace, pod.name, container.name, cpus, devices, held))
    memory: dict[int, dict[str, int]] = {}
    for block in allocatable.memory:
        for node in block.topology.nodes:
            per_type = memory.setdefault(node.ID, {})
            per_type[block.memory_type] = per_type.get(block.memory_type, 0) + block.size
    return KubeletView(
        allocatable_cpus=frozenset(allocatable.cpu_ids),
        holders=tuple(holders),
        memory=memory,
        foreign_cpus=frozenset(foreign),
        assigned_memory=assigned,
        others=tuple(others),
    )
