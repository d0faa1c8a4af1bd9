"""Selectors that name a device (``serial:S3EVNX0K123``, ``pci-class:0108``), and what
one selects in an :class:`~numa_device_plugin.topology.locality.Inventory`.

Forms (:func:`parse_selector`):

================================  =====================================================
``block:NAME``                    the block device ``class/block/NAME`` (a partition
                                  counts as its disk; dm and md through their slaves)
``serial:SERIAL``                 the disks whose ``serial`` is SERIAL (survives
                                  renumbering: ``nvme0n1`` and ``nvme1n1`` can swap at
                                  boot); with ``*``, ``?`` or ``[...]`` a shell-style
                                  pattern a pool can share (``serial:S3EVNX*``)
``wwid:WWID``                     the disks whose ``wwid`` is WWID (likewise stable;
                                  a pattern as for serial)
``net:IFNAME``                    the network interface IFNAME (bonds and VLANs through
                                  their lower interfaces)
``pci:DOMAIN:BUS:DEV.FN``         the PCI device at that address (``0000:41:00.0``;
                                  a VMD domain has 5 to 8 digits, ``10000:01:00.0``)
``pci-id:VENDOR:DEVICE``          every PCI device with that vendor and device id
                                  (``15b3:101d``)
``pci-class:PREFIX``              every PCI device whose class code (6 hex digits)
                                  starts with PREFIX (``0108`` NVMe, ``0200``
                                  Ethernet, ``0302`` a 3D controller)
``path:/HOST/PATH``               the block device of the filesystem mounted at that
                                  host path (from the host's mount table: the mount
                                  visible there; partitions, dm/LVM, md and btrfs
                                  through their disks): one name for every server
                                  of a pool (``path:/mnt/disks/a``). Nothing mounted
                                  there (unmounted, hidden, a symlink) selects
                                  nothing; ``path:/`` is the root filesystem's disk
``path-below:/HOST/PATH``         the same, or the filesystem mounted at its nearest
                                  parent (``/var/lib/elasticsearch`` on a ``/var/lib``
                                  mount), never the root filesystem ``/``
================================  =====================================================

:func:`select` is pure. A selection's NUMA nodes are those of every matched device
that has locality; a device without locality adds none (it is named in
:attr:`Selection.unlocated`), and a selection with no node at all says why in
:attr:`Selection.reason`. Nothing ever falls back to some NUMA node.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from numa_device_plugin.topology import alphabet, pci, sysfs
from numa_device_plugin.topology.locality import Inventory, Located
from numa_device_plugin.topology.mounts import Mount, MountTable, escape, unescape
from numa_device_plugin.topology.pci import PciDevice

KINDS = ("block", "serial", "wwid", "net", "pci", "pci-id", "pci-class", "path", "path-below")
# The kinds that name a host path (looked up in the mount table).
PATH_KINDS = ("path", "path-below")
# Characters of a selector's value (a wwid is ~80; anything longer is not a name).
MAX_VALUE = 256
# Characters of a path: selector's host path.
MAX_PATH = 1024
# Matched devices named in a selection (a class can match hundreds).
MAX_NAMED = 16

# Domains have 4 hex digits, or up to 8 behind an Intel VMD (10000:01:00.0), as the
# kernel names them.
_PCI = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_PCI_ID = re.compile(r"(?:0x)?([0-9a-f]{4}):(?:0x)?([0-9a-f]{4})")
_PCI_CLASS = re.compile(r"(?:0x)?([0-9a-f]{2,6})")
# A serial or wwid holding one of these is a shell-style pattern (id_matches).
_PATTERN = re.compile(r"[*?\[]")
# What a selector's ends lose (str.strip() would also drop U+00A0, U+2028: the chart's
# schema refuses those, and so does the plugin).
_ASCII_SPACE = " \t\n\r\x0b\x0c"


@dataclass(frozen=True)
class Selector:
    """A parsed selector: ``kind`` (one of :data:`KINDS`) and ``value`` (normalised:
    PCI addresses and ids in lower case)."""

    kind: str
    value: str

    def __str__(self) -> str:
        # a host path as mountinfo writes it: \040 for a space, \134 for a backslash
        value = escape(self.value) if self.kind in PATH_KINDS else self.value
        return f"{self.kind}:{value}"


@dataclass(frozen=True)
class Selection:
    """What a selector picked: ``nodes`` (the NUMA nodes of the matched devices that
    have locality), ``matched`` (a short name of each, at most :data:`MAX_NAMED`),
    ``count`` (how many matched), ``unlocated`` (matched devices without locality,
    with why, at most :data:`MAX_NAMED`), ``reason`` (why ``nodes`` is empty; None
    when it is not) and ``by_node`` (each node's device names, :meth:`on`)."""

    nodes: frozenset[int]
    matched: tuple[str, ...] = ()
    count: int = 0
    unlocated: tuple[str, ...] = ()
    reason: str | None = None
    by_node: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def on(self, node_id: int) -> tuple[str, ...]:
        """What a pod on NUMA node ``node_id`` is near: the kernel names of the matched
        disks (a partition's disk) and interfaces, the addresses of matched PCI
        devices, on that node (:attr:`by_node`, at most :data:`MAX_NAMED`)."""
        return dict(self.by_node).get(node_id, ())


def parse_selector(text: str) -> Selector:
    """``KIND:VALUE`` -> :class:`Selector`. Raises ValueError naming the forms when the
    kind is unknown or the value is not of its kind's form.

    A host path (``path:``, ``path-below:``) is normalised (``//`` and a trailing
    ``/`` dropped) and its mountinfo escapes decoded once (``\\040`` a space, ``\\011``
    a tab, ``\\012`` a newline, ``\\134`` a backslash), so a mount point copied from
    ``/proc/self/mountinfo`` names it, a trailing space included."""
    kind, sep, value = text.strip(_ASCII_SPACE).partition(":")
    if not sep or kind not in KINDS:
        raise ValueError(
            f"{text[:80]!r} is not a selector (block:NAME, serial:S, wwid:W, net:IFNAME, "
            "pci:DOMAIN:BUS:DEV.FN, pci-id:VENDOR:DEVICE, pci-class:PREFIX, path:/HOST/PATH, "
            "path-below:/HOST/PATH)"
        )
    value = value.strip(_ASCII_SPACE)  # U+00A0 and the like stay, and are refused
    limit = MAX_PATH if kind in PATH_KINDS else MAX_VALUE
    if not value or len(value) > limit or not alphabet.graphic(value, " "):
        raise ValueError(
            f"{kind}: needs a value of 1 to {limit} printable characters (no control, "
            "separator, invisible format, private-use or surrogate character)"
        )
    if kind in PATH_KINDS:
        decoded = unescape(value)
        parts = [part for part in decoded.split("/") if part]
        if not decoded.startswith("/") or any(part in (".", "..") for part in parts):
            raise ValueError(f"{kind}:{value[:80]!r}: an absolute host path without . or ..")
        if not alphabet.graphic(decoded, " \t\n"):
            raise ValueError(f"{kind}:{value[:80]!r}: an escape decodes to a control character")
        value = "/" + "/".join(parts)
    elif kind in ("block", "net"):
        if not sysfs.KERNEL_NAME.fullmatch(value):
            raise ValueError(f"{kind}:{value[:80]!r}: not a kernel device name")
    elif kind == "pci":
        if not _PCI.fullmatch(value.lower()):
            raise ValueError(f"pci:{value[:80]!r}: expected DOMAIN:BUS:DEV.FN, e.g. 0000:41:00.0")
        value = value.lower()
    elif kind == "pci-id":
        match = _PCI_ID.fullmatch(value.lower())
        if match is None:
            raise ValueError(
                f"pci-id:{value[:80]!r}: expected VENDOR:DEVICE in hex, e.g. 15b3:101d"
            )
        value = f"{match[1]}:{match[2]}"
    elif kind == "pci-class":
        match = _PCI_CLASS.fullmatch(value.lower())
        if match is None:
            raise ValueError(
                f"pci-class:{value[:80]!r}: expected 2 to 6 hex digits of the class code, "
                "e.g. 0108 (NVMe)"
            )
        value = match[1]
    elif " " in value:
        raise ValueError(f"{kind}: a value with spaces cannot be matched ({value[:80]!r})")
    return Selector(kind, value)


def select(inventory: Inventory, selector: Selector, mounts: MountTable | None = None) -> Selection:
    """The devices of ``inventory`` that ``selector`` names, and their NUMA nodes; a
    ``path:`` selector looks its path up in ``mounts`` (the host's mount table; None:
    not read). When the inventory was cut (:attr:`Inventory.cut`) the reason says the
    device may be among those left out."""
    if selector.kind in PATH_KINDS:
        return _from_path(inventory, selector, mounts or MountTable(problem="not read"))
    selection = _select(inventory, selector)
    kind = _KIND_LISTED[selector.kind]
    if selection.reason is not None and kind in inventory.cut:
        cut = (
            f" (this node lists more {kind} than are read: only the first "
            f"{pci.MAX_DEVICES} by name were, so it may be among those left out)"
        )
        return replace(selection, reason=selection.reason + cut)
    return selection


# The inventory's name of the kind each selector looks in (Inventory.cut).
_KIND_LISTED = {
    "block": "block devices",
    "serial": "block devices",
    "wwid": "block devices",
    "net": "network interfaces",
    "pci": "PCI devices",
    "pci-id": "PCI devices",
    "pci-class": "PCI devices",
    "path": "block devices",
    "path-below": "block devices",
}


def _select(inventory: Inventory, selector: Selector) -> Selection:
    if selector.kind in ("pci", "pci-id", "pci-class"):
        return _from_pci([d for d in inventory.pci if _pci_matches(d, selector)], selector)
    if selector.kind == "net":
        found: list[Located] = [n for n in inventory.net if n.name == selector.value]
    elif selector.kind == "block":
        found = [d for d in inventory.block if d.name == selector.value]
    else:
        found = [
            d for d in inventory.block
            if d.disk == d.name
            and id_matches(d.serial if selector.kind == "serial" else d.wwid, selector.value)
        ]  # fmt: skip
    return _from_located(found, selector)


def id_matches(found: str | None, wanted: str) -> bool:
    """Whether a disk's ``serial`` or ``wwid`` (``found``; None when it has none) is
    ``wanted``: equal, or matching it as a shell-style pattern (``*``, ``?``, ``[...]``,
    case-sensitive, :func:`fnmatch.fnmatchcase`) when it holds one of those."""
    if found is None:
        return False
    if _PATTERN.search(wanted):
        return fnmatch.fnmatchcase(found, wanted)
    return found == wanted


def _from_path(inventory: Inventory, selector: Selector, mounts: MountTable) -> Selection:
    """The block devices of the mount visible at the path (their disks' nodes, through
    partitions, dm/md and btrfs), or why there is none: the table unread, nothing
    mounted at the path (``path:``) or only the root filesystem above it
    (``path-below:``), a filesystem without a block device (tmpfs, overlay, NFS)."""
    if mounts.problem is not None:
        return Selection(
            frozenset(), reason=f"{selector}: the host's mount table: {mounts.problem}"
        )
    path = selector.value
    mount = mounts.holding(path)
    if mount is None:
        return Selection(frozenset(), reason=f"{selector}: no mount holds it: {mounts.unheld()}")
    refused = _not_mounted_there(selector, mount, mounts.at(path), mounts.holding("/"))
    if refused is not None:
        return Selection(frozenset(), count=1, unlocated=(f"{mount}: {refused[0]}",),
                         reason=f"{selector}: {refused[1]}")  # fmt: skip
    if not mount.blocks:
        device = f"{mount.device[0]}:{mount.device[1]}"
        reason = f"{selector}: on {mount} ({device}), which is no block device: no locality"
        return Selection(frozenset(), count=1, unlocated=(f"{mount}: no block device",),
                         reason=reason)  # fmt: skip
    return _from_located(inventory.blocks_named(mount.blocks), selector)


def _not_mounted_there(
    selector: Selector, mount: Mount, stacked: tuple[Mount, ...], root: Mount | None
) -> tuple[str, str] | None:
    """Why ``mount``, the one visible at the selector's path, is not taken: (short,
    full reason naming what to fix), or None when it is. ``path:`` takes only a mount
    at the path itself; ``path-below:`` a parent too, but never the root filesystem
    (``root``, the mount visible at ``/``), nor a folder of it bound or mounted again
    elsewhere (the same device), unless the path is ``/``."""
    path = selector.value
    if root is not None and mount is not root and mount.device == root.device and path != "/":
        return "the root filesystem bound there", (
            f"{mount} is the root filesystem's ({root}) bound or mounted again there, which "
            f"is never taken for a data disk; mount the data disk at {escape(path)}, or "
            "select the root disk with path:/"
        )
    if mount.mount_point == path:
        return None
    escaped = escape(path)
    if stacked and mount.mount_point == "/":  # not under the root at all: the IDs lie
        return "not reachable from the root mount", (
            f"{stacked[-1]} is listed but not reachable from the root mount (its parent IDs "
            "loop or name no mount of the table): not a table the kernel writes; read "
            "the mount table again"
        )
    if stacked:
        hidden = (
            f"{stacked[-1]} is hidden by {mount} (mounted over a parent later); "
            f"unmount {escape(mount.mount_point)} or mount the disk at {escaped} again"
        )
        return "hides the mount at the path", f"nothing is visible at the path: {hidden}"
    if mount.mount_point == "/":
        return "the root filesystem", (
            f"nothing is mounted there: it is on the root filesystem ({mount}), which is "
            f"never taken for a data disk; mount the disk at {escaped} (a symlink is not "
            "followed: name the mount point itself), or select the root disk with path:/"
        )
    if selector.kind == "path-below":
        return None
    return "a parent mount", (
        f"nothing is mounted there: it is below {mount}; mount the disk at {escaped}, "
        f"or write path-below:{escaped} to take the disk of the mount it is below"
    )


def _pci_matches(device: PciDevice, selector: Selector) -> bool:
    if selector.kind == "pci":
        return device.address == selector.value
    if selector.kind == "pci-id":
        return f"{device.vendor:04x}:{device.device:04x}" == selector.value
    return f"{device.pci_class:06x}".startswith(selector.value)


def _what(selector: Selector) -> str:
    return {
        "block": "block device",
        "serial": "disk with that serial",
        "wwid": "disk with that wwid",
        "net": "network interface",
        "pci": "PCI device",
        "pci-id": "PCI device with that vendor:device id",
        "pci-class": "PCI device of that class",
        "path": "block device of its mount",
        "path-below": "block device of its mount",
    }[selector.kind]


def _from_pci(devices: list[PciDevice], selector: Selector) -> Selection:
    nodes = frozenset(d.numa_node for d in devices if d.numa_node is not None)
    unlocated = [
        f"{d.address} ({d.class_name}): numa_node -1" for d in devices if d.numa_node is None
    ]
    matched = [f"{d.address} ({d.class_name})" for d in devices]
    names = [(d.numa_node, d.address) for d in devices if d.numa_node is not None]
    return replace(_selection(nodes, matched, unlocated, selector), by_node=_by_node(names))


def _from_located(devices: list[Located], selector: Selector) -> Selection:
    nodes = frozenset(node for d in devices for node in d.nodes)
    unlocated = [
        f"{d.name}: {(d.reason or '').removeprefix('no locality: ')}"
        for d in devices
        if not d.located
    ]
    names = [(node, d.disk or d.name) for d in devices for node in sorted(d.nodes)]
    selection = _selection(nodes, [d.name for d in devices], unlocated, selector)
    return replace(selection, by_node=_by_node(names))


def _by_node(names: Sequence[tuple[int, str]]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """(node, name) pairs as each node's names, in order, each once, at most
    :data:`MAX_NAMED` a node."""
    found: dict[int, list[str]] = {}
    for node, name in names:
        listed = found.setdefault(node, [])
        if name not in listed and len(listed) < MAX_NAMED:
            listed.append(name)
    return tuple((node, tuple(found[node])) for node in sorted(found))


def _selection(
    nodes: frozenset[int], matched: list[str], unlocated: list[str], selector: Selector
) -> Selection:
    reason = None
    if not matched:
        reason = f"{selector}: no {_what(selector)} matches on this node"
    elif not nodes:
        first = unlocated[0]
        more = f" (and {len(unlocated) - 1} more)" if len(unlocated) > 1 else ""
        reason = f"{selector}: no matched device has NUMA locality: {first}{more}"
    return Selection(
        nodes=nodes,
        matched=tuple(matched[:MAX_NAMED]),
        count=len(matched),
        unlocated=tuple(unlocated[:MAX_NAMED]),
        reason=reason,
    )


def all_of(selections: Sequence[Selection], selectors: Sequence[Selector]) -> Selection:
    """Several selections that must all agree (``--near osd=path:/data --near
    osd=net:ens1``) as one: the NUMA nodes every one of them covers, their devices
    together. The first that has no node gives the reason; when each has nodes but
    none is common to all, the reason names where each is."""
    if len(selections) == 1:
        return selections[0]
    nodes = frozenset.intersection(*(s.nodes for s in selections))
    matched = tuple(name for s in selections for name in s.matched)[:MAX_NAMED]
    unlocated = tuple(line for s in selections for line in s.unlocated)[:MAX_NAMED]
    count = sum(s.count for s in selections)
    reason = next((s.reason for s in selections if s.reason is not None), None)
    if reason is None and not nodes:
        where = "; ".join(
            f"{selector} on {','.join(map(str, sorted(s.nodes)))}"
            for selector, s in zip(selectors, selections, strict=True)
        )
        reason = f"its devices are on no common NUMA node: {where}"
    names = [(node, name) for s in selections for node, listed in s.by_node
             if node in nodes for name in listed]  # fmt: skip
    return Selection(nodes=nodes if reason is None else frozenset(), matched=matched,
                     count=count, unlocated=unlocated, reason=reason,
                     by_node=_by_node(names) if reason is None else ())  # fmt: skip
