"""Faults an adversarial run found, each over a real ``serve`` process and the kubelet
stand-in: two instances on one folder, other clients' ListAndWatch streams, huge
device ids, and the socket folder deleted and created again."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME, LOCK_FILE_NAME
from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.discovery import Discovery, discover
from numa_device_plugin.plugin.manager import PluginManager
from numa_device_plugin.topology.fake import SysfsTree
from tests.standin_helpers import (
    ServeProcess,
    eventually,
    free_port,
    live_plugin,
    running,
    serve_process,
    wait_all_live,
)
from tests.topology.test_topology import SNAPSHOT_TABLE

NAMES = ["numa-align/numa-0", "numa-align/numa-1"]


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


async def logged(process: ServeProcess, event: str, timeout: float = 10.0) -> dict[str, Any]:
    """Wait until the process has logged ``event``; the first such log line."""
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [line for line in process.events() if line.get("event") == event]
        return bool(found)

    try:
        await eventually(seen, timeout)
    except TimeoutError:
        raise AssertionError(f"{event!r} never logged; the log:\n{process.log()}") from None
    return found[0]


def accepted(kubelet: KubeletStandIn) -> int:
    return sum(1 for record in kubelet.registrations if record.error is None)


async def test_a_second_instance_waits_for_the_lock_then_takes_over(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    port = free_port()
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as first:
        await wait_all_live(kubelet, NAMES, timeout=20)
        flags = ("--health-address", f"127.0.0.1:{port}")
        async with serve_process(two_nodes, sock_dir, *flags) as second:
            waiting = await logged(
                second, "another instance serves this device-plugin folder; waiting for it to exit"
            )
            assert f"pid={first.pid} " in waiting["holder"]
            assert waiting["lock"] == str(sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME)
            # It decided before touching any socket: the first instance's registrations
            # are the only ones, and its streams are the kubelet's only streams.
            assert accepted(kubelet) == 2
            assert all(kubelet.live(name) for name in NAMES)
            await eventually(lambda: readyz(port)[0] == 503)
            _, text = await asyncio.to_thread(readyz, port)
            assert "holds the lock" in text
            assert f"pid={first.pid}" in text

            assert await first.terminate() == 0
            await logged(second, "took over the instance lock")
            await wait_all_live(kubelet, NAMES, timeout=10)
            await eventually(lambda: readyz(port)[0] == 200)
            lock_text = (sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME).read_text()
            assert lock_text.startswith(f"pid={second.pid} ")
            for name in NAMES:
                assert kubelet.open_streams(name) == 1
            assert await second.terminate() == 0
    stopped = [line for line in first.events() if line.get("event") == "device plugin stopped"]
    assert stopped, first.log()


async def test_the_lock_survives_a_kubelet_restart(two_nodes: SysfsTree, sock_dir: Path) -> None:
    """The kubelet deletes every file of the folder when it starts, but not subfolders:
    a newcomer after a kubelet restart must still find the lock taken."""
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as first:
        await wait_all_live(kubelet, NAMES, timeout=20)
        await kubelet.restart()
        await wait_all_live(kubelet, NAMES, timeout=10)
        async with serve_process(two_nodes, sock_dir) as second:
            waiting = await logged(
                second, "another instance serves this device-plugin folder; waiting for it to exit"
            )
            assert f"pid={first.pid} " in waiting["holder"]
            assert accepted(kubelet) == 4


async def test_a_lock_file_replaced_by_a_folder_makes_the_plugin_stand_down(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Holding no lock, the plugin must not serve: a newcomer could take the lock and
    both would register. It stands down, unready, until it can lock again."""
    lock = sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME
    async with live_plugin(two_nodes, sock_dir, NAMES) as (kubelet, plugin, port):
        await eventually(lambda: readyz(port)[0] == 200)
        lock.unlink()
        lock.mkdir()
        await logged(plugin, "cannot lock the device-plugin folder; standing down")
        await eventually(lambda: not any(kubelet.open_streams(name) for name in NAMES))
        status, text = await asyncio.to_thread(readyz, port)
        assert status == 503
        assert f"cannot lock {lock}" in text
        assert not list(sock_dir.glob("*.sock"))[1:], "only kubelet.sock is left"

        lock.rmdir()
        await logged(plugin, "took over the instance lock")
        await wait_all_live(kubelet, NAMES, timeout=10)
        await eventually(lambda: readyz(port)[0] == 200)
        assert lock.read_text().startswith(f"pid={plugin.pid} ")
        assert await plugin.terminate() == 0


