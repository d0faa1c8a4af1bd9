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
