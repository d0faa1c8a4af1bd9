"""The NUMA topology of a machine as read from sysfs, and which NUMA nodes to advertise.

:func:`read_topology` turns a sysfs root into a plain :class:`Topology`;
:func:`plan_nodes` decides, purely, which NUMA nodes get an extended resource and
why the others do not; :func:`topology_warnings` lists what an operator should
hear about (too many nodes for the Topology Manager, overlapping CPU sets).

The rules follow the kernel's sysfs ABI:

- NUMA node ids come from ``devices/system/node/online``; where that file is
  missing, from the ``nodeN`` folders. No ``devices/system/node`` folder at all
  (a kernel without NUMA) means one node 0 holding every online CPU.
- A node's CPUs come from ``nodeN/cpulist``, else ``nodeN/cpumap``, else its
  ``cpuN`` links.
- A CPU is online when it is in ``cpu/online`` (where that file exists and is
  not empty) and its own ``cpu/cpuN/online`` does not read 0.
- Memory is ``MemTotal`` of ``nodeN/meminfo``; distances are ``nodeN/distance``,
  one value per online node in id order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from numa_device_plugin import sysfs

_NODE_DIR = re.compile(r"^node(\d+)$")
_CPU_DIR = re.compile(r"^cpu(\d+)$")

# The kubelet's Topology Manager refuses to start on machines with more NUMA
# nodes than this unless its policy option max-allowable-numa-nodes is set.
TOPOLOGY_MANAGER_MAX_NUMA_NODES = 8


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node.

    ``cpus``: ids of its usable (online) CPUs; ``memory_bytes``: MemTotal in
    bytes, None when sysfs has no meminfo for it; ``distances``: NUMA node id
    to the kernel's relative distance (10 = local), empty when unknown;
    ``all_cpus``: every CPU sysfs lists for it, online or not; ``missing_folder``:
    the node is listed online but has no ``nodeN`` folder.
    """

    id: int
    cpus: frozenset[int]
    memory_bytes: int | None = None
    distances: Mapping[int, int] = field(default_factory=dict)
    all_cpus: frozenset[int] = frozenset()
    missing_folder: bool = False


