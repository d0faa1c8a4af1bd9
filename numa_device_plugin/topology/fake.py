"""Synthetic sysfs trees for tests, the benchmarks and the soak.

:class:`SysfsTree` writes ``<root>/devices/system/{cpu,node}`` file by file;
:func:`build_machine` makes a regular machine of any size in one call.
"""

from __future__ import annotations

import os
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


class DeviceTree:
    """Adds PCI devices, disks and network interfaces to a synthetic sysfs root, laid
    out as the kernel lays them out: ``devices/pci<domain>:<bus>/<address>/`` with
    ``numa_node``, ``class``, ``vendor`` and ``device``; ``bus/pci/devices/<address>``,
    ``class/block/<name>`` and ``class/net/<name>`` as relative links to their folders;
    virtual ones under ``devices/virtual/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for folder in ("bus/pci/devices", "class/block", "class/net", "devices/virtual"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    def pci(
        self,
        address: str,
        numa_node: int | str = -1,
        pci_class: str = "0x010802",
        vendor: str = "0x144d",
        device: str = "0xa808",
        *,
        parent: str | None = None,
    ) -> Path:
        """A PCI device (under bridge ``parent``'s folder when given); its folder."""
        folder = (
            self.pci_folder(parent) / address
            if parent
            else self.root / "devices" / f"pci{address[:7]}" / address
        )
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("numa_node", numa_node),
            ("class", pci_class),
            ("vendor", vendor),
            ("device", device),
        ):
            (folder / name).write_text(f"{value}\n")
        self._link(self.root / "bus" / "pci" / "devices" / address, folder)
        return folder

    def pci_folder(self, address: str) -> Path:
        """The folder of the PCI device at ``address`` (it must exist)."""
        return (self.root / "bus" / "pci" / "devices" / address).resolve()

    def disk(
        self,
        name: str,
        address: str | None,
        *,
        serial: str | None = None,
        wwid: str | None = None,
        partitions: int = 0,
    ) -> Path:
        """A disk on the PCI device at ``address`` (None: virtual), with ``serial`` and
        ``wwid`` files and ``partitions`` partitions ``<name>p1``..; its folder."""
        if address is None:
            folder = self.root / "devices" / "virtual" / "block" / name
        else:
            folder = self.pci_folder(address) / "nvme" / "nvme0" / name
        folder.mkdir(parents=True, exist_ok=True)
        if serial is not None:
            (folder / "serial").write_text(f"{serial}\n")
        if wwid is not None:
            (folder / "wwid").write_text(f"{wwid}\n")
        self._link(self.root / "class" / "block" / name, folder)
        for number in range(1, partitions + 1):
            part = folder / f"{name}p{number}"
            part.mkdir()
            (part / "partition").write_text(f"{number}\n")
            self._link(self.root / "class" / "block" / part.name, part)
        return folder

    def mapped(self, name: str, slaves: list[str]) -> Path:
        """A device-mapper or md device ``name`` made of the block devices ``slaves``."""
        folder = self.disk(name, None)
        (folder / "slaves").mkdir(exist_ok=True)
        for slave in slaves:
            self._link(folder / "slaves" / slave, self.root / "class" / "block" / slave)
        return folder

    def nic(self, name: str, address: str | None, lowers: tuple[str, ...] = ()) -> Path:
        """An interface on the PCI device at ``address`` (None: virtual, with the
        ``lower_<name>`` links of a bond or VLAN); its folder."""
        if address is None:
            folder = self.root / "devices" / "virtual" / "net" / name
        else:
            folder = self.pci_folder(address) / "net" / name
        folder.mkdir(parents=True, exist_ok=True)
        for lower in lowers:
            self._link(folder / f"lower_{lower}", self.root / "class" / "net" / lower)
        self._link(self.root / "class" / "net" / name, folder)
        return folder

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        """A relative symlink ``link`` -> ``target``, as sysfs makes them."""
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))
