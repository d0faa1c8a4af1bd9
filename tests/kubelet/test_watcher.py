"""The ``kubelet.sock`` watcher: the events it turns into wake-ups as the kubelet and
the device-plugin folder come and go."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from numa_device_plugin.kubelet.watcher import (
    FOLDER_CREATED,
    FOLDER_DELETED,
    KUBELET_CREATED,
    SUBFOLDER_CHANGED,
    SocketDirWatcher,
)


class Woken:
    """The reasons the watcher woke the manager with, waited on by condition."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.seen = threading.Condition()
        self.watcher: SocketDirWatcher | None = None

    def __call__(self, reason: str, name: str) -> None:
        with self.seen:
            self.reasons.append(reason)
            self.seen.notify_all()

    def wait_for(self, reason: str, timeout: float = 10) -> None:
        with self.seen:
            assert self.seen.wait_for(lambda: reason in self.reasons, timeout), self.reasons


@contextmanager
def watching(folder: Path, subfolders: tuple[str, ...] = ()) -> Iterator[Woken]:
    """A :class:`SocketDirWatcher` on ``folder`` waking a :class:`Woken` (its
    ``watcher`` attribute), its loop in a thread, for the block."""
    woken = Woken()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    watcher = SocketDirWatcher(folder, woken, loop, subfolders)
    woken.watcher = watcher
    watcher.start()
    try:
        yield woken
    finally:
        watcher.stop()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def test_a_kubelet_sock_that_appears_by_rename_wakes_the_manager(tmp_path: Path) -> None:
    """The kubelet creates its socket under another name and renames it in place (a
    moved-in file is no Create event)."""
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    with watching(folder) as woken:
        (folder / "kubelet.sock.tmp").touch()
        (folder / "kubelet.sock.tmp").rename(folder / "kubelet.sock")
        woken.wait_for(KUBELET_CREATED)


def test_the_folder_moved_away_and_back_is_watched_again(tmp_path: Path) -> None:
    """A kubelet restart that moves the device-plugin folder aside (a rename, not a
    delete) and a new one in its place."""
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    with watching(folder) as woken:
        folder.rename(tmp_path / "device-plugins.old")
        woken.wait_for(FOLDER_DELETED)
        folder.mkdir()
        woken.wait_for(FOLDER_CREATED)
        woken.reasons.clear()
        (folder / "kubelet.sock").touch()
        woken.wait_for(KUBELET_CREATED)


def test_the_watcher_finds_its_folder_gone_again_and_watches_it_when_it_is_back(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    woken: list[str] = []
    seen = threading.Condition()
    loop = asyncio.new_event_loop()

    def wake(reason: str, name: str) -> None:
        with seen:
            woken.append(reason)
            seen.notify_all()

    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    watcher = SocketDirWatcher(folder, wake, loop)
    watcher.start()
    try:
        shutil.rmtree(folder)
        # It came back and went again before the watcher could watch it: no wake, no
        # error, nothing watched.
        watcher._folder_appeared()
        assert watcher._watch is None
        assert FOLDER_CREATED not in woken
        # Back for good: watched again, and kubelet.sock in it wakes the manager.
        folder.mkdir()
        with seen:
            assert seen.wait_for(lambda: FOLDER_CREATED in woken, timeout=10), woken
        (folder / "kubelet.sock").touch()
        with seen:
            assert seen.wait_for(lambda: KUBELET_CREATED in woken, timeout=10), woken
    finally:
        watcher.stop()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def wait_quiet(woken: Woken, seconds: float = 0.5) -> list[str]:
    """The reasons woken with over ``seconds`` (inotify delivers within milliseconds)."""
    woken.reasons.clear()
    time.sleep(seconds)
    return list(woken.reasons)


def subfolder_watched(woken: Woken, expected: bool, timeout: float = 10) -> None:
    assert woken.watcher is not None
    deadline = time.monotonic() + timeout
    while woken.watcher.subfolders_watched != expected:
        assert time.monotonic() < deadline, f"subfolders_watched stayed {not expected}"
        time.sleep(0.01)


def appears_and_is_watched(woken: Woken, subfolder: Path) -> None:
    """``subfolder`` made: it wakes, is watched, and a file made in it wakes."""
    subfolder.mkdir()
    woken.wait_for(SUBFOLDER_CHANGED)
    subfolder_watched(woken, True)
    woken.reasons.clear()
    (subfolder / "lock").touch()
    woken.wait_for(SUBFOLDER_CHANGED)


def test_a_lock_subfolder_wakes_on_what_is_created_deleted_or_moved_not_on_reads(
    tmp_path: Path,
) -> None:
    """Mutants: subfolder events dropped; opens, reads and writes waking (a second
    instance reads the holder line five times a second while it waits)."""
    folder = tmp_path / "device-plugins"
    (folder / ".lock").mkdir(parents=True)
    lock = folder / ".lock" / "lock"
    lock.write_text("pid=1\n")
    with watching(folder, (".lock",)) as woken:
        subfolder_watched(woken, True)
        assert wait_quiet(woken, 0.2) == []
        with lock.open("r+") as handle:
            handle.read()
            handle.write("more\n")
        lock.read_text()
        assert wait_quiet(woken) == []
        lock.unlink()
        woken.wait_for(SUBFOLDER_CHANGED)
        woken.reasons.clear()
        lock.mkdir()  # a folder in its place
        woken.wait_for(SUBFOLDER_CHANGED)
        woken.reasons.clear()
        lock.rmdir()
        (folder / ".lock" / "other").touch()
        (folder / ".lock" / "other").rename(lock)
        woken.wait_for(SUBFOLDER_CHANGED)
        # Nothing in the socket folder itself was touched: no socket deletion.
        assert "socket deleted" not in woken.reasons


def test_a_lock_subfolder_deleted_and_made_again_is_watched_again(tmp_path: Path) -> None:
    """Mutant: the watch kept for the deleted folder (the new one's changes would wake
    nothing, and subfolders_watched would keep saying True)."""
    folder = tmp_path / "device-plugins"
    (folder / ".lock").mkdir(parents=True)
    with watching(folder, (".lock",)) as woken:
        subfolder_watched(woken, True)
        shutil.rmtree(folder / ".lock")
        woken.wait_for(SUBFOLDER_CHANGED)
        subfolder_watched(woken, False)
        woken.reasons.clear()
        appears_and_is_watched(woken, folder / ".lock")


def test_a_lock_subfolder_absent_at_start_is_watched_once_it_appears(tmp_path: Path) -> None:
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    with watching(folder, (".lock",)) as woken:
        assert woken.watcher is not None
        assert not woken.watcher.subfolders_watched
        appears_and_is_watched(woken, folder / ".lock")


def test_the_socket_folder_made_again_with_its_lock_subfolder_is_watched_again(
    tmp_path: Path,
) -> None:
    """An operator's ``rm -rf`` and a new folder that already holds the subfolder when
    the watcher gets to it: the subfolder is watched with the folder."""
    folder = tmp_path / "device-plugins"
    (folder / ".lock").mkdir(parents=True)
    with watching(folder, (".lock",)) as woken:
        subfolder_watched(woken, True)
        shutil.rmtree(folder)
        woken.wait_for(FOLDER_DELETED)
        subfolder_watched(woken, False)
        (tmp_path / "staged" / ".lock").mkdir(parents=True)
        (tmp_path / "staged").rename(folder)
        woken.wait_for(FOLDER_CREATED)
        subfolder_watched(woken, True)
        woken.reasons.clear()
        (folder / ".lock" / "lock").touch()
        woken.wait_for(SUBFOLDER_CHANGED)
