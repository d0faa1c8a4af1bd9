"""The node page's model: what each CPU is, who holds it, the memory per NUMA node.

:func:`build_page` turns a :class:`~numa_device_plugin.plugin.reports.snapshot.PluginState` into a
:class:`NodePage`; pure. Where the figures come from:

- the NUMA nodes, their CPUs (``cpu`` folders of ``nodeN``, offline ones from
  ``/sys/devices/system/cpu/online``), MemTotal, hugepage pools and ``distance``:
  the last discovery, read from sysfs;
- who holds a CPU and which CPUs the kubelet may hand out: the kubelet's pod
  resources API (``List``: a container's ``cpu_ids``, ``devices`` and ``memory``;
  ``GetAllocatableResources``: ``cpu_ids`` and ``memory``), as last read;
- the resources: the device lists advertised (ListAndWatch) and the registrations;
- the disks, NICs and accelerators of each NUMA node: the PCI devices' ``numa_node``
  (``bus/pci/devices``) and the block and net classes above them, as the last
  discovery read them; the resources that follow a device: its selector and plan.

Without a read of the pod resources API nobody's CPUs are known, and the CPUs are
marked ``unknown``; without the Memory Manager's ``Static`` policy the memory bars
show sysfs's totals with nothing assigned.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

from numa_device_plugin.plugin.reports.snapshot import PluginState
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.bynode import NO_DEVICES, NodeDevices, devices_by_node
from numa_device_plugin.topology.memory import MEMORY, hugepages_type
from numa_device_plugin.topology.plan import NodePlan

# What each CPU can be, in the order the legend lists them.
OURS = "ours"  # exclusive, to a container holding a numa-align resource
OTHER = "other"  # exclusive, to another container
SHARED = "shared"  # in the kubelet's shared pool: free for exclusive use
RESERVED = "reserved"  # kept by the kubelet (--reserved-cpus, system/kube reserved)
OFFLINE = "offline"  # listed by sysfs for the NUMA node, but not online
UNKNOWN = "unknown"  # the pod resources API was never read
CPU_STATES = (OURS, OTHER, SHARED, RESERVED, OFFLINE, UNKNOWN)


@dataclass(frozen=True)
class CpuCell:
    """One CPU: its id, one of :data:`CPU_STATES`, and for an exclusive one its holder
    (``namespace/pod/container``)."""

    cpu: int
    state: str
    holder: str | None = None


@dataclass(frozen=True)
class MemoryBar:
    """One memory type of a NUMA node, in bytes: ``allocatable`` (the Memory
    Manager's, or sysfs's total where ``source`` is ``sysfs``), held by containers
    holding our resources (``ours``) and by others (``others``)."""

    memory_type: str
    allocatable: int
    ours: int
    others: int
    source: str

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.ours - self.others)


@dataclass(frozen=True)
class ResourceRow:
    """One advertised resource: its NUMA node(s) (``nodes``, a list such as ``0,1``
    for a resource that follows a device on two), device count, Healthy ones, held
    ones (by the pod resources API) and whether it is registered with the kubelet;
    ``near``: the device it follows (``data-disk=serial:S1``), None for the others;
    ``exposed``: for a resource over several NUMA nodes, the node whose free devices it
    offers, and ``why`` (None for the others)."""

    name: str
    node_id: int
    devices: int
    healthy: int
    held: int
    registered: bool
    nodes: str = ""
    near: str | None = None
    exposed: int | None = None
    why: str | None = None


@dataclass(frozen=True)
class NearRow:
    """A resource that follows a device: its name, selector, the NUMA nodes its
    devices lie on (a list such as ``1``; empty when none) and why nothing is
    advertised (None when something is)."""

    resource: str
    selector: str
    nodes: str
    matched: str
    reason: str | None


@dataclass(frozen=True)
class NumaBox:
    """One NUMA node as drawn: its CPUs, memory bars, resources and holders
    (``namespace/pod/container`` -> its CPUs on this node, as a cpulist)."""

    id: int
    advertised: bool
    reason: str | None
    cpus: tuple[CpuCell, ...]
    memory: tuple[MemoryBar, ...]
    resources: tuple[ResourceRow, ...]
    holders: Mapping[str, str]
    devices: NodeDevices = NO_DEVICES


@dataclass(frozen=True)
class NodePage:
    """The whole page: ``node`` (host name), ``taken_at`` (``time.time()``), the
    boxes by NUMA node id, the distance matrix (``ids`` x ``ids``; None where sysfs
    gave none; both empty when sysfs gave no distance at all), what the pod resources
    API last said (one line) and the readiness problems; ``left_out``: NUMA nodes past
    :data:`MAX_BOXES` that are not drawn."""

    node: str
    taken_at: float
    boxes: tuple[NumaBox, ...]
    ids: tuple[int, ...]
    distances: tuple[tuple[int | None, ...], ...]
    pod_resources: str
    problems: tuple[str, ...]
    configuration: str
    near: tuple[NearRow, ...] = ()
    left_out: int = 0


# NUMA nodes one page draws (boxes, rows, the distance table): real machines have up
# to 32; a sysfs claiming up to the kernel's 1,024 still gets a page in bounded time.
MAX_BOXES = 64


def build_page(state: PluginState, node: str | None = None) -> NodePage:
    """The :class:`NodePage` of ``state``; pure apart from the host name default
    (``socket.gethostname()``). Work is linear in the CPUs, devices and pods shown,
    and the first :data:`MAX_BOXES` NUMA nodes are drawn."""
    view = state.view
    ours_names = set(state.served)
    holders: dict[int, tuple[str, str]] = {}  # cpu -> (holder, OURS | OTHER)
    our_memory: dict[tuple[int, str], int] = {}
    if view is not None:
        for holder in view.holders:
            ours = any(name in ours_names for name in holder.devices)
            label = f"{holder.namespace}/{holder.pod}/{holder.container}"
            for cpu in holder.cpus:
                holders[cpu] = (label, OURS if ours else OTHER)
            if ours:
                for key, size in holder.memory.items():
                    our_memory[key] = our_memory.get(key, 0) + size
        for holder in view.others:
            label = f"{holder.namespace}/{holder.pod}/{holder.container}"
            for cpu in holder.cpus:
                holders.setdefault(cpu, (label, OTHER))
    reserved = state.config.reserved_cpus if state.config is not None else frozenset()
    on_node = devices_by_node(state.inventory)
    drawn = state.plans[:MAX_BOXES]
    nearest = state.nearest
    resources = _resources(state)
    boxes = []
    for plan in drawn:
        cells = tuple(_cell(cpu, plan, state, holders, reserved) for cpu in _all_cpus(plan))
        by_holder: dict[str, list[int]] = {}
        for cell in cells:
            if cell.holder is not None:
                by_holder.setdefault(cell.holder, []).append(cell.cpu)
        boxes.append(
            NumaBox(
                id=plan.node.id,
                advertised=plan.advertised,
                reason=f"{plan.reason}; {nearest[plan.node.id].short}"
                if plan.node.id in nearest and nearest[plan.node.id].to
                else plan.reason,
                cpus=cells,
                memory=_memory_bars(plan, state, our_memory),
                resources=resources.get(plan.node.id, ()),
                holders={h: sysfs.format_cpulist(c) for h, c in sorted(by_holder.items())},
                devices=on_node.get(plan.node.id, NO_DEVICES),
            )
        )
    ids: tuple[int, ...] = ()
    matrix: tuple[tuple[int | None, ...], ...] = ()
    if any(plan.node.distances for plan in drawn):
        ids = tuple(plan.node.id for plan in drawn)
        matrix = tuple(
            tuple((plan.node.distances or {}).get(other) for other in ids) for plan in drawn
        )
    configuration = ""
    if state.configuration:
        configuration = f"{state.configuration['name']}: {state.configuration['why']}"
    return NodePage(
        node=node if node is not None else socket.gethostname(),
        taken_at=state.taken_at,
        boxes=tuple(boxes),
        ids=ids,
        distances=matrix,
        pod_resources=_pod_resources_line(state),
        problems=state.problems,
        configuration=configuration,
        near=tuple(
            NearRow(
                entry.resource,
                " & ".join(entry.near.terms),
                ",".join(map(str, entry.nodes)),
                ", ".join(entry.selection.matched),
                entry.reason,
            )
            for entry in state.near
        ),
        left_out=len(state.plans) - len(drawn),
    )


def _all_cpus(plan: NodePlan) -> list[int]:
    return sorted(plan.node.cpus | plan.node.all_cpus)


def _cell(
    cpu: int,
    plan: NodePlan,
    state: PluginState,
    holders: Mapping[int, tuple[str, str]],
    reserved: frozenset[int],
) -> CpuCell:
    if cpu not in plan.node.cpus:
        return CpuCell(cpu, OFFLINE)
    if cpu in holders:
        label, kind = holders[cpu]
        return CpuCell(cpu, kind, label)
    view = state.view
    if cpu in reserved:
        return CpuCell(cpu, RESERVED)
    if view is None:
        return CpuCell(cpu, UNKNOWN)
    if view.cpu_manager_static and cpu not in view.allocatable_cpus:
        return CpuCell(cpu, RESERVED)
    return CpuCell(cpu, SHARED)


def _memory_bars(
    plan: NodePlan, state: PluginState, our_memory: Mapping[tuple[int, str], int]
) -> tuple[MemoryBar, ...]:
    node = plan.node
    view = state.view
    if view is not None and view.memory.get(node.id):
        assigned = view.assigned_memory.get(node.id, {})
        return tuple(
            MemoryBar(
                memory_type,
                size,
                ours := our_memory.get((node.id, memory_type), 0),
                max(0, assigned.get(memory_type, 0) - ours),
                "memory manager",
            )
            for memory_type, size in sorted(view.memory[node.id].items(), key=_type_order)
        )
    bars = []
    if node.memory_bytes is not None:
        bars.append(MemoryBar(MEMORY, node.memory_bytes, 0, 0, "sysfs"))
    bars.extend(
        MemoryBar(hugepages_type(size), size * pages, 0, 0, "sysfs")
        for size, pages in node.hugepages
        if pages
    )
    return tuple(bars)


def _type_order(item: tuple[str, int]) -> tuple[int, str]:
    return (item[0] != MEMORY, item[0])


def _resources(state: PluginState) -> dict[int, tuple[ResourceRow, ...]]:
    """Each NUMA node's resource rows, in one pass over the held ids and one over the
    resources (not one of each per NUMA node)."""
    held: dict[str, set[str]] = {}
    if state.view is not None:
        for holder in state.view.holders:
            for name, ids in holder.devices.items():
                held.setdefault(name, set()).update(ids)
    rows: dict[int, list[ResourceRow]] = {}
    for name, served in sorted(state.served.items()):
        nodes = ",".join(map(str, served.resource.node_ids))
        near = None if served.resource.near is None else str(served.resource.near)
        exposure = state.exposure(served.resource)
        for node_id in served.resource.node_ids:
            rows.setdefault(node_id, []).append(
                ResourceRow(
                    name,
                    node_id,
                    len(served.devices),
                    served.healthy,
                    len(held.get(name, ())),
                    served.registered,
                    nodes,
                    near,
                    None if exposure is None else exposure.node_id,
                    None if exposure is None else exposure.why,
                )
            )
    return {node_id: tuple(listed) for node_id, listed in rows.items()}


def _pod_resources_line(state: PluginState) -> str:
    age = state.pod_resources_age
    if state.pod_resources_up is None:
        return "the kubelet's pod resources API has not been read yet"
    if state.pod_resources_up:
        line = f"the kubelet's pod resources API, read {age:.0f} s ago"
        if state.pod_resources_on_change:
            line += " (and again when a Guaranteed pod's cgroup comes or goes)"
        return line
    if age is None:
        return "the kubelet's pod resources API cannot be read: nobody's CPUs are known"
    return (
        f"the kubelet's pod resources API cannot be read; its last answer, {age:.0f} s "
        "ago, is shown"
    )
