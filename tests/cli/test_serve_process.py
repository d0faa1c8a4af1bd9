"""A real ``serve`` process: SIGHUP, SIGTERM and SIGUSR1, an unusable socket folder or a
socket path too long (exit 2 naming the option), and the modules it loads (only what it
uses)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.topology.fake import SysfsTree
from tests.cli.test_cli import NAMES, run_main
from tests.conftest import REPO
from tests.standin_helpers import eventually, wait_all_live


async def _wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    for _ in range(int(timeout / 0.05)):
        if process.poll() is not None:
            return process.returncode
        await asyncio.sleep(0.05)
    process.kill()
    raise AssertionError("serve did not exit")


async def test_real_serve_process_sighup_and_sigterm(two_nodes: SysfsTree, sock_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_LOG_FORMAT="json")
    args = ["--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir), "--capacity", "4"]
    async with KubeletStandIn(sock_dir) as kubelet:
        process = subprocess.Popen(
            [sys.executable, "-m", "numa_device_plugin", "serve", *args],
            env=env,
            stderr=subprocess.PIPE,
        )
        try:
            await wait_all_live(kubelet, NAMES, timeout=20)
            assert len(kubelet.devices("numa-align/numa-0")) == 4
            process.send_signal(signal.SIGHUP)
            await kubelet.wait_until(lambda: len(kubelet.registrations) >= 4, timeout=10)
            await wait_all_live(kubelet, NAMES)
            process.send_signal(signal.SIGTERM)
            assert await _wait_exit(process, 10) == 0
        finally:
            if process.poll() is None:
                process.kill()
            stderr = process.communicate()[1].decode()
        assert sorted(p.name for p in sock_dir.iterdir()) == [".numa-device-plugin", "kubelet.sock"]
        await kubelet.wait_until(lambda: kubelet.clients == {})
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "device plugin stopped" in events
    assert events.count("registered with the kubelet") == 4


async def test_sigusr1_switches_serves_log_level_and_back(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """At info, an Allocate logs nothing; after SIGUSR1 it logs its debug line; after a
    second SIGUSR1 nothing again. Each switch says so at warning level."""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_LOG_FORMAT="json")
    args = ["--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir), "--capacity", "4"]
    log = tmp_path / "serve.log"

    def events(name: str) -> list[dict[str, object]]:
        lines = log.read_text().splitlines()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in found if e["event"] == name]

    def last_change_is(level: str) -> bool:
        return [e["log_level"] for e in events("log level changed")][-1:] == [level]

    async def allocations_logged_after(device: str) -> int:
        await kubelet.allocate(NAMES[0], [device])
        await asyncio.sleep(0.3)  # a line is written before Allocate answers; margin for I/O
        return len(events("Allocate"))

    async with KubeletStandIn(sock_dir) as kubelet:
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "numa_device_plugin", "serve", *args], env=env, stderr=stderr
            )
        try:
            await wait_all_live(kubelet, NAMES, timeout=20)
            device = kubelet.devices(NAMES[0])[0].ID
            assert await allocations_logged_after(device) == 0, "info: no debug line"
            for level, logged in (("debug", 1), ("info", 1)):
                process.send_signal(signal.SIGUSR1)
                await eventually(partial(last_change_is, level), timeout=10)
                assert await allocations_logged_after(device) == logged, level
            process.send_signal(signal.SIGTERM)
            assert await _wait_exit(process, 10) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    changes = events("log level changed")
    assert [(e["level"], e["log_level"], e["configured"]) for e in changes] == [
        ("warning", "debug", "info"),
        ("warning", "info", "info"),
    ]


def test_unknown_serve_flag_prints_serves_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["serve", "--bogus"], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "No such option '--bogus'" in err


def _unusable(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if kind == "a file":
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        return blocker
    if kind == "under a file":
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        return blocker / "dp"
    if kind == "read-only":
        folder = tmp_path / "ro"
        folder.mkdir()
        real_access = os.access
        # As root, permission bits do not stop writes: stand in for a read-only mount.
        monkeypatch.setattr(
            os, "access", lambda path, mode: Path(path) != folder and real_access(path, mode)
        )
        return folder
    return tmp_path / ("d" * 100)  # kubelet.sock in it is over the unix socket limit


@pytest.mark.parametrize("kind", ["a file", "under a file", "read-only", "too long"])
def test_serve_with_unusable_socket_dir_exits_2_naming_option_and_path(
    kind: str,
    two_nodes: SysfsTree,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = _unusable(kind, tmp_path, monkeypatch)
    args = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(folder)]
    code, _, err = run_main(args, capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "--socket-dir" in err
    assert str(folder.parent if kind == "under a file" else folder) in err
    assert not folder.is_dir() or not any(folder.iterdir()), "nothing may be created"


def test_resource_socket_path_too_long_exits_2(
    two_nodes: SysfsTree, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid but long --resource-prefix makes the resources' socket paths too long for
    grpc: exit 2 at start naming the path, its length and the limit (once retried forever)."""
    prefix = "a" * 40 + "." + "b" * 40 + ".example.com"  # a valid 93-character domain
    args = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir)]
    code, _, err = run_main([*args, "--resource-prefix", prefix], capsys)
    assert code == 2
    path = sock_dir / f"{prefix}_numa-0.sock"
    assert str(path) in err
    assert f"is {len(str(path))} bytes" in err
    assert "at most 105" in err
    assert sorted(os.listdir(sock_dir)) == [], "no socket, no lock: nothing was touched"


def test_serve_loads_only_what_it_uses() -> None:
    """The stand-in (demo's), the status report, prometheus-client (made after
    registration), the node page and the state it shows (at their first request),
    http.client (the API server's reads, with a configuration file), PyYAML and watchdog
    (the folders are watched once registered) stay out of serve's imports and its
    listeners' making; once, cli/__init__ imported every
    command, the bounded readers PyYAML and http.client, and the listeners the node
    page."""
    import subprocess
    import sys

    code = (
        "import sys; from numa_device_plugin.cli import cli; import click; "
        "cli.get_command(click.Context(cli), 'serve'); "
        "from numa_device_plugin.cli.serve import node_pages; node_pages(lambda: None); "
        "print(' '.join(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    loaded = set(result.stdout.split())
    assert "numa_device_plugin.cli.serve" in loaded
    for module in (
        "numa_device_plugin.kubelet_standin",
        "numa_device_plugin.cli.demo",
        "numa_device_plugin.cli.status",
        "numa_device_plugin.plugin.reports.status",
        "numa_device_plugin.plugin.reports.prometheus",
        "prometheus_client",
        "numa_device_plugin.plugin.reports.nodepage",
        "numa_device_plugin.plugin.reports.snapshot",
        "http.client",
        "yaml",
        "numa_device_plugin.nodeconfig.configs",
        "watchdog",
        "numa_device_plugin.kubelet.watcher",
        "numa_device_plugin.kubelet.kubepods",
    ):
        assert module not in loaded, module
