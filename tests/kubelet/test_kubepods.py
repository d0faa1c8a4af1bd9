"""The kubelet's kubepods cgroup folder: where it is under the host's cgroup folder, and
its watcher (real inotify on a temporary folder)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from numa_device_plugin.kubelet.kubepods import KubepodsWatcher, find_kubepods, is_kubepods
from tests.standin_helpers import eventually


@pytest.mark.parametrize(
    ("folders", "expected"),
    [
        # cgroup v2, the systemd cgroup driver.
        (["kubepods.slice/kubepods-burstable.slice", "system.slice"], "kubepods.slice"),
        # cgroup v2, cgroupfs.
        (["kubepods/burstable", "kubepods/besteffort"], "kubepods"),
        # cgroup v1: the cpuset hierarchy (the CPU manager's).
        (["cpuset/kubepods", "memory/kubepods"], "cpuset/kubepods"),
        (["cpuset/kubepods.slice"], "cpuset/kubepods.slice"),
        # A kubelet --cgroup-root (kind's): one level down.
        (
            ["kubelet.slice/kubelet-kubepods.slice", "system.slice/x.service"],
            "kubelet.slice/kubelet-kubepods.slice",
        ),
        (["kubelet/kubepods"], "kubelet/kubepods"),
        # The top wins over a deeper one.
        (["a.slice/a-kubepods.slice", "kubepods.slice"], "kubepods.slice"),
        # Not a node: nothing.
        (["system.slice/ssh.service", "user.slice"], None),
        ([], None),
    ],
)
def test_the_kubepods_folder_is_found_where_each_cgroup_driver_and_version_puts_it(
    tmp_path: Path, folders: list[str], expected: str | None
) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    for folder in folders:
        (root / folder).mkdir(parents=True)
    found = find_kubepods(root)
    assert found == (root / expected if expected is not None else None)


def test_odd_cgroup_folders_find_nothing_and_raise_nothing(tmp_path: Path) -> None:
    assert find_kubepods(tmp_path / "absent") is None
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "kubepods").write_text("not a folder")
    (tmp_path / "files" / "kubepods.slice").symlink_to(tmp_path / "nowhere")
    assert find_kubepods(tmp_path / "files") is None
    # The kubepods folder itself given.
    (tmp_path / "cg" / "kubepods.slice").mkdir(parents=True)
    assert find_kubepods(tmp_path / "cg" / "kubepods.slice") == tmp_path / "cg" / "kubepods.slice"


def test_only_kubepods_names_count() -> None:
    assert is_kubepods("kubepods")
    assert is_kubepods("kubepods.slice")
    assert is_kubepods("kubelet-kubepods.slice")
    assert not is_kubepods("kubepods-burstable.slice")
    assert not is_kubepods("kubepods-pod1234.slice")
    assert not is_kubepods("system.slice")


@contextlib.asynccontextmanager
async def watched(folder: Path) -> AsyncIterator[tuple[KubepodsWatcher, asyncio.Queue[int]]]:
    """A started watcher of ``folder``; each ``changed()`` call puts one item."""
    calls: asyncio.Queue[int] = asyncio.Queue()
    watcher = KubepodsWatcher(folder, lambda: calls.put_nowait(1), asyncio.get_running_loop())
    watcher.start()
    try:
        yield watcher, calls
    finally:
        watcher.stop()


async def changed_within(calls: asyncio.Queue[int], timeout: float = 5.0) -> None:
    await asyncio.wait_for(calls.get(), timeout)


async def test_a_pod_cgroup_made_or_removed_calls_changed(tmp_path: Path) -> None:
    """Mutant: the handler ignores deletions (a pod leaving frees nothing until the backstop)."""
    kubepods = tmp_path / "kubepods"
    kubepods.mkdir()
    async with watched(kubepods) as (watcher, calls):
        assert watcher.live
        (kubepods / "pod1").mkdir()
        await changed_within(calls)
        (kubepods / "pod1").rmdir()
        await changed_within(calls)
        (kubepods / "pod2").mkdir()
        await changed_within(calls)
        os.rename(kubepods / "pod2", tmp_path / "elsewhere")  # moved away
        await changed_within(calls)


async def drained(watcher: KubepodsWatcher, calls: asyncio.Queue[int]) -> int:
    """Once the watch has seen its folder's own deletion (every event before it was
    handed over): stop and join it, run what it handed to the loop, and count the calls."""
    await eventually(lambda: watcher.ended)
    watcher.stop()
    for _ in range(3):
        await asyncio.sleep(0)
    return calls.qsize()


async def test_files_and_deeper_folders_call_nothing(tmp_path: Path) -> None:
    """A container's cgroup (a level down) and file events are not asked for: a busy
    node's cgroup files would otherwise wake the plugin for nothing. The folder's own
    removal, the last event, shows that the earlier ones were all handled: only the
    move of a pod folder out and that removal call."""
    kubepods = tmp_path / "kubepods"
    (kubepods / "burstable").mkdir(parents=True)
    async with watched(kubepods) as (watcher, calls):
        (kubepods / "burstable" / "pod9").mkdir()
        (kubepods / "burstable" / "pod9").rmdir()
        (kubepods / "cgroup.events").write_text("populated 1\n")
        (kubepods / "cgroup.events").write_text("populated 0\n")
        (kubepods / "cgroup.events").unlink()
        os.rename(kubepods / "burstable", tmp_path / "burstable")  # a folder going: a call
        kubepods.rmdir()  # the watch's last event: a call
        assert await drained(watcher, calls) == 2


async def test_the_watch_is_not_live_once_its_folder_is_removed_or_replaced(
    tmp_path: Path,
) -> None:
    kubepods = tmp_path / "kubepods"
    kubepods.mkdir()
    async with watched(kubepods) as (watcher, calls):
        assert watcher.live
        kubepods.rmdir()
        assert not watcher.live
        await changed_within(calls)  # its own deletion: the owner looks again
        kubepods.mkdir()  # another folder by the same name (the inode may be reused)
        assert not watcher.live
        (kubepods / "pod1").mkdir()
        # a watch of the new folder sees pod2 come: the events happen, not to the old one
        async with watched(kubepods) as (fresh, fresh_calls):
            (kubepods / "pod2").mkdir()
            await changed_within(fresh_calls)
            assert fresh.live
        assert await drained(watcher, calls) == 0, "the new folder is not watched"
    assert not watcher.live, "stopped"


def test_an_absent_folder_cannot_be_watched(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    watcher = KubepodsWatcher(tmp_path / "absent", lambda: None, loop)
    with pytest.raises(FileNotFoundError):
        watcher.start()
    assert not watcher.live
    watcher.stop()  # idempotent, nothing started
    loop.close()
