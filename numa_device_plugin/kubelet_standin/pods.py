"""The stand-in's pod model, shared by its device-manager and pod-resources sides.

What the kubelet's pod resources API reports comes from here: the pods placed with
:meth:`Pods.add`, their containers' exclusive CPUs and devices, and what the
kubelet's managers may hand out. ``GetAllocatableResources().cpu_ids`` are
``allocatable_cpus`` (every CPU minus the reserved set) under ``cpu_manager_policy``
``static``, and empty under ``none``, as the kubelet's CPU manager reports them;
``memory`` lists ``allocatable_memory`` per NUMA node and memory type, and ``List``
gives each container's memory blocks, under ``memory_manager_policy`` ``Static``;
under ``None`` both are empty, as the kubelet's Memory Manager reports them.
``devices`` are the healthy devices of every plugin whose stream is open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.plugin.model.resources import HEALTHY

# A container as a test places it: name, {resource: device ids}, exclusive CPU ids and,
# optionally, its memory blocks (memory type, bytes, NUMA node ids).
MemoryBlock = tuple[str, int, Sequence[int]]
Container = tuple[Any, ...]


def _topology(nodes: Sequence[int]) -> pr_pb2.TopologyInfo:
    return pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n) for n in nodes])


class Pods:
    """The pods on the node and what the kubelet may hand out.

    ``devices(resource)`` gives the device list a plugin reported for ``resource``
    (for the topology of held devices); ``healthy()`` the open resources' device
    lists, ``{resource: devices}``.
    """

    def __init__(
        self,
        devices: Callable[[str], Sequence[api_pb2.Device]],
        healthy: Callable[[], Mapping[str, Sequence[api_pb2.Device]]],
        *,
        allocatable_cpus: Sequence[int] = (),
        cpu_manager_policy: str = "static",
        allocatable_memory: Mapping[int, int | Mapping[str, int]] | None = None,
        memory_manager_policy: str = "Static",
    ) -> None:
        self._devices = devices
        self._healthy = healthy
        self.pods: list[pr_pb2.PodResources] = []
        self.allocatable_cpus = list(allocatable_cpus)
        self.cpu_manager_policy = cpu_manager_policy
        # NUMA node -> memory type -> bytes (a bare number: the type "memory").
        self.allocatable_memory: dict[int, dict[str, int]] = {
            node: dict(value) if isinstance(value, Mapping) else {"memory": value}
            for node, value in (allocatable_memory or {}).items()
        }
        self.memory_manager_policy = memory_manager_policy

    def add(
        self,
        namespace: str,
        name: str,
        containers: Sequence[Container],
    ) -> None:
        """Place a pod: per container its name, ``{resource: device ids}``, exclusive
        CPU ids and, optionally, memory blocks ``(type, bytes, NUMA nodes)``. Device
        topology is taken from what the plugins reported."""
        pod = pr_pb2.PodResources(name=name, namespace=namespace)
        for container_name, devices, cpus, *rest in containers:
            container = pod.containers.add(name=container_name, cpu_ids=list(cpus))
            blocks: Sequence[MemoryBlock] = rest[0] if rest else ()
            for memory_type, size, nodes in blocks:
                container.memory.add(memory_type=memory_type, size=size, topology=_topology(nodes))
            for resource, ids in devices.items():
                nodes = sorted(
                    {
                        node.ID
                        for device in self._devices(resource)
                        if device.ID in ids
                        for node in device.topology.nodes
                    }
                )
                container.devices.add(
                    resource_name=resource, device_ids=ids, topology=_topology(nodes)
                )
        self.pods.append(pod)

    def listed(self) -> list[pr_pb2.PodResources]:
        """The pods as ``List`` gives them: without memory blocks unless the Memory
        Manager's policy is ``Static``."""
        if self.memory_manager_policy == "Static":
            return self.pods
        bare = []
        for pod in self.pods:
            copy = pr_pb2.PodResources()
            copy.CopyFrom(pod)
            for container in copy.containers:
                del container.memory[:]
            bare.append(copy)
        return bare

    def remove(self, namespace: str, name: str) -> None:
        """The pod is gone: its containers no longer hold devices or CPUs."""
        self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def find(self, namespace: str, name: str) -> pr_pb2.PodResources | None:
        for pod in self.pods:
            if (pod.namespace, pod.name) == (namespace, name):
                return pod
        return None

    def allocatable_resources(self) -> pr_pb2.AllocatableResourcesResponse:
        """As the kubelet: every healthy device of every registered plugin, with its
        topology, and the CPUs and memory its managers may hand out."""
        cpus = self.allocatable_cpus if self.cpu_manager_policy == "static" else []
        response = pr_pb2.AllocatableResourcesResponse(cpu_ids=cpus)
        if self.memory_manager_policy == "Static":
            for node, per_type in sorted(self.allocatable_memory.items()):
                for memory_type, size in sorted(per_type.items()):
                    response.memory.add(
                        memory_type=memory_type, size=size, topology=_topology([node])
                    )
        for resource, devices in sorted(self._healthy().items()):
            for device in devices:
                if device.health == HEALTHY:
                    response.devices.add(
                        resource_name=resource,
                        device_ids=[device.ID],
                        topology=_topology([n.ID for n in device.topology.nodes]),
                    )
        return response
