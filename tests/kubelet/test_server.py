"""The unix-socket runner and the socket folder: stale sockets, path limits, identity."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import (
    MAX_UNIX_PATH_BYTES,
    SocketPathError,
    UnixSocketServer,
)
from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from numa_device_plugin.plugin.settings.config import detect_socket_dir


def plugin_server(path: Path) -> UnixSocketServer:
    servicer = NumaDevicePluginServicer(build_resource("numa-align", 0, 1))
    return UnixSocketServer(
        path, lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s)
    )


async def options_via(path: Path) -> api_pb2.DevicePluginOptions:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        response: api_pb2.DevicePluginOptions = await stub.GetDevicePluginOptions(
            api_pb2.Empty(), timeout=5
        )
        return response


@pytest.mark.parametrize("stale", ["socket", "file", "dangling-symlink"])
async def test_stale_socket_is_removed_before_listening(sock_dir: Path, stale: str) -> None:
    path = sock_dir / "p.sock"
    if stale == "socket":
        leftover = socket.socket(socket.AF_UNIX)
        leftover.bind(str(path))
        leftover.close()
    elif stale == "file":
        path.write_text("junk")
    else:
        path.symlink_to(sock_dir / "nowhere")
    server = plugin_server(path)
    await server.start()
    try:
        assert (await options_via(path)).get_preferred_allocation_available
        assert server.is_intact()
    finally:
        await server.stop(0)
    assert not path.exists()


async def test_directory_in_the_way_is_a_clear_error(sock_dir: Path) -> None:
    (sock_dir / "p.sock").mkdir()
    with pytest.raises(SocketPathError, match="is a directory"):
        await plugin_server(sock_dir / "p.sock").start()


def _path_of_length(folder: Path, length: int) -> Path:
    stem = str(folder) + "/"
    return Path(stem + "x" * (length - len(stem)))


def test_socket_path_over_the_limit_is_refused(sock_dir: Path) -> None:
    long_path = _path_of_length(sock_dir, MAX_UNIX_PATH_BYTES + 1)
    with pytest.raises(SocketPathError) as caught:
        plugin_server(long_path)
    message = str(caught.value)
    assert str(long_path) in message
    assert f"is {MAX_UNIX_PATH_BYTES + 1} bytes" in message
    assert f"at most {MAX_UNIX_PATH_BYTES}" in message


async def test_the_limit_is_what_the_installed_grpcio_enforces(sock_dir: Path) -> None:
    """grpcio refuses unix socket paths below the kernel's 107 bytes: the limit is
    measured, so a grpcio that changes it fails here rather than in the field."""
    at_limit = _path_of_length(sock_dir, MAX_UNIX_PATH_BYTES)
    server = plugin_server(at_limit)
    await server.start()
    try:
        assert (await options_via(at_limit)).get_preferred_allocation_available
    finally:
        await server.stop(0)
    over = grpc.aio.server()
    try:
        with pytest.raises(RuntimeError):
            over.add_insecure_port(f"unix://{_path_of_length(sock_dir, MAX_UNIX_PATH_BYTES + 1)}")
    finally:
        await over.stop(0)


async def test_is_intact_notices_deletion_and_replacement(sock_dir: Path) -> None:
    path = sock_dir / "p.sock"
    server = plugin_server(path)
    await server.start()
    try:
        path.unlink()
        assert not server.is_intact()
        impostor = socket.socket(socket.AF_UNIX)
        impostor.bind(str(path))
        impostor.close()
        assert not server.is_intact()
    finally:
        await server.stop(0)


async def test_restart_on_same_path(sock_dir: Path) -> None:
    path = sock_dir / "p.sock"
    server = plugin_server(path)
    for _ in range(3):
        await server.start()
        assert (await options_via(path)).get_preferred_allocation_available
        await server.stop(0)
        assert not path.exists()
    await server.stop(0)  # idempotent


async def test_start_twice_is_an_error(sock_dir: Path) -> None:
    server = plugin_server(sock_dir / "p.sock")
    await server.start()
    try:
        with pytest.raises(RuntimeError, match="already serving"):
            await server.start()
    finally:
        await server.stop(0)


def test_detect_socket_dir(tmp_path: Path) -> None:
    standard, k0s, microk8s = (tmp_path / n for n in ("standard", "k0s", "microk8s"))
    candidates = (standard, k0s, microk8s)
    assert detect_socket_dir(candidates) == standard
    microk8s.mkdir()
    (microk8s / "kubelet.sock").touch()
    assert detect_socket_dir(candidates) == microk8s
    k0s.mkdir()
    (k0s / "kubelet.sock").touch()
    assert detect_socket_dir(candidates) == k0s


async def test_socket_deleted_between_bind_and_identity_is_not_intact(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file vanishing before its identity is read must not count as intact
    (``None == None``): the manager would then never serve the resource again."""
    from numa_device_plugin.kubelet import grpcserver as server_module

    real = server_module.file_identity

    def deleted_first(path: Path) -> tuple[int, int, int] | None:
        path.unlink(missing_ok=True)
        return real(path)

    monkeypatch.setattr(server_module, "file_identity", deleted_first)
    server = plugin_server(sock_dir / "p.sock")
    await server.start()
    try:
        assert not server.is_intact()
    finally:
        await server.stop(0)
