"""Paths no test ran before: a stop arriving while the supervisor switches
configurations, the probes' write timeout for a client that reads nothing, and the
watcher finding its folder gone again as it comes back."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.watcher import FOLDER_CREATED, KUBELET_CREATED, SocketDirWatcher
from numa_device_plugin.nodeconfig.supervisor import ConfigSupervisor
from numa_device_plugin.ops import probes
from numa_device_plugin.plugin.config import Config


class SlowManager:
    """A manager whose teardown takes ``teardown`` seconds; ``made`` lists them all."""

    made: ClassVar[list[SlowManager]] = []

    def __init__(self, config: Config, teardown: float = 0.3) -> None:
        self.config = config
        self.teardown = teardown
        self.stopping = asyncio.Event()
        self.finished = False
        SlowManager.made.append(self)

    def readiness_problems(self) -> list[str]:
        return []

    def stop(self) -> None:
        self.stopping.set()

    def reload(self) -> None:
        pass

    async def serve(self) -> None:
        await self.stopping.wait()
        await asyncio.sleep(self.teardown)
        self.finished = True


async def test_a_stop_during_a_configuration_switch_starts_nothing_new() -> None:
    SlowManager.made = []
    first, second = config_from_params({"capacity": 3}), config_from_params({"capacity": 4})
    choices: list[Any] = [("a", first), ("b", second)]

    def select() -> Any:
        return choices[0] if len(choices) == 1 else choices.pop(0)

    supervisor = ConfigSupervisor(select, SlowManager, interval=0.05)  # type: ignore[arg-type]
    task = asyncio.create_task(supervisor.serve())
    while not SlowManager.made or not SlowManager.made[0].stopping.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # the switch to "b" is retiring "a" now
    supervisor.stop()
    await asyncio.wait_for(task, 5)
    assert [manager.config for manager in SlowManager.made] == [first], "b never started"
    assert SlowManager.made[0].finished, "a was torn down in full"
    assert supervisor.manager is None


async def test_a_client_that_reads_nothing_is_cut_off_after_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probes, "WRITE_TIMEOUT", 0.5)
    body = b"x" * (32 << 20)  # far more than the socket buffers hold
    server = probes.ProbeServer(("127.0.0.1", 0), list, lambda: body)
    await server.start()
    client = socket.create_connection(("127.0.0.1", server.port))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        while server.connections == 0 and time.monotonic() - started < 5:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        while server.connections and time.monotonic() - started < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
        assert server.connections == 0, "the connection was dropped"
        assert took < 3, took
    finally:
        client.close()
        await server.stop()


def test_the_watcher_finds_its_folder_gone_again_and_watches_it_when_it_is_back(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "device-plugins"
    folder.mkdir()
    woken: list[str] = []
    seen = threading.Condition()
    loop = asyncio.new_event_loop()

    def wake(reason: str, name: str) -> None:
        with seen:
            woken.append(reason)
            seen.notify_all()

    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    watcher = SocketDirWatcher(folder, wake, loop)
    watcher.start()
    try:
        shutil.rmtree(folder)
        # It came back and went again before the watcher could watch it: no wake, no
        # error, nothing watched.
        watcher._folder_appeared()
        assert watcher._watch is None
        assert FOLDER_CREATED not in woken
        # Back for good: watched again, and kubelet.sock in it wakes the manager.
        folder.mkdir()
        with seen:
            assert seen.wait_for(lambda: FOLDER_CREATED in woken, timeout=10), woken
        (folder / "kubelet.sock").touch()
        with seen:
            assert seen.wait_for(lambda: KUBELET_CREATED in woken, timeout=10), woken
    finally:
        watcher.stop()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
