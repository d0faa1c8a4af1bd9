"""The device watch: sysfs read again, and the manager woken only for a discovery that
would serve something else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.plugin.advertised.discovery import Discovery, discover, look_key
from numa_device_plugin.plugin.lifecycle.devicewatch import DeviceWatch, changed, differs
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from numa_device_plugin.topology.sysfs import SysfsFormatError


def machine(root: Path) -> tuple[SysfsTree, DeviceTree]:
    tree = SysfsTree(root).cpus(4, online="0-3")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-1")
    tree.node(1, "2-3")
    devices = DeviceTree(root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
    return tree, devices


async def test_the_manager_is_woken_only_when_what_would_be_served_differs(
    tmp_path: Path,
) -> None:
    tree, devices = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    served: list[Discovery] = [discover(config)]
    woken: list[int] = []
    watch = DeviceWatch(config, discover, lambda: served[-1], lambda: woken.append(1))
    await watch.look()
    await watch.look()
    assert woken == []
    assert watch.take() is None
    devices.pci("0000:02:00.0", 0, "0x020000")  # a device nobody selects: shown, not served
    await watch.look()
    assert woken == [1]
    shown = watch.take()
    assert shown is not None
    assert changed(served[-1].resources, shown.resources) == set()
    served.append(shown)
    (tree.root / "class/block/nvme1n1").unlink()  # the selected disk goes
    await watch.look()
    assert woken == [1, 1]
    found = watch.take()
    assert found is not None
    assert changed(served[-1].resources, found.resources) == {"numa-align/d"}
    assert watch.take() is None


async def test_a_failed_read_keeps_what_is_served_and_wakes_nobody(tmp_path: Path) -> None:
    tree, _ = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root)
    woken: list[int] = []

    def broken(_: Config) -> Discovery:
        raise SysfsFormatError(tree.root / "node/node0/cpulist", "x", "malformed")

    watch = DeviceWatch(config, broken, lambda: discover(config), lambda: woken.append(1))
    await watch.look()
    await watch.look()
    assert (woken, watch.take()) == ([], None)


def test_nothing_is_served_before_the_first_discovery_so_any_differs(tmp_path: Path) -> None:
    tree, _ = machine(tmp_path / "sys")
    first = discover(Config(sysfs_root=tree.root))
    assert differs(None, first)
    assert not differs(first, discover(Config(sysfs_root=tree.root)))


async def test_a_look_at_unchanged_devices_logs_nothing_and_reads_no_details(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every --device-interval (60 s) a quiet look: no plan logged again, no details
    (models, sizes) read; only a change reads again, loud, with the details."""
    from functools import partial

    tree, devices = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    served = [discover(config)]
    capsys.readouterr()
    loud: list[int] = []

    def counted(given: Config) -> Discovery:
        loud.append(1)
        return discover(given)

    watch = DeviceWatch(config, counted, lambda: served[-1], lambda: None,
                        partial(discover, quiet=True))  # fmt: skip
    for _ in range(3):
        await watch.look()
    assert loud == []
    assert capsys.readouterr().err == ""
    devices.disk("nvme0n1", "0000:01:00.0", serial="OTHER")
    await watch.look()
    assert loud == [1]
    found = watch.take()
    assert found is not None
    assert found.details is not None
    assert "advertising NUMA node" in capsys.readouterr().err
    assert discover(config, quiet=True).details is None


def mounted_machine(root: Path) -> tuple[SysfsTree, Path]:
    """machine() with nvme1n1 (node 1) partitioned, its p1 mounted at /mnt/disks/a, the
    root filesystem on nvme0n1p1 (node 0); the mountinfo file beside the tree."""
    tree, devices = machine(root)
    devices.disk("nvme1n1", "0000:41:00.0", serial="DATA", partitions=1)
    devices.disk("nvme0n1", "0000:01:00.0", serial="ROOT", partitions=1)
    for number, name in (("259:1", "nvme1n1p1"), ("259:3", "nvme0n1p1")):
        link = root / "dev/block" / number
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../..") / "class/block" / name)
    table = root.parent / "mountinfo"
    table.write_text(MOUNTED)
    return tree, table


