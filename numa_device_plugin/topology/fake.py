"""Synthetic sysfs trees for tests, the benchmarks and the soak.

:class:`SysfsTree` writes ``<root>/devices/system/{cpu,node}`` file by file;
:func:`build_machine` makes a regular machine of any size in one call.
"""

from __future__ import annotations

from pathlib import Path


class SysfsTree:
    """Builds a synthetic sysfs root (``<root>/devices/system/{node,cpu}``) file by file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.system = root / "devices" / "system"
        (self.system / "cpu").mkdir(parents=True)

    def write(self, relative: str, content: str | bytes) -> Path:
        """Write ``devices/system/<relative>``, creating folders; returns the path."""
        path = self.system / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def cpus(self, count: int, online: str | None = None) -> SysfsTree:
        """Create ``cpu/cpu0`` .. ``cpu/cpu<count-1>``; write ``cpu/online`` when given."""
        for cpu in range(count):
            (self.system / "cpu" / f"cpu{cpu}").mkdir(parents=True, exist_ok=True)
        if online is not None:
            self.write("cpu/online", online + "\n")
        return self

    def node(
        self,
        node_id: int,
        cpulist: str | None = None,
        *,
        distance: str | None = None,
        mem_kb: int | None = 1048576,
        hugepages: dict[int, int] | None = None,
    ) -> SysfsTree:
        """Create ``node/node<id>`` with the given cpulist, distance row, MemTotal (kB)
        and hugepage pools (page size in kB -> pages)."""
        folder = self.system / "node" / f"node{node_id}"
        folder.mkdir(parents=True, exist_ok=True)
        if cpulist is not None:
            self.write(f"node/node{node_id}/cpulist", cpulist + "\n")
        if distance is not None:
            self.write(f"node/node{node_id}/distance", distance + "\n")
        if mem_kb is not None:
            self.write(
                f"node/node{node_id}/meminfo",
                f"Node {node_id} MemTotal:  {mem_kb} kB\nNode {node_id} MemFree:  1 kB\n",
            )
        for size_kb, pages in (hugepages or {}).items():
            self.write(
                f"node/node{node_id}/hugepages/hugepages-{size_kb}kB/nr_hugepages", f"{pages}\n"
            )
        return self


def build_machine(root: Path, nodes: int, cpus_per_node: int = 2) -> SysfsTree:
    """A machine with ``nodes`` NUMA nodes of ``cpus_per_node`` online CPUs each,
    distances 10 local and 20 remote, 1 GiB per node."""
    total = nodes * cpus_per_node
    tree = SysfsTree(root).cpus(total, online=f"0-{total - 1}")
    tree.write("node/online", f"0-{nodes - 1}\n")
    for node in range(nodes):
        first = node * cpus_per_node
        row = " ".join("10" if other == node else "20" for other in range(nodes))
        tree.node(node, f"{first}-{first + cpus_per_node - 1}", distance=row)
    return tree
