"""The restart loop's wake-ups: why the loop should look at the world again, and when.

Everything that can change what must be served only wakes the loop and says why:
the watcher (``kubelet.sock`` created, a socket deleted, the folder gone or back), a
servicer whose ListAndWatch stream the kubelet dropped, SIGHUP (reload), SIGTERM
(stop), the lock check, a retry timer. A wake first gathers the burst of events that
usually comes with it (``debounce`` seconds), so the loop acts once on the state it
then finds, not once per event: a restart storm ends in one server and one
registration per resource.

Tests wait for :meth:`Wakeups.wait_until` a predicate instead of sleeping; every
change of state announces itself (:meth:`Wakeups.announce`) to let them look again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

STREAM_LOST = "ListAndWatch stream lost"
RELOAD = "reload requested"
STOP = "stop requested"
LOCK_CHANGED = "lock file changed"
DEVICES_CHANGED = "devices changed"


class Wakeups:
    """Reasons to wake, the stop and reload requests, and whether the loop is idle.

    Loop thread only (the watcher hands its events over with ``call_soon_threadsafe``).
    """

    def __init__(self) -> None:
        self._reasons: list[tuple[str, str]] = []
        self._woken = asyncio.Event()
        self.stopping = False
        self._reload = False
        self.idle = False
        self._changed = asyncio.Event()

    def wake(self, reason: str, name: str = "") -> None:
        """Record why the loop should look again (``name``: the file or resource), and
        wake it."""
        self._reasons.append((reason, name))
        self.announce()
        self._woken.set()

    def stop(self) -> None:
        """Ask the loop to stop (SIGTERM)."""
        self.stopping = True
        self.wake(STOP)

    def reload(self) -> None:
        """Ask the loop to discover again and serve everything afresh (SIGHUP)."""
        self._reload = True
        self.wake(RELOAD)

    def take_reload(self) -> bool:
        """True once after each :meth:`reload`."""
        asked, self._reload = self._reload, False
        return asked

    @property
    def pending(self) -> bool:
        """A reason or a reload not yet handled."""
        return bool(self._reasons) or self._reload

    def woken_now(self) -> bool:
        return self._woken.is_set()

    async def sleep(self, delay: float | None, debounce: float) -> None:
        """Until woken (then ``debounce`` seconds more, to gather the burst) or until
        ``delay`` seconds have passed (None: no limit)."""
        try:
            async with asyncio.timeout(delay):
                await self._woken.wait()
        except TimeoutError:
            return
        if debounce and not self.stopping:
            await asyncio.sleep(debounce)

    async def nap(self, seconds: float) -> None:
        """Up to ``seconds``, less when woken; the wake is consumed unless stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._woken.wait()
        if not self.stopping:
            self._woken.clear()

    def drain(self) -> list[tuple[str, str]]:
        """The reasons gathered since the last drain; the loop is no longer woken."""
        self._woken.clear()
        reasons, self._reasons = self._reasons, []
        return reasons

    def set_idle(self, idle: bool) -> None:
        """The loop sleeps with nothing left to do (or stopped doing so)."""
        self.idle = idle
        self.announce()

    def announce(self) -> None:
        """Something changed: let :meth:`wait_until` look again."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None) -> None:
        """Wait until ``predicate()``, looked at after every announced change; raises
        TimeoutError after ``timeout`` seconds (None: no limit)."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._changed.wait()
