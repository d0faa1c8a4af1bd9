"""Which NUMA nodes to advertise, and what an operator should hear about the topology.

:func:`plan_nodes` decides, purely, which NUMA nodes of a :class:`~.numa.Topology` get
an extended resource and why the others do not; :func:`topology_warnings` lists what
an operator should hear about (too many NUMA nodes for the Topology Manager,
overlapping CPU sets).
"""

from __future__ import annotations

from dataclasses import dataclass

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.numa import NumaNode, Topology

# The kubelet's Topology Manager refuses to start on machines with more NUMA
# nodes than this unless its policy option max-allowable-numa-nodes is set.
TOPOLOGY_MANAGER_MAX_NUMA_NODES = 8
# Overlapping CPU sets are reported in at most this many lines (plus a summary),
# each naming at most this many NUMA nodes.
MAX_OVERLAP_LINES = 5
MAX_OVERLAP_NODES = 16


@dataclass(frozen=True)
class NodePlan:
    """Whether a NUMA node is advertised as an extended resource, and why not if not."""

    node: NumaNode
    advertised: bool
    reason: str | None = None


def plan_nodes(topology: Topology, *, include_cpuless: bool = False) -> tuple[NodePlan, ...]:
    """Decide per NUMA node whether it is advertised; same order as ``topology.nodes``.

    A node with no usable CPU can never satisfy a ``single-numa-node`` alignment
    that includes CPUs, so it is left out unless ``include_cpuless`` is set.
    """
    plans: list[NodePlan] = []
    for node in topology.nodes:
        reason = _why_unusable(node)
        if reason is None:
            plans.append(NodePlan(node, advertised=True))
        elif include_cpuless:
            plans.append(NodePlan(node, advertised=True, reason=f"{reason}; included on request"))
        else:
            plans.append(NodePlan(node, advertised=False, reason=reason))
    return tuple(plans)


def _why_unusable(node: NumaNode) -> str | None:
    if node.cpus:
        return None
    if node.missing_folder:
        return f"listed online but sysfs has no node{node.id} folder"
    if node.all_cpus:
        offline = sysfs.format_cpulist(node.all_cpus)
        return f"no usable CPU: all of its CPUs ({offline}) are offline"
    return "no CPU: a memory-only NUMA node (e.g. HBM, CXL or persistent memory)"


def topology_warnings(plans: tuple[NodePlan, ...]) -> list[str]:
    """Operator warnings for a plan: more NUMA nodes than the Topology Manager accepts
    by default (with the kubelet setting the machine needs), and CPUs that sysfs puts
    in two NUMA nodes."""
    limit = numa_limit_warning(plans)
    warnings = [] if limit is None else [limit]
    warnings.extend(_overlap_warnings([plan.node for plan in plans]))
    return warnings


def numa_limit_warning(plans: tuple[NodePlan, ...]) -> str | None:
    """The kubelet setting a machine of more than 8 NUMA nodes needs, with the count;
    None for 8 or fewer. The kubelet counts every NUMA node the machine has (cadvisor's
    topology: memory-only nodes too), not those advertised: with a policy other than
    none it refuses to start on more than 8 (``pkg/kubelet/cm/topologymanager/
    topology_manager.go``)."""
    if len(plans) <= TOPOLOGY_MANAGER_MAX_NUMA_NODES:
        return None
    return (
        f"this machine has {len(plans)} NUMA nodes: the kubelet's Topology Manager "
        f"refuses more than {TOPOLOGY_MANAGER_MAX_NUMA_NODES} (the kubelet does not start "
        "with a policy other than none) unless its configuration has "
        f'topologyManagerPolicyOptions: {{max-allowable-numa-nodes: "{len(plans)}"}} '
        "(Kubernetes 1.31 and later, GA in 1.35; https://kubernetes.io/docs/tasks/"
        "administer-cluster/topology-manager/#policy-option-max-allowable-numa-nodes)"
    )


def _overlap_warnings(nodes: list[NumaNode]) -> list[str]:
    """CPUs that sysfs puts in more than one NUMA node, grouped by the set of nodes
    sharing them: at most MAX_OVERLAP_LINES lines and one summary line, in time
    linear in the CPU count (not quadratic in the node count)."""
    owners: dict[int, list[int]] = {}
    for node in nodes:
        for cpu in node.all_cpus:
            owners.setdefault(cpu, []).append(node.id)
    groups: dict[tuple[int, ...], list[int]] = {}
    for cpu, listing in owners.items():
        if len(listing) > 1:
            groups.setdefault(tuple(sorted(listing)), []).append(cpu)
    lines = []
    for sharing, cpus in sorted(groups.items())[:MAX_OVERLAP_LINES]:
        shown = ",".join(map(str, sharing[:MAX_OVERLAP_NODES]))
        if len(sharing) > MAX_OVERLAP_NODES:
            shown += f" and {len(sharing) - MAX_OVERLAP_NODES} more"
        lines.append(
            f"NUMA nodes {shown} all list CPUs {sysfs.format_cpulist(cpus)} (broken firmware "
            "tables?); alignment to any of them may not be exclusive"
        )
    if len(groups) > MAX_OVERLAP_LINES:
        lines.append(
            f"... and {len(groups) - MAX_OVERLAP_LINES} more groups of NUMA nodes sharing CPUs"
        )
    return lines
