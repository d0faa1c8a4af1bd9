"""Where each resource that follows a device goes (plan_near): a table over the
selection's NUMA nodes, the advertised ones and the resource prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.plugin.advertised.discovery import discover, plan_near
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from numa_device_plugin.topology.locality import read_inventory
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Three NUMA nodes of 2 CPUs; disk S0 on node 0, S1 on node 1, an md over both."""
    tree = SysfsTree(tmp_path / "sys").cpus(6, online="0-5")
    tree.write("node/online", "0-2\n")
    for node in range(3):
        tree.node(node, f"{2 * node}-{2 * node + 1}")
    devices = DeviceTree(tree.root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:81:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:01:00.0", serial="S0")
    devices.disk("nvme1n1", "0000:81:00.0", serial="S1")
    devices.mapped("md0", ["nvme0n1", "nvme1n1"])
    return tree.root


def plans(*advertised: int) -> tuple[NodePlan, ...]:
    return tuple(
        NodePlan(NumaNode(id=i, cpus=frozenset({2 * i, 2 * i + 1})), advertised=i in advertised)
        for i in range(3)
    )


@pytest.mark.parametrize(
    ("near", "advertised", "nodes", "reason"),
    [
        ("d=serial:S1", (0, 1, 2), (1,), None),
        ("d=block:md0", (0, 1, 2), (0, 1), None),
        # Only the advertised ones among the selection's (mutant: all of them).
        ("d=block:md0", (0, 2), (0,), None),
        # None advertised: nothing, and why (mutant: no reason).
        # On a node without CPUs and no distance row: it follows none, and says so.
        (
            "d=serial:S1",
            (0, 2),
            (),
            "serial:S1: nvme1n1 is on memory-only node 1; its distance row (node1/distance) is "
            "unknown",
        ),
        ("d=serial:NONE", (0, 1, 2), (), "serial:NONE: no disk with that serial matches"),
    ],
)
def test_a_near_resource_goes_to_the_advertised_nodes_of_its_devices(
    root: Path,
    near: str,
    advertised: tuple[int, ...],
    nodes: tuple[int, ...],
    reason: str | None,
) -> None:
    config = Config(sysfs_root=root, near=(parse_near(near),))
    (plan,) = plan_near(config, plans(*advertised), read_inventory(root))
    assert plan.nodes == nodes
    if reason is None:
        assert plan.reason is None
    else:
        assert plan.reason is not None
        assert plan.reason.startswith(reason)


def test_a_near_resource_is_named_with_the_configured_prefix(root: Path) -> None:
    """Mutant: the name built with ``numa-align/`` whatever the prefix."""
    config = Config(
        sysfs_root=root, resource_prefix="example.com", near=(parse_near("d=serial:S1"),)
    )
    (plan,) = plan_near(config, plans(0, 1, 2), read_inventory(root))
    assert plan.resource == "example.com/d"
    assert "example.com/d" in discover(config).resources


@pytest.mark.parametrize(
    ("selectors", "advertised", "nodes", "reason"),
    [
        # A data disk and a NIC on the same node: there.
        (["serial:S1", "net:ib0"], (0, 1, 2), (1,), None),
        # The RAID over both nodes and the NIC on node 1: node 1 only.
        (["block:md0", "net:ib0"], (0, 1, 2), (1,), None),
        # They disagree: nothing, saying where each is.
        (["serial:S0", "net:ib0"], (0, 1, 2), (),
         "its devices are on no common NUMA node: serial:S0 on 0; net:ib0 on 1"),
        # One matches nothing: its reason.
        (["serial:S1", "net:nope"], (0, 1, 2), (), "net:nope: no network interface matches"),
        # Common to both, but not advertised.
        (["serial:S1", "net:ib0"], (0, 2), (),
         "serial:S1: nvme1n1 is on memory-only node 1; its distance row (node1/distance) is "
         "unknown"),
    ],
)  # fmt: skip
def test_several_selectors_for_one_name_go_where_all_of_them_agree(
    root: Path,
    selectors: list[str],
    advertised: tuple[int, ...],
    nodes: tuple[int, ...],
    reason: str | None,
) -> None:
    from numa_device_plugin.plugin.model.near import merge_near

    DeviceTree(root).pci("0000:82:00.0", 1, "0x020700")
    DeviceTree(root).nic("ib0", "0000:82:00.0")
    near = merge_near([parse_near(f"osd={selector}") for selector in selectors])
    (plan,) = plan_near(Config(sysfs_root=root, near=near), plans(*advertised),
                        read_inventory(root))  # fmt: skip
    assert plan.nodes == nodes
    if reason is None:
        assert plan.reason is None
    else:
        assert plan.reason is not None
        assert reason in plan.reason