ROOT_LINE = "22 1 259:3 / / rw - ext4 /dev/nvme0n1p1 rw\n"
MOUNTED = ROOT_LINE + "30 22 259:1 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"


async def test_an_unmounted_data_disk_leaves_its_served_resource_unhealthy_never_on_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The data disk's mount goes (a nofail mount that failed, an operator's umount):
    the resource stays where it was, every device Unhealthy, the reason naming the path,
    the root filesystem it found and what to fix, logged as a warning; mounted again,
    it is served again. Never the root disk's node."""
    from numa_device_plugin.plugin.advertised.lost import with_left_behind

    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("data-a=path:/mnt/disks/a"),),
                    mount_table=table)  # fmt: skip
    served = [discover(config)]
    assert served[0].resources["numa-align/data-a"].near_nodes == (1,)
    watch = DeviceWatch(config, discover, lambda: served[-1], lambda: None)
    table.write_text(ROOT_LINE)
    capsys.readouterr()
    await watch.look()
    found = watch.take()
    assert found is not None
    lost = found.resources["numa-align/data-a"]
    assert lost.near_nodes == (1,)  # where it was, not the root disk's node 0
    assert lost.lost is not None
    assert "path:/mnt/disks/a: nothing is mounted there: it is on the root filesystem" in lost.lost
    assert "mount the disk at /mnt/disks/a" in lost.lost
    listed = with_left_behind(lost, lost.devices, None, frozenset({0, 1}))
    assert listed
    assert {device.health for device in listed} == {"Unhealthy"}
    err = capsys.readouterr().err
    assert "level='warning'" in err
    assert "not advertising a resource near a device" in err
    served.append(found)
    table.write_text(MOUNTED)
    await watch.look()
    back = watch.take()
    assert back is not None
    assert back.resources["numa-align/data-a"].lost is None
    assert back.resources["numa-align/data-a"].near_nodes == (1,)


async def test_a_lost_resource_whose_reason_text_changes_registers_nothing_again(
    tmp_path: Path,
) -> None:
    """A malformed mount-table line that moves as pods mount volumes changes the
    reason's text (its line number), not what the kubelet sees."""
    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("data-a=path:/mnt/disks/a"),),
                    mount_table=table)  # fmt: skip
    served = [discover(config)]
    watch = DeviceWatch(config, discover, lambda: served[-1], lambda: None)
    registered: list[set[str]] = []
    for garbage_at in (1, 2, 3):
        lines = MOUNTED.splitlines(keepends=True)
        lines.insert(garbage_at, "garbage\n")
        table.write_text("".join(lines))
        await watch.look()
        found = watch.take()
        if found is not None:
            registered.append(changed(served[-1].resources, found.resources))
            served.append(found)
    assert registered[0] == {"numa-align/data-a"}  # lost: its devices go Unhealthy
    assert all(names == set() for names in registered[1:]), registered
    reasons = {s.resources["numa-align/data-a"].lost for s in served[1:]}
    assert len(reasons) == len(served) - 1  # each reason was shown as it was


async def test_a_resource_that_stays_lost_reads_quietly_and_wakes_nobody(tmp_path: Path) -> None:
    tree, _ = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    served = [discover(config)]
    woken: list[int] = []
    loud: list[int] = []

    def counted(given: Config) -> Discovery:
        loud.append(1)
        return discover(given)

    from functools import partial

    watch = DeviceWatch(config, counted, lambda: served[-1], lambda: woken.append(1),
                        partial(discover, quiet=True))  # fmt: skip
    (tree.root / "class/block/nvme1n1").unlink()
    await watch.look()
    found = watch.take()
    assert found is not None
    assert found.resources["numa-align/d"].lost is not None
    served.append(found)
    for _ in range(3):
        await watch.look()
    assert (woken, loud, watch.take()) == ([1], [1], None)


