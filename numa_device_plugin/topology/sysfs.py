"""Reading and parsing the sysfs files that describe NUMA nodes and CPUs.

Everything here reads through a caller-given sysfs root (``/sys`` on a node, an
unpacked snapshot in tests), never ``/sys`` directly. The parsers are pure and
raise :class:`ValueError`; :func:`read_parsed` turns that into a
:class:`SysfsFormatError` that names the file and its content, so a malformed
file on a real node is reported exactly.

Formats (Documentation/ABI/stable/sysfs-devices-node and sysfs-devices-system-cpu):

- *cpulist*: ``0-3,8,10-11``, an empty string for the empty set.
- *cpumap*: comma-separated 32-bit hex words, most significant word first,
  e.g. ``00000000,0000ff00``; the first word may be shorter.
- *distance*: whitespace-separated integers, one per online NUMA node in id order.
- *meminfo*: lines such as ``Node 0 MemTotal:  8386704 kB``.

Some kernels (and the snapshots) pad files with trailing NUL bytes; they are
stripped along with surrounding whitespace.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_HEX_WORD = re.compile(r"^[0-9a-fA-F]{1,8}$")
_MEMTOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s+kB\s*$", re.MULTILINE)

# The kernel never numbers CPUs beyond this (CONFIG_NR_CPUS tops out at 8192);
# a larger number in a cpulist is garbage, not a big machine.
MAX_CPU_ID = 65535
# sysfs attributes are at most a page; node meminfo and distance rows of the
# largest machines stay far below this.
MAX_FILE_BYTES = 1 << 20


# A kernel device name as a selector, a pod's NUMA_NEAR_* value and a table may carry
# it: block devices (nvme0n1p1, dm-0, cciss!c0d0), interfaces (eth0, bond0.100), PCI
# addresses (0000:41:00.0). Never a comma (the variable's separator), a space, a
# control character or anything not ASCII.
KERNEL_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.:@!+]{0,63}")


def is_kernel_name(name: str) -> bool:
    """Whether ``name`` is of :data:`KERNEL_NAME`'s form."""
    return KERNEL_NAME.fullmatch(name) is not None


# Characters of a malformed file's content quoted in the error (the rest is cut).
_MAX_QUOTED = 256


class SysfsError(Exception):
    """A sysfs file could not be read (permissions, I/O error). Names the file."""


class SysfsFormatError(SysfsError):
    """A sysfs file's content is not in the kernel's format.

    Attributes: ``path`` (the file), ``content`` (what it held, NULs stripped)
    and ``reason`` (what is wrong with it).
    """

    def __init__(self, path: Path, content: str, reason: str) -> None:
        self.path = path
        self.content = content
        self.reason = reason
        shown = content if len(content) <= _MAX_QUOTED else content[:_MAX_QUOTED] + "..."
        super().__init__(f"malformed sysfs file {path}: {reason} (content: {shown!r})")


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, when not a regular file: ``a folder``,
    ``a FIFO``, ``a socket``, ``a character device``, ``a block device``."""
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


class _IsLink(Exception):
    """The file asked for with ``follow=False`` is a symbolic link."""


def read_text(path: Path, *, follow: bool = True) -> str | None:
    """Return the file's content with trailing NULs and surrounding whitespace removed.

    Only regular files are read (sysfs attributes are regular files): anything
    else at the path (a FIFO, which would block the reader for good, a device, a
    folder) raises :class:`SysfsFormatError` naming it, as does a file larger
    than :data:`MAX_FILE_BYTES` or content that is not UTF-8 text. Returns None
    when the file does not exist. Raises :class:`SysfsError` naming the file for
    any other OS error. ``follow=False``: a file that is itself a symbolic link is
    not opened (:class:`Confined` resolves it first).
    """
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise _IsLink from None
        raise SysfsError(f"cannot read sysfs file {path}: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SysfsFormatError(path, "", f"{file_kind(mode)}, not a regular file")
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SysfsError(f"cannot read sysfs file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise SysfsFormatError(
            path, raw[:80].decode("utf-8", "replace"), f"larger than {MAX_FILE_BYTES} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SysfsFormatError(path, raw.decode("utf-8", "replace"), "not UTF-8 text") from exc
    return text.replace("\0", "").strip()


def read_parsed(path: Path, parse: Callable[[str], T]) -> T | None:
    """Read ``path`` and parse it; None when the file is missing.

    Raises :class:`SysfsFormatError` (naming the file and its content) when
    ``parse`` raises ValueError, and :class:`SysfsError` when reading fails.
    """
    return parsed(path, read_text(path), parse)


def parsed(path: Path, text: str | None, parse: Callable[[str], T]) -> T | None:
    """``parse(text)`` of file ``path``'s ``text`` (None: the file is missing, None);
    a ValueError becomes :class:`SysfsFormatError` naming the file and its content."""
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise SysfsFormatError(path, text, str(exc)) from exc


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel list such as ``0-3,8`` into a set of ids; ``""`` is the empty set.

    Used for cpulist files and for ``node/online``. Raises ValueError on
    anything else (reversed ranges, non-numbers, empty items, ids > MAX_CPU_ID).
    """
    text = text.strip()
    if not text:
        return frozenset()
    ids: set[int] = set()
    for item in text.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise ValueError(f"{item!r} is not a number or a range N-M")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise ValueError(f"range {item!r} ends before it starts")
        if end > MAX_CPU_ID:
            raise ValueError(f"id {end} is larger than any kernel allows ({MAX_CPU_ID})")
        ids.update(range(start, end + 1))
    return frozenset(ids)


