"""Selectors naming a device, and what each selects: a table per form, the -1 case,
several NUMA nodes, and values that are refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import DeviceTree
from numa_device_plugin.topology.locality import Inventory, read_inventory
from numa_device_plugin.topology.mounts import MountTable, read_mount_table
from numa_device_plugin.topology.selectors import (
    MAX_NAMED,
    Selector,
    id_matches,
    parse_selector,
    select,
)


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    """NVMe on node 0 and on node 1 (each with a serial and a wwid), a NIC and a GPU on
    node 1, a SATA disk and a NIC without proximity, an md over both NVMe, a bond over
    both NICs."""
    tree = DeviceTree(tmp_path_factory.mktemp("sysfs"))
    tree.pci("0000:00:01.0", 0, "0x010802")
    tree.pci("0000:41:00.0", 1, "0x010802")
    tree.pci("0000:41:01.0", 1, "0x020000", "0x15b3", "0x1017")
    tree.pci("0000:42:00.0", 1, "0x030200", "0x10de", "0x20b0")
    tree.pci("0000:00:1f.2", -1, "0x010601", "0x8086", "0xa182")
    tree.pci("0000:00:03.0", -1, "0x020000", "0x8086", "0x1533")
    tree.disk("nvme0n1", "0000:00:01.0", serial="S0", wwid="eui.0000", partitions=1)
    tree.disk("nvme1n1", "0000:41:00.0", serial="S1", wwid="eui.1111", partitions=1)
    tree.disk("sda", "0000:00:1f.2", serial="SATA")
    tree.mapped("md0", ["nvme0n1p1", "nvme1n1p1"])
    tree.nic("ens1", "0000:41:01.0")
    tree.nic("eno1", "0000:00:03.0")
    tree.nic("bond0", None, ("ens1",))
    tree.nic("lo", None)
    return read_inventory(tree.root)


@pytest.mark.parametrize(
    ("selector", "nodes", "matched"),
    [
        ("block:nvme1n1", {1}, ["nvme1n1"]),
        ("block:nvme1n1p1", {1}, ["nvme1n1p1"]),
        ("block:md0", {0, 1}, ["md0"]),
        ("serial:S1", {1}, ["nvme1n1"]),
        ("serial:S0", {0}, ["nvme0n1"]),
        ("wwid:eui.1111", {1}, ["nvme1n1"]),
        ("serial:S*", {0, 1}, ["nvme0n1", "nvme1n1", "sda"]),  # sda (SATA) adds no node
        ("serial:S?", {0, 1}, ["nvme0n1", "nvme1n1"]),
        ("serial:S[1-9]", {1}, ["nvme1n1"]),
        ("wwid:eui.0*", {0}, ["nvme0n1"]),
        ("net:ens1", {1}, ["ens1"]),
        ("net:bond0", {1}, ["bond0"]),
        ("pci:0000:42:00.0", {1}, ["0000:42:00.0 (3D controller)"]),
        ("pci:0000:42:00.0".upper().replace("PCI", "pci"), {1}, ["0000:42:00.0 (3D controller)"]),
        ("pci-id:10de:20b0", {1}, ["0000:42:00.0 (3D controller)"]),
        ("pci-id:0x10DE:0x20B0", {1}, ["0000:42:00.0 (3D controller)"]),
        ("pci-class:0108", {0, 1}, [f"0000:{b}.0 (NVMe controller)" for b in ("00:01", "41:00")]),
        ("pci-class:0302", {1}, ["0000:42:00.0 (3D controller)"]),
        ("pci-class:02", {1}, [f"0000:{b}.0 (Ethernet controller)" for b in ("00:03", "41:01")]),
    ],
)  # fmt: skip
def test_each_selector_selects_its_devices_and_their_nodes(
    inventory: Inventory, selector: str, nodes: set[int], matched: list[str]
) -> None:
    selection = select(inventory, parse_selector(selector))
    assert selection.nodes == nodes
    assert list(selection.matched) == matched
    assert selection.reason is None


def test_devices_without_locality_add_no_node_and_are_named(inventory: Inventory) -> None:
    """pci-class:02 matches the NIC at -1 too: it adds nothing, never node 0."""
    selection = select(inventory, parse_selector("pci-class:0200"))
    assert selection.nodes == {1}
    assert selection.unlocated == ("0000:00:03.0 (Ethernet controller): numa_node -1",)


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ("block:nvme9n1", "block:nvme9n1: no block device matches on this node"),
        ("serial:NOPE", "serial:NOPE: no disk with that serial matches on this node"),
        ("serial:s*", "serial:s*: no disk with that serial matches on this node"),
        ("net:eth9", "net:eth9: no network interface matches on this node"),
        ("pci-class:0b40", "pci-class:0b40: no PCI device of that class matches on this node"),
        (
            "block:sda",
            "block:sda: no matched device has NUMA locality: sda: PCI device 0000:00:1f.2 "
            "has numa_node -1 (the firmware gave no proximity)",
        ),
        ("net:lo", "net:lo: no matched device has NUMA locality: lo: a virtual device"),
        ("pci-id:8086:1533", "pci-id:8086:1533: no matched device has NUMA locality: "
         "0000:00:03.0 (Ethernet controller): numa_node -1"),
    ],
)  # fmt: skip
def test_a_selection_without_nodes_says_why(
    inventory: Inventory, selector: str, reason: str
) -> None:
    selection = select(inventory, parse_selector(selector))
    assert selection.nodes == frozenset()
    assert selection.reason == reason


def test_serial_and_wwid_select_the_disk_not_its_partitions(inventory: Inventory) -> None:
    assert select(inventory, parse_selector("serial:S1")).count == 1
    assert select(inventory, parse_selector("serial:*")).matched == ("nvme0n1", "nvme1n1", "sda")


@pytest.mark.parametrize(
    ("found", "wanted", "matches"),
    [
        ("S3EVNX0K123", "S3EVNX0K123", True),
        ("S3EVNX0K123", "S3EVNX*", True),
        ("S3EVNX0K123", "s3evnx*", False),  # case-sensitive, as the kernel's serial
        ("S3EVNX0K123", "S3EVNX", False),  # no pattern: equal only
        ("A.B", "A?B", True),
        ("A[B", "A[B", True),  # an unclosed bracket stands for itself
        ("AXB", "A[B", False),
        (None, "*", False),  # a disk without a serial never matches, even "*"
    ],
)  # fmt: skip
def test_a_serial_is_equal_or_matches_as_a_shell_pattern(
    found: str | None, wanted: str, matches: bool
) -> None:
    assert id_matches(found, wanted) is matches


def test_a_selection_names_at_most_max_named_devices(tmp_path: Path) -> None:
    tree = DeviceTree(tmp_path)
    for index in range(MAX_NAMED + 4):
        tree.pci(f"0000:{index + 16:02x}:00.0", 1, "0x010802")
    selection = select(read_inventory(tmp_path), parse_selector("pci-class:0108"))
    assert selection.count == MAX_NAMED + 4
    assert len(selection.matched) == MAX_NAMED


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("block:nvme0n1", Selector("block", "nvme0n1")),
        (" serial:S3EVNX0K123 ", Selector("serial", "S3EVNX0K123")),
        ("pci:0000:41:00.0", Selector("pci", "0000:41:00.0")),
        ("pci:0000:4A:00.0", Selector("pci", "0000:4a:00.0")),
        ("pci:10000:01:00.0", Selector("pci", "10000:01:00.0")),  # an Intel VMD domain
        ("pci:FFFFFFFF:01:00.0", Selector("pci", "ffffffff:01:00.0")),
        ("pci-id:0x15B3:101d", Selector("pci-id", "15b3:101d")),
        ("pci-class:0x0108", Selector("pci-class", "0108")),
        ("wwid:eui.002538b471b40718", Selector("wwid", "eui.002538b471b40718")),
    ],
)
def test_parse_selector_normalises(text: str, parsed: Selector) -> None:
    assert parse_selector(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nvme0n1", "is not a selector"),
        ("disk:nvme0n1", "is not a selector"),
        ("block:", "needs a value"),
        ("block:../../etc", "not a kernel device name"),
        ("net:eth0 eth1", "not a kernel device name"),
        ("pci:41:00.0", "expected DOMAIN:BUS:DEV.FN"),
        ("pci:0000:41:00.8", "expected DOMAIN:BUS:DEV.FN"),
        ("pci:100000000:01:00.0", "expected DOMAIN:BUS:DEV.FN"),
        ("pci:000:01:00.0", "expected DOMAIN:BUS:DEV.FN"),
        ("pci-id:15b3", "expected VENDOR:DEVICE"),
        ("pci-class:1", "expected 2 to 6 hex digits"),
        ("pci-class:0108020", "expected 2 to 6 hex digits"),
        ("serial:a b", "with spaces"),
        ("serial:" + "x" * 300, "needs a value of 1 to 256"),
        ("serial:\x1b[31m", "printable"),
    ],
)
def test_parse_selector_refuses_with_the_forms(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_selector(text)


def test_a_vmd_domains_device_is_selected_by_its_address(tmp_path: Path) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("10000:01:00.0", 1, "0x010802")
    selection = select(read_inventory(tmp_path), parse_selector("pci:10000:01:00.0"))
    assert selection.nodes == {1}


def test_a_selector_missing_from_a_cut_inventory_says_it_was_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.topology import pci

    tree = DeviceTree(tmp_path)
    for index in range(4):
        tree.pci(f"0000:{index + 16:02x}:00.0", 1, "0x010802")
    monkeypatch.setattr(pci, "MAX_DEVICES", 2)
    inventory = read_inventory(tmp_path)
    missing = select(inventory, parse_selector("pci:0000:13:00.0"))
    assert missing.reason == (
        "pci:0000:13:00.0: no PCI device matches on this node (this node lists more PCI "
        "devices than are read: only the first 2 by name were, so it may be among those "
        "left out)"
    )
    assert select(inventory, parse_selector("pci:0000:10:00.0")).nodes == {1}
    assert "left out" not in (select(inventory, parse_selector("serial:X")).reason or "")


def test_a_selection_names_at_most_max_named_devices_without_locality(tmp_path: Path) -> None:
    """Mutant: the unlocated list unbounded (a class matching hundreds of devices with
    numa_node -1 named every one in logs and /debug/state)."""
    tree = DeviceTree(tmp_path)
    for index in range(MAX_NAMED + 4):
        tree.pci(f"0000:{index + 16:02x}:00.0", -1, "0x010802")
    selection = select(read_inventory(tmp_path), parse_selector("pci-class:0108"))
    assert selection.count == MAX_NAMED + 4
    assert len(selection.unlocated) == MAX_NAMED
    assert selection.reason is not None
    assert f"(and {MAX_NAMED + 3} more)" in selection.reason


@pytest.fixture
def mounted(tmp_path: Path) -> tuple[Inventory, MountTable]:
    """tests/topology/test_mounts.py's machine and table: /mnt/disks/a on nvme1n1p1 (node
    1), /mnt/disks/b on LVM over both disks, a bind mount, tmpfs and overlay."""
    from tests.topology.test_mounts import TABLE, sysfs_with_devices

    sysfs_with_devices(tmp_path / "sys")
    (tmp_path / "mountinfo").write_text(TABLE)
    root = tmp_path / "sys"
    return read_inventory(root), read_mount_table(tmp_path / "mountinfo", root)


@pytest.mark.parametrize(
    ("selector", "nodes", "matched", "reason"),
    [
        ("path:/mnt/disks/a", {1}, ["nvme1n1p1"], None),
        ("path:/mnt/disks/a/", {1}, ["nvme1n1p1"], None),
        ("path://mnt//disks/a/", {1}, ["nvme1n1p1"], None),  # normalised
        ("path:/var/lib/elasticsearch", {1}, ["nvme1n1p1"], None),  # a bind mount
        ("path:/mnt/disks/a/inner", {0}, ["nvme0n1p3"], None),  # a mount below a mount
        ("path:/mnt/disks/b", {0, 1}, ["dm-0"], None),  # LVM over disks on both nodes
        ("path:/", {0}, ["nvme0n1p2"], None),  # the root filesystem, asked for
        ("path-below:/mnt/disks/a//shard-0/data", {1}, ["nvme1n1p1"], None),  # below it
        ("path-below:/var/lib/elasticsearch/nodes", {1}, ["nvme1n1p1"], None),
        ("path-below:/mnt/disks/a/inner/x", {0}, ["nvme0n1p3"], None),  # the nearest
        ("path-below:/mnt/disks/a", {1}, ["nvme1n1p1"], None),  # at it counts too
        # below a mount, without asking for it: nothing
        ("path:/mnt/disks/a/shard-0", set(), [],
         "path:/mnt/disks/a/shard-0: nothing is mounted there: it is below xfs "
         "/dev/nvme1n1p1 at /mnt/disks/a; mount the disk at /mnt/disks/a/shard-0, or write "
         "path-below:/mnt/disks/a/shard-0 to take the disk of the mount it is below"),
        # the root filesystem is never a data disk unless asked for by path:/
        ("path:/etc", set(), [], "it is on the root filesystem (ext4 /dev/nvme0n1p2 at /)"),
        ("path-below:/etc", set(), [], "select the root disk with path:/"),
        ("path:/mnt/disks/scratch", set(), [],
         "path:/mnt/disks/scratch: on tmpfs tmpfs at /mnt/disks/scratch (0:40), which is no "
         "block device: no locality"),
        ("path:/mnt/my disk", set(), [], "on overlay overlay at /mnt/my\\040disk (0:41)"),
        # mountinfo's escapes name the same mount point, decoded once
        ("path:/mnt/my\\040disk", set(), [], "path:/mnt/my\\040disk: on overlay overlay"),
    ],
)  # fmt: skip
def test_a_path_selects_the_block_device_of_its_mount(
    mounted: tuple[Inventory, MountTable],
    selector: str,
    nodes: set[int],
    matched: list[str],
    reason: str | None,
) -> None:
    inventory, table = mounted
    selection = select(inventory, parse_selector(selector), table)
    assert selection.nodes == nodes
    assert list(selection.matched) == matched
    if reason is None:
        assert selection.reason is None
    else:
        assert selection.reason is not None
        assert reason in selection.reason


def test_a_path_without_a_readable_mount_table_says_why(
    mounted: tuple[Inventory, MountTable],
) -> None:
    inventory, _ = mounted
    unread = select(inventory, parse_selector("path:/mnt/disks/a"))
    assert unread.reason == "path:/mnt/disks/a: the host's mount table: not read"
    broken = select(inventory, parse_selector("path:/x"), MountTable(problem="malformed x"))
    assert broken.reason == "path:/x: the host's mount table: malformed x"
    assert select(inventory, parse_selector("path:/x"), MountTable()).reason == (
        "path:/x: no mount holds it: the table has no root mount (a mount at / whose parent "
        "is not listed)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("path:mnt/disks/a", "an absolute host path"),
        ("path:/mnt/../etc", "without . or .."),
        ("path:/mnt/./a", "without . or .."),
        ("path:/" + "a" * 1024, "needs a value of 1 to 1024"),
        ("path:/mnt/\x00", "printable"),
    ],
)
def test_a_path_selector_refuses_what_is_no_absolute_path(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_selector(text)


def test_a_selection_lists_each_nodes_devices_by_the_name_a_pod_uses(
    inventory: Inventory,
) -> None:
    """Disks by their kernel name (a partition's disk), interfaces by name, PCI devices
    by address: what NUMA_NEAR_<NAME> tells the container."""
    assert select(inventory, parse_selector("block:nvme1n1p1")).by_node == ((1, ("nvme1n1",)),)
    assert select(inventory, parse_selector("block:md0")).by_node == ((0, ("md0",)), (1, ("md0",)))
    assert select(inventory, parse_selector("pci-class:0108")).by_node == (
        (0, ("0000:00:01.0",)), (1, ("0000:41:00.0",)),
    )  # fmt: skip
    assert select(inventory, parse_selector("net:bond0")).on(1) == ("bond0",)
    assert select(inventory, parse_selector("net:eno1")).by_node == ()  # no locality