async def test_a_read_that_keeps_failing_is_logged_once_and_again_when_it_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _ = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root)
    errors = ["x", "x", "x", "y", "y"]

    def broken(_: Config) -> Discovery:
        raise SysfsFormatError(tree.root / "node/node0/cpulist", errors.pop(0), "malformed")

    watch = DeviceWatch(config, broken, lambda: discover(config), lambda: None)
    capsys.readouterr()
    for _ in range(5):
        await watch.look()
    err = capsys.readouterr().err
    assert err.count("re-reading the devices failed") == 2, err


def test_the_mount_table_is_read_for_a_path_selector_anywhere_in_an_all_of_list(
    tmp_path: Path,
) -> None:
    from numa_device_plugin.plugin.model.near import merge_near

    tree, table = mounted_machine(tmp_path / "sys")
    DeviceTree(tree.root).nic("ens1", "0000:41:00.0")
    near = merge_near([parse_near("osd=net:ens1"), parse_near("osd=path:/mnt/disks/a")])
    found = discover(Config(sysfs_root=tree.root, near=near, mount_table=table))
    (plan,) = found.near
    assert plan.reason is None, plan.reason
    assert plan.nodes == (1,)


def counting_watch(
    config: Config, served: list[Discovery], woken: list[int]
) -> tuple[DeviceWatch, list[int]]:
    """A watch with the real look key whose quiet looks are counted."""
    from numa_device_plugin.plugin.advertised.discovery import look_key

    quiet: list[int] = []

    def counted(given: Config) -> Discovery:
        quiet.append(1)
        return discover(given, quiet=True)

    watch = DeviceWatch(config, discover, lambda: served[-1], lambda: woken.append(1),
                        counted, look_key)  # fmt: skip
    return watch, quiet


async def test_an_unchanged_machine_is_read_again_only_when_the_full_look_is_due(
    tmp_path: Path,
) -> None:
    from numa_device_plugin.plugin.lifecycle.devicewatch import FULL_LOOK_EVERY

    tree, _ = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    woken: list[int] = []
    watch, quiet = counting_watch(config, [discover(config)], woken)
    for _ in range(FULL_LOOK_EVERY + 1):
        await watch.look()
    # The first look reads (no key yet); the next FULL_LOOK_EVERY - 1 are skipped; then
    # the full look is due.
    assert len(quiet) == 2
    assert watch.skipped_looks == FULL_LOOK_EVERY - 1
    assert woken == []


def replace_link(link: Path) -> None:
    """What the kernel does when a device goes and comes back under the same name: a
    new sysfs entry (a new inode), made before the old one is gone so that no file
    system hands the old inode number out again."""
    fresh = link.with_name(link.name + ".new")
    fresh.symlink_to(link.readlink())
    fresh.replace(link)


@pytest.mark.parametrize(
    "change",
    ["a disk replaced under the same name", "a device added", "a device removed",
     "a CPU taken offline", "a NIC renamed"],
)  # fmt: skip
async def test_a_change_of_devices_or_cpus_is_read_at_the_next_look(
    tmp_path: Path, change: str
) -> None:
    tree, devices = machine(tmp_path / "sys")
    devices.nic("ens1", "0000:41:00.0")
    from numa_device_plugin.plugin.model.resources import CPUS

    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),), capacity=CPUS)
    served = [discover(config)]
    woken: list[int] = []
    watch, quiet = counting_watch(config, served, woken)
    await watch.look()
    await watch.look()
    assert len(quiet) == 1
    disk = tree.root / "class/block/nvme1n1"
    if change == "a disk replaced under the same name":
        (disk / "serial").write_text("NEW\n")  # the new disk's serial, same folder
        replace_link(disk)
    elif change == "a device added":
        devices.pci("0000:02:00.0", 0, "0x020000")
    elif change == "a device removed":
        disk.unlink()
    elif change == "a CPU taken offline":
        tree.write("cpu/online", "0-2\n")
    else:
        (tree.root / "class/net/ens1").rename(tree.root / "class/net/data0")
    await watch.look()
    assert len(quiet) == 2, f"{change}: not read"
    if change != "a NIC renamed":  # a NIC nobody selects: shown, not served
        assert woken == [1]


