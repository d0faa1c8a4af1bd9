"""A resource over several NUMA nodes (``numa-align/any``, a device on several nodes, their
memory) offers the free devices of one node only, the one with the most room: the rule
(pure), then over real gRPC against the kubelet stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.counts.exposure import Room, choose, expose
from numa_device_plugin.plugin.counts.pending import (
    LISTED_WITHIN,
    PENDING_SECONDS,
    Allocation,
    still_pending,
)
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.model.resources import HEALTHY, UNHEALTHY, Device
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree, build_machine
from tests.standin_helpers import eventually, past, running, wait_all_live

ANY = "numa-align/any"
GIB = 1 << 30

# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rooms", "previous", "exposed"),
    [
        ([(0, 3, 0), (1, 5, 0)], None, 1),  # the most free CPUs
        ([(0, 5, 0), (1, 5, 0)], None, 0),  # a tie: the lower id
        ([(0, 5, 1), (1, 5, 2)], None, 1),  # a tie on CPUs: more free memory
        ([(0, 5, 0), (1, 5, 0), (2, 5, 0)], 2, 2),  # kept: nobody has strictly more
        ([(0, 5, 9), (1, 5, 0)], 1, 0),  # strictly more (memory breaks the tie)
        ([(0, 4, 0), (1, 5, 0)], 0, 1),  # strictly more CPUs: switch
        ([(0, 7, 0), (1, 5, 0)], 3, 0),  # the previous node is gone
        ([(4, 0, 0)], None, 4),  # one node
        ([(0, 0, 0), (1, 0, 0)], None, 0),  # none free: still one node exposed
    ],
)  # fmt: skip
def test_the_node_with_the_most_room_is_exposed_and_kept_until_another_has_strictly_more(
    rooms: list[tuple[int, int, int]], previous: int | None, exposed: int
) -> None:
    found = choose(ANY, [Room(*room) for room in rooms], previous)
    assert found.node_id == exposed
    assert f"node {exposed}" in found.why


def test_choosing_among_no_node_is_an_error_naming_the_resource() -> None:
    with pytest.raises(ValueError, match="numa-align/any: no NUMA node"):
        choose(ANY, [], None)


def test_expose_turns_only_free_devices_of_other_nodes_unhealthy() -> None:
    devices = [
        Device("numa0-cpu0000", 0, 0), Device("numa0-cpu0001", 0, 1),
        Device("numa1-cpu0002", 1, 2), Device("numa1-cpu0003", 1, 3, UNHEALTHY),
    ]  # fmt: skip
    shown = expose(devices, 1, frozenset({"numa0-cpu0001"}))
    assert [d.health for d in shown] == [UNHEALTHY, HEALTHY, HEALTHY, UNHEALTHY]


def test_an_allocation_is_pending_until_listed_with_cpus_or_too_old() -> None:
    allocation = Allocation(ANY, frozenset({"numa1-cpu0002"}), at=100.0)
    listed_without_cpus = KubeletView(
        frozenset({2}), holders=(Holder("ns", "p", "c", frozenset(), {ANY: ("numa1-cpu0002",)}),)
    )
    listed = KubeletView(
        frozenset({2}), holders=(Holder("ns", "p", "c", frozenset({2}), {ANY: ("numa1-cpu0002",)}),)
    )
    assert still_pending([allocation], None, 100.5) == (allocation,)
    assert still_pending([allocation], listed_without_cpus, 100.5) == (allocation,)
    assert still_pending([allocation], listed, 100.5) == ()
    assert still_pending([allocation], None, 100.0 + PENDING_SECONDS) == ()
    # A read that started after the answer and lists none of the ids: the pod is gone.
    nothing = KubeletView(frozenset({2}))
    assert still_pending([allocation], nothing, 101.0, read_at=100.0 + LISTED_WITHIN) == ()
    # ... but one that started before the kubelet could list them proves nothing.
    assert still_pending([allocation], nothing, 101.0, read_at=100.1) == (allocation,)
    assert still_pending([allocation], listed_without_cpus, 101.0, read_at=101.0) == (allocation,)


# -- over gRPC -----------------------------------------------------------------------------


@asynccontextmanager
async def serving(
    root: Path, folder: Path, cpus: list[int], **settings: object
) -> AsyncIterator[tuple[KubeletStandIn, PluginManager]]:
    """The plugin in ``cpus`` mode against a stand-in whose allocatable CPUs are
    ``cpus``; reads the pod resources API every 0.1 s."""
    memory = settings.pop("allocatable_memory", None)
    settings.setdefault("pod_resources_interval", 0.1)
    config = Config(
        sysfs_root=root, socket_dir=folder / "dp", capacity="cpus",
        pod_resources_socket=folder / "pr" / "kubelet.sock",
        shutdown_grace=0.5, device_interval=0, **settings,  # type: ignore[arg-type]
    )  # fmt: skip
    standin = KubeletStandIn(folder / "dp", pod_resources_dir=folder / "pr",
                             allocatable_cpus=cpus, allocatable_memory=memory)  # type: ignore[arg-type]  # fmt: skip
    async with standin as kubelet, running(config) as manager:
        yield kubelet, manager


def healthy_by_node(kubelet: KubeletStandIn, name: str) -> dict[int, list[str]]:
    """The resource's Healthy device ids per NUMA node, as the stand-in last got them."""
    found: dict[int, list[str]] = {}
    for device in kubelet.devices(name):
        if device.health == HEALTHY:
            found.setdefault(device.topology.nodes[0].ID, []).append(device.ID)
    return found


