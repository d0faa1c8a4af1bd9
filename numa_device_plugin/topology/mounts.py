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

A path is held by the mount whose mount point is the path or its nearest parent
(component by component); of several mounts at one point the last listed is the one
seen (it was mounted over the others). Bind mounts need nothing special: their line
has the device of the filesystem they show.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from numa_device_plugin.topology import sysfs

# Mounts read (a node with thousands of pods has a few thousand); bytes of the table.
MAX_MOUNTS = 65536
MAX_TABLE_BYTES = 16 << 20

_OCTAL = re.compile(r"\\([0-7]{3})")
_DEVICE = re.compile(r"(\d{1,10}):(\d{1,10})")


@dataclass(frozen=True)
class Mount:
    """One mount: ``mount_point`` (absolute, unescaped), ``device`` (``(major, minor)``
    of its filesystem; major 0: no block device), ``fs_type`` and ``source``, and
    ``block``: the kernel name of the block device ``dev/block/MAJ:MIN`` resolves to
    under the sysfs root (``sda1``, ``dm-0``), None when there is none."""

    mount_point: str
    device: tuple[int, int]
    fs_type: str
    source: str
    block: str | None = None


@dataclass(frozen=True)
class MountTable:
    """The mounts of a table, in its order, or why it could not be read (``problem``,
    then ``mounts`` is empty)."""

    mounts: tuple[Mount, ...] = ()
    problem: str | None = None

    def holding(self, path: str) -> Mount | None:
        """The mount that holds absolute ``path``: the last listed of those whose mount
        point is ``path`` or its nearest parent; None when none is (a table without
        ``/``)."""
        best: Mount | None = None
        for mount in self.mounts:
            point = mount.mount_point
            above = path == point or point == "/" or path.startswith(point.rstrip("/") + "/")
            if above and (best is None or len(point) >= len(best.mount_point)):
                best = mount
        return best


def unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040``: a space) decoded."""
    return _OCTAL.sub(lambda match: chr(int(match[1], 8)), field)


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """The mounts of mountinfo ``text``, in order (at most :data:`MAX_MOUNTS`).
    Raises ValueError naming the line (1-based) that is not a mountinfo line."""
    mounts: list[Mount] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(mounts) >= MAX_MOUNTS:
            raise ValueError(f"more than {MAX_MOUNTS} mounts")
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
        except ValueError:
            raise ValueError(f"line {number} has no ' - ' separator: {line[:120]!r}") from None
        device = _DEVICE.fullmatch(fields[2])
        point = unescape(fields[4])
        if device is None or not point.startswith("/") or len(fields) < separator + 3:
            raise ValueError(f"line {number} is not a mountinfo line: {line[:120]!r}")
        mounts.append(
            Mount(
                point,
                (int(device[1]), int(device[2])),
                fields[separator + 1],
                unescape(fields[separator + 2]),
            )
        )
    return tuple(mounts)


def read_mount_table(table: Path, sysfs_root: Path) -> MountTable:
    """The mounts of the mountinfo file ``table``, each with the block device its
    ``major:minor`` resolves to under ``sysfs_root`` (``dev/block/MAJ:MIN``, links kept
    inside the root). Never raises: an unreadable or malformed table is a
    :class:`MountTable` with a ``problem`` naming the file."""
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
        text = b"".join(chunks).decode("utf-8", "replace")
    except OSError as exc:
        return MountTable(problem=f"cannot read the mount table {table}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    try:
        mounts = parse_mountinfo(text)
    except ValueError as exc:
        return MountTable(problem=f"malformed mount table {table}: {exc}")
    confined = sysfs.Confined(sysfs_root)
    names: dict[tuple[int, int], str | None] = {}
    resolved = []
    for mount in mounts:
        if mount.device[0] == 0:
            resolved.append(mount)
            continue
        if mount.device not in names:
            link = sysfs_root / "dev" / "block" / f"{mount.device[0]}:{mount.device[1]}"
            real = confined.folder(link)
            names[mount.device] = None if isinstance(real, str) else real.name
        resolved.append(Mount(mount.mount_point, mount.device, mount.fs_type, mount.source,
                              names[mount.device]))  # fmt: skip
    return MountTable(tuple(resolved))
