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
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_DIR_NAME = ".numa-device-plugin"
LOCK_FILE_NAME = "lock"


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
        exists but the file cannot be created or opened (permissions, read-only).
        """
        if self.intact():
            return True
        self.release()
        try:
            self.path.parent.mkdir(exist_ok=True)
        except FileNotFoundError:
            return False  # the socket folder itself is gone
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        info = os.fstat(fd)
        self._fd, self._identity = fd, (info.st_dev, info.st_ino)
        return True

    def intact(self) -> bool:
        """True while this instance holds the lock on the file now at :attr:`path`
        (False once the folder, and the file with it, was deleted or replaced)."""
        if self._fd is None:
            return False
        try:
            info = self.path.stat()
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self._identity

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (``pid=12 host=node-a``), or
        ``unknown`` when the file says nothing readable."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            return "unknown"
        return text[:200] or "unknown"

    def release(self) -> None:
        """Give the lock up (closing the descriptor unlocks it). Idempotent."""
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            os.close(fd)
