"""Synthetic machines of the shapes servers take today, each written as a sysfs root:
a CXL memory expander, a GB200-like board (memory-only HBM nodes holding the GPUs),
AMD NPS4 (2 sockets x 4 NUMA nodes) and Intel SNC-3 (2 sockets x 3 NUMA nodes).

Each NUMA node is (CPUs, socket) with CPUs 0 for a memory-only node; the SLIT is given
by a function of two node ids, as the firmware's table would give it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from numa_device_plugin.topology.fake import DeviceTree, SysfsTree


def machine(
    root: Path,
    layout: Sequence[tuple[int, int | None]],
    distance: Callable[[int, int], int],
    *,
    mem_kb: Callable[[int], int] = lambda node: 1 << 20,
) -> SysfsTree:
    """NUMA nodes 0..len(layout)-1, node i with ``layout[i]`` = (its CPU count, its
    socket; None for a memory-only node), CPUs numbered in node order, each CPU's
    ``topology/physical_package_id`` its node's socket; ``distance(i, j)`` the SLIT."""
    total = sum(cpus for cpus, _ in layout)
    tree = SysfsTree(root).cpus(total, online=f"0-{total - 1}")
    tree.write("node/online", f"0-{len(layout) - 1}\n")
    tree.write("node/possible", f"0-{len(layout) - 1}\n")
    first = 0
    for node, (cpus, socket) in enumerate(layout):
        row = " ".join(str(distance(node, other)) for other in range(len(layout)))
        cpulist = f"{first}-{first + cpus - 1}" if cpus else ""
        tree.node(node, cpulist, distance=row, mem_kb=mem_kb(node))
        for cpu in range(first, first + cpus):
            tree.write(f"cpu/cpu{cpu}/topology/physical_package_id", f"{socket}\n")
        first += cpus
    return tree


def cxl_expander(root: Path) -> SysfsTree:
    """Two sockets (nodes 0 and 1, 4 CPUs each) and a CXL memory expander on socket 0's
    root port: memory-only node 2 (64 GiB), distance 24 from node 0 and 34 from node 1;
    no PCI device on it. And a second expander, node 3, interleaved across both sockets:
    as far from each (28)."""
    slit = {(0, 1): 21, (0, 2): 24, (1, 2): 34, (0, 3): 28, (1, 3): 28, (2, 3): 40}

    def distance(a: int, b: int) -> int:
        return 10 if a == b else slit[(min(a, b), max(a, b))]

    return machine(root, [(4, 0), (4, 1), (0, None), (0, None)], distance,
                   mem_kb=lambda node: 64 << 20 if node >= 2 else 8 << 20)  # fmt: skip


# GB200-like: two Grace CPU nodes; each of the 4 GPUs' HBM is a memory-only node (2-5),
# the GPU's PCI function reporting that node, as the NVIDIA driver's NUMA mode makes.
GB200_GPUS = {2: "0008:01:00.0", 3: "0009:01:00.0", 4: "0018:01:00.0", 5: "0019:01:00.0"}


def gb200_like(root: Path) -> SysfsTree:
    """Grace nodes 0 and 1 (4 CPUs each, sockets 0 and 1, distance 40 between them),
    HBM nodes 2, 3 (GPUs 0 and 1, distance 80 from node 0, 120 from node 1) and 4, 5
    (GPUs 2 and 3, the other way round); HBM to HBM 120. A ConnectX NIC ``ib0`` on
    node 1 itself."""

    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        low, high = min(a, b), max(a, b)
        if high <= 1:
            return 40
        if low <= 1:
            return 80 if (high in (2, 3)) == (low == 0) else 120
        return 120

    tree = machine(root, [(4, 0), (4, 1), (0, None), (0, None), (0, None), (0, None)], distance)
    devices = DeviceTree(tree.root)
    for node, address in GB200_GPUS.items():
        devices.pci(address, node, pci_class="0x030200", vendor="0x10de", device="0x2941")
    devices.pci("0006:01:00.0", 1, pci_class="0x020700", vendor="0x15b3", device="0x1021")
    devices.nic("ib0", "0006:01:00.0")
    return tree


def nps4(root: Path) -> SysfsTree:
    """AMD NPS4: 2 sockets x 4 NUMA nodes of 4 CPUs (nodes 0-3 socket 0, 4-7 socket 1),
    12 within a socket, 32 across; a 100G NIC ``ens1f0`` on node 5 and an NVMe disk
    (serial ``NPS4-DATA``) on node 2."""

    def distance(a: int, b: int) -> int:
        return 10 if a == b else 12 if a // 4 == b // 4 else 32

    tree = machine(root, [(4, node // 4) for node in range(8)], distance)
    devices = DeviceTree(tree.root)
    devices.pci("0000:c1:00.0", 5, pci_class="0x020000", vendor="0x15b3", device="0x101d")
    devices.nic("ens1f0", "0000:c1:00.0")
    devices.pci("0000:41:00.0", 2, pci_class="0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="NPS4-DATA")
    return tree


def snc3(root: Path) -> SysfsTree:
    """Intel SNC-3: 2 sockets x 3 NUMA nodes of 4 CPUs (nodes 0-2 socket 0, 3-5 socket
    1), 12 within a socket, 21 across; an NVMe disk (serial ``SNC-DATA``) on node 4."""

    def distance(a: int, b: int) -> int:
        return 10 if a == b else 12 if a // 3 == b // 3 else 21

    tree = machine(root, [(4, node // 3) for node in range(6)], distance)
    devices = DeviceTree(tree.root)
    devices.pci("0000:81:00.0", 4, pci_class="0x010802")
    devices.disk("nvme1n1", "0000:81:00.0", serial="SNC-DATA")
    return tree
