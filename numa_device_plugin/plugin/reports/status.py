"""``numa-device-plugin status``: who holds which NUMA node, from the kubelet's view.

Reads the kubelet's pod resources API (``v1.PodResourcesLister``: ``List`` and
``GetAllocatableResources`` on ``pod-resources/kubelet.sock`` beside the
device-plugin folder) and this node's topology from sysfs, and reports per
advertised NUMA node: capacity, allocatable and allocated devices; the CPUs the
kubelet may hand out exclusively there, how many are assigned to containers
holding the node's resource (ours) or not (others), and how many are free; the
memory the Memory Manager reports there; and each container holding the
resource, with the exclusive CPUs the kubelet gave it and whether they lie on
that NUMA node. A container whose CPUs are elsewhere, or that has no exclusive
CPUs at all, is flagged: the Topology Manager did not align it. In ``cpus``
mode a container holding a different number of devices than exclusive CPUs is
flagged too: the live count assumes a pod asks as many devices as CPUs. With
``--memory-unit``, each memory resource gets its line: devices, free units, the
bytes allocatable and assigned, and its holders, MISCOUNTED when their devices are
not their memory divided by the unit.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.kubelet.view import KubeletView, view_from
from numa_device_plugin.ops.bounded import one_line
from numa_device_plugin.plugin.advertised.discovery import Discovery
from numa_device_plugin.plugin.counts.capacity import live_devices, misalignment, node_capacity
from numa_device_plugin.plugin.counts.exposure import Room, choose
from numa_device_plugin.plugin.counts.planning import free_cpus
from numa_device_plugin.plugin.model.ids import device_index
from numa_device_plugin.plugin.model.resources import CPUS, Resource
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.memory import format_quantity


def build_status(
    discovery: Discovery,
    config: Config,
    pods: pr_pb2.ListPodResourcesResponse,
    allocatable: pr_pb2.AllocatableResourcesResponse,
) -> dict[str, Any]:
    """The status document; pure.

    ``{"nodes": [{"id", "resource", "cpus", "capacity", "allocatable",
    "allocated", "allocatable_cpus", "assigned_cpus": {"ours", "others"},
    "free_cpus", "memory": {type: bytes} | null, "holders": [{"namespace",
    "pod", "container", "devices", "cpus", "aligned", "problem"}], "near"}], "memory":
    [:func:`memory_status`], "exposed": {resource: {"offered", "most_room", "why"}},
    "misaligned": int, "miscounted": int,
    "cpu_manager_static": bool, "memory_manager_static": bool}``.
    A resource that follows a device has an entry per NUMA node it covers (``near``:
    its ``NAME=SELECTOR``; null for the others), each with its devices and holders there.
    ``capacity`` is the plugin's device count for the node (the slots, or in
    ``cpus`` mode its allocatable CPUs); ``allocatable`` the healthy devices the
    kubelet lists; ``allocated`` distinct held devices (an init container's device
    handed on to an app container counts once).
    """
    view = view_from(pods, allocatable)
    free = Counter(entry.resource_name for entry in allocatable.devices for _ in entry.device_ids)
    free_ids: dict[str, list[str]] = {}
    for device_entry in allocatable.devices:
        free_ids.setdefault(device_entry.resource_name, []).extend(device_entry.device_ids)
    nodes = []
    misaligned = miscounted = 0
    memory = []
    exposed = {}
    for name, resource in discovery.resources.items():
        if resource.spans and resource.memory is None:
            exposed[name] = _exposed(config, discovery, view, resource, free_ids.get(name, []))
        if resource.memory is not None:
            for part in resource.parts or (resource,):
                on_part = sum(1 for i in free_ids.get(name, ()) if device_index(i, part.node_id)
                              is not None)  # fmt: skip
                entry = memory_status(part, view, on_part if resource.parts else free.get(name, 0))
                miscounted += sum(1 for h in entry["holders"] if h["problem"] is not None)
                memory.append(entry)
            continue
        for node_id in resource.node_ids:
            entry, bad, counted = _node_status(discovery, config, view, resource, node_id)
            listed = free_ids.get(name, ())
            entry["allocatable"] = sum(1 for i in listed if device_index(i, node_id) is not None)
            nodes.append(entry)
            misaligned += bad
            miscounted += counted
    return {
        "nodes": nodes,
        "memory": memory,
        "exposed": exposed,
        "misaligned": misaligned,
        "miscounted": miscounted,
        "cpu_manager_static": view.cpu_manager_static,
        "memory_manager_static": bool(view.memory),
    }


def _exposed(
    config: Config, discovery: Discovery, view: KubeletView, resource: Resource, listed: list[str]
) -> dict[str, Any]:
    """A resource over several NUMA nodes: ``offered``, the nodes whose free devices the
    kubelet lists as allocatable (one: the exposed node; its held devices aside), and the
    node the rule gives the most room now (``most_room``, ``why``: what the plugin
    exposes unless it keeps an equal node)."""
    held = {i for holder in view.holders for i in holder.devices.get(resource.name, ())}
    offered = sorted(
        {node for i in listed if i not in held for node in resource.node_ids
         if device_index(i, node) is not None}
    )  # fmt: skip
    rooms = [
        Room(node, free_cpus(config, view, discovery_cpus(discovery, node)))
        for node in resource.node_ids
    ]
    best = choose(resource.name, rooms, None)
    return {"offered": offered, "most_room": best.node_id, "why": best.why}


def discovery_cpus(discovery: Discovery, node_id: int) -> frozenset[int]:
    """NUMA node ``node_id``'s usable CPUs in ``discovery``."""
    return next(p.node.cpus for p in discovery.plans if p.node.id == node_id)


