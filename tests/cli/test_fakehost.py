"""``fake-host``: a server to try the plugin on without ../shared or a cluster, its
sysfs and its mount table side by side, read by discover and demo as they read a real
one (path: through the mount table and dev/block, net: through class/net)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import run_main

NEAR = ["--near", "ch=path:/data/ch", "--near", "kafka=path:/data/kafka",
        "--near", "nic=net:ens1f0"]  # fmt: skip


@pytest.mark.parametrize(("swapped", "ch", "kafka"), [(False, 0, 1), (True, 1, 0)])
def test_one_configuration_follows_each_disk_on_both_fake_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], swapped: bool, ch: int, kafka: int
) -> None:
    """The first day's recipe: ClickHouse and Kafka by mount point, the NIC by name, on
    a server and on one cabled the other way round, with discover --check and demo."""
    host = tmp_path / "host"
    code, out, _ = run_main(["fake-host", str(host), *(["--swapped"] if swapped else [])],
                            capsys)  # fmt: skip
    assert code == 0
    assert f"numa-device-plugin discover --sysfs-root {host / 'sys'}" in out
    args = ["--sysfs-root", str(host / "sys"), *NEAR]
    code, out, _ = run_main(["discover", *args, "--check", "--output", "json"], capsys)
    assert code == 0  # every resource advertised
    found = {e["resource"]: e for e in json.loads(out)["near"]}
    assert found["numa-align/ch"]["nodes"] == [ch]
    assert found["numa-align/kafka"]["nodes"] == [kafka]
    assert found["numa-align/nic"]["nodes"] == [1]
    assert found["numa-align/ch"]["by_node"] == {str(ch): [f"nvme{ch}n1"]}
    code, out, _ = run_main(["demo", *args, "--capacity", "2"], capsys)  # over real gRPC
    assert code == 0
    assert f'{{"NUMA_NEAR_CH": "nvme{ch}n1", "NUMA_NODE": "{ch}"}}' in out  # keys sorted
    assert f"numa-align/kafka: 2 devices (2 Healthy), TopologyInfo NUMA node(s) [{kafka}]" in out


def test_a_fake_host_is_written_only_into_a_new_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kept").write_text("a file of the user's")
    code, _, err = run_main(["fake-host", str(tmp_path)], capsys)
    assert code == 2
    assert "is not an empty folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    code, _, err = run_main(["fake-host", str(tmp_path / "x"), "--machine", "gb200"], capsys)
    assert code == 2
    assert "'gb200' is not 'two-socket-storage'" in err
