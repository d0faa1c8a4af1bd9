"""Fake hosts to try the plugin on before a cluster: a folder laid out as a server's
views, ``HOST/sys`` (a sysfs root: NUMA nodes, CPUs, PCI devices, disks with their
partitions, NICs, and the ``dev/block/MAJ:MIN`` links a ``path:`` selector follows from a
mount to its disk) and ``HOST/proc/1/mountinfo`` (its mount table). ``discover``,
``demo`` and ``status`` given ``--sysfs-root HOST/sys`` read ``HOST/proc/1/mountinfo``
beside it (:func:`numa_device_plugin.cli.hostviews.own_mount_table`).

Machines (:data:`MACHINES`):

- ``two-socket-storage``: two sockets, one NUMA node each (CPUs 0-3 and 4-7, 16 GiB
  each); the root disk ``sda`` (``sda1`` at ``/``) on node 0; two NVMe data disks,
  ``nvme0n1`` (serial ``CH-0001``, ``nvme0n1p1`` at ``/data/ch``) on node 0 and
  ``nvme1n1`` (serial ``KF-0001``, ``nvme1n1p1`` at ``/data/kafka``) on node 1; a 100G
  NIC ``ens1f0`` (``15b3:101d``) on node 1. ``swapped``: the same server cabled the other
  way round, ``/data/ch``'s disk on node 1 and ``/data/kafka``'s on node 0 (the serials
  follow the disks: ``CH-0002``, ``KF-0002``).
"""

from __future__ import annotations

from pathlib import Path

from numa_device_plugin.topology.fake import DeviceTree, SysfsTree

MACHINES = ("two-socket-storage",)
GIB_KB = 1 << 20


def build_host(folder: Path, machine: str = "two-socket-storage", swapped: bool = False) -> Path:
    """Write the fake host ``machine`` into ``folder`` (absent or empty) and return its
    sysfs root, ``folder/sys``. Raises ValueError for an unknown machine or a folder
    that holds something."""
    if machine not in MACHINES:
        raise ValueError(f"no machine {machine!r}: one of {', '.join(MACHINES)}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} is not an empty folder: a fake host is written into a new one")
    root = folder / "sys"
    tree = SysfsTree(root).cpus(8, online="0-7")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-3", distance="10 21", mem_kb=16 * GIB_KB)
    tree.node(1, "4-7", distance="21 10", mem_kb=16 * GIB_KB)
    devices = DeviceTree(root)
    devices.pci("0000:00:17.0", 0, "0x010601", "0x8086", "0xa182")  # SATA: the root disk
    devices.pci("0000:41:00.0", 0, "0x010802")  # NVMe, socket 0
    devices.pci("0000:c1:00.0", 1, "0x010802")  # NVMe, socket 1
    devices.pci("0000:c2:00.0", 1, "0x020000", "0x15b3", "0x101d")  # 100G NIC, socket 1
    sata = devices.pci_folder("0000:00:17.0") / "ata1" / "host0" / "target0:0:0" / "0:0:0:0"
    (sata / "block" / "sda" / "sda1").mkdir(parents=True)
    (sata / "block" / "sda" / "sda1" / "partition").write_text("1\n")
    DeviceTree._link(root / "class" / "block" / "sda", sata / "block" / "sda")
    DeviceTree._link(root / "class" / "block" / "sda1", sata / "block" / "sda" / "sda1")
    ch, kafka = ("nvme1n1", "nvme0n1") if swapped else ("nvme0n1", "nvme1n1")
    serial = "0002" if swapped else "0001"
    devices.disk("nvme0n1", "0000:41:00.0", serial=f"{'KF' if swapped else 'CH'}-{serial}",
                 partitions=1)  # fmt: skip
    devices.disk("nvme1n1", "0000:c1:00.0", serial=f"{'CH' if swapped else 'KF'}-{serial}",
                 partitions=1)  # fmt: skip
    devices.nic("ens1f0", "0000:c2:00.0")
    numbers = {"sda1": "8:1", "nvme0n1p1": "259:1", "nvme1n1p1": "259:3"}
    for name, number in numbers.items():  # what a mount's major:minor leads to
        DeviceTree._link(
            root / "dev" / "block" / number, (root / "class" / "block" / name).resolve()
        )
    table = folder / "proc" / "1" / "mountinfo"
    table.parent.mkdir(parents=True)
    table.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"30 22 {numbers[ch + 'p1']} / /data/ch rw,noatime shared:20 - xfs /dev/{ch}p1 rw\n"
        f"31 22 {numbers[kafka + 'p1']} / /data/kafka rw,noatime shared:21 - xfs "
        f"/dev/{kafka}p1 rw\n"
    )
    return root