async def test_a_newcomer_on_a_new_lock_file_makes_the_plugin_stand_down(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """The lock file deleted and locked anew by another instance: this one stands
    down (its streams end, /readyz names the holder) and waits to take over."""
    from numa_device_plugin.ops.instancelock import InstanceLock

    async with live_plugin(two_nodes, sock_dir, NAMES) as (kubelet, plugin, port):
        (sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME).unlink()
        newcomer = InstanceLock(sock_dir)
        assert newcomer.try_acquire()
        try:
            await logged(plugin, "another instance took the lock; standing down")
            await eventually(lambda: not any(kubelet.open_streams(name) for name in NAMES))
            await eventually(lambda: "holds the lock" in readyz(port)[1])
            assert f"pid={os.getpid()} " in readyz(port)[1]
        finally:
            newcomer.release()
        await logged(plugin, "took over the instance lock")
        await wait_all_live(kubelet, NAMES, timeout=10)
        assert await plugin.terminate() == 0


async def test_an_operators_stream_ending_is_not_the_kubelet_leaving(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """grpcurl opening and closing ListAndWatch once cut the kubelet's live stream (the
    plugin took any stream's end for the kubelet leaving) and counted for /readyz."""
    port = free_port()
    flags = ("--log-level", "debug", "--health-address", f"127.0.0.1:{port}")
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(two_nodes, sock_dir, *flags) as plugin,
    ):
        await wait_all_live(kubelet, NAMES, timeout=20)
        await eventually(lambda: readyz(port)[0] == 200)
        target = f"unix://{sock_dir / 'numa-align_numa-0.sock'}"
        async with grpc.aio.insecure_channel(target) as operator:
            stream = api_pb2_grpc.DevicePluginStub(operator).ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert len(first.devices) == 100
        closed = await logged(plugin, "ListAndWatch closed")
        assert closed["kubelet"] is False
        assert closed["resource"] == "numa-align/numa-0"
        events = [line["event"] for line in plugin.events()]
        assert "ListAndWatch stream lost: the kubelet went away" not in events
        assert "serving and registering again" not in events
        assert accepted(kubelet) == 2
        assert all(kubelet.live(name) for name in NAMES)
        assert (await asyncio.to_thread(readyz, port))[0] == 200
        # The kubelet's own stream still counts: dropping it brings a re-registration.
        await kubelet.clients["numa-align/numa-0"].channel.close()
        await logged(plugin, "ListAndWatch stream lost: the kubelet went away")
        await kubelet.wait_until(lambda: accepted(kubelet) == 3)
        await wait_all_live(kubelet, NAMES)


@pytest.mark.parametrize("length", [1_000_000])
async def test_a_huge_device_id_gets_a_bounded_refusal_and_log_line(
    two_nodes: SysfsTree, sock_dir: Path, length: int
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as plugin:
        await wait_all_live(kubelet, NAMES, timeout=20)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate("numa-align/numa-1", ["z" * length, "numa1-slot0000"])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len((caught.value.details() or "").encode()) <= 1024
        await logged(plugin, "Allocate refused")
        refused = [line for line in plugin.log().splitlines() if "Allocate refused" in line]
        assert len(refused) == 1
        assert len(refused[0].encode()) <= 2048, "the log line carries the bounded message"
        response = await kubelet.allocate("numa-align/numa-1", ["numa1-slot0000"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}


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
            await wait_all_live(kubelet, NAMES, timeout=5)
            lock = folder / LOCK_DIR_NAME / LOCK_FILE_NAME
            await eventually(lambda: lock.exists() and f"pid={plugin.pid} " in lock.read_text())
            # Still watched: a kubelet restart in the new folder is followed as ever.
            await kubelet.restart()
            await wait_all_live(kubelet, NAMES, timeout=10)
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


async def test_serve_process_on_odd_sysfs_warns_and_serves(
    sysfs_tree: SysfsTree, sock_dir: Path
) -> None:
    odd_machine(sysfs_tree)
    wanted = [f"numa-align/numa-{node}" for node in range(3)]
    port = free_port()
    flags = ("--metrics-address", f"127.0.0.1:{port}")
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(sysfs_tree, sock_dir, *flags) as plugin,
    ):
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
