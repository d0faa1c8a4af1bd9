"""Watching the device-plugin folder for kubelet restarts (watchdog, inotify on Linux).

The watcher decides nothing: it turns file events into ``wake(reason)`` calls
on the manager's event loop. A kubelet restart shows as every socket in the
folder being deleted, then ``kubelet.sock`` being created anew.

The folder itself may be deleted and created again (a node reset, an operator's
``rm -rf``): an inotify watch ends with the folder it watched. So the parent
folder is watched too, and when the folder appears again the watch on it is
made anew and the manager woken, which then looks for ``kubelet.sock``.

Named subfolders (the instance lock's) are watched too: a file or folder created,
deleted or moved in one, or the subfolder itself going or coming, wakes the manager
with :data:`SUBFOLDER_CHANGED`. Opening, reading and writing wake nothing (a second
instance reads the lock's holder line five times a second while it waits). A
subfolder that cannot be watched (absent, or no inotify watch left) is watched from
when it appears; :attr:`SocketDirWatcher.subfolders_watched` says whether all are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from numa_device_plugin.kubelet.registration import KUBELET_SOCKET_NAME

KUBELET_CREATED = "kubelet.sock created"
SOCKET_DELETED = "socket deleted"
FOLDER_CREATED = "socket folder created"
FOLDER_DELETED = "socket folder deleted"
SUBFOLDER_CHANGED = "subfolder changed"


class _Handler(FileSystemEventHandler):
    def __init__(
        self,
        notify: Callable[[str, str], None],
        subfolders: Collection[str],
        subfolder_appeared: Callable[[str], None],
        subfolder_gone: Callable[[str], None],
    ) -> None:
        self._notify = notify
        self._subfolders = subfolders
        self._subfolder_appeared = subfolder_appeared
        self._subfolder_gone = subfolder_gone

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            self._directory_event(event)
        elif isinstance(event, FileCreatedEvent):
            self._created(_name(event.src_path))
        elif isinstance(event, FileMovedEvent):
            self._deleted(_name(event.src_path))
            self._created(_name(event.dest_path))
        elif isinstance(event, FileDeletedEvent):
            self._deleted(_name(event.src_path))

    def _directory_event(self, event: FileSystemEvent) -> None:
        gone = isinstance(event, (DirDeletedEvent, DirMovedEvent))
        if gone and (name := _name(event.src_path)) in self._subfolders:
            self._subfolder_gone(name)
        if isinstance(event, DirCreatedEvent):
            appeared = _name(event.src_path)
        elif isinstance(event, DirMovedEvent) and event.dest_path:
            appeared = _name(event.dest_path)
        else:
            return
        if appeared in self._subfolders:
            self._subfolder_appeared(appeared)

    def _created(self, name: str) -> None:
        if name == KUBELET_SOCKET_NAME:
            self._notify(KUBELET_CREATED, name)

    def _deleted(self, name: str) -> None:
        self._notify(SOCKET_DELETED, name)


class _SubfolderHandler(FileSystemEventHandler):
    """Events in a watched subfolder: anything created, deleted or moved."""

    def __init__(self, name: str, changed: Callable[[str], None]) -> None:
        self._name = name
        self._changed = changed

    def on_any_event(self, event: FileSystemEvent) -> None:
        kinds = (FileCreatedEvent, FileDeletedEvent, FileMovedEvent)
        if isinstance(event, (*kinds, DirCreatedEvent, DirDeletedEvent, DirMovedEvent)):
            self._changed(self._name)


def _name(path: str | bytes) -> str:
    return Path(path.decode() if isinstance(path, bytes) else path).name


class _ParentHandler(FileSystemEventHandler):
    """Events in the parent folder: only the socket folder's own comings and goings."""

    def __init__(self, name: str, appeared: Callable[[], None], gone: Callable[[], None]) -> None:
        self._name = name
        self._appeared = appeared
        self._gone = gone

    def on_any_event(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            return
        if isinstance(event, DirMovedEvent):
            if _name(event.src_path) == self._name:
                self._gone()
            if event.dest_path and _name(event.dest_path) == self._name:
                self._appeared()
        elif isinstance(event, DirCreatedEvent) and _name(event.src_path) == self._name:
            self._appeared()
        elif isinstance(event, DirDeletedEvent) and _name(event.src_path) == self._name:
            self._gone()


class SocketDirWatcher:
    """Calls ``wake(reason, file_name)`` on ``loop`` for each relevant event in ``directory``.

    Reasons: :data:`KUBELET_CREATED` (``kubelet.sock`` created or moved in),
    :data:`SOCKET_DELETED` (any file deleted or moved away),
    :data:`FOLDER_DELETED` and :data:`FOLDER_CREATED` (the folder itself went, or
    came back and is watched again), :data:`SUBFOLDER_CHANGED` (something created,
    deleted or moved in one of ``subfolders``, names in ``directory``, or the
    subfolder itself gone or back). The folder must exist when :meth:`start` is
    called; its parent is watched too.
    """

    def __init__(
        self,
        directory: Path,
        wake: Callable[[str, str], None],
        loop: asyncio.AbstractEventLoop,
        subfolders: Collection[str] = (),
    ) -> None:
        self.directory = directory
        self._wake = wake
        self._loop = loop
        self._observer: BaseObserver | None = None
        self._watch: ObservedWatch | None = None
        self._subfolders = tuple(subfolders)
        self._subwatches: dict[str, ObservedWatch] = {}
        self._handler = _Handler(
            self._notify,
            self._subfolders,
            self._subfolder_appeared,
            self._subfolder_changed,
        )

    @property
    def subfolders_watched(self) -> bool:
        """True while every named subfolder has a watch (False while one is absent or
        could not be watched: its changes then wake nothing)."""
        return all(name in self._subwatches for name in self._subfolders)

    def _notify(self, reason: str, name: str) -> None:
        # Runs on watchdog's thread: hand over to the event loop.
        # A closed loop means the manager is gone: nobody to wake.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake, reason, name)

    def _folder_appeared(self) -> None:
        # On watchdog's thread, under the observer's (re-entrant) lock: watch the new
        # folder, then wake the manager, which looks at what is in it by then.
        observer = self._observer
        if observer is None:
            return
        self._unwatch_folder(observer)
        try:
            self._watch = observer.schedule(self._handler, str(self.directory), recursive=False)
        except OSError:
            return  # gone again already; its deletion wakes the manager
        for name in self._subfolders:
            self._watch_subfolder(observer, name)
        self._notify(FOLDER_CREATED, self.directory.name)

    def _folder_gone(self) -> None:
        if self._observer is not None:
            self._unwatch_folder(self._observer)
        self._notify(FOLDER_DELETED, self.directory.name)

    def _subfolder_appeared(self, name: str) -> None:
        # On watchdog's thread, as _folder_appeared.
        if self._observer is not None:
            self._watch_subfolder(self._observer, name)
        self._notify(SUBFOLDER_CHANGED, name)

    def _watch_subfolder(self, observer: BaseObserver, name: str) -> None:
        """(Re)watch the subfolder ``name``; left unwatched when it cannot be (absent,
        not a folder, no inotify watch left)."""
        watch = self._subwatches.pop(name, None)
        if watch is not None:
            with contextlib.suppress(KeyError):
                observer.unschedule(watch)
        path = self.directory / name
        if not path.is_dir():
            return
        with contextlib.suppress(OSError):
            handler = _SubfolderHandler(name, self._subfolder_changed)
            self._subwatches[name] = observer.schedule(handler, str(path), recursive=False)

    def _subfolder_changed(self, name: str) -> None:
        # An inotify watch ends with its folder: forget it, so that the folder coming
        # back is watched anew (and subfolders_watched says False meanwhile).
        if not (self.directory / name).is_dir():
            watch = self._subwatches.pop(name, None)
            if watch is not None and self._observer is not None:
                with contextlib.suppress(KeyError):
                    self._observer.unschedule(watch)
        self._notify(SUBFOLDER_CHANGED, name)

    def _unwatch_folder(self, observer: BaseObserver) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(KeyError):
                observer.unschedule(watch)

    def start(self) -> None:
        """Start the observer thread; raises OSError when the folder cannot be watched."""
        observer = Observer()
        observer.daemon = True
        self._observer = observer
        parent = self.directory.parent
        if parent != self.directory:
            observer.schedule(
                _ParentHandler(self.directory.name, self._folder_appeared, self._folder_gone),
                str(parent),
                recursive=False,
            )
        self._watch = observer.schedule(self._handler, str(self.directory), recursive=False)
        for name in self._subfolders:
            self._watch_subfolder(observer, name)
        observer.start()

    def stop(self) -> None:
        """Stop and join the observer thread. Idempotent."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
