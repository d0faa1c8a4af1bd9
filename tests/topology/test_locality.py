"""Device locality from sysfs: PCI devices, disks (partitions, dm/md) and interfaces
(bonds, VLANs), on synthetic trees, hostile trees and real machines' snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_device_plugin.topology.bynode import NO_DEVICES, devices_by_node, unlocated_pci
from numa_device_plugin.topology.fake import DeviceTree
from numa_device_plugin.topology.locality import (
    MAX_DEPTH,
    Inventory,
    Located,
    read_inventory,
)
from numa_device_plugin.topology.parts import PartsWalk


@pytest.fixture
def tree(tmp_path: Path) -> DeviceTree:
    """Two NVMe drives (node 0 and node 1), a NIC on node 1, a GPU on node 1 and a
    SATA controller without proximity (-1)."""
    tree = DeviceTree(tmp_path)
    tree.pci("0000:00:01.0", 0)
    tree.pci("0000:41:00.0", 1, "0x010802")
    tree.pci("0000:41:01.0", 1, "0x020000", "0x15b3", "0x1017")
    tree.pci("0000:42:00.0", 1, "0x030200", "0x10de", "0x20b0")
    tree.pci("0000:00:1f.2", -1, "0x010601")
    tree.disk("nvme0n1", "0000:00:01.0", serial="S0", wwid="eui.0000", partitions=2)
    tree.disk("nvme1n1", "0000:41:00.0", serial="S1", wwid="eui.1111")
    tree.disk("sda", "0000:00:1f.2", serial="SATA")
    tree.nic("eth0", "0000:41:01.0")
    return tree


def by_name(devices: tuple[Located, ...]) -> dict[str, Located]:
    return {d.name: d for d in devices}


def test_pci_devices_carry_numa_node_class_and_ids(tree: DeviceTree) -> None:
    inventory = read_inventory(tree.root)
    gpu = inventory.pci_device("0000:42:00.0")
    assert gpu is not None
    assert (gpu.numa_node, gpu.pci_class, gpu.vendor, gpu.device) == (1, 0x030200, 0x10DE, 0x20B0)
    assert gpu.class_name == "3D controller"
    assert [d.address for d in inventory.pci] == sorted(d.address for d in inventory.pci)
    assert inventory.warnings == ()


def test_numa_node_minus_one_is_no_locality_never_node_0(tree: DeviceTree) -> None:
    inventory = read_inventory(tree.root)
    sata = inventory.pci_device("0000:00:1f.2")
    assert sata is not None
    assert sata.numa_node is None
    sda = by_name(inventory.block)["sda"]
    assert sda.nodes == frozenset()
    assert sda.reason is not None
    assert "0000:00:1f.2 has numa_node -1" in sda.reason
    assert 0 not in sda.nodes
    assert sda.serial == "SATA"
    assert unlocated_pci(inventory) == 1


def test_a_disk_takes_the_numa_node_of_the_pci_device_above_it(tree: DeviceTree) -> None:
    block = by_name(read_inventory(tree.root).block)
    assert block["nvme1n1"].nodes == {1}
    assert block["nvme1n1"].pci == ("0000:41:00.0",)
    assert (block["nvme1n1"].serial, block["nvme1n1"].wwid) == ("S1", "eui.1111")
    assert block["nvme0n1"].nodes == {0}


def test_a_partition_counts_as_its_disk(tree: DeviceTree) -> None:
    part = by_name(read_inventory(tree.root).block)["nvme0n1p2"]
    assert part.nodes == {0}
    assert part.disk == "nvme0n1"
    assert (part.serial, part.wwid) == ("S0", "eui.0000")


def test_serial_and_wwid_are_read_from_the_device_folder_too(tmp_path: Path) -> None:
    """NVMe keeps the serial on the controller, SCSI the wwid on the SCSI device:
    ``<disk>/device/serial``."""
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1)
    folder = tree.disk("nvme0n1", "0000:41:00.0")
    (folder / "device").mkdir()
    (folder / "device" / "serial").write_text("  S3EVNX0K123   \n")
    disk = by_name(read_inventory(tmp_path).block)["nvme0n1"]
    assert disk.serial == "S3EVNX0K123"


def test_an_interface_takes_its_pci_devices_node_and_virtual_ones_have_none(
    tree: DeviceTree,
) -> None:
    tree.nic("lo", None)
    net = by_name(read_inventory(tree.root).net)
    assert net["eth0"].nodes == {1}
    assert net["lo"].nodes == frozenset()
    assert net["lo"].virtual
    assert net["lo"].reason == "no locality: a virtual device"


def test_a_device_mapper_device_has_the_nodes_of_all_its_slaves(tree: DeviceTree) -> None:
    tree.mapped("md0", ["nvme0n1p1", "nvme1n1"])
    tree.mapped("dm-0", ["md0"])
    block = by_name(read_inventory(tree.root).block)
    assert block["md0"].nodes == {0, 1}
    assert block["md0"].parts == ("nvme0n1p1", "nvme1n1")
    assert block["md0"].pci == ("0000:00:01.0", "0000:41:00.0")
    assert block["dm-0"].nodes == {0, 1}


def test_a_mapped_device_with_a_part_without_locality_has_none(tree: DeviceTree) -> None:
    tree.mapped("md1", ["nvme1n1", "sda"])
    md1 = by_name(read_inventory(tree.root).block)["md1"]
    assert md1.nodes == frozenset()
    assert md1.reason is not None
    assert "its part sda has none" in md1.reason


def test_a_bond_and_a_vlan_follow_their_lower_interfaces(tree: DeviceTree) -> None:
    tree.pci("0000:00:02.0", 0, "0x020000")
    tree.nic("eth1", "0000:00:02.0")
    tree.nic("bond0", None, ("eth0", "eth1"))
    tree.nic("bond0.100", None, ("bond0",))
    net = by_name(read_inventory(tree.root).net)
    assert net["bond0"].nodes == {0, 1}
    assert net["bond0.100"].nodes == {0, 1}
    assert devices_by_node(read_inventory(tree.root)).get(1, NO_DEVICES).nics == (
        "eth0",
    )  # not the bond


def test_loops_of_parts_end_with_no_locality(tree: DeviceTree) -> None:
    tree.nic("a", None, ("b",))
    tree.nic("b", None, ("a",))
    net = by_name(read_inventory(tree.root).net)
    assert net["a"].nodes == frozenset()
    assert net["a"].reason == "no locality: its part b has none: its parts loop back to it"
    assert net["b"].nodes == frozenset()


def test_parts_nested_too_deep_end_with_no_locality(tree: DeviceTree) -> None:
    previous = "eth0"
    for level in range(MAX_DEPTH + 2):
        tree.nic(f"v{level}", None, (previous,))
        previous = f"v{level}"
    net = by_name(read_inventory(tree.root).net)
    assert net["v0"].nodes == {1}
    assert net[f"v{MAX_DEPTH - 1}"].nodes == {1}  # eth0 and 8 levels above it
    assert net[f"v{MAX_DEPTH}"].reason == f"no locality: parts nested over {MAX_DEPTH} deep"
    assert net[previous].reason == (
        f"no locality: its part v{MAX_DEPTH} has none: parts nested over {MAX_DEPTH} deep"
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("garbage", "expected -1 or a NUMA node id"),
        ("1024", "above the kernel's limit"),
        ("9223372036854775808", "expected -1 or a NUMA node id"),
        ("-2", "expected -1 or a NUMA node id"),
        ("", "expected -1 or a NUMA node id"),
    ],
)
def test_a_malformed_numa_node_leaves_the_pci_device_out_naming_the_file(
    tree: DeviceTree, content: str, why: str
) -> None:
    (tree.pci_folder("0000:41:00.0") / "numa_node").write_text(content)
    inventory = read_inventory(tree.root)
    assert inventory.pci_device("0000:41:00.0") is None
    assert any("0000:41:00.0/numa_node" in w and why in w for w in inventory.warnings)
    disk = by_name(inventory.block)["nvme1n1"]  # the disk under it: no locality, with why
    assert disk.nodes == frozenset()
    assert disk.reason is not None
    assert "numa_node" in disk.reason
    assert why in disk.reason


@pytest.mark.parametrize("name", ["class", "vendor", "device"])
def test_a_malformed_id_file_leaves_the_pci_device_out(tree: DeviceTree, name: str) -> None:
    (tree.pci_folder("0000:42:00.0") / name).write_text("0xZZ")
    inventory = read_inventory(tree.root)
    assert inventory.pci_device("0000:42:00.0") is None
    assert any(f"0000:42:00.0/{name}" in w for w in inventory.warnings)


def test_a_fifo_as_numa_node_is_refused_without_blocking(tree: DeviceTree) -> None:
    path = tree.pci_folder("0000:41:00.0") / "numa_node"
    path.unlink()
    os.mkfifo(path)
    inventory = read_inventory(tree.root)
    assert inventory.pci_device("0000:41:00.0") is None
    assert any("a FIFO" in w for w in inventory.warnings)


def test_links_that_leave_the_root_loop_or_dangle_give_no_locality(
    tree: DeviceTree, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "numa_node").write_text("1\n")
    block = tree.root / "class" / "block"
    (block / "escape").symlink_to(outside)
    (block / "loop-a").symlink_to("loop-b")
    (block / "loop-b").symlink_to("loop-a")
    (block / "dangling").symlink_to("../../devices/nothing")
    found = by_name(read_inventory(tree.root).block)
    assert found["escape"].nodes == frozenset()
    assert "outside the sysfs root" in (found["escape"].reason or "")
    assert found["loop-a"].nodes == frozenset()
    assert found["dangling"].nodes == frozenset()
    assert "points to nothing" in (found["dangling"].reason or "")


def test_oddly_named_pci_entries_are_left_out_with_a_warning(tree: DeviceTree) -> None:
    (tree.root / "bus" / "pci" / "devices" / "not-an-address").mkdir()
    inventory = read_inventory(tree.root)
    assert all(d.address != "not-an-address" for d in inventory.pci)
    assert any("not-an-address" in w for w in inventory.warnings)


def test_a_root_without_bus_or_class_folders_is_an_empty_inventory(tmp_path: Path) -> None:
    assert read_inventory(tmp_path) == Inventory()


def test_devices_by_node_lists_disks_nics_and_accelerators(tree: DeviceTree) -> None:
    inventory = read_inventory(tree.root)
    one = devices_by_node(inventory).get(1, NO_DEVICES)
    assert one.disks == ("nvme1n1",)
    assert one.nics == ("eth0",)
    assert one.accelerators == ("0000:42:00.0 3D controller",)
    assert one.pci == 3
    zero = devices_by_node(inventory).get(0, NO_DEVICES)
    assert devices_by_node(inventory).get(7, NO_DEVICES) == NO_DEVICES
    assert zero.disks == ("nvme0n1",)  # partitions are not listed as disks


# The README table of ../shared/fixtures/sysfs-pci: (disk or interface -> NUMA nodes),
# and PCI devices per numa_node (None: -1).
PCI_TABLE = {
    "40intel64-2g2n4c+pcilocality": (
        {"sda": set(), "sda1": set(), "sr0": set(), "eth0": set(), "eth3": set(), "ib0": {2}},
        {None: 36, 2: 1},
    ),
    "fakepcilocalities": (
        {"sda": {0}, "sda6": {0}, "sr0": {0}, "eth0": {0}, "eth3": {0}, "ib0": {1}},
        {0: 14, 1: 4, 2: 6, 3: 6},
    ),
}


@pytest.mark.parametrize("name", sorted(PCI_TABLE))
def test_real_machines_devices_sit_where_their_sysfs_says(pci_snapshots: Path, name: str) -> None:
    located, per_node = PCI_TABLE[name]
    inventory = read_inventory(pci_snapshots / name)
    everything = by_name(inventory.block) | by_name(inventory.net)
    for device, nodes in located.items():
        assert set(everything[device].nodes) == nodes, device
        if not nodes:
            assert "numa_node -1" in (everything[device].reason or ""), device
    counts: dict[int | None, int] = {}
    for pci in inventory.pci:
        counts[pci.numa_node] = counts.get(pci.numa_node, 0) + 1
    assert counts == per_node
    assert inventory.warnings == ()


def test_real_machines_ib0_is_an_infiniband_controller_of_its_vendor(pci_snapshots: Path) -> None:
    inventory = read_inventory(pci_snapshots / "fakepcilocalities")
    ib = inventory.pci_device("0000:43:00.0")
    assert ib is not None
    assert (ib.vendor, ib.device, ib.class_name) == (0x1077, 0x7322, "InfiniBand controller")
    assert devices_by_node(inventory).get(0, NO_DEVICES).disks == ("sda", "sr0")
    assert devices_by_node(inventory).get(0, NO_DEVICES).nics == ("eth0", "eth1", "eth2", "eth3")


def test_each_interface_is_resolved_once_however_many_share_it(
    tree: DeviceTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile tree of layers of bonds, each bond over every bond of the layer below:
    walking it path by path is width ** depth; resolving each device once is linear."""
    from numa_device_plugin.topology import locality

    below = ["eth0"]
    for layer in range(6):
        names = [f"b{layer}x{i}" for i in range(6)]
        for name in names:
            tree.nic(name, None, tuple(below))
        below = names
    calls: list[str] = []
    resolve = locality._Reader._resolve

    def counted(self: locality._Reader, kind: str, name: str) -> tuple[Located, int] | PartsWalk:
        if kind == "net":
            calls.append(name)
        return resolve(self, kind, name)

    monkeypatch.setattr(locality._Reader, "_resolve", counted)
    net = by_name(read_inventory(tree.root).net)
    assert net["b5x0"].nodes == {1}
    assert sorted(calls) == sorted(net)


