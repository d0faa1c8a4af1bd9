"""A resource that follows a device, once the device is gone or has moved: kept and
reported Unhealthy, held ids of the node it left still listed (what the kubelet needs
to tell the pods that hold them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.advertised.discovery import Discovery, NearPlan
from numa_device_plugin.plugin.advertised.lost import keep_lost, with_left_behind
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.model.resources import HEALTHY, UNHEALTHY, Device, Resource
from numa_device_plugin.topology.selectors import Selection

NEAR = parse_near("data=serial:DATA")
NAME = "numa-align/data"


def near_on(node_id: int, slots: int = 2) -> Resource:
    base = build_resource("numa-align", node_id, slots)
    return Resource(NAME, node_id, base.devices, near=NEAR, near_nodes=(node_id,))


def plan(reason: str | None) -> NearPlan:
    nodes = frozenset() if reason else frozenset({1})
    return NearPlan(NEAR, NAME, Selection(nodes, reason=reason), tuple(nodes), reason)


def holding(*ids: str) -> KubeletView:
    return KubeletView(
        allocatable_cpus=frozenset({1, 2}),
        holders=(Holder("ns", "pod", "main", frozenset({2}), {NAME: ids}),),
    )


def test_a_served_resource_whose_device_is_gone_is_kept_lost_with_the_reason() -> None:
    served = {NAME: near_on(1)}
    found = Discovery(plans=(), resources={}, near=(plan("serial:DATA: no disk"),))
    kept = keep_lost(served, found).resources[NAME]
    assert kept.lost == "serial:DATA: no disk"
    assert replace(kept, lost=None) == served[NAME]


@pytest.mark.parametrize(
    ("served", "found_resources", "near", "kept"),
    [
        ({}, {}, "gone", False),  # never served: nothing to keep
        ({NAME: near_on(1)}, {}, None, False),  # no longer configured
        ({NAME: near_on(1)}, {NAME: near_on(0)}, "moved", False),  # found elsewhere: the new one
    ],
)  # fmt: skip
def test_only_a_served_and_still_configured_resource_missing_now_is_kept(
    served: dict[str, Resource], found_resources: dict[str, Resource], near: str | None,
    kept: bool,
) -> None:  # fmt: skip
    plans = () if near is None else (plan("no disk" if near == "gone" else None),)
    found = Discovery(plans=(), resources=found_resources, near=plans)
    result = keep_lost(served, found)
    assert (result is not found) is kept
    assert dict(result.resources) == found_resources


def test_a_lost_resource_lists_every_device_unhealthy() -> None:
    lost = replace(near_on(1), lost="gone")
    devices = with_left_behind(lost, lost.devices, None, frozenset({0, 1}))
    assert [d.id for d in devices] == [d.id for d in lost.devices]
    assert {d.health for d in devices} == {UNHEALTHY}


def test_ids_held_on_the_node_a_resource_left_stay_listed_unhealthy_on_that_node() -> None:
    """The disk moved from node 1 to node 0: a pod still holds numa1-slot0001; the
    kubelet would report an id missing from the list as Healthy."""
    moved = near_on(0)
    view = holding("numa1-slot0001", "junk", "numa7-slot0001")  # node 7: not on this machine
    devices = with_left_behind(moved, moved.devices, view, frozenset({0, 1}))
    assert devices[: len(moved.devices)] == moved.devices
    assert devices[len(moved.devices) :] == (Device("numa1-slot0001", 1, 1, UNHEALTHY),)
    assert {d.health for d in moved.devices} == {HEALTHY}


def test_a_resource_of_a_numa_node_is_left_as_it_is() -> None:
    plain = build_resource("numa-align", 1, 2)
    view = KubeletView(
        allocatable_cpus=frozenset({1}),
        holders=(Holder("ns", "pod", "main", frozenset({1}), {plain.name: ("numa0-slot0000",)}),),
    )  # fmt: skip
    assert with_left_behind(plain, plain.devices, view, frozenset({0, 1})) == plain.devices


def test_the_memory_of_a_lost_resource_is_kept_lost_too() -> None:
    """data-memory (--memory-unit) follows data's device: it goes Unhealthy with it."""
    memory = replace(near_on(1), name=f"{NAME}-memory")
    served = {NAME: near_on(1), memory.name: memory}
    found = Discovery(plans=(), resources={}, near=(plan("gone"),))
    kept = keep_lost(served, found).resources
    assert {name: r.lost for name, r in kept.items()} == {NAME: "gone", memory.name: "gone"}


def test_a_hostile_kubelet_naming_many_held_ids_gets_a_bounded_list() -> None:
    from numa_device_plugin.plugin.advertised.lost import MAX_LEFT_BEHIND

    moved = near_on(0)
    many = holding(*(f"numa1-slot{i:05d}" for i in range(MAX_LEFT_BEHIND * 3)))
    devices = with_left_behind(moved, moved.devices, many, frozenset({0, 1}))
    assert len(devices) == len(moved.devices) + MAX_LEFT_BEHIND


def test_an_id_held_where_the_resource_left_is_listed_unhealthy_and_not_counted_foreign() -> None:
    """The poller's plan: numa1-slot0001, held by a pod on the node a near resource
    left, is in its list (Unhealthy) and so is no id the kubelet made up."""
    from numa_device_plugin.plugin.counts.planning import plan as poller_plan
    from numa_device_plugin.plugin.serving.catalog import Catalog
    from numa_device_plugin.plugin.settings.config import Config
    from numa_device_plugin.topology.numa import NumaNode
    from numa_device_plugin.topology.plan import NodePlan

    moved = near_on(0)
    plans = tuple(NodePlan(NumaNode(id=i, cpus=frozenset({i})), advertised=True) for i in (0, 1))
    catalog = Catalog(lambda resource: None)  # type: ignore[arg-type, return-value]
    catalog.update(Discovery(plans=plans, resources={NAME: moved}))
    view = holding("numa1-slot0001", "junk")
    devices, foreign = poller_plan(Config(), catalog, view, {NAME: moved}).lists[NAME]
    assert Device("numa1-slot0001", 1, 1, UNHEALTHY) in devices
    assert foreign == {"junk"}


def test_a_lost_resource_whose_reason_text_changes_keeps_the_servicer_its_server_holds() -> None:
    """The device watch registers nothing again for a new reason's text; the catalog
    must then keep the servicer the running server holds (a new one would get the
    poller's device lists while the kubelet's stream stays on the old one)."""
    from numa_device_plugin.plugin.lifecycle.devicewatch import changed
    from numa_device_plugin.plugin.serving.catalog import Catalog

    made: list[Resource] = []

    def make(resource: Resource) -> object:
        made.append(resource)
        return object()

    catalog = Catalog(make)  # type: ignore[arg-type]
    lost = replace(near_on(1), lost="path:/x: malformed mount table: line 3")
    catalog.update(Discovery(plans=(), resources={NAME: lost}))
    first = catalog.servicers[NAME]
    moved = replace(lost, lost="path:/x: malformed mount table: line 4")
    assert changed({NAME: lost}, {NAME: moved}) == set()
    catalog.update(Discovery(plans=(), resources={NAME: moved}))
    assert catalog.servicers[NAME] is first
    assert catalog.resources[NAME].lost == "path:/x: malformed mount table: line 4"  # shown
    found = replace(lost, lost=None)  # back: served again, a new servicer for it
    assert changed({NAME: moved}, {NAME: found}) == {NAME}
    catalog.update(Discovery(plans=(), resources={NAME: found}))
    assert catalog.servicers[NAME] is not first
    assert len(made) == 2