async def test_a_moved_mount_is_read_at_the_next_look(tmp_path: Path) -> None:
    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("data-a=path:/mnt/disks/a"),),
                    mount_table=table)  # fmt: skip
    woken: list[int] = []
    watch, quiet = counting_watch(config, [discover(config)], woken)
    await watch.look()
    await watch.look()
    table.write_text(ROOT_LINE)
    await watch.look()
    assert (len(quiet), woken) == (2, [1])


def test_a_fifo_or_an_oversized_mount_table_gives_a_key_at_once(tmp_path: Path) -> None:
    """The look key reads the mount table as discovery does: a FIFO planted in its place
    never blocks the device watch's thread, and a table over the limit is not read
    whole; each is a key of its own (the error), so the look runs and says why."""
    import os

    from numa_device_plugin.plugin.advertised.discovery import look_key
    from numa_device_plugin.topology.mounts import MAX_TABLE_BYTES

    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("data-a=path:/mnt/disks/a"),),
                    mount_table=table)  # fmt: skip
    normal = look_key(config)
    table.unlink()
    os.mkfifo(table)
    planted = look_key(config)  # returns: no writer is waited for
    assert planted != normal
    assert "not a regular file" in str(planted)
    table.unlink()
    with table.open("wb") as out:
        out.truncate(MAX_TABLE_BYTES + 1)
    assert f"over {MAX_TABLE_BYTES} bytes" in str(look_key(config))


def test_a_configuration_with_only_path_below_reads_the_mount_table(tmp_path: Path) -> None:
    """``path-below:`` alone (no ``path:``) needs the mount table as much: the resource
    lies on the data disk's node, and the look key follows the table (a moved mount is
    a new key)."""
    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, mount_table=table,
                    near=(parse_near("data-a=path-below:/mnt/disks/a/shard-1"),))  # fmt: skip
    found = discover(config)
    assert found.resources["numa-align/data-a"].near_nodes == (1,)
    before = look_key(config)
    table.write_text(ROOT_LINE + "30 22 259:3 / /mnt/disks/a rw - xfs /dev/nvme0n1p1 rw\n")
    assert look_key(config) != before


async def test_a_full_look_that_failed_is_retried_at_the_next_interval_not_skipped(
    tmp_path: Path,
) -> None:
    """The full look that the key would have skipped finds a change (a device
    attribute changed in place, which the key does not see), but reading it all fails
    once: the next look reads again, at once, rather than trusting the unchanged key
    for FULL_LOOK_EVERY - 1 more intervals."""
    from numa_device_plugin.plugin.lifecycle.devicewatch import FULL_LOOK_EVERY
    from numa_device_plugin.topology.sysfs import SysfsError

    tree, _ = machine(tmp_path / "sys")
    served = discover(Config(sysfs_root=tree.root, capacity=5))
    changed_in_place = discover(Config(sysfs_root=tree.root, capacity=6))
    config = Config(sysfs_root=tree.root, capacity=5)
    quiet: list[Discovery] = []
    loud: list[int] = []

    def quiet_look(given: Config) -> Discovery:
        quiet.append(served if not quiet else changed_in_place)
        return quiet[-1]

    def full_look(given: Config) -> Discovery:
        loud.append(1)
        if len(loud) == 1:
            raise SysfsError("devices/system/node/node1/meminfo: Input/output error")
        return changed_in_place

    woken: list[int] = []
    watch = DeviceWatch(config, full_look, lambda: served, lambda: woken.append(1),
                        quiet_look, lambda given: "unchanged")  # fmt: skip
    for _ in range(FULL_LOOK_EVERY):  # the first look, then all but the due one skipped
        await watch.look()
    assert (len(quiet), watch.skipped_looks) == (1, FULL_LOOK_EVERY - 1)
    await watch.look()  # the due full look: a change, and a failed read of it
    assert (len(quiet), len(loud), woken) == (2, 1, [])
    await watch.look()  # the very next interval reads again
    assert (len(quiet), len(loud), woken) == (3, 2, [1])
    assert watch.take() is changed_in_place


