"""``discover``: its JSON and table on synthetic trees and every real snapshot, memory
resources, malformed and odd sysfs files, each NUMA node's devices and the resources
that follow a device (bad and hostile ``--near`` refused with usage), and the
inventory's lines escaped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import SysfsTree
from tests.cli.test_cli import NAMES, run_main
from tests.topology.test_topology import SNAPSHOT_TABLE


def test_discover_json_shape(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    table = tmp_path / "mountinfo"  # not this machine's: its mounts are no part of the tree
    table.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n23 22 0:40 / /mnt/nfs rw - nfs4 h:/x rw\n"
    )
    code, out, _ = run_main(
        ["discover", "--sysfs-root", str(two_nodes.root), "--mount-table", str(table),
         "--output", "json"], capsys,
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "nodes": [
            {
                "id": 0,
                "cpus": "0-3",
                "memory_bytes": 1073741824,
                "distances": {"0": 10, "1": 21},
                "hugepages": {},
                "advertised": True,
                "reason": None,
                "devices": {"disks": [], "nics": [], "accelerators": [], "pci": 0},
                "sockets": [],
                "nearest": None,
            },
            {
                "id": 1,
                "cpus": "4-7",
                "memory_bytes": 1073741824,
                "distances": {"0": 21, "1": 10},
                "hugepages": {},
                "advertised": True,
                "reason": None,
                "devices": {"disks": [], "nics": [], "accelerators": [], "pci": 0},
                "sockets": [],
                "nearest": None,
            },
        ],
        "resources": NAMES,
        "devices": dict.fromkeys(NAMES, 100),
        "spanning": {},
        "near": [],
        "unlocated_pci": 0,
        "inventory": {
            "disks": [],
            "nics": [],
            "accelerators": [],
            "mounts": [{"point": "/mnt/nfs", "type": "nfs4"}],
        },
    }


def test_discover_shows_memory_resources_with_memory_unit(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """1 GiB per NUMA node, 2 MiB pages on node 1: its memory resource counts what is
    left beside the hugepages, over the unit."""
    two_nodes.write("node/node1/hugepages/hugepages-2048kB/nr_hugepages", "128\n")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--memory-unit", "256Mi"]
    code, out, _ = run_main([*args, "--output", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["nodes"][1]["hugepages"] == {"2Mi": 128}
    assert document["devices"] == {
        "numa-align/numa-0": 100,
        "numa-align/numa-0-memory": 4,
        "numa-align/numa-1": 100,
        "numa-align/numa-1-memory": 3,
        "numa-align/numa-1-hugepages-2mi": 1,
    }
    code, out, _ = run_main(args, capsys)
    assert "numa-align/numa-1-memory (3)" in out.splitlines()[-1]


@pytest.mark.parametrize("command", ["discover", "status", "demo", "serve"])
def test_a_memory_unit_that_makes_too_many_devices_is_a_usage_error_in_every_command(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """1 MiB over 16 GiB per NUMA node is over 10,000 devices: ``discover``, ``status``
    and ``demo`` once ended in a MemoryUnitError traceback (``serve`` exited 2)."""
    for node in (0, 1):
        two_nodes.node(node, mem_kb=16 << 20)
    args = [command, "--sysfs-root", str(two_nodes.root), "--memory-unit", "1Mi"]
    if command == "serve":
        args += ["--socket-dir", str(tmp_path / "dp")]
    code, _, err = run_main(args, capsys)
    assert code == 2, err
    assert "Invalid value for '--memory-unit'" in err
    assert "more than 10000" in err
    assert "Traceback" not in err


def test_discover_table(two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["discover", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "CPUS", "MEMORY_BYTES", "DISTANCES", "ADVERTISED", "REASON"]
    assert lines[1].split() == ["0", "0-3", "1073741824", "0:10,1:21", "yes"]
    assert lines[-1] == "resources (devices): numa-align/numa-0 (100), numa-align/numa-1 (100)"


def test_discover_malformed_sysfs_exits_1_naming_the_file(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/node1/cpulist", "4-ten\n")
    code, _, err = run_main(["discover", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 1
    assert "node1/cpulist" in err
    assert "'4-ten'" in err


def test_discover_with_odd_informative_files_reports_null_and_warns(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/node1/distance", "0\n")
    two_nodes.write("node/node0/meminfo", "Node 0 MemTotal: lots\n")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--output", "json"]
    code, out, err = run_main(args, capsys)
    assert code == 0
    nodes = json.loads(out)["nodes"]
    assert (nodes[0]["memory_bytes"], nodes[1]["distances"]) == (None, None)
    assert nodes[0]["distances"] == {"0": 10, "1": 21}
    assert [node["advertised"] for node in nodes] == [True, True]
    assert "node1/distance" in err
    assert "(content: '0')" in err
    assert "node0/meminfo" in err
    code, out, _ = run_main(args[:-2], capsys)
    assert code == 0
    assert out.splitlines()[1].split()[:4] == ["0", "0-3", "-", "0:10,1:21"]


@pytest.mark.parametrize("name", sorted(SNAPSHOT_TABLE))
def test_discover_json_on_snapshots(
    snapshots_root: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = snapshots_root / name
    code, out, _ = run_main(["discover", "--sysfs-root", str(root), "--output", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    advertised = {n["id"]: n["cpus"] for n in document["nodes"] if n["advertised"]}
    assert advertised == SNAPSHOT_TABLE[name]
    assert [n["id"] for n in document["nodes"]] == sorted(n["id"] for n in document["nodes"])
    assert document["resources"] == [f"numa-align/numa-{i}" for i in sorted(advertised)]
    for node in document["nodes"]:
        assert node["reason"] is None if node["advertised"] else isinstance(node["reason"], str)


def test_discover_lists_each_nodes_devices_and_the_near_resources(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    for index in range(20):
        devices.pci(f"0000:{0x41 + index:02x}:00.0", 1, "0x010802")
        devices.disk(f"nvme{index}n1", f"0000:{0x41 + index:02x}:00.0", serial=f"S{index}")
    devices.pci("0000:00:03.0", -1, "0x020000")
    devices.nic("eno1", "0000:00:03.0")
    near = ["--near", "nvme=pci-class:0108", "--near", "nic=net:eno1", "--near", "d=serial:S3"]
    args = ["discover", "--sysfs-root", str(two_nodes.root), *near]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    assert "  1: disks nvme0n1, nvme1n1," in out
    assert "  no NUMA locality (numa_node -1): 1 PCI device(s)" in out
    assert "near numa-align/nvme (pci-class:0108): NUMA node(s) 1, from 0000:41:00.0" in out
    assert "and 4 more" in out
    assert "near numa-align/d (serial:S3): NUMA node(s) 1, from nvme3n1" in out
    assert (
        "near numa-align/nic: not advertised: net:eno1: no matched device has NUMA locality" in out
    )
    code, out, _ = run_main([*args, "--output", "json"], capsys)
    document = json.loads(out)
    assert [n["devices"]["pci"] for n in document["nodes"]] == [0, 20]
    assert [(e["resource"], e["nodes"], e["matched_count"]) for e in document["near"]] == [
        ("numa-align/nvme", [1], 20),
        ("numa-align/nic", [], 1),
        ("numa-align/d", [1], 1),
    ]
    assert document["devices"]["numa-align/d"] == 100
    assert "numa-align/nic" not in document["devices"]


def test_discover_check_exits_1_naming_each_resource_that_would_not_be_advertised(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pre-flight to gate a rollout on: --check exits 1 when a --near resource would
    not be advertised here (discover alone exits 0 whatever it matched), each named."""
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S0")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--near", "d=serial:S0"]
    assert run_main([*args, "--check"], capsys)[0] == 0
    code, _, err = run_main([*args, "--near", "x=serial:NOPE", "--near", "y=net:eth9"], capsys)
    assert code == 0
    code, out, err = run_main(
        [*args, "--near", "x=serial:NOPE", "--near", "y=net:eth9", "--check", "--output",
         "json"], capsys,
    )  # fmt: skip
    assert code == 1
    assert json.loads(out)["near"][0]["nodes"] == [1]  # printed as without --check
    named = [line for line in err.splitlines() if "would not be advertised" in line]
    assert named == [
        "numa-device-plugin discover: numa-align/x would not be advertised: serial:NOPE: no "
        "disk with that serial matches on this node",
        "numa-device-plugin discover: numa-align/y would not be advertised: net:eth9: no "
        "network interface matches on this node",
    ]


