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
  part has none (its data or traffic goes through that part too). A part left out
  (over :data:`MAX_PARTS`, or a name that is not printable) leaves the device
  without locality, never with the nodes of the others.
- A native NVMe multipath head (``devices/virtual/nvme-subsystem/nvme-subsys0/
  nvme0n1``) is made of its paths (``nvme0c0n1`` under each controller): a dual-port
  drive on two NUMA nodes has both.
- Other virtual devices (``lo``, ``loop0``, ``ram0``, a bridge without lowers) have
  no locality.

Every link and file is resolved inside the sysfs root only
(:class:`~numa_device_plugin.topology.sysfs.Confined`): a link that leaves it, a loop
or a missing target makes that device's locality unknown, with the reason. Every count is
bounded (:data:`MAX_DEVICES` per kind, :data:`MAX_PARTS` parts of a device,
:data:`MAX_DEPTH` levels of parts, walked with a stack of its own, not by recursion) and each
device is resolved once, so a hostile tree costs time linear in what is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.parts import MAX_DEPTH as MAX_DEPTH
from numa_device_plugin.topology.parts import MAX_PARTS, NVME_HEAD, PartsWalk, nvme_paths
from numa_device_plugin.topology.parts import Located as Located
from numa_device_plugin.topology.pci import (
    MAX_DEVICES,
    PciDevice,
    list_entries,
    natural_key,
    parse_numa_node,
    read_pci_devices,
)

# Characters of an identifier (serial, wwid) kept; NVMe serials are 20, wwids ~80.
MAX_ID_CHARS = 256


@dataclass(frozen=True)
class Inventory:
    """The devices of one sysfs root, each kind sorted by name: ``pci`` by address,
    ``block`` and ``net`` by kernel name, numbers by value (``nvme2n1`` before
    ``nvme10n1``). ``warnings``: odd sysfs content, one line per file, naming it.
    ``cut``: the kinds (``PCI devices``, ``block devices``, ``network interfaces``)
    whose folder listed more than :data:`~numa_device_plugin.topology.pci.MAX_DEVICES`:
    only the first in name order were read."""

    pci: tuple[PciDevice, ...] = ()
    block: tuple[Located, ...] = ()
    net: tuple[Located, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)
    cut: tuple[str, ...] = field(default=(), compare=False)

    def pci_device(self, address: str) -> PciDevice | None:
        """The PCI device at ``address``, or None."""
        return next((d for d in self.pci if d.address == address), None)

    def blocks_named(self, names: tuple[str, ...]) -> list[Located]:
        """The block devices whose kernel names are among ``names``, in :attr:`block`'s
        order (an index made once: every ``path:`` selector of a look asks)."""
        index = self._block_index
        found = sorted(index[name] for name in set(names) if name in index)
        return [device for _, device in found]

    @cached_property
    def _block_index(self) -> dict[str, tuple[int, Located]]:
        """Each block device's kernel name -> (its place in :attr:`block`, it)."""
        return {device.name: (position, device) for position, device in enumerate(self.block)}


def read_inventory(sysfs_root: Path) -> Inventory:
    """Read the PCI devices, block devices and network interfaces under ``sysfs_root``
    (``bus/pci/devices``, ``class/block``, ``class/net``; a missing folder is an empty
    kind). Never raises for sysfs content: a device whose files are malformed is left
    out (PCI) or gets no locality (block, net), with a warning naming the file."""
    reader = _Reader(sysfs_root)
    cut: list[str] = []
    pci = read_pci_devices(sysfs_root, reader.warnings, cut)
    block = reader.located("block", cut)
    net = reader.located("net", cut)
    return Inventory(pci=pci, block=block, net=net, warnings=tuple(reader.warnings), cut=tuple(cut))


