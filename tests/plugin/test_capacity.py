"""Exact NUMA capacity (``--capacity cpus``) and the CPU manager check: the pure rules
over in-memory views, then real ``serve`` processes against the kubelet stand-in and
its pod resources API."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.build import build_resource, near_resource
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.counts.capacity import (
    live_devices,
    live_memory_devices,
    live_resource_devices,
    node_capacity,
)
from numa_device_plugin.plugin.counts.held import admissible, foreign_devices
from numa_device_plugin.plugin.counts.poller import CapacityPoller
from numa_device_plugin.plugin.model.near import Near, parse_near
from numa_device_plugin.plugin.model.recorder import NullRecorder
from numa_device_plugin.plugin.model.resources import CPUS, HEALTHY, UNHEALTHY, Resource
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan
from numa_device_plugin.topology.selectors import parse_selector
from tests.plugin.test_devices import HOSTILE
from tests.standin_helpers import (
    ServeProcess,
    bound_port,
    eventually,
    never_serve,
    serve_process,
    wait_all_live,
)
from tests.topology.test_numamemory import ALL, GI, M1, block, counts, machine, memory_mode

NODE1 = frozenset(range(4, 8))
R1 = "numa-align/numa-1"
R0 = "numa-align/numa-0"
ANY = "numa-align/any"


def ours(*ids: str, cpus: tuple[int, ...] = (), name: str = "app") -> Holder:
    return Holder("ns", name, "c", frozenset(cpus), {R1: tuple(ids)})


def foreign(*cpus: int, name: str = "other") -> Holder:
    return Holder("ns", name, "c", frozenset(cpus))


def health(view: KubeletView | None, **kwargs: object) -> dict[str, str]:
    devices = live_devices(CPUS, 1, NODE1, R1, (), view, **kwargs)  # type: ignore[arg-type]
    return {device.id.removeprefix("numa1-"): device.health[0] for device in devices}


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        # Every CPU allocatable, nobody holds any: every device Healthy.
        (
            KubeletView(frozenset(range(8))),
            {"cpu0004": "H", "cpu0005": "H", "cpu0006": "H", "cpu0007": "H"},
        ),
        # CPU 4 reserved by the kubelet: no device for it.
        (KubeletView(frozenset(range(5, 8))), {"cpu0005": "H", "cpu0006": "H", "cpu0007": "H"}),
        # A foreign Guaranteed pod has 5 and 6: two free devices turn Unhealthy, the
        # highest-numbered ones.
        (
            KubeletView(frozenset(range(8)), (foreign(5, 6),)),
            {"cpu0004": "H", "cpu0005": "H", "cpu0006": "U", "cpu0007": "U"},
        ),
        # Our pod holds cpu0007 (device) and CPU 7: it stays Healthy, 3 free remain.
        (
            KubeletView(frozenset(range(8)), (ours("numa1-cpu0007", cpus=(7,)),)),
            {"cpu0004": "H", "cpu0005": "H", "cpu0006": "H", "cpu0007": "H"},
        ),
        # Ours holds one device but got 3 CPUs; a foreign pod has the fourth: nothing
        # is free, and only the held device is Healthy.
        (
            KubeletView(frozenset(range(8)), (ours("numa1-cpu0006", cpus=(4, 5, 6)), foreign(7))),
            {"cpu0004": "U", "cpu0005": "U", "cpu0006": "H", "cpu0007": "U"},
        ),
        # Foreign CPUs on the other NUMA node change nothing here.
        (
            KubeletView(frozenset(range(8)), (foreign(0, 1, 2),)),
            {f"cpu000{c}": "H" for c in range(4, 8)},
        ),
        # A held id from an earlier slots-mode run stays listed (and Healthy).
        (
            KubeletView(frozenset(range(8)), (ours("numa1-slot0003", cpus=(4,)),)),
            {"cpu0004": "H", "cpu0005": "H", "cpu0006": "H", "cpu0007": "U", "slot0003": "H"},
        ),
        # CPU manager "none": no allocatable CPUs, nothing can be aligned.
        (KubeletView(frozenset()), {f"cpu000{c}": "U" for c in range(4, 8)}),
        # No pod resources API: usable CPUs of the node, all Healthy.
        (None, {f"cpu000{c}": "H" for c in range(4, 8)}),
    ],
)
def test_live_devices_in_cpus_mode(view: KubeletView | None, expected: dict[str, str]) -> None:
    assert health(view) == expected


def test_fallback_subtracts_reserved_cpus_and_unaligned_can_be_allowed() -> None:
    assert health(None, reserved_cpus=frozenset({4, 0})) == {
        "cpu0005": "H",
        "cpu0006": "H",
        "cpu0007": "H",
    }
    none_policy = KubeletView(frozenset())
    assert set(health(none_policy, allow_unaligned=True).values()) == {"H"}
    assert len(health(none_policy, allow_unaligned=True, reserved_cpus=frozenset({4}))) == 3


def test_slots_mode_only_follows_the_cpu_manager_check() -> None:
    base = build_resource("numa-align", 1, 3).devices
    busy = KubeletView(frozenset(range(8)), (foreign(4, 5, 6, 7),))
    assert {d.health for d in live_devices(3, 1, NODE1, R1, base, busy)} == {HEALTHY}
    none_policy = KubeletView(frozenset())
    assert {d.health for d in live_devices(3, 1, NODE1, R1, base, none_policy)} == {UNHEALTHY}
    allowed = live_devices(3, 1, NODE1, R1, base, none_policy, allow_unaligned=True)
    assert {d.health for d in allowed} == {HEALTHY}
    assert [d.id for d in allowed] == [d.id for d in base]


def test_node_capacity_figures() -> None:
    view = KubeletView(
        frozenset(range(1, 8)),
        (
            ours("numa1-cpu0004", cpus=(4, 5)),
            foreign(6),
            ours("numa1-cpu0007", cpus=(1,), name="x"),
        ),
    )
    devices = live_devices(CPUS, 1, NODE1, R1, (), view)
    figures = node_capacity(R1, 1, NODE1, devices, view)
    assert figures.allocatable_cpus == NODE1
    assert figures.assigned_ours == {4, 5}
    assert figures.assigned_other == {6}
    assert figures.held == {"numa1-cpu0004", "numa1-cpu0007"}
    assert figures.free_cpus == 1
    assert (figures.devices, figures.healthy, figures.misaligned) == (4, 3, 1)


DISK = "numa-align/data-disk"
NODE0 = frozenset(range(4))


def disk_holder(*ids: str, cpus: tuple[int, ...] = (), name: str = "es") -> Holder:
    return Holder("ns", name, "c", frozenset(cpus), {DISK: tuple(ids)})


def near_disk(nodes: tuple[int, ...]) -> Resource:
    plans = [
        NodePlan(NumaNode(id=i, cpus=NODE0 if i == 0 else NODE1), advertised=True) for i in nodes
    ]
    return near_resource("numa-align", Near("data-disk", parse_selector("serial:S1")), plans, CPUS)


def test_a_near_resource_counts_the_free_cpus_of_its_device_node_like_numa_n() -> None:
    """A pod holding numa-1 took CPUs 4-5; the near resource on node 1 has as many
    Healthy devices as node 1 has free CPUs (2), the same figure as numa-1's; a pod
    holding the near resource with CPU 6 lowers both."""
    view = KubeletView(frozenset(range(8)), (ours("numa1-cpu0004", "numa1-cpu0005", cpus=(4, 5)),))
    cpus = {0: NODE0, 1: NODE1}.__getitem__
    near = live_resource_devices(CPUS, near_disk((1,)), cpus, view)
    numa1 = live_devices(CPUS, 1, NODE1, R1, (), view)
    free_near = sum(d.health == HEALTHY for d in near)
    assert free_near == 2
    assert free_near == sum(d.health == HEALTHY for d in numa1) - 2  # numa-1 keeps its held 2
    view = KubeletView(
        view.allocatable_cpus, (*view.holders, disk_holder("numa1-cpu0006", cpus=(6,)))
    )
    near = live_resource_devices(CPUS, near_disk((1,)), cpus, view)
    assert [d.id for d in near if d.health == HEALTHY] == ["numa1-cpu0004", "numa1-cpu0006"]
    figures = node_capacity(R1, 1, NODE1, numa1, view, related=[DISK])
    assert figures.assigned_ours == {4, 5, 6}  # the near pod's CPU is ours, not other
    assert figures.held == {"numa1-cpu0004", "numa1-cpu0005"}


def test_a_near_resource_on_two_nodes_lists_each_nodes_devices_by_its_cpus() -> None:
    view = KubeletView(frozenset(range(1, 8)), (foreign(4, 5, 6, 7),))
    near = live_resource_devices(CPUS, near_disk((0, 1)), {0: NODE0, 1: NODE1}.__getitem__, view)
    assert {d.id: d.health[0] for d in near} == {
        "numa0-cpu0001": "H", "numa0-cpu0002": "H", "numa0-cpu0003": "H",
        "numa1-cpu0004": "U", "numa1-cpu0005": "U", "numa1-cpu0006": "U", "numa1-cpu0007": "U",
    }  # fmt: skip
    assert {d.node_id for d in near if d.id.startswith("numa1")} == {1}


def test_a_near_holder_whose_cpus_are_elsewhere_is_misaligned_on_its_device_node() -> None:
    view = KubeletView(frozenset(range(8)), (disk_holder("numa1-cpu0004", cpus=(0,)),))
    figures = node_capacity(R1, 1, NODE1, (), view, related=[DISK])
    assert figures.misaligned == 1
    assert node_capacity(R0, 0, NODE0, (), view, related=[DISK]).misaligned == 0


def test_held_ids_of_a_near_resource_are_foreign_only_when_on_none_of_its_nodes() -> None:
    view = KubeletView(
        frozenset(range(8)), (disk_holder("numa1-cpu0004", "numa0-cpu0001", "numa3-cpu0001"),)
    )
    assert foreign_devices(view, DISK, (0, 1)) == {"numa3-cpu0001"}
    assert foreign_devices(view, DISK, 1) == {"numa0-cpu0001", "numa3-cpu0001"}


def test_a_near_holder_counts_only_on_the_numa_node_of_the_device_it_holds() -> None:
    """Mutant: the holder of a near resource counted on every NUMA node: on node 0 its
    CPUs (all on node 1) made it misaligned."""
    view = KubeletView(frozenset(range(8)), (disk_holder("numa1-cpu0005", cpus=(5,)),))
    on_1 = node_capacity(R1, 1, NODE1, (), view, related=[DISK])
    on_0 = node_capacity(R0, 0, NODE0, (), view, related=[DISK])
    assert (on_1.misaligned, on_1.assigned_ours) == (0, frozenset({5}))
    assert (on_0.misaligned, on_0.assigned_ours) == (0, frozenset())


def test_a_slots_near_resource_lists_each_nodes_slots_once_on_that_node() -> None:
    """Mutant: in slots mode every node's base devices were put on each node."""
    plans = [NodePlan(NumaNode(id=i, cpus=NODE0 if i == 0 else NODE1), advertised=True)
             for i in (0, 1)]  # fmt: skip
    resource = near_resource("numa-align", Near("data-disk", parse_selector("serial:S1")),
                             plans, 3)  # fmt: skip
    live = live_resource_devices(3, resource, {0: NODE0, 1: NODE1}.__getitem__, None)
    assert [(d.id, d.node_id) for d in live] == [
        ("numa0-slot0000", 0), ("numa0-slot0001", 0), ("numa0-slot0002", 0),
        ("numa1-slot0000", 1), ("numa1-slot0001", 1), ("numa1-slot0002", 1),
    ]  # fmt: skip


