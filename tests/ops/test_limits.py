"""File descriptor limits and bounded failure logs: a plugin that cannot get the
descriptors its resources need refuses at start (exit 2) instead of living on and
logging hundreds of lines a second; a soft limit below the need is raised; failures
at run time show in /readyz and write one line per pass."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops.limits import FdLimitError, ensure_fds, fds_needed
from numa_device_plugin.ops.logs import LogLimiter
from numa_device_plugin.topology.fake import build_machine
from tests.conftest import REPO
from tests.plugin.test_manager import make_config
from tests.standin_helpers import eventually, running, serve_args, wait_all_live


def limited(soft: int, hard: int, argv: list[str]) -> list[str]:
    """``argv`` run under RLIMIT_NOFILE ``(soft, hard)``, set by a Python wrapper that
    execs it (not preexec_fn: forking a threaded process, as grpc's test process is,
    can deadlock the child before exec)."""
    code = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", code, *argv]


def test_ensure_fds_raises_the_soft_limit_or_refuses() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert ensure_fds(10, 1) == (soft, hard), "enough already: unchanged"
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(FdLimitError) as caught:
            ensure_fds(hard + 1, 5)
        assert f"soft {soft}, hard {hard}" in str(caught.value)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard), "left as it was"


def test_fds_needed_counts_resources_and_listener_connections() -> None:
    assert fds_needed(64) < fds_needed(65) < fds_needed(65, 128)
    assert fds_needed(1024) > 3 * 1024


def test_a_hard_limit_too_low_exits_2_naming_both_limits(tmp_path: Path, sock_dir: Path) -> None:
    """1,024 NUMA nodes under nofile 1,024 once never registered and logged 560 lines a
    second while liveness saw a live process."""
    tree = build_machine(tmp_path / "sys", nodes=64, cpus_per_node=1)
    result = subprocess.run(
        limited(100, 100, serve_args(tree, sock_dir)),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "64 resources need about" in result.stderr
    assert "RLIMIT_NOFILE is soft 100, hard 100" in result.stderr
    assert not list(sock_dir.glob("*.sock")), "nothing was served"


async def test_a_low_soft_limit_is_raised_and_every_resource_registers(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = build_machine(tmp_path / "sys", nodes=64, cpus_per_node=1)
    names = [f"numa-align/numa-{node}" for node in range(64)]
    async with KubeletStandIn(sock_dir) as kubelet:
        plugin = subprocess.Popen(
            limited(100, 4096, serve_args(tree, sock_dir)),
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_all_live(kubelet, names, timeout=60)
            limits = Path(f"/proc/{plugin.pid}/limits").read_text()
            (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
            assert line.split()[3:5] == ["4096", "4096"]
        finally:
            plugin.terminate()
            plugin.wait(30)


async def test_servers_failing_at_run_time_show_in_readyz_with_one_log_line_per_pass(
    two_nodes: object, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class OutOfFds(UnixSocketServer):
        async def start(self) -> None:
            raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("numa_device_plugin.plugin.serving.endpoint.UnixSocketServer", OutOfFds)
    config = make_config(two_nodes, sock_dir)  # type: ignore[arg-type]
    with capture_logs() as logs:
        async with KubeletStandIn(sock_dir), running(config) as manager:
            await eventually(lambda: bool(manager.readiness_problems()))
            await eventually(
                lambda: sum(e["event"] == "cannot serve resources; retrying" for e in logs) >= 3
            )
            problems = manager.readiness_problems()
    assert problems[0] == (
        "cannot serve 2 resource(s) (first error: [Errno 24] Too many open files); retrying"
    )
    lines = [e for e in logs if e["event"] == "cannot serve resources; retrying"]
    passes = [e for e in logs if e["event"] == "serving and registering again"]
    assert all(e["count"] == 2 for e in lines), "one line for both resources"
    assert not any(e["event"] == "cannot serve resource; retrying" for e in logs)
    assert len(passes) <= 2, "a retry is not a new plan"


def test_the_log_limiter_lets_one_line_per_kind_per_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr("numa_device_plugin.ops.logs.time.monotonic", lambda: now[0])
    limiter = LogLimiter(5.0)
    assert limiter.allow("a") == 0
    assert limiter.allow("a") is None
    assert limiter.allow("b") == 0, "another kind passes"
    assert limiter.allow("a") is None
    now[0] += 5.0
    assert limiter.allow("a") == 2, "two held back since"
    assert limiter.allow("a") is None
