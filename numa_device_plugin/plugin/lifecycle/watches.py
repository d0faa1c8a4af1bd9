"""What wakes the restart loop while :meth:`PluginManager.serve` runs, besides the
kubelet's calls: the device-plugin folder's watcher (with the instance lock's
subfolder), the lock keeper's backstop check, the device watch and (``--cgroup-root``)
the kubelet's kubepods folder's watcher. They only wake the loop or feed it (the
kubepods watcher asks the capacity poller for a read); this module starts and stops
them together.

Registering needs none of the watches, so they start after it: the device-plugin
folder's watch (watchdog's import and its thread) a moment after the loop has first
acted (registered, or found no kubelet; a second at the latest), followed by one
wake, so that the loop looks at the state once more and finds what changed before
the watch began (a kubelet restart, a socket deleted); the loop decides from the
state it finds, never from the events alone. The kubepods watch starts at the first
accepted registration once the folder is watched, and is made again at a later one
when it has ended (a kubelet that replaced the folder, such as after a change of
cgroup driver)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME
from numa_device_plugin.plugin.lifecycle.devicewatch import DeviceWatch
from numa_device_plugin.plugin.serving.lock import LockKeeper
from numa_device_plugin.plugin.settings.config import Config

if TYPE_CHECKING:
    from numa_device_plugin.kubelet.kubepods import KubepodsWatcher
    from numa_device_plugin.kubelet.watcher import SocketDirWatcher

# The wake that follows the start of the device-plugin folder's watch.
FOLDER_WATCHED = "device-plugin folder watched"
# Seconds after the loop has first acted before the folder is watched: the kubelet
# dials back and opens each ListAndWatch stream once Register is answered, and
# watchdog's import (~10 ms on the event loop) would hold back the lists it waits for.
FOLDER_WATCH_SETTLE = 0.25
# Seconds after the watches start by which the folder is watched, whether or not the
# loop has acted by then (a kubelet restart meanwhile is found by the wake that follows).
FOLDER_WATCH_LATEST = 1.0

log = structlog.get_logger(__name__)


class Watches:
    """The watcher threads and the watch tasks, for the time the loop serves.

    ``acted``: returns once the loop has first acted (the folder's watch starts
    :data:`FOLDER_WATCH_SETTLE` seconds later, or :data:`FOLDER_WATCH_LATEST` seconds
    after :meth:`start`, and ``stop()`` is called when it cannot start: the error is
    :attr:`error`); None: the folder's watch starts in :meth:`start`.
    """

    def __init__(
        self,
        config: Config,
        wake: Callable[[str, str], None],
        lock_keeper: LockKeeper,
        device_watch: DeviceWatch,
        pods_changed: Callable[[], None],
        *,
        acted: Callable[[], Awaitable[None]] | None = None,
        stop: Callable[[], None] = lambda: None,
    ) -> None:
        self._config = config
        self._wake = wake
        self._acted = acted
        self._stop = stop
        self.error: OSError | None = None
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
        # An accepted registration before the folder was watched asked for the kubepods
        # watch (True), under this kubelet.
        self._kubepods_asked: tuple[bool, tuple[int, int, int] | None] = (False, None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the checks, and the device-plugin folder's watch (now without
        ``acted``, else in a task: :meth:`_watch_once_acted`). Raises OSError when the
        folder cannot be watched now (inotify)."""
        self._loop = asyncio.get_running_loop()
        if self._acted is None:
            self._watch_folder()
        self._tasks = [
            asyncio.create_task(
                self._lock_keeper.watch(lambda reason: self._wake(reason, ""), self._subfolders),
                name="lock check",
            ),
            asyncio.create_task(self._device_watch.run(), name="device watch"),
        ]
        if self._acted is not None:
            self._tasks.append(asyncio.create_task(self._watch_once_acted(), name="folder watch"))

    @property
    def watching(self) -> bool:
        """True once the device-plugin folder is watched (until :meth:`stop`)."""
        return self._watcher is not None

    def _subfolders(self) -> bool:
        return self._watcher is not None and self._watcher.subfolders_watched

    def _watch_folder(self) -> None:
        """Watch the device-plugin folder (made again if it went), then start the
        kubepods watch a registration asked for meanwhile, and ask for a read of the
        pod resources API (the registration's read came before it). Raises OSError."""
        from numa_device_plugin.kubelet.watcher import SocketDirWatcher

        assert self._loop is not None
        self._config.socket_dir.mkdir(parents=True, exist_ok=True)
        watcher = SocketDirWatcher(
            self._config.socket_dir, self._wake, self._loop, (LOCK_DIR_NAME,)
        )
        watcher.start()
        self._watcher = watcher
        (asked, kubelet), self._kubepods_asked = self._kubepods_asked, (False, None)
        if asked:
            self.ensure_kubepods(kubelet)
            if self.pods_signalled:
                self._pods_changed()  # a read after it: a cgroup made before it began

    async def _watch_once_acted(self) -> None:
        """:data:`FOLDER_WATCH_SETTLE` seconds after the loop has acted, or
        :data:`FOLDER_WATCH_LATEST` seconds after :meth:`start` (a registration
        retried, a Register call a hung kubelet never answers, the lock held by another
        instance): the folder's watch, then one wake (the loop looks at the state again:
        what changed before the watch began is found). When it cannot be watched,
        :attr:`error` and ``stop()``: the plugin ends, as when the folder cannot be
        watched at start."""
        assert self._acted is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FOLDER_WATCH_LATEST):
                await self._acted()
                await asyncio.sleep(FOLDER_WATCH_SETTLE)
        try:
            self._watch_folder()
        except OSError as exc:
            log.error("cannot watch the device-plugin folder; stopping",
                      socket_dir=str(self._config.socket_dir), error=str(exc))  # fmt: skip
            self.error = exc
            self._stop()
            return
        self._wake(FOLDER_WATCHED, "")

    def ensure_kubepods(self, kubelet: tuple[int, int, int] | None) -> None:
        """Watch the kubelet's kubepods folder (``--cgroup-root``) unless a live watch
        does (loop thread, between :meth:`start` and :meth:`stop`). Called at each
        accepted registration; ``kubelet``: the file identity of the kubelet.sock
        registered with (``grpcserver.file_identity``). Before the device-plugin
        folder is watched, the watch waits for that. When the folder is not found it
        is looked for again only under another kubelet. Never raises."""
        root = self._config.cgroup_root
        if root is None or self._loop is None or self.pods_signalled:
            return
        if self._watcher is None:
            self._kubepods_asked = (True, kubelet)  # started with the folder's watch
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
        self._kubepods_asked = (False, None)
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
    from numa_device_plugin.kubelet.kubepods import KubepodsWatcher, find_kubepods

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
