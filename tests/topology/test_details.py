"""The inventory an operator writes selectors from: on a real machine's snapshot and
on synthetic trees with odd files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_device_plugin.topology import locality
from numa_device_plugin.topology.details import details
from numa_device_plugin.topology.fake import DeviceTree
from numa_device_plugin.topology.locality import read_inventory


def test_a_real_machines_disks_and_nics_with_what_selects_them(pci_snapshots: Path) -> None:
    root = pci_snapshots / "fakepcilocalities"
    found = details(root, read_inventory(root))
    disks = {d["name"]: d for d in found["disks"]}
    assert sorted(disks) == ["sda", "sr0"]  # no ram or loop devices
    assert disks["sda"] == {
        "name": "sda", "nodes": [0], "serial": None, "wwid": None, "model": "PERC H700",
        "size_bytes": 1798651772928, "pci": ["0000:01:00.0"], "mountpoints": None,
    }  # fmt: skip
    nics = {n["name"]: n for n in found["nics"]}
    assert nics["ib0"]["nodes"] == [1]
    assert nics["ib0"]["pci"] == ["0000:43:00.0"]
    assert sorted(nics) == ["eth0", "eth1", "eth2", "eth3", "ib0"]


def test_ids_driver_and_accelerators_of_a_synthetic_tree(tmp_path: Path) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1, "0x010802")
    tree.pci("0000:42:00.0", 1, "0x030200", "0x10de", "0x20b0")
    tree.pci("0000:17:00.0", 0, "0x020000", "0x15b3", "0x1017")
    disk = tree.disk("nvme0n1", "0000:41:00.0", serial="S1", wwid="eui.1")
    (disk / "size").write_text("7501476528\n")
    (disk.parent / "model").write_text("SAMSUNG MZQL23T8HCLS\n")
    os.symlink("..", disk / "device")  # the controller's folder holds model
    nic = tree.nic("ens1f0", "0000:17:00.0")
    drivers = tmp_path / "bus" / "pci" / "drivers" / "mlx5_core"
    drivers.mkdir(parents=True)
    os.symlink(os.path.relpath(drivers, nic), nic / "driver")
    (nic / "device").symlink_to(".")  # here: the interface's folder holds the driver link
    found = details(tmp_path, read_inventory(tmp_path))
    assert found["disks"] == [{
        "name": "nvme0n1", "nodes": [1], "serial": "S1", "wwid": "eui.1",
        "model": "SAMSUNG MZQL23T8HCLS", "size_bytes": 7501476528 * 512,
        "pci": ["0000:41:00.0"], "mountpoints": None,
    }]  # fmt: skip
    assert found["nics"] == [
        {"name": "ens1f0", "nodes": [0], "pci": ["0000:17:00.0"], "driver": "mlx5_core"}
    ]
    assert found["accelerators"] == [{
        "pci": "0000:42:00.0", "node": 1, "class": "030200", "class_name": "3D controller",
        "id": "10de:20b0",
    }]  # fmt: skip


@pytest.mark.parametrize("size", ["garbage", "-5", "", "9" * 5000])
def test_an_odd_size_is_left_out_never_an_error(tmp_path: Path, size: str) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1, "0x010802")
    disk = tree.disk("nvme0n1", "0000:41:00.0", serial="S1")
    (disk / "size").write_text(size)
    (found,) = details(tmp_path, read_inventory(tmp_path))["disks"]
    assert found["size_bytes"] is None


@pytest.mark.parametrize("field", ["model", "size", "serial", "wwid", "driver", "device"])
def test_no_inventory_field_is_read_through_a_link_out_of_the_sysfs_root(
    tmp_path: Path, field: str
) -> None:
    """A hostile node plants a link out of the root for each field the inventory reads:
    the field is left unknown (None), the rest as usual; nothing outside is read."""
    root = tmp_path / "sys"
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("model", "size", "serial", "wwid"):
        (outside / name).write_text("PLANTED\n" if name != "size" else "4242\n")
    (outside / "driver").mkdir()
    tree = DeviceTree(root)
    tree.pci("0000:41:00.0", 1, "0x010802")
    tree.pci("0000:17:00.0", 0, "0x020000")
    disk = tree.disk("nvme0n1", "0000:41:00.0", serial="S1", wwid="eui.1")
    (disk / "size").write_text("8\n")
    (disk.parent / "model").write_text("REAL\n")
    os.symlink("..", disk / "device")
    nic = tree.nic("ens1f0", "0000:17:00.0")
    drivers = root / "bus" / "pci" / "drivers" / "mlx5_core"
    drivers.mkdir(parents=True)
    os.symlink(os.path.relpath(drivers, nic), nic / "driver")
    (nic / "device").symlink_to(".")
    if field == "device":  # the folder model, serial and wwid may sit in
        (disk / "device").unlink()
        (disk / "device").symlink_to(outside)
    elif field == "driver":
        (nic / "driver").unlink()
        (nic / "driver").symlink_to(outside / "driver")
    elif field == "model":
        (disk.parent / "model").unlink()
        (disk.parent / "model").symlink_to(outside / "model")
    else:
        (disk / field).unlink()
        (disk / field).symlink_to(outside / field)
    found = details(root, read_inventory(root))
    (shown,) = found["disks"]
    (interface,) = found["nics"]
    assert "PLANTED" not in repr(found)
    assert shown["size_bytes"] != 4242 * 512
    expected = {"model": "REAL", "size_bytes": 8 * 512, "serial": "S1", "wwid": "eui.1"}
    left_unknown = {"device": "model", "size": "size_bytes"}.get(field, field)
    for key, value in expected.items():
        assert shown[key] == (None if key == left_unknown else value), key
    assert interface["driver"] == (None if field == "driver" else "mlx5_core")


def test_a_native_nvme_multipath_head_is_listed_as_a_disk_on_its_paths_nodes(
    tmp_path: Path,
) -> None:
    """The head (nvme0n1, virtual under nvme-subsystem) is the disk a server mounts;
    its paths are hidden. A dm device over partitions, virtual too, is not a disk."""
    from tests.topology.test_locality import multipath_head

    tree = DeviceTree(tmp_path)
    tree.pci("0000:01:00.0", 0)
    tree.pci("0000:81:00.0", 1)
    multipath_head(tree, {"nvme0": "0000:01:00.0", "nvme1": "0000:81:00.0"}, links=True)
    tree.disk("nvme5n1", "0000:01:00.0", serial="S5", partitions=1)
    tree.mapped("dm-0", ["nvme5n1p1"])
    found = details(tmp_path, read_inventory(tmp_path))
    disks = {d["name"]: d for d in found["disks"]}
    assert sorted(disks) == ["nvme0n1", "nvme5n1"]
    assert disks["nvme0n1"]["nodes"] == [0, 1]
    assert disks["nvme0n1"]["serial"] == "DUAL-PORT"
    assert disks["nvme0n1"]["pci"] == ["0000:01:00.0", "0000:81:00.0"]


def test_bonds_and_vlans_are_not_listed_as_nics_their_lower_interfaces_are(
    tmp_path: Path,
) -> None:
    tree = DeviceTree(tmp_path)
    tree.pci("0000:17:00.0", 0, "0x020000")
    tree.pci("0000:18:00.0", 0, "0x020000")
    tree.nic("ens1f0", "0000:17:00.0")
    tree.nic("ens1f1", "0000:18:00.0")
    tree.nic("bond0", None, ("ens1f0", "ens1f1"))
    tree.nic("bond0.100", None, ("bond0",))
    found = details(tmp_path, read_inventory(tmp_path))
    assert [n["name"] for n in found["nics"]] == ["ens1f0", "ens1f1"]


def test_each_disk_lists_the_mount_points_of_itself_its_partitions_and_lvm_over_them(
    tmp_path: Path,
) -> None:
    """As lsblk's MOUNTPOINTS: nvme1n1 holds /mnt/disks/a (p1) and a bind mount of it,
    LVM over both disks' p1 holds /mnt/disks/b (on both); a container's own table (the
    runtime's /etc/hosts bind mount) names no host mount point: unknown, not empty."""
    from numa_device_plugin.topology.mounts import read_mount_table
    from tests.topology.test_mounts import TABLE, sysfs_with_devices

    root = tmp_path / "sys"
    sysfs_with_devices(root)
    (tmp_path / "mountinfo").write_text(TABLE)
    inventory = read_inventory(root)
    found = details(root, inventory, read_mount_table(tmp_path / "mountinfo", root))
    points = {d["name"]: d["mountpoints"] for d in found["disks"]}
    assert points == {
        "nvme0n1": ["/", "/mnt/disks/a/inner", "/mnt/disks/b"],
        "nvme1n1": ["/mnt/disks/a", "/mnt/disks/b", "/var/lib/elasticsearch"],
    }
    (tmp_path / "container").write_text(
        "1 0 0:30 / / rw - overlay overlay rw\n"
        "2 1 259:2 /x /etc/hosts rw - ext4 /dev/nvme0n1p2 rw\n"
    )
    inside = details(root, inventory, read_mount_table(tmp_path / "container", root))
    assert {d["mountpoints"] for d in inside["disks"]} == {None}
    # a host whose / is an overlay (a live system, a test guest) is still the host
    (tmp_path / "overlay-host").write_text(
        "1 0 0:30 / / rw - overlay overlay rw\n"
        "2 1 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"
    )
    host = details(root, inventory, read_mount_table(tmp_path / "overlay-host", root))
    # nvme0n1 is mounted nowhere there: an empty list, never null (which says unknown)
    assert {d["name"]: d["mountpoints"] for d in host["disks"]} == {
        "nvme0n1": [],
        "nvme1n1": ["/mnt/disks/a"],
    }


@pytest.mark.parametrize(
    ("name", "parts", "virtual", "expected"),
    [
        ("nvme0n1", ("nvme0c0n1", "nvme0c1n1"), True, True),
        ("nvme0n1", (), True, False),  # no path left: no disk to mount
        ("nvme0n1", ("nvme0c0n1", "dm-3"), True, False),
        ("nvme0n1", ("nvme0c0n1",), False, False),  # a real controller's namespace
        ("dm-0", ("nvme0c0n1",), True, False),
    ],
    ids=["head", "pathless", "mixed-parts", "not-virtual", "dm"],
)
def test_only_a_virtual_nvme_head_made_of_paths_is_a_multipath_head(
    name: str, parts: tuple[str, ...], virtual: bool, expected: bool
) -> None:
    from numa_device_plugin.topology.details import is_multipath_head
    from numa_device_plugin.topology.parts import Located

    device = Located(name, frozenset({0}), ("0000:01:00.0",), parts=parts, disk=name,
                     virtual=virtual)  # fmt: skip
    assert is_multipath_head(device) is expected
    inventory = locality.Inventory(block=(device,))
    listed = [d["name"] for d in details(Path("/nonexistent"), inventory)["disks"]]
    assert listed == ([name] if expected or not virtual else [])


def test_a_multipath_heads_mount_points_are_its_own_not_lost_in_its_paths(
    tmp_path: Path,
) -> None:
    """A filesystem on the head's partition (nvme0n1p1, over the paths nvme0c0n1 and
    nvme0c1n1) is a mount point of the head, the disk a server mounts."""
    import os

    from numa_device_plugin.topology.mounts import read_mount_table
    from tests.topology.test_locality import multipath_head

    tree = DeviceTree(tmp_path)
    tree.pci("0000:01:00.0", 0)
    tree.pci("0000:81:00.0", 1)
    multipath_head(tree, {"nvme0": "0000:01:00.0", "nvme1": "0000:81:00.0"}, links=True)
    for device, name in (("259:1", "nvme0n1p1"), ("259:0", "nvme0n1")):
        link = tmp_path / "dev" / "block" / device
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath((tmp_path / "class/block" / name).resolve(), link.parent), link)
    (tmp_path / "mountinfo").write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 259:1 / /data rw - xfs /dev/nvme0n1p1 rw\n"
        "31 22 259:0 / /raw rw - xfs /dev/nvme0n1 rw\n"
    )
    inventory = read_inventory(tmp_path)
    found = details(tmp_path, inventory, read_mount_table(tmp_path / "mountinfo", tmp_path))
    assert {d["name"]: d["mountpoints"] for d in found["disks"]} == {"nvme0n1": ["/data", "/raw"]}


