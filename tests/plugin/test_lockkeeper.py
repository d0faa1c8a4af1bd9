"""The lock keeper's periodic check: a backstop while the lock's subfolder is watched,
every LOCK_CHECK seconds while it is not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from numa_device_plugin.ops.wakeups import LOCK_CHANGED
from numa_device_plugin.plugin.serving import lock as lockkeeper
from numa_device_plugin.plugin.serving.lock import LockKeeper
from tests.standin_helpers import eventually, past


async def test_the_lock_is_checked_only_as_a_backstop_while_its_folder_is_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants: the watched period ignored (a check every LOCK_CHECK, a loop wake
    each); the period not chosen anew when the watch comes or goes."""
    monkeypatch.setattr(lockkeeper, "LOCK_CHECK", 0.05)
    monkeypatch.setattr(lockkeeper, "LOCK_CHECK_WATCHED", 30.0)
    keeper = LockKeeper(tmp_path, lambda: None)
    assert keeper.lock.try_acquire()
    checks = {"n": 0}
    real_intact = keeper.lock.intact

    def counted() -> bool:
        checks["n"] += 1
        return real_intact()

    monkeypatch.setattr(keeper.lock, "intact", counted)
    watched = {"now": True}
    chosen: list[bool] = []  # each period chosen: whether the folder was watched then

    def is_watched() -> bool:
        chosen.append(watched["now"])
        return watched["now"]

    woken: list[str] = []
    task = asyncio.create_task(keeper.watch(woken.append, is_watched))
    try:
        await eventually(lambda: chosen == [True])  # the watched period is under way
        await past(lockkeeper.LOCK_CHECK * 4)  # four unwatched periods would have checked
        assert (checks["n"], chosen) == (0, [True]), "no check within the watched period"
        watched["now"] = False
        assert keeper.keep()  # a wake of the loop: the period is chosen anew
        checks["n"] = 0
        await eventually(lambda: checks["n"] >= 3)
        watched["now"] = True
        chosen.clear()
        assert keeper.keep()
        await eventually(lambda: chosen[-1:] == [True])  # the watched period chosen anew
        checks["n"] = 0
        await past(lockkeeper.LOCK_CHECK * 4)
        assert checks["n"] == 0
        assert woken == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        keeper.release()


async def test_a_lock_file_deleted_while_unwatched_wakes_the_loop_at_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockkeeper, "LOCK_CHECK", 0.05)
    keeper = LockKeeper(tmp_path, lambda: None)
    assert keeper.lock.try_acquire()
    woken: list[str] = []
    task = asyncio.create_task(keeper.watch(woken.append, lambda: False))
    try:
        keeper.lock.path.unlink()
        await eventually(lambda: LOCK_CHANGED in woken)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        keeper.release()
