"""Capacity polling against device ids the plugin never advertised, as a confused or
hostile kubelet could list them: odd digits, huge numbers, another node's ids, other
forms. They count for nothing, each is warned about once, and the counts stay right,
at start and while serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.capacity import (
    admissible,
    foreign_devices,
    live_devices,
    live_memory_devices,
)
from numa_device_plugin.plugin.devices import CPUS, HEALTHY, device_index
from tests.plugin.test_capacity import NODE1, R1
from tests.topology.test_numamemory import ALL, GI, M1, counts, machine, memory_mode

HOSTILE = [
    "numa0-mem²",  # a digit Python's isdigit() accepts and int() refuses
    "numa1-mem" + "7" * 5000,  # over int()'s 4,300 digits
    "numa1-cpu" + "1" * 10,  # over 9 digits
    "numa1-cpu٣",  # an Arabic-Indic digit
    "numa0-cpu0004",  # another node's id
    "numa1-",
    "numa1-cpu",
    "cpu0004",
    "",
    "numa1-CPU0004",
    "numa01x-cpu0004",
    "numa1-cpu0004\n",
    "x" * 70_000,
]


@pytest.mark.parametrize(
    ("device_id", "node", "index"),
    [
        ("numa1-cpu0012", 1, 12),
        ("numa0-hp2m0003", 0, 3),
        ("numa7-hp1g0000", 7, 0),
        ("numa1-slot0099", 1, 99),
        ("numa1-mem123456789", 1, 123456789),
        *((device_id, 1, None) for device_id in HOSTILE),
    ],
)
def test_device_index_parses_only_the_plugins_own_ids(
    device_id: str, node: int, index: int | None
) -> None:
    assert device_index(device_id, node) == index


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
    from numa_device_plugin.cli.options import config_from_params
    from numa_device_plugin.plugin.discovery import discover

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
    from numa_device_plugin.cli.options import config_from_params
    from numa_device_plugin.plugin.discovery import discover

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
    assert "Traceback" not in plugin.log()
