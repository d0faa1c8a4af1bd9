"""`numa-device-plugin status` against the stand-in's pod resources API."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.cli import main
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.reports.status import build_status, render_table
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import running, wait_all_live
from tests.topology.test_numamemory import GI, M1, block, machine


def status_args(tree: SysfsTree, socket: Path, *extra: str) -> list[str]:
    return [
        "status", "--pod-resources-socket", str(socket), "--sysfs-root", str(tree.root),
        "--capacity", "5", *extra,
    ]  # fmt: skip


async def test_status_lists_holders_and_flags_misalignment(
    two_nodes: SysfsTree, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    standin = KubeletStandIn(
        sock_dir / "dp",
        pod_resources_dir=sock_dir / "pr",
        allocatable_cpus=range(1, 8),
        allocatable_memory={1: 4 * 2**30},  # the Memory Manager's Static policy, node 1
    )
    async with standin as kubelet, running(make_config(two_nodes, sock_dir / "dp")):
        await wait_all_live(kubelet, NAMES)
        kubelet.add_pod(
            "search",
            "shard-1",
            [
                ("warm", {"numa-align/numa-1": ["numa1-slot0000"]}, [4]),
                ("engine", {"numa-align/numa-1": ["numa1-slot0000"]}, [4, 5, 6]),
            ],
        )
        kubelet.add_pod("db", "bad", [("pg", {"numa-align/numa-1": ["numa1-slot0001"]}, [1, 2])])
        kubelet.add_pod("db", "shared", [("pg", {"numa-align/numa-0": ["numa0-slot0003"]}, [])])
        kubelet.add_pod("other", "gpu", [("x", {}, [7])])
        socket = kubelet.pod_resources_socket
        assert socket is not None
        args = status_args(two_nodes, socket, "--output", "json")
        assert await asyncio.to_thread(main, args) == 0
        document = json.loads(capsys.readouterr().out)
        assert await asyncio.to_thread(main, status_args(two_nodes, socket)) == 0
        table = capsys.readouterr().out
    node0, node1 = document["nodes"]
    assert (node0["id"], node0["resource"], node0["cpus"]) == (0, "numa-align/numa-0", "0-3")
    assert (node1["capacity"], node1["allocatable"], node1["allocated"]) == (5, 5, 2)
    holders = {(h["pod"], h["container"]): h for h in node1["holders"]}
    assert set(holders) == {("shard-1", "warm"), ("shard-1", "engine"), ("bad", "pg")}
    assert holders[("shard-1", "engine")]["aligned"] is True
    assert holders[("shard-1", "engine")]["cpus"] == "4-6"
    assert holders[("bad", "pg")]["aligned"] is False
    assert holders[("bad", "pg")]["problem"] == "CPUs 1-2 are not on NUMA node 1"
    (shared,) = node0["holders"]
    assert shared["aligned"] is False
    assert "no exclusive CPUs" in shared["problem"]
    assert document["misaligned"] == 2
    assert (
        "NUMA node 1 (numa-align/numa-1, CPUs 4-7): capacity 5, allocatable 5, allocated 2" in table
    )
    assert "db/bad pg: 1 device(s), CPUs 1-2, MISALIGNED: CPUs 1-2 are not on NUMA node 1" in table
    assert "search/shard-1 engine: 1 device(s), CPUs 4-6, aligned" in table
    # CPUs 1-7 allocatable; node 0 (0-3): 1-2 held by db/bad (a holder of numa-1: "other"
    # for node 0); node 1 (4-7): 4-6 ours, 7 another pod's.
    assert (node0["allocatable_cpus"], node0["assigned_cpus"], node0["free_cpus"]) == (
        3,
        {"ours": 0, "others": 2},
        1,
    )
    assert (node1["allocatable_cpus"], node1["assigned_cpus"], node1["free_cpus"]) == (
        4,
        {"ours": 3, "others": 1},
        0,
    )
    assert node1["memory"] == {"memory": 4 * 2**30}
    assert node0["memory"] is None
    assert (
        "exclusive CPUs: allocatable 4, assigned 4 (ours 3, others 1), free 0; "
        "memory (bytes): memory 4294967296" in table
    )
    assert table.rstrip().endswith("misaligned containers: 2")


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("absent", "no such socket (is the kubelet running"),
        ("a file", "is a regular file, not a socket"),
        ("a folder", "is a folder, not a socket"),
        ("refused", "nothing answers on it (connection refused)"),
        ("silent", "no answer within 2 s (--timeout)"),
        ("unimplemented", "it does not serve the pod resources API v1"),
    ],
)
async def test_status_failures_are_one_short_line(
    kind: str,
    reason: str,
    two_nodes: SysfsTree,
    sock_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a 300-character gRPC text, and "Connection refused" for a file or a folder."""

    from numa_device_plugin.kubelet.grpcserver import UnixSocketServer

    path = sock_dir / "kubelet.sock"
    listener = socket.socket(socket.AF_UNIX)
    server = UnixSocketServer(path, lambda _: None)  # no service at all
    if kind == "a file":
        path.write_text("")
    elif kind == "a folder":
        path.mkdir()
    elif kind in ("refused", "silent"):
        listener.bind(str(path))
        if kind == "silent":
            listener.listen()  # accepts, never speaks HTTP/2
    elif kind == "unimplemented":
        await server.start()
    try:
        # A silent server stays silent however loaded the machine: 2 s, not 0.5.
        code = await asyncio.to_thread(main, status_args(two_nodes, path, "--timeout", "2"))
    finally:
        listener.close()
        await server.stop()
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"numa-device-plugin status: {path}: {err.split(': ', 2)[2]}"
    assert reason in err
    assert err.count("\n") == 1, "one line"
    assert len(err) < 200


