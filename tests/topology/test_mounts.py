"""The host's mount table (proc(5) mountinfo): parsing, which mount holds a path, and
the block device each mount's major:minor names in sysfs; hostile tables."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import DeviceTree
from numa_device_plugin.topology.mounts import (
    Mount,
    MountTable,
    parse_line,
    parse_mountinfo,
    read_mount_table,
    unescape,
)

TABLE = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
24 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
30 22 259:5 / /mnt/disks/a rw,relatime shared:20 master:3 - xfs /dev/nvme1n1p1 rw
31 22 253:0 / /mnt/disks/b rw,relatime - xfs /dev/mapper/vg-data rw
32 22 259:5 /es /var/lib/elasticsearch rw,relatime - xfs /dev/nvme1n1p1 rw
33 22 0:40 / /mnt/disks/scratch rw - tmpfs tmpfs rw,size=1024k
34 22 0:41 / /mnt/my\\040disk rw - overlay overlay rw,lowerdir=/a
35 30 259:6 / /mnt/disks/a/inner rw - ext4 /dev/nvme0n1p3 rw
"""


def test_mountinfo_lines_become_mounts_with_their_device_and_type() -> None:
    mounts = parse_mountinfo(TABLE)
    assert mounts[0] == Mount("/", (259, 2), "ext4", "/dev/nvme0n1p2", mount_id=22, parent_id=1)
    assert mounts[2] == Mount("/mnt/disks/a", (259, 5), "xfs", "/dev/nvme1n1p1",
                              mount_id=30, parent_id=22)  # fmt: skip
    assert mounts[6].mount_point == "/mnt/my disk"  # \\040 is a space
    assert [m.fs_type for m in mounts] == [
        "ext4", "proc", "xfs", "xfs", "xfs", "tmpfs", "overlay", "ext4"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "point"),
    [
        ("/mnt/disks/a", "/mnt/disks/a"),
        ("/mnt/disks/a/shard-1/data", "/mnt/disks/a"),
        ("/mnt/disks/a/inner/x", "/mnt/disks/a/inner"),  # the nearest parent
        ("/mnt/disks/ab", "/"),  # a prefix of the text, not of the path
        ("/var/lib/elasticsearch", "/var/lib/elasticsearch"),  # a bind mount
        ("/mnt/my disk/x", "/mnt/my disk"),
        ("/etc", "/"),
        ("/", "/"),
    ],
)
def test_a_path_is_held_by_the_mount_at_it_or_its_nearest_parent(path: str, point: str) -> None:
    holder = MountTable(parse_mountinfo(TABLE)).holding(path)
    assert holder is not None
    assert holder.mount_point == point


def test_of_two_mounts_at_one_point_the_later_is_seen() -> None:
    table = MountTable(parse_mountinfo(TABLE + "40 30 259:9 / /mnt/disks/a rw - xfs /dev/x rw\n"))
    holder = table.holding("/mnt/disks/a/f")
    assert holder is not None
    assert holder.device == (259, 9)