class _Reader:
    """One reading of a sysfs root; remembers each folder's NUMA node."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.confined = sysfs.Confined(root)
        self.real_root = self.confined.real_root
        self.warnings: list[str] = []
        # Real folder -> its own numa_node (None: -1), or "" when it has no such file.
        self._numa: dict[str, int | str | None] = {}
        self._cut: set[str] = set()
        # Per kind: name -> (where it sits, height of its parts).
        self._done: dict[str, tuple[Located, int]] = {}

    # -- listing ---------------------------------------------------------------------------

    def located(self, kind: str, cut: list[str] | None = None) -> tuple[Located, ...]:
        folder = self.root / "class" / kind
        what = "block devices" if kind == "block" else "network interfaces"
        self._done = {}
        found = []
        for name in list_entries(folder, what, self.warnings, natural=True, cut=cut):
            if not name.isprintable() or "/" in name:
                self._warn_once(f"{folder} lists a name that is not printable ({name[:40]!r}); "
                                "it is left out")  # fmt: skip
                continue
            if not sysfs.is_kernel_name(name):
                found.append(self._misnamed(kind, name))
                continue
            found.append(self._locate(kind, name)[0])
        return tuple(found)

    def _misnamed(self, kind: str, name: str) -> Located:
        """A device whose name is not a kernel device name (a comma, ``=``, a space: a
        hostile sysfs), never located: a disk's serial and wwid are read all the same,
        so that a selector of them names it with the reason; the inventory warns."""
        why = f"no locality: its name is not a kernel device name ({name[:64]!r})"
        folder = self.root / "class" / kind
        self._warn_once(f"{folder} lists {name[:64]!r}, not a kernel device name: no locality")
        target = self.confined.folder(folder / name)
        if kind != "block" or isinstance(target, str):
            return Located(name, frozenset(), reason=why, disk=name if kind == "block" else "")
        _, serial, wwid = disk_ids(self.confined, target, name, self._warn_once)
        return Located(name, frozenset(), reason=why, disk=name, serial=serial, wwid=wwid)

    # -- one device ------------------------------------------------------------------------

    def _locate(self, kind: str, name: str) -> tuple[Located, int]:
        """Where ``class/<kind>/<name>`` sits, and the height of its tree of parts (0: it
        has none).

        The tree of parts is walked with a stack of its own, never by recursion, so
        any depth of stacked dm devices or bonds costs memory linear in the devices
        and cannot raise RecursionError; a device whose parts nest over
        :data:`MAX_DEPTH` deep has no locality. Each device is resolved once per kind
        (a part shared by many is not walked again); a device met again while its own
        parts are being resolved is a loop."""
        if name in self._done:
            return self._done[name]
        start = self._resolve(kind, name)
        if not isinstance(start, PartsWalk):
            self._done[name] = start
            return start
        stack = [start]
        busy = {name: start}
        while True:
            frame = stack[-1]
            if frame.index < len(frame.parts):
                part = frame.parts[frame.index]
                frame.index += 1
                if part in self._done:
                    frame.absorb(part, *self._done[part])
                elif part in busy:
                    why = "no locality: its parts loop back to it"
                    frame.absorb(part, Located(part, frozenset(), reason=why), 0)
                else:
                    found = self._resolve(kind, part)
                    if isinstance(found, PartsWalk):
                        stack.append(found)
                        busy[part] = found
                    else:
                        self._done[part] = found
                        frame.absorb(part, *found)
                continue
            stack.pop()
            done = frame.result()
            self._done[frame.base.name] = done
            del busy[frame.base.name]
            if not stack:
                return done
            stack[-1].absorb(frame.base.name, *done)

    def _resolve(self, kind: str, name: str) -> tuple[Located, int] | PartsWalk:
        """``class/<kind>/<name>`` without walking its parts: where it sits (height 0),
        or, for a device made of others, the :class:`PartsWalk` to walk them from."""
        link = self.root / "class" / kind / name
        target = self.confined.folder(link)
        if isinstance(target, str):
            return Located(
                name,
                frozenset(),
                reason=f"no locality: {target}",
                disk=name if kind == "block" else "",
            ), 0
        base = Located(
            name, frozenset(), virtual="virtual" in target.relative_to(self.real_root).parts[:2]
        )
        if kind == "block":
            disk, serial, wwid = disk_ids(self.confined, target, name, self._warn_once)
            if not sysfs.is_kernel_name(disk):  # a partition's disk is the folder above it
                why = f"no locality: its disk's folder is not a kernel device name ({disk[:64]!r})"
                return replace(base, reason=why), 0
            base = replace(base, disk=disk, serial=serial, wwid=wwid)
            head = (target, name) if disk == name else (target.parent, disk)
            if base.virtual and NVME_HEAD.fullmatch(head[1]):
                paths = nvme_paths(self.confined, *head)  # a head, or a partition of one
                if paths is not None:
                    return self._multipath(base, paths)
        parts, problem = self._parts(kind, target / ("slaves" if kind == "block" else ""))
        if problem is not None:
            return replace(base, parts=parts, reason=f"no locality: {problem}"), 0
        if parts:
            return PartsWalk(replace(base, parts=parts), parts)
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

    def _parts(self, kind: str, folder: Path) -> tuple[tuple[str, ...], str | None]:
        """The names of the devices ``folder``'s device is made of (``slaves/*`` of a
        block device, the ``lower_<name>`` links of an interface), sorted, and why
        they cannot all be used (None when they can): over :data:`MAX_PARTS` of them,
        or one whose name is not printable. The device's nodes are those of *all* its
        parts, so a part left out leaves the device without locality."""
        names: list[str] = []
        problem = None
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    name = entry.name
                    if kind == "net":
                        if not name.startswith("lower_"):
                            continue
                        name = name.removeprefix("lower_")
                    if not name or not name.isprintable():
                        problem = f"a part's name in {folder} is not printable ({name[:40]!r})"
                        break
                    if len(names) >= MAX_PARTS:
                        problem = f"{folder} names over {MAX_PARTS} parts; not all were read"
                        break
                    names.append(name)
        except OSError:
            return (), None
        if problem is not None:
            self.warnings.append(problem)
            return (), problem
        return tuple(sorted(names, key=natural_key)), None

    def _multipath(self, base: Located, paths: list[tuple[str, Path]]) -> tuple[Located, int]:
        """A multipath head: the NUMA nodes of all its paths' PCI devices (a dual-port
        drive on two nodes gives both); no locality when it has no path, or a path has
        none."""
        base = replace(base, parts=tuple(name for name, _ in paths))
        if not paths:
            return replace(base, reason="no locality: an NVMe multipath head with no path"), 0
        nodes: set[int] = set()
        pci: list[str] = []
        for name, folder in paths:
            address, node = self._nearest_pci(folder)
            if address is None or not isinstance(node, int):
                if isinstance(node, str):
                    why = node.removeprefix("no locality: ")
                elif address is None:
                    why = "no PCI device above it in sysfs"
                else:
                    why = f"PCI device {address} has numa_node -1"
                return replace(base, reason=f"no locality: its path {name} has none: {why}"), 1
            nodes.add(node)
            if address not in pci:
                pci.append(address)
        return replace(base, nodes=frozenset(nodes), pci=tuple(pci)), 1

    def _nearest_pci(self, folder: Path) -> tuple[str | None, int | str | None]:
        """The nearest folder at or above ``folder`` (inside the root) with a
        ``numa_node`` file: (its name, its node or None for -1, or why it is unusable);
        (None, None) when there is none."""
        current = str(folder)
        while current.startswith(self.confined.prefix):
            node = self._numa_of(current)
            if node != "":
                return os.path.basename(current), node
            current = os.path.dirname(current)
        return None, None

    def _numa_of(self, folder: str) -> int | str | None:
        """``folder``'s own numa_node: the node, None for -1, "" when there is no file,
        or a reason text when it is malformed or leads out of the root."""
        if folder in self._numa:
            return self._numa[folder]
        path = Path(folder, "numa_node")
        result: int | str | None
        text: str | None = None
        try:
            text = self.confined.read_text(path)
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


def disk_ids(
    confined: sysfs.Confined, target: Path, name: str, warn: Callable[[str], None]
) -> tuple[str, str | None, str | None]:
    """(the disk's name, its serial, its wwid) for block device folder ``target`` (read
    through ``confined``; ``warn`` gets each odd file's line): a partition (a
    ``partition`` file) takes its disk's, the folder above it."""
    disk_folder = target
    if (target / "partition").is_file():
        disk_folder = target.parent
    disk = disk_folder.name if disk_folder != target else name
    serial = _identifier(confined, disk_folder, "serial", warn)
    wwid = _identifier(confined, disk_folder, "wwid", warn)
    return disk, serial, wwid


def _identifier(
    confined: sysfs.Confined, folder: Path, attribute: str, warn: Callable[[str], None]
) -> str | None:
    """``folder/<attribute>``, else ``folder/device/<attribute>`` (NVMe and SCSI keep
    them on the controller or the SCSI device; a head of NVMe multipath on its
    subsystem), stripped; None when absent, empty, unreadable or behind a link
    that leaves the root (with a warning)."""
    candidates = [folder / attribute]
    device = folder / "device"
    if os.path.lexists(device):
        real = confined.folder(device)
        if isinstance(real, str):
            warn(f"{real}; the {attribute} there is not read")
        else:
            candidates.append(real / attribute)
    for path in candidates:
        try:
            text = confined.read_text(path)
        except sysfs.SysfsError as exc:
            warn(f"{exc}; the {attribute} is left unknown")
            continue
        if text:
            return text[:MAX_ID_CHARS]
    return None