@dataclass(frozen=True)
class Topology:
    """All NUMA nodes of a machine, sorted by id. ``numa_in_sysfs`` is False on a
    kernel without NUMA support, where one synthetic node 0 stands for the machine."""

    nodes: tuple[NumaNode, ...]
    numa_in_sysfs: bool = True

    def node(self, node_id: int) -> NumaNode:
        """Return the node with that id; raises KeyError when there is none."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)


@dataclass(frozen=True)
class NodePlan:
    """Whether a NUMA node is advertised as an extended resource, and why not if not."""

    node: NumaNode
    advertised: bool
    reason: str | None = None


def read_topology(sysfs_root: Path) -> Topology:
    """Discover NUMA nodes under ``sysfs_root`` (a folder holding ``devices/system``).

    Raises :class:`~numa_device_plugin.sysfs.SysfsFormatError` naming the file
    and its content when a file is malformed, and
    :class:`~numa_device_plugin.sysfs.SysfsError` when one cannot be read or the
    root holds no ``devices/system/cpu`` folder.
    """
    system = sysfs_root / "devices" / "system"
    cpu_dir = system / "cpu"
    node_dir = system / "node"
    if not cpu_dir.is_dir():
        raise sysfs.SysfsError(f"{cpu_dir} does not exist: is {sysfs_root} a sysfs root?")
    online = _OnlineCpus(cpu_dir)

    if not node_dir.is_dir():
        every_cpu = online.listed or frozenset(_numbered(cpu_dir, _CPU_DIR))
        return Topology(
            nodes=(NumaNode(id=0, cpus=online.filter(every_cpu), all_cpus=every_cpu),),
            numa_in_sysfs=False,
        )

    node_ids = _node_ids(node_dir)
    nodes = tuple(_read_node(node_dir, node_id, node_ids, online) for node_id in node_ids)
    return Topology(nodes=nodes)


def _node_ids(node_dir: Path) -> tuple[int, ...]:
    online = sysfs.read_parsed(node_dir / "online", sysfs.parse_cpulist)
    if online is not None:
        if not online:
            raise sysfs.SysfsFormatError(node_dir / "online", "", "no NUMA node is online")
        return tuple(sorted(online))
    found = sorted(_numbered(node_dir, _NODE_DIR))
    if not found:
        raise sysfs.SysfsError(f"{node_dir} has neither an 'online' file nor nodeN folders")
    return tuple(found)


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    """Ids of the entries of ``folder`` whose names match ``pattern`` (``cpu12`` -> 12)."""
    return [
        int(match.group(1)) for entry in folder.iterdir() if (match := pattern.match(entry.name))
    ]


class _OnlineCpus:
    """Which CPUs are online: in ``cpu/online`` where that file exists and is not
    empty, and not reading 0 in their own ``cpu/cpuN/online``."""

    def __init__(self, cpu_dir: Path) -> None:
        self._cpu_dir = cpu_dir
        self.listed = sysfs.read_parsed(cpu_dir / "online", sysfs.parse_cpulist) or None

    def filter(self, cpus: frozenset[int]) -> frozenset[int]:
        if self.listed is not None:
            cpus = cpus & self.listed
        return frozenset(cpu for cpu in cpus if self._own_flag(cpu) is not False)

    def _own_flag(self, cpu: int) -> bool | None:
        return sysfs.read_parsed(self._cpu_dir / f"cpu{cpu}" / "online", sysfs.parse_online_flag)


def _node_cpus(folder: Path) -> frozenset[int]:
    cpus = sysfs.read_parsed(folder / "cpulist", sysfs.parse_cpulist)
    if cpus is None:
        cpus = sysfs.read_parsed(folder / "cpumap", sysfs.parse_cpumap)
    if cpus is None:
        cpus = frozenset(_numbered(folder, _CPU_DIR))
    return cpus


def _read_node(
    node_dir: Path, node_id: int, node_ids: tuple[int, ...], online: _OnlineCpus
) -> NumaNode:
    folder = node_dir / f"node{node_id}"
    if not folder.is_dir():
        return NumaNode(id=node_id, cpus=frozenset(), missing_folder=True)
    all_cpus = _node_cpus(folder)
    memory = sysfs.read_parsed(folder / "meminfo", sysfs.parse_meminfo_total)
    row = sysfs.read_parsed(folder / "distance", sysfs.parse_distance)
    distances: dict[int, int] = {}
    if row is not None:
        if len(row) != len(node_ids):
            raise sysfs.SysfsFormatError(
                folder / "distance",
                " ".join(map(str, row)),
                f"{len(row)} values but {len(node_ids)} NUMA nodes are online",
            )
        distances = dict(zip(node_ids, row, strict=True))
    return NumaNode(
        id=node_id,
        cpus=online.filter(all_cpus),
        memory_bytes=memory,
        distances=distances,
        all_cpus=all_cpus,
    )


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
    """Operator warnings for a plan: more advertised NUMA nodes than the Topology
    Manager accepts by default, and CPUs that sysfs puts in two NUMA nodes."""
    warnings: list[str] = []
    advertised = [plan for plan in plans if plan.advertised]
    if len(advertised) > TOPOLOGY_MANAGER_MAX_NUMA_NODES:
        warnings.append(
            f"{len(advertised)} NUMA nodes are advertised; the kubelet's Topology Manager "
            f"refuses more than {TOPOLOGY_MANAGER_MAX_NUMA_NODES} unless its policy option "
            "max-allowable-numa-nodes is set (Kubernetes 1.31+)"
        )
    nodes = [plan.node for plan in plans]
    for index, first in enumerate(nodes):
        for second in nodes[index + 1 :]:
            shared = first.all_cpus & second.all_cpus
            if shared:
                warnings.append(
                    f"NUMA nodes {first.id} and {second.id} both list CPUs "
                    f"{sysfs.format_cpulist(shared)} (broken firmware tables?); "
                    "alignment to either node may not be exclusive"
                )
    return warnings
