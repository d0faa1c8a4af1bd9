"""The stand-in behaves as the kubelet's device manager does (shared/KUBELET.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet.registration import (
    RegistrationError,
    register,
    register_request,
)
from numa_device_plugin.kubelet_standin import CHECKPOINT_NAME, KubeletStandIn
from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from tests.standin_helpers import eventually

OPTIONS = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)
NAME = "numa-align/numa-0"


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(sock_dir, dial_timeout=1) as standin:
        yield standin


Plugin = tuple[NumaDevicePluginServicer, UnixSocketServer]


@pytest.fixture
async def plugins(kubelet: KubeletStandIn) -> AsyncIterator[Callable[[str], Awaitable[Plugin]]]:
    """Start plugin servers in the stand-in's folder; all are stopped at teardown."""
    started: list[Plugin] = []

    async def serve(socket: str) -> Plugin:
        servicer = NumaDevicePluginServicer(build_resource("numa-align", 0, 3))
        server = UnixSocketServer(
            kubelet.directory / socket,
            lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s),
        )
        await server.start()
        started.append((servicer, server))
        return servicer, server

    yield serve
    for plugin in started:
        await stop_plugin(plugin)


async def stop_plugin(plugin: Plugin) -> None:
    plugin[0].close()
    await plugin[1].stop(0)


@pytest.mark.parametrize(
    ("version", "name", "needle"),
    [
        ("v1alpha", NAME, "Unsupported device plugin API version"),
        ("v1beta1", "numa-0", "invalid resource name"),
        ("v1beta1", "kubernetes.io/numa-0", "invalid resource name"),
        ("v1beta1", "requests.x/numa-0", "invalid resource name"),
    ],
)
async def test_register_refuses_bad_version_and_names(
    kubelet: KubeletStandIn, version: str, name: str, needle: str
) -> None:
    request = api_pb2.RegisterRequest(version=version, endpoint="p.sock", resource_name=name)
    with pytest.raises(RegistrationError) as caught:
        await register(kubelet.socket_path, request, timeout=2)
    assert caught.value.code == grpc.StatusCode.UNKNOWN
    assert needle in caught.value.details
    assert kubelet.registrations[-1].error is not None


async def test_register_fails_when_endpoint_is_not_serving(kubelet: KubeletStandIn) -> None:
    with pytest.raises(RegistrationError, match="failed to dial"):
        await register(kubelet.socket_path, register_request(NAME, "none.sock", OPTIONS), timeout=5)
    assert NAME not in kubelet.clients


async def test_register_dials_back_and_keeps_device_list(
    kubelet: KubeletStandIn, plugins: Callable[[str], Awaitable[Plugin]]
) -> None:
    plugin = await plugins("p.sock")
    await register(kubelet.socket_path, register_request(NAME, "p.sock", OPTIONS), timeout=5)
    await kubelet.wait_until(lambda: kubelet.live(NAME))
    assert [d.ID for d in kubelet.devices(NAME)] == [
        "numa0-slot0000",
        "numa0-slot0001",
        "numa0-slot0002",
    ]
    assert kubelet.allocatable(NAME) == 3
    assert kubelet.clients[NAME].options.get_preferred_allocation_available
    await stop_plugin(plugin)


async def test_stream_end_marks_resource_unhealthy_and_is_not_reopened(
    kubelet: KubeletStandIn,
    plugins: Callable[[str], Awaitable[Plugin]],
) -> None:
    plugin = await plugins("p.sock")
    await register(kubelet.socket_path, register_request(NAME, "p.sock", OPTIONS), timeout=5)
    await kubelet.wait_until(lambda: kubelet.live(NAME))
    await stop_plugin(plugin)
    await kubelet.wait_until(lambda: NAME not in kubelet.clients)
    assert kubelet.allocatable(NAME) == 0


async def test_old_stream_ending_after_new_registration_drops_the_new_endpoint(
    kubelet: KubeletStandIn,
    plugins: Callable[[str], Awaitable[Plugin]],
) -> None:
    """The race the plugin must avoid by stopping its old server before registering again."""
    old = await plugins("old.sock")
    await register(kubelet.socket_path, register_request(NAME, "old.sock", OPTIONS), timeout=5)
    await kubelet.wait_until(lambda: kubelet.live(NAME))
    new = await plugins("new.sock")
    await register(kubelet.socket_path, register_request(NAME, "new.sock", OPTIONS), timeout=5)
    await kubelet.wait_until(lambda: kubelet.clients[NAME].endpoint == "new.sock")
    await kubelet.wait_until(lambda: kubelet.open_streams(NAME) == 2)
    assert not kubelet.live(NAME), "two open streams is not one live registration"
    await stop_plugin(old)
    await kubelet.wait_until(lambda: NAME not in kubelet.clients)
    assert kubelet.allocatable(NAME) == 0
    await eventually(lambda: new[0].open_streams == 0)
    await stop_plugin(new)


async def test_restart_deletes_every_socket_but_the_checkpoint(
    kubelet: KubeletStandIn, plugins: Callable[[str], Awaitable[Plugin]]
) -> None:
    folder = kubelet.directory
    (folder / CHECKPOINT_NAME).write_text("{}")
    plugin = await plugins("p.sock")
    await register(kubelet.socket_path, register_request(NAME, "p.sock", OPTIONS), timeout=5)
    await kubelet.wait_until(lambda: kubelet.live(NAME))
    old_kubelet = kubelet.socket_path.stat().st_ino, kubelet.socket_path.stat().st_ctime_ns
    await kubelet.restart()
    assert {p.name for p in folder.iterdir()} == {CHECKPOINT_NAME, "kubelet.sock"}
    new_kubelet = kubelet.socket_path.stat().st_ino, kubelet.socket_path.stat().st_ctime_ns
    assert new_kubelet != old_kubelet
    assert kubelet.clients == {}
    assert kubelet.allocatable(NAME) == 0
    # The plugin's stream must end with the old kubelet.
    await eventually(lambda: plugin[0].open_streams == 0, timeout=5)
    await stop_plugin(plugin)


async def test_preferred_allocation_only_when_offered(
    kubelet: KubeletStandIn, plugins: Callable[[str], Awaitable[Plugin]]
) -> None:
    plugin = await plugins("p.sock")
    no_options = api_pb2.DevicePluginOptions()
    await register(kubelet.socket_path, register_request(NAME, "p.sock", no_options), timeout=5)
    await kubelet.wait_until(lambda: kubelet.live(NAME))
    # The kubelet takes options from GetDevicePluginOptions, not from the request.
    response = await kubelet.get_preferred_allocation(NAME, ["numa0-slot0002"], [], 1)
    assert list(response.container_responses[0].deviceIDs) == ["numa0-slot0002"]
    await stop_plugin(plugin)


async def test_allocate_without_plugin_is_lookup_error(kubelet: KubeletStandIn) -> None:
    with pytest.raises(LookupError, match="no plugin"):
        await kubelet.allocate(NAME, ["x"])
