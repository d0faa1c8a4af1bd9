"""``path:`` never names a wrong disk: the mount visible at a path as the kernel resolves
it (the mount tree, not the longest mount point), a table with odd mount points, btrfs
and other anonymous-device filesystems, unmounted and hidden data disks, symlinks and
escapes; on synthetic tables and, where this machine lets us, on the real kernel in a
private mount namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from numa_device_plugin.topology.locality import read_inventory
from numa_device_plugin.topology.mounts import MountTable, parse_mountinfo, read_mount_table
from numa_device_plugin.topology.selectors import Selection, parse_selector, select
from tests.topology.test_mounts import TABLE, sysfs_with_devices

ROOT = "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"


def selected(tmp_path: Path, table: str, selector: str) -> Selection:
    """What ``selector`` picks on test_mounts' machine (nvme0n1 on NUMA node 0, its
    partitions p1-p3; nvme1n1p1 on node 1; dm-0 over both p1s) with mountinfo ``table``."""
    root = tmp_path / "sys"
    if not root.exists():
        sysfs_with_devices(root)
    (tmp_path / "mountinfo").write_bytes(table.encode())
    mounts = read_mount_table(tmp_path / "mountinfo", root)
    assert mounts.problem is None, mounts.problem
    return select(read_inventory(root), parse_selector(selector), mounts)


def test_an_unmounted_data_disk_selects_nothing_never_the_root_disk(tmp_path: Path) -> None:
    """A nofail data mount that failed at boot: the path is a folder of the root
    filesystem, whose disk is not the data disk."""
    selection = selected(tmp_path, ROOT, "path:/mnt/disks/a")
    assert selection.nodes == frozenset()
    assert selection.reason == (
        "path:/mnt/disks/a: nothing is mounted there: it is on the root filesystem "
        "(ext4 /dev/nvme0n1p2 at /), which is never taken for a data disk; mount the disk "
        "at /mnt/disks/a (a symlink is not followed: name the mount point itself), or "
        "select the root disk with path:/"
    )
    assert selection.by_node == ()


@pytest.mark.parametrize(
    ("table", "selector"),
    [
        # a folder of the root filesystem bound at the data disk's mount point
        (ROOT + "30 22 259:2 /srv/a /mnt/disks/a rw - ext4 /dev/nvme0n1p2 rw\n",
         "path:/mnt/disks/a"),
        # the root filesystem mounted again over /var/lib (a btrfs subvolume is the same)
        (ROOT + "30 22 259:2 /var/lib /var/lib rw - ext4 /dev/nvme0n1p2 rw\n",
         "path-below:/var/lib/elasticsearch"),
    ],
)  # fmt: skip
def test_the_root_filesystem_bound_elsewhere_is_never_taken_for_a_data_disk(
    tmp_path: Path, table: str, selector: str
) -> None:
    """A bind mount shows the filesystem it binds: a folder of the root filesystem bound
    at /mnt/disks/a is the root disk, which path: takes only as path:/ (as when nothing
    is mounted there)."""
    selection = selected(tmp_path, table, selector)
    assert selection.nodes == frozenset()
    assert selection.reason is not None
    assert "is the root filesystem's (ext4 /dev/nvme0n1p2 at /) bound or mounted again" in (
        selection.reason
    )
    assert "select the root disk with path:/" in selection.reason
    assert selected(tmp_path, table, "path:/").nodes == frozenset({0})


def test_a_mount_hidden_by_a_later_mount_over_its_parent_is_not_chosen(tmp_path: Path) -> None:
    """/mnt/disks/a (nvme1n1p1, node 1) mounted first, then nvme0n1p3 over /mnt: a
    process sees /mnt's filesystem at /mnt/disks/a, and so does the selector."""
    table = (
        ROOT + "30 22 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"
        "40 22 259:6 / /mnt rw - ext4 /dev/nvme0n1p3 rw\n"
    )
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.nodes == frozenset()
    assert selection.reason is not None
    assert "xfs /dev/nvme1n1p1 at /mnt/disks/a is hidden by ext4 /dev/nvme0n1p3 at /mnt" in (
        selection.reason
    )
    # and path-below: does not take the hiding mount either
    assert selected(tmp_path, table, "path-below:/mnt/disks/a").nodes == frozenset()
    # the same mount, mounted after /mnt (a child of it): visible, selected
    visible = (
        ROOT
        + "40 22 259:6 / /mnt rw - ext4 /dev/nvme0n1p3 rw\n"
        + ("30 40 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n")
    )
    assert selected(tmp_path, visible, "path:/mnt/disks/a").nodes == {1}


