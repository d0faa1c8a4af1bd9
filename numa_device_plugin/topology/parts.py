"""The pieces of a device made of others: a dm/md device over its ``slaves/``, a bond
or VLAN over its ``lower_*``, a native NVMe multipath head over its paths.

:class:`Located` is where one block device or interface sits; :class:`PartsWalk` adds
up a device's parts as :mod:`~numa_device_plugin.topology.locality` walks them (the
rule: the NUMA nodes of *all* its parts, none when any part has none); and
:func:`nvme_paths` finds a multipath head's paths (Documentation/ABI/testing/
sysfs-class-nvme; drivers/nvme/host/multipath.c names a path ``nvme<S>c<C>n<N>``
under controller ``nvme<C>`` of subsystem ``nvme-subsys<S>``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.pci import natural_key

# Levels of slaves/lower_* followed (dm over md over partitions is 3).
MAX_DEPTH = 8
# Parts of one device read (md arrays and bonds have a few dozen at most).
MAX_PARTS = 256


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


@dataclass
class PartsWalk:
    """A device being resolved from its parts (:meth:`locality._Reader._locate`): ``base``
    (what it is, without nodes), its ``parts`` and the next one to read, what the
    parts read so far add up to, and the first part without locality."""

    base: Located
    parts: tuple[str, ...]
    index: int = 0
    nodes: set[int] = field(default_factory=set)
    pci: list[str] = field(default_factory=list)
    height: int = 0
    failed: str | None = None

    def absorb(self, part: str, located: Located, below: int) -> None:
        """Add part ``part`` (``below``: the height of its own parts); a part without
        locality ends the walk of this device's parts."""
        self.height = max(self.height, below + 1)
        if not located.located:
            why = (located.reason or "").removeprefix("no locality: ")
            if why.startswith("its part "):
                why = why.split(": ", 1)[-1]  # the first cause, not the whole chain
            self.failed = f"no locality: its part {part} has none: {why}"
            self.index = len(self.parts)
            return
        self.nodes |= located.nodes
        self.pci.extend(a for a in located.pci if a not in self.pci)

    def result(self) -> tuple[Located, int]:
        if self.failed is not None:
            return replace(self.base, reason=self.failed), self.height
        if self.height > MAX_DEPTH:
            reason = f"no locality: parts nested over {MAX_DEPTH} deep"
            return replace(self.base, reason=reason), self.height
        return replace(self.base, nodes=frozenset(self.nodes), pci=tuple(self.pci)), self.height


# A native NVMe multipath head: nvme<subsystem>n<namespace> (its paths: nvme<S>c<C>n<N>).
NVME_HEAD = re.compile(r"nvme(\d+)n(\d+)")
# A path of one (nvme0c1n1: subsystem 0, controller 1, namespace 1), a hidden disk.
NVME_PATH = re.compile(r"nvme(\d+)c(\d+)n(\d+)")


def _links(folder: Path, *, folders: bool = False) -> list[str]:
    """The entries of ``folder`` that are links (``folders``: or folders), at most
    :data:`MAX_PARTS`; [] when it cannot be listed."""
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink() or (folders and entry.is_dir(follow_symlinks=False)):
                    names.append(entry.name)
                if len(names) >= MAX_PARTS:
                    break
    except OSError:
        return []
    return names


def nvme_paths(confined: sysfs.Confined, head: Path, name: str) -> list[tuple[str, Path]] | None:
    """The paths of a native NVMe multipath head (``devices/virtual/nvme-subsystem/
    nvme-subsysS/nvmeSnN``): (name, real folder) of each ``nvmeScCnN`` path, from
    the head's ``multipath/`` links (newer kernels) or else the subsystem's
    controllers (``nvme-subsysS/nvmeC`` -> ``.../nvme/nvmeC/nvmeScCnN``). None when
    ``head`` is not under ``nvme-subsystem``."""
    if head.parent.parent.name != "nvme-subsystem":
        return None
    subsys, nsid = NVME_HEAD.fullmatch(name).groups()  # type: ignore[union-attr]
    path_name = re.compile(rf"nvme{subsys}c(\d+)n{nsid}")
    found: dict[str, Path] = {}
    for entry in _links(head / "multipath"):
        if path_name.fullmatch(entry):
            real = confined.folder(head / "multipath" / entry)
            if isinstance(real, Path):
                found[entry] = real
    if not found:
        for controller in _links(head.parent):
            if re.fullmatch(r"nvme\d+", controller) is None:
                continue
            real = confined.folder(head.parent / controller)
            if isinstance(real, str):
                continue
            for entry in _links(real, folders=True):
                if path_name.fullmatch(entry) and len(found) < MAX_PARTS:
                    found[entry] = real / entry
    return sorted(found.items(), key=lambda item: natural_key(item[0]))
