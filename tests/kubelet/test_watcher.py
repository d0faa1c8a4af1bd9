"""The ``kubelet.sock`` watcher: the events it turns into wake-ups as the kubelet and
the device-plugin folder come and go."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

from numa_device_plugin.kubelet.watcher import FOLDER_CREATED, KUBELET_CREATED, SocketDirWatcher


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