def test_caps_keep_the_first_in_name_order_whatever_the_folder_order(
    tree: DeviceTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the cap the kept devices are the first by name, not the first the folder
    happened to list, and the inventory says which kinds were cut."""
    from numa_device_plugin.topology import pci

    real_scandir = os.scandir

    def reversed_scandir(path: os.PathLike[str] | str) -> object:
        class Listing:
            def __init__(self) -> None:
                with real_scandir(path) as entries:
                    self.entries = sorted(entries, key=lambda e: e.name, reverse=True)

            def __enter__(self) -> list[os.DirEntry[str]]:
                return self.entries

            def __exit__(self, *_: object) -> None:
                return None

        return Listing()

    monkeypatch.setattr(pci, "MAX_DEVICES", 2)
    for listing in (os.scandir, reversed_scandir):
        monkeypatch.setattr(os, "scandir", listing)
        inventory = read_inventory(tree.root)
        assert [d.address for d in inventory.pci] == ["0000:00:01.0", "0000:00:1f.2"]
        assert [d.name for d in inventory.block] == ["nvme0n1", "nvme0n1p1"]
        assert inventory.cut == ("PCI devices", "block devices")
        assert any("lists 5 PCI devices, more than 2" in w for w in inventory.warnings)
        assert any("lists 5 block devices, more than 2" in w for w in inventory.warnings)


def test_a_device_with_more_parts_than_read_has_no_locality(
    tree: DeviceTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes from a subset of the parts would be wrong: over MAX_PARTS, none at all."""
    from numa_device_plugin.topology import locality

    monkeypatch.setattr(locality, "MAX_PARTS", 1)
    tree.mapped("md0", ["nvme0n1", "nvme1n1"])
    inventory = read_inventory(tree.root)
    md0 = by_name(inventory.block)["md0"]
    assert md0.nodes == frozenset()
    assert md0.reason is not None
    assert "names over 1 parts; not all were read" in md0.reason
    assert any("names over 1 parts" in w for w in inventory.warnings)


def test_a_part_with_an_unprintable_name_leaves_the_device_without_locality(
    tree: DeviceTree,
) -> None:
    tree.mapped("md0", ["nvme0n1", "nvme1n1"])
    os.symlink("../../nvme1n1", tree.root / "devices/virtual/block/md0/slaves/bad\x01")
    md0 = by_name(read_inventory(tree.root).block)["md0"]
    assert md0.nodes == frozenset()
    assert "is not printable" in (md0.reason or "")


def test_hundreds_of_stacked_mapped_devices_end_without_a_traceback(tree: DeviceTree) -> None:
    """About 330 stacked dm devices raised RecursionError at start (the top one, dm-0,
    is read first); the walk keeps its own stack, and past MAX_DEPTH a device has no
    locality, saying why."""
    import sys

    levels = sys.getrecursionlimit() + 50
    previous = "nvme1n1"
    for height in range(1, levels + 1):  # dm-{levels - 1} on the disk, dm-0 on top
        tree.mapped(f"dm-{levels - height}", [previous])
        previous = f"dm-{levels - height}"
    block = by_name(read_inventory(tree.root).block)
    assert block[f"dm-{levels - 1}"].nodes == {1}
    assert block[f"dm-{levels - MAX_DEPTH}"].nodes == {1}
    too_deep = block[f"dm-{levels - MAX_DEPTH - 1}"]
    assert too_deep.reason == f"no locality: parts nested over {MAX_DEPTH} deep"
    assert block["dm-0"].reason == (
        f"no locality: its part dm-1 has none: parts nested over {MAX_DEPTH} deep"
    )


def test_links_and_files_that_leave_the_root_are_never_followed(
    tree: DeviceTree, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One rule for every link: a PCI device's folder, a numa_node file and a disk's
    device link that lead out of the sysfs root give nothing from outside."""
    outside = tmp_path_factory.mktemp("outside")
    planted = outside / "pcidev"
    planted.mkdir()
    for name, value in (
        ("numa_node", "3"),
        ("class", "0x010802"),
        ("vendor", "0x1"),
        ("device", "0x2"),
    ):
        (planted / name).write_text(value + "\n")
    (outside / "serial").write_text("PLANTED\n")
    (outside / "numa_node").write_text("3\n")
    os.symlink(planted, tree.root / "bus/pci/devices/0000:99:00.0")
    numa = tree.pci_folder("0000:41:00.0") / "numa_node"
    numa.unlink()
    numa.symlink_to(outside / "numa_node")
    disk = tree.disk("sdz", "0000:00:01.0")
    os.symlink(outside, disk / "device")
    inventory = read_inventory(tree.root)
    assert inventory.pci_device("0000:99:00.0") is None
    assert inventory.pci_device("0000:41:00.0") is None
    assert any("0000:99:00.0 points outside the sysfs root" in w for w in inventory.warnings)
    block = by_name(inventory.block)
    assert block["nvme1n1"].nodes == frozenset()
    assert "points outside the sysfs root" in (block["nvme1n1"].reason or "")
    assert block["sdz"].serial is None
    assert any("device points outside the sysfs root" in w for w in inventory.warnings)


def multipath_head(tree: DeviceTree, paths: dict[str, str], *, links: bool) -> None:
    """nvme0n1, a native NVMe multipath head under devices/virtual/nvme-subsystem, with a
    path nvme0c<C>n1 under each controller nvme<C> of ``paths`` (controller -> PCI
    address); ``links``: the head's multipath/ folder (newer kernels) rather than
    the subsystem's controller links."""
    subsys = tree.root / "devices/virtual/nvme-subsystem/nvme-subsys0"
    head = subsys / "nvme0n1"
    head.mkdir(parents=True)
    (subsys / "serial").write_text("DUAL-PORT\n")
    (head / "wwid").write_text("eui.dual\n")
    os.symlink("..", head / "device")
    os.symlink(
        "../../devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1",
        tree.root / "class/block/nvme0n1",
    )
    part = head / "nvme0n1p1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    os.symlink(
        os.path.relpath(part, tree.root / "class/block"), tree.root / "class/block/nvme0n1p1"
    )
    for controller, address in paths.items():
        folder = tree.pci_folder(address) / "nvme" / controller
        path = folder / f"nvme0c{controller.removeprefix('nvme')}n1"
        path.mkdir(parents=True)
        # What else a controller holds: another namespace's path, its attributes' folders.
        (folder / f"nvme0c{controller.removeprefix('nvme')}n2").mkdir()
        (folder / "power").mkdir()
        (head / "multipath").mkdir(exist_ok=True)
        other = head / "multipath" / "nvme9c9n9"
        if not other.is_symlink():
            os.symlink(os.path.relpath(folder / "power", head / "multipath"), other)
        if links:
            (head / "multipath").mkdir(exist_ok=True)
            os.symlink(os.path.relpath(path, head / "multipath"), head / "multipath" / path.name)
        else:
            os.symlink(os.path.relpath(folder, subsys), subsys / controller)


@pytest.mark.parametrize("links", [True, False], ids=["multipath-folder", "controllers"])
def test_an_nvme_multipath_head_has_the_nodes_of_its_paths(tmp_path: Path, links: bool) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:01:00.0", 0)
    tree.pci("0000:81:00.0", 1)
    multipath_head(tree, {"nvme0": "0000:01:00.0", "nvme1": "0000:81:00.0"}, links=links)
    block = by_name(read_inventory(tree.root).block)
    head = block["nvme0n1"]
    assert head.nodes == {0, 1}
    assert head.pci == ("0000:01:00.0", "0000:81:00.0")
    assert head.parts == ("nvme0c0n1", "nvme0c1n1")
    assert (head.serial, head.wwid) == ("DUAL-PORT", "eui.dual")
    assert block["nvme0n1p1"].nodes == {0, 1}
    assert block["nvme0n1p1"].disk == "nvme0n1"


def test_an_nvme_multipath_head_with_a_path_without_locality_has_none(tmp_path: Path) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:01:00.0", 0)
    tree.pci("0000:81:00.0", -1)
    multipath_head(tree, {"nvme0": "0000:01:00.0", "nvme1": "0000:81:00.0"}, links=True)
    head = by_name(read_inventory(tree.root).block)["nvme0n1"]
    assert head.nodes == frozenset()
    assert head.reason == (
        "no locality: its path nvme0c1n1 has none: PCI device 0000:81:00.0 has numa_node -1"
    )


def test_odd_entries_give_no_locality_or_are_left_out_saying_why(tree: DeviceTree) -> None:
    (tree.root / "devices" / "a-file").write_text("x")
    (tree.root / "class" / "block" / "to-a-file").symlink_to("../../devices/a-file")
    (tree.pci_folder("0000:42:00.0") / "class").unlink()
    serial = tree.pci_folder("0000:41:00.0") / "nvme" / "nvme0" / "nvme1n1" / "serial"
    serial.unlink()
    os.mkfifo(serial)
    inventory = read_inventory(tree.root)
    block = by_name(inventory.block)
    assert block["to-a-file"].reason is not None
    assert block["to-a-file"].reason.endswith("is not a folder")
    assert inventory.pci_device("0000:42:00.0") is None
    assert any(
        "lacks class, vendor or device; PCI device 0000:42:00.0" in w for w in inventory.warnings
    )
    assert block["nvme1n1"].serial is None
    assert block["nvme1n1"].nodes == {1}
    assert any("a FIFO" in w and "the serial is left unknown" in w for w in inventory.warnings)


def test_a_class_folder_that_is_a_file_is_an_empty_kind_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "net").write_text("not a folder")
    inventory = read_inventory(tmp_path)
    assert inventory.net == ()
    assert any("cannot list" in w and "no network interfaces read" in w for w in inventory.warnings)


