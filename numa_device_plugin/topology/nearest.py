"""Where a device on a NUMA node without CPUs goes: the nearest NUMA node(s) with CPUs.

CXL memory expanders, HBM and Grace-Blackwell put memory, and sometimes PCI devices, on
NUMA nodes that have no CPU. No pod can be aligned with such a node (the Topology
Manager's ``single-numa-node`` hint must hold the pod's CPUs), so a device there follows
the advertised NUMA node(s) nearest to it by the firmware's SLIT: the row
``devices/system/node/node<N>/distance`` of the device's node (10 is local; ACPI 6.5,
5.2.17). A tie follows every tied node (the resource then spans NUMA nodes and one of
them is exposed at a time: :mod:`numa_device_plugin.plugin.counts.exposure`).

The device's own ``local_cpulist`` cannot confirm it: for a device on a CPU-less node
the kernel writes ``cpumask_of_node(node)``, an empty mask (``cpumask_of_pcibus``,
``arch/x86/include/asm/pci.h``), so only the SLIT says which CPUs are near.

Pure: :func:`nearest_nodes` is computed from a plan (:mod:`.plan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from numa_device_plugin.topology.plan import NodePlan

if TYPE_CHECKING:
    from numa_device_plugin.topology.selectors import Selection


@dataclass(frozen=True)
class Nearest:
    """Where a device on NUMA node ``node`` (not advertised: no usable CPU) goes:
    ``to``, the advertised NUMA nodes at the smallest SLIT distance from it (sorted;
    empty when its distance row is unknown or names none of them), ``distance`` (that
    distance; None when ``to`` is empty) and ``why``, one line for logs and pages
    (``memory-only node 2; nearest CPUs: node 0 at distance 14``)."""

    node: int
    to: tuple[int, ...]
    distance: int | None
    why: str

    @property
    def short(self) -> str:
        """What a page says of the node: ``its devices follow node 0 (distance 14)``."""
        if not self.to:
            return "its devices follow no NUMA node: " + self.why.partition("; ")[2]
        nodes = ", ".join(map(str, self.to))
        return (
            f"its devices follow node{'s' if len(self.to) > 1 else ''} {nodes} "
            f"(distance {self.distance})"
        )

    def document(self) -> dict[str, object]:
        """As JSON: ``{"node", "to": [...], "distance", "why"}``."""
        return {"node": self.node, "to": list(self.to), "distance": self.distance,
                "why": self.why}  # fmt: skip


def nearest_nodes(plans: Iterable[NodePlan]) -> dict[int, Nearest]:
    """For each NUMA node of ``plans`` that is not advertised, the advertised node(s) a
    device on it follows (:class:`Nearest`), keyed by its id; advertised nodes are
    absent. Time linear in the nodes times the advertised nodes."""
    plans = tuple(plans)
    advertised = sorted(plan.node.id for plan in plans if plan.advertised)
    found = {}
    for plan in plans:
        if not plan.advertised:
            found[plan.node.id] = _nearest(plan, advertised)
    return found


def _nearest(plan: NodePlan, advertised: list[int]) -> Nearest:
    node = plan.node
    what = _what(plan)
    if not advertised:
        return Nearest(node.id, (), None, f"{what}; no NUMA node has usable CPUs")
    if node.distances is None:
        return Nearest(node.id, (), None,
                       f"{what}; its distance row (node{node.id}/distance) is unknown, so no "
                       "NUMA node with CPUs is known to be near")  # fmt: skip
    row = {other: node.distances[other] for other in advertised if other in node.distances}
    if not row:
        return Nearest(node.id, (), None,
                       f"{what}; its distance row names no NUMA node with CPUs")  # fmt: skip
    closest = min(row.values())
    to = tuple(other for other in advertised if row.get(other) == closest)
    shown = ", ".join(map(str, to))
    plural = "s" if len(to) > 1 else ""
    why = f"{what}; nearest CPUs: node{plural} {shown} at distance {closest}"
    if len(to) > 1:
        why += " (a tie: it follows each, one exposed at a time)"
    return Nearest(node.id, to, closest, why)


def _what(plan: NodePlan) -> str:
    """``memory-only node 2`` or ``node 2 (no usable CPU: ...)``."""
    node = plan.node
    if not node.all_cpus and not node.missing_folder:
        return f"memory-only node {node.id}"
    return f"node {node.id} ({plan.reason})"


def follow(nodes: Iterable[int], nearest: Mapping[int, Nearest]) -> frozenset[int]:
    """``nodes`` (a device's NUMA nodes) with each node in ``nearest`` (not advertised)
    replaced by the nodes it follows (none when it follows none)."""
    found: set[int] = set()
    for node in nodes:
        if node in nearest:
            found.update(nearest[node].to)
        else:
            found.add(node)
    return frozenset(found)


def follow_selection(
    selection: Selection, nearest: Mapping[int, Nearest], selector: object = ""
) -> tuple[Selection, tuple[str, ...]]:
    """``selection`` (of ``selector``) with its devices on nodes of ``nearest`` (not
    advertised) moved to the nodes they follow (its ``nodes`` and ``by_node``: a pod
    there is told of them), and one line per such node saying why (``ib0 is on
    memory-only node 2; nearest CPUs: node 0 at distance 14``); when they follow no
    node at all, its ``reason`` is ``<selector>: <those lines>``. A selection that found
    nothing is returned as is."""
    moved = sorted(selection.nodes & nearest.keys())
    if selection.reason is not None or not moved:
        return selection, ()
    from numa_device_plugin.topology.selectors import MAX_NAMED

    names = dict(selection.by_node)
    lines = []
    for node in moved:
        on = names.get(node, ())
        who = ", ".join(on) if on else "its device"
        lines.append(f"{who} {'are' if len(on) > 1 else 'is'} on {nearest[node].why}")
    by_node: dict[int, list[str]] = {}
    for node, listed in selection.by_node:
        for target in nearest[node].to if node in nearest else (node,):
            found = by_node.setdefault(target, [])
            found.extend(n for n in listed if n not in found)
    nodes = follow(selection.nodes, nearest)
    return replace(
        selection,
        nodes=nodes,
        by_node=tuple((node, tuple(by_node[node][:MAX_NAMED])) for node in sorted(by_node)),
        reason=None if nodes else f"{selector}: " + "; ".join(lines),
    ), tuple(lines)
