"""``demo``: the plugin against the in-process kubelet stand-in on a synthetic tree and on
this machine, its named configurations chosen by the node's labels as ``serve`` chooses
them, and malformed sysfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import SysfsTree
from tests.cli.test_cli import run_main


def test_demo_on_a_synthetic_tree(two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        ["demo", "--sysfs-root", str(two_nodes.root), "--capacity", "3"], capsys
    )
    assert code == 0
    assert "2 resource(s) registered" in out
    assert "numa-align/numa-1: 3 devices (3 Healthy), TopologyInfo NUMA node(s) [1]" in out
    assert 'Allocate(numa-align/numa-0, [numa0-slot0000]) -> envs {"NUMA_NODE": "0"}' in out


POOLS_FILE = "configs:\n  slots: {capacity: 3}\n  exact: {capacity: cpus}\ndefault: slots\n"


@pytest.mark.parametrize(
    ("labels", "chosen", "device"),
    [
        ([], "slots", "numa0-slot0000"),  # no label: the file's default
        (["--node-label", "numa-align/config=exact"], "exact", "numa0-cpu0000"),
        (["--node-label", "zone=a", "--node-label", "numa-align/config=exact"], "exact",
         "numa0-cpu0000"),
    ],
)  # fmt: skip
def test_demo_chooses_by_the_node_label_as_serve_does(
    two_nodes: SysfsTree,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    labels: list[str],
    chosen: str,
    device: str,
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--config-file", str(pools), *labels]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    if labels:
        assert out.startswith(f"configuration {chosen}, chosen by the node's labels")
    else:  # it printed "chosen by the node's labels (none)"
        assert out.startswith(f"configuration {chosen}, the file's default (no --node-label)")
    assert f"Allocate(numa-align/numa-0, [{device}])" in out


def test_demo_lists_a_resource_that_follows_no_device_in_its_summary(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary left out a near resource that was not advertised (stderr only)."""
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--near", "gpu=pci-class:0302"]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    assert (
        "  numa-align/gpu: not advertised: pci-class:0302: no PCI device of that class "
        "matches on this node\n"
    ) in out


def test_demo_help_says_what_chooses_its_named_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said --config-file needs --node-name, which demo does not have."""
    code, out, _ = run_main(["demo", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "--node-name" not in text.replace("serve reads the labels of --node-name", "")
    assert "demo takes --node-label" in text


def test_demo_with_a_label_naming_no_configuration_exits_1_saying_so(
    two_nodes: SysfsTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--config-file", str(pools),
            "--node-label", "numa-align/config=nope"]  # fmt: skip
    code, _, err = run_main(args, capsys)
    assert code == 1
    assert "label numa-align/config='nope' names no configuration" in err


@pytest.mark.parametrize("label", ["novalue", "=x"])
def test_demo_node_labels_are_key_value_and_need_a_config_file(
    label: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(["demo", "--node-label", "a=b"], capsys)
    assert code == 2
    assert "only applies with --config-file" in err
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    code, _, err = run_main(["demo", "--config-file", str(pools), "--node-label", label], capsys)
    assert code == 2
    assert "is not KEY=VALUE" in err


def test_demo_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/sys/devices/system/cpu").is_dir():
        pytest.skip("this machine has no sysfs")
    code, out, _ = run_main(["demo"], capsys)
    assert code == 0
    assert '"NUMA_NODE"' in out


def test_demo_with_malformed_sysfs_exits_1(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/online", "0-1,x\n")
    code, _, err = run_main(["demo", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 1
    assert "node/online" in err


def test_the_status_command_the_demo_prints_reads_its_mount_table(tmp_path: Path) -> None:
    """Run as printed, status left out --mount-table: its path: rows vanished and the
    warning named the real machine's root disk."""
    from numa_device_plugin.cli.demo import status_argv
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.plugin.settings.config import Config

    table = tmp_path / "host" / "proc" / "1" / "mountinfo"
    config = Config(sysfs_root=tmp_path / "host" / "sys", socket_dir=tmp_path / "dp",
                    near=(parse_near("data=path:/mnt/disks/a"),), mount_table=table)  # fmt: skip
    argv = status_argv(config)
    assert argv[argv.index("--mount-table") + 1] == str(table)
    assert argv[argv.index("--sysfs-root") + 1] == str(tmp_path / "host" / "sys")


def _fake_host(tmp_path: Path) -> SysfsTree:
    """A fake host: HOST/sys (two NUMA nodes, nvme1n1p1 on node 1) and, when asked,
    HOST/proc/1/mountinfo beside it."""
    from tests.topology.test_mounts import sysfs_with_devices

    tree = SysfsTree(tmp_path / "host" / "sys")
    tree.node(0, "0-1")
    tree.node(1, "2-3")
    sysfs_with_devices(tree.root)
    return tree


def test_a_sysfs_tree_without_its_mount_table_is_refused_for_path_selectors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sysfs-root with the machine's own mount table mixed this machine's mounts with
    another tree's disks (a wrong disk or none, silently)."""
    tree = _fake_host(tmp_path)
    args = ["discover", "--sysfs-root", str(tree.root), "--near", "data=path:/mnt/disks/a"]
    code, _, err = run_main(args, capsys)
    assert code == 2
    assert "is not this machine's /sys, but the mount table is (/proc/1/mountinfo)" in err
    assert "Give that tree's table with --mount-table" in err
    assert run_main(["discover", "--sysfs-root", str(tree.root)], capsys)[0] == 0  # no path:


def test_a_sysfs_tree_with_its_own_mount_table_beside_it_reads_that_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _fake_host(tmp_path)
    table = tmp_path / "host" / "proc" / "1" / "mountinfo"
    table.parent.mkdir(parents=True)
    table.write_text("22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
                     "30 22 259:5 / /mnt/disks/a rw - xfs /dev/nvme1n1p1 rw\n")  # fmt: skip
    args = ["discover", "--sysfs-root", str(tree.root), "--near", "data=path:/mnt/disks/a"]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    assert "near numa-align/data (path:/mnt/disks/a): NUMA node(s) 1, from nvme1n1p1" in out
    # demo reads the same table, and takes --device-interval (a device lost or moved
    # shows without a cluster)
    code, out, _ = run_main(["demo", "--sysfs-root", str(tree.root), "--capacity", "2",
                             "--device-interval", "1", *args[3:]], capsys)  # fmt: skip
    assert code == 0
    assert "numa-align/data: 2 devices (2 Healthy), TopologyInfo NUMA node(s) [1]" in out
