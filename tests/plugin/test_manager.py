"""The plugin end to end against the kubelet stand-in, over real unix sockets:
registration, ListAndWatch, Allocate, reload, readiness and shutdown, on synthetic and
real machines. A kubelet that restarts or misbehaves: test_kubelet_restarts.py; the
loop's own errors: test_loop_errors.py; resources that follow a device:
test_near_serving.py. ``NAMES`` and :func:`make_config` serve them all."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.sysfs import SysfsFormatError
from tests.standin_helpers import (
    all_live,
    bound_port,
    eventually,
    running,
    scrape,
    serve_process,
    wait_all_live,
)
from tests.topology.test_topology import SNAPSHOT_TABLE

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


async def test_socket_folder_missing_at_start_is_created(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    folder = sock_dir / "dp"
    async with running(make_config(two_nodes, folder)) as manager:
        await asyncio.wait_for(manager.started.wait(), 5)
        assert folder.is_dir()
        async with KubeletStandIn(folder) as kubelet:
            await wait_all_live(kubelet, NAMES)


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


# -- tests that a mutation run found missing ------------------------------------------------


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
