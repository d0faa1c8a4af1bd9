"""What one answer of the kubelet's pod resources API calls for (pure, thread-safe):
each resource's device list, the held ids it never advertises, and the recorder's
figures. :class:`~numa_device_plugin.plugin.counts.poller.CapacityPoller` computes it off the
event loop and publishes it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.advertised.lost import with_left_behind
from numa_device_plugin.plugin.counts.capacity import (
    assigned_memory,
    live_resource_devices,
    node_capacity,
)
from numa_device_plugin.plugin.counts.exposure import Exposure, choose, expose, rooms_for
from numa_device_plugin.plugin.counts.held import admissible, foreign_devices, held_devices
from numa_device_plugin.plugin.counts.pending import Allocation, with_allocations
from numa_device_plugin.plugin.model.figures import NodeCapacity
from numa_device_plugin.plugin.model.resources import Device, Resource
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.memory import MEMORY


@dataclass(frozen=True)
class Planned:
    """What one answer of the pod resources API calls for: per resource its device
    list and the held ids it never advertises, the recorder's figures, and per resource
    over several NUMA nodes the node it exposes (:mod:`.exposure`)."""

    lists: Mapping[str, tuple[tuple[Device, ...], set[str]]]
    capacities: list[NodeCapacity]
    memory: Mapping[int, Mapping[str, int]]
    assigned_memory: Mapping[tuple[int, str, str], int]
    exposures: Mapping[str, Exposure] = field(default_factory=dict)


def plan(
    config: Config,
    catalog: Catalog,
    view: KubeletView | None,
    resources: Mapping[str, Resource],
    previous: Mapping[str, int] | None = None,
    allocations: Iterable[Allocation] = (),
) -> Planned:
    """Pure (thread-safe): each resource's device list and foreign held ids, and the
    figures the recorder takes, for ``view`` with ``allocations`` (answered, not listed
    yet: :mod:`.pending`) counted; ``previous``: the node each resource over several
    NUMA nodes exposed so far (kept unless another has strictly more room)."""
    view = with_allocations(view, allocations, resources, catalog.node_cpus, config.cpus_mode)
    lists: dict[str, tuple[tuple[Device, ...], set[str]]] = {}
    known = catalog.discovery.plans if catalog.discovery is not None else ()
    nodes = frozenset(p.node.id for p in known)  # ids held elsewhere are listed on these only
    for name, resource in resources.items():
        ours = {
            node_id: admissible(config.capacity, resource, node_id, catalog.node_cpus(node_id))
            for node_id in resource.node_ids
        }
        devices = with_left_behind(resource, live_resource_devices(
            config.capacity,
            resource,
            catalog.node_cpus,
            view,
            reserved_cpus=config.reserved_cpus,
            allow_unaligned=config.allow_unaligned,
        ), view, nodes)  # fmt: skip
        listed = {device.id for device in devices}
        lists[name] = (devices, foreign_devices(view, name, resource.node_ids, ours) - listed)
    exposures = _expose(config, catalog, view, resources, previous or {}, lists)
    return Planned(
        lists,
        node_capacities(config, catalog, view, resources, lambda name: lists[name][0]),
        view.memory if view is not None else {},
        assigned_memory(view, resources),
        exposures,
    )


def _expose(
    config: Config,
    catalog: Catalog,
    view: KubeletView | None,
    resources: Mapping[str, Resource],
    previous: Mapping[str, int],
    lists: dict[str, tuple[tuple[Device, ...], set[str]]],
) -> dict[str, Exposure]:
    """Choose the exposed node of each CPU resource over several NUMA nodes, then offer
    only that node's free devices in its list and in those of its memory resources
    (``lists`` changed in place)."""
    spanning = [r for r in resources.values() if r.spans]
    if not spanning:
        return {}
    nodes = sorted({node for r in spanning for node in r.node_ids})
    cpus = {node: free_cpus(config, view, catalog.node_cpus(node)) for node in nodes}
    memory = free_memory(view, nodes) if config.memory_unit is not None else {}
    exposures: dict[str, Exposure] = {}
    for resource in spanning:
        if resource.memory is None:
            rooms = rooms_for(resource.node_ids, cpus, memory)
            exposures[resource.name] = choose(resource.name, rooms, previous.get(resource.name))
    for resource in spanning:
        base = exposures.get(resource.follows or resource.name)
        if base is None:
            continue
        devices, foreign = lists[resource.name]
        held = frozenset(
            device_id
            for node in resource.node_ids
            for device_id in held_devices(view, resource.name, node)
        )
        lists[resource.name] = (expose(devices, base.node_id, held), foreign)
    return exposures


def free_cpus(config: Config, view: KubeletView | None, node_cpus: frozenset[int]) -> int:
    """A NUMA node's free exclusive CPUs (``node_cpus``: its usable CPUs), counted as
    ``cpus`` mode counts them (:func:`~.capacity.live_devices`): the kubelet's
    allocatable CPUs of the node that no container has; without the API, or when the
    CPU manager is not static, the node's CPUs minus ``--reserved-cpus``."""
    if view is None or not view.cpu_manager_static:
        allocatable = node_cpus - config.reserved_cpus
    else:
        allocatable = view.allocatable_cpus & node_cpus
    assigned = frozenset() if view is None else view.assigned_cpus
    return len(allocatable - assigned)


def free_memory(view: KubeletView | None, nodes: Iterable[int]) -> dict[int, int]:
    """Per NUMA node of ``nodes``, bytes of regular memory the Memory Manager lists as
    allocatable and not assigned (0 when it lists none, or assigned more)."""
    if view is None:
        return {}
    return {
        node: max(
            0,
            view.memory.get(node, {}).get(MEMORY, 0)
            - view.assigned_memory.get(node, {}).get(MEMORY, 0),
        )
        for node in nodes
    }


def node_capacities(
    config: Config,
    catalog: Catalog,
    view: KubeletView | None,
    resources: Mapping[str, Resource],
    devices: Callable[[str], tuple[Device, ...]],
) -> list[NodeCapacity]:
    """Per advertised NUMA node its figures (:func:`node_capacity`), each resource's
    devices given by ``devices(name)``; holders of a resource that follows a device
    count for the node of the device they hold."""
    near = [r for r in resources.values() if r.memory is None and not r.node_own]
    return [
        node_capacity(
            name,
            resource.node_id,
            catalog.node_cpus(resource.node_id),
            devices(name),
            view,
            config.reserved_cpus,
            related=[r.name for r in near if resource.node_id in r.near_nodes],
        )
        for name, resource in resources.items()
        if resource.memory is None and resource.node_own
    ]
