"""Helpers for tests that run the plugin against the kubelet stand-in."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import held_port as held_port  # re-exported for the tests
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.recorder import Recorder
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree

# The resources of a two-NUMA-node machine (the two_nodes fixture).
NAMES = ["numa-align/numa-0", "numa-align/numa-1"]

REPO = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def running(config: Config, recorder: Recorder | None = None) -> AsyncIterator[PluginManager]:
    """Run ``PluginManager.serve`` in a task for the block; stop it and re-raise its error."""
    manager = PluginManager(config, recorder=recorder)
    task = asyncio.create_task(manager.serve())
    try:
        yield manager
    finally:
        manager.stop()
        await asyncio.wait_for(task, 10)


def all_live(kubelet: KubeletStandIn, names: list[str]) -> bool:
    return all(kubelet.live(name) for name in names)


async def wait_all_live(
    kubelet: KubeletStandIn,
    names: list[str],
    timeout: float = 10,
    plugin: ServeProcess | None = None,
) -> None:
    """Wait until every resource of ``names`` has a live registration with the stand-in;
    after ``timeout`` seconds, fail naming those that were live and those that were not,
    what the stand-in saw of them, and the end of ``plugin``'s log when given."""
    try:
        await kubelet.wait_until(lambda: all_live(kubelet, names), timeout)
    except TimeoutError:
        live = [name for name in names if kubelet.live(name)]
        missing = [name for name in names if name not in live]
        seen = {
            name: f"{kubelet.open_streams(name)} stream(s), "
            f"{sum(r.resource_name == name for r in kubelet.registrations)} Register call(s)"
            for name in missing
        }
        tail = "" if plugin is None else "\nthe plugin's log ends:\n" + plugin.log()[-4000:]
        raise AssertionError(
            f"after {timeout:g} s, {len(live)} of {len(names)} resources were live;"
            f" not live: {', '.join(missing)} ({seen}){tail}"
        ) from None


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds, for state the stand-in does not
    announce (the plugin's servicers, files); raises TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing announces this state: poll it
            await asyncio.sleep(0.01)


async def past(seconds: float, turns: int = 10) -> None:
    """Until the event loop's clock is ``seconds`` past now, then ``turns`` more turns of
    the loop: every timer due by then has fired and what it woke has run its next steps.
    A negative check after it means "nothing happened although it would have by now"
    (asyncio runs due timers in order of their time), where a sleep alone only means
    that some wall-clock time passed."""
    loop = asyncio.get_running_loop()
    due: asyncio.Future[None] = loop.create_future()
    loop.call_at(loop.time() + seconds, due.set_result, None)
    await due
    for _ in range(turns):
        await asyncio.sleep(0)


@dataclass
class ServeProcess:
    """A real ``numa-device-plugin serve`` child process; its stderr goes to ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path
    final_log: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        """Everything the process logged so far (kept after the log file is gone)."""
        if self.final_log is not None:
            return self.final_log
        return self.log_path.read_text(errors="replace")

    def tracebacks(self) -> list[str]:
        """The log lines that hold a traceback, whole (a failed check then shows which
        logger and event wrote it, where pytest would cut the log short)."""
        return [line for line in self.log().splitlines() if "Traceback" in line]

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines (the process logs with ``--log-format json``)."""
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{")]

    async def wait_exit(self, timeout: float = 10.0) -> int:
        """Wait for the process to exit; kills it and fails after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while self.process.poll() is None:  # noqa: ASYNC110 - a child process: poll it
                await asyncio.sleep(0.02)
        return self.process.returncode

    async def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return await self.wait_exit(timeout)


def serve_args(tree: SysfsTree, folder: Path, *flags: str) -> list[str]:
    """The command line of a ``serve`` process on ``tree`` and ``folder``."""
    return [
        sys.executable,
        "-m",
        "numa_device_plugin",
        "serve",
        *("--sysfs-root", str(tree.root), "--socket-dir", str(folder)),
        *("--log-format", "json"),
        *flags,
    ]


@asynccontextmanager
async def serve_process(
    tree: SysfsTree, folder: Path, *flags: str, env: dict[str, str] | None = None
) -> AsyncIterator[ServeProcess]:
    """Start ``serve`` (``flags`` after the defaults, so they win); at the end kill it if
    it still runs. The log file lives beside ``folder`` (a temp folder of the test)."""
    log_path = Path(tempfile.mkstemp(prefix="serve-", suffix=".log", dir=folder.parent)[1])
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            serve_args(tree, folder, *flags),
            env=environment,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    served = ServeProcess(process, log_path)
    try:
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        served.final_log = served.log()
        log_path.unlink(missing_ok=True)


@asynccontextmanager
async def live_plugin(
    tree: SysfsTree,
    folder: Path,
    names: list[str],
    listener: str = "--health-address",
    *flags: str,
) -> AsyncIterator[tuple[KubeletStandIn, ServeProcess, int]]:
    """The stand-in and a ``serve`` process with an HTTP ``listener`` on a free port,
    every resource of ``names`` live and the plugin ready (``/readyz``: its devices read
    after registering, its loop done with what that woke it for):
    ``(kubelet, plugin, port)``."""
    async with (
        KubeletStandIn(folder) as kubelet,
        serve_process(tree, folder, listener, "127.0.0.1:0", *flags) as plugin,
    ):
        port = await bound_port(plugin, listener.removeprefix("--").removesuffix("-address"))
        await wait_all_live(kubelet, names, timeout=20, plugin=plugin)
        await eventually(lambda: readyz(port)[0] == 200, 20)
        yield kubelet, plugin, port


def bounded_serve(monkeypatch: Any, seconds: float = 10.0) -> None:
    """For bad-flag tests that must reach ``serve`` (a fault found at discovery): the
    real ``serve`` under a deadline, so a flag wrongly accepted fails the test in
    ``seconds`` (``main`` exits 1 on the TimeoutError) instead of serving until
    pytest's timeout."""
    from numa_device_plugin.cli import serve as serve_module

    real = serve_module.serve

    async def bounded(*args: Any, **kwargs: Any) -> int:
        async with asyncio.timeout(seconds):
            return await real(*args, **kwargs)

    monkeypatch.setattr(serve_module, "serve", bounded)


def never_serve(monkeypatch: Any) -> None:
    """For bad-flag tests that fail before serving: ``serve`` replaced by a coroutine
    that fails the test at once, so a flag wrongly accepted never serves."""
    from numa_device_plugin.cli import serve as serve_module

    async def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("serve was reached: the bad flag was accepted")

    monkeypatch.setattr(serve_module, "serve", refuse)


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


async def bound_port(process: ServeProcess, listener: str, timeout: float = 30.0) -> int:
    """The port a ``serve`` process bound for ``listener`` (``health``, ``metrics``),
    given ``127.0.0.1:0``: read from its ``listening`` log line. A port picked by
    binding and releasing it could be taken before the plugin binds it."""
    found: list[int] = []

    def seen() -> bool:
        found[:] = [
            int(line["port"])
            for line in process.events()
            if line.get("event") == "listening" and line.get("listener") == listener
        ]
        return bool(found)

    try:
        await eventually(seen, timeout)
    except TimeoutError:
        raise AssertionError(f"no {listener} listener logged; the log:\n{process.log()}") from None
    return found[-1]


async def logged(process: ServeProcess, event: str, timeout: float = 10.0) -> dict[str, Any]:
    """Wait until the process has logged ``event``; the first such log line."""
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [line for line in process.events() if line.get("event") == event]
        return bool(found)

    try:
        await eventually(seen, timeout)
    except TimeoutError:
        raise AssertionError(f"{event!r} never logged; the log:\n{process.log()}") from None
    return found[0]
