"""The NUMA topology of a machine as read from sysfs.

:func:`read_topology` turns a sysfs root into a plain :class:`Topology`;
:func:`~.plan.plan_nodes` then decides, purely, which NUMA nodes get an extended
resource (:mod:`.plan`).

The rules follow the kernel's sysfs ABI:

- NUMA node ids come from ``devices/system/node/online``; where that file is
  missing, from the ``nodeN`` folders. No ``devices/system/node`` folder at all
  (a kernel without NUMA) means one node 0 holding every online CPU.
- A node's CPUs come from ``nodeN/cpulist``, else ``nodeN/cpumap``, else its
  ``cpuN`` links.
- A CPU is online when it is in ``cpu/online`` (where that file exists and is
  not empty) and its own ``cpu/cpuN/online`` does not read 0.
- Memory is ``MemTotal`` of ``nodeN/meminfo``; distances are ``nodeN/distance``,
  one value per online node in id order (some kernels and dumps give one per
  *possible* node, ``node/possible``; that is read too).

Bounds keep discovery linear in the machine: NUMA node ids up to
:data:`MAX_NUMA_NODE_ID`, cpulists adding up to :data:`MAX_CPU_MEMBERSHIPS` CPUs.

Only node ids and CPU sets decide what is advertised, so only their files
(``node/online``, ``cpulist``, ``cpumap``, ``cpu/online``) stop discovery when
malformed. Informative fields never refuse a real machine: a malformed
``distance`` or ``meminfo`` leaves that field unknown (None) with a warning
naming the file and its content, and an empty per-CPU ``online`` file reads as
online (as hwloc reads it), with a warning. Warnings are collected in
:attr:`Topology.warnings`; nothing here logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from numa_device_plugin.topology import sysfs

_NODE_DIR = re.compile(r"^node(\d+)$")
_CPU_DIR = re.compile(r"^cpu(\d+)$")

# The kernel's largest NUMA node id: MAX_NUMNODES = 1 << CONFIG_NODES_SHIFT, and
# Kconfig bounds CONFIG_NODES_SHIFT by 10 (include/linux/numa.h, mm/Kconfig).
MAX_NUMA_NODE_ID = 1023
# CPUs the NUMA nodes' cpulists may list in all: twice the most CPUs a kernel can
# have, room for overlapping firmware tables but not for every CPU in every node.
MAX_CPU_MEMBERSHIPS = 2 * (sysfs.MAX_CPU_ID + 1)

T = TypeVar("T")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node.

    ``cpus``: ids of its usable (online) CPUs; ``memory_bytes``: MemTotal in
    bytes, None when sysfs has no usable meminfo for it; ``distances``: NUMA node
    id to the kernel's relative distance (10 = local), None when unknown (no
    ``distance`` file, or one in a form we cannot map);
    ``all_cpus``: every CPU sysfs lists for it, online or not; ``missing_folder``:
    the node is listed online but has no ``nodeN`` folder; ``hugepages``: its
    hugepage pools, (page size in bytes, pages) sorted by size, from
    ``nodeN/hugepages/hugepages-<kB>kB/nr_hugepages`` (pools with 0 pages included);
    ``sockets``: the physical packages its usable CPUs sit in, from
    ``cpu/cpuN/topology/physical_package_id`` of its lowest and highest CPU (none where
    the kernel gives -1 or no file; two for a node spanning sockets, as AMD's NPS0
    makes).
    """

    id: int
    cpus: frozenset[int]
    memory_bytes: int | None = None
    distances: Mapping[int, int] | None = None
    all_cpus: frozenset[int] = frozenset()
    missing_folder: bool = False
    hugepages: tuple[tuple[int, int], ...] = ()
    sockets: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Topology:
    """All NUMA nodes of a machine, sorted by id. ``numa_in_sysfs`` is False on a
    kernel without NUMA support, where one synthetic node 0 stands for the machine.
    ``warnings``: odd but tolerated sysfs content, one line per file, naming it."""

    nodes: tuple[NumaNode, ...]
    numa_in_sysfs: bool = True
    warnings: tuple[str, ...] = ()

    def node(self, node_id: int) -> NumaNode:
        """Return the node with that id; raises KeyError when there is none."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)


def read_topology(sysfs_root: Path) -> Topology:
    """Discover NUMA nodes under ``sysfs_root`` (a folder holding ``devices/system``).

    Raises :class:`~numa_device_plugin.topology.sysfs.SysfsFormatError` naming the file
    and its content when a file is malformed, and
    :class:`~numa_device_plugin.topology.sysfs.SysfsError` when one cannot be read or the
    root holds no ``devices/system/cpu`` folder.
    """
    system = sysfs_root / "devices" / "system"
    cpu_dir = system / "cpu"
    node_dir = system / "node"
    if not cpu_dir.is_dir():
        raise sysfs.SysfsError(f"{cpu_dir} does not exist: is {sysfs_root} a sysfs root?")
    warnings: list[str] = []
    online = _OnlineCpus(cpu_dir)

    if not sysfs.folder_exists(node_dir):
        every_cpu = online.listed or frozenset(_numbered(cpu_dir, _CPU_DIR))
        nodes: tuple[NumaNode, ...] = (
            NumaNode(id=0, cpus=online.filter(every_cpu), all_cpus=every_cpu),
        )
    else:
        node_ids = _node_ids(node_dir)
        possible = _possible_ids(node_dir)
        read: list[NumaNode] = []
        listed = 0
        for node_id in node_ids:
            node = _read_node(node_dir, node_id, node_ids, possible, online, warnings)
            listed += len(node.all_cpus)
            if listed > MAX_CPU_MEMBERSHIPS:
                raise sysfs.SysfsFormatError(
                    node_dir / f"node{node_id}" / "cpulist",
                    sysfs.format_cpulist(node.all_cpus),
                    f"the NUMA nodes' cpulists list over {MAX_CPU_MEMBERSHIPS} CPUs in all "
                    "(every CPU in many NUMA nodes: broken firmware tables)",
                )
            read.append(node)
        nodes = tuple(read)
    if online.empty_flags:
        cpus = sysfs.format_cpulist(online.empty_flags)
        warnings.append(
            f"{cpu_dir}/cpuN/online is empty for CPUs {cpus} (content: ''); taken as online"
        )
    return Topology(nodes=nodes, numa_in_sysfs=node_dir.is_dir(), warnings=tuple(warnings))


def _check_ids(ids: frozenset[int] | list[int], where: Path, content: str) -> None:
    """Raise :class:`~numa_device_plugin.topology.sysfs.SysfsFormatError` naming
    ``where`` when an id is above :data:`MAX_NUMA_NODE_ID`."""
    highest = max(ids, default=0)
    if highest > MAX_NUMA_NODE_ID:
        raise sysfs.SysfsFormatError(
            where,
            content,
            f"NUMA node id {highest} is above the kernel's limit of {MAX_NUMA_NODE_ID} "
            "(CONFIG_NODES_SHIFT is at most 10)",
        )


def _possible_ids(node_dir: Path) -> tuple[int, ...] | None:
    """``node/possible``, sorted; None when missing or unreadable (it only helps map
    distance rows, so it never stops discovery)."""
    try:
        possible = sysfs.read_parsed(node_dir / "possible", sysfs.parse_cpulist)
    except sysfs.SysfsError:
        return None
    if not possible or max(possible) > MAX_NUMA_NODE_ID:
        return None
    return tuple(sorted(possible))


def _node_ids(node_dir: Path) -> tuple[int, ...]:
    online = sysfs.read_parsed(node_dir / "online", sysfs.parse_cpulist)
    if online is not None:
        if not online:
            raise sysfs.SysfsFormatError(node_dir / "online", "", "no NUMA node is online")
        _check_ids(online, node_dir / "online", sysfs.format_cpulist(online))
        return tuple(sorted(online))
    found = sorted(_numbered(node_dir, _NODE_DIR))
    if not found:
        raise sysfs.SysfsError(f"{node_dir} has neither an 'online' file nor nodeN folders")
    _check_ids(found, node_dir / f"node{found[-1]}", "(a folder)")
    return tuple(found)


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    """Ids of the entries of ``folder`` whose names match ``pattern`` (``cpu12`` -> 12)."""
    return [
        int(match.group(1)) for entry in folder.iterdir() if (match := pattern.match(entry.name))
    ]


class _OnlineCpus:
    """Which CPUs are online: in ``cpu/online`` where that file exists and is not
    empty, and not reading 0 in their own ``cpu/cpuN/online`` (an empty one reads
    as online, with a warning)."""

    def __init__(self, cpu_dir: Path) -> None:
        self._cpu_dir = cpu_dir
        self.empty_flags: set[int] = set()
        # Each CPU's flag read once, however many NUMA nodes list the CPU.
        self._flags: dict[int, bool | None] = {}
        self.listed = sysfs.read_parsed(cpu_dir / "online", sysfs.parse_cpulist) or None

    def filter(self, cpus: frozenset[int]) -> frozenset[int]:
        if self.listed is not None:
            cpus = cpus & self.listed
        return frozenset(cpu for cpu in sorted(cpus) if self._own_flag(cpu) is not False)

    def packages(self, cpus: frozenset[int], warnings: list[str]) -> frozenset[int]:
        """The physical packages (sockets) of ``cpus``, from the
        ``topology/physical_package_id`` of the lowest and the highest of them only (two
        files a NUMA node, not one a CPU: reading every CPU's made a look at 1,024 CPUs
        three times slower, and a node spanning two sockets, as AMD's NPS0 makes, still
        shows: the kernel numbers a socket's CPUs together, its hyperthreads after all
        cores): -1 or no file adds none; a malformed one adds none, with a warning
        naming it."""
        found = set()
        for cpu in {min(cpus), max(cpus)} if cpus else ():
            package = _informative(self._cpu_dir / f"cpu{cpu}" / "topology" / "physical_package_id",
                                   _parse_package, warnings)  # fmt: skip
            if package is not None and package >= 0:
                found.add(package)
        return frozenset(found)

    def _own_flag(self, cpu: int) -> bool | None:
        if cpu not in self._flags:
            self._flags[cpu] = self._read_flag(cpu)
        return self._flags[cpu]

    def _read_flag(self, cpu: int) -> bool | None:
        path = self._cpu_dir / f"cpu{cpu}" / "online"
        text = sysfs.read_text(path)
        if text == "":
            self.empty_flags.add(cpu)
            return True
        return None if text is None else sysfs.read_parsed(path, sysfs.parse_online_flag)


def _node_cpus(folder: Path) -> frozenset[int]:
    cpus = sysfs.read_parsed(folder / "cpulist", sysfs.parse_cpulist)
    if cpus is None:
        cpus = sysfs.read_parsed(folder / "cpumap", sysfs.parse_cpumap)
    if cpus is None:
        cpus = frozenset(_numbered(folder, _CPU_DIR))
    return cpus


def _informative(path: Path, parse: Callable[[str], T], warnings: list[str]) -> T | None:
    """Read an informative field: None, with a warning naming the file and content,
    when it is malformed (or not a regular file) instead of an error."""
    try:
        return sysfs.read_parsed(path, parse)
    except sysfs.SysfsFormatError as exc:
        warnings.append(f"{exc}; the field is left unknown")
        return None


def _distances(
    path: Path,
    node_ids: tuple[int, ...],
    possible: tuple[int, ...] | None,
    warnings: list[str],
) -> dict[int, int] | None:
    """The ``distance`` row mapped to NUMA node ids: one value per online node, or one
    per possible node (``node/possible``) as some kernels and dumps give it."""
    row = _informative(path, sysfs.parse_distance, warnings)
    if row is None:
        return None
    if len(row) == len(node_ids):
        return dict(zip(node_ids, row, strict=True))
    if possible is not None and len(row) == len(possible):
        online = set(node_ids)
        return {node: value for node, value in zip(possible, row, strict=True) if node in online}
    counts = f"{len(node_ids)} online" + (f", {len(possible)} possible" if possible else "")
    content = " ".join(map(str, row))
    warnings.append(
        f"malformed sysfs file {path}: {len(row)} values for {counts} NUMA nodes "
        f"(content: {content[:200]!r}); the field is left unknown"
    )
    return None


def _read_node(
    node_dir: Path,
    node_id: int,
    node_ids: tuple[int, ...],
    possible: tuple[int, ...] | None,
    online: _OnlineCpus,
    warnings: list[str],
) -> NumaNode:
    folder = node_dir / f"node{node_id}"
    if not folder.is_dir():
        return NumaNode(id=node_id, cpus=frozenset(), missing_folder=True)
    all_cpus = _node_cpus(folder)
    cpus = online.filter(all_cpus)
    return NumaNode(
        id=node_id,
        cpus=cpus,
        memory_bytes=_informative(folder / "meminfo", sysfs.parse_meminfo_total, warnings),
        distances=_distances(folder / "distance", node_ids, possible, warnings),
        all_cpus=all_cpus,
        hugepages=_hugepages(folder / "hugepages", warnings),
        sockets=online.packages(cpus, warnings),
    )


def _hugepages(folder: Path, warnings: list[str]) -> tuple[tuple[int, int], ...]:
    """(page size in bytes, pages) per ``hugepages-<kB>kB`` pool under ``folder``; a
    pool whose folder name or ``nr_hugepages`` is malformed is left out with a warning
    naming the file. No folder (a kernel without hugepages): ()."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return ()
    pools = []
    for entry in entries:
        match = _HUGEPAGES_DIR.fullmatch(entry.name)
        if match is None:
            warnings.append(f"unexpected hugepage pool folder {entry}; left out")
            continue
        count = _informative(entry / "nr_hugepages", sysfs.parse_count, warnings)
        if count is not None:
            pools.append((int(match.group(1)) * 1024, count))
    return tuple(sorted(pools))


_HUGEPAGES_DIR = re.compile(r"hugepages-([1-9][0-9]*)kB")


# physical_package_id: -1 where the architecture gives none; the kernel's package ids
# are ints, far below this bound in practice.
_MAX_PACKAGE = 65535


def _parse_package(text: str) -> int:
    """``physical_package_id``: -1 (unknown) or 0..65535. Raises ValueError otherwise."""
    if text == "-1":
        return -1
    if not text.isascii() or not text.isdigit() or int(text) > _MAX_PACKAGE:
        raise ValueError(f"expected -1 or a package id up to {_MAX_PACKAGE}")
    return int(text)