def test_the_mount_tree_decides_not_the_order_or_length_of_mount_points() -> None:
    """Children listed before their parents, a stack of three at one point, a child of a
    mount that was mounted over: each path gets the mount a process sees."""
    table = MountTable(parse_mountinfo(
        "50 41 8:3 / /mnt/disks/a/inner rw - ext4 /dev/sda3 rw\n"  # a child of the top one
        "41 40 8:2 / /mnt/disks/a rw - ext4 /dev/sda2 rw\n"  # over 40
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 8:5 / /mnt/disks/a rw - ext4 /dev/sda5 rw\n"
        "60 40 8:6 / /mnt/disks/a/inner rw - ext4 /dev/sda6 rw\n"  # on the hidden one
        "42 41 8:7 / /mnt/disks/a rw - ext4 /dev/sda7 rw\n"  # over 41: the top
        "43 22 8:8 / /mnt/disks rw - ext4 /dev/sda8 rw\n"  # after a: hides the stack
    ))  # fmt: skip

    def seen(path: str) -> str | None:
        mount = table.holding(path)
        return None if mount is None else mount.source

    assert seen("/mnt/disks/a/inner/x") == "/dev/sda8"
    assert seen("/mnt/disks") == "/dev/sda8"
    assert seen("/etc") == "/dev/sda1"
    unhidden = MountTable(tuple(m for m in table.mounts if m.mount_id != 43))
    assert unhidden.holding("/mnt/disks/a") is not None
    assert unhidden.holding("/mnt/disks/a").source == "/dev/sda7"  # type: ignore[union-attr]
    assert unhidden.holding("/mnt/disks/a/inner").source == "/dev/sda7"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("", None),  # nothing
        ("40 41 8:5 / /mnt rw - ext4 /dev/sda5 rw\n41 40 8:6 / / rw - ext4 /dev/sda6 rw\n", None),
        # a mount listed as its own parent is a root (proc(5)); one at /mnt is no child
        (
            "22 22 8:1 / / rw - ext4 /dev/sda1 rw\n23 23 8:2 / /mnt rw - ext4 /dev/sda2 rw\n",
            "/dev/sda1",
        ),
        ("22 1 8:1 / /x rw - ext4 /dev/sda1 rw\n", None),  # no root at /
    ],
    ids=["empty", "parent-loop", "self-parents", "rootless"],
)
def test_a_table_without_a_root_mount_or_with_loops_holds_nothing_or_the_root(
    table: str, expected: str | None
) -> None:
    found = MountTable(parse_mountinfo(table)).holding("/mnt/disks/a")
    assert (None if found is None else found.source) == expected


def test_a_mount_whose_parents_loop_is_named_unreachable_not_hidden_by_root(
    tmp_path: Path,
) -> None:
    """/mnt/disks/a's parent 31 and 31's parent 30 loop: nothing at the path hangs from
    the root. The reason says so (it said "hidden by ... at /; unmount /")."""
    table = (
        ROOT + "30 31 259:6 / /mnt rw - ext4 /dev/nvme0n1p3 rw\n"
        "31 30 259:6 / /mnt/disks rw - ext4 /dev/nvme0n1p3 rw\n"
        "32 31 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"
    )
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.nodes == frozenset()
    assert selection.reason is not None
    assert "is listed but not reachable from the root mount" in selection.reason
    assert "unmount /" not in selection.reason


def test_a_table_of_two_root_mounts_holds_nothing_and_says_why(tmp_path: Path) -> None:
    """Two mounts at / whose parents are not listed: the kernel writes one (a mount over
    / has the one below as its parent). Which holds /mnt/disks/a is open (the second
    root's, the later, used to win and every mount under the first was lost): none."""
    table = (
        ROOT + "30 22 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n"
        "40 2 259:6 / / rw - ext4 /dev/nvme0n1p3 rw\n"
    )
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.nodes == frozenset()
    assert selection.reason == (
        "path:/mnt/disks/a: no mount holds it: the table has 2 root mounts (at / with no "
        "parent listed): not a table the kernel writes, and which holds a path is open"
    )


