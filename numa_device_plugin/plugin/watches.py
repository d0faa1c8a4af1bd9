"""What wakes the restart loop while :meth:`PluginManager.serve` runs, besides the
kubelet's calls: the device-plugin folder's watcher (with the instance lock's
subfolder), the lock keeper's backstop check, the device watch and (``--cgroup-root``)
the kubelet's kubepods folder's watcher. They only wake the loop or feed it (the
kubepods watcher asks the capacity poller for a read); this module starts and stops
them together. The kubepods watch starts at the first accepted registration, not
before (registering does not need it), and is made again at a later one when it has
ended (a kubelet that replaced the folder, such as after a change of cgroup driver)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog

from numa_device_plugin.kubelet.kubepods import KubepodsWatcher, find_kubepods
from numa_device_plugin.kubelet.watcher import SocketDirWatcher
from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME
from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.devicewatch import DeviceWatch
from numa_device_plugin.plugin.lockkeeper import LockKeeper

log = structlog.get_logger(__name__)


class Watches:
    """The watcher thread and the two watch tasks, for the time the loop serves."""

    def __init__(
        self,
        config: Config,
        wake: Callable[[str, str], None],
        lock_keeper: LockKeeper,
        device_watch: DeviceWatch,
        pods_changed: Callable[[], None],
    ) -> None:
        self._config = config
        self._wake = wake
        self._lock_keeper = lock_keeper
        self._device_watch = device_watch
        self._pods_changed = pods_changed
        self._watcher: SocketDirWatcher | None = None
        self._kubepods: KubepodsWatcher | None = None
        # The kubelet (its kubelet.sock identity) the kubepods folder was last looked
        # for under (none yet: a value no kubelet has), and whether its absence was
        # said (then later looks say it at debug).
        self._kubepods_looked: object = object()
        self._kubepods_absent_said = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Watch the device-plugin folder (which must exist) and start the checks.
        Raises OSError when the folder cannot be watched (inotify)."""
        loop = self._loop = asyncio.get_running_loop()
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

    def ensure_kubepods(self, kubelet: tuple[int, int, int] | None) -> None:
        """Watch the kubelet's kubepods folder (``--cgroup-root``) unless a live watch
        does (loop thread, between :meth:`start` and :meth:`stop`). Called at each
        accepted registration; ``kubelet``: the file identity of the kubelet.sock
        registered with (``grpcserver.file_identity``). When the folder is not found it
        is looked for again only under another kubelet. Never raises."""
        root = self._config.cgroup_root
        if root is None or self._loop is None or self.pods_signalled:
            return
        if self._kubepods is None and kubelet == self._kubepods_looked:
            return  # looked for under this kubelet already: not there
        self._kubepods_looked = kubelet
        ended, self._kubepods = self._kubepods, None
        if ended is not None:
            ended.stop()
            log.info("the kubepods cgroup folder's watch ended; looking for it again",
                     folder=str(ended.folder))  # fmt: skip
        self._kubepods = watch_kubepods(root, self._pods_changed, self._loop,
                                        quiet=self._kubepods_absent_said)  # fmt: skip
        self._kubepods_absent_said |= self._kubepods is None

    @property
    def pods_signalled(self) -> bool:
        """True while the kubelet's kubepods folder is watched (a Guaranteed pod's
        cgroup coming or going calls ``pods_changed``)."""
        return self._kubepods is not None and self._kubepods.live

    async def stop(self) -> None:
        """Cancel the checks and stop the watcher threads; no watch starts after it
        (:meth:`ensure_kubepods` does nothing). Idempotent."""
        self._loop = None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
        kubepods, self._kubepods = self._kubepods, None
        if kubepods is not None:
            kubepods.stop()


def watch_kubepods(
    cgroup_root: Path,
    changed: Callable[[], None],
    loop: asyncio.AbstractEventLoop,
    *,
    quiet: bool = False,
) -> KubepodsWatcher | None:
    """A started watcher of the kubelet's kubepods folder under ``cgroup_root``, or None
    when there is none or it cannot be watched (said in the log, at debug level with
    ``quiet``: the pod resources API is then read on its interval). Never raises."""
    folder = find_kubepods(cgroup_root)
    if folder is None:
        (log.debug if quiet else log.warning)(
            "no kubelet kubepods cgroup folder under --cgroup-root; reading the pod "
            "resources API on its interval",
            cgroup_root=str(cgroup_root),
        )
        return None
    watcher = KubepodsWatcher(folder, changed, loop)
    try:
        watcher.start()
    except OSError as exc:
        log.warning(
            "cannot watch the kubelet's kubepods cgroup folder; reading the pod "
            "resources API on its interval",
            folder=str(folder),
            error=str(exc),
        )
        return None
    log.info("reading the pod resources API when a Guaranteed pod's cgroup comes or goes",
             folder=str(folder))  # fmt: skip
    return watcher