@pytest.mark.parametrize(
    ("near", "why"),
    [
        ("numa-1=serial:S1", "would collide with the NUMA-node resources"),
        ("d=sn:S1", "is not a selector"),
        ("d", "is not NAME=SELECTOR"),
    ],
)
def test_discover_refuses_a_bad_near_with_usage(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], near: str, why: str
) -> None:
    code, _, err = run_main(
        ["discover", "--sysfs-root", str(two_nodes.root), "--near", near], capsys
    )
    assert code == 2
    assert "Usage: numa-device-plugin discover" in err
    assert why in err


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--near", "a" * 120_000 + "=block:sda"], "(120000 characters)"),
        (["--near", "d=serial:" + "s" * 120_000], "needs a value of 1 to 256"),
        (["--near", "d=sn:" + "s" * 120_000], "is not a selector"),
        (["--near", "a" * 120_000], "is not NAME=SELECTOR"),
        ([arg for i in range(65) for arg in ("--near", f"n{i}=block:sda")], "(--near, NUMA_NEAR"),
    ],
    ids=["long-name", "long-serial", "long-bad-selector", "no-equals", "65"],
)
def test_a_hostile_near_gets_a_short_usage_error_naming_near(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], args: list[str], why: str
) -> None:
    """A 120 KB NAME gave 240 KB of stderr, and "at most 64" did not name --near."""
    code, out, err = run_main(["discover", "--sysfs-root", str(two_nodes.root), *args], capsys)
    assert code == 2
    assert why in err
    assert "--near" in err
    assert len(out) + len(err) < 1_500


