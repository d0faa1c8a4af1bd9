"""Which NUMA node a PCI device, a disk or a network interface sits on, from sysfs.

:func:`read_inventory` turns a sysfs root into a plain :class:`Inventory`: every PCI
device with its ``numa_node``, class, vendor and device id; every block device and
network interface with the NUMA node(s) of the PCI device(s) under it. Nothing here
logs; odd content becomes a line of :attr:`Inventory.warnings` naming the file, or a
device whose :attr:`~Located.reason` says why it has no locality.

The rules follow the kernel's sysfs ABI (Documentation/ABI/testing/sysfs-bus-pci,
sysfs-block, sysfs-class-net):

- ``bus/pci/devices/<address>`` links to the device's folder under ``devices/``; its
  ``numa_node`` is the NUMA node the firmware (ACPI ``_PXM``) gave the device, ``-1``
  when it gave none: *no locality*, never node 0. ``class`` is 24 bits
  (``0x010802``: base class, subclass, programming interface); ``vendor`` and
  ``device`` 16 bits.
- ``class/block/<name>`` and ``class/net/<name>`` link to the device's folder; its
  NUMA node is the ``numa_node`` of the nearest folder above it that has one (its PCI
  device). A partition's folder lies inside its disk's, so it has its disk's node.
- A device-mapper or md device (``devices/virtual/block/dm-0``) is made of the block
  devices in its ``slaves/``; a VLAN or a bond (``devices/virtual/net/bond0``) of the
  interfaces its ``lower_<name>`` links name. Each part is resolved in turn: the
  device's NUMA nodes are those of all its parts, and it has no locality when any
  part has none (its data or traffic goes through that part too).
- Other virtual devices (``lo``, ``loop0``, ``ram0``, a bridge without lowers) have
  no locality.

Links are resolved inside the sysfs root only: a link that leaves it, a loop or a
missing target makes that device's locality unknown, with the reason. Every count is
bounded (:data:`MAX_DEVICES` per kind, :data:`MAX_PARTS` parts of a device,
:data:`MAX_DEPTH` levels of parts) and each device is resolved once, so a hostile tree
costs time linear in what is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.pci import (
    MAX_DEVICES,
    PciDevice,
    is_accelerator,
    list_entries,
    parse_numa_node,
    read_pci_devices,
)

# Levels of slaves/lower_* followed (dm over md over partitions is 3).
MAX_DEPTH = 8
# Parts of one device read (md arrays and bonds have a few dozen at most).
MAX_PARTS = 256
# Characters of an identifier (serial, wwid) kept; NVMe serials are 20, wwids ~80.
MAX_ID_CHARS = 256


@dataclass(frozen=True)
class Located:
    """A block device or a network interface and where it sits.

    ``name``: the kernel's name (``nvme0n1``, ``sda1``, ``eth0``); ``nodes``: its NUMA
    nodes (empty: no locality, then ``reason`` says why); ``pci``: the addresses of
    the PCI devices it hangs off (several for a dm, md or bond device); ``parts``: for
    a device made of others, their names. Block devices only: ``disk`` (the whole
    disk of a partition, else its own name), ``serial`` and ``wwid`` (sysfs's
    ``serial``/``wwid`` of the disk or of its ``device``, None when absent),
    ``virtual`` (under ``devices/virtual``).
    """

    name: str
    nodes: frozenset[int]
    pci: tuple[str, ...] = ()
    reason: str | None = None
    parts: tuple[str, ...] = ()
    disk: str = ""
    serial: str | None = None
    wwid: str | None = None
    virtual: bool = False

    @property
    def located(self) -> bool:
        return bool(self.nodes)


@dataclass(frozen=True)
class Inventory:
    """The devices of one sysfs root, each kind sorted by name: ``pci`` by address,
    ``block`` and ``net`` by kernel name, numbers by value (``nvme2n1`` before
    ``nvme10n1``). ``warnings``: odd sysfs content, one line per
    file, naming it."""

    pci: tuple[PciDevice, ...] = ()
    block: tuple[Located, ...] = ()
    net: tuple[Located, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def pci_device(self, address: str) -> PciDevice | None:
        """The PCI device at ``address``, or None."""
        return next((d for d in self.pci if d.address == address), None)


def read_inventory(sysfs_root: Path) -> Inventory:
    """Read the PCI devices, block devices and network interfaces under ``sysfs_root``
    (``bus/pci/devices``, ``class/block``, ``class/net``; a missing folder is an empty
    kind). Never raises for sysfs content: a device whose files are malformed is left
    out (PCI) or gets no locality (block, net), with a warning naming the file."""
    reader = _Reader(sysfs_root)
    pci = read_pci_devices(sysfs_root, reader.warnings)
    block = reader.located("block")
    net = reader.located("net")
    return Inventory(pci=pci, block=block, net=net, warnings=tuple(reader.warnings))


class _Reader:
    """One reading of a sysfs root; remembers each folder's NUMA node."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.real_root = Path(os.path.realpath(root))
        except (OSError, ValueError):
            self.real_root = root
        self.warnings: list[str] = []
        # Real folder -> its own numa_node (None: -1), or "" when it has no such file.
        self._numa: dict[str, int | str | None] = {}
        # Every real path inside the root starts with this.
        self._root_prefix = os.path.join(str(self.real_root), "")
        self._cut: set[str] = set()
        # Per kind: name -> (where it sits, height of its parts); names being resolved.
        self._done: dict[str, tuple[Located, int]] = {}
        self._busy: set[str] = set()

    # -- listing ---------------------------------------------------------------------------

    def located(self, kind: str) -> tuple[Located, ...]:
        folder = self.root / "class" / kind
        what = "block devices" if kind == "block" else "network interfaces"
        self._done, self._busy = {}, set()
        return tuple(
            self._locate(kind, name)[0]
            for name in list_entries(folder, what, self.warnings, natural=True)
            if name.isprintable() and "/" not in name
        )

    # -- one device ------------------------------------------------------------------------

    def _locate(self, kind: str, name: str) -> tuple[Located, int]:
        """Where ``class/<kind>/<name>`` sits, and the height of its tree of parts (0: it
        has none). Each device is resolved once per kind (a part shared by many is not
        walked again); a device met again while its own parts are being resolved is a
        loop."""
        if name in self._done:
            return self._done[name]
        if name in self._busy:
            return Located(name, frozenset(), reason="no locality: its parts loop back to it"), 0
        self._busy.add(name)
        try:
            found = self._resolve(kind, name)
        finally:
            self._busy.discard(name)
        self._done[name] = found
        return found

    def _resolve(self, kind: str, name: str) -> tuple[Located, int]:
        link = self.root / "class" / kind / name
        target = self._inside(link)
        if isinstance(target, str):
            return Located(
                name, frozenset(), reason=target, disk=name if kind == "block" else ""
            ), 0
        base = Located(
            name, frozenset(), virtual="virtual" in target.relative_to(self.real_root).parts[:2]
        )
        if kind == "block":
            disk, serial, wwid = self._disk_ids(target, name)
            base = replace(base, disk=disk, serial=serial, wwid=wwid)
        parts = self._parts(kind, target / ("slaves" if kind == "block" else ""))
        if parts:
            return self._composite(kind, base, parts)
        pci, node = self._nearest_pci(target)
        if pci is None:
            why = "a virtual device" if base.virtual else "no PCI device above it in sysfs"
            return replace(base, reason=f"no locality: {why}"), 0
        if node is None:
            reason = (
                f"no locality: PCI device {pci} has numa_node -1 (the firmware gave no proximity)"
            )
            return replace(base, pci=(pci,), reason=reason), 0
        if isinstance(node, str):
            return replace(base, pci=(pci,), reason=node), 0
        return replace(base, nodes=frozenset({node}), pci=(pci,)), 0

    def _composite(self, kind: str, base: Located, parts: list[str]) -> tuple[Located, int]:
        """A dm/md device or a VLAN/bond: the union of its parts' NUMA nodes, or no
        locality when a part has none or the parts nest over :data:`MAX_DEPTH` deep."""
        base = replace(base, parts=tuple(parts))
        nodes: set[int] = set()
        pci: list[str] = []
        height = 0
        for part in parts:
            located, below = self._locate(kind, part)
            height = max(height, below + 1)
            if not located.located:
                why = (located.reason or "").removeprefix("no locality: ")
                if why.startswith("its part "):
                    why = why.split(": ", 1)[-1]  # the first cause, not the whole chain
                return replace(base, reason=f"no locality: its part {part} has none: {why}"), height
            nodes |= located.nodes
            pci.extend(a for a in located.pci if a not in pci)
        if height > MAX_DEPTH:
            return replace(base, reason=f"no locality: parts nested over {MAX_DEPTH} deep"), height
        return replace(base, nodes=frozenset(nodes), pci=tuple(pci)), height

    def _parts(self, kind: str, folder: Path) -> list[str]:
        """The names of the devices ``target`` is made of: ``slaves/*`` of a block
        device, the ``lower_<name>`` links of an interface."""
        try:
            with os.scandir(folder) as entries:
                names = [entry.name for entry in entries]
        except OSError:
            return []
        if kind == "net":
            names = [n.removeprefix("lower_") for n in names if n.startswith("lower_")]
        names = [n for n in names if n and n.isprintable()]
        if len(names) > MAX_PARTS:
            self.warnings.append(f"{folder} names over {MAX_PARTS} parts; the rest left out")
        return sorted(names)[:MAX_PARTS]

    def _inside(self, link: Path) -> Path | str:
        """The real folder ``link`` points to, or why it cannot be used."""
        try:
            real = os.path.realpath(link, strict=True)
        except FileNotFoundError:
            return f"no locality: {link} points to nothing"
        except (OSError, RuntimeError, ValueError) as exc:
            return f"no locality: {link} cannot be resolved ({getattr(exc, 'strerror', exc)})"
        if not real.startswith(self._root_prefix):
            return f"no locality: {link} points outside the sysfs root"
        if not os.path.isdir(real):
            return f"no locality: {link} is not a folder"
        return Path(real)

    def _nearest_pci(self, folder: Path) -> tuple[str | None, int | str | None]:
        """The nearest folder at or above ``folder`` (inside the root) with a
        ``numa_node`` file: (its name, its node or None for -1, or why it is unusable);
        (None, None) when there is none."""
        current = str(folder)
        while current.startswith(self._root_prefix):
            node = self._numa_of(current)
            if node != "":
                return os.path.basename(current), node
            current = os.path.dirname(current)
        return None, None

    def _numa_of(self, folder: str) -> int | str | None:
        """``folder``'s own numa_node: the node, None for -1, "" when there is no file,
        or a reason text when it is malformed."""
        if folder in self._numa:
            return self._numa[folder]
        path = Path(folder, "numa_node")
        result: int | str | None
        try:
            text = sysfs.read_text(path)
            result = "" if text is None else parse_numa_node(text)
        except sysfs.SysfsError as exc:
            result = f"no locality: {exc}"
            self._warn_once(str(exc))
        except ValueError as exc:
            error = sysfs.SysfsFormatError(path, text or "", str(exc))
            result = f"no locality: {error}"
            self._warn_once(str(error))
        if len(self._numa) < 4 * MAX_DEVICES:
            self._numa[folder] = result
        return result

    def _warn_once(self, line: str) -> None:
        if line not in self._cut:
            self._cut.add(line)
            self.warnings.append(line)

    def _disk_ids(self, target: Path, name: str) -> tuple[str, str | None, str | None]:
        """(the disk's name, its serial, its wwid) for block device folder ``target``:
        a partition (a ``partition`` file) takes its disk's, the folder above it."""
        disk_folder = target
        if (target / "partition").is_file():
            disk_folder = target.parent
        disk = disk_folder.name if disk_folder != target else name
        serial = self._identifier(disk_folder, "serial")
        wwid = self._identifier(disk_folder, "wwid")
        return disk, serial, wwid

    def _identifier(self, folder: Path, attribute: str) -> str | None:
        """``folder/<attribute>``, else ``folder/device/<attribute>`` (NVMe and SCSI keep
        them on the controller or the SCSI device), stripped; None when absent, empty
        or unreadable (with a warning)."""
        for path in (folder / attribute, folder / "device" / attribute):
            try:
                text = sysfs.read_text(path)
            except sysfs.SysfsError as exc:
                self._warn_once(f"{exc}; the {attribute} is left unknown")
                continue
            if text:
                return text[:MAX_ID_CHARS]
        return None


