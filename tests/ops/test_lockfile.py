"""The instance lock file against what a hostile neighbour can plant in the shared
device-plugin folder: a symlink (to the kubelet's checkpoint), a FIFO, a socket, a
symlinked lock subfolder. Nothing is written through a link, nothing blocks, no
descriptor leaks, and a serving plugin stands down with the reason instead of
hanging."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME, LOCK_FILE_NAME, InstanceLock
from numa_device_plugin.topology.fake import SysfsTree
from tests.conftest import REPO
from tests.standin_helpers import (
    NAMES,
    bound_port,
    eventually,
    live_plugin,
    logged,
    readyz,
    serve_process,
    wait_all_live,
)

TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"

CHECKPOINT = b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1}'


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def plant_symlink(lock: Path, target: Path) -> None:
    os.symlink(os.path.relpath(target, lock.parent), lock)


def plant_fifo(lock: Path, _: Path) -> None:
    os.mkfifo(lock)


def plant_socket(lock: Path, _: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(lock))
    listener.close()


PLANTS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "symlink to the checkpoint": (plant_symlink, "a symbolic link: refused, never followed"),
    "fifo": (plant_fifo, "not a regular file (a FIFO)"),
    "socket": (plant_socket, "No such device or address"),  # open(2) refuses it: ENXIO
}


@pytest.fixture
def folder(sock_dir: Path) -> tuple[Path, Path]:
    """The device-plugin folder with a kubelet checkpoint and the lock subfolder:
    ``(lock path, checkpoint path)``."""
    checkpoint = sock_dir / "kubelet_internal_checkpoint"
    checkpoint.write_bytes(CHECKPOINT)
    (sock_dir / LOCK_DIR_NAME).mkdir()
    return sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME, checkpoint


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_lock_is_refused_and_nothing_is_written_or_leaked(
    folder: tuple[Path, Path], plant: str
) -> None:
    lock_path, checkpoint = folder
    make, reason = PLANTS[plant]
    make(lock_path, checkpoint)
    lock = InstanceLock(lock_path.parent.parent)
    before = open_fds()
    started = time.monotonic()
    with pytest.raises(OSError, match=re.escape(reason)) as raised:
        lock.try_acquire()
    assert raised.value.filename == str(lock_path)
    assert lock.holder() == "unknown"
    assert time.monotonic() - started < 1, "a FIFO must not block the open or the read"
    assert open_fds() == before, "every descriptor is closed on the refusal path"
    assert not lock.held
    assert checkpoint.read_bytes() == CHECKPOINT


def test_a_symlinked_lock_folder_is_refused(folder: tuple[Path, Path], tmp_path: Path) -> None:
    lock_path, _ = folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lock_path.parent.rmdir()
    os.symlink(elsewhere, lock_path.parent)
    lock = InstanceLock(lock_path.parent.parent)
    with pytest.raises(OSError, match="a symbolic link") as raised:
        lock.try_acquire()
    assert raised.value.filename == str(lock_path.parent)
    assert list(elsewhere.iterdir()) == [], "no lock file is created through the link"


def test_a_regular_lock_is_still_taken_and_named(folder: tuple[Path, Path]) -> None:
    lock_path, _ = folder
    lock = InstanceLock(lock_path.parent.parent)
    try:
        assert lock.try_acquire()
        assert lock.intact()
        assert lock.holder().startswith(f"pid={os.getpid()} host=")
    finally:
        lock.release()
    lock_path.write_text("x" * 5000)
    assert lock.holder() == "x" * 200, "at most 200 bytes of the holder are read"


def test_a_lock_replaced_by_a_symlink_to_itself_is_not_intact(folder: tuple[Path, Path]) -> None:
    """``intact`` compares the file now at the path without following a link: a link
    to the very file this instance locked is not that file."""
    lock_path, _ = folder
    lock = InstanceLock(lock_path.parent.parent)
    try:
        assert lock.try_acquire()
        os.rename(lock_path, lock_path.with_name("kept"))
        os.symlink("kept", lock_path)
        assert not lock.intact()
    finally:
        lock.release()


@pytest.mark.parametrize("plant", ["symlink to the checkpoint", "fifo"])
async def test_serve_refuses_a_planted_lock_at_start(
    two_nodes: SysfsTree, folder: tuple[Path, Path], plant: str
) -> None:
    lock_path, checkpoint = folder
    make, reason = PLANTS[plant]
    make(lock_path, checkpoint)
    async with serve_process(two_nodes, lock_path.parent.parent) as plugin:
        assert await plugin.wait_exit(20) == 1
    assert reason in plugin.log()
    assert str(lock_path) in plugin.log()
    assert checkpoint.read_bytes() == CHECKPOINT
    # The troubleshooting page once said the plugin waits here.
    (row,) = [line for line in TROUBLESHOOTING.read_text().splitlines()
              if line.startswith("| `cannot lock the device-plugin folder`")]  # fmt: skip
    assert "Found at start, it exits 1" in row


@pytest.mark.parametrize("plant", ["symlink to the checkpoint", "fifo"])
async def test_a_lock_replaced_while_serving_makes_the_plugin_stand_down_not_hang(
    two_nodes: SysfsTree, folder: tuple[Path, Path], plant: str
) -> None:
    """The lock file swapped for a planted one: the plugin stands down (it cannot lock
    it), keeps answering its probes, writes nothing through the link, and SIGTERM
    still ends it at once."""
    lock_path, checkpoint = folder
    make, reason = PLANTS[plant]
    sock_dir = lock_path.parent.parent
    async with live_plugin(two_nodes, sock_dir, NAMES) as (kubelet, plugin, port):
        lock_path.unlink()
        make(lock_path, checkpoint)
        await logged(plugin, "cannot lock the device-plugin folder; standing down")
        await eventually(lambda: not any(kubelet.open_streams(name) for name in NAMES))
        status, text = await asyncio.to_thread(readyz, port)
        assert status == 503
        assert reason in text
        assert checkpoint.read_bytes() == CHECKPOINT
        started = time.monotonic()
        assert await plugin.terminate(timeout=5) == 0
        assert time.monotonic() - started < 2
    assert checkpoint.read_bytes() == CHECKPOINT


def accepted(kubelet: KubeletStandIn) -> int:
    return sum(1 for record in kubelet.registrations if record.error is None)


async def test_a_second_instance_waits_for_the_lock_then_takes_over(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as first:
        await wait_all_live(kubelet, NAMES, timeout=20)
        flags = ("--health-address", "127.0.0.1:0")
        async with serve_process(two_nodes, sock_dir, *flags) as second:
            port = await bound_port(second, "health")
            waiting = await logged(
                second, "another instance serves this device-plugin folder; waiting for it to exit"
            )
            assert f"pid={first.pid} " in waiting["holder"]
            assert waiting["lock"] == str(sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME)
            # It decided before touching any socket: the first instance's registrations
            # are the only ones, and its streams are the kubelet's only streams.
            assert accepted(kubelet) == 2
            assert all(kubelet.live(name) for name in NAMES)
            await eventually(lambda: readyz(port)[0] == 503)
            _, text = await asyncio.to_thread(readyz, port)
            assert "holds the lock" in text
            assert f"pid={first.pid}" in text

            assert await first.terminate() == 0
            await logged(second, "took over the instance lock")
            await wait_all_live(kubelet, NAMES, timeout=10)
            await eventually(lambda: readyz(port)[0] == 200)
            lock_text = (sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME).read_text()
            assert lock_text.startswith(f"pid={second.pid} ")
            for name in NAMES:
                assert kubelet.open_streams(name) == 1
            assert await second.terminate() == 0
    stopped = [line for line in first.events() if line.get("event") == "device plugin stopped"]
    assert stopped, first.log()


async def test_the_lock_survives_a_kubelet_restart(two_nodes: SysfsTree, sock_dir: Path) -> None:
    """The kubelet deletes every file of the folder when it starts, but not subfolders:
    a newcomer after a kubelet restart must still find the lock taken."""
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as first:
        await wait_all_live(kubelet, NAMES, timeout=20)
        await kubelet.restart()
        await wait_all_live(kubelet, NAMES, timeout=10)
        async with serve_process(two_nodes, sock_dir) as second:
            waiting = await logged(
                second, "another instance serves this device-plugin folder; waiting for it to exit"
            )
            assert f"pid={first.pid} " in waiting["holder"]
            assert accepted(kubelet) == 4


async def test_a_lock_file_replaced_by_a_folder_makes_the_plugin_stand_down(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Holding no lock, the plugin must not serve: a newcomer could take the lock and
    both would register. It stands down, unready, until it can lock again."""
    lock = sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME
    async with live_plugin(two_nodes, sock_dir, NAMES) as (kubelet, plugin, port):
        await eventually(lambda: readyz(port)[0] == 200)
        lock.unlink()
        lock.mkdir()
        await logged(plugin, "cannot lock the device-plugin folder; standing down")
        await eventually(lambda: not any(kubelet.open_streams(name) for name in NAMES))
        status, text = await asyncio.to_thread(readyz, port)
        assert status == 503
        assert f"cannot lock {lock}" in text
        # The streams end first, the servers then stop and their sockets go.
        await eventually(lambda: {p.name for p in sock_dir.glob("*.sock")} == {"kubelet.sock"})

        lock.rmdir()
        await logged(plugin, "took over the instance lock")
        await wait_all_live(kubelet, NAMES, timeout=10)
        await eventually(lambda: readyz(port)[0] == 200)
        assert lock.read_text().startswith(f"pid={plugin.pid} ")
        assert await plugin.terminate() == 0


