"""What wakes the restart loop while :meth:`PluginManager.serve` runs, besides the
kubelet's calls: the device-plugin folder's watcher (with the instance lock's
subfolder), the lock keeper's backstop check and the device watch. They only wake
the loop or feed it; this module starts and stops them together."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from numa_device_plugin.kubelet.watcher import SocketDirWatcher
from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME
from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.devicewatch import DeviceWatch
from numa_device_plugin.plugin.lockkeeper import LockKeeper


class Watches:
    """The watcher thread and the two watch tasks, for the time the loop serves."""

    def __init__(
        self,
        config: Config,
        wake: Callable[[str, str], None],
        lock_keeper: LockKeeper,
        device_watch: DeviceWatch,
    ) -> None:
        self._config = config
        self._wake = wake
        self._lock_keeper = lock_keeper
        self._device_watch = device_watch
        self._watcher: SocketDirWatcher | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Watch the device-plugin folder (which must exist) and start the checks.
        Raises OSError when the folder cannot be watched (inotify)."""
        loop = asyncio.get_running_loop()
        watcher = SocketDirWatcher(self._config.socket_dir, self._wake, loop, (LOCK_DIR_NAME,))
        watcher.start()
        self._watcher = watcher
        self._tasks = [
            asyncio.create_task(
                self._lock_keeper.watch(
                    lambda reason: self._wake(reason, ""), lambda: watcher.subfolders_watched
                ),
                name="lock check",
            ),
            asyncio.create_task(self._device_watch.run(), name="device watch"),
        ]

    async def stop(self) -> None:
        """Cancel the checks and stop the watcher thread. Idempotent."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
