"""Exact NUMA memory and hugepages (``--memory-unit``): quantities, the kubelet's
``--reserved-memory`` syntax, pools from sysfs, the health rule, and real ``serve``
processes against the stand-in's Memory Manager."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.cli import main
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.view import KubeletView, view_from
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.build import build_resources
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.counts.capacity import assigned_memory, live_memory_devices
from numa_device_plugin.plugin.model.resources import HEALTHY, UNHEALTHY, Resource
from numa_device_plugin.plugin.reports.status import build_status, render_table
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.memory import (
    MemoryUnitError,
    device_unit,
    format_quantity,
    memory_device_id,
    node_pools,
    parse_quantity,
    parse_reserved_memory,
)
from numa_device_plugin.topology.numa import read_topology
from numa_device_plugin.topology.plan import plan_nodes
from tests.standin_helpers import ServeProcess, bounded_serve, eventually, serve_process

GI = 1 << 30
MI = 1 << 20
M0, M1 = "numa-align/numa-0-memory", "numa-align/numa-1-memory"
H1G, H2M = "numa-align/numa-0-hugepages-1gi", "numa-align/numa-0-hugepages-2mi"


# -- quantities and --reserved-memory ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [("1Gi", GI), ("256Mi", 256 * MI), ("1000000", 10**6), ("2G", 2 * 10**9), ("64Ki", 65536),
     (" 3Gi ", 3 * GI), ("0", 0)],
)  # fmt: skip
def test_quantities_parse_as_bytes(text: str, size: int) -> None:
    assert parse_quantity(text) == size


@pytest.mark.parametrize("text", ["1.5Gi", "1e9", "Gi", "-1Gi", "1GB", "1 Gi", "", "1gi"])
def test_quantities_refused_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a memory quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("size", "text"),
    [(2 * MI, "2Mi"), (GI, "1Gi"), (65536, "64Ki"), (32 * MI, "32Mi"), (1000, "1000")],
)
def test_sizes_format_as_the_kubelet_names_them(size: int, text: str) -> None:
    assert format_quantity(size) == text


def test_reserved_memory_takes_the_kubelets_syntax() -> None:
    assert parse_reserved_memory("0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi") == (
        (0, "hugepages-1Gi", 2 * GI),
        (0, "memory", GI),
        (1, "memory", 2 * GI),
    )
    # Given twice (the kubelet's flag repeats): the sizes add up.
    assert parse_reserved_memory("0:memory=1Gi;0:memory=512Mi;") == ((0, "memory", GI + 512 * MI),)
    # hugepages-2048Ki is hugepages-2Mi, as the kubelet normalises it.
    assert parse_reserved_memory("1:hugepages-2048Ki=4Mi") == ((1, "hugepages-2Mi", 4 * MI),)


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("0memory=1Gi", "expected <NUMA node>:<type>=<quantity>"),
        ("x:memory=1Gi", "expected <NUMA node>:<type>=<quantity>"),
        ("0:memory", "'memory' is not <type>=<quantity>"),
        ("0:mem=1Gi", "'mem' is not a memory type"),
        ("0:memory=1.5Gi", "'1.5Gi' is not a memory quantity"),
        ("0:hugepages-=1Gi", "is not a memory type"),
    ],
)
def test_malformed_reserved_memory_names_the_entry_and_fault(text: str, fault: str) -> None:
    with pytest.raises(ValueError, match="^" + repr(text.split(";")[0]).replace(".", r"\.")) as e:
        parse_reserved_memory(text)
    assert fault in str(e.value)


# -- pools and devices from sysfs -----------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_type", "unit", "per_device"),
    [
        ("memory", GI, GI),
        ("memory", 256 * MI, 256 * MI),
        ("hugepages-2Mi", GI, GI),  # small pages: one device per unit
        ("hugepages-2Mi", MI, 2 * MI),  # ... but never less than a page
        ("hugepages-1Gi", 256 * MI, GI),  # 1Gi pages: one device per page
        ("hugepages-1Gi", 4 * GI, GI),
    ],
)
def test_device_sizes(memory_type: str, unit: int, per_device: int) -> None:
    assert device_unit(memory_type, unit) == per_device


def test_pools_subtract_hugepages_from_memory_and_reserved_from_the_fallback() -> None:
    pools = node_pools(0, 8 * GI, {GI: 2, 2 * MI: 512}, GI, ((0, "memory", GI),))
    assert [(p.memory_type, p.unit, p.total, p.fallback, p.devices) for p in pools] == [
        ("memory", GI, 5 * GI, 4 * GI, 5),
        ("hugepages-2Mi", GI, GI, GI, 1),
        ("hugepages-1Gi", GI, 2 * GI, 2 * GI, 2),
    ]
    # An empty pool, or one smaller than a device, gives no resource; unknown MemTotal none.
    assert [p.memory_type for p in node_pools(1, 512 * MI, {GI: 0}, GI, ())] == []
    assert node_pools(1, None, {}, GI, ()) == []
    with pytest.raises(MemoryUnitError, match="gives NUMA node 3 16384 memory devices"):
        node_pools(3, 16 * GI, {}, MI, ())


def test_device_ids_are_stable_and_name_node_type_and_unit() -> None:
    assert memory_device_id(1, "memory", 7) == "numa1-mem0007"
    assert memory_device_id(0, "hugepages-2Mi", 3) == "numa0-hp2m0003"
    assert memory_device_id(12, "hugepages-1Gi", 0) == "numa12-hp1g0000"


def machine(root: Path) -> SysfsTree:
    """Two NUMA nodes of 2 CPUs: node 0 with 8 GiB, two 1Gi pages and 512 2Mi pages;
    node 1 with 8 GiB and no hugepages."""
    tree = SysfsTree(root).cpus(4, online="0-3")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-1", distance="10 20", mem_kb=8 << 20, hugepages={1048576: 2, 2048: 512})
    tree.node(1, "2-3", distance="20 10", mem_kb=8 << 20)
    return tree


def test_sysfs_hugepage_pools_become_resources(tmp_path: Path) -> None:
    topology = read_topology(machine(tmp_path).root)
    assert topology.node(0).hugepages == ((2 * MI, 512), (GI, 2))
    resources = build_resources(plan_nodes(topology), memory_unit=GI)
    assert {name: len(r.devices) for name, r in resources.items()} == {
        "numa-align/numa-0": 100, M0: 5, H2M: 1, H1G: 2, "numa-align/numa-1": 100, M1: 8,
    }  # fmt: skip
    assert [d.id for d in resources[H1G].devices] == ["numa0-hp1g0000", "numa0-hp1g0001"]
    assert {d.node_id for d in resources[M1].devices} == {1}
    # Without --memory-unit nothing changes.
    assert list(build_resources(plan_nodes(topology))) == ["numa-align/numa-0", "numa-align/numa-1"]


def test_a_malformed_hugepage_count_is_a_warning_naming_the_file(tmp_path: Path) -> None:
    tree = machine(tmp_path)
    path = tree.write("node/node1/hugepages/hugepages-2048kB/nr_hugepages", "many\n")
    tree.write("node/node1/hugepages/surprise/nr_hugepages", "1\n")
    topology = read_topology(tree.root)
    assert topology.node(1).hugepages == ()
    assert any(str(path) in w and "'many'" in w for w in topology.warnings), topology.warnings
    assert any("surprise" in w for w in topology.warnings)


# -- the health rule --------------------------------------------------------------------------


def memory_resource(tmp_path: Path, name: str = M1, unit: int = GI) -> Resource:
    topology = read_topology(machine(tmp_path / name.replace("/", "_")).root)
    resources = build_resources(plan_nodes(topology), memory_unit=unit,
                                reserved_memory=((1, "memory", 2 * GI),))  # fmt: skip
    return resources[name]


def block(memory_type: str, size: int, nodes: list[int]) -> pr_pb2.ContainerMemory:
    return pr_pb2.ContainerMemory(
        memory_type=memory_type, size=size,
        topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n) for n in nodes]),
    )  # fmt: skip


def view(
    allocatable: dict[int, dict[str, int]], containers: list[tuple[dict[str, list[str]], Any]]
) -> KubeletView:
    pods = pr_pb2.ListPodResourcesResponse()
    pod = pods.pod_resources.add(name="p", namespace="n")
    for index, (devices, blocks) in enumerate(containers):
        container = pod.containers.add(name=f"c{index}", memory=blocks)
        for resource, ids in devices.items():
            container.devices.add(resource_name=resource, device_ids=ids)
    answer = pr_pb2.AllocatableResourcesResponse()
    for node, per_type in allocatable.items():
        for memory_type, size in per_type.items():
            answer.memory.append(block(memory_type, size, [node]))
    return view_from(pods, answer)


def healthy(devices: tuple[Any, ...]) -> list[str]:
    return [d.id for d in devices if d.health == HEALTHY]


def test_health_is_held_plus_whole_free_units(tmp_path: Path) -> None:
    resource = memory_resource(tmp_path)
    # No API yet: 8 GiB - 2 GiB reserved.
    assert len(healthy(live_memory_devices(resource, None))) == 6
    # The kubelet: 7 GiB allocatable, a foreign container 2.5 GiB: floor(4.5) = 4.
    seen = view({1: {"memory": 7 * GI}}, [({}, [block("memory", 5 * GI // 2, [1])])])
    assert healthy(live_memory_devices(resource, seen)) == [f"numa1-mem000{i}" for i in range(4)]
    # Ours holds devices 5 and 6 with 2 GiB: held first, then the lowest: 2 + floor(2.5).
    ours = ({M1: ["numa1-mem0005", "numa1-mem0006"]}, [block("memory", 2 * GI, [1])])
    seen = view({1: {"memory": 7 * GI}}, [({}, [block("memory", 5 * GI // 2, [1])]), ours])
    devices = live_memory_devices(resource, seen)
    assert healthy(devices) == ["numa1-mem0000", "numa1-mem0001", "numa1-mem0005",
                                "numa1-mem0006"]  # fmt: skip
    assert len(devices) == 8
    # Nothing free: the held devices stay Healthy, the kubelet keeps its pod.
    seen = view({1: {"memory": 7 * GI}}, [({}, [block("memory", 6 * GI, [1])]), ours])
    assert healthy(live_memory_devices(resource, seen)) == ["numa1-mem0005", "numa1-mem0006"]


def test_a_block_spanning_nodes_counts_in_full_on_each(tmp_path: Path) -> None:
    m0, m1 = memory_resource(tmp_path, M0), memory_resource(tmp_path, M1)
    seen = view({0: {"memory": 4 * GI}, 1: {"memory": 7 * GI}},
                [({}, [block("memory", 3 * GI, [0, 1])])])  # fmt: skip
    assert len(healthy(live_memory_devices(m0, seen))) == 1
    assert len(healthy(live_memory_devices(m1, seen))) == 4
    assert assigned_memory(seen, [M0, M1]) == {
        (0, "memory", "numa-align"): 0, (0, "memory", "other"): 3 * GI,
        (1, "memory", "numa-align"): 0, (1, "memory", "other"): 3 * GI,
    }  # fmt: skip


def test_without_the_memory_managers_static_policy_every_device_is_unhealthy(
    tmp_path: Path,
) -> None:
    resource = memory_resource(tmp_path)
    no_memory = view({}, [])
    assert healthy(live_memory_devices(resource, no_memory)) == []
    assert {d.health for d in live_memory_devices(resource, no_memory)} == {UNHEALTHY}
    # --allow-unaligned: as without the API (sysfs minus reserved).
    assert len(healthy(live_memory_devices(resource, no_memory, allow_unaligned=True))) == 6


def test_held_ids_beyond_the_list_stay_listed(tmp_path: Path) -> None:
    resource = memory_resource(tmp_path)  # 8 devices: 0-7
    seen = view({1: {"memory": 7 * GI}}, [({M1: ["numa1-mem0011"]}, [block("memory", GI, [1])])])
    devices = live_memory_devices(resource, seen)
    assert devices[-1].id == "numa1-mem0011"
    assert devices[-1].health == HEALTHY


# -- real serve processes against the stand-in -----------------------------------------------

ALLOCATABLE = {
    0: {"memory": 4 * GI, "hugepages-1Gi": 2 * GI, "hugepages-2Mi": GI},
    1: {"memory": 7 * GI},
}


@asynccontextmanager
async def memory_mode(
    tree: SysfsTree,
    folder: Path,
    *flags: str,
    policy: str = "Static",
    api: bool = True,
    pods: dict[tuple[str, str], list[Any]] | None = None,
) -> AsyncIterator[tuple[KubeletStandIn, ServeProcess]]:
    """The stand-in (its Memory Manager ``policy``, ``ALLOCATABLE``, the ``pods``
    placed before the plugin starts) and `serve --memory-unit 1Gi` reading it every
    0.2 s; ``api`` False: no pod resources API."""
    standin = KubeletStandIn(
        folder / "dp",
        pod_resources_dir=folder / "pr" if api else None,
        allocatable_cpus=range(4),
        allocatable_memory=ALLOCATABLE,
        memory_manager_policy=policy,
    )
    args = (
        "--memory-unit", "1Gi",
        "--pod-resources-socket", str(folder / "pr" / "kubelet.sock"),
        "--pod-resources-interval", "0.2",
        *flags,
    )  # fmt: skip
    for (namespace, name), containers in (pods or {}).items():
        standin.add_pod(namespace, name, containers)
    async with standin as kubelet, serve_process(tree, folder / "dp", *args) as plugin:
        yield kubelet, plugin


def counts(kubelet: KubeletStandIn, names: tuple[str, ...]) -> tuple[int, ...] | None:
    """Healthy devices per resource of ``names`` while all are live, else None."""
    if not all(kubelet.live(name) for name in names):
        return None
    return tuple(kubelet.allocatable(name) for name in names)


ALL = (M0, H1G, H2M, M1)


async def test_serve_advertises_memory_per_type_and_follows_the_kubelet(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = machine(tmp_path / "sys")
    async with memory_mode(tree, sock_dir) as (kubelet, plugin):
        await kubelet.wait_until(lambda: counts(kubelet, ALL) == (4, 2, 1, 7), timeout=20)
        assert [len(kubelet.devices(name)) for name in ALL] == [5, 2, 1, 8]
        assert {n.ID for d in kubelet.devices(M1) for n in d.topology.nodes} == {1}

        # A foreign Guaranteed pod's 2.5 GiB on node 1 takes 3 units; gone, they return.
        kubelet.add_pod("web", "cache", [("cache", {}, [3], [("memory", 5 * GI // 2, [1])])])
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (4,), timeout=5)
        assert counts(kubelet, (M0,)) == (4,), "node 0 is untouched"

        # Ours holds 2 units with 2 GiB: they stay Healthy whatever else comes.
        await kubelet.allocate(M1, ["numa1-mem0006", "numa1-mem0007"])
        kubelet.add_pod("db", "pg", [("pg", {M1: ["numa1-mem0006", "numa1-mem0007"]}, [2],
                                      [("memory", 2 * GI, [1])])])  # fmt: skip
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (4,), timeout=5)
        kubelet.add_pod("web", "big", [("big", {}, [], [("memory", 3 * GI, [1])])])
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (2,), timeout=5)
        held = {d.ID: d.health for d in kubelet.devices(M1)}
        assert held["numa1-mem0006"] == held["numa1-mem0007"] == HEALTHY

        # Hugepages: a foreign pod's 1Gi page.
        kubelet.add_pod("web", "huge", [("huge", {}, [], [("hugepages-1Gi", GI, [0])])])
        await kubelet.wait_until(lambda: counts(kubelet, (H1G,)) == (1,), timeout=5)

        for namespace, name in (("web", "cache"), ("web", "big"), ("db", "pg"), ("web", "huge")):
            kubelet.remove_pod(namespace, name)
        await kubelet.wait_until(lambda: counts(kubelet, ALL) == (4, 2, 1, 7), timeout=5)
        assert await plugin.terminate() == 0


async def test_serve_withholds_memory_without_the_static_memory_manager(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = machine(tmp_path / "sys")
    async with memory_mode(tree, sock_dir, policy="None") as (kubelet, plugin):
        await kubelet.wait_until(lambda: counts(kubelet, ALL) == (0, 0, 0, 0), timeout=20)
        # CPUs are another matter: the CPU manager is static.
        cpu = ("numa-align/numa-0", "numa-align/numa-1")
        await kubelet.wait_until(lambda: counts(kubelet, cpu) == (100, 100), timeout=20)
        assert counts(kubelet, ALL) == (0, 0, 0, 0)
        assert await plugin.terminate() == 0
    warnings = [e for e in plugin.events() if "Memory Manager is not Static" in e["event"]]
    assert warnings, plugin.log()
    assert "--memory-manager-policy=Static" in warnings[0]["event"]
    assert "--reserved-memory" in warnings[0]["event"]
    # One line at the change, naming every memory resource; then at most one per
    # registration of a memory resource, naming it (a registration that came before
    # the first pod resources read, as under load, cannot know the policy yet).
    at_change = [w for w in warnings if sorted(w["resources"]) == sorted(ALL)]
    assert len(at_change) == 1, warnings
    per_registration = [w["resources"] for w in warnings if w not in at_change]
    assert all(len(names) == 1 for names in per_registration), warnings
    names = [names[0] for names in per_registration]
    assert len(names) == len(set(names)), "one line per registration"
    assert set(names) <= set(ALL)


async def test_serve_without_the_api_counts_sysfs_minus_reserved_memory(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = machine(tmp_path / "sys")
    reserved = ("--reserved-memory", "0:memory=1Gi,hugepages-1Gi=1Gi;1:memory=512Mi")
    async with memory_mode(tree, sock_dir, *reserved, api=False) as (kubelet, plugin):
        # node 0: 8 - 3 GiB of pages - 1 reserved = 4; one 1Gi page left; node 1: 7.5 -> 7.
        await kubelet.wait_until(lambda: counts(kubelet, ALL) == (4, 1, 1, 7), timeout=20)
        assert await plugin.terminate() == 0


@pytest.mark.parametrize(
    ("flags", "fault"),
    [
        (["--memory-unit", "1.5Gi"], "'1.5Gi' is not a memory quantity"),
        (["--memory-unit", "512Ki"], "below the floor of 1Mi"),
        (["--memory-unit", "1Gi", "--reserved-memory", "0memory=1Gi"], "'0memory=1Gi'"),
        (["--memory-unit", "1Gi", "--reserved-memory", ";"], "reserves nothing"),
        (["--reserved-memory", "0:memory=1Gi"], "only applies with --memory-unit"),
        (["--memory-unit", "1Mi"], "16384 memory devices"),
    ],
)
def test_bad_memory_flags_exit_2(
    flags: list[str],
    fault: str,
    tmp_path: Path,
    sock_dir: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bounded_serve(monkeypatch)  # the device cap is found at discovery, inside serve
    tree = machine(tmp_path / "sys")
    tree.node(1, "2-3", distance="20 10", mem_kb=16 << 20)  # 16384 MiB
    folder = sock_dir / "dp"
    argv = ["serve", "--sysfs-root", str(tree.root), "--socket-dir", str(folder), *flags]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Usage:" in err
    assert fault in err


def test_status_shows_free_units_per_type_and_flags_miscounted_memory(tmp_path: Path) -> None:

    tree = machine(tmp_path)
    config = config_from_params({"sysfs_root": tree.root, "memory_unit": GI,
                                 "socket_dir": tmp_path / "dp"})  # fmt: skip
    pods = pr_pb2.ListPodResourcesResponse()
    pod = pods.pod_resources.add(name="pg", namespace="db")
    good = pod.containers.add(name="pg", memory=[block("memory", 2 * GI, [1])])
    good.devices.add(resource_name=M1, device_ids=["numa1-mem0000", "numa1-mem0001"])
    bad = pod.containers.add(name="sidecar", memory=[block("memory", 3 * GI, [1])])
    bad.devices.add(resource_name=M1, device_ids=["numa1-mem0002"])
    pods.pod_resources.add(name="web", namespace="web").containers.add(
        name="web", memory=[block("memory", GI, [1])]
    )
    allocatable = pr_pb2.AllocatableResourcesResponse()
    allocatable.memory.append(block("memory", 7 * GI, [1]))
    allocatable.devices.add(resource_name=M1, device_ids=["numa1-mem0000"])
    document = build_status(discover(config), config, pods, allocatable)
    (entry,) = [e for e in document["memory"] if e["resource"] == M1]
    assert {k: v for k, v in entry.items() if k != "holders"} == {
        "id": 1, "resource": M1, "memory_type": "memory", "unit": GI, "capacity": 8,
        "allocatable": 1, "allocated": 3, "allocatable_bytes": 7 * GI,
        "assigned_bytes": {"ours": 5 * GI, "others": GI}, "free_units": 1,
    }  # fmt: skip
    assert [h["problem"] is None for h in entry["holders"]] == [True, False]
    assert document["miscounted"] == 1
    assert document["memory_manager_static"] is True
    text = render_table(document)
    assert (
        f"NUMA node 1 memory ({M1}, unit 1Gi): capacity 8, allocatable 1, allocated 3, "
        "free units 1 (allocatable 7Gi, assigned ours 5Gi, others 1Gi)"
    ) in text
    assert "db/pg sidecar: 1 device(s), 3Gi, MISCOUNTED: 1 device(s) for" in text
    assert "db/pg pg: 2 device(s), 2Gi, counted" in text


def test_assigned_memory_reaches_its_metric(tmp_path: Path) -> None:
    from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder

    seen = view({1: {"memory": 7 * GI}}, [
        ({M1: ["numa1-mem0000"]}, [block("memory", GI, [1])]),
        ({"vendor/gpu": ["g0"]}, [block("memory", 2 * GI, [1])]),  # another plugin's holder
    ])  # fmt: skip
    recorder = PrometheusRecorder()
    recorder.capacity([], seen.memory, assigned_memory(seen, [M1]))
    text = recorder.render().decode()
    name = "numa_node_assigned_memory_bytes"
    assert (
        f'{name}{{holder="numa-align",memory_type="memory",numa_node="1"}} 1.073741824e+09' in text
    )
    assert f'{name}{{holder="other",memory_type="memory",numa_node="1"}} 2.147483648e+09' in text


@pytest.mark.parametrize(
    ("flags", "counting"),
    [
        ((), "counting each NUMA node's usable CPUs minus --reserved-cpus and skipping the "
         "CPU manager check until it can"),
        (("--memory-unit", "256Mi"), "counting each NUMA node's usable CPUs minus "
         "--reserved-cpus and its memory per sysfs minus --reserved-memory, and skipping the "
         "CPU and Memory Manager checks until it can"),
    ],
)  # fmt: skip
async def test_the_start_warning_without_pod_resources_says_what_is_counted(
    two_nodes: SysfsTree, sock_dir: Path, flags: tuple[str, ...], counting: str
) -> None:
    """Memory counted from sysfs too: the warning names it, not only the CPUs."""
    absent = sock_dir / "no-pod-resources.sock"
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(two_nodes, sock_dir, "--pod-resources-socket", str(absent), *flags) as plugin,
    ):
        await kubelet.wait_until(lambda: kubelet.live("numa-align/numa-1"), timeout=20)
        await eventually(
            lambda: any("cannot be read" in e["event"] for e in plugin.events()), timeout=20
        )
        assert await plugin.terminate() == 0
    said = [e["event"] for e in plugin.events() if "cannot be read" in e["event"]]
    assert said == [f"the kubelet's pod resources API cannot be read; {counting}"]


def test_zero_bytes_format_as_zero() -> None:
    """Mutant: the zero guard in ``format_quantity`` removed (0 became ``0Ei``)."""
    assert format_quantity(0) == "0"
    assert format_quantity(1) == "1"


@pytest.mark.parametrize(
    "text",
    ["0:memory=1Gi;;1:memory=2Gi", ";0:memory=1Gi;1:memory=2Gi", "0:memory=1Gi; ;1:memory=2Gi"],
)
def test_an_empty_reserved_memory_entry_is_skipped_not_the_end(text: str) -> None:
    """Mutant: ``continue`` -> ``break`` on an empty ``;`` entry (node 1 was lost)."""
    assert parse_reserved_memory(text) == ((0, "memory", GI), (1, "memory", 2 * GI))
