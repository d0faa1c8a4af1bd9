"""PCI devices as sysfs shows them: address, ``numa_node``, class and ids, and the
class codes in words.

``bus/pci/devices/<address>`` (Documentation/ABI/testing/sysfs-bus-pci) links to the
device's folder; ``numa_node`` is the NUMA node the firmware (ACPI ``_PXM``) gave it,
``-1`` when none (no locality, never node 0); ``class`` is 24 bits (``0x010802``: base
class, subclass, programming interface), ``vendor`` and ``device`` 16 bits. Nothing here
logs: faults become lines of the caller's ``warnings``, naming the file.
"""

from __future__ import annotations

import functools
import heapq
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numa_device_plugin.topology import sysfs

# The kernel numbers NUMA nodes below 1 << CONFIG_NODES_SHIFT, and NODES_SHIFT is at
# most 10 on every architecture: a numa_node above this is garbage.
MAX_NUMA_NODE_ID = 1023
# PCI devices (and block devices, interfaces) read per kind; large servers have a few
# thousand.
MAX_DEVICES = 16384

PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HEX = re.compile(r"0x[0-9a-fA-F]{1,6}")

# PCI class codes (base class << 8 | subclass) in words, from the PCI-SIG's code and
# ID assignment specification; the base class alone where the subclass is not listed.
PCI_CLASS_NAMES: dict[int, str] = {
    0x0100: "SCSI storage controller",
    0x0101: "IDE controller",
    0x0104: "RAID controller",
    0x0105: "ATA controller",
    0x0106: "SATA controller",
    0x0107: "SAS controller",
    0x0108: "NVMe controller",
    0x0180: "mass storage controller",
    0x0200: "Ethernet controller",
    0x0207: "InfiniBand controller",
    0x0280: "network controller",
    0x0300: "VGA controller",
    0x0302: "3D controller",
    0x0380: "display controller",
    0x0403: "audio device",
    0x0600: "host bridge",
    0x0601: "ISA bridge",
    0x0604: "PCI bridge",
    0x0880: "system peripheral",
    0x0B40: "co-processor",
    0x0C03: "USB controller",
    0x0C05: "SMBus controller",
    0x0C06: "InfiniBand controller",
    0x1080: "encryption controller",
    0x1200: "processing accelerator",
    0x1280: "processing accelerator",
}
_BASE_CLASS_NAMES: dict[int, str] = {
    0x01: "mass storage controller",
    0x02: "network controller",
    0x03: "display controller",
    0x04: "multimedia controller",
    0x05: "memory controller",
    0x06: "bridge",
    0x07: "communication controller",
    0x08: "system peripheral",
    0x0B: "processor",
    0x0C: "serial bus controller",
    0x0D: "wireless controller",
    0x10: "encryption controller",
    0x11: "signal processing controller",
    0x12: "processing accelerator",
}
# Base classes (and class codes) that count as accelerators in listings.
_ACCELERATOR_CLASSES = (0x0302, 0x0380, 0x0B40, 0x1200, 0x1280)


def pci_class_name(pci_class: int) -> str:
    """``0x010802`` -> ``NVMe controller``: the class code (24 bits, from the device's
    ``class`` file) in words; ``class 0xXXXXXX`` for codes not in the table."""
    code = pci_class >> 8
    return (
        PCI_CLASS_NAMES.get(code)
        or _BASE_CLASS_NAMES.get(pci_class >> 16)
        or f"class {pci_class:#08x}"
    )


def is_accelerator(pci_class: int) -> bool:
    """True for 3D and display controllers, co-processors and processing accelerators."""
    return (pci_class >> 8) in _ACCELERATOR_CLASSES


@dataclass(frozen=True)
class PciDevice:
    """One PCI function: ``address`` (``0000:41:00.0``), ``numa_node`` (None: ``-1``,
    no locality), ``pci_class`` (24 bits), ``vendor`` and ``device`` (16 bits), from
    ``bus/pci/devices/<address>/{numa_node,class,vendor,device}``."""

    address: str
    numa_node: int | None
    pci_class: int
    vendor: int
    device: int

    @property
    def class_name(self) -> str:
        return pci_class_name(self.pci_class)


def parse_numa_node(text: str) -> int | None:
    """A device's ``numa_node``: ``-1`` -> None (no locality), else 0..MAX_NUMA_NODE_ID.
    Raises ValueError otherwise."""
    if text == "-1":
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 4:
        raise ValueError("expected -1 or a NUMA node id")
    node = int(text)
    if node > MAX_NUMA_NODE_ID:
        raise ValueError(f"NUMA node {node} is above the kernel's limit ({MAX_NUMA_NODE_ID})")
    return node


