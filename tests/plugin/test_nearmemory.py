"""Memory that follows a device (``--memory-unit`` with ``--near``) or ``any``: the
resource's nodes' memory and hugepages under its name, counted as those nodes'; on several
NUMA nodes one part per node, offered on the node the resource exposes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from numa_device_plugin.plugin.advertised.devicememory import near_memory
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree

GIB = 1 << 30


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two NUMA nodes of 2 CPUs and 4 GiB (node 1 with 1,024 hugepages of 2 MiB); disk S0 on
    node 0, S1 on node 1, an md over both."""
    tree = SysfsTree(tmp_path / "sys").cpus(4, online="0-3")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-1", mem_kb=4 * GIB // 1024)
    tree.node(1, "2-3", mem_kb=4 * GIB // 1024, hugepages={2048: 1024})
    devices = DeviceTree(tree.root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:81:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:01:00.0", serial="S0")
    devices.disk("nvme1n1", "0000:81:00.0", serial="S1")
    devices.mapped("md0", ["nvme0n1", "nvme1n1"])
    return tree.root


def test_a_near_resource_on_one_node_gets_that_nodes_memory_and_hugepages(root: Path) -> None:
    config = Config(sysfs_root=root, memory_unit=GIB, near=(parse_near("data=serial:S1"),))
    resources = discover(config).resources
    memory = resources["numa-align/data-memory"]
    same = resources["numa-align/numa-1-memory"]
    assert memory.memory == same.memory  # the same pool: counted live as node 1's
    assert memory.devices == same.devices
    assert memory.node_ids == (1,)
    assert memory.near == resources["numa-align/data"].near
    assert memory.near_devices == ((1, ("nvme1n1",)),)  # Allocate names the disk
    assert resources["numa-align/data-hugepages-2mi"].memory == (
        resources["numa-align/numa-1-hugepages-2mi"].memory
    )
    assert "numa-align/data-hugepages-2mi" in resources
    assert not any(n.startswith("numa-align/data-") and "numa-0" in n for n in resources)


def test_a_near_resource_on_two_nodes_gets_a_memory_resource_of_one_part_per_node(
    root: Path,
) -> None:
    config = Config(sysfs_root=root, memory_unit=GIB, near=(parse_near("data=block:md0"),))
    resources = discover(config).resources
    memory = resources["numa-align/data-memory"]
    assert memory.node_ids == (0, 1)
    assert memory.spans
    assert memory.follows == "numa-align/data"
    assert [part.memory for part in memory.parts] == [
        resources["numa-align/numa-0-memory"].memory,
        resources["numa-align/numa-1-memory"].memory,
    ]
    assert memory.devices == (
        resources["numa-align/numa-0-memory"].devices
        + resources["numa-align/numa-1-memory"].devices
    )
    hugepages = resources["numa-align/data-hugepages-2mi"]  # only node 1 has them
    assert hugepages.node_ids == (1,)
    assert not hugepages.parts
    assert not hugepages.spans


def test_any_gets_memory_over_every_node_in_cpus_mode_and_none_with_slots(root: Path) -> None:
    cpus = discover(Config(sysfs_root=root, memory_unit=GIB, capacity="cpus")).resources
    assert cpus["numa-align/any"].node_ids == (0, 1)
    assert cpus["numa-align/any"].anywhere
    assert cpus["numa-align/any"].devices == (
        cpus["numa-align/numa-0"].devices + cpus["numa-align/numa-1"].devices
    )
    assert cpus["numa-align/any-memory"].node_ids == (0, 1)
    assert cpus["numa-align/any-memory"].follows == "numa-align/any"
    assert cpus["numa-align/any-hugepages-2mi"].node_ids == (1,)
    off = Config(sysfs_root=root, memory_unit=GIB, capacity="cpus", any_resource="off")
    assert not [name for name in discover(off).resources if "/any" in name]
    slots = discover(Config(sysfs_root=root, memory_unit=GIB)).resources
    assert not [name for name in slots if "/any" in name]


@pytest.mark.parametrize(
    ("near", "memory_unit", "absent"),
    [
        ("data=serial:S1", None, "numa-align/data-memory"),  # no --memory-unit
        ("data=serial:NONE", GIB, "numa-align/data-memory"),  # not advertised
    ],
)  # fmt: skip
def test_no_memory_follows_a_device_without_a_unit_or_not_advertised(
    root: Path, near: str, memory_unit: int | None, absent: str
) -> None:
    config = Config(sysfs_root=root, memory_unit=memory_unit, near=(parse_near(near),))
    assert absent not in discover(config).resources


def test_a_memory_name_taken_by_another_resource_is_left_out(root: Path) -> None:
    """near names data and data-memory: data's memory would be named like the other."""
    config = Config(
        sysfs_root=root, memory_unit=GIB,
        near=(parse_near("data=serial:S1"), parse_near("data-memory=serial:S0")),
    )  # fmt: skip
    resources = discover(config).resources
    assert resources["numa-align/data-memory"].node_ids == (0,)  # the near resource's own
    assert resources["numa-align/data-memory"].memory is None


def test_an_invalid_memory_name_is_left_out(root: Path) -> None:
    config = Config(sysfs_root=root, memory_unit=GIB, near=(parse_near("data=serial:S1"),))
    resources = {
        name: resource
        for name, resource in discover(config).resources.items()
        if resource.near is None or name == "numa-align/data"
    }
    long_name = "numa-align/" + "d" * 60  # + "-memory": over the 63 characters of a name
    resources[long_name] = replace(resources["numa-align/data"], name=long_name)
    assert set(near_memory(resources)) == {
        "numa-align/data-memory", "numa-align/data-hugepages-2mi"
    }  # fmt: skip
