"""The soak (short run) and the benchmark scripts, as .ci/run runs them.

Figures are not asserted here (targets live in the benchmark output); these
tests check behaviour: the soak's end state, and that each benchmark runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench
from benchmarks.harness import PACE, percentile
from benchmarks.soak import soak


async def test_soak_100_restarts_ends_with_one_live_registration_per_resource() -> None:
    """Invariants only (growth thresholds belong to `make soak`): one live registration
    per resource, no hung Allocate, open fds back near their baseline once settled (grpc
    may hold one closed channel's connection per peer and resource until the peer goes
    away; a leak of one per restart would exceed that at once)."""
    result = await soak(restarts=100, nodes=3, seed=11, growth_bound=None)
    assert result.failures == []
    assert result.restarts == 100
    assert result.sockets_deleted > 0
    assert result.allocate_ok > 0
    assert result.allocate_hung == 0
    assert result.registrations > 0
    assert set(result.baseline) == set(result.final) == {"open_fds", "rss_bytes"}


def test_percentile_nearest_rank() -> None:
    samples = list(range(1, 101))
    assert percentile(samples, 0.50) == 50
    assert percentile(samples, 0.99) == 99
    assert percentile([7.0], 0.99) == 7.0


@pytest.mark.parametrize(
    "args",
    [
        ["reregistration", "--restarts", "3"],
        ["allocate", "--calls", "40", "--concurrency", "4"],
        ["startup", "--runs", "1"],
        ["footprint", "--calls", "20", "--idle-seconds", "0.5"],
        ["polling", "--window", "0.5", "--idle-seconds", "0.5"],
        # Small sizes: the test shows the benchmark runs; `make bench` runs 8, 64, 256.
        ["scale", "--nodes", "2,8", "--memory-nodes", "2"],
        ["page", "--nodes", "2,4", "--runs", "1"],
        ["locality", "--pci", "20", "--block", "10", "--mounts", "15", "--runs", "1"],
        ["manynodes", "--many-nodes", "10", "--runs", "1", "--restarts", "20"],
    ],
)
def test_benchmarks_run_and_print_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # A tenth of each fixed settle time: the figures are rough, the test only needs JSON.
    assert bench.main([*args, "--json", "--pace", "0.1"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["machine"]["cores"] >= 1
    assert document["figures"]
    for figure in document["figures"]:
        assert figure["value"] >= 0
        assert figure["verdict"] in ("", "ok", "MISSED")


def test_benchmark_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["reregistration", "--restarts", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: cores ")
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "re-registration 8 NUMA nodes, 2 restarts p99" in "\n".join(rows)
    floor = [
        row for row in rows if "8 NUMA nodes, 2 restarts, floor (empty grpc.aio plugin) p99" in row
    ]
    assert len(floor) == 1
    assert "<=" not in floor[0], "the floor has no target"


def test_the_attack_script_runs_and_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import attack

    args = ["--slowloris", "50", "--burst", "50", "--burst-timeout", "10"]
    # A fifth of each hold time: the figures are rough, the test asserts no probe failed.
    args += ["--json", "--pace", "0.2"]
    assert attack.main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["slowloris"]["connections_opened"] == 50
    burst = document["burst"]
    assert burst["answered"] + burst["refused"] + burst["hung"] == 50
    assert burst["hung"] == 0, "every connection ends, answered or refused"
    assert document["slowloris"]["probe"]["failed"] == 0, "the prober was answered"


@pytest.mark.parametrize("pace", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_pace_exits_2_with_usage(pace: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["startup", "--pace", pace])
    assert exit_info.value.code == 2
    assert "--pace" in capsys.readouterr().err


def test_the_pace_is_back_after_a_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    """The soak test after a paced benchmark test (same worker) settles at full length."""
    assert bench.main(["reregistration", "--restarts", "1", "--json", "--pace", "0.1"]) == 0
    assert PACE == [1.0]


def test_a_commands_peak_is_its_own_not_the_benchmarks(tmp_path: Path) -> None:
    """A child forked from a process holding 192 MB: wait4's ru_maxrss carries the
    parent's mark across exec (the fleet benchmark's 550 MB), the wrapper's VmHWM is
    the command's own."""
    from benchmarks.peak import peak_mb, wrapped

    held = bytearray(192 << 20)
    held[::4096] = b"x" * len(held[::4096])  # every page touched: resident
    peak_file = tmp_path / "peak"
    process = subprocess.Popen(wrapped([sys.executable], peak_file, "platform"),
                               stdout=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert usage.ru_maxrss / 1024 >= 192  # what the benchmark used to print
    assert 0 < peak_mb(peak_file) < 64
    del held


def test_the_fleet_benchmark_names_its_slow_pod_and_prints_the_others(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m benchmarks.fleet` at a small size: devices and check run as processes
    against the stand-in, every node but the slow one shown, the slow one named."""
    from benchmarks import fleet

    assert fleet.main(["--nodes", "12", "--slow", "20", "--timeout", "5", "--latency", "0"]) == 0
    figures = json.loads(capsys.readouterr().out)
    for command in ("devices", "check"):
        assert figures[command]["nodes_shown"] == 11, figures
        assert figures[command]["slow_pod_named"] is True
        assert figures[command]["wall_seconds"] > 0
        assert figures[command]["peak_rss_mb"] > 0
    assert figures["devices"]["exit"] == 0
    assert figures["check"]["exit"] == 1  # the slow node's pods are unknown


def test_the_side_by_side_benchmark_measures_each_plugin_and_compares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``benchmarks.peer`` with ours, ours without ``--cgroup-root``, an earlier version
    (here the same interpreter), the floor and the floor with ours' libraries, two
    starts each, an idle window in the first: every plugin registers healthy and gets
    its figures (the libraries' imports show in the RSS); the ratio needs a peer, so
    there is none; a bad flag exits 2."""
    import sys

    from benchmarks import peer

    assert peer.main(["--runs", "2", "--idle", "0.5", "--settle", "0.5", "--idle-runs", "1",
                      "--allocates", "20", "--floor", "--before", sys.executable,
                      "--without-cgroups", "--library-floor", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    names = ["numa-device-plugin", "without --cgroup-root", "before",
             "floor (empty grpc.aio plugin)", "floor + the libraries"]  # fmt: skip
    assert list(result["samples"]) == names
    for name in names:
        samples = result["samples"][name]
        assert len(samples["starts_s"]) == 2
        assert samples["rss_mb"][0] > 5
        assert len(samples["idle_cpu_s_per_30s"]) == 1, "idle windows in --idle-runs runs"
        assert samples["allocate_p50_ms"] > 0
    # ~7 MB (prometheus-client alone ~3 MB); two processes of one program differ by < 1 MB.
    floor_rss = result["samples"]["floor (empty grpc.aio plugin)"]["rss_mb"]
    assert min(result["samples"]["floor + the libraries"]["rss_mb"]) > max(floor_rss) + 5
    rows = {row["figure"]: row for row in result["rows"]}
    start = rows["exec -> registered and healthy, median"]
    assert list(start["values"]) == names
    assert start["ratio"] is None
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--peer", "/nonexistent/plugin"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--idle-runs", "0"])
    assert exit_info.value.code == 2


def test_the_side_by_side_benchmark_puts_ours_on_a_machine_of_many_devices_with_pci(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--pci N``: ours reads a machine of N PCI devices (a tenth with a disk) and
    still registers healthy; a negative count exits 2."""
    from benchmarks import peer

    argv = peer.Ours("ours", pci=40).argv(tmp_path, tmp_path / "dp", tmp_path / "pr.sock")
    root = Path(argv[argv.index("--sysfs-root") + 1])
    assert len(list((root / "bus" / "pci" / "devices").iterdir())) == 40
    assert len(list((root / "class" / "block").glob("nvme*n1"))) == 4
    assert peer.main(["--runs", "1", "--idle", "0", "--idle-runs", "1", "--allocates", "5",
                      "--pci", "40", "--json"]) == 0  # fmt: skip
    samples = json.loads(capsys.readouterr().out)["samples"]["numa-device-plugin"]
    assert len(samples["starts_s"]) == 1
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--pci", "-1"])
    assert exit_info.value.code == 2


def test_the_drift_benchmark_reads_rss_after_registration_allocates_and_the_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m benchmarks.drift` at a small size: ours registers with the DaemonSet's
    settings, answers its Allocates, and the hold is read every period and at its end."""
    from benchmarks import drift

    assert drift.main(["--allocates", "20", "--hold", "1", "--every", "0.5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["allocates"] == 20
    seconds = [at for at, _ in result["trace"]]
    assert seconds == sorted(seconds)
    assert seconds[0] >= 0.5, "a reading per period, none before the first ends"
    assert seconds[-1] >= 1.0, "the hold is read at its end"
    for key in ("rss_after_registration_mb", "rss_after_allocates_mb", "rss_after_hold_mb"):
        assert result[key] > 5, key
    assert result["verdict"] in ("ok", "MISSED")


@pytest.mark.parametrize("args", [["--every", "0"], ["--hold", "-1"], ["--allocates", "-5"]])
def test_the_drift_benchmark_refuses_bad_flags_with_usage(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import drift

    with pytest.raises(SystemExit) as exit_info:
        drift.main(args)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


async def test_the_floor_plugin_registers_once_a_refusing_kubelet_sock_listens(
    tmp_path: Path,
) -> None:
    """kubelet.sock exists a moment before its kubelet listens (and a stopped kubelet's
    a moment after): a Register refused then once made the floor plugin exit, and the
    re-registration benchmark with it (CI). Like any plugin, it tries again."""
    from benchmarks.floor import argv
    from numa_device_plugin.kubelet_standin import KubeletStandIn
    from tests.conftest import REPO

    socket_dir = tmp_path / "dp"
    socket_dir.mkdir()
    refusing = socket.socket(socket.AF_UNIX)
    refusing.bind(str(socket_dir / "kubelet.sock"))  # bound, never listening: refused
    floor = subprocess.Popen(argv(socket_dir, ["numa-align/numa-0"]), cwd=REPO,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        await asyncio.sleep(0.5)
        assert floor.poll() is None, floor.communicate()[1]
        refusing.close()
        (socket_dir / "kubelet.sock").unlink()
        async with KubeletStandIn(socket_dir) as kubelet:
            await kubelet.wait_until(lambda: kubelet.live("numa-align/numa-0"), 20)
    finally:
        refusing.close()
        floor.terminate()
        floor.communicate(timeout=20)
