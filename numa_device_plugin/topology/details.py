"""What an operator needs to write a selector, per NUMA node: each disk's serial, wwid,
model, size and PCI address, each NIC's PCI address and driver, each accelerator's
class and ids (``discover``'s inventory). Disks are whole disks on a PCI device and
native NVMe multipath heads (on their paths' nodes); not partitions, dm, md, loop or
ram devices. NICs are interfaces on a PCI device; not bonds or VLANs (their lower
interfaces are listed).

Read from sysfs (Documentation/ABI/stable/sysfs-block, sysfs-class-net): a disk's
``size`` is in 512-byte sectors whatever its logical block size; ``model`` sits on the
disk's ``device`` (the SCSI device or the NVMe controller); an interface's driver is
the name its ``device/driver`` link points to. Links are followed inside the sysfs root
only; a value that cannot be read is left out (None), never an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.locality import Inventory, Located
from numa_device_plugin.topology.mounts import MountTable
from numa_device_plugin.topology.parts import NVME_HEAD, NVME_PATH
from numa_device_plugin.topology.pci import MAX_DEVICES, is_accelerator

SECTOR_BYTES = 512
# Mount points listed per disk (a disk under a node's pod volumes has one per volume).
MAX_MOUNT_POINTS = 32
# Characters of a model kept (SCSI models are 16, NVMe 40).
MAX_MODEL_CHARS = 64


@dataclass(frozen=True)
class DiskDetails:
    """A whole disk: ``name``, ``nodes``, ``serial``, ``wwid``, ``model``, ``size_bytes``
    and ``pci`` (the addresses it hangs off)."""

    name: str
    nodes: tuple[int, ...]
    serial: str | None
    wwid: str | None
    model: str | None
    size_bytes: int | None
    pci: tuple[str, ...]

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": list(self.nodes), "serial": self.serial,
            "wwid": self.wwid, "model": self.model, "size_bytes": self.size_bytes,
            "pci": list(self.pci),
        }  # fmt: skip


@dataclass(frozen=True)
class NicDetails:
    """An interface on a PCI device: ``name``, ``nodes``, ``pci`` and ``driver``."""

    name: str
    nodes: tuple[int, ...]
    pci: tuple[str, ...]
    driver: str | None

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": list(self.nodes), "pci": list(self.pci),
                "driver": self.driver}  # fmt: skip


def details(
    root: Path, inventory: Inventory, mounts: MountTable | None = None
) -> dict[str, list[dict[str, Any]]]:
    """``{"disks": [...], "nics": [...], "accelerators": [...]}`` of ``inventory`` (read
    under sysfs root ``root``): whole disks and interfaces on a PCI device (not ram,
    loop or virtual ones),
    each once, with their NUMA nodes (empty: no locality); accelerators as ``{"pci",
    "node", "class", "class_name", "id"}``. At most :data:`MAX_DEVICES` of each. Each
    disk's ``mountpoints`` (as lsblk's MOUNTPOINTS, of the disk, its partitions and the
    dm/md devices over them, from ``mounts``, the host's mount table): None when the
    table is unread or is a container's own (:func:`is_a_containers`)."""
    confined = sysfs.Confined(root)
    points = mount_points(inventory, mounts)
    disks = [
        {**_disk(confined, root, d).document(),
         "mountpoints": None if points is None else points.get(d.name, [])}
        for d in inventory.block
        if d.disk == d.name and d.pci and (not d.virtual or is_multipath_head(d))
    ][:MAX_DEVICES]  # fmt: skip
    nics = [_nic(confined, root, n).document() for n in inventory.net if n.pci and not n.parts][
        :MAX_DEVICES
    ]
    accelerators = [
        {
            "pci": d.address,
            "node": d.numa_node,
            "class": f"{d.pci_class:06x}",
            "class_name": d.class_name,
            "id": f"{d.vendor:04x}:{d.device:04x}",
        }
        for d in inventory.pci
        if is_accelerator(d.pci_class)
    ][:MAX_DEVICES]
    return {"disks": disks, "nics": nics, "accelerators": accelerators,
            "mounts": other_mounts(mounts) or []}  # fmt: skip


