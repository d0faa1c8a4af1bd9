"""A ``grpc.aio`` server on one unix socket, for any servicer.

:class:`UnixSocketServer` removes a stale socket left by an earlier run,
listens, remembers the socket file's identity (device, inode) so a later check
can tell whether *its* socket is still there (the kubelet deletes every socket
in the device-plugin folder when it restarts), and on stop waits until grpc
has closed the listener and unlinked the file. Waiting matters: creating a new
socket at the same path while an old server is still shutting down can stall
the next registration.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog

log = structlog.get_logger(__name__)

# AF_UNIX sun_path is 108 bytes including the terminating NUL, so the kernel takes
# 107; grpcio (1.85, server and client alike) refuses 106 bytes and more.
# tests/kubelet/test_server.py measures this against the installed grpcio.
MAX_UNIX_PATH_BYTES = 105


class SocketPathError(ValueError):
    """The socket path cannot be used (too long, or a directory is in the way)."""


def check_socket_path(path: Path) -> None:
    """Raise :class:`SocketPathError` when ``path`` is longer than grpcio accepts
    (:data:`MAX_UNIX_PATH_BYTES`, 105 bytes); the message names the path, its length
    and the limit."""
    length = len(os.fsencode(path))
    if length > MAX_UNIX_PATH_BYTES:
        raise SocketPathError(
            f"unix socket path {path} is {length} bytes; grpc accepts at most {MAX_UNIX_PATH_BYTES}"
        )


def unix_target(path: Path) -> str:
    """The gRPC target of the unix socket ``path``, made absolute: gRPC reads
    ``unix://relative/x`` as an authority, refuses it, and its C core logs a trace
    block on every attempt."""
    return f"unix://{os.path.abspath(path)}"


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """``(st_dev, st_ino, st_ctime_ns)`` of ``path``, None when it does not exist or
    cannot be looked at (a symbolic link loop, no permission): nobody can connect to
    it then either.

    Two different files at one path (deleted and re-created) differ in inode
    or change time even when the file system reuses the inode number.
    """
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


def remove_stale_socket(path: Path) -> bool:
    """Remove whatever non-directory file sits at ``path``; True if something was removed.

    Raises :class:`SocketPathError` when ``path`` is a directory.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        raise SocketPathError(f"{path} is a directory; cannot listen on a unix socket there")
    path.unlink(missing_ok=True)
    return True


class UnixSocketServer:
    """One ``grpc.aio`` server listening on ``unix://<path>``.

    ``add_servicers(server)`` is called once per start to attach servicers
    (e.g. ``api_pb2_grpc.add_DevicePluginServicer_to_server``). Not reusable
    across event loops; :meth:`start` after :meth:`stop` makes a fresh server.
    """

    def __init__(self, path: Path, add_servicers: Callable[[grpc.aio.Server], None]) -> None:
        check_socket_path(path)
        self.path = path
        self._add_servicers = add_servicers
        self._server: grpc.aio.Server | None = None
        self._identity: tuple[int, int, int] | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Remove a stale socket, listen and start serving.

        Raises :class:`SocketPathError` for an unusable path and RuntimeError
        when grpc cannot bind (e.g. the folder does not exist).
        """
        if self._server is not None:
            raise RuntimeError(f"server on {self.path} is already serving")
        if remove_stale_socket(self.path):
            log.info("removed stale socket", path=str(self.path))
        server = grpc.aio.server()
        self._add_servicers(server)
        server.add_insecure_port(unix_target(self.path))
        await server.start()
        self._server = server
        self._identity = file_identity(self.path)

    def is_intact(self) -> bool:
        """True while serving and the socket file at ``path`` is still the one we created.

        A missing file is never intact, even when it was already gone when we
        looked right after binding (someone deleted it in between).
        """
        return (
            self._server is not None
            and self._identity is not None
            and file_identity(self.path) == self._identity
        )

    async def stop(self, grace: float | None = 0.0) -> None:
        """Stop serving: wait up to ``grace`` seconds for calls to finish, then cancel them.

        Returns after grpc has closed the listener. grpc itself unlinks the
        path when its listener closes (whatever socket is there by then); the
        file is also removed here if it is still ours. Idempotent.
        """
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        if self._identity is not None and file_identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        self._identity = None
