"""The kubelet's pod cgroups as a signal that its CPU and memory assignments changed
(watchdog, inotify on Linux).

The CPU and Memory Managers assign a Guaranteed pod's exclusive CPUs and memory when
the kubelet admits it (``pkg/kubelet/cm/topologymanager``: ``Admit`` calls each
manager's ``Allocate``); the kubelet then makes the pod's cgroup folder, directly in
its ``kubepods`` folder (Burstable and BestEffort pods go into its ``burstable`` and
``besteffort`` subfolders, and get no exclusive CPUs), and removes it once the pod has
terminated. So a folder made or removed in ``kubepods`` is when the pod resources API
may have changed for a pod without devices, which nothing else tells a device plugin;
between such events, nothing the plugin counts changes but through an Allocate, a
registration or a kubelet restart, each of which reads the API anyway.

Only the ``kubepods`` folder itself is watched (one inotify watch, folders made,
removed or moved; a cgroup file's modification is not asked for, so a busy pod's
``memory.events`` wakes nothing). The watcher decides nothing: it calls ``changed()``
on the event loop.

Where ``kubepods`` is, under the host's cgroup folder (its ``/sys/fs/cgroup``):
``kubepods.slice`` (the systemd cgroup driver) or ``kubepods`` (cgroupfs), at the top
(cgroup v2) or under ``cpuset`` (cgroup v1), or one level deeper for a kubelet with a
``--cgroup-root`` (kind's ``kubelet.slice/kubelet-kubepods.slice``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileDeletedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

KUBEPODS_NAMES = ("kubepods.slice", "kubepods")
# Folders above kubepods, as a cgroup v1 hierarchy's (the CPU manager's is cpuset's).
HIERARCHIES = ("", "cpuset")
# Folders looked through for a kubepods one level down (a kubelet --cgroup-root).
MAX_SCANNED = 256


def is_kubepods(name: str) -> bool:
    """True for a kubepods folder's name: ``kubepods``, ``kubepods.slice`` or a
    systemd slice ending in ``-kubepods.slice`` (under a kubelet ``--cgroup-root``)."""
    return name in KUBEPODS_NAMES or name.endswith("-kubepods.slice")


def find_kubepods(cgroup_root: Path) -> Path | None:
    """The kubelet's ``kubepods`` folder under ``cgroup_root`` (the host's
    ``/sys/fs/cgroup``), or ``cgroup_root`` itself when it is one; None when there is
    none (not a node, or the kubelet's ``cgroupsPerQOS`` is off). The first found of:
    ``kubepods.slice``, ``kubepods``, the same under ``cpuset``, then any folder one level
    down named as :func:`is_kubepods` says (sorted, at most :data:`MAX_SCANNED` folders
    looked through). Never raises: an unreadable folder counts as absent."""
    if is_kubepods(cgroup_root.name) and cgroup_root.is_dir():
        return cgroup_root
    for hierarchy in HIERARCHIES:
        for name in KUBEPODS_NAMES:
            candidate = cgroup_root / hierarchy / name if hierarchy else cgroup_root / name
            if candidate.is_dir():
                return candidate
    for hierarchy in HIERARCHIES:
        top = cgroup_root / hierarchy if hierarchy else cgroup_root
        for folder in _subfolders(top)[:MAX_SCANNED]:
            for child in _subfolders(folder):
                if is_kubepods(child.name):
                    return child
    return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return sorted(
                Path(entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)
            )
    except OSError:
        return []


class _Handler(FileSystemEventHandler):
    def __init__(self, folder: str, changed: Callable[[], None], ended: Callable[[], None]) -> None:
        self._folder = folder
        self._changed = changed
        self._ended = ended

    def on_any_event(self, event: FileSystemEvent) -> None:
        if (
            isinstance(event, (DirDeletedEvent, FileDeletedEvent))
            and event.src_path == self._folder
        ):
            # The watched folder itself (inotify's IN_DELETE_SELF): the watch has ended.
            self._ended()
            self._changed()
        elif event.is_directory and isinstance(
            event, (DirCreatedEvent, DirDeletedEvent, DirMovedEvent)
        ):
            self._changed()


class KubepodsWatcher:
    """Calls ``changed()`` on ``loop`` each time a folder is made, removed or moved in
    ``folder`` (the kubelet's ``kubepods``: a Guaranteed pod's cgroup came or went).

    :attr:`live` says whether the signal can be trusted now: the watch started and
    ``folder`` is still the folder it watches. A folder removed (its deletion also calls
    ``changed()``) or replaced ends the watch; the owner then reads on a timer again.
    """

    def __init__(
        self, folder: Path, changed: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.folder = folder
        self._changed = changed
        self._loop = loop
        self._observer: BaseObserver | None = None
        self._identity: tuple[int, int] | None = None
        self._ended = False

    @property
    def live(self) -> bool:
        """True while the watch runs on the folder it started on: not stopped, the
        folder's own deletion not seen, and a ``stat`` of it the one at start."""
        if self._observer is None or self._identity is None or self._ended:
            return False
        try:
            stat = self.folder.stat()
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == self._identity

    @property
    def ended(self) -> bool:
        """True once the watch saw its folder's own deletion (inotify's
        ``IN_DELETE_SELF``): every event before it has been handed to the loop."""
        return self._ended

    def _end(self) -> None:
        self._ended = True  # on watchdog's thread; read on the loop's (a bool: atomic)

    def _notify(self) -> None:
        # On watchdog's thread: hand over to the event loop (closed: nobody to tell).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._changed)

    def start(self) -> None:
        """Start watching; raises OSError when ``folder`` cannot be watched (absent, no
        inotify watch or instance left)."""
        stat = self.folder.stat()
        observer = Observer()
        observer.daemon = True
        observer.schedule(
            _Handler(str(self.folder), self._notify, self._end),
            str(self.folder),
            recursive=False,
            # The inotify mask asks for these only (no IN_MODIFY): FileDeletedEvent for
            # the folder's own deletion, which watchdog reports as a file's.
            event_filter=[DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileDeletedEvent],
        )
        observer.start()
        self._observer = observer
        self._identity = (stat.st_dev, stat.st_ino)
        self._ended = False

    def stop(self) -> None:
        """Stop and join the observer thread. Idempotent."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
