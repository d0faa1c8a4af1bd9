"""The instance lock file against what a hostile neighbour can plant in the shared
device-plugin folder: a symlink (to the kubelet's checkpoint), a FIFO, a socket, a
symlinked lock subfolder. Nothing is written through a link, nothing blocks, no
descriptor leaks, and a serving plugin stands down with the reason instead of
hanging."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from numa_device_plugin.ops.instancelock import LOCK_DIR_NAME, LOCK_FILE_NAME, InstanceLock
from numa_device_plugin.topology.fake import SysfsTree
from tests.conftest import REPO
from tests.plugin.test_hardening import NAMES, logged, readyz
from tests.standin_helpers import eventually, live_plugin, serve_process

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