def _hex_parser(bits: int, what: str) -> Callable[[str], int]:
    """A parser of ``0x``-prefixed hex values of at most ``bits`` bits (ValueError)."""

    def parse(text: str) -> int:
        if not _HEX.fullmatch(text):
            raise ValueError(f"expected a {what} in hex (0x...)")
        value = int(text, 16)
        if value >= 1 << bits:
            raise ValueError(f"a {what} has {bits} bits")
        return value

    return parse


parse_pci_class = _hex_parser(24, "PCI class code")
parse_pci_id = _hex_parser(16, "PCI id")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders numbers in names by value: ``nvme2n1`` before ``nvme10n1``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)
    )


def list_entries(
    folder: Path,
    kind: str,
    warnings: list[str],
    *,
    natural: bool = False,
    cut: list[str] | None = None,
) -> list[str]:
    """The names in ``folder``, sorted (``natural``: numbers by value, for kernel
    names); [] when it does not exist or cannot be listed (with a warning).

    At most :data:`MAX_DEVICES` are kept, and always the same ones whatever order the
    folder lists them in: the first in sort order (a bounded heap, so memory stays
    at the cap however large the folder). Past the cap a warning says so and ``kind``
    is appended to ``cut``."""
    key: Callable[[str], Any] = natural_key if natural else _plain
    heap: list[tuple[Any, str]] = []  # the kept names, largest first (negated order)
    seen = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                seen += 1
                item = (_Reversed(key(entry.name)), entry.name)
                if len(heap) < MAX_DEVICES:
                    heapq.heappush(heap, item)
                elif item[0] > heap[0][0]:  # sorts before the largest kept name
                    heapq.heapreplace(heap, item)
    except FileNotFoundError:
        return []
    except OSError as exc:
        warnings.append(f"cannot list {folder}: {exc.strerror or exc}; no {kind} read")
        return []
    if seen > MAX_DEVICES:
        warnings.append(
            f"{folder} lists {seen} {kind}, more than {MAX_DEVICES}; the first "
            f"{MAX_DEVICES} in name order are read, the rest left out"
        )
        if cut is not None:
            cut.append(kind)
    return sorted((name for _, name in heap), key=key)


def _plain(name: str) -> str:
    return name


@functools.total_ordering
class _Reversed:
    """A sort key turned around, so that :mod:`heapq`'s min-heap keeps the largest."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and bool(self.key == other.key)

    def __lt__(self, other: _Reversed) -> bool:
        return bool(self.key > other.key)


def read_pci_devices(
    root: Path, warnings: list[str], cut: list[str] | None = None
) -> tuple[PciDevice, ...]:
    """Every ``bus/pci/devices/<address>`` under sysfs root ``root``, by address; a
    device whose files are missing or malformed, or whose link or files lead out of
    the root (:class:`~numa_device_plugin.topology.sysfs.Confined`), is left out with a
    warning naming the file (``warnings``). Past :data:`MAX_DEVICES`, "PCI devices" is
    appended to ``cut`` (:func:`list_entries`)."""
    folder = root / "bus" / "pci" / "devices"
    confined = sysfs.Confined(root)
    found = []
    for address in list_entries(folder, "PCI devices", warnings, cut=cut):
        if not PCI_ADDRESS.fullmatch(address):
            warnings.append(
                f"{folder / address} is not named as a PCI address "
                f"(domain:bus:device.function); left out"
            )
            continue
        real = confined.folder(folder / address)
        if isinstance(real, str):
            warnings.append(f"{real}; PCI device {address} left out")
            continue
        device = _pci_device(confined, real, address, warnings)
        if device is not None:
            found.append(device)
    return tuple(found)


def _pci_device(
    confined: sysfs.Confined, path: Path, address: str, warnings: list[str]
) -> PciDevice | None:
    try:
        numa = confined.read_parsed(path / "numa_node", parse_numa_node)
        pci_class = confined.read_parsed(path / "class", parse_pci_class)
        vendor = confined.read_parsed(path / "vendor", parse_pci_id)
        device = confined.read_parsed(path / "device", parse_pci_id)
    except sysfs.SysfsError as exc:
        warnings.append(f"{exc}; PCI device {address} left out")
        return None
    if pci_class is None or vendor is None or device is None:
        warnings.append(f"{path} lacks class, vendor or device; PCI device {address} left out")
        return None
    return PciDevice(address, numa, pci_class, vendor, device)