def test_a_root_mount_listed_as_its_own_parent_is_the_root_and_holds_its_children() -> None:
    """proc(5): the root of a mount namespace may name itself as its parent. It is the
    root, and the mounts below it are found through it."""
    table = MountTable(parse_mountinfo(
        "22 22 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 8:2 / /mnt/disks/a rw - xfs /dev/sda2 rw\n"
    ))  # fmt: skip
    assert [m.source if m else None for m in map(table.holding, ("/etc", "/mnt/disks/a/x"))] == [
        "/dev/sda1",
        "/dev/sda2",
    ]


def test_of_two_mounts_at_one_point_under_one_parent_the_later_listed_is_seen() -> None:
    """Mounted twice at one point of one parent (a mount over a mount that shares its
    parent, as a racing automounter leaves it): the line listed later is the one on top."""
    table = MountTable(parse_mountinfo(
        ROOT
        + "30 22 8:2 / /mnt/disks/a rw - xfs /dev/sda2 rw\n"
        + "31 22 8:3 / /mnt/disks/a rw - xfs /dev/sda3 rw\n"
    ))  # fmt: skip
    found = table.holding("/mnt/disks/a/file")
    assert found is not None
    assert found.source == "/dev/sda3"


def test_a_stack_whose_mount_ids_loop_ends_instead_of_spinning() -> None:
    """A hostile table repeating a mount ID so that a stack at one point comes back to a
    mount already climbed (30 -> 31 -> 30 again): :meth:`MountTable.holding` stops at the
    last new mount of the stack, where the device watch's thread would otherwise spin
    forever. Run in a child process, killed if it spins."""
    table = (
        ROOT
        + "30 22 8:2 / /mnt rw - xfs /dev/sda2 rw\n"
        + "31 30 8:3 / /mnt rw - xfs /dev/sda3 rw\n"
        + "30 31 8:4 / /mnt rw - xfs /dev/sda4 rw\n"
    )
    code = (
        "import sys\n"
        "from numa_device_plugin.topology.mounts import MountTable, parse_mountinfo\n"
        "print(MountTable(parse_mountinfo(sys.stdin.read())).holding('/mnt/x').source)\n"
    )
    try:
        # milliseconds when it ends; a spinning holding() never does
        found = subprocess.run([sys.executable, "-c", code], input=table, text=True,
                               capture_output=True, timeout=60, check=True)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("holding() spins on a looping stack")
    assert found.stdout == "/dev/sda3\n"


ODD = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("odd", ODD, ids=[f"U+{ord(c):04X}" for c in ODD])
def test_a_mount_point_with_a_character_str_splitlines_breaks_on_blinds_nothing(
    tmp_path: Path, odd: str
) -> None:
    """The kernel escapes only space, tab, newline and backslash: a USB stick labelled
    with any other character is one line of the table, not a malformed one."""
    table = TABLE + f"90 22 0:50 / /media/usb{odd}stick rw - vfat /dev/sdz1 rw\n"
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.nodes == {1}
    mounts = parse_mountinfo(table)
    assert mounts[-1].mount_point == f"/media/usb{odd}stick"
    assert "\\" in str(mounts[-1]) or odd.isprintable()  # shown escaped in reasons