def test_the_poller_counts_holders_of_a_near_resource_as_ours_on_its_node(
    tmp_path: Path,
) -> None:
    """Mutant: the near resources' names never passed to the count: a pod holding
    numa-align/data-disk was counted as another's."""
    from numa_device_plugin.plugin.counts.planning import node_capacities

    tree = SysfsTree(tmp_path / "sys").cpus(8, online="0-7")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-3", distance="10 21")
    tree.node(1, "4-7", distance="21 10")
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    config = config_from_params(
        {"sysfs_root": tree.root, "capacity": "cpus", "near": (parse_near("data-disk=serial:S1"),)}
    )
    catalog = Catalog(lambda resource: None)  # type: ignore[arg-type, return-value]
    discovery = discover(config)
    catalog.update(discovery)
    view = KubeletView(frozenset(range(8)), (disk_holder("numa1-cpu0005", cpus=(5,)),))
    figures = {
        f.resource: f
        for f in node_capacities(config, catalog, view, discovery.resources, lambda _: ())
    }
    assert figures[R1].assigned_ours == {5}
    assert figures[R1].assigned_other == frozenset()


# -- a real serve process ---------------------------------------------------------------------


@asynccontextmanager
async def cpus_mode(
    tree: SysfsTree,
    folder: Path,
    *flags: str,
    allocatable: range = range(1, 8),
    policy: str = "static",
) -> AsyncIterator[tuple[KubeletStandIn, ServeProcess]]:
    """The stand-in (CPU 0 reserved) with its pod resources API, and `serve --capacity
    cpus` reading it every 0.2 s."""
    standin = KubeletStandIn(
        folder / "dp",
        pod_resources_dir=folder / "pr",
        allocatable_cpus=allocatable,
        cpu_manager_policy=policy,
    )
    args = (
        "--capacity", "cpus",
        "--pod-resources-socket", str(folder / "pr" / "kubelet.sock"),
        "--pod-resources-interval", "0.2",
        *flags,
    )  # fmt: skip
    async with standin as kubelet, serve_process(tree, folder / "dp", *args) as plugin:
        yield kubelet, plugin