def test_a_class_entry_with_an_unprintable_name_is_left_out(tree: DeviceTree) -> None:
    """Mutant: unprintable class entries not filtered (a name with an escape sequence
    would reach the logs and the node page)."""
    folder = tree.pci_folder("0000:41:00.0") / "nvme" / "nvme0" / "nvme1n1"
    (tree.root / "class" / "block" / "evil\x1b[31m").symlink_to(folder)
    names = [d.name for d in read_inventory(tree.root).block]
    assert names == ["nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme1n1", "sda"]


def test_a_composite_names_each_pci_device_once(tree: DeviceTree) -> None:
    """Mutant: duplicate PCI addresses in a composite (an md over two partitions of one
    disk listed its controller twice)."""
    tree.mapped("md0", ["nvme0n1p1", "nvme0n1p2"])
    tree.mapped("md1", ["md0", "nvme0n1p2", "nvme1n1"])
    block = by_name(read_inventory(tree.root).block)
    assert block["md0"].pci == ("0000:00:01.0",)
    assert block["md1"].pci == ("0000:00:01.0", "0000:41:00.0")


def test_a_composite_names_the_first_part_without_locality(tree: DeviceTree) -> None:
    """Mutant: the walk of a device's parts went on past the first part without
    locality, and the reason named the last one."""
    tree.mapped("md0", ["sda", "virt", "nvme1n1"])
    tree.disk("virt", None)
    md0 = by_name(read_inventory(tree.root).block)["md0"]
    assert md0.reason == (
        "no locality: its part sda has none: PCI device 0000:00:1f.2 has numa_node -1 "
        "(the firmware gave no proximity)"
    )