async def test_one_shot_commands_log_only_warnings_unless_asked(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """discover once logged a line per NUMA node to stderr (1,024 on a 1,024-node box)."""
    code = await asyncio.to_thread(main, ["discover", "--sysfs-root", str(two_nodes.root)])
    assert code == 0
    assert capsys.readouterr().err == ""
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--log-level", "info"]
    assert await asyncio.to_thread(main, args) == 0
    assert "advertising NUMA node" in capsys.readouterr().err


async def test_standin_pod_resources_get_and_allocatable(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    standin = KubeletStandIn(
        sock_dir / "dp", pod_resources_dir=sock_dir / "pr", allocatable_cpus=[2]
    )
    async with standin as kubelet, running(make_config(two_nodes, sock_dir / "dp")):
        await wait_all_live(kubelet, NAMES)
        kubelet.add_pod("ns", "p", [("c", {"numa-align/numa-0": ["numa0-slot0001"]}, [2])])
        async with grpc.aio.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            got = await stub.Get(pr_pb2.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"))
            device = got.pod_resources.containers[0].devices[0]
            assert [n.ID for n in device.topology.nodes] == [0]
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.Get(pr_pb2.GetPodResourcesRequest(pod_name="q", pod_namespace="ns"))
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            allocatable = await stub.GetAllocatableResources(pr_pb2.AllocatableResourcesRequest())
            assert list(allocatable.cpu_ids) == [2]
            assert len(allocatable.devices) == 10


def test_podresources_wire_names_and_numbers() -> None:
    def fields(message: str) -> list[tuple[str, int]]:
        descriptor = pr_pb2.DESCRIPTOR.message_types_by_name[message]
        return [(f.name, f.number) for f in descriptor.fields]

    assert pr_pb2.DESCRIPTOR.package == "v1"
    assert fields("ContainerResources") == [
        ("name", 1), ("devices", 2), ("cpu_ids", 3), ("memory", 4), ("dynamic_resources", 5),
    ]  # fmt: skip
    assert fields("AllocatableResourcesResponse") == [("devices", 1), ("cpu_ids", 2), ("memory", 3)]
    assert fields("ContainerDevices") == [("resource_name", 1), ("device_ids", 2), ("topology", 3)]
    assert fields("ContainerMemory") == [("memory_type", 1), ("size", 2), ("topology", 3)]
    assert fields("DynamicResource") == [
        ("claim_name", 2), ("claim_namespace", 3), ("claim_resources", 4),
    ]  # fmt: skip
    assert fields("GetPodResourcesRequest") == [("pod_name", 1), ("pod_namespace", 2)]
    service = pr_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


@pytest.mark.parametrize(
    "flags",
    [(), ("--capacity", "cpus", "--memory-unit", "256Mi", "--near", "any-nic=pci-class:02")],
    ids=["slots", "cpus-memory-near"],
)
async def test_demo_keep_serves_until_sigint_and_status_reads_it(
    two_nodes: SysfsTree, flags: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --keep` prints a status command line that works as printed (with the flags
    that shape the resources: once it left out --capacity and --memory-unit, and status
    reported "capacity 100" for 2 devices), then stops on Ctrl-C and leaves no temp
    folder."""
    import os
    import shlex
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    demo = subprocess.Popen(
        # Port 0: the demo's default 9201 may be taken (the README tour's demo --keep
        # still running once failed `make test`).
        [sys.executable, "-m", "numa_device_plugin", "demo", "--keep",
         "--sysfs-root", str(two_nodes.root), "--metrics-address", "127.0.0.1:0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        line = ""
        async with asyncio.timeout(60):
            while " status --socket-dir " not in line:
                line = await asyncio.to_thread(demo.stdout.readline)
                assert line, "the demo ended before printing the status command"
        printed = shlex.split(line)
        argv = printed[printed.index("status") :]
        assert await asyncio.to_thread(main, [*argv, "--output", "json"]) == 0
        document = json.loads(capsys.readouterr().out)
        # As printed, the command runs (the interpreter, or numa-device-plugin on PATH).
        done = await asyncio.to_thread(
            subprocess.run, printed, capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        folder = Path(argv[argv.index("--socket-dir") + 1]).parent
        demo.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(demo.wait, 30) == 0
        assert not folder.exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    capacities = {node["resource"]: node["capacity"] for node in document["nodes"]}
    if flags:
        # cpus mode: a device per CPU of the node (4 each), the memory resources listed.
        assert capacities["numa-align/numa-0"] == 4
        assert document["memory"], "the memory resources are reported"
    else:
        assert capacities["numa-align/numa-0"] == 100


async def test_status_lists_a_near_resource_per_numa_node_it_covers(
    two_nodes: SysfsTree, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """numa-align/md follows an md array over disks on both NUMA nodes: one entry per
    node, each with its own devices and holders, a holder's CPUs checked against the
    node of the devices it holds."""
    from dataclasses import replace

    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:00:01.0", 0)
    devices.pci("0000:41:00.0", 1)
    devices.disk("nvme0n1", "0000:00:01.0")
    devices.disk("nvme1n1", "0000:41:00.0")
    devices.mapped("md0", ["nvme0n1", "nvme1n1"])
    md = "numa-align/md"
    config = replace(make_config(two_nodes, sock_dir / "dp"), near=(parse_near("md=block:md0"),))
    standin = KubeletStandIn(
        sock_dir / "dp", pod_resources_dir=sock_dir / "pr", allocatable_cpus=range(1, 8)
    )
    async with standin as kubelet, running(config):
        await wait_all_live(kubelet, [*NAMES, md])
        kubelet.add_pod("es", "data-0", [("es", {md: ["numa1-slot0002"]}, [5])])
        kubelet.add_pod("es", "data-1", [("es", {md: ["numa0-slot0000"]}, [6])])
        socket = kubelet.pod_resources_socket
        assert socket is not None
        near = ("--near", "md=block:md0")
        assert (
            await asyncio.to_thread(main, status_args(two_nodes, socket, *near, "--output", "json"))
            == 0
        )
        document = json.loads(capsys.readouterr().out)
        assert await asyncio.to_thread(main, status_args(two_nodes, socket, *near)) == 0
        table = capsys.readouterr().out
    entries = {e["id"]: e for e in document["nodes"] if e["resource"] == md}
    assert set(entries) == {0, 1}
    assert [(h["pod"], h["aligned"]) for h in entries[1]["holders"]] == [("data-0", True)]
    assert [(h["pod"], h["problem"]) for h in entries[0]["holders"]] == [
        ("data-1", "CPUs 6 are not on NUMA node 0")
    ]
    assert (entries[0]["capacity"], entries[0]["allocatable"], entries[0]["allocated"]) == (5, 5, 1)
    assert entries[1]["near"] == "md=block:md0"
    assert document["misaligned"] == 1
    assert "NUMA node 1 (numa-align/md near block:md0, CPUs 4-7): capacity 5" in table


def test_the_table_escapes_control_characters_in_names_from_the_kubelet() -> None:
    """A pod name with NUL and CR once reached the terminal as is."""
    from numa_device_plugin.plugin.reports.status import render_table

    holder = {"aligned": True, "problem": None, "namespace": "ns", "pod": "p\x00\rx",
              "container": "c\x1b[2J", "devices": ["numa0-slot0000"], "cpus": "1"}  # fmt: skip
    node = {"id": 0, "resource": "numa-align/numa-0", "cpus": "0-3", "capacity": 1,
            "allocatable": 1, "allocated": 1, "assigned_cpus": {"ours": 1, "others": 0},
            "memory": None, "allocatable_cpus": 4, "free_cpus": 3, "holders": [holder]}  # fmt: skip
    document = {"cpu_manager_static": True, "nodes": [node], "memory": [],
                "memory_manager_static": True, "misaligned": 0, "miscounted": 0}  # fmt: skip
    table = render_table(document)
    assert "  ns/p\\x00 x c\\x1b[2J: 1 device(s), CPUs 1, aligned" in table.splitlines()
    assert not any(c in table for c in "\x00\r\x1b")


def memory_status_of(tmp_path: Path, size: int, devices: list[str], total: int) -> Any:
    config = config_from_params({"sysfs_root": machine(tmp_path).root, "memory_unit": GI})
    pods = pr_pb2.ListPodResourcesResponse()
    container = pods.pod_resources.add(name="pg", namespace="db").containers.add(
        name="pg", memory=[block("memory", size, [1])]
    )
    container.devices.add(resource_name=M1, device_ids=devices)
    allocatable = pr_pb2.AllocatableResourcesResponse()
    allocatable.memory.append(block("memory", total, [1]))
    document = build_status(discover(config), config, pods, allocatable)
    (entry,) = [e for e in document["memory"] if e["resource"] == M1]
    return document, entry


def test_a_holder_asks_units_rounded_up(tmp_path: Path) -> None:
    """Mutant: ceil -> floor in the MISCOUNTED check (1.5 GiB asks 2 units)."""
    document, entry = memory_status_of(
        tmp_path, 3 * GI // 2, ["numa1-mem0000", "numa1-mem0001"], 7 * GI
    )
    assert [h["problem"] for h in entry["holders"]] == [None]
    assert document["miscounted"] == 0


def test_free_units_never_go_below_zero(tmp_path: Path) -> None:
    """Mutant: the clamp of free units removed (more assigned than allocatable)."""
    _, entry = memory_status_of(tmp_path, 9 * GI, ["numa1-mem0000"], 7 * GI)
    assert entry["free_units"] == 0


@pytest.mark.parametrize("static", [True, False])
def test_the_memory_manager_line_shows_only_when_it_is_not_static(
    tmp_path: Path, static: bool
) -> None:
    """Mutant: the Memory Manager warning shown when the policy *is* Static."""
    document, _ = memory_status_of(tmp_path, GI, ["numa1-mem0000"], 7 * GI if static else 0)
    if not static:
        document = {**document, "memory_manager_static": False}
    text = render_table(document)
    line = "the kubelet lists no allocatable memory: its Memory Manager policy is not Static"
    assert (line in text) is not static


def test_status_flags_a_cpus_mode_holder_with_other_devices_than_cpus(tmp_path: Path) -> None:
    """The cpus-mode MISCOUNTED check (a path no test ran)."""
    tree = machine(tmp_path)
    config = config_from_params({"sysfs_root": tree.root, "capacity": "cpus"})
    pods = pr_pb2.ListPodResourcesResponse()
    container = pods.pod_resources.add(name="pg", namespace="db").containers.add(
        name="pg", cpu_ids=[2, 3]
    )
    container.devices.add(resource_name="numa-align/numa-1", device_ids=["numa1-cpu0002"])
    allocatable = pr_pb2.AllocatableResourcesResponse(cpu_ids=list(range(4)))
    document = build_status(discover(config), config, pods, allocatable)
    assert document["miscounted"] == 1
    text = render_table(document)
    assert "aligned, MISCOUNTED: 1 device(s) for 2 exclusive CPUs" in text


def test_status_says_where_any_is_offered_and_where_the_rule_would_put_it(
    tmp_path: Path,
) -> None:
    """The kubelet lists any's free devices on node 1 only (node 0's CPU 2 held by a pod
    of any, CPU 0 by a foreign pod): offered there, the most room there."""
    tree = machine(tmp_path)
    config = config_from_params({"sysfs_root": tree.root, "capacity": "cpus"})
    pods = pr_pb2.ListPodResourcesResponse()
    pod = pods.pod_resources.add(name="web", namespace="shop")
    pod.containers.add(name="app", cpu_ids=[1]).devices.add(
        resource_name="numa-align/any", device_ids=["numa0-cpu0001"]
    )
    pods.pod_resources.add(name="db", namespace="ops").containers.add(name="db", cpu_ids=[0])
    allocatable = pr_pb2.AllocatableResourcesResponse(cpu_ids=list(range(4)))
    listed = ["numa0-cpu0001", "numa1-cpu0002", "numa1-cpu0003"]
    allocatable.devices.add(resource_name="numa-align/any", device_ids=listed)
    document = build_status(discover(config), config, pods, allocatable)
    assert document["exposed"]["numa-align/any"] == {
        "offered": [1],
        "most_room": 1,
        "why": "most room: node 1 has 2 free CPUs (node 0: 0 free CPUs)",
    }
    text = render_table(document)
    assert (
        "numa-align/any: the kubelet lists free devices on NUMA node(s) 1; the rule now: " in text
    )
