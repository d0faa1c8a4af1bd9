"""``numa-device-plugin status``: who holds which NUMA node, from the kubelet's view.

Reads the kubelet's pod resources API (``v1.PodResourcesLister``: ``List`` and
``GetAllocatableResources`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``)
and this node's topology from sysfs, and reports per advertised NUMA node:
capacity, allocatable and allocated slots, and each container holding one,
with the exclusive CPUs the kubelet gave it and whether they lie on that NUMA
node. A container whose CPUs are elsewhere, or that has no exclusive CPUs at
all, is flagged: the Topology Manager did not align it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from numa_device_plugin import sysfs
from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.manager import Discovery
from numa_device_plugin.registration import FRESH_CONNECTION

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class StatusError(Exception):
    """The pod resources API could not be read; the message says why."""


async def fetch(
    socket: Path, timeout: float = 5.0
) -> tuple[pr_pb2.ListPodResourcesResponse, pr_pb2.AllocatableResourcesResponse]:
    """List and GetAllocatableResources from the kubelet at ``socket`` (seconds).

    Raises :class:`StatusError` naming the socket and the gRPC status.
    """
    target = f"unix://{socket}"
    async with grpc.aio.insecure_channel(target, options=FRESH_CONNECTION) as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)
        try:
            pods = await stub.List(pr_pb2.ListPodResourcesRequest(), timeout=timeout)
            allocatable = await stub.GetAllocatableResources(
                pr_pb2.AllocatableResourcesRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise StatusError(
                f"cannot read the pod resources API at {socket}: {exc.code().name}: {exc.details()}"
            ) from exc
    return pods, allocatable


def build_status(
    discovery: Discovery,
    capacity: int,
    pods: pr_pb2.ListPodResourcesResponse,
    allocatable: pr_pb2.AllocatableResourcesResponse,
) -> dict[str, Any]:
    """The status document: ``{"nodes": [{"id", "resource", "cpus", "capacity",
    "allocatable", "allocated", "holders": [{"namespace", "pod", "container",
    "devices", "cpus", "aligned", "problem"}]}], "misaligned": int}``; pure."""
    free = Counter(entry.resource_name for entry in allocatable.devices for _ in entry.device_ids)
    nodes = []
    misaligned = 0
    for name, resource in discovery.resources.items():
        node_cpus = next(p.node.cpus for p in discovery.plans if p.node.id == resource.node_id)
        holders: list[dict[str, Any]] = []
        held: set[str] = set()  # init containers hand their devices on: count each once
        for pod in pods.pod_resources:
            for container in pod.containers:
                ids = [
                    i for d in container.devices if d.resource_name == name for i in d.device_ids
                ]
                if not ids:
                    continue
                cpus = set(container.cpu_ids)
                if not cpus:
                    aligned = False
                    problem: str | None = "no exclusive CPUs (not Guaranteed with integer CPUs?)"
                elif cpus <= node_cpus:
                    aligned, problem = True, None
                else:
                    outside = sysfs.format_cpulist(cpus - node_cpus)
                    aligned = False
                    problem = f"CPUs {outside} are not on NUMA node {resource.node_id}"
                misaligned += 0 if aligned else 1
                held.update(ids)
                holders.append(
                    {
                        "namespace": pod.namespace,
                        "pod": pod.name,
                        "container": container.name,
                        "devices": ids,
                        "cpus": sysfs.format_cpulist(cpus),
                        "aligned": aligned,
                        "problem": problem,
                    }
                )
        nodes.append(
            {
                "id": resource.node_id,
                "resource": name,
                "cpus": sysfs.format_cpulist(node_cpus),
                "capacity": capacity,
                "allocatable": free.get(name, 0),
                "allocated": len(held),
                "holders": holders,
            }
        )
    return {"nodes": nodes, "misaligned": misaligned}


def render_table(document: dict[str, Any]) -> str:
    """The status document as text: a line per NUMA node, then its holders."""
    lines = []
    for node in document["nodes"]:
        lines.append(
            f"NUMA node {node['id']} ({node['resource']}, CPUs {node['cpus']}): "
            f"capacity {node['capacity']}, allocatable {node['allocatable']}, "
            f"allocated {node['allocated']}"
        )
        for holder in node["holders"]:
            flag = "aligned" if holder["aligned"] else f"MISALIGNED: {holder['problem']}"
            lines.append(
                f"  {holder['namespace']}/{holder['pod']} {holder['container']}: "
                f"{len(holder['devices'])} slot(s), CPUs {holder['cpus'] or '-'}, {flag}"
            )
        if not node["holders"]:
            lines.append("  (no pod holds this NUMA node)")
    lines.append(f"misaligned containers: {document['misaligned']}")
    return "\n".join(lines)