@pytest.mark.parametrize(
    "folder",
    [b"evil\nINJECTED=1", b"x\x1b]0;title\x07", b"d\xff", b"d,sda", b"has space"],
    ids=["newline", "escape", "non-utf-8", "comma", "space"],
)
def test_a_partition_whose_disk_folder_is_no_kernel_name_has_no_locality(
    tmp_path: Path, folder: bytes
) -> None:
    """A partition's disk is the folder above it, which class/block never lists: a
    hostile name there is never taken as the disk a pod is told about."""
    from numa_device_plugin.topology.selectors import parse_selector, select

    tree = DeviceTree(tmp_path)
    pci = tree.pci("0000:41:00.0", 1, "0x010802")
    disk = os.path.join(bytes(pci / "nvme" / "nvme0"), folder)
    os.makedirs(os.path.join(disk, b"nvme9n1p1"))
    with open(os.path.join(disk, b"nvme9n1p1", b"partition"), "w") as f:
        f.write("1\n")
    link = tmp_path / "class" / "block" / "nvme9n1p1"
    os.symlink(os.path.relpath(os.path.join(disk, b"nvme9n1p1"), bytes(link.parent)), bytes(link))
    inventory = read_inventory(tmp_path)
    part = by_name(inventory.block)["nvme9n1p1"]
    assert part.nodes == frozenset()
    assert part.reason is not None
    assert "its disk's folder is not a kernel device name" in part.reason
    selection = select(inventory, parse_selector("block:nvme9n1p1"))
    assert selection.by_node == ()
    assert selection.reason is not None