def _node_status(
    discovery: Discovery, config: Config, view: KubeletView, resource: Resource, node_id: int
) -> tuple[dict[str, Any], int, int]:
    """One CPU resource's entry on NUMA node ``node_id`` (a resource that follows a device
    has one per node it covers: its devices and holders there), with the counts of
    misaligned and miscounted holders."""
    name = resource.name
    misaligned = miscounted = 0
    node_cpus = discovery_cpus(discovery, node_id)
    devices = live_devices(
        config.capacity, node_id, node_cpus, name, resource.devices_on(node_id), view,
        reserved_cpus=config.reserved_cpus, allow_unaligned=True,
    )  # fmt: skip
    figures = node_capacity(name, node_id, node_cpus, devices, view)
    holders: list[dict[str, Any]] = []
    for holder in view.holders:
        ids = [i for i in holder.devices.get(name, ()) if device_index(i, node_id) is not None]
        if not ids:
            continue
        problem = misalignment(holder, node_id, node_cpus)
        misaligned += problem is not None
        aligned = problem is None
        if config.capacity == CPUS and holder.cpus and len(ids) != len(holder.cpus):
            miscounted += 1
            count = (
                f"{len(ids)} device(s) for {len(holder.cpus)} exclusive CPUs: with "
                "--capacity cpus a container asks as many devices as CPUs"
            )
            problem = count if problem is None else f"{problem}; {count}"
        holders.append(
            {
                "namespace": holder.namespace,
                "pod": holder.pod,
                "container": holder.container,
                "devices": ids,
                "cpus": sysfs.format_cpulist(holder.cpus),
                "aligned": aligned,
                "problem": problem,
            }
        )
    entry = {
        "id": node_id,
        "resource": name,
        "cpus": sysfs.format_cpulist(node_cpus),
        "capacity": len(devices),
        "allocatable": 0,
        "allocated": sum(1 for i in figures.held if device_index(i, node_id) is not None),
        "allocatable_cpus": len(figures.allocatable_cpus),
        "assigned_cpus": {
            "ours": len(figures.assigned_ours),
            "others": len(figures.assigned_other),
        },
        "free_cpus": figures.free_cpus,
        "memory": dict(view.memory[node_id]) if node_id in view.memory else None,
        "holders": holders,
        "near": None if resource.near is None else str(resource.near),
    }
    return entry, misaligned, miscounted


