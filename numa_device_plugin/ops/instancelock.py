"""One plugin instance per device-plugin folder: an advisory ``flock`` on a lock file.

Two plugins serving the same resources from one folder fight: each one's
registration replaces the other's, and the kubelet ends up with streams from
both. So before touching any socket the plugin takes an exclusive ``flock`` on
``<socket folder>/.numa-device-plugin/lock``. The lock file sits in a
subfolder because the kubelet, when it starts, deletes every file of the
device-plugin folder but its checkpoint (subfolders and their contents stay);
a lock on a deleted file would lock nothing a newcomer sees. The file is never
deleted: deleting it would let a newcomer lock a fresh file while a waiter
still holds the old one open.

The holder writes ``pid=<pid> host=<hostname>`` into the file, so a waiting
instance can say who is in its way. The lock goes when the holder's file
descriptor closes, i.e. at the latest when its process exits.

The folder is shared with the kubelet and whatever else runs as root on the node, so
nothing in it is trusted: the subfolder and the file are opened with ``O_NOFOLLOW``
(a symlink planted there, say to the kubelet's checkpoint, is refused, never written
through) and ``O_NONBLOCK`` (a FIFO neither blocks the open nor a read), and anything
that is not a regular file is refused with an :class:`OSError` naming it. Every
descriptor is closed on every path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from numa_device_plugin.topology.sysfs import file_kind

LOCK_DIR_NAME = ".numa-device-plugin"
LOCK_FILE_NAME = "lock"
# Bytes of the holder's line that are read (it writes about 40).
HOLDER_BYTES = 200
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_in_folder(folder: Path, name: str, flags: int, mode: int = 0o644) -> int:
    """A descriptor of the regular file ``folder/name``, opened with ``flags`` plus
    ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC``, ``folder`` itself opened without
    following a link. Raises OSError: ``ELOOP`` for a symlink (folder or file),
    ``ENOTDIR``/``EINVAL`` naming the path when it is a folder, FIFO, socket or device,
    FileNotFoundError when either is missing."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        raise _named(exc, folder) from None
    try:
        fd = os.open(name, flags | _NOFOLLOW, mode, dir_fd=folder_fd)
    except OSError as exc:
        raise _named(exc, folder / name) from None
    finally:
        os.close(folder_fd)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise OSError(
                errno.EINVAL, f"not a regular file ({file_kind(kind)})", str(folder / name)
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming the whole ``path`` (``dir_fd`` opens name only the last part),
    a symlink said as such."""
    if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and path.is_symlink()):
        return OSError(exc.errno, "a symbolic link: refused, never followed", str(path))
    return type(exc)(exc.errno, exc.strerror, str(path))


class InstanceLock:
    """The exclusive lock of one device-plugin folder (``socket_dir``).

    ``path`` is the lock file. Not thread-safe; use from the event loop's thread.
    """

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.path = socket_dir / LOCK_DIR_NAME / LOCK_FILE_NAME
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; True when this instance holds it now.

        Creates the lock subfolder and file when missing (never the socket folder
        itself: returns False when that is gone). Raises OSError when the folder
        exists but the file cannot be created or opened (permissions, read-only), or
        when the subfolder or the file is a symlink (``ELOOP``), or the file is not a
        regular file (a FIFO, a folder: ``EINVAL`` naming it). Nothing is written
        through a link, and no descriptor stays open but the held lock's.
        """
        if self.intact():
            return True
        self.release()
        try:
            self.path.parent.mkdir(exist_ok=True)
        except FileNotFoundError:
            return False  # the socket folder itself is gone
        fd = _open_in_folder(self.path.parent, self.path.name, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
            info = os.fstat(fd)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._identity = fd, (info.st_dev, info.st_ino)
        return True

    def intact(self) -> bool:
        """True while this instance holds the lock on the file now at :attr:`path`
        (False once the folder, and the file with it, was deleted or replaced)."""
        if self._fd is None:
            return False
        try:
            info = self.path.lstat()
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self._identity

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (``pid=12 host=node-a``), or
        ``unknown`` when the file says nothing readable. Never blocks: the file is
        opened like the lock (no link followed, a FIFO or folder refused) and at most
        :data:`HOLDER_BYTES` are read."""
        try:
            fd = _open_in_folder(self.path.parent, self.path.name, os.O_RDONLY)
        except OSError:
            return "unknown"
        try:
            data = os.pread(fd, HOLDER_BYTES, 0)
        except OSError:
            return "unknown"
        finally:
            os.close(fd)
        return data.decode(errors="replace").strip() or "unknown"

    def release(self) -> None:
        """Give the lock up (closing the descriptor unlocks it). Idempotent."""
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            os.close(fd)