def test_a_table_without_root_holds_nothing_outside_its_mounts() -> None:
    table = MountTable(parse_mountinfo(TABLE.splitlines()[2] + "\n"))
    assert table.holding("/etc") is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("garbage\n", "line 1 has no ' - ' separator"),
        ("1 2 3 4 5 6 - ext4\n", "line 1 is not a mountinfo line"),
        ("1 2 x:y / / rw - ext4 /dev/a rw\n", "line 1 is not a mountinfo line"),
        ("1 2 8:1 / relative rw - ext4 /dev/a rw\n", "line 1 is not a mountinfo line"),
        (TABLE + "1 2 99999999999:1 / /x rw - ext4 /dev/a rw\n", "line 9 is not"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_line(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_mountinfo(text)


def test_octal_escapes_are_decoded() -> None:
    assert unescape(r"/a\040b\011c\012d\134e") == "/a b\tc\nd\\e"


def sysfs_with_devices(root: Path) -> DeviceTree:
    """nvme0n1 (partitions p1-p3) on node 0, nvme1n1 (p1) on node 1, dm-0 over both
    p1s, and dev/block links for them as the kernel makes them."""
    tree = DeviceTree(root)
    tree.pci("0000:01:00.0", 0)
    tree.pci("0000:81:00.0", 1)
    tree.disk("nvme0n1", "0000:01:00.0", serial="S0", partitions=3)
    tree.disk("nvme1n1", "0000:81:00.0", serial="S1", partitions=1)
    tree.mapped("dm-0", ["nvme0n1p1", "nvme1n1p1"])
    for device, name in (("259:2", "nvme0n1p2"), ("259:5", "nvme1n1p1"), ("259:6", "nvme0n1p3"),
                         ("253:0", "dm-0")):  # fmt: skip
        link = root / "dev" / "block" / device
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath((root / "class/block" / name).resolve(), link.parent), link)
    return tree


def test_each_mount_names_the_block_device_of_its_major_minor(tmp_path: Path) -> None:
    sysfs_with_devices(tmp_path / "sys")
    (tmp_path / "mountinfo").write_text(TABLE)
    table = read_mount_table(tmp_path / "mountinfo", tmp_path / "sys")
    assert table.problem is None
    assert {m.mount_point: m.blocks for m in table.mounts} == {
        "/": ("nvme0n1p2",), "/proc": (), "/mnt/disks/a": ("nvme1n1p1",),
        "/mnt/disks/b": ("dm-0",), "/var/lib/elasticsearch": ("nvme1n1p1",),
        "/mnt/disks/scratch": (), "/mnt/my disk": (), "/mnt/disks/a/inner": ("nvme0n1p3",),
    }  # fmt: skip


def test_a_dev_block_link_that_leaves_the_root_names_no_device(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sysfs_with_devices(tmp_path / "sys")
    link = tmp_path / "sys/dev/block/259:5"
    link.unlink()
    link.symlink_to(tmp_path_factory.mktemp("outside"))
    (tmp_path / "mountinfo").write_text(TABLE)
    table = read_mount_table(tmp_path / "mountinfo", tmp_path / "sys")
    assert {m.mount_point: m.blocks for m in table.mounts}["/mnt/disks/a"] == ()


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo", "garbage", "huge"])
def test_an_unreadable_table_is_a_problem_naming_it_never_an_error(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.topology import mounts

    table = tmp_path / "mountinfo"
    if kind == "folder":
        table.mkdir()
    elif kind == "fifo":
        os.mkfifo(table)
    elif kind == "garbage":
        table.write_bytes(b"\xff\xfe not a table\n")
    elif kind == "huge":
        monkeypatch.setattr(mounts, "MAX_TABLE_BYTES", 1000)
        table.write_text(TABLE * 20)
    found = read_mount_table(table, tmp_path)
    assert found.mounts == ()
    assert found.problem is not None
    assert str(table) in found.problem


def test_a_table_of_more_mounts_than_read_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from numa_device_plugin.topology import mounts

    monkeypatch.setattr(mounts, "MAX_MOUNTS", 3)
    with pytest.raises(ValueError, match="more than 3 mounts"):
        parse_mountinfo(TABLE)


def test_a_filesystem_of_major_0_has_no_block_device_whatever_sysfs_links(
    tmp_path: Path,
) -> None:
    """Major 0 is the kernel's anonymous devices (tmpfs, overlay, NFS): never a disk,
    even where a hostile tree links dev/block/0:40 to one."""
    tree = sysfs_with_devices(tmp_path / "sys")
    os.symlink(os.path.relpath((tree.root / "class/block/nvme1n1").resolve(),
                               tree.root / "dev/block"), tree.root / "dev/block/0:40")  # fmt: skip
    (tmp_path / "mountinfo").write_text(TABLE)
    table = read_mount_table(tmp_path / "mountinfo", tmp_path / "sys")
    assert {m.mount_point: m.blocks for m in table.mounts}["/mnt/disks/scratch"] == ()


def test_a_multi_device_source_names_each_of_its_devices(tmp_path: Path) -> None:
    """bcachefs mounts an anonymous device whose source lists its devices joined by
    ``:``: every one of them is the mount's, each once, in the source's order."""
    sysfs_with_devices(tmp_path / "sys")
    (tmp_path / "mountinfo").write_text(
        "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
        "40 22 0:70 / /mnt/pool rw - bcachefs /dev/nvme1n1p1:/dev/nvme0n1p3:/dev/nvme1n1p1 rw\n"
    )
    table = read_mount_table(tmp_path / "mountinfo", tmp_path / "sys")
    assert table.mounts[-1].blocks == ("nvme1n1p1", "nvme0n1p3")


def test_a_table_without_a_trailing_newline_keeps_its_last_line() -> None:
    mounts = parse_mountinfo(TABLE.rstrip("\n"))
    assert [m.mount_point for m in mounts][-1] == "/mnt/disks/a/inner"
    assert len(mounts) == len(parse_mountinfo(TABLE))


def test_a_mapper_source_names_its_dm_device_and_skips_odd_dm_folders(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``/dev/mapper/NAME`` on an anonymous device (btrfs on LVM) is the dm device whose
    ``dm/name`` is NAME; a dm link leaving the root and a dm device whose name cannot be
    read are passed over, never followed or fatal."""
    root = tmp_path / "sys"
    tree = sysfs_with_devices(root)
    (root / "class/block/dm-0/dm").mkdir(parents=True, exist_ok=True)
    (root / "class/block/dm-0/dm/name").write_text("vg-data\n")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "dm").mkdir()
    (outside / "dm" / "name").write_text("vg-data\n")
    (root / "class/block/dm-1").symlink_to(outside)  # out of the root: not read
    tree.mapped("dm-2", ["nvme0n1p3"])
    (root / "class/block/dm-2/dm").mkdir(parents=True, exist_ok=True)
    (root / "class/block/dm-2/dm/name").mkdir()  # unreadable as text
    (tmp_path / "mountinfo").write_text(
        "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
        "40 22 0:70 / /mnt/lvm rw - btrfs /dev/mapper/vg-data rw\n"
        "41 22 0:71 / /mnt/gone rw - btrfs /dev/mapper/nothing rw\n"
    )
    table = read_mount_table(tmp_path / "mountinfo", root)
    assert table.problem is None
    assert [m.blocks for m in table.mounts[1:]] == [("dm-0",), ()]


@pytest.mark.parametrize("fs_type", ["tmpfs", "overlay", "fuse.sshfs", "proc", "vfat", "nfs4"])
def test_a_filesystem_without_a_block_device_is_on_no_disk_whatever_its_source(
    tmp_path: Path, fs_type: str
) -> None:
    """Mount sources are free text: a tmpfs (or an overlay, a FUSE mount...) on an
    anonymous device whose source says /dev/nvme1n1p1 holds nothing of that disk, so
    ``path:`` says it has no locality, never NUMA node 1; btrfs and bcachefs, whose
    sources name their devices, still resolve."""
    from numa_device_plugin.topology.locality import read_inventory
    from numa_device_plugin.topology.selectors import parse_selector, select

    root = tmp_path / "sys"
    sysfs_with_devices(root)
    (tmp_path / "mountinfo").write_text(
        "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
        f"40 22 0:70 / /mnt/odd rw - {fs_type} /dev/nvme1n1p1 rw\n"
        "41 22 0:71 / /mnt/pool rw - btrfs /dev/nvme1n1p1 rw\n"
    )
    table = read_mount_table(tmp_path / "mountinfo", root)
    assert [m.blocks for m in table.mounts[1:]] == [(), ("nvme1n1p1",)]
    inventory = read_inventory(root)
    odd = select(inventory, parse_selector("path:/mnt/odd"), table)
    assert odd.nodes == frozenset()
    assert odd.reason is not None
    assert "which is no block device: no locality" in odd.reason
    assert select(inventory, parse_selector("path:/mnt/pool"), table).nodes == {1}


def line_by_line(data: bytes) -> tuple[Mount, ...] | str:
    """The reference for parse_mountinfo's whole-table path: parse_line on each line
    that is not blank, or the error's text."""
    mounts = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if raw.strip():
            try:
                mounts.append(parse_line(raw.decode("utf-8", "replace"), number))
            except ValueError as exc:
                return str(exc)
    return tuple(mounts)


FIELDS = ["1", "22", "0", "259:2", "8:1", "0:40", "/", "/a", "/a\\040b", "a", "", "-",
          "rw", "shared:1", "master:3", "xfs", "/dev/x", "\\134", "é", "\xff", "\t", "\r",
          "99999999999", "\u0661", "-x", "x-"]  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_the_whole_table_reading_gives_what_each_line_gives(seed: int) -> None:
    """parse_mountinfo reads a usual table with one regular expression: on tables of
    usual, odd and broken lines (fields shuffled, escapes, bytes that are not UTF-8,
    blank lines, no last newline) it gives the same mounts, or the same error, as
    parse_line on each line."""
    chance = random.Random(seed)
    odd = seed % 2  # half the tables only of usual lines: the whole-table path
    lines = []
    for _ in range(chance.randint(1, 30)):
        if not odd or chance.random() < 0.6:  # a usual line; in odd tables, changed
            fields = [str(chance.randint(1, 99)), str(chance.randint(1, 99)),
                      f"{chance.randint(0, 300)}:{chance.randint(0, 9)}", "/",
                      chance.choice(["/", "/mnt/a", "/mnt/a\\040b", "/x/é"]), "rw",
                      *chance.sample(["shared:1", "master:2", "-x"], chance.randint(0, 2)),
                      "-", chance.choice(["xfs", "tmpfs", "-"]),
                      chance.choice(["/dev/x", "none", "a\\134b", "-"]), "rw"]  # fmt: skip
            if odd and chance.random() < 0.3:
                fields[chance.randrange(len(fields))] = chance.choice(FIELDS)
            if odd and chance.random() < 0.2:
                fields = fields[: chance.randint(6, len(fields))]
        else:
            fields = [chance.choice(FIELDS) for _ in range(chance.randint(0, 12))]
        lines.append(" ".join(fields))
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    data = data.replace("\xff".encode(), b"\xff") + (b"\n" if chance.random() < 0.7 else b"")
    expected = line_by_line(data)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            parse_mountinfo(data)
    else:
        assert parse_mountinfo(data) == expected


def test_a_line_of_many_optional_fields_reads_as_parse_line_reads_it() -> None:
    """Past the fast path's 16 optional fields a line goes to parse_line: the same
    mount (a hostile 16 MiB line of fields no longer costs the whole-table expression
    a second and more)."""
    many = "22 1 8:1 / / rw " + " ".join(f"shared:{i}" for i in range(40)) + " - ext4 /dev/a rw\n"
    (mount,) = parse_mountinfo(many)
    assert mount == parse_line(many.rstrip("\n"), 1)
    assert (mount.mount_point, mount.fs_type, mount.source) == ("/", "ext4", "/dev/a")