def test_a_table_of_blank_lines_costs_no_more_memory_than_its_bytes() -> None:
    data = b"\n" * (4 << 20) + ROOT.encode()
    tracemalloc.start()
    try:
        mounts = parse_mountinfo(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [m.mount_point for m in mounts] == ["/"]
    assert peak < len(data) // 4, f"peak {peak} bytes for a {len(data)}-byte table"


RAID1 = "0c6f1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f"  # a btrfs's fsid, its UUID in /dev/disk/by-uuid


def btrfs_tree(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    sysfs_with_devices(root)
    for fsid, names in ((RAID1, ["nvme1n1p1", "nvme0n1p1"]), ("77aa-b", ["nvme0n1p3"])):
        folder = root / "fs" / "btrfs" / fsid / "devices"
        folder.mkdir(parents=True)
        for name in names:
            os.symlink(os.path.relpath(root / "class/block" / name, folder), folder / name)
    (root / "fs" / "btrfs" / "features").mkdir()
    (root / "class/block/dm-0").resolve().joinpath("dm").mkdir()
    (root / "class/block/dm-0").resolve().joinpath("dm/name").write_text("vg-data\n")


@pytest.mark.parametrize(
    ("source", "nodes", "matched"),
    [
        ("/dev/nvme0n1p3", {0}, ["nvme0n1p3"]),  # a one-disk btrfs
        ("/dev/nvme1n1p1", {0, 1}, ["nvme0n1p1", "nvme1n1p1"]),  # a raid1 over two sockets
        ("/dev/mapper/vg-data", {0, 1}, ["dm-0"]),  # on LVM, by its dm name
        ("/dev/nvme9n1", set(), []),  # no such disk
        ("/dev/../../etc/passwd", set(), []),  # no kernel name
        ("/dev/mapper/missing", set(), []),
        # mounted by UUID: a btrfs's UUID is its fsid, fs/btrfs/<fsid>/devices lists it
        (f"/dev/disk/by-uuid/{RAID1}", {0, 1}, ["nvme0n1p1", "nvme1n1p1"]),
        ("/dev/disk/by-uuid/00000000-0000-4000-8000-000000000000", set(), []),
        ("/dev/disk/by-uuid/../../../etc", set(), []),
        # other /dev/disk links are udev's, not in sysfs: not followed, no block device
        ("/dev/disk/by-label/data", set(), []),
    ],
)
def test_btrfs_on_an_anonymous_device_selects_the_disks_of_its_source_and_fs_btrfs(
    tmp_path: Path, source: str, nodes: set[int], matched: list[str]
) -> None:
    btrfs_tree(tmp_path)
    table = ROOT + f"30 22 0:45 /@data /mnt/disks/a rw - btrfs {source} rw,subvol=/@data\n"
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.nodes == nodes
    assert sorted(selection.matched) == matched
    if not nodes:
        assert selection.reason is not None
        assert "which is no block device" in selection.reason


@pytest.mark.parametrize("stale", ["00aa-stale", "ffaa-stale"])  # listed before and after
def test_a_device_listed_under_two_btrfs_fsids_gives_only_its_own_disk(
    tmp_path: Path, stale: str
) -> None:
    """nvme1n1p1 under the raid1's fsid and under a stale one with nvme0n1p3: which is
    mounted is open, so only the source's own device is taken, whatever the fsids' order
    (it was the union of those listed before the other)."""
    btrfs_tree(tmp_path)
    folder = tmp_path / "sys" / "fs" / "btrfs" / stale / "devices"
    folder.mkdir(parents=True)
    for name in ("nvme1n1p1", "nvme0n1p3"):
        os.symlink(os.path.relpath(tmp_path / "sys/class/block" / name, folder), folder / name)
    table = ROOT + "30 22 0:45 / /mnt/disks/a rw - btrfs /dev/nvme1n1p1 rw\n"
    selection = selected(tmp_path, table, "path:/mnt/disks/a")
    assert selection.matched == ("nvme1n1p1",)
    assert selection.nodes == frozenset({1})


def test_a_filesystem_without_a_dev_source_on_an_anonymous_device_is_no_block_device(
    tmp_path: Path,
) -> None:
    btrfs_tree(tmp_path)
    table = ROOT + "30 22 0:45 / /mnt/disks/a rw - tmpfs nvme1n1p1 rw\n"
    assert selected(tmp_path, table, "path:/mnt/disks/a").nodes == frozenset()


def test_an_escaped_selector_names_a_mount_point_with_a_trailing_space(tmp_path: Path) -> None:
    table = ROOT + "30 22 259:5 / /mnt/disk\\040 rw - xfs /dev/nvme1n1p1 rw\n"
    assert selected(tmp_path, table, "path:/mnt/disk\\040").nodes == {1}
    assert str(parse_selector("path:/mnt/disk\\040")) == "path:/mnt/disk\\040"
    # written plainly, the trailing space is stripped as any selector's: another path
    assert selected(tmp_path, table, "path:/mnt/disk ").nodes == frozenset()
    # decoded once: \134040 is a backslash and the text 040
    assert parse_selector("path:/a\\134040").value == "/a\\040"


def test_a_symlink_to_a_mount_is_not_followed_and_says_so(tmp_path: Path) -> None:
    """/data -> /mnt/disks/a on the host: the plugin sees only the mount table, where
    nothing is mounted at /data; it refuses rather than guess."""
    selection = selected(tmp_path, TABLE, "path:/data")
    assert selection.nodes == frozenset()
    assert selection.reason is not None
    assert "a symlink is not followed: name the mount point itself" in selection.reason


# -- the real kernel ------------------------------------------------------------------

PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from numa_device_plugin.topology.mounts import MountTable, parse_mountinfo
base = sys.argv[1]
table = MountTable(parse_mountinfo(open("/proc/self/mountinfo", "rb").read()))
found = {}
for path in sys.argv[3:]:
    st = os.stat(path)
    mount = table.holding(path)
    found[path] = [[os.major(st.st_dev), os.minor(st.st_dev)], list(mount.device)]
print(json.dumps(found))
"""


def test_the_kernel_sees_the_mount_the_table_says_is_visible(tmp_path: Path) -> None:
    """In a private mount namespace: tmpfs at mnt/disks/a, one stacked over it, one
    mounted over mnt afterwards (hiding both), one under a name with a carriage return
    and U+2028; for each path the device holding() gives is the one stat() sees."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    base = tmp_path / "k"
    odd = base / "odd\r\u2028x" / "in"
    for folder in (base / "mnt/disks/a", base / "mnt/disks/b", base / "keep/a", odd):
        folder.mkdir(parents=True)
    script = f"""
set -e
mount -t tmpfs a '{base}/mnt/disks/a'
mount -t tmpfs a2 '{base}/mnt/disks/a'
mkdir '{base}/mnt/disks/a/deep'
mount -t tmpfs keep '{base}/keep/a'
mount -t tmpfs odd "$ODD"
mkdir -p '{base}/mnt/disks/b'
mount -t tmpfs b '{base}/mnt/disks/b'
mount -t tmpfs hide '{base}/mnt'
mkdir -p '{base}/mnt/disks/a'
exec "$PYTHON" -c "$PROBE" '{base}' "$REPO" "$@"
"""
    paths = [str(base / p) for p in ("mnt/disks/a", "mnt", "keep/a", "keep")] + [str(odd)]
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHON": sys.executable, "PROBE": PROBE, "REPO": repo, "ODD": str(odd)}
    run = subprocess.run(
        [unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh", *paths],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip(f"no private mount namespace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    for path, (kernel, table) in found.items():
        assert kernel == table, f"{path}: the kernel sees {kernel}, the table says {table}"
    # and the hidden stack is not what mnt/disks/a shows
    assert found[paths[0]][0] == found[paths[1]][0]


def test_visible_mounts_are_what_holding_finds_at_their_points_on_random_tables() -> None:
    """MountTable.visible (all mounts at once) against holding() at each mount's point,
    on tables with stacks, mounts over parents, children listed before parents, odd
    names sharing prefixes (/a, /a-b, /a/b) and repeated IDs."""
    import random

    points = ["/a", "/a/b", "/a-b", "/a/b/c", "/b", "/a/b/c/d", "/ab", "/a//b", "/"]
    for seed in range(300):
        rng = random.Random(seed)
        lines = ["1 0 8:1 / / rw - ext4 /dev/sda1 rw"]
        for index in range(rng.randint(1, 12)):
            mount_id = rng.randint(2, 14)
            parent = rng.choice([1, *range(2, 14)])
            lines.append(f"{mount_id} {parent} 8:{index + 2} / {rng.choice(points)} rw "
                         f"- ext4 /dev/x{index} rw")  # fmt: skip
        rng.shuffle(lines)
        table = MountTable(parse_mountinfo("\n".join(lines) + "\n"))
        for mount in table.mounts:
            assert table.visible(mount) == (table.holding(mount.mount_point) is mount), (
                seed, mount, lines,
            )  # fmt: skip


def test_visibility_of_a_table_of_deep_mount_points_costs_its_bytes_not_their_square() -> None:
    """4,000 tmpfs mounts 2,040 components deep (within the table's 16 MiB): one walk from
    the root per mount took 8.7 s, twice a look; all at once it is one pass. Counted in
    walks, not timed: holding() is never called."""
    from unittest import mock

    deep = "/a" * 2040
    lines = ["22 1 8:1 / / rw - ext4 /dev/sda1 rw"] + [
        f"{100 + i} 22 0:{i} / {deep}{i} rw - tmpfs tmpfs rw" for i in range(4000)
    ]
    table = MountTable(parse_mountinfo("\n".join(lines) + "\n"))
    with mock.patch.object(MountTable, "holding", side_effect=AssertionError("a walk")):
        assert all(table.visible(mount) for mount in table.mounts)
