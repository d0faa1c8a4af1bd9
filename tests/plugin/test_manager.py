"""The plugin end to end against the kubelet stand-in, over real unix sockets:
registration, ListAndWatch, Allocate, kubelet restarts and storms, an absent
kubelet, deleted sockets, dropped streams, reload and shutdown."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME, LOCK_FILE_NAME
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.recorder import NullRecorder
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.sysfs import SysfsFormatError
from tests.standin_helpers import (
    all_live,
    bound_port,
    eventually,
    logged,
    running,
    scrape,
    serve_process,
    wait_all_live,
)
from tests.topology.test_topology import SNAPSHOT_TABLE


class _FailureRecorder(NullRecorder):
    """Counts failed Register calls, by resource."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures

    def registration(self, resource: str, ok: bool) -> None:
        if not ok:
            self.failures.append(resource)


NAMES = ["numa-align/numa-0", "numa-align/numa-1"]


def make_config(tree: SysfsTree, folder: Path, **overrides: object) -> Config:
    values: dict[str, object] = {
        "sysfs_root": tree.root,
        "socket_dir": folder,
        "capacity": 5,
        "register_timeout": 2.0,
        "shutdown_grace": 0.5,
    }
    values.update(overrides)
    return Config(**values)  # type: ignore[arg-type]


