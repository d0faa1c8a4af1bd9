"""The device-plugin folder is watched after registering (watchdog's import and its
thread cost a start ~5 ms), and the loop then looks at the state once more: what changed
before the watch began (a socket deleted, a kubelet restarted) is found all the same. A
folder that cannot be watched ends the plugin with the error, as it did at start; the
kubepods watch a registration asks for meanwhile starts with the folder's."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from numa_device_plugin.kubelet.watcher import SocketDirWatcher
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.lifecycle.devicewatch import DeviceWatch
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.lifecycle.watches import Watches
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.serving.lock import LockKeeper
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_firstlook import with_devices
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import eventually, running, wait_all_live


def before_the_watch(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Runs ``action`` each time the folder's watch is about to start."""
    original = SocketDirWatcher.start

    def start(watcher: SocketDirWatcher) -> None:
        action()
        original(watcher)

    monkeypatch.setattr(SocketDirWatcher, "start", start)


async def test_the_folder_is_watched_once_registered_and_a_socket_deleted_before_is_found(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a resource near a device (the first look reads the devices: no later
    hand-over wakes the loop). Mutants: the watch started before registering (the
    first assertion); no look at the state after it starts (the socket deleted
    meanwhile is never served again: nothing else wakes the loop)."""
    with_devices(two_nodes)
    config = make_config(two_nodes, sock_dir, near=(parse_near("data=serial:DATA"),))
    names = sorted([*NAMES, "numa-align/data"])
    async with KubeletStandIn(sock_dir) as kubelet:
        seen: list[list[str]] = []

        def delete_a_socket() -> None:
            seen.append(sorted(r.resource_name for r in kubelet.registrations))
            (sock_dir / "numa-align_numa-0.sock").unlink()

        before_the_watch(monkeypatch, delete_a_socket)
        async with running(config) as manager:
            await manager.wait_settled()
            assert seen == [names], "each resource registered before the watch began"
            assert manager.watches.watching

            def registrations(name: str) -> int:
                return sum(r.resource_name == name for r in kubelet.registrations)

            await eventually(lambda: registrations(NAMES[0]) == 2)
            await wait_all_live(kubelet, names)
            assert (sock_dir / "numa-align_numa-0.sock").exists()
            assert registrations(NAMES[1]) == 1, "what did not change is left alone"


async def test_a_kubelet_restart_before_the_watch_began_is_found(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet restarts (its sockets deleted, a new kubelet.sock) between the
    registrations and the watch's start, held back until the stand-in is back: the
    plugin registers with the new kubelet all the same."""
    reached, gate = asyncio.Event(), asyncio.Event()
    original = Watches._watch_once_acted

    async def held(watches: Watches) -> None:
        assert watches._acted is not None
        await watches._acted()
        reached.set()
        await gate.wait()
        await original(watches)

    monkeypatch.setattr(Watches, "_watch_once_acted", held)
    config = make_config(two_nodes, sock_dir)
    async with KubeletStandIn(sock_dir) as kubelet, running(config) as manager:
        await reached.wait()
        await wait_all_live(kubelet, NAMES)
        await kubelet.restart()
        assert (sock_dir / "kubelet.sock").exists()
        gate.set()
        await eventually(lambda: len(kubelet.registrations) == 2 * len(NAMES), timeout=20)
        await wait_all_live(kubelet, NAMES, timeout=20)
        await manager.wait_settled()
        assert manager.readiness_problems() == []


async def test_a_folder_that_cannot_be_watched_stops_the_plugin_with_the_error(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As at start before (the process exits 1 naming it), now after registering: the
    sockets are removed and serve raises the OSError."""

    def no_watch_left() -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    before_the_watch(monkeypatch, no_watch_left)
    async with KubeletStandIn(sock_dir) as kubelet:
        manager = PluginManager(make_config(two_nodes, sock_dir))
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(OSError, match="inotify") as raised,
        ):
            await asyncio.wait_for(manager.serve(), 20)
        assert raised.value.errno == errno.ENOSPC
        assert sorted(r.resource_name for r in kubelet.registrations) == NAMES
    assert not [name for name in os.listdir(sock_dir) if name.startswith("numa-align")]
    (said,) = [e for e in logs if e["event"] == "cannot watch the device-plugin folder; stopping"]
    assert "inotify watch limit reached" in said["error"]


async def test_the_kubepods_watch_asked_for_before_the_folder_is_watched_starts_with_it(
    two_nodes: SysfsTree, tmp_path: Path
) -> None:
    """A registration accepted before the folder's watch began (the kubepods watch is
    asked for at each) is not forgotten, and the pod resources API is read once it is
    watched (a Guaranteed pod's cgroup made between the registration's read and the
    watch would otherwise wait for the 60 s backstop). Mutants: ``ensure_kubepods``
    returning before the folder is watched without remembering it (the interval reads
    forever); no read when the watch begins."""
    (tmp_path / "cgroup" / "kubepods").mkdir(parents=True)
    config = Config(sysfs_root=two_nodes.root, socket_dir=tmp_path / "dp",
                    cgroup_root=tmp_path / "cgroup", device_interval=0)  # fmt: skip
    acted = asyncio.Event()
    waiting = asyncio.Event()

    async def wait_acted() -> None:
        waiting.set()
        await acted.wait()

    woken: list[str] = []
    reads: list[str] = []
    device_watch = DeviceWatch(config, discover, lambda: None, lambda: None)
    watches = Watches(config, lambda reason, _: woken.append(reason),
                      LockKeeper(config.socket_dir, lambda: None), device_watch,
                      lambda: reads.append("read"), acted=wait_acted)  # fmt: skip
    watches.start()
    try:
        watches.ensure_kubepods((1, 1, 1))
        await asyncio.wait_for(waiting.wait(), 10)  # the watch waits for the loop to act
        assert not watches.watching
        assert not watches.pods_signalled
        assert not (tmp_path / "dp").exists(), "nothing made before the loop acted"
        acted.set()
        await eventually(lambda: watches.watching)
        assert watches.pods_signalled
        assert reads == ["read"], "a read once watched: the registration's came before"
        assert woken == ["device-plugin folder watched"]
    finally:
        await watches.stop()
    assert not watches.pods_signalled