def exposed(kubelet: KubeletStandIn, name: str = ANY) -> set[int]:
    """The NUMA nodes whose devices are Healthy (held ones aside: none are held here)."""
    return set(healthy_by_node(kubelet, name))


def cpu(node: int, number: int) -> str:
    return f"numa{node}-cpu{number:04d}"


@pytest.mark.parametrize("nodes", [2, 3, 8])
async def test_any_offers_the_free_cpus_of_the_node_with_the_most_room_only(
    tmp_path: Path, nodes: int
) -> None:
    tree = build_machine(tmp_path / "sys", nodes=nodes, cpus_per_node=4)
    async with serving(tree.root, tmp_path, list(range(nodes * 4))) as (kubelet, manager):
        names = [f"numa-align/numa-{n}" for n in range(nodes)] + [ANY]
        await wait_all_live(kubelet, names, timeout=20)
        # Every CPU of every node is listed (the list arrives on the stream: waited for).
        await kubelet.wait_until(lambda: len(kubelet.devices(ANY)) == nodes * 4)
        await kubelet.wait_until(lambda: exposed(kubelet) == {0})  # a tie: the lower id
        assert kubelet.allocatable(ANY) == 4
        # Every node but the last loses CPUs to pods that hold no device of ours:
        # node n keeps n free CPUs... the last keeps 3.
        for node in range(nodes - 1):
            taken = [node * 4 + i for i in range(4 - min(node, 2))]
            kubelet.add_pod("other", f"db-{node}", [("db", {}, taken)])
        last = nodes - 1
        kubelet.add_pod("other", "db-last", [("db", {}, [last * 4])])
        await kubelet.wait_until(lambda: exposed(kubelet) == {last}, timeout=10)
        assert kubelet.allocatable(ANY) == 3, "exactly the most room one node has"
        assert manager.poller.spanning.exposures[ANY].node_id == last
        assert f"node {last} has 3 free CPUs" in manager.poller.spanning.exposures[ANY].why
        # numa-N resources are untouched by it: each still offers its own free CPUs (their
        # lists reach the stand-in on their own streams: waited for, not asserted at once).
        await kubelet.wait_until(lambda: kubelet.allocatable(f"numa-align/numa-{last}") == 3)
        if nodes > 3:
            await kubelet.wait_until(lambda: kubelet.allocatable("numa-align/numa-2") == 2)


async def test_held_devices_stay_healthy_on_a_node_that_is_no_longer_exposed(
    tmp_path: Path,
) -> None:
    tree = build_machine(tmp_path / "sys", nodes=2, cpus_per_node=4)
    async with serving(tree.root, tmp_path, list(range(8))) as (kubelet, manager):
        await wait_all_live(kubelet, [ANY], timeout=20)
        await kubelet.wait_until(lambda: exposed(kubelet) == {0})
        # A pod of 2 CPUs lands on node 0 (the exposed node): node 1 has more room now.
        held = [cpu(0, 0), cpu(0, 1)]
        await kubelet.allocate(ANY, held)
        kubelet.add_pod("ns", "web", [("app", {ANY: held}, [0, 1])])
        await kubelet.wait_until(
            lambda: healthy_by_node(kubelet, ANY) == {0: held, 1: [cpu(1, n) for n in range(4, 8)]}
        )
        assert kubelet.allocatable(ANY) == 2 + 4, "held (2) + free on the exposed node (4)"
        assert manager.poller.spanning.switches[ANY] == 1
        kubelet.remove_pod("ns", "web")
        await kubelet.wait_until(lambda: exposed(kubelet) == {1} and kubelet.allocatable(ANY) == 4)
        assert manager.poller.spanning.exposures[ANY].node_id == 1, (
            "a tie again: no flapping back to 0"
        )
        assert manager.poller.spanning.switches[ANY] == 1