def healths(kubelet: KubeletStandIn, resource: str) -> dict[str, str]:
    return {d.ID: d.health for d in kubelet.devices(resource)}


async def test_healthy_devices_follow_the_free_exclusive_cpus(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with cpus_mode(two_nodes, sock_dir) as (kubelet, plugin):
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        # CPU 0 is the kubelet's: node 0 has 3 devices, node 1 four.
        await kubelet.wait_until(lambda: kubelet.allocatable(R0) == 3)
        assert sorted(healths(kubelet, R0)) == ["numa0-cpu0001", "numa0-cpu0002", "numa0-cpu0003"]
        assert kubelet.allocatable(R1) == 4

        # A Guaranteed pod without our resource takes CPUs 5 and 6.
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 2, timeout=5)
        assert healths(kubelet, R1) == {
            "numa1-cpu0004": HEALTHY,
            "numa1-cpu0005": HEALTHY,
            "numa1-cpu0006": UNHEALTHY,
            "numa1-cpu0007": UNHEALTHY,
        }
        assert kubelet.allocatable(R0) == 3, "node 0 is untouched"

        # Ours takes cpu0004 with 1 CPU (7): the held device stays Healthy, one is free.
        await kubelet.allocate(R1, ["numa1-cpu0004"])
        kubelet.add_pod("db", "pg", [("pg", {R1: ["numa1-cpu0004"]}, [7])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 2, timeout=5)
        await kubelet.wait_until(
            lambda: (
                healths(kubelet, R1)["numa1-cpu0005"] == HEALTHY
                and healths(kubelet, R1)["numa1-cpu0004"] == HEALTHY
            )
        )
        # Another foreign pod takes the last CPU: only the held device stays Healthy.
        kubelet.add_pod("web", "cache", [("cache", {}, [4])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 1, timeout=5)
        assert healths(kubelet, R1)["numa1-cpu0004"] == HEALTHY

        # They leave: every device comes back.
        kubelet.remove_pod("web", "nginx")
        kubelet.remove_pod("web", "cache")
        kubelet.remove_pod("db", "pg")
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4, timeout=5)
        assert await plugin.terminate() == 0
    changes = [e for e in plugin.events() if e["event"] == "device list changed"]
    assert changes, plugin.log()


async def test_an_allocate_brings_a_read_before_the_interval(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """The kubelet assigns a container's CPUs right after Allocate: the plugin reads
    the API again a moment later, not only at its (here 1 hour) interval."""
    async with cpus_mode(two_nodes, sock_dir, "--pod-resources-interval", "3600") as (
        kubelet,
        _,
    ):
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        kubelet.add_pod("db", "pg", [("pg", {R1: ["numa1-cpu0004", "numa1-cpu0005"]}, [])])
        await kubelet.allocate(R1, ["numa1-cpu0004", "numa1-cpu0005"])
        # The CPU manager assigns its CPUs just after Allocate; a foreign pod has one too.
        kubelet.pods[-1].containers[0].cpu_ids.extend([4, 5])
        kubelet.add_pod("web", "nginx", [("nginx", {}, [6])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 3, timeout=5)
        # Held devices, then the lowest-numbered free one (devices are not the CPUs).
        assert healths(kubelet, R1) == {
            "numa1-cpu0004": HEALTHY,
            "numa1-cpu0005": HEALTHY,
            "numa1-cpu0006": HEALTHY,
            "numa1-cpu0007": UNHEALTHY,
        }


async def test_without_the_api_reserved_cpus_are_subtracted(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    flags = (
        "--capacity", "cpus", "--reserved-cpus", "0,4",
        "--pod-resources-socket", str(sock_dir / "nowhere.sock"),
    )  # fmt: skip
    async with (
        KubeletStandIn(sock_dir / "dp") as kubelet,
        serve_process(two_nodes, sock_dir / "dp", *flags) as plugin,
    ):
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        assert sorted(healths(kubelet, R0)) == [f"numa0-cpu000{c}" for c in (1, 2, 3)]
        assert sorted(healths(kubelet, R1)) == [f"numa1-cpu000{c}" for c in (5, 6, 7)]
        assert kubelet.allocatable(R1) == 3
        response = await kubelet.allocate(R1, ["numa1-cpu0005"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}
        await kubelet.restart()  # registered again; still served from the fallback
        await wait_all_live(kubelet, [R0, R1], timeout=10)
        assert await plugin.terminate() == 0
    said = [e for e in plugin.events() if "pod resources API cannot be read" in e["event"]]
    assert len(said) == 1, "said once"


def registered_lines(plugin: ServeProcess) -> list[dict[str, Any]]:
    """The plugin's ``registered with the kubelet`` log lines."""
    return [e for e in plugin.events() if e["event"] == "registered with the kubelet"]


@pytest.mark.parametrize("capacity", ["cpus", "3"])
async def test_a_cpu_manager_without_static_policy_gets_no_healthy_device(
    two_nodes: SysfsTree, sock_dir: Path, capacity: str
) -> None:
    async with cpus_mode(two_nodes, sock_dir, "--capacity", capacity, policy="none") as (
        kubelet,
        plugin,
    ):
        await wait_all_live(kubelet, [R0, R1], timeout=20, plugin=plugin)
        await kubelet.wait_until(
            lambda: kubelet.allocatable(R0) == 0 and kubelet.allocatable(R1) == 0
        )
        assert len(kubelet.devices(R1)) == (4 if capacity == "cpus" else 3)
        await kubelet.restart()
        # As long as the start's: a loaded run (two busy loops, two sessions of two
        # workers) once left numa-1 unregistered 10 s after the restart, cause unknown;
        # the log says it if it comes again.
        await wait_all_live(kubelet, [R0, R1], timeout=20, plugin=plugin)
        assert kubelet.allocatable(R1) == 0
        # The stand-in has the lists before the plugin has Register's answer (and logs
        # it): under load a SIGTERM at once once cut the last lines off.
        # numa-0, numa-1 and, in cpus mode, any: each registered twice.
        twice = 6 if capacity == "cpus" else 4
        await eventually(lambda: len(registered_lines(plugin)) == twice, 20)
        names = {record.resource_name for record in kubelet.registrations}
        assert (ANY in names) == (capacity == "cpus")
        if capacity == "cpus":  # its list arrives on its own stream: waited for
            await kubelet.wait_until(
                lambda: len(kubelet.devices(ANY)) == 8 and kubelet.allocatable(ANY) == 0, 20
            )  # every device listed, none Healthy: withheld like the others
        assert await plugin.terminate() == 0
    warnings = [e for e in plugin.events() if "CPU manager is not static" in e["event"]]
    assert "--cpu-manager-policy=static" in warnings[0]["event"]
    assert "--allow-unaligned" in warnings[0]["event"]
    registrations = registered_lines(plugin)
    assert len(registrations) == twice
    # A line at each registration made once the API has answered (both after the
    # restart), and one when the first answer shows the policy: at least 3. Under load
    # the first read can time out (0.2 s here) before the first registrations, which
    # then cannot know the policy yet: 4 is not always reached.
    after_restart = [
        e
        for e in plugin.events()[plugin.events().index(registrations[twice // 2]) :]
        if "CPU manager is not static" in e["event"]
    ]
    assert len(after_restart) >= 2, "a line at each registration"
    assert len(warnings) >= 3


async def test_allow_unaligned_keeps_devices_healthy(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with cpus_mode(two_nodes, sock_dir, "--allow-unaligned", policy="none") as (
        kubelet,
        plugin,
    ):
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        # No exclusive CPU list under "none": the node's usable CPUs, all Healthy.
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        assert kubelet.allocatable(R0) == 4
        assert await plugin.terminate() == 0
    assert not [e for e in plugin.events() if "CPU manager is not static" in e["event"]]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--capacity", "cpus", "--reserved-cpus", "0-x"], "is not a cpulist"),
        (["--pod-resources-interval", "0"], "positive number of seconds"),
        (["--pod-resources-interval", "soon"], "not a number of seconds"),
        (["--capacity", "cpus", "--include-cpuless-nodes"], "CPU-less node"),
        (["--reserved-cpus", "0"], "only applies with --capacity cpus"),
        (["--capacity", "cores"], "not a whole number or 'cpus'"),
    ],
)
def test_bad_cpus_mode_flags_exit_2(
    args: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    sock_dir: Path,
    two_nodes: SysfsTree,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never_serve(monkeypatch)
    argv = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir)]
    assert main([*argv, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert needle in err


def test_cpus_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cli.test_cli import serve_config

    monkeypatch.setenv("NUMA_CAPACITY", "cpus")
    monkeypatch.setenv("NUMA_RESERVED_CPUS", "0,8")
    monkeypatch.setenv("NUMA_POD_RESOURCES_INTERVAL", "2.5")
    monkeypatch.setenv("NUMA_POD_RESOURCES_SOCKET", "/run/pr.sock")
    monkeypatch.setenv("NUMA_ALLOW_UNALIGNED", "true")
    monkeypatch.setenv("NUMA_SOCKET_DIR", "/var/lib/k0s/kubelet/device-plugins")
    config = serve_config([])
    assert (config.capacity, config.reserved_cpus) == ("cpus", frozenset({0, 8}))
    assert (config.pod_resources_interval, config.allow_unaligned) == (2.5, True)
    assert config.pod_resources_path == Path("/run/pr.sock")
    monkeypatch.delenv("NUMA_POD_RESOURCES_SOCKET")
    assert serve_config([]).pod_resources_path == Path(
        "/var/lib/k0s/kubelet/pod-resources/kubelet.sock"
    )


async def test_metrics_follow_the_live_count(two_nodes: SysfsTree, sock_dir: Path) -> None:
    from tests.standin_helpers import scrape

    async with cpus_mode(two_nodes, sock_dir, "--metrics-address", "127.0.0.1:0") as (
        kubelet,
        plugin,
    ):
        port = await bound_port(plugin, "metrics")
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        kubelet.add_pod("db", "bad", [("pg", {R1: ["numa1-cpu0004"]}, [1])])
        # Held cpu0004 + 2 free exclusive CPUs (5 and 6 are taken; 1 is on node 0).
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 3, timeout=5)

        def settled() -> bool:
            return 'numa_node_misaligned_containers{numa_node="1"} 1.0' in scrape(port)

        await eventually(settled, timeout=5)
        text = scrape(port)
    assert 'numa_node_allocatable_cpus{numa_node="0"} 3.0' in text
    assert 'numa_node_allocatable_cpus{numa_node="1"} 4.0' in text
    assert 'numa_node_assigned_cpus{holder="other",numa_node="1"} 2.0' in text
    assert 'numa_node_assigned_cpus{holder="numa-align",numa_node="1"} 0.0' in text
    assert 'numa_node_assigned_cpus{holder="other",numa_node="0"} 1.0' in text
    assert 'numa_device_plugin_devices{health="Healthy",resource="numa-align/numa-1"} 3.0' in text
    assert 'numa_device_plugin_devices{health="Unhealthy",resource="numa-align/numa-1"} 1.0' in text


async def test_the_poller_stops_when_cancelled_as_a_read_is_requested(sock_dir: Path) -> None:
    """Regression: with asyncio.wait_for (Python 3.11) a cancel arriving as a read was
    requested was swallowed, and stopping the plugin waited a whole interval more."""

    config = Config(
        socket_dir=sock_dir,
        pod_resources_socket=sock_dir / "nowhere.sock",
        pod_resources_interval=3600,
    )
    poller = CapacityPoller(config, Catalog(lambda resource: None), NullRecorder())  # type: ignore[arg-type, return-value]
    try:
        task = asyncio.create_task(poller.run())
        await asyncio.sleep(0)  # the poller waits for its event now
        poller.schedule.request()
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        assert task.cancelled()
    finally:
        await poller.close()


async def test_an_outage_of_the_pod_resources_api_keeps_the_last_counts(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Once the API has answered, its last answer holds while it is away (a kubelet
    restart): sysfs arithmetic would count the busy CPUs of node 1 as free. The
    metrics say the API is down and how old the counts are."""
    from tests.standin_helpers import scrape

    async with cpus_mode(two_nodes, sock_dir, "--metrics-address", "127.0.0.1:0") as (
        kubelet,
        plugin,
    ):
        port = await bound_port(plugin, "metrics")
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6, 7])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 1, timeout=5)
        await eventually(lambda: "numa_device_plugin_pod_resources_up 1.0" in scrape(port))
        before = healths(kubelet, R1)

        await kubelet.stop_pod_resources()
        await eventually(lambda: "numa_device_plugin_pod_resources_up 0.0" in scrape(port))
        await asyncio.sleep(1.0)  # five more failed reads at 0.2 s
        assert kubelet.allocatable(R1) == 1, "the outage made busy CPUs look free"
        assert healths(kubelet, R1) == before
        ages = [
            float(line.split()[-1])
            for line in scrape(port).splitlines()
            if line.startswith("numa_device_plugin_pod_resources_last_read_age_seconds ")
        ]
        assert ages, "no age series"
        assert ages[0] >= 1.0

        # It answers again, without the foreign pod: fresh counts.
        kubelet.remove_pod("web", "nginx")
        await kubelet.start_pod_resources()
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4, timeout=5)
        assert await plugin.terminate() == 0
    said = [e["event"] for e in plugin.events() if "cannot be read" in e["event"]]
    # On a loaded machine the very first read (0.2 s at most, the interval) may fail
    # too: that says the start-up line, before any answer. The outage is said once.
    outage = (
        "the kubelet's pod resources API cannot be read; keeping the counts of its last "
        "answer until it can"
    )
    assert said.count(outage) == 1, said
    assert all(e == outage or e.startswith(
        "the kubelet's pod resources API cannot be read; counting each NUMA node's") for e in said
    ), said  # fmt: skip


async def test_serve_advertises_a_near_resource_on_its_disks_node_with_node_1s_free_cpus(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """--near data-disk=serial:S1 with the disk on NUMA node 1: the resource's devices
    lie on node 1, its allocatable is node 1's free exclusive CPUs (as numa-1's), a
    foreign pod lowers both, and Allocate injects NUMA_NODE=1. A selector matching
    nothing advertises nothing and the plugin keeps serving the rest."""
    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1)
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    flags = ("--near", "data-disk=serial:S1", "--near", "gone=serial:NOPE")
    async with cpus_mode(two_nodes, sock_dir, *flags) as (kubelet, plugin):
        await wait_all_live(kubelet, [R0, R1, DISK], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(DISK) == 4)
        assert {d.ID: [n.ID for n in d.topology.nodes] for d in kubelet.devices(DISK)} == {
            f"numa1-cpu000{c}": [1] for c in range(4, 8)
        }
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        await kubelet.wait_until(
            lambda: kubelet.allocatable(DISK) == 2 and kubelet.allocatable(R1) == 2, timeout=5
        )
        response = await kubelet.allocate(DISK, ["numa1-cpu0004"])
        # The pod is told which device it is near, by the kernel's name.
        assert dict(response.container_responses[0].envs) == {
            "NUMA_NODE": "1",
            "NUMA_NEAR_DATA_DISK": "nvme0n1",
        }
        assert not kubelet.live("numa-align/gone")
        assert await plugin.terminate() == 0
    near = [e for e in plugin.events() if e["event"] == "advertising a resource near a device"]
    assert [(e["resource"], e["nodes"]) for e in near] == [(DISK, [1])]
    gone = [e for e in plugin.events() if e["event"] == "not advertising a resource near a device"]
    assert [e["reason"] for e in gone] == [
        "serial:NOPE: no disk with that serial matches on this node"
    ]


async def test_a_silent_pod_resources_api_does_not_hold_up_registration(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Mutation: the first read at start-up waits max(interval, POLL_TIMEOUT) instead of
    min. A pod resources socket that accepts and never answers, a 3600 s interval:
    the resources still register within seconds (the read gives up after 2 s)."""
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(sock_dir / "silent.sock"))
    silent.listen()
    flags = (
        "--capacity", "cpus",
        "--pod-resources-socket", str(sock_dir / "silent.sock"),
        "--pod-resources-interval", "3600",
    )  # fmt: skip
    try:
        async with (
            KubeletStandIn(sock_dir / "dp") as kubelet,
            serve_process(two_nodes, sock_dir / "dp", *flags),
        ):
            await wait_all_live(kubelet, [R0, R1], timeout=20)
    finally:
        silent.close()


@pytest.mark.parametrize("device_id", HOSTILE)
def test_a_foreign_held_id_counts_for_nothing_in_cpus_mode(device_id: str) -> None:
    holders = (Holder("ns", "evil", "c", frozenset({5}), {R1: (device_id,)}),)
    view = KubeletView(frozenset(range(8)), holders)
    devices = live_devices(CPUS, 1, NODE1, R1, (), view)
    assert [d.id for d in devices] == [f"numa1-cpu000{c}" for c in range(4, 8)]
    # CPU 5 is taken by that container: 3 of the 4 are free.
    assert sum(d.health == HEALTHY for d in devices) == 3
    assert foreign_devices(view, R1, 1) == {device_id}


@pytest.mark.parametrize("device_id", HOSTILE)
def test_a_foreign_held_id_counts_for_nothing_for_memory(device_id: str, tmp_path: Path) -> None:

    tree = machine(tmp_path / "sys")
    config = config_from_params({"sysfs_root": tree.root, "memory_unit": GI})
    resource = discover(config).resources[M1]
    holders = (Holder("ns", "evil", "c", frozenset(), {M1: (device_id,)}, {(1, "memory"): GI}),)
    view = KubeletView(
        frozenset(range(4)), holders, {1: {"memory": 7 * GI}}, assigned_memory={1: {"memory": GI}}
    )
    devices = live_memory_devices(resource, view)
    assert len(devices) == len(resource.devices)
    assert sum(d.health == HEALTHY for d in devices) == 6  # (7 - 1) GiB over 1 GiB


def test_held_ids_of_cpus_the_node_does_not_have_add_no_device() -> None:
    """50,004 devices were once advertised for a 4-CPU node (over the 10,000 cap; at
    180,000 ids ListAndWatch passed 4 MiB and the plugin re-registered in a loop)."""
    ids = tuple(f"numa1-cpu{cpu:04d}" for cpu in range(100, 50_100))
    view = KubeletView(frozenset(range(8)), (Holder("ns", "evil", "c", frozenset({5}), {R1: ids}),))
    devices = live_devices(CPUS, 1, NODE1, R1, (), view)
    assert [d.id for d in devices] == [f"numa1-cpu000{c}" for c in range(4, 8)]
    assert len(foreign_devices(view, R1, 1, {1: admissible(CPUS, None, 1, NODE1)})) == 50_000


def test_slot_ids_held_in_cpus_mode_count_at_most_one_per_cpu() -> None:
    """Slot ids of an earlier slots-mode run stay listed for the pods holding them,
    but never more of them than the node has CPUs (104 devices on 4 CPUs once)."""
    ids = tuple(f"numa1-slot{index:04d}" for index in range(100))
    view = KubeletView(frozenset(range(8)), (Holder("ns", "old", "c", frozenset({5}), {R1: ids}),))
    devices = live_devices(CPUS, 1, NODE1, R1, (), view)
    assert [d.id for d in devices if "slot" in d.id] == [f"numa1-slot000{i}" for i in range(4)]
    assert len(devices) == 2 * len(NODE1)


@pytest.mark.parametrize(
    "device_id", ["numa1-mem10000", "numa1-mem999999999", "numa1-hp2m0001", "numa1-cpu0001"]
)
def test_a_held_id_of_another_kind_or_past_the_pool_cap_adds_no_memory_device(
    device_id: str, tmp_path: Path
) -> None:

    tree = machine(tmp_path / "sys")
    config = config_from_params({"sysfs_root": tree.root, "memory_unit": GI})
    resource = discover(config).resources[M1]
    holders = (Holder("ns", "evil", "c", frozenset(), {M1: (device_id,)}),)
    view = KubeletView(frozenset(range(4)), holders, {1: {"memory": 7 * GI}})
    assert len(live_memory_devices(resource, view)) == len(resource.devices)
    ours = {1: admissible(CPUS, resource, 1, frozenset())}
    assert foreign_devices(view, M1, 1, ours) == {device_id}


async def test_serve_with_a_foreign_id_at_start_and_later_keeps_counting(
    tmp_path: Path, sock_dir: Path
) -> None:
    """The id already listed when the plugin starts (once a traceback and exit 1), then
    a second one while serving (once a frozen device list): the counts follow the
    memory as without them, and each id is warned about once."""
    tree = machine(tmp_path / "sys")
    early: list[Any] = [("a", {M1: ["numa0-mem²"]}, [], [])]
    async with memory_mode(tree, sock_dir, pods={("evil", "a"): early}) as (kubelet, plugin):
        await kubelet.wait_until(lambda: counts(kubelet, ALL) == (4, 2, 1, 7), timeout=20)
        huge = "numa1-mem" + "7" * 5000
        kubelet.add_pod("evil", "b", [("b", {M1: [huge]}, [], [("memory", 3 * GI, [1])])])
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (4,), timeout=10)
        kubelet.remove_pod("evil", "b")
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (7,), timeout=10)
        kubelet.add_pod("evil", "b", [("b", {M1: [huge]}, [], [("memory", 3 * GI, [1])])])
        await kubelet.wait_until(lambda: counts(kubelet, (M1,)) == (4,), timeout=10)
        assert await plugin.terminate() == 0
    warned = [
        event["device_id"]
        for event in plugin.events()
        if event["event"].startswith("the kubelet lists a device id this plugin never")
    ]
    assert warned == ["numa0-mem²", huge[:80]], "one warning per id"
    assert not plugin.tracebacks(), "\n".join(plugin.tracebacks())


def test_over_assigned_memory_leaves_only_the_held_devices_healthy(tmp_path: Path) -> None:
    """The clamp of free units (``max(0, ...)``) was an equivalent mutant: a negative
    free count already meant none free. It is gone; this pins the rule it stood for."""
    from numa_device_plugin.plugin.counts.capacity import live_memory_devices
    from tests.topology.test_numamemory import healthy, memory_resource, view

    resource = memory_resource(tmp_path)
    held = {M1: ["numa1-mem0003"]}
    over = view({1: {"memory": 2 * GI}}, [(held, [block("memory", 5 * GI, [1])])])
    assert healthy(live_memory_devices(resource, over)) == ["numa1-mem0003"]