@pytest.mark.parametrize("name", ["d,sda", "a b", "ünï"])
def test_a_listed_block_device_whose_name_is_no_kernel_name_has_no_locality(
    tmp_path: Path, name: str
) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1, "0x010802")
    tree.disk(name, "0000:41:00.0", serial="S1")
    inventory = read_inventory(tmp_path)
    found = by_name(inventory.block)[name]
    assert found.nodes == frozenset()
    assert found.reason == f"no locality: its name is not a kernel device name ({name!r})"
    from numa_device_plugin.topology.selectors import parse_selector, select

    assert select(inventory, parse_selector("serial:S1")).by_node == ()


def test_a_virtual_nvme_name_outside_nvme_subsystem_is_no_multipath_head(tmp_path: Path) -> None:
    """Only a head under devices/virtual/nvme-subsystem is made of paths; another
    virtual device named like one (a driver's, a hostile tree's) is just virtual."""
    tree = DeviceTree(tmp_path)
    tree.disk("nvme9n1", None)
    found = by_name(read_inventory(tree.root).block)["nvme9n1"]
    assert (found.nodes, found.parts) == (frozenset(), ())
    assert found.reason == "no locality: a virtual device"


def test_an_nvme_multipath_head_without_a_path_has_no_locality_and_says_so(
    tmp_path: Path,
) -> None:
    tree = DeviceTree(tmp_path)
    multipath_head(tree, {}, links=True)
    found = by_name(read_inventory(tree.root).block)["nvme0n1"]
    assert found.nodes == frozenset()
    assert found.reason == "no locality: an NVMe multipath head with no path"


