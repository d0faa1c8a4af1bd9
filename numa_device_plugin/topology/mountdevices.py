"""The block devices a mount of the host's mount table is on (:mod:`.mounts` reads the
table): a mount's ``major:minor`` through sysfs's ``dev/block/MAJ:MIN`` link, and for a
filesystem that mounts with an anonymous device (btrfs, bcachefs) its ``/dev/`` source
(``/dev/NAME``, ``/dev/mapper/DMNAME``, ``/dev/disk/by-uuid/<fsid>``) and, for btrfs,
every disk in ``fs/btrfs/<fsid>/devices/``. Links are kept inside the sysfs root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from numa_device_plugin.topology import sysfs

# Devices of one multi-device filesystem read from fs/btrfs/<fsid>/devices.
MAX_FS_DEVICES = 256
# Filesystems on block devices that mount with an anonymous device (major 0), whose
# mount source names their device(s): btrfs (one, the others under fs/btrfs) and
# bcachefs (all, joined by ':'). Any other type's source is free text: a tmpfs, an
# overlay or a FUSE mount may name /dev/nvme1n1p1 and hold nothing of it.
SOURCE_NAMES_DEVICES = frozenset({"btrfs", "bcachefs"})
# A filesystem UUID as /dev/disk/by-uuid names it (btrfs: its fsid, fs/btrfs/<fsid>).
_FSID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class MountDevices:
    """The block devices of mounts, under one sysfs root (each looked up once)."""

    def __init__(self, sysfs_root: Path) -> None:
        self.root = sysfs_root
        self.confined = sysfs.Confined(sysfs_root)
        self.by_number: dict[tuple[int, int], tuple[str, ...]] = {}
        self.by_source: dict[str, tuple[str, ...]] = {}
        self._mapper: dict[str, str] | None = None
        self._btrfs: list[tuple[str, ...]] | None = None

    def of(self, device: tuple[int, int], fs_type: str, source: str) -> tuple[str, ...]:
        """The block devices of a mount of ``device`` (major, minor), ``fs_type`` and
        ``source`` (mountinfo's fields): its ``major:minor``'s, or for an anonymous
        device (major 0) of a :data:`SOURCE_NAMES_DEVICES` type those its ``/dev/``
        source names, with every other device of the btrfs filesystem that holds them."""
        if device[0] != 0:
            if device not in self.by_number:
                link = self.root / "dev" / "block" / f"{device[0]}:{device[1]}"
                real = self.confined.folder(link)
                self.by_number[device] = () if isinstance(real, str) else (real.name,)
            return self.by_number[device]
        if fs_type not in SOURCE_NAMES_DEVICES or not source.startswith("/dev/"):
            return ()  # tmpfs, overlay, proc, NFS, FUSE: no block device, whatever the source
        if source not in self.by_source:
            self.by_source[source] = self._from_source(source)
        return self.by_source[source]

    def _from_source(self, source: str) -> tuple[str, ...]:
        names: list[str] = []
        for one in source.split(":"):  # bcachefs lists its devices as /dev/a:/dev/b
            if one.startswith("/dev/disk/by-uuid/"):  # a btrfs's UUID is its fsid
                fsid = one.removeprefix("/dev/disk/by-uuid/")
                found = self._btrfs_devices(fsid) if _FSID.fullmatch(fsid) else ()
                names.extend(name for name in found if name not in names)
                continue
            name = self._named(one)
            if name is not None and name not in names:
                names.append(name)
        # The other disks of the btrfs the source names: of the one filesystem that
        # lists the source's own device(s). A device listed under two fsids (a stale
        # scan of a disk formatted again) leaves it open which is mounted: only the
        # source's own then, the same whatever order the fsids are listed in.
        holding = [fs for fs in self._btrfs_filesystems() if any(name in fs for name in names)]
        if len(holding) == 1:
            names.extend(name for name in holding[0] if name not in names)
        return tuple(names)

    def _named(self, device: str) -> str | None:
        """The kernel name of ``/dev/NAME`` or ``/dev/mapper/DMNAME`` under the root."""
        if device.startswith("/dev/mapper/"):
            return self._mappers().get(device.removeprefix("/dev/mapper/"))
        name = device.removeprefix("/dev/")
        if not sysfs.KERNEL_NAME.fullmatch(name):
            return None
        real = self.confined.folder(self.root / "class" / "block" / name)
        return None if isinstance(real, str) else name

    def _mappers(self) -> dict[str, str]:
        """Each device-mapper device's ``dm/name`` -> its kernel name (``dm-0``)."""
        if self._mapper is None:
            self._mapper = {}
            for name in _listed(self.root / "class" / "block"):
                if not name.startswith("dm-"):
                    continue
                real = self.confined.folder(self.root / "class" / "block" / name)
                if isinstance(real, str):
                    continue
                try:
                    text = self.confined.read_text(real / "dm" / "name")
                except sysfs.SysfsError:
                    continue
                if text:
                    self._mapper.setdefault(text, name)
        return self._mapper

    def _btrfs_filesystems(self) -> list[tuple[str, ...]]:
        """The devices of each btrfs filesystem (``fs/btrfs/<fsid>/devices/``)."""
        if self._btrfs is None:
            self._btrfs = []
            for fsid in _listed(self.root / "fs" / "btrfs"):
                names = self._btrfs_devices(fsid)
                if names:
                    self._btrfs.append(names)
        return self._btrfs

    def _btrfs_devices(self, fsid: str) -> tuple[str, ...]:
        """The kernel names in ``fs/btrfs/<fsid>/devices/`` (at most
        :data:`MAX_FS_DEVICES`)."""
        folder = self.root / "fs" / "btrfs" / fsid / "devices"
        return tuple(
            name for name in _listed(folder) if sysfs.KERNEL_NAME.fullmatch(name)
        )[:MAX_FS_DEVICES]  # fmt: skip


def _listed(folder: Path) -> list[str]:
    """The names in ``folder`` (sorted, at most 16 times :data:`MAX_FS_DEVICES`), or none
    when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            names = []
            for entry in entries:
                names.append(entry.name)
                if len(names) >= MAX_FS_DEVICES * 16:
                    break
    except OSError:
        return []
    return sorted(names)