def mount_points(found: Discovery | None) -> dict[str, Any]:
    assert found is not None
    assert found.details is not None
    return {disk["name"]: disk["mountpoints"] for disk in found.details["disks"]}


async def test_the_disks_mount_points_follow_the_mount_table_without_a_path_selector(
    tmp_path: Path,
) -> None:
    """/debug/state and the inventory kept a moved mount's old points forever: the look
    key read the table only for path: selectors, and a look that found the same
    resources handed nothing over. Now a changed table refreshes the mount points alone
    (no sysfs look, nothing registered again), and an unchanged one does nothing."""
    from numa_device_plugin.plugin.lifecycle.devicewatch import changed

    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, mount_table=table, capacity=5)
    served = [discover(config)]
    assert mount_points(served[0]) == {"nvme0n1": ["/"], "nvme1n1": ["/mnt/disks/a"]}
    woken: list[int] = []
    watch, quiet = counting_watch(config, served, woken)
    await watch.look()  # the first look: reads, matches
    assert (len(quiet), woken, watch.take()) == (1, [], None)
    table.write_text(ROOT_LINE + "31 22 259:3 / /mnt/disks/b rw - xfs /dev/nvme0n1p1 rw\n")
    await watch.look()
    found = watch.take()
    assert (len(quiet), woken) == (1, [1]), "the mount points alone, no sysfs look"
    assert mount_points(found) == {"nvme0n1": ["/", "/mnt/disks/b"], "nvme1n1": []}
    assert found is not None
    assert changed(served[0].resources, found.resources) == set()
    served.append(found)
    await watch.look()
    assert (woken, watch.take()) == ([1], None)


async def test_a_newly_mounted_disk_appears_beside_a_path_selector_on_another_mount(
    tmp_path: Path,
) -> None:
    tree, table = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, mount_table=table,
                    near=(parse_near("data-a=path:/mnt/disks/a"),))  # fmt: skip
    served = [discover(config)]
    woken: list[int] = []
    watch, _ = counting_watch(config, served, woken)
    await watch.look()
    table.write_text(MOUNTED + "32 22 259:3 / /mnt/scratch rw - xfs /dev/nvme0n1p1 rw\n")
    await watch.look()
    found = watch.take()
    assert woken == [1]
    assert mount_points(found)["nvme0n1"] == ["/", "/mnt/scratch"]
    assert found is not None
    assert found.resources == served[0].resources


def test_the_look_key_of_an_unreadable_device_folder_is_its_error_never_a_raise(
    tmp_path: Path,
) -> None:
    """A device folder that cannot be listed (gone, a file in its place) is part of the
    key as its error, as read_inventory sees it (empty): the key changes, the look runs
    and finds what it finds, and it changes back when the folder does."""
    tree, _ = mounted_machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, mount_table=tmp_path / "mountinfo")
    normal = look_key(config)
    net = tree.root / "class" / "net"
    net.mkdir(parents=True, exist_ok=True)
    net.rename(tmp_path / "net-away")
    net.write_text("not a folder\n")
    broken = look_key(config)
    assert broken != normal
    assert isinstance(broken, tuple)
    assert any(entry and entry[0][0] == "error" for entry in broken[1])
    net.unlink()
    (tmp_path / "net-away").rename(net)
    assert look_key(config) == normal