async def test_every_resource_registers_with_its_devices(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        assert set(kubelet.clients) == set(NAMES)
        for node, name in enumerate(NAMES):
            devices = kubelet.devices(name)
            assert [d.ID for d in devices] == [f"numa{node}-slot000{i}" for i in range(5)]
            assert {d.health for d in devices} == {"Healthy"}
            assert {tuple(n.ID for n in d.topology.nodes) for d in devices} == {(node,)}
            assert kubelet.allocatable(name) == 5
            client = kubelet.clients[name]
            assert client.endpoint == name.replace("/", "_") + ".sock"
            assert client.options.get_preferred_allocation_available
            assert not client.options.pre_start_required
        assert [r.version for r in kubelet.registrations] == ["v1beta1", "v1beta1"]
        await eventually(lambda: m.registered == set(NAMES))


async def test_allocate_through_the_kubelet(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
        response = await kubelet.allocate("numa-align/numa-1", ["numa1-slot0003"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}
        preferred = await kubelet.get_preferred_allocation(
            "numa-align/numa-0", ["numa0-slot0004", "numa0-slot0002", "numa0-slot0003"], [], 2
        )
        assert list(preferred.container_responses[0].deviceIDs) == [
            "numa0-slot0002",
            "numa0-slot0003",
        ]


async def test_bad_requests_get_invalid_argument_and_serving_goes_on(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate("numa-align/numa-1", ["numa0-slot0000"])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "numa0-slot0000" in (caught.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await kubelet.call_allocate("numa-align/numa-1", api_pb2.AllocateRequest())
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as too_many:
            await kubelet.get_preferred_allocation("numa-align/numa-0", ["numa0-slot0000"], [], 2)
        assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        response = await kubelet.allocate("numa-align/numa-1", ["numa1-slot0000"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}
        assert all_live(kubelet, NAMES), "refused calls must not disturb the registration"


async def test_kubelet_restart_leads_to_reregistration_of_every_resource(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await kubelet.restart()
        assert kubelet.clients == {}
        await wait_all_live(kubelet, NAMES)
        accepted = [r.resource_name for r in kubelet.registrations if r.error is None]
        assert sorted(accepted) == sorted(NAMES * 2)
        for name in NAMES:
            assert kubelet.allocatable(name) == 5
            assert (sock_dir / name.replace("/", "_")).with_suffix(".sock").exists()
        response = await kubelet.allocate("numa-align/numa-0", ["numa0-slot0000"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "0"}
        await eventually(lambda: m.registered == set(NAMES))


async def test_ten_quick_restarts_end_with_one_live_registration_per_resource(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        for _ in range(10):
            await kubelet.restart()
        await wait_all_live(kubelet, NAMES)
        await m.wait_settled()  # every event handled; the state must hold
        for name in NAMES:
            assert kubelet.live(name)
            assert kubelet.open_streams(name) == 1
            assert m.servicers[name].open_streams == 1
            assert kubelet.allocatable(name) == 5
        await eventually(lambda: m.registered == set(NAMES))
        assert sorted(p.name for p in sock_dir.iterdir()) == [
            ".numa-device-plugin",
            "kubelet.sock",
            "numa-align_numa-0.sock",
            "numa-align_numa-1.sock",
        ]


async def test_restarts_at_random_moments_during_registration(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Restarts that land while the plugin is mid-registration still end in one live
    registration per resource."""
    rng = __import__("random").Random(7)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        for _ in range(15):
            await kubelet.restart()
            await asyncio.sleep(rng.uniform(0, 0.02))
        await wait_all_live(kubelet, NAMES)
        await m.wait_settled()
        assert all(kubelet.live(name) for name in NAMES)


async def test_kubelet_absent_at_start_then_present(two_nodes: SysfsTree, sock_dir: Path) -> None:
    kubelet = KubeletStandIn(sock_dir)
    async with running(make_config(two_nodes, sock_dir)) as manager:
        await asyncio.wait_for(manager.started.wait(), 5)
        await manager.wait_settled()
        assert manager.registered == set()
        assert not any(sock_dir.glob("numa-align_*.sock")), "no server before a kubelet exists"
        await kubelet.start()
        try:
            await wait_all_live(kubelet, NAMES)
            await eventually(lambda: manager.registered == set(NAMES))
        finally:
            await kubelet.stop()


async def test_socket_folder_missing_at_start_is_created(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    folder = sock_dir / "dp"
    async with running(make_config(two_nodes, folder)) as manager:
        await asyncio.wait_for(manager.started.wait(), 5)
        assert folder.is_dir()
        async with KubeletStandIn(folder) as kubelet:
            await wait_all_live(kubelet, NAMES)


async def test_stale_kubelet_socket_without_listener_is_retried(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """kubelet.sock exists but nobody accepts (a crashed kubelet): retry, never crash."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_dir / "kubelet.sock"))
    stale.close()
    failures: list[str] = []
    recorder = _FailureRecorder(failures)
    async with running(make_config(two_nodes, sock_dir), recorder=recorder) as manager:
        await eventually(lambda: len(failures) >= 4)  # two attempts per resource
        assert manager.registered == set()
        kubelet = KubeletStandIn(sock_dir)
        await kubelet.restart()  # a new kubelet: cleans the folder, creates kubelet.sock
        try:
            await wait_all_live(kubelet, NAMES)
        finally:
            await kubelet.stop()


async def test_refused_registration_is_retried_with_backoff(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubelet = KubeletStandIn(sock_dir)
    real_register = kubelet.device_manager.register
    refusals = {"left": 3}

    async def flaky(request: api_pb2.RegisterRequest) -> str | None:
        if request.resource_name == "numa-align/numa-1" and refusals["left"] > 0:
            refusals["left"] -= 1
            return "device manager is busy"
        return await real_register(request)

    monkeypatch.setattr(kubelet.device_manager, "register", flaky)
    async with kubelet, running(make_config(two_nodes, sock_dir)) as manager:
        await wait_all_live(kubelet, NAMES)
        refused = [r for r in kubelet.registrations if r.error is not None]
        assert len(refused) == 3
        await eventually(lambda: manager.registered == set(NAMES))


async def test_deleted_plugin_socket_is_served_and_registered_again(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
        path = sock_dir / "numa-align_numa-1.sock"
        before = path.stat().st_ino, path.stat().st_ctime_ns
        path.unlink()
        await eventually(
            lambda: path.exists() and (path.stat().st_ino, path.stat().st_ctime_ns) != before
        )
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 3)
        await wait_all_live(kubelet, NAMES)
        assert kubelet.registrations[-1].resource_name == "numa-align/numa-1"


async def test_stream_dropped_by_kubelet_leads_to_reregistration(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
        await kubelet.clients["numa-align/numa-0"].channel.close()
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 3)
        await wait_all_live(kubelet, NAMES)
        assert kubelet.registrations[-1].resource_name == "numa-align/numa-0"


async def test_kubelet_gone_for_good_then_back(two_nodes: SysfsTree, sock_dir: Path) -> None:
    kubelet = KubeletStandIn(sock_dir)
    await kubelet.start()
    async with running(make_config(two_nodes, sock_dir)) as manager:
        await wait_all_live(kubelet, NAMES)
        await kubelet.stop()
        await eventually(lambda: manager.registered == set())
        await manager.wait_settled()
        assert not any(sock_dir.glob("numa-align_*.sock")), "no kubelet: nothing served"
        await kubelet.restart()
        try:
            await wait_all_live(kubelet, NAMES)
        finally:
            await kubelet.stop()


async def test_a_kubelet_sock_that_becomes_a_symlink_loop_is_survived(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """It once ended serve: "unexpected error ... starting over", then ``_evaluate``
    raised the same OSError (ELOOP) out of the main loop, exit 1."""
    kubelet = KubeletStandIn(sock_dir)
    await kubelet.start()
    async with running(make_config(two_nodes, sock_dir)) as manager:
        await wait_all_live(kubelet, NAMES)
        await kubelet.stop()
        looped = sock_dir / "kubelet.sock"
        looped.unlink(missing_ok=True)
        looped.symlink_to("kubelet.sock")
        manager.wake("test")
        await eventually(lambda: manager.registered == set())
        await manager.wait_settled()
        looped.unlink()
        await kubelet.restart()
        try:
            await wait_all_live(kubelet, NAMES)
        finally:
            await kubelet.stop()


async def test_reload_discovers_again(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        # CPUs 4-7 go offline: node 1 has no usable CPU left; a new node 2 appears.
        two_nodes.write("cpu/online", "0-3,8-9\n")
        two_nodes.write("node/online", "0-2\n")
        for node, row in ((0, "10 21 21"), (1, "21 10 21")):
            two_nodes.write(f"node/node{node}/distance", row + "\n")
        two_nodes.node(2, "8-9", distance="21 21 10")
        m.reload()
        wanted = ["numa-align/numa-0", "numa-align/numa-2"]
        await wait_all_live(kubelet, wanted)
        await kubelet.wait_until(lambda: kubelet.allocatable("numa-align/numa-1") == 0)
        assert set(m.resources) == set(wanted)
        assert not (sock_dir / "numa-align_numa-1.sock").exists()


async def test_reload_with_malformed_sysfs_keeps_serving(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        two_nodes.write("node/node1/cpulist", "4-?\n")
        m.reload()
        await m.wait_settled()
        assert set(m.resources) == set(NAMES)
        assert all_live(kubelet, NAMES)


async def test_malformed_sysfs_at_start_raises_naming_the_file(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    two_nodes.write("node/node0/cpulist", "0-3,zz\n")
    with pytest.raises(SysfsFormatError, match="node0/cpulist"):
        async with running(make_config(two_nodes, sock_dir)):
            await asyncio.sleep(1)


async def test_stop_removes_sockets_and_ends_streams(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with KubeletStandIn(sock_dir) as kubelet:
        async with running(make_config(two_nodes, sock_dir)):
            await wait_all_live(kubelet, NAMES)
        assert sorted(os.listdir(sock_dir)) == [".numa-device-plugin", "kubelet.sock"]
        await kubelet.wait_until(lambda: kubelet.clients == {})


async def test_cpuless_nodes_on_request(sysfs_tree: SysfsTree, sock_dir: Path) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.write("node/online", "0,4\n")
    sysfs_tree.node(0, "0-1").node(4, "")
    async with KubeletStandIn(sock_dir) as kubelet:
        async with running(make_config(sysfs_tree, sock_dir)) as manager:
            await wait_all_live(kubelet, ["numa-align/numa-0"])
            assert list(manager.resources) == ["numa-align/numa-0"]
        config = make_config(sysfs_tree, sock_dir, include_cpuless_nodes=True)
        async with running(config):
            await wait_all_live(kubelet, ["numa-align/numa-0", "numa-align/numa-4"])


async def test_unexpected_error_in_the_loop_is_survived(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.kubelet.registration import register as real

    calls = {"n": 0}

    async def exploding(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("surprise")
        await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("numa_device_plugin.plugin.serving.endpoint.register", exploding)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
    assert calls["n"] >= 3


async def test_back_to_back_restarts_without_debounce(two_nodes: SysfsTree, sock_dir: Path) -> None:
    """Every restart ends with every resource live, with no event coalescing at all.

    Guards against a stall once seen with a plugin process: a resource stopped while
    kubelet.sock was briefly absent was never served again after another resource
    had recorded the new kubelet. In-process the race is rare; the soak test, with a
    real plugin process, exercises the cross-process timing."""
    config = make_config(two_nodes, sock_dir, debounce=0.0)
    async with KubeletStandIn(sock_dir) as kubelet, running(config):
        await wait_all_live(kubelet, NAMES)
        for _ in range(60):
            await kubelet.restart()
            # A stall never ends; a slow machine only delays (3 s once failed in CI's
            # run beside two TCG guests): wait for the event, not a short deadline.
            await wait_all_live(kubelet, NAMES, timeout=30)


async def test_hung_register_does_not_delay_a_new_kubelet(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Regression: a Register call to a hung kubelet must not hold the plugin back when
    a new kubelet.sock appears; it registers with the new one at once, not after the
    (here 30 s) register timeout."""
    from numa_device_plugin.kubelet.grpcserver import UnixSocketServer

    called = asyncio.Event()

    class HungKubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
        async def Register(self, request: object, context: object) -> None:
            called.set()
            await asyncio.Event().wait()

    hung = UnixSocketServer(
        sock_dir / "kubelet.sock",
        lambda s: api_pb2_grpc.add_RegistrationServicer_to_server(HungKubelet(), s),
    )
    await hung.start()
    try:
        async with running(make_config(two_nodes, sock_dir, register_timeout=30.0)):
            await asyncio.wait_for(called.wait(), 5)
            (sock_dir / "kubelet.sock").unlink()
            async with KubeletStandIn(sock_dir) as kubelet:
                # Well before the 30 s register timeout it must not wait for.
                await wait_all_live(kubelet, NAMES, timeout=20)
    finally:
        await hung.stop(0)


async def test_socket_deleted_right_after_bind_is_served_again(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the socket deleted between bind and the identity check left the
    resource unserved (and Register retried) until the next kubelet restart."""
    from numa_device_plugin.kubelet import grpcserver as server_module

    real = server_module.file_identity
    victim = sock_dir / "numa-align_numa-1.sock"
    deleted = {"done": False}

    def racing(path: Path) -> tuple[int, int, int] | None:
        if path == victim and not deleted["done"]:
            deleted["done"] = True
            path.unlink()
        return real(path)

    monkeypatch.setattr(server_module, "file_identity", racing)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES, timeout=20)
        await eventually(lambda: m.registered == set(NAMES), timeout=20)
    assert deleted["done"]


# -- tests that a mutation run found missing ------------------------------------------------


def test_backoff_grows_to_its_ceiling_then_resets() -> None:
    from numa_device_plugin.kubelet.registration import Backoff

    backoff = Backoff(initial=0.05, maximum=5.0)
    delays = [backoff.next_delay() for _ in range(12)]
    for attempt, delay in enumerate(delays):
        ceiling = min(5.0, 0.05 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert delays[6] > 0.05 * 2**5, "the delay must grow"
    backoff.reset()
    assert backoff.next_delay() <= 0.05


async def test_a_hung_register_times_out_and_is_retried(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet whose Register never answers once: the call must time out
    (--register-timeout) and be retried, not wait for good."""
    kubelet = KubeletStandIn(sock_dir)
    real_register = kubelet.device_manager.register
    hung: list[str] = []

    async def hang_once(request: api_pb2.RegisterRequest) -> str | None:
        if request.resource_name == "numa-align/numa-1" and not hung:
            hung.append(request.resource_name)
            await asyncio.Event().wait()
        return await real_register(request)

    monkeypatch.setattr(kubelet.device_manager, "register", hang_once)
    config = make_config(two_nodes, sock_dir, register_timeout=0.3)
    async with kubelet, running(config) as manager:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: manager.registered == set(NAMES))
    assert hung == ["numa-align/numa-1"]


async def test_a_register_answered_after_its_timeout_counts_once_the_kubelet_dialed_back(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet that accepts a Register (dials back, opens ListAndWatch) but answers
    after --register-timeout, as a loaded kubelet does (it dials for up to 10 s): the
    kubelet holds the registration, so the plugin must not register again. It once
    did, and the kubelet was left with two clients and two open streams for one
    resource (63 of 64 resources live after 60 s, beside two TCG guests)."""
    kubelet = KubeletStandIn(sock_dir)
    real_register = kubelet.device_manager.register
    late: list[str] = []
    calls: list[str] = []

    async def answer_late_once(request: api_pb2.RegisterRequest) -> str | None:
        calls.append(request.resource_name)
        error = await real_register(request)
        if request.resource_name == "numa-align/numa-1" and not late:
            late.append(request.resource_name)
            await asyncio.sleep(1.0)  # past the 0.3 s timeout, the stream already open
        return error

    monkeypatch.setattr(kubelet.device_manager, "register", answer_late_once)
    config = make_config(two_nodes, sock_dir, register_timeout=0.3)
    async with kubelet, running(config) as manager:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: manager.registered == set(NAMES))
        await asyncio.sleep(1.5)  # the late answer came; a retry would have come by now
        assert kubelet.device_manager.open_streams("numa-align/numa-1") == 1
        assert calls.count("numa-align/numa-1") == 1, "registered once"
        assert manager.readiness_problems() == []
    assert late == ["numa-align/numa-1"]


async def test_a_register_finishing_after_its_endpoint_was_removed_does_not_count(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.plugin.advertised.discovery import discover
    from numa_device_plugin.plugin.lifecycle.manager import PluginManager
    from numa_device_plugin.plugin.serving import endpoint as endpoint_module
    from numa_device_plugin.plugin.serving.endpoint import Endpoint
    from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer

    async def accepted(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(endpoint_module, "register", accepted)
    config = make_config(two_nodes, sock_dir)
    manager = PluginManager(config)
    resource = discover(config).resources["numa-align/numa-0"]
    endpoint = Endpoint(config, resource, NumaDevicePluginServicer(resource), (0, 0, 0))
    # The endpoint is not (any more) the current one.
    await manager.endpoints.keep_registering(endpoint)
    assert manager.registered == set()


async def test_an_error_in_the_loop_schedules_a_restart(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's own error handler: a pass that raises is followed by serving afresh."""
    from numa_device_plugin.plugin.lifecycle.restarts import Restarts

    real_restart = Restarts.restart
    raised: list[bool] = []

    async def explode_once(self: Restarts, names: set[str]) -> None:
        if not raised:
            raised.append(True)
            raise RuntimeError("surprise in the loop")
        await real_restart(self, names)

    monkeypatch.setattr(Restarts, "restart", explode_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: m.registered == set(NAMES))
    assert raised == [True]


async def test_an_error_deciding_what_to_serve_is_logged_and_retried(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Restarts.evaluate`` runs after the loop's own error handler: a failure there is
    caught too ("logged and retried, never raised")."""
    from numa_device_plugin.plugin.lifecycle.restarts import Restarts

    real_evaluate = Restarts.evaluate
    raised: list[bool] = []

    def explode_once(self: Restarts, reasons: list[tuple[str, str]]) -> None:
        if not raised:
            raised.append(True)
            raise OSError(40, "Too many levels of symbolic links")
        real_evaluate(self, reasons)

    monkeypatch.setattr(Restarts, "evaluate", explode_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        m.wake("test")
        await eventually(lambda: bool(raised))
        await kubelet.restart()
        await wait_all_live(kubelet, NAMES)
    assert raised == [True]


async def test_a_server_that_fails_to_start_once_is_started_again(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.kubelet.grpcserver import UnixSocketServer

    real_start = UnixSocketServer.start
    failed: list[Path] = []

    async def fail_once(self: UnixSocketServer) -> None:
        if self.path.name == "numa-align_numa-0.sock" and not failed:
            failed.append(self.path)
            raise RuntimeError("cannot bind (simulated)")
        await real_start(self)

    monkeypatch.setattr(UnixSocketServer, "start", fail_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: m.registered == set(NAMES))
    assert len(failed) == 1


async def test_streams_are_ended_before_the_server_stops(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Ending the servicer's streams first makes the grace period cost nothing: a
    re-serve with a 30 s grace and the kubelet's stream open still takes milliseconds."""
    config = make_config(two_nodes, sock_dir, shutdown_grace=30.0)
    async with KubeletStandIn(sock_dir) as kubelet, running(config):
        await wait_all_live(kubelet, NAMES)
        (sock_dir / "numa-align_numa-1.sock").unlink()
        # Within 20 s, well under the 30 s grace it must not cost.
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 3, timeout=20)
        await wait_all_live(kubelet, NAMES, timeout=20)


async def test_readiness_needs_the_kubelets_stream(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: m.readiness_problems() == [])
        m.servicers["numa-align/numa-1"].close()  # its streams end; still "registered"
        assert "numa-align/numa-1" in m.registered
        assert m.readiness_problems() == [
            "numa-align/numa-1: the kubelet has no ListAndWatch stream open"
        ]


async def test_socket_folder_deleted_and_created_again(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """The watch on a deleted folder ends with it; the plugin follows the folder's return
    and serves the new kubelet there (it once waited for good)."""
    folder = sock_dir / "dp"
    kubelet = KubeletStandIn(folder)
    await kubelet.start()
    try:
        async with serve_process(two_nodes, folder) as plugin:
            await wait_all_live(kubelet, NAMES, timeout=20)
            await kubelet.stop()

            def deleted() -> bool:
                # The plugin re-takes its lock (re-creating the lock subfolder) while
                # the folder is there: delete as `rm -rf` repeated until it is gone.
                shutil.rmtree(folder, ignore_errors=True)
                return not folder.exists()

            await eventually(deleted)
            await logged(plugin, "waiting for the kubelet")
            kubelet = KubeletStandIn(folder)
            await kubelet.start()  # creates the folder, then kubelet.sock in it
            await wait_all_live(kubelet, NAMES, timeout=20)
            lock = folder / LOCK_DIR_NAME / LOCK_FILE_NAME
            await eventually(lambda: lock.exists() and f"pid={plugin.pid} " in lock.read_text())
            # Still watched: a kubelet restart in the new folder is followed as ever.
            await kubelet.restart()
            await wait_all_live(kubelet, NAMES, timeout=20)
            assert await plugin.terminate() == 0
    finally:
        await kubelet.stop()


@pytest.mark.parametrize("name", sorted(SNAPSHOT_TABLE))
async def test_serve_on_every_real_snapshot(
    snapshots_root: Path, sock_dir: Path, name: str
) -> None:
    wanted = [f"numa-align/numa-{node}" for node in sorted(SNAPSHOT_TABLE[name])]
    config = Config(sysfs_root=snapshots_root / name, socket_dir=sock_dir, capacity=3)
    async with KubeletStandIn(sock_dir) as kubelet, running(config) as manager:
        await wait_all_live(kubelet, wanted)
        assert list(manager.resources) == wanted
        for resource in wanted:
            node = int(resource.rsplit("-", 1)[1])
            devices = kubelet.devices(resource)
            assert {tuple(n.ID for n in d.topology.nodes) for d in devices} == {(node,)}


async def test_serve_process_on_odd_sysfs_warns_and_serves(
    sysfs_tree: SysfsTree, sock_dir: Path
) -> None:
    odd_machine(sysfs_tree)
    wanted = [f"numa-align/numa-{node}" for node in range(3)]
    flags = ("--metrics-address", "127.0.0.1:0")
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(sysfs_tree, sock_dir, *flags) as plugin,
    ):
        port = await bound_port(plugin, "metrics")
        await wait_all_live(kubelet, wanted, timeout=20)
        metrics = await asyncio.to_thread(scrape, port)
        assert await plugin.terminate() == 0
    warnings = "\n".join(line["event"] for line in plugin.events() if line["level"] == "warning")
    assert "node1/distance: distance values must be positive (content: '0')" in warnings
    assert "node1/meminfo: no 'Node N MemTotal: X kB' line" in warnings
    assert "node2/meminfo: a FIFO, not a regular file" in warnings
    assert "online is empty for CPUs 3" in warnings
    assert 'numa_node_memory_bytes{numa_node="0"}' in metrics
    assert 'numa_node_memory_bytes{numa_node="1"}' not in metrics
    assert 'numa_node_distance{numa_node="1"' not in metrics
    assert 'numa_node_distance{numa_node="2",to_numa_node="2"} 10.0' in metrics
    assert 'numa_node_cpus_count{numa_node="1"} 2.0' in metrics


async def test_rediscovery_runs_off_the_event_loop(two_nodes: SysfsTree, sock_dir: Path) -> None:
    """SIGHUP's rediscovery once ran on the event loop: slow sysfs stalled Allocate."""
    release = threading.Event()
    entered = threading.Event()
    calls = {"n": 0}

    def slow_discover(config: Config) -> Discovery:
        calls["n"] += 1
        if calls["n"] > 1:
            entered.set()
            release.wait(10)
        return discover(config)

    config = Config(sysfs_root=two_nodes.root, socket_dir=sock_dir, capacity=2)
    manager = PluginManager(config, discover_fn=slow_discover)
    async with KubeletStandIn(sock_dir) as kubelet:
        task = asyncio.create_task(manager.serve())
        try:
            await wait_all_live(kubelet, NAMES)
            manager.reload()
            assert await asyncio.to_thread(entered.wait, 10)
            response = await asyncio.wait_for(
                kubelet.allocate("numa-align/numa-0", ["numa0-slot0000"]), 5
            )
            assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "0"}
        finally:
            release.set()
            manager.stop()
            await asyncio.wait_for(task, 10)


def odd_machine(tree: SysfsTree) -> SysfsTree:
    """Every tolerated odd form at once: an empty per-CPU online file, a distance file
    holding a single 0, distance rows counting possible nodes, a meminfo without
    MemTotal, and a FIFO where a meminfo belongs."""
    tree.cpus(6, online="0-5")
    tree.write("node/online", "0-2\n")
    tree.write("node/possible", "0-3\n")
    tree.node(0, "0-1", distance="10 20 20 20")
    tree.node(1, "2-3", distance="0", mem_kb=None)
    tree.write("node/node1/meminfo", "Node 1 MemFree: 4 kB\n")
    tree.node(2, "4-5", distance="20 20 10 20", mem_kb=None)
    os.mkfifo(tree.system / "node/node2/meminfo")
    tree.write("cpu/cpu3/online", "")
    return tree


class _NearRecorder(NullRecorder):
    """Keeps each report of the near resources' NUMA nodes."""

    def __init__(self) -> None:
        self.reports: list[dict[str, tuple[int, ...]]] = []

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        self.reports.append({name: tuple(ids) for name, ids in nodes.items()})


async def test_the_manager_reports_each_near_resources_numa_nodes_to_the_metrics(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Mutant: ``recorder.near({})``: numa_device_plugin_near_* never reported."""
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    near = (parse_near("data-disk=serial:S1"), parse_near("gone=serial:NONE"))
    recorder = _NearRecorder()
    async with running(make_config(two_nodes, sock_dir, near=near), recorder=recorder) as manager:
        await asyncio.wait_for(manager.started.wait(), 10)
        assert recorder.reports[-1] == {"numa-align/data-disk": (1,), "numa-align/gone": ()}


async def test_a_disk_that_moves_is_followed_without_a_restart_or_other_registrations(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Hotplug: the disk under a near resource is replaced by one on the other node
    (then taken away): with --device-interval the resource follows it, and only it
    registers again; nothing registers while nothing changes."""
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
    config = make_config(two_nodes, sock_dir, near=(parse_near("data=serial:DATA"),),
                         device_interval=0.2)  # fmt: skip
    disk = "numa-align/data"
    async with KubeletStandIn(sock_dir) as kubelet, running(config) as manager:
        await wait_all_live(kubelet, [*NAMES, disk])
        assert {n.ID for d in kubelet.devices(disk) for n in d.topology.nodes} == {1}
        looks: list[int] = []
        five = asyncio.Event()
        look = manager.device_watch.look

        async def counted() -> None:
            await look()
            looks.append(1)
            if len(looks) >= 5:
                five.set()

        manager.device_watch.look = counted  # type: ignore[method-assign]
        await asyncio.wait_for(five.wait(), 60)  # five looks at unchanged devices, however slow
        registered = [r.resource_name for r in kubelet.registrations]
        assert sorted(registered) == sorted([*NAMES, disk])
        # The disk is replaced by one on NUMA node 0 (same serial: the same data).
        shutil.rmtree(devices.pci_folder("0000:41:00.0") / "nvme")
        (two_nodes.root / "class" / "block" / "nvme1n1").unlink()
        devices.disk("nvme0n1", "0000:01:00.0", serial="DATA")
        await kubelet.wait_until(
            lambda: {n.ID for d in kubelet.devices(disk) for n in d.topology.nodes} == {0},
            timeout=20,
        )
        # Only it registers again (twice when a look falls between the removal and the
        # new disk: lost, then moved).
        assert {r.resource_name for r in kubelet.registrations[len(registered) :]} == {disk}
        assert manager.resources[disk].near_devices == ((0, ("nvme0n1",)),)
        # Taken away: the resource stays, every device Unhealthy (the kubelet then tells
        # the pods that hold one), with why.
        (two_nodes.root / "class" / "block" / "nvme0n1").unlink()
        await eventually(lambda: manager.resources[disk].lost is not None, 20)
        assert manager.resources[disk].lost == (
            "serial:DATA: no disk with that serial matches on this node"
        )
        await kubelet.wait_until(
            lambda: {d.health for d in kubelet.devices(disk)} == {"Unhealthy"}, timeout=20
        )
        assert all_live(kubelet, NAMES)
        # Back on node 1: served again, Healthy, on its new node.
        devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
        await kubelet.wait_until(
            lambda: (
                {(n.ID, d.health) for d in kubelet.devices(disk) for n in d.topology.nodes}
                == {(1, "Healthy")}
            ),
            timeout=20,
        )
        assert manager.resources[disk].lost is None
