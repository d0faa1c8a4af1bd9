"""The restart loop survives its own surprises: an error anywhere in a pass is logged and
followed by serving afresh, and a server that fails to start is started again."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import (
    eventually,
    running,
    wait_all_live,
)


async def test_unexpected_error_in_the_loop_is_survived(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.kubelet.registration import register as real

    calls = {"n": 0}

    async def exploding(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("surprise")
        await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("numa_device_plugin.plugin.serving.endpoint.register", exploding)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)):
        await wait_all_live(kubelet, NAMES)
    assert calls["n"] >= 3


async def test_an_error_in_the_loop_schedules_a_restart(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's own error handler: a pass that raises is followed by serving afresh."""
    from numa_device_plugin.plugin.lifecycle.restarts import Restarts

    real_restart = Restarts.restart
    raised: list[bool] = []

    async def explode_once(self: Restarts, names: set[str]) -> None:
        if not raised:
            raised.append(True)
            raise RuntimeError("surprise in the loop")
        await real_restart(self, names)

    monkeypatch.setattr(Restarts, "restart", explode_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: m.registered == set(NAMES))
    assert raised == [True]


async def test_an_error_deciding_what_to_serve_is_logged_and_retried(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Restarts.evaluate`` runs after the loop's own error handler: a failure there is
    caught too ("logged and retried, never raised")."""
    from numa_device_plugin.plugin.lifecycle.restarts import Restarts

    real_evaluate = Restarts.evaluate
    raised: list[bool] = []

    def explode_once(self: Restarts, reasons: list[tuple[str, str]]) -> None:
        if not raised:
            raised.append(True)
            raise OSError(40, "Too many levels of symbolic links")
        real_evaluate(self, reasons)

    monkeypatch.setattr(Restarts, "evaluate", explode_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        m.wake("test")
        await eventually(lambda: bool(raised))
        await kubelet.restart()
        await wait_all_live(kubelet, NAMES)
    assert raised == [True]


async def test_a_server_that_fails_to_start_once_is_started_again(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.kubelet.grpcserver import UnixSocketServer

    real_start = UnixSocketServer.start
    failed: list[Path] = []

    async def fail_once(self: UnixSocketServer) -> None:
        if self.path.name == "numa-align_numa-0.sock" and not failed:
            failed.append(self.path)
            raise RuntimeError("cannot bind (simulated)")
        await real_start(self)

    monkeypatch.setattr(UnixSocketServer, "start", fail_once)
    async with KubeletStandIn(sock_dir) as kubelet, running(make_config(two_nodes, sock_dir)) as m:
        await wait_all_live(kubelet, NAMES)
        await eventually(lambda: m.registered == set(NAMES))
    assert len(failed) == 1
