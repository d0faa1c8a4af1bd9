"""Resource names as the kubelet validates them, and stable device ids."""

from __future__ import annotations

import re

import pytest

from numa_device_plugin.plugin.advertised.build import build_resources
from numa_device_plugin.plugin.model.ids import device_index, socket_name
from numa_device_plugin.plugin.model.names import (
    validate_extended_resource_name,
    validate_resource_prefix,
)
from numa_device_plugin.plugin.model.near import MAX_NEAR, Near, check_near, parse_near
from numa_device_plugin.plugin.model.resources import MAX_DEVICE_ID_LENGTH
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan
from numa_device_plugin.topology.selectors import parse_selector


def plans(*ids: int, skip: tuple[int, ...] = ()) -> tuple[NodePlan, ...]:
    return tuple(
        NodePlan(NumaNode(id=i, cpus=frozenset({i})), advertised=i not in skip) for i in ids
    )


@pytest.mark.parametrize(
    "name",
    ["numa-align/numa-0", "example.com/numa-73", "a/b", "numa.example.io/Numa_1.x"],
)
def test_valid_extended_resource_names(name: str) -> None:
    validate_extended_resource_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("numa-0", "no domain"),
        ("kubernetes.io/numa-0", "kubernetes.io"),
        ("sub.kubernetes.io/numa-0", "kubernetes.io"),
        ("requests.numa/numa-0", "requests."),
        ("Numa-Align/numa-0", "DNS subdomain"),
        ("numa_align/numa-0", "DNS subdomain"),
        ("numa-align/numa-0/x", "more than one"),
        ("numa-align/-numa", "name part"),
        ("numa-align/" + "n" * 64, "name part"),
        ("a" * 250 + "/x", "DNS subdomain"),
        ("/numa-0", "DNS subdomain"),
        ("numa-align/", "name part"),
    ],
)
def test_invalid_extended_resource_names(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        validate_extended_resource_name(name)


def test_prefix_validation() -> None:
    assert validate_resource_prefix("numa.example.com") == "numa.example.com"
    with pytest.raises(ValueError, match="DNS subdomain"):
        validate_resource_prefix("Bad_Prefix")


def test_one_resource_per_advertised_node_in_id_order() -> None:
    resources = build_resources(plans(33, 0, 4, skip=(4,)), capacity=3)
    assert list(resources) == ["numa-align/numa-0", "numa-align/numa-33"]
    resource = resources["numa-align/numa-33"]
    assert resource.node_id == 33
    assert [d.id for d in resource.devices] == [
        "numa33-slot0000",
        "numa33-slot0001",
        "numa33-slot0002",
    ]
    assert {d.node_id for d in resource.devices} == {33}
    assert {d.health for d in resource.devices} == {"Healthy"}
    assert resource.socket_name == "numa-align_numa-33.sock"


def test_device_ids_are_stable_unique_and_short() -> None:
    first = build_resources(plans(0, 1023), capacity=10_000)
    second = build_resources(plans(0, 1023), capacity=10_000)
    assert first == second
    ids = [d.id for r in first.values() for d in r.devices]
    assert len(ids) == len(set(ids)) == 20_000
    assert max(map(len, ids)) <= MAX_DEVICE_ID_LENGTH


def test_custom_prefix() -> None:
    resources = build_resources(plans(1), prefix="numa.example.com", capacity=1)
    assert list(resources) == ["numa.example.com/numa-1"]
    assert socket_name("numa.example.com/numa-1") == "numa.example.com_numa-1.sock"


@pytest.mark.parametrize("capacity", [0, -1, 10_001])
def test_capacity_bounds(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        build_resources(plans(0), capacity=capacity)


def near(name: str = "data-disk", selector: str = "serial:S1") -> Near:
    return Near(name, parse_selector(selector))


def test_a_near_resource_has_slots_on_each_covered_numa_node_with_their_ids() -> None:
    resources = build_resources(plans(0, 1, 2), capacity=2, near=[(near(), frozenset({1, 2}))])
    resource = resources["numa-align/data-disk"]
    assert [(d.id, d.node_id) for d in resource.devices] == [
        ("numa1-slot0000", 1),
        ("numa1-slot0001", 1),
        ("numa2-slot0000", 2),
        ("numa2-slot0001", 2),
    ]
    assert resource.node_ids == (1, 2)
    assert resource.node_id == 1  # the first of them (mutant: the last)
    assert resource.near == near()
    assert list(resources)[-1] == "numa-align/data-disk"  # after the NUMA nodes'


def test_a_near_resource_in_cpus_mode_has_one_device_per_cpu_of_its_node() -> None:
    node = NumaNode(id=1, cpus=frozenset({4, 5, 6, 7}))
    resources = build_resources(
        [NodePlan(node, advertised=True)],
        capacity="cpus",
        reserved_cpus=frozenset({4}),
        near=[(near(), frozenset({1}))],
    )
    assert [d.id for d in resources["numa-align/data-disk"].devices] == [
        "numa1-cpu0005",
        "numa1-cpu0006",
        "numa1-cpu0007",
    ]


def test_near_device_ids_are_the_same_in_every_build() -> None:
    """The kubelet re-admits running pods by the ids it recorded."""
    first = build_resources(plans(0, 1), near=[(near(), frozenset({1}))])
    assert first == build_resources(plans(0, 1), near=[(near(), frozenset({1}))])


def test_a_near_resource_on_no_advertised_node_is_not_built() -> None:
    """Never a fallback to some other NUMA node."""
    resources = build_resources(plans(0, 1, skip=(1,)), near=[(near(), frozenset({1}))])
    assert "numa-align/data-disk" not in resources
    assert "numa-align/data-disk" not in build_resources(plans(0), near=[(near(), frozenset())])


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("data-disk", "is not NAME=SELECTOR"),
        ("=serial:S1", "is not NAME=SELECTOR"),
        ("numa-1=serial:S1", "collide with the NUMA-node resources"),
        ("numa-0-memory=serial:S1", "collide"),
        ("any=serial:S1", "would collide with the resource any"),
        ("any-memory=serial:S1", "would collide with the resource any"),
        ("any-hugepages-2mi=serial:S1", "would collide with the resource any"),
        ("x/y=serial:S1", "without the prefix"),
        ("-disk=serial:S1", "name part"),
        ("disk=sn:S1", "is not a selector"),
        ("d" * 64 + "=serial:S1", "name part"),
    ],
)
def test_parse_near_refuses_with_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_near(text)


