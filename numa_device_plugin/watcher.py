"""Watching the device-plugin folder for kubelet restarts (watchdog, inotify on Linux).

The watcher decides nothing: it turns file events into ``wake(reason)`` calls
on the manager's event loop. A kubelet restart shows as every socket in the
folder being deleted, then ``kubelet.sock`` being created anew.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from watchdog.events import (
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from numa_device_plugin.registration import KUBELET_SOCKET_NAME

KUBELET_CREATED = "kubelet.sock created"
SOCKET_DELETED = "socket deleted"


class _Handler(FileSystemEventHandler):
    def __init__(self, notify: Callable[[str, str], None]) -> None:
        self._notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        if isinstance(event, FileCreatedEvent):
            self._created(_name(event.src_path))
        elif isinstance(event, FileMovedEvent):
            self._deleted(_name(event.src_path))
            self._created(_name(event.dest_path))
        elif isinstance(event, FileDeletedEvent):
            self._deleted(_name(event.src_path))

    def _created(self, name: str) -> None:
        if name == KUBELET_SOCKET_NAME:
            self._notify(KUBELET_CREATED, name)

    def _deleted(self, name: str) -> None:
        self._notify(SOCKET_DELETED, name)


def _name(path: str | bytes) -> str:
    return Path(path.decode() if isinstance(path, bytes) else path).name


class SocketDirWatcher:
    """Calls ``wake(reason, file_name)`` on ``loop`` for each relevant event in ``directory``.

    Reasons: :data:`KUBELET_CREATED` (``kubelet.sock`` created or moved in) and
    :data:`SOCKET_DELETED` (any file deleted or moved away). The folder must
    exist when :meth:`start` is called.
    """

    def __init__(
        self,
        directory: Path,
        wake: Callable[[str, str], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.directory = directory
        self._wake = wake
        self._loop = loop
        self._observer: BaseObserver | None = None

    def _notify(self, reason: str, name: str) -> None:
        # Runs on watchdog's thread: hand over to the event loop.
        # A closed loop means the manager is gone: nobody to wake.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake, reason, name)

    def start(self) -> None:
        """Start the observer thread; raises OSError when the folder cannot be watched."""
        observer = Observer()
        observer.schedule(_Handler(self._notify), str(self.directory), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        """Stop and join the observer thread. Idempotent."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
