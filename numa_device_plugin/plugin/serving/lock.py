"""Keeping the instance lock (:class:`~numa_device_plugin.ops.instancelock.InstanceLock`) while
serving, and standing down without it.

Two plugins serving one device-plugin folder fight: each registration replaces the
other's. So nothing is served without the folder's lock:

- At start the plugin waits (polling every :data:`LOCK_POLL` seconds) while another
  instance holds the lock; a lock file that cannot be locked is an error then.
- While serving, the lock file is checked whenever the loop wakes, and the watcher
  wakes it for anything created, deleted or moved in the lock's subfolder (inotify)
  or the subfolder going; a periodic check is the backstop: every
  :data:`LOCK_CHECK_WATCHED` seconds while the subfolder is watched, every
  :data:`LOCK_CHECK` seconds while it is not (no inotify watch left, say). If it was deleted and the
  folder created again (the kubelet's own clean-up never does that, an operator's
  ``rm -rf`` does), the new file is locked. If another instance got it first, or it
  cannot be locked (say a folder now stands in its place), the plugin stands down:
  it stops serving, ``/readyz`` says why, and it waits for the lock as at start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from numa_device_plugin.ops.instancelock import InstanceLock
from numa_device_plugin.ops.wakeups import LOCK_CHANGED

log = structlog.get_logger(__name__)

# Seconds between attempts to take the lock while it cannot be taken.
LOCK_POLL = 0.2
# Seconds between checks that the lock file is still the one this instance locked,
# while its subfolder is not watched, and while it is (a backstop: an event lost to a
# full inotify queue).
LOCK_CHECK = 2.0
LOCK_CHECK_WATCHED = 60.0


class LockKeeper:
    """The lock of ``socket_dir``, why it is not held (``problem``, for ``/readyz``),
    whether it was lost while serving (``lost``: the loop must stand down) and whether
    the last :meth:`acquire` took it over (``took_over``: after waiting for another
    instance or after standing down; what was looked at before may have changed)."""

    def __init__(self, socket_dir: Path, on_change: Callable[[], None]) -> None:
        self.socket_dir = socket_dir
        self.lock = InstanceLock(socket_dir)
        self.problem: str | None = None
        self.lost = False
        self.took_over = False
        self._on_change = on_change
        self._recheck = asyncio.Event()

    async def acquire(
        self,
        *,
        raise_errors: bool,
        stopping: Callable[[], bool],
        nap: Callable[[float], Awaitable[None]],
    ) -> bool:
        """Take the lock, waiting while another instance holds it or, unless
        ``raise_errors`` (at start: OSError is raised), while it cannot be locked.
        ``nap(seconds)`` waits between attempts (less when the loop is woken). False
        when ``stopping()`` turned true meanwhile."""
        announced: str | None = None
        while not stopping():
            error: OSError | None = None
            try:
                acquired = self.lock.try_acquire()
            except OSError as exc:
                if raise_errors:
                    raise
                acquired, error = False, exc
            if acquired:
                # Said whenever the lock comes after waiting or after standing down, even
                # at the first attempt (the holder may be gone by then).
                self.took_over = bool(announced or self.lost)
                if self.took_over:
                    log.info("took over the instance lock", lock=str(self.lock.path))
                self.problem = None
                self.lost = False
                return True
            if error is not None:
                kind = "error"
                problem = f"cannot lock {self.lock.path}: {error}; serving nothing until it can"
                if announced != kind:
                    log.error(
                        "cannot lock the device-plugin folder; serving nothing until it can",
                        lock=str(self.lock.path),
                        error=str(error),
                    )
            else:
                kind = "holder"
                holder = self.lock.holder()
                problem = (
                    f"another instance ({holder}) holds the lock {self.lock.path}; "
                    "waiting for it to exit"
                )
                if announced != kind:
                    log.warning(
                        "another instance serves this device-plugin folder; waiting for it to exit",
                        holder=holder,
                        lock=str(self.lock.path),
                    )
            announced = kind
            if problem != self.problem:
                self.problem = problem
                self._on_change()
            await nap(LOCK_POLL)
        return False

    def keep(self) -> bool:
        """Still hold the lock, locking a new lock file when the old one is gone; False
        (and ``lost``) when another instance got it first or it cannot be locked."""
        self._recheck.set()  # the periodic check's period may have changed
        if self.lock.intact() or not self.socket_dir.is_dir():
            return True  # still ours, or no folder to serve in yet
        try:
            if self.lock.try_acquire():
                log.warning(
                    "the lock file was replaced; locked the new one", lock=str(self.lock.path)
                )
                return True
        except OSError as exc:
            log.error(
                "cannot lock the device-plugin folder; standing down",
                lock=str(self.lock.path),
                error=str(exc),
            )
            self.problem = f"cannot lock {self.lock.path}: {exc}"
        else:
            if not self.socket_dir.is_dir():
                return True  # the folder went while it was being locked: none to serve in
            holder = self.lock.holder()
            log.warning("another instance took the lock; standing down", holder=holder)
            self.problem = f"another instance ({holder}) holds the lock"
        self.lost = True
        return False

    async def watch(self, wake: Callable[[str], None], watched: Callable[[], bool]) -> None:
        """``wake(LOCK_CHANGED)`` when the lock file is no longer the one this instance
        locked, checked every LOCK_CHECK_WATCHED seconds while ``watched()`` (the lock's
        subfolder is watched), else every LOCK_CHECK seconds; until cancelled. Each
        :meth:`keep` starts the period anew with ``watched()`` as it is then."""
        while True:
            self._recheck.clear()
            period = LOCK_CHECK_WATCHED if watched() else LOCK_CHECK
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._recheck.wait(), period)
            if self.lock.held and not self.lock.intact():
                wake(LOCK_CHANGED)

    def release(self) -> None:
        self.lock.release()