def test_discover_takes_a_name_twice_as_selectors_that_must_agree(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    devices.pci("0000:42:00.0", 1, "0x020000")
    devices.nic("ens1", "0000:42:00.0")
    devices.pci("0000:01:00.0", 0, "0x020000")
    devices.nic("ens0", "0000:01:00.0")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--output", "json",
            "--near", "osd=serial:S1", "--near", "osd=net:ens1",
            "--near", "split=serial:S1", "--near", "split=net:ens0"]  # fmt: skip
    code, out, _ = run_main(args, capsys)
    assert code == 0
    near = {entry["resource"]: entry for entry in json.loads(out)["near"]}
    assert near["numa-align/osd"]["selector"] == "serial:S1 & net:ens1"
    assert near["numa-align/osd"]["nodes"] == [1]
    assert near["numa-align/split"]["nodes"] == []
    assert near["numa-align/split"]["reason"] == (
        "its devices are on no common NUMA node: serial:S1 on 1; net:ens0 on 0"
    )


@pytest.mark.parametrize("text", ["\x1b]0;owned\x07", "\x1b[2J", "S1\nforged line", "S\u2028x"])
def test_discovers_inventory_lines_show_every_terminal_control_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """A serial, wwid, model or driver from a hostile sysfs printed raw would clear the
    screen or forge a line; JSON keeps it exact."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    tree = build_machine(tmp_path / "sys", nodes=2)
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.pci("0000:17:00.0", 0, "0x020000")
    disk = devices.disk("nvme0n1", "0000:41:00.0", serial=text, wwid=text)
    (disk / "model").write_text(text)
    nic = devices.nic("ens1f0", "0000:17:00.0")
    drivers = tree.root / "bus/pci/drivers" / "d"
    drivers.mkdir(parents=True)
    (nic / "device").symlink_to(".")
    (nic / "driver").symlink_to(os.path.relpath(drivers, nic))
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root)], capsys)
    assert code == 0
    inventory = out[out.index("inventory (select by these):") :]
    assert all(line.isprintable() for line in inventory.splitlines()), inventory
    assert repr(text.strip())[1:-1] in inventory
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root), "--output", "json"],
                            capsys)  # fmt: skip
    (shown,) = json.loads(out)["inventory"]["disks"]
    assert shown["serial"] == text.strip()


def test_discovers_inventory_says_none_for_a_device_without_locality(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk and a NIC whose PCI device has numa_node -1: listed, on NUMA node(s)
    "none", never an empty field."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    tree = build_machine(tmp_path / "sys", nodes=2)
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", -1, "0x010802")
    devices.pci("0000:17:00.0", -1, "0x020000")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    devices.nic("ens1f0", "0000:17:00.0")
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root)], capsys)
    assert code == 0
    assert "  disk nvme0n1: NUMA node(s) none; serial S1" in out
    assert "  NIC ens1f0: NUMA node(s) none; PCI 0000:17:00.0" in out


def test_discover_names_the_partition_matched_and_the_disk_the_pod_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """path: matches the mounted partition; Allocate tells the pod its disk. discover
    said only "from nvme1n1p1" while NUMA_NEAR_DATA said nvme1n1: it says both."""
    from tests.topology.test_mounts import sysfs_with_devices

    root = tmp_path / "sys"
    tree = SysfsTree(root)
    tree.node(0, "0-1")
    tree.node(1, "2-3")
    sysfs_with_devices(root)
    table = tmp_path / "mountinfo"
    table.write_text("22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
                     "30 22 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n")  # fmt: skip
    code, out, _ = run_main(["discover", "--sysfs-root", str(root), "--mount-table", str(table),
                             "--near", "data=path:/mnt/disks/a"], capsys)  # fmt: skip
    assert code == 0
    assert ("near numa-align/data (path:/mnt/disks/a): NUMA node(s) 1, from nvme1n1p1; "
            "NUMA_NEAR_DATA=nvme1n1 in the pod") in out  # fmt: skip


def test_discover_says_where_a_device_on_a_memory_only_node_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.topology.shapes import gb200_like

    tree = gb200_like(tmp_path / "sys")
    table = tmp_path / "mountinfo"
    table.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    code, out, _ = run_main(
        ["discover", "--sysfs-root", str(tree.root), "--mount-table", str(table),
         "--near", "gpu0=pci:0008:01:00.0"], capsys,
    )  # fmt: skip
    assert code == 0
    assert (
        "  2: accel 0008:01:00.0 3D controller (1 PCI); a resource near them follows "
        "NUMA node(s) 0" in out
    )
    assert "accelerator 0008:01:00.0: NUMA node 2 (no CPUs: follows 0);" in out
    assert out.rstrip().endswith(
        "near numa-align/gpu0 (pci:0008:01:00.0): NUMA node(s) 0, from 0008:01:00.0 (3D "
        "controller); NUMA_NEAR_GPU0=0008:01:00.0 in the pod; 0008:01:00.0 is on memory-only "
        "node 2; nearest CPUs: node 0 at distance 80"
    )