@pytest.mark.parametrize("name", ["any-nic", "anything", "many", "any-memory-disk"])
def test_names_that_only_begin_like_any_are_a_near_resources_own(name: str) -> None:
    assert parse_near(f"{name}=serial:S1").name == name


def test_parse_near() -> None:
    assert parse_near("data-disk = serial:S1") == near()
    assert str(parse_near("nic=net:ens1f0")) == "nic=net:ens1f0"


def test_check_near_refuses_a_name_given_twice() -> None:
    with pytest.raises(ValueError, match="given twice"):
        check_near("numa-align", [near(), near(selector="serial:S2")])


def test_check_near_refuses_more_than_max_near() -> None:
    """Each is a server, a socket and a registration: a file of thousands would exhaust
    the node's descriptors."""
    many = [near(f"d{i}", f"serial:S{i}") for i in range(MAX_NEAR + 1)]
    check_near("numa-align", many[:MAX_NEAR])
    with pytest.raises(ValueError, match=f"at most {MAX_NEAR}"):
        check_near("numa-align", many)


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


def test_a_name_given_again_adds_a_selector_that_must_agree() -> None:
    from numa_device_plugin.plugin.model.near import merge_near

    given = [parse_near(t) for t in ("osd=path:/var/lib/ceph", "nic=net:ib0", "osd=net:ens1",
                                     "osd=path:/var/lib/ceph")]  # fmt: skip
    merged = merge_near(given)
    assert [str(n) for n in merged] == ["osd=path:/var/lib/ceph & net:ens1", "nic=net:ib0"]
    assert merged[0].flags() == ["osd=path:/var/lib/ceph", "osd=net:ens1"]
    assert merge_near([parse_near(f) for f in merged[0].flags()]) == merged[:1]


def test_check_near_refuses_more_selectors_for_one_name_than_max_all_of() -> None:
    from numa_device_plugin.plugin.model.near import MAX_ALL_OF, merge_near

    many = merge_near([parse_near(f"d=block:sd{i}") for i in range(MAX_ALL_OF + 1)])
    with pytest.raises(ValueError, match=f"{MAX_ALL_OF + 1} selectors, at most {MAX_ALL_OF}"):
        check_near("numa-align", many)


def test_near_names_become_variables_and_two_that_would_collide_are_refused() -> None:
    from numa_device_plugin.plugin.model.near import near_env

    assert near_env("data-disk") == "NUMA_NEAR_DATA_DISK"
    assert near_env("nic.0") == "NUMA_NEAR_NIC_0"
    with pytest.raises(ValueError, match="would both set NUMA_NEAR_DATA_DISK"):
        check_near(
            "numa-align", [parse_near("data-disk=serial:A"), parse_near("data_disk=serial:B")]
        )
