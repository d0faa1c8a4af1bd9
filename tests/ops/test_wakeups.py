"""The loop's wake-ups: reasons recorded, a reload kept until taken, no debounce once
stopping."""

from __future__ import annotations

import asyncio
import time

from numa_device_plugin.ops.wakeups import Wakeups


async def test_a_reload_stays_pending_until_taken() -> None:
    """Mutant: ``pending`` ignoring a reload (after the reasons were drained)."""
    wakeups = Wakeups()
    wakeups.reload()
    wakeups.drain()
    assert wakeups.pending
    assert wakeups.take_reload()
    assert not wakeups.pending


async def test_no_debounce_once_stopping() -> None:
    """Mutant: the debounce applied while stopping (a SIGTERM waited it out)."""
    wakeups = Wakeups()
    wakeups.stop()
    started = time.monotonic()
    await asyncio.wait_for(wakeups.sleep(None, debounce=30.0), 5)
    assert time.monotonic() - started < 1
