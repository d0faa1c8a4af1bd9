"""When the capacity poller reads the pod resources API next: every interval, or
sooner when asked (a registration, an Allocate, a Guaranteed pod's cgroup coming or
going); see :mod:`numa_device_plugin.plugin.counts.poller` for why each."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

# While a change signal is live (the kubepods watch), seconds between reads at least.
SIGNALLED_INTERVAL = 60.0
# Seconds after a signal to read, and to read once more (the kubelet may drop a
# terminated pod from its active pods a moment after removing its cgroup).
SIGNAL_POLL_DELAY, SIGNAL_SETTLE_DELAY = 0.5, 5.0


class ReadSchedule:
    """The next read's time: :meth:`wait` returns after :meth:`period` seconds (the
    ``interval``, in seconds), or as soon as :meth:`request` or :meth:`pods_changed`
    asks. Loop thread only.

    ``signalled`` says whether a signal of the kubelet's changes is live (set by the
    owner of the kubepods watch); while it is, the interval is a backstop of at least
    :data:`SIGNALLED_INTERVAL` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.signalled: Callable[[], bool] = lambda: False
        self._now = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._settle: asyncio.TimerHandle | None = None
        self._allocatable_asked = False

    def request(self, delay: float = 0.0, *, allocatable: bool = False) -> None:
        """Read ``delay`` seconds from now; ``allocatable``: read
        ``GetAllocatableResources`` too, not only ``List``."""
        self._allocatable_asked |= allocatable
        if delay <= 0:
            self._now.set()
        elif self._timer is None or self._timer.cancelled():
            self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def period(self) -> float:
        """Seconds to the next read when nothing asks sooner: the interval, or at least
        :data:`SIGNALLED_INTERVAL` while :attr:`signalled` says a signal is live."""
        return max(self.interval, SIGNALLED_INTERVAL) if self.signalled() else self.interval

    def pods_changed(self) -> None:
        """A Guaranteed pod's cgroup came or went: read :data:`SIGNAL_POLL_DELAY`
        seconds from now, and again :data:`SIGNAL_SETTLE_DELAY` seconds after the last
        such signal."""
        self.request(SIGNAL_POLL_DELAY)
        if self._settle is not None:
            self._settle.cancel()
        self._settle = asyncio.get_running_loop().call_later(SIGNAL_SETTLE_DELAY, self._now.set)

    def take_allocatable(self) -> bool:
        """Whether a read of ``GetAllocatableResources`` was asked since the last call."""
        asked, self._allocatable_asked = self._allocatable_asked, False
        return asked

    async def wait(self) -> None:
        """Until the next read is due (:meth:`period` seconds, or asked sooner)."""
        # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
        # cancellation that arrives as the event is set, and the poller would
        # outlive the plugin's shutdown by an interval.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.period()):
                await self._now.wait()
        self._now.clear()

    def cancel(self) -> None:
        """Cancel the pending timers."""
        for timer in (self._timer, self._settle):
            if timer is not None:
                timer.cancel()

    def _fire(self) -> None:
        self._timer = None
        self._now.set()