def test_a_mount_hidden_by_a_later_mount_is_not_listed_as_its_disks(tmp_path: Path) -> None:
    """nvme1n1p1 mounted at /mnt/disks/a, then nvme0n1p3 over /mnt, then a tmpfs over
    /mnt/disks/b (hiding the LVM there): what a process sees at those points is on
    nvme0n1 or no disk, so only nvme0n1 lists /mnt, as ``path:`` would find it."""
    from numa_device_plugin.topology.mounts import read_mount_table
    from tests.topology.test_mounts import sysfs_with_devices

    root = tmp_path / "sys"
    sysfs_with_devices(root)
    (tmp_path / "mountinfo").write_text(
        "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
        "30 22 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"
        "31 22 253:0 / /srv/b rw - xfs /dev/mapper/vg-data rw\n"
        "40 22 259:6 / /mnt rw - ext4 /dev/nvme0n1p3 rw\n"
        "41 22 0:50 / /srv/b rw - tmpfs tmpfs rw\n"
    )
    found = details(root, read_inventory(root), read_mount_table(tmp_path / "mountinfo", root))
    assert {d["name"]: d["mountpoints"] for d in found["disks"]} == {
        "nvme0n1": ["/", "/mnt"],
        "nvme1n1": [],
    }


def test_the_mounts_on_no_local_disk_are_listed_for_check(tmp_path: Path) -> None:
    """NFS and tmpfs mounts a volume may sit on are listed (check says their volumes are
    on no disk); not the kernel's folders, the kubelet's pod volumes, / or a hidden one;
    unknown mount points list none."""
    from numa_device_plugin.topology.mounts import read_mount_table
    from tests.topology.test_mounts import sysfs_with_devices

    root = tmp_path / "sys"
    sysfs_with_devices(root)
    (tmp_path / "mountinfo").write_text(
        "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
        "23 22 0:21 / /proc rw - proc proc rw\n"
        "24 22 0:22 / /run rw - tmpfs tmpfs rw\n"
        "25 22 0:23 / /mnt/nfs rw - nfs4 filer:/export rw\n"
        "26 22 0:24 / /var/lib/kubelet/pods/p1/volumes/x rw - tmpfs tmpfs rw\n"
        "27 22 0:25 / /scratch rw - tmpfs tmpfs rw\n"
        "28 22 0:26 / /mnt/old rw - nfs4 filer:/old rw\n"
        "29 22 259:6 / /mnt rw - ext4 /dev/nvme0n1p3 rw\n"  # hides /mnt/nfs and /mnt/old
        "30 29 0:27 / /mnt/nfs rw - nfs4 filer:/new rw\n"
    )
    inventory = read_inventory(root)
    found = details(root, inventory, read_mount_table(tmp_path / "mountinfo", root))
    assert found["mounts"] == [
        {"point": "/mnt/nfs", "type": "nfs4"}, {"point": "/scratch", "type": "tmpfs"},
    ]  # fmt: skip
    assert details(root, inventory)["mounts"] == []