async def test_the_exposed_node_switches_at_allocate_before_any_read_of_the_pod_resources_api(
    tmp_path: Path,
) -> None:
    tree = build_machine(tmp_path / "sys", nodes=2, cpus_per_node=4)
    async with serving(tree.root, tmp_path, list(range(8)), pod_resources_interval=60.0) as (
        kubelet,
        _,
    ):
        await wait_all_live(kubelet, [ANY], timeout=20)
        await kubelet.wait_until(lambda: exposed(kubelet) == {0} and kubelet.allocatable(ANY) == 4)
        await past(1.0)  # the reads after the registrations are over; the next in 60 s
        reads = kubelet.pod_resources_calls
        seen: list[int] = []

        def switched() -> bool:
            if exposed(kubelet) != {0, 1}:
                return False
            seen.append(kubelet.pod_resources_calls)  # at the moment the update arrived
            return True

        await kubelet.allocate(ANY, [cpu(0, 0)])
        # The stand-in's List does not list it (no pod added): only Allocate tells.
        await kubelet.wait_until(switched, timeout=5)
        assert seen[0] == reads, "switched before the API was read again"
        assert healthy_by_node(kubelet, ANY) == {
            0: [cpu(0, 0)],
            1: [cpu(1, n) for n in range(4, 8)],
        }
        # The read Allocate asks for (ALLOCATE_POLL_DELAY later) lists nothing: a read
        # started that late ends the allocation; node 0 has as much room as node 1 again,
        # which stays exposed (no flapping back).
        await kubelet.wait_until(
            lambda: exposed(kubelet) == {1} and kubelet.allocatable(ANY) == 4, timeout=5
        )
        assert kubelet.pod_resources_calls > reads


async def test_a_near_resource_on_two_nodes_and_its_memory_follow_the_exposed_node(
    tmp_path: Path,
) -> None:
    tree = SysfsTree(tmp_path / "sys").cpus(8, online="0-7")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-3", mem_kb=4 * GIB // 1024)
    tree.node(1, "4-7", mem_kb=4 * GIB // 1024)
    devices = DeviceTree(tree.root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:81:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:01:00.0", serial="S0")
    devices.disk("nvme1n1", "0000:81:00.0", serial="S1")
    memory = {0: 4 * GIB, 1: 4 * GIB}
    async with serving(
        tree.root, tmp_path, list(range(8)), memory_unit=GIB, allocatable_memory=memory,
        near=(parse_near("nvme=pci-class:0108"),), any_resource="off",
    ) as (kubelet, manager):  # fmt: skip
        names = ["numa-align/nvme", "numa-align/nvme-memory"]
        await wait_all_live(kubelet, names, timeout=20)
        assert ANY not in {r.resource_name for r in kubelet.registrations}, "turned off"
        await kubelet.wait_until(lambda: exposed(kubelet, names[0]) == {0})
        await kubelet.wait_until(lambda: exposed(kubelet, names[1]) == {0})
        assert kubelet.allocatable(names[0]) == 4
        assert kubelet.allocatable(names[1]) == 4
        # Node 0 loses a CPU and 3 GiB to another pod: node 1 has the most room now.
        kubelet.add_pod("other", "db", [("db", {}, [0], [("memory", 3 * GIB, [0])])])
        await kubelet.wait_until(
            lambda: exposed(kubelet, names[0]) == {1} and exposed(kubelet, names[1]) == {1}
        )
        assert kubelet.allocatable(names[1]) == 4, "node 1's 4 GiB, not node 0's 1 GiB more"
        assert manager.poller.spanning.exposures[names[0]].node_id == 1
        # A tie on CPUs is broken by free memory: node 1 loses a CPU too, keeps its memory.
        kubelet.add_pod("other", "cache", [("c", {}, [4])])
        await asyncio.sleep(0)
        await eventually(lambda: manager.poller.spanning.exposures[names[0]].rooms[1].cpus == 3)
        assert manager.poller.spanning.exposures[names[0]].node_id == 1
        response = await kubelet.allocate(names[0], ["numa1-cpu0005"])
        assert response.container_responses[0].envs["NUMA_NODE"] == "1"
        assert response.container_responses[0].envs["NUMA_NEAR_NVME"] == "0000:81:00.0"


async def test_a_device_list_message_has_one_topology_node_per_device(tmp_path: Path) -> None:
    """TopologyInfo of every device of any names its own node, as numa-N's do."""
    tree = build_machine(tmp_path / "sys", nodes=3, cpus_per_node=2)
    async with serving(tree.root, tmp_path, list(range(6))) as (kubelet, _):
        await wait_all_live(kubelet, [ANY], timeout=20)
        await kubelet.wait_until(lambda: len(kubelet.devices(ANY)) == 6)
        listed: list[api_pb2.Device] = list(kubelet.devices(ANY))
        assert [(d.ID, [n.ID for n in d.topology.nodes]) for d in listed] == [
            (cpu(n, c), [n]) for n in range(3) for c in (2 * n, 2 * n + 1)
        ]
