"""The host's mount table, and which block device holds a path (the ``path:`` selector).

The table is proc(5)'s ``mountinfo`` of a process in the host's mount namespace
(``/proc/1/mountinfo`` on a node): one line per mount,

``36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue``

with the fields mount ID, parent ID, ``major:minor`` of the filesystem's device, root
within the filesystem, mount point, mount options, optional fields up to ``-``, then
the filesystem type, the mount source and the super options. Spaces, tabs, newlines
and backslashes in paths are written as octal escapes (``\\040``). A filesystem on a
block device has that device's ``major:minor``, which sysfs links as
``dev/block/MAJ:MIN`` to the device's folder (a partition, a dm or md device: the
inventory resolves those to their disks); tmpfs, overlay, NFS and other filesystems
without a block device have major 0.

A path is held by the mount *visible* there, as the kernel resolves it: from the root
mount, component by component, into a child mount (by parent ID) at that component;
of several mounts stacked at one point, the one mounted over the others (its parent is
the one below it). A mount at ``/mnt/disks/a`` hidden by a later mount over ``/mnt``
holds nothing: ``/mnt``'s filesystem is what a process sees there. Bind mounts need
nothing special: their line has the device of the filesystem they show.

Lines are split on ``\\n`` only (the kernel escapes nothing else: a mount point may
hold a carriage return, a form feed or U+2028) and the four escapes are decoded once.
btrfs (and other filesystems on several disks) mount with an anonymous ``0:N``
device; their block devices come from the mount source (``/dev/nvme1n1p1``,
``/dev/mapper/NAME``) and, for btrfs, ``fs/btrfs/<fsid>/devices/`` under the sysfs
root (every disk of a multi-device filesystem).
"""

from __future__ import annotations

import gc
import os
import re
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from numa_device_plugin.topology.mountdevices import SOURCE_NAMES_DEVICES, MountDevices
from numa_device_plugin.topology.mounttree import MountTree

# Mounts read (a node with thousands of pods has a few thousand); bytes of the table.
MAX_MOUNTS = 65536
MAX_TABLE_BYTES = 16 << 20


_OCTAL = re.compile(r"\\([0-7]{3})")
_DEVICE = re.compile(r"(\d{1,10}):(\d{1,10})")
_ID = re.compile(r"\d{1,10}")
# A line of the usual shape, as parse_line reads it: IDs, major:minor, root, point,
# options, optional fields up to the first "-" from the seventh field on, type, source
# and the rest (parse_mountinfo's fast path over a whole table). At most 16 optional
# fields (the kernel writes a few: shared:, master:, propagate_from:, unbindable): a
# hostile line of millions of fields made the lazy loop take 1.8 s; one with more goes to
# parse_line, which gives the same mount or the error.
_TABLE = re.compile(
    r"^([0-9]{1,10}) ([0-9]{1,10}) ([0-9]{1,10}):([0-9]{1,10}) [^ \n]* ([^ \n]*) [^ \n]*"
    r"(?: [^ \n]*){0,16}? - ([^ \n]*) ([^ \n]*)[^\n]*$",
    re.MULTILINE,
)


class Mount(NamedTuple):
    """One mount: ``mount_point`` (absolute, unescaped), ``device`` (``(major, minor)``
    of its filesystem; major 0: an anonymous device), ``fs_type`` and ``source``
    (unescaped), ``mount_id`` and ``parent_id`` (mountinfo's first two fields: the
    mount tree), and ``blocks``: the kernel names of its block devices under the sysfs
    root (``("sda1",)``, ``("dm-0",)``; a multi-device btrfs names each), empty when
    there is none. A named tuple: a table of 65,536 is made in a fraction of the time
    a frozen dataclass's ``__init__`` takes."""

    mount_point: str
    device: tuple[int, int]
    fs_type: str
    source: str
    blocks: tuple[str, ...] = ()
    mount_id: int = 0
    parent_id: int = 0

    def __str__(self) -> str:
        """``TYPE SOURCE at POINT`` as mountinfo writes them (escaped: a reason that
        shows it is one line of printable text)."""
        return f"{shown(self.fs_type)} {shown(self.source)} at {shown(self.mount_point)}"