@pytest.mark.parametrize("name", ["d,sda", "d=X", "d $(id) x", "d" * 250])
def test_a_disk_whose_name_is_not_a_kernel_name_is_selected_by_its_serial_with_the_reason(
    tmp_path: Path, name: str
) -> None:
    """Such a disk was made with its name and reason alone (no serial): ``serial:S``
    then said "no disk with that serial matches on this node", untrue, naming neither
    the disk nor why. Its ids are read, the selector names it and says why it has no
    locality, and the inventory warns; no such name reaches a pod's environment."""
    from numa_device_plugin.topology.selectors import parse_selector, select

    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1)
    tree.disk(name, "0000:41:00.0", serial="ODD", wwid="eui.odd")
    inventory = read_inventory(tmp_path)
    (found,) = [d for d in inventory.block if d.name == name]
    assert (found.serial, found.wwid, found.nodes) == ("ODD", "eui.odd", frozenset())
    assert any("not a kernel device name" in line and repr(name[:64]) in line
               for line in inventory.warnings)  # fmt: skip
    for selector in ("serial:ODD", "wwid:eui.odd"):
        selection = select(inventory, parse_selector(selector))
        assert selection.nodes == frozenset()
        assert selection.by_node == ()
        assert selection.reason is not None
        assert "no disk with that" not in selection.reason
        assert "its name is not a kernel device name" in selection.reason
        assert repr(name[:64]) in selection.reason