def memory_status(resource: Resource, view: KubeletView, allocatable: int) -> dict[str, Any]:
    """One memory resource's entry: ``{"id", "resource", "memory_type", "unit",
    "capacity", "allocatable", "allocated", "allocatable_bytes", "assigned_bytes":
    {"ours", "others"}, "free_units", "holders": [{"namespace", "pod", "container",
    "devices", "bytes", "problem"}]}`` (bytes; ``free_units``: whole units no container
    has, the count the plugin keeps Healthy beside the held ones). A holder whose
    device count is not its memory blocks on the node divided by the unit (rounded
    up) is MISCOUNTED: the live count assumes a pod asks as many units as it requests."""
    pool = resource.memory
    assert pool is not None
    node, kind = resource.node_id, pool.memory_type
    total = view.memory.get(node, {}).get(kind, 0)
    assigned = view.assigned_memory.get(node, {}).get(kind, 0)
    held: set[str] = set()
    ours = 0
    holders = []
    for holder in view.holders:
        ids = list(holder.devices.get(resource.name, ()))
        if not ids:
            continue
        held.update(ids)
        size = holder.memory.get((node, kind), 0)
        ours += size
        units = -(-size // pool.unit)
        problem = None
        if units != len(ids):
            problem = (
                f"{len(ids)} device(s) for {size} bytes of {kind} on NUMA node {node}: a "
                f"container asks one device per {pool.unit} bytes ({units})"
            )
        holders.append(
            {"namespace": holder.namespace, "pod": holder.pod, "container": holder.container,
             "devices": ids, "bytes": size, "problem": problem}
        )  # fmt: skip
    return {
        "id": node,
        "resource": resource.name,
        "memory_type": kind,
        "unit": pool.unit,
        "capacity": len(resource.devices),
        "allocatable": allocatable,
        "allocated": len(held),
        "allocatable_bytes": total,
        "assigned_bytes": {"ours": ours, "others": assigned - ours},
        "free_units": max(0, total - assigned) // pool.unit,
        "holders": holders,
    }


def render_table(document: dict[str, Any]) -> str:
    """The status document as text: a line per NUMA node, its CPUs, then its holders."""
    lines = []
    if not document["cpu_manager_static"]:
        lines.append(
            "the kubelet lists no allocatable CPUs: its CPU manager policy is not static, "
            "so nothing is aligned"
        )
    for node in document["nodes"]:
        near = f" near {node['near'].partition('=')[2]}" if node.get("near") else ""
        lines.append(
            f"NUMA node {node['id']} ({node['resource']}{near}, CPUs {node['cpus']}): "
            f"capacity {node['capacity']}, allocatable {node['allocatable']}, "
            f"allocated {node['allocated']}"
        )
        assigned = node["assigned_cpus"]
        memory = ", ".join(f"{kind} {size}" for kind, size in (node["memory"] or {}).items())
        lines.append(
            f"  exclusive CPUs: allocatable {node['allocatable_cpus']}, assigned "
            f"{assigned['ours'] + assigned['others']} (ours {assigned['ours']}, others "
            f"{assigned['others']}), free {node['free_cpus']}"
            + (f"; memory (bytes): {memory}" if memory else "")
        )
        for holder in node["holders"]:
            if holder["aligned"] and holder["problem"] is None:
                flag = "aligned"
            elif holder["aligned"]:
                flag = f"aligned, MISCOUNTED: {holder['problem']}"
            else:
                flag = f"MISALIGNED: {holder['problem']}"
            lines.append(
                f"  {_who(holder)}: "
                f"{len(holder['devices'])} device(s), CPUs {holder['cpus'] or '-'}, {flag}"
            )
        if not node["holders"]:
            lines.append("  (no pod holds this NUMA node)")
    if document["memory"] and not document["memory_manager_static"]:
        lines.append(
            "the kubelet lists no allocatable memory: its Memory Manager policy is not Static"
        )
    for entry in document["memory"]:
        assigned = entry["assigned_bytes"]
        lines.append(
            f"NUMA node {entry['id']} {entry['memory_type']} ({entry['resource']}, unit "
            f"{format_quantity(entry['unit'])}): capacity {entry['capacity']}, allocatable "
            f"{entry['allocatable']}, allocated {entry['allocated']}, free units "
            f"{entry['free_units']} (allocatable {format_quantity(entry['allocatable_bytes'])}"
            f", assigned ours {format_quantity(assigned['ours'])}, others "
            f"{format_quantity(assigned['others'])})"
        )
        for holder in entry["holders"]:
            flag = "counted" if holder["problem"] is None else f"MISCOUNTED: {holder['problem']}"
            lines.append(
                f"  {_who(holder)}: "
                f"{len(holder['devices'])} device(s), {format_quantity(holder['bytes'])}, {flag}"
            )
    for name, exposed in document.get("exposed", {}).items():
        offered = ",".join(map(str, exposed["offered"])) or "none"
        lines.append(
            f"{name}: the kubelet lists free devices on NUMA node(s) {offered}; "
            f"the rule now: {exposed['why']}"
        )
    lines.append(f"misaligned containers: {document['misaligned']}")
    if document["miscounted"]:
        lines.append(
            "containers whose device count differs from their CPUs or memory: "
            f"{document['miscounted']}"
        )
    return "\n".join(lines)


def _who(holder: dict[str, Any]) -> str:
    """``namespace/pod container`` as the kubelet named them, control characters shown
    as escapes (a NUL or a carriage return from the kubelet never reaches the terminal)."""
    return one_line(f"{holder['namespace']}/{holder['pod']} {holder['container']}", 300)