@dataclass(frozen=True)
class MountTable:
    """The mounts of a table, in its order, or why it could not be read (``problem``,
    then ``mounts`` is empty). The mount tree is indexed once, at the first question
    (every ``path:`` selector of a look asks the same table)."""

    mounts: tuple[Mount, ...] = ()
    problem: str | None = None

    @cached_property
    def _tree(self) -> MountTree[Mount]:
        return MountTree(self.mounts)

    def holding(self, path: str) -> Mount | None:
        """The mount visible at absolute, normalised ``path`` (no ``.``, ``..`` or
        double slashes): from the root mount (a mount at ``/`` whose parent is not
        listed, or is itself), into the child mounted at each component of the path
        and up each stack of mounts at one point. None when the table has no root
        mount. Time: the path's components, whatever the table's size."""
        tree = self._tree
        if tree.root is None:
            return None
        current = tree.top(tree.root, "/")
        prefix = ""
        for part in (part for part in path.split("/") if part):
            prefix += "/" + part
            child = tree.child(current, prefix)
            if child is not None:
                current = tree.top(child, prefix)
        return current

    def unheld(self) -> str:
        """Why :meth:`holding` answers None: no root mount, or several."""
        roots = self._tree.roots
        if roots == 0:
            return "the table has no root mount (a mount at / whose parent is not listed)"
        return (f"the table has {roots} root mounts (at / with no parent listed): not a "
                "table the kernel writes, and which holds a path is open")  # fmt: skip

    def at(self, path: str) -> tuple[Mount, ...]:
        """The mounts whose mount point is ``path``, visible or not."""
        return tuple(self._tree.at(path))

    def visible(self, mount: Mount) -> bool:
        """Whether ``mount`` is the one a process sees at its own mount point (not
        hidden under a later mount over it or over a parent folder): what
        :meth:`holding` answers for its point, for every mount of the table at once in
        time linear in the table's bytes (a hostile table of deep mount points made one
        :meth:`holding` per mount take seconds)."""
        return id(mount) in self._tree.visible


def unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040``: a space) decoded,
    once (``\\134040`` is the text ``\\040``)."""
    if "\\" not in field:
        return field
    return _OCTAL.sub(lambda match: chr(int(match[1], 8)), field)


def escape(path: str) -> str:
    """``path`` as mountinfo writes it: space, tab, newline and backslash as octal
    escapes (the inverse of :func:`unescape` for the kernel's escapes)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def shown(text: str) -> str:
    """``text`` as one line of printable characters: :func:`escape`, then every other
    non-printable character as ``\\xNN``, ``\\uNNNN`` (a carriage return, U+2028)."""
    return "".join(
        c if c.isprintable() else repr(c)[1:-1] if c not in "\t\n" else f"\\{ord(c):03o}"
        for c in escape(text)
    )


def parse_line(line: str, number: int) -> Mount:
    """One mountinfo line (without its ``\\n``) -> :class:`Mount`; ``number`` (1-based)
    names it in the ValueError raised when it is not a mountinfo line."""
    fields = line.split(" ")
    try:
        separator = fields.index("-", 6)
    except ValueError:
        raise ValueError(f"line {number} has no ' - ' separator: {line[:120]!r}") from None
    device = _DEVICE.fullmatch(fields[2])
    point = unescape(fields[4])
    if (
        device is None
        or not _ID.fullmatch(fields[0])
        or not _ID.fullmatch(fields[1])
        or not point.startswith("/")
        or len(fields) < separator + 3
    ):
        raise ValueError(f"line {number} is not a mountinfo line: {line[:120]!r}")
    major, minor = device.groups()
    return Mount(point, (int(major), int(minor)), fields[separator + 1],
                 unescape(fields[separator + 2]), (), int(fields[0]), int(fields[1]))  # fmt: skip


def parse_mountinfo(text: str | bytes) -> tuple[Mount, ...]:
    """The mounts of mountinfo ``text`` (bytes are decoded as UTF-8, an invalid byte
    replaced), in order, at most :data:`MAX_MOUNTS`; lines are split on ``\\n`` only,
    one at a time (a table of blank lines costs no list of them). Raises ValueError
    naming the line (1-based) that is not a mountinfo line.

    A table whose every line has the kernel's usual shape is read by one regular
    expression over the whole text (65,536 lines in a third of the time a line at a
    time takes); any other is read line by line by :func:`parse_line`, which gives the
    same mounts or names the line in error."""
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    if lines <= MAX_MOUNTS and b"\n\n" not in data and not data.startswith(b"\n"):
        mounts = _usual(data.decode("utf-8", "replace"), lines)  # "\n" ends no UTF-8 sequence
        if mounts is not None:
            return mounts
    mounts_read: list[Mount] = []
    start = 0
    number = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        number += 1
        raw = data[start:end]
        start = end + 1
        if not raw.strip():
            continue
        if len(mounts_read) >= MAX_MOUNTS:
            raise ValueError(f"more than {MAX_MOUNTS} mounts")
        mounts_read.append(parse_line(raw.decode("utf-8", "replace"), number))
    return tuple(mounts_read)


def _usual(text: str, lines: int) -> tuple[Mount, ...] | None:
    """The mounts of ``text`` when each of its ``lines`` has the kernel's usual shape
    (:data:`_TABLE`) and an absolute mount point, else None. The collector waits
    meanwhile: 65,536 mounts made its passes take a third of the time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        found = _TABLE.findall(text)
        if len(found) != lines:
            return None
        new = tuple.__new__  # Mount's own __new__ is Python code: 10 % of the time
        mounts = tuple([
            new(Mount, (unescape(point) if "\\" in point else point, (int(major), int(minor)),
                        fs_type, unescape(source) if "\\" in source else source, (),
                        int(mount_id), int(parent_id)))
            for mount_id, parent_id, major, minor, point, fs_type, source in found
        ])  # fmt: skip
    finally:
        if collecting:
            gc.enable()
    if not all(mount.mount_point.startswith("/") for mount in mounts):
        return None
    return mounts


def read_mount_table(table: Path, sysfs_root: Path) -> MountTable:
    """The mounts of the mountinfo file ``table``, each with its block devices under
    ``sysfs_root`` (``dev/block/MAJ:MIN``; for an anonymous device, its ``/dev/…``
    source and ``fs/btrfs/<fsid>/devices``; links kept inside the root). Never raises:
    an unreadable or malformed table is a :class:`MountTable` with a ``problem``
    naming the file."""
    try:
        fd = os.open(table, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return MountTable(problem=f"cannot read the mount table {table}: {exc.strerror or exc}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return MountTable(problem=f"the mount table {table} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_TABLE_BYTES:
                return MountTable(
                    problem=f"the mount table {table} is over {MAX_TABLE_BYTES} bytes"
                )
        data = b"".join(chunks)
        del chunks
    except OSError as exc:
        return MountTable(problem=f"cannot read the mount table {table}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    try:
        mounts = parse_mountinfo(data)
    except ValueError as exc:
        return MountTable(problem=f"malformed mount table {table}: {exc}")
    del data
    devices = MountDevices(sysfs_root)
    resolved = tuple(
        m
        if (m.device[0] == 0 and m.fs_type not in SOURCE_NAMES_DEVICES)  # of()'s ()
        or not (blocks := devices.of(m.device, m.fs_type, m.source))
        else Mount(m.mount_point, m.device, m.fs_type, m.source, blocks, m.mount_id, m.parent_id)
        for m in mounts
    )  # fmt: skip (a Mount made directly: dataclasses.replace cost 0.5 s at 65,000)
    return MountTable(resolved)