@dataclass(frozen=True)
class NodeDevices:
    """What sits on one NUMA node: ``disks`` (whole, non-virtual disks by name),
    ``nics`` (interfaces on a PCI device, not bonds or VLANs), ``accelerators``
    (``address class-in-words``) and ``pci`` (how many PCI devices in all)."""

    disks: tuple[str, ...]
    nics: tuple[str, ...]
    accelerators: tuple[str, ...]
    pci: int

    def document(self) -> dict[str, list[str] | int]:
        """As JSON: ``{"disks": [...], "nics": [...], "accelerators": [...], "pci": N}``."""
        return {
            "disks": list(self.disks),
            "nics": list(self.nics),
            "accelerators": list(self.accelerators),
            "pci": self.pci,
        }


NO_DEVICES = NodeDevices((), (), (), 0)


def devices_by_node(inventory: Inventory) -> dict[int, NodeDevices]:
    """What sits on each NUMA node, in one pass over ``inventory`` (time linear in the
    devices, whatever the number of NUMA nodes); a node with nothing is absent: use
    :data:`NO_DEVICES`."""
    disks: dict[int, list[str]] = {}
    nics: dict[int, list[str]] = {}
    accelerators: dict[int, list[str]] = {}
    pci: dict[int, int] = {}
    for block in inventory.block:
        if block.disk == block.name and not block.virtual:
            for node in sorted(block.nodes):
                disks.setdefault(node, []).append(block.name)
    for interface in inventory.net:
        if not interface.parts:
            for node in sorted(interface.nodes):
                nics.setdefault(node, []).append(interface.name)
    for device in inventory.pci:
        if device.numa_node is not None:
            pci[device.numa_node] = pci.get(device.numa_node, 0) + 1
            if is_accelerator(device.pci_class):
                accelerators.setdefault(device.numa_node, []).append(
                    f"{device.address} {device.class_name}"
                )
    return {
        node: NodeDevices(
            tuple(disks.get(node, ())),
            tuple(nics.get(node, ())),
            tuple(accelerators.get(node, ())),
            pci.get(node, 0),
        )
        for node in sorted({*disks, *nics, *pci})
    }


def unlocated_pci(inventory: Inventory) -> int:
    """How many PCI devices have ``numa_node`` -1 (no locality)."""
    return sum(1 for d in inventory.pci if d.numa_node is None)