def parse_cpumap(text: str) -> frozenset[int]:
    """Parse a hex CPU mask (``00000000,0000ff00``) into a set of CPU ids.

    Words are 32 bits, most significant first. Raises ValueError when a word is
    not 1 to 8 hex digits.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty mask")
    words = text.split(",")
    if len(words) * 32 > MAX_CPU_ID + 1:
        raise ValueError(f"{len(words)} words is more than any kernel's CPU count")
    cpus: set[int] = set()
    for position, word in enumerate(reversed(words)):
        if not _HEX_WORD.match(word):
            raise ValueError(f"{word!r} is not a 32-bit hex word")
        value = int(word, 16)
        bit = 0
        while value:
            if value & 1:
                cpus.add(position * 32 + bit)
            value >>= 1
            bit += 1
    return frozenset(cpus)


def parse_distance(text: str) -> tuple[int, ...]:
    """Parse a node's distance row (``10 21``). Raises ValueError on non-integers or no value."""
    fields = text.split()
    if not fields:
        raise ValueError("no distance values")
    try:
        values = tuple(int(field) for field in fields)
    except ValueError:
        raise ValueError("distance values must be integers") from None
    if any(value <= 0 for value in values):
        raise ValueError("distance values must be positive")
    return values


def parse_meminfo_total(text: str) -> int:
    """Return a node's MemTotal in bytes from its ``meminfo`` text (the kernel prints kB).

    Raises ValueError when there is no ``Node N MemTotal: X kB`` line.
    """
    match = _MEMTOTAL.search(text)
    if match is None:
        raise ValueError("no 'Node N MemTotal: X kB' line")
    return int(match.group(1)) * 1024


def parse_count(text: str) -> int:
    """A non-negative whole number such as ``nr_hugepages``. Raises ValueError otherwise."""
    if not text.isdigit():
        raise ValueError("expected a non-negative whole number")
    return int(text)


def parse_online_flag(text: str) -> bool:
    """Parse ``cpu/cpuN/online``: ``1`` online, ``0`` offline. Raises ValueError otherwise."""
    if text == "1":
        return True
    if text == "0":
        return False
    raise ValueError("expected 0 or 1")


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format ids the way the kernel prints a cpulist: sorted ranges, ``0-3,8``; ``""`` if empty."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)


def folder_exists(folder: Path) -> bool:
    """Whether ``folder`` exists as a folder; raises
    :class:`~numa_device_plugin.topology.SysfsError` for anything but a folder
    or nothing (a symbolic link loop, a file, no permission), never reading it as
    "no NUMA"."""
    try:
        mode = folder.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SysfsError(f"cannot read {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        raise SysfsError(f"{folder} is not a folder ({file_kind(mode)})")
    return True


class Confined:
    """Resolves paths under one sysfs root and refuses any that leave it.

    sysfs is a tree of folders joined by relative symbolic links
    (``bus/pci/devices/<address>``, ``class/block/<name>``, a disk's ``device``); on a
    node they all stay under ``/sys``. A link, or a file that is a link, that resolves
    outside the root is not followed: its data would be somebody else's (a planted
    ``serial`` or ``numa_node``). Every reader of device trees resolves through one
    of these (:meth:`folder` for links to folders, :meth:`file` for attribute files).
    """

    def __init__(self, root: Path) -> None:
        try:
            self.real_root = Path(os.path.realpath(root))
        except (OSError, ValueError):
            self.real_root = root
        # Every real path inside the root starts with this.
        self.prefix = os.path.join(str(self.real_root), "")

    def inside(self, real: str) -> bool:
        """Whether the real (resolved) path ``real`` is the root or below it."""
        return real.startswith(self.prefix) or real == str(self.real_root)

    def folder(self, link: Path) -> Path | str:
        """The real folder ``link`` resolves to, or why it cannot be used: it points to
        nothing, cannot be resolved (a loop), leaves the root or is not a folder."""
        try:
            real = os.path.realpath(link, strict=True)
        except FileNotFoundError:
            return f"{link} points to nothing"
        except (OSError, RuntimeError, ValueError) as exc:
            return f"{link} cannot be resolved ({getattr(exc, 'strerror', None) or exc})"
        if not self.inside(real):
            return f"{link} points outside the sysfs root"
        if not os.path.isdir(real):
            return f"{link} is not a folder"
        return Path(real)

    def file(self, path: Path) -> Path | str:
        """``path`` resolved (a file itself may be a link), or why it cannot be read:
        it resolves outside the root, or cannot be resolved. A missing file resolves
        to itself (the reader then finds nothing)."""
        try:
            real = os.path.realpath(path)
        except (OSError, RuntimeError, ValueError) as exc:
            return f"{path} cannot be resolved ({getattr(exc, 'strerror', None) or exc})"
        if not self.inside(real):
            return f"{path} points outside the sysfs root"
        return Path(real)

    def read_text(self, path: Path) -> str | None:
        """:func:`read_text` of ``path``, a file in a folder already resolved inside the
        root (:meth:`folder`, or a real path walked up from one): read at once unless
        the file itself is a link, which is followed only when it resolves inside the
        root; raises :class:`SysfsError` naming the file when it does not. (One system
        call per attribute: resolving every path in full doubled the inventory's time.)"""
        try:
            return read_text(path, follow=False)
        except _IsLink:
            pass
        real = self.file(path)
        if isinstance(real, str):
            raise SysfsError(f"cannot read sysfs file {path}: {real.removeprefix(f'{path} ')}")
        return read_text(real)

    def read_parsed(self, path: Path, parse: Callable[[str], T]) -> T | None:
        """:func:`read_parsed` through :meth:`read_text` (the same errors)."""
        return parsed(path, self.read_text(path), parse)