async def test_a_newcomer_on_a_new_lock_file_makes_the_plugin_stand_down(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """The lock file replaced by a new one another instance holds: this one stands
    down (its streams end, /readyz names the holder) and waits to take over. The new
    file is locked beside and renamed over the old one, so that the newcomer holds it
    before the plugin can look (deleting the file and locking it anew raced the
    plugin's own re-lock, which the folder's inotify watch wakes at once)."""
    side = Path(tempfile.mkdtemp(dir=sock_dir.parent))  # the same filesystem: a rename
    try:
        async with live_plugin(two_nodes, sock_dir, NAMES) as (kubelet, plugin, port):
            newcomer = InstanceLock(side)
            assert newcomer.try_acquire()
            os.replace(newcomer.path, sock_dir / LOCK_DIR_NAME / LOCK_FILE_NAME)
            try:
                await logged(plugin, "another instance took the lock; standing down")
                await eventually(lambda: not any(kubelet.open_streams(name) for name in NAMES))
                await eventually(lambda: "holds the lock" in readyz(port)[1])
                assert f"pid={os.getpid()} " in readyz(port)[1]
            finally:
                newcomer.release()
            await logged(plugin, "took over the instance lock")
            await wait_all_live(kubelet, NAMES, timeout=10)
            assert await plugin.terminate() == 0
    finally:
        shutil.rmtree(side)


def test_taking_the_lock_replaces_a_longer_holder_line_whole(tmp_path: Path) -> None:
    """Mutant: no ``ftruncate``: a shorter holder line left the previous holder's tail."""
    import socket

    lock = InstanceLock(tmp_path)
    lock.path.parent.mkdir()
    lock.path.write_text("pid=1 host=" + "a-very-long-previous-host-name" * 4 + "\n")
    assert lock.try_acquire()
    try:
        assert lock.path.read_text() == f"pid={os.getpid()} host={socket.gethostname()}\n"
    finally:
        lock.release()


def test_the_socket_folder_deleted_by_the_kubelet_is_waited_for_not_created(
    tmp_path: Path,
) -> None:
    """The kubelet removes and re-creates the device-plugin folder when it restarts: the
    lock never creates that folder itself (it would be the kubelet's to make), says
    "not now", and takes the lock once the folder is back."""
    socket_dir = tmp_path / "device-plugins"
    lock = InstanceLock(socket_dir)
    assert lock.try_acquire() is False
    assert not socket_dir.exists()
    socket_dir.mkdir()
    try:
        assert lock.try_acquire() is True
        assert lock.intact()
        shutil.rmtree(socket_dir)
        assert not lock.intact()
        assert lock.try_acquire() is False
    finally:
        lock.release()


async def test_the_lock_regained_at_the_first_attempt_after_standing_down_is_logged(
    tmp_path: Path,
) -> None:
    """The newcomer may be gone before the plugin's first retry: "took over the instance
    lock" was logged only when that retry failed, and the newcomer test, waiting for the
    line, failed at load 15."""
    from structlog.testing import capture_logs

    from numa_device_plugin.plugin.serving.lock import LockKeeper

    keeper = LockKeeper(tmp_path, lambda: None)
    keeper.lock.path.parent.mkdir()
    keeper.lost = True  # it stood down; the other instance has exited since

    async def nap(_: float) -> None:
        raise AssertionError("no wait: the lock is free")

    with capture_logs() as logs:
        assert await keeper.acquire(raise_errors=False, stopping=lambda: False, nap=nap)
    try:
        assert [entry["event"] for entry in logs] == ["took over the instance lock"]
        assert (keeper.lost, keeper.problem) == (False, None)
    finally:
        keeper.lock.release()


def test_a_folder_deleted_while_its_lock_is_taken_again_is_no_other_instance(
    tmp_path: Path,
) -> None:
    """The folder went between the keeper's look and its re-lock (an `rm -rf` racing
    it): that is no folder to serve in, not "another instance took the lock" (the
    plugin stood down and waited for an instance that did not exist)."""
    from numa_device_plugin.plugin.serving.lock import LockKeeper

    folder = tmp_path / "dp"
    folder.mkdir()
    keeper = LockKeeper(folder, lambda: None)
    assert keeper.lock.try_acquire()
    keeper.lock.path.unlink()  # the lock file gone: not intact any more
    real = keeper.lock.try_acquire

    def racing() -> bool:
        shutil.rmtree(folder)  # the rest of the rm -rf, between the look and the lock
        return real()

    keeper.lock.try_acquire = racing  # type: ignore[method-assign]
    try:
        assert keeper.keep()
        assert (keeper.lost, keeper.problem) == (False, None)
    finally:
        keeper.lock.release()


async def test_a_plugin_that_waited_for_the_lock_looks_again_before_serving(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Its first look came before the wait: the disk a resource follows moved to NUMA
    node 0 meanwhile (replaced, its controller moved). Once it takes the lock over it
    looks again and serves node 0, not the node 1 it saw before waiting (with
    --device-interval 0, forever)."""
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree
    from tests.plugin.test_manager import make_config
    from tests.standin_helpers import running

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1)
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    holder = InstanceLock(sock_dir)
    assert holder.try_acquire()
    config = make_config(two_nodes, sock_dir, near=(parse_near("d=serial:S1"),),
                         device_interval=0)  # fmt: skip
    try:
        async with KubeletStandIn(sock_dir) as kubelet, running(config) as manager:
            await eventually(lambda: manager.lock_keeper.problem is not None)  # waiting
            assert manager.resources["numa-align/d"].near_nodes == (1,)  # its first look
            (devices.pci_folder("0000:41:00.0") / "numa_node").write_text("0\n")
            holder.release()
            await wait_all_live(kubelet, ["numa-align/d", *NAMES], timeout=20)
            nodes = {n.ID for d in kubelet.devices("numa-align/d") for n in d.topology.nodes}
            assert nodes == {0}
            assert manager.lock_keeper.took_over
    finally:
        holder.release()