def mount_points(inventory: Inventory, mounts: MountTable | None) -> dict[str, list[str]] | None:
    """Disk name -> the mount points of the disk, its partitions and the devices made of
    them (sorted, at most :data:`MAX_MOUNT_POINTS` each), of the mounts visible there
    (as ``path:`` finds them: a mount hidden under a later one is not listed); None when
    ``mounts`` is None, unreadable or a container's own table."""
    if mounts is None or mounts.problem is not None or is_a_containers(mounts):
        return None
    disk_of = {d.name: d.disk or d.name for d in inventory.block}
    made_of = {d.name: d.parts for d in inventory.block}
    found: dict[str, set[str]] = {}
    for mount in mounts.mounts:
        if not mounts.visible(mount):
            continue  # hidden by a later mount: its disk is not what is seen there
        disks: set[str] = set()
        pending = list(mount.blocks)
        seen: set[str] = set()
        while pending and len(seen) < 64:  # dm over md over partitions: their disks
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            parts = made_of.get(name, ())
            # a dm or md device: its parts' disks; a multipath head and its partitions
            # (made of the head's paths, which are no disks): the head
            if parts and not all(NVME_PATH.fullmatch(part) for part in parts):
                pending.extend(parts)
            elif name in disk_of:
                disks.add(disk_of[name])
        for disk in disks:
            found.setdefault(disk, set()).add(mount.mount_point)
    return {disk: sorted(points)[:MAX_MOUNT_POINTS] for disk, points in found.items()}


# Mount points of filesystems on no local disk listed at most, and those never listed:
# the kernel's own and the kubelet's per-pod volumes (thousands on a busy node).
MAX_OTHER_MOUNTS = 4096
_NOT_LISTED = re.compile(r"/(proc|sys|dev|run)(/.*)?|/var/lib/kubelet/pods/.*")


def other_mounts(mounts: MountTable | None) -> list[dict[str, Any]] | None:
    """The visible mounts of filesystems on no local disk (NFS, tmpfs, FUSE...), as
    ``{"point", "type"}`` sorted by point, at most :data:`MAX_OTHER_MOUNTS`, neither
    ``/`` nor the kernel's or the kubelet's pod folders: what tells ``check`` that a
    volume's path is on no disk, where the nearest disk mount above it would say the
    root disk. None when the mount points are unknown (as :func:`mount_points`)."""
    if mounts is None or mounts.problem is not None or is_a_containers(mounts):
        return None
    found: dict[str, str] = {}
    for mount in mounts.mounts:
        point = mount.mount_point
        if mount.blocks or point == "/" or _NOT_LISTED.fullmatch(point):
            continue
        if mounts.visible(mount):
            found[point] = mount.fs_type
    return [{"point": point, "type": found[point]} for point in sorted(found)][:MAX_OTHER_MOUNTS]


# Files a container runtime bind-mounts into every container (the kubelet's and
# Docker's); a host's own table has none of them as a mount point.
CONTAINER_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/dev/termination-log")


def is_a_containers(mounts: MountTable) -> bool:
    """Whether ``mounts`` is a container's own table (one of :data:`CONTAINER_FILES` is
    a mount point), not the host's: its mount points name nothing on the host."""
    return any(mount.mount_point in CONTAINER_FILES for mount in mounts.mounts)


def is_multipath_head(device: Located) -> bool:
    """Whether ``device`` is a native NVMe multipath head (``nvme0n1`` under
    ``devices/virtual/nvme-subsystem``, made of its paths ``nvme0c0n1``, ``nvme0c1n1``):
    virtual in sysfs, yet the disk a server mounts and ``lsblk`` lists, so the
    inventory lists it (on its paths' NUMA nodes); a dm or md device is not."""
    return (
        device.virtual
        and NVME_HEAD.fullmatch(device.name) is not None
        and bool(device.parts)
        and all(NVME_PATH.fullmatch(part) for part in device.parts)
    )


def _text(confined: sysfs.Confined, path: Path) -> str | None:
    try:
        return confined.read_text(path) or None
    except sysfs.SysfsError:
        return None


def _inside(confined: sysfs.Confined, link: Path) -> Path | None:
    """The real folder ``link`` resolves to inside the sysfs root, or None."""
    real = confined.folder(link)
    return None if isinstance(real, str) else real


def _disk(confined: sysfs.Confined, root: Path, disk: Located) -> DiskDetails:
    """A disk's details, every file read in a folder resolved inside the root first
    (``class/block/<name>``, then its ``device``): a link out of the root gives None."""
    folder = _inside(confined, root / "class" / "block" / disk.name)
    device = None if folder is None else _inside(confined, folder / "device")
    sectors = None if folder is None else _text(confined, folder / "size")
    model = None if device is None else _text(confined, device / "model")
    # A 64-bit sector count has at most 20 digits; anything else is no size.
    valid = sectors is not None and sectors.isascii() and sectors.isdigit() and len(sectors) <= 20
    size = int(sectors) * SECTOR_BYTES if valid and sectors is not None else None
    return DiskDetails(
        disk.name, tuple(sorted(disk.nodes)), disk.serial, disk.wwid,
        model[:MAX_MODEL_CHARS] if model else None, size, disk.pci,
    )  # fmt: skip


def _nic(confined: sysfs.Confined, root: Path, nic: Located) -> NicDetails:
    driver = confined.folder(root / "class" / "net" / nic.name / "device" / "driver")
    name = None if isinstance(driver, str) else os.path.basename(driver)
    return NicDetails(nic.name, tuple(sorted(nic.nodes)), nic.pci, name)
