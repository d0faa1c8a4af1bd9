"""What an operator needs to write a selector, per NUMA node: each disk's serial, wwid,
model, size and PCI address, each NIC's PCI address and driver, each accelerator's
class and ids (``discover``'s inventory).

Read from sysfs (Documentation/ABI/stable/sysfs-block, sysfs-class-net): a disk's
``size`` is in 512-byte sectors whatever its logical block size; ``model`` sits on the
disk's ``device`` (the SCSI device or the NVMe controller); an interface's driver is
the name its ``device/driver`` link points to. Links are followed inside the sysfs root
only; a value that cannot be read is left out (None), never an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.locality import Inventory, Located
from numa_device_plugin.topology.pci import MAX_DEVICES, is_accelerator

SECTOR_BYTES = 512
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


def details(root: Path, inventory: Inventory) -> dict[str, list[dict[str, Any]]]:
    """``{"disks": [...], "nics": [...], "accelerators": [...]}`` of ``inventory`` (read
    under sysfs root ``root``): whole disks and interfaces on a PCI device (not ram,
    loop or virtual ones),
    each once, with their NUMA nodes (empty: no locality); accelerators as ``{"pci",
    "node", "class", "class_name", "id"}``. At most :data:`MAX_DEVICES` of each."""
    confined = sysfs.Confined(root)
    disks = [
        _disk(confined, root, d).document()
        for d in inventory.block
        if d.disk == d.name and not d.virtual and d.pci
    ][:MAX_DEVICES]
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
    return {"disks": disks, "nics": nics, "accelerators": accelerators}


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
