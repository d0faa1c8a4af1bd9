"""The ``kubelet.sock`` watcher: the events it turns into wake-ups as the kubelet and
the device-plugin folder come and go."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from numa_device_plugin.kubelet.watcher import (
    FOLDER_CREATED,
    FOLDER_DELETED,
    KUBELET_CREATED,
    SocketDirWatcher,
)


class Woken:
    """The reasons the watcher woke the manager with, waited on by condition."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.seen = threading.Condition()

    def __call__(self, reason: str, name: str) -> None:
        with self.seen:
            self.reasons.append(reason)
            self.seen.notify_all()

    def wait_for(self, reason: str, timeout: float = 10) -> None:
        with self.seen:
            assert self.seen.wait_for(lambda: reason in self.reasons, timeout), self.reasons


@contextmanager
def watching(folder: Path) -> Iterator[Woken]:
    """A :class:`SocketDirWatcher` on ``folder`` waking a :class:`Woken`, its loop in a
    thread, for the block."""
    woken = Woken()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    watcher = SocketDirWatcher(folder, woken, loop)
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
