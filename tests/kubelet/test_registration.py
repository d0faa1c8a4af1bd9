"""Register calls share one connection to a kubelet while they are in flight together,
and dial anew after a failure (``KubeletConnection``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet.registration import (
    KubeletConnection,
    RegistrationError,
    register,
    register_request,
)
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from tests.standin_helpers import eventually

OPTIONS = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)
NAMES = [f"numa-align/numa-{node}" for node in range(4)]


def connections_to(socket: Path) -> int:
    """Connections the server at ``socket`` has accepted and still holds: the accepted
    sockets carry the listener's path in /proc/net/unix (as bound: grpc's has extra
    leading slashes), in state 03 (connected)."""
    count = 0
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and Path(fields[7]) == socket and fields[5] == "03":
            count += 1
    return count


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(sock_dir, dial_timeout=2) as standin:
        servers = []
        for node, name in enumerate(NAMES):
            servicer = NumaDevicePluginServicer(build_resource("numa-align", node, 2))
            server = UnixSocketServer(sock_dir / socket_name(name), servicer_adder(servicer))
            await server.start()
            servers.append((servicer, server))
        yield standin
        for servicer, server in servers:
            servicer.close()
            await server.stop(0)


def socket_name(name: str) -> str:
    return f"{name.replace('/', '_')}.sock"


def servicer_adder(servicer: NumaDevicePluginServicer) -> Callable[[grpc.aio.Server], None]:
    return lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)


def request_for(name: str) -> api_pb2.RegisterRequest:
    return register_request(name, socket_name(name), OPTIONS)


class Gate(asyncio.Event):
    """Set to let the held Register calls through; ``arrived``: the resource names of
    those that reached the kubelet so far."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[str] = []


def gate_registrations(kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Hold every Register at the kubelet until the returned gate is set."""
    gate = Gate()
    real = kubelet.device_manager.register

    async def held(request: api_pb2.RegisterRequest) -> str | None:
        gate.arrived.append(request.resource_name)
        await gate.wait()
        return await real(request)

    monkeypatch.setattr(kubelet.device_manager, "register", held)
    return gate


async def test_registrations_in_flight_together_share_one_connection_closed_after(
    kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants: a channel per call (4 connections); the channel never closed."""
    gate = gate_registrations(kubelet, monkeypatch)
    connection = KubeletConnection(kubelet.socket_path)
    calls = [
        asyncio.create_task(
            register(kubelet.socket_path, request_for(name), timeout=10, connection=connection)
        )
        for name in NAMES
    ]
    # every call has reached the kubelet (each waits at the gate): over one connection
    await eventually(lambda: sorted(gate.arrived) == sorted(NAMES))
    assert connections_to(kubelet.socket_path) == 1
    gate.set()
    await asyncio.gather(*calls)
    assert set(kubelet.clients) == set(NAMES)
    await eventually(lambda: connections_to(kubelet.socket_path) == 0)


async def test_without_a_connection_each_call_dials_its_own(
    kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter above sees separate connections (so it can tell the two apart)."""
    gate = gate_registrations(kubelet, monkeypatch)
    calls = [
        asyncio.create_task(register(kubelet.socket_path, request_for(name), timeout=10))
        for name in NAMES[:2]
    ]
    await eventually(lambda: connections_to(kubelet.socket_path) == 2)
    gate.set()
    await asyncio.gather(*calls)


async def test_a_call_failing_on_a_shared_connection_sends_later_calls_to_a_new_one(
    kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: failures not marking the connection broken (a later call would reuse a
    channel that may be waiting out grpc's reconnect backoff)."""
    gate = gate_registrations(kubelet, monkeypatch)
    connection = KubeletConnection(kubelet.socket_path)
    first, second = (
        asyncio.create_task(
            register(kubelet.socket_path, request_for(name), timeout=10, connection=connection)
        )
        for name in NAMES[:2]
    )
    await eventually(lambda: connections_to(kubelet.socket_path) == 1)
    await asyncio.sleep(0.2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    third = asyncio.create_task(
        register(kubelet.socket_path, request_for(NAMES[2]), timeout=10, connection=connection)
    )
    await eventually(lambda: connections_to(kubelet.socket_path) == 2)
    gate.set()
    await asyncio.gather(second, third)
    assert set(kubelet.clients) == {NAMES[1], NAMES[2]}


async def test_a_connection_that_found_no_kubelet_reaches_one_that_came_since(
    sock_dir: Path,
) -> None:
    """The first call fails fast (nothing listens); once a kubelet listens the next call
    on the same KubeletConnection is accepted at once, not after a reconnect backoff."""
    socket = sock_dir / "kubelet.sock"
    connection = KubeletConnection(socket)
    with pytest.raises(RegistrationError) as failed:
        await register(socket, request_for(NAMES[0]), timeout=5, connection=connection)
    assert failed.value.code.name == "UNAVAILABLE"
    async with KubeletStandIn(sock_dir, dial_timeout=2) as kubelet:
        servicer = NumaDevicePluginServicer(build_resource("numa-align", 0, 2))
        server = UnixSocketServer(sock_dir / socket_name(NAMES[0]), servicer_adder(servicer))
        await server.start()
        try:
            await asyncio.wait_for(
                register(socket, request_for(NAMES[0]), timeout=5, connection=connection), 0.9
            )
            assert set(kubelet.clients) == {NAMES[0]}
        finally:
            servicer.close()
            await server.stop(0)
