"""Stop signals from the first moment, in a PID namespace as in the container (the
kernel drops any signal its PID 1 has no handler for):

- the image's entrypoint, ``dumb-init -- numa-device-plugin serve``: a SIGTERM to PID 1
  0.1 s, 0.5 s or 3 s after exec ends the plugin within 2 s and leaves no socket;
- the plugin itself as PID 1 (a container run without the image's entrypoint): the same
  0.5 s and 3 s after exec. Before the interpreter reaches the entry point (~30 ms on a
  quiet machine, a few hundred under load) nothing can catch a signal; that window is
  why the image runs dumb-init."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops import signals
from numa_device_plugin.topology.fake import SysfsTree
from tests.conftest import missing
from tests.standin_helpers import REPO, eventually, serve_args


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def pid_namespace() -> None:
    """Only the PID 1 tests need ``unshare --pid``: without it they skip, or fail under
    CI (the other tests here run anyway)."""
    if not can_unshare():
        missing("needs unshare --pid (root or user namespaces; util-linux) to run PID 1")


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in its status):
    the kernel drops a signal sent to a namespace's PID 1 that has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def child_of(pid: int, timeout: float = 5.0) -> int:
    """The one child of ``pid`` (unshare's forked command), once it exists."""
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{pid}/task/{pid}/children")
    while time.monotonic() < deadline:
        children = path.read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.005)
    raise AssertionError(f"{pid} has no child")


def pid_in_namespace(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError("no NSpid")


DUMB_INIT = Path(sys.executable).parent / "dumb-init"


@pytest.mark.parametrize(
    ("entrypoint", "after"),
    [("dumb-init", 0.1), ("dumb-init", 0.5), ("dumb-init", 3.0), ("plugin", 0.5),
     ("plugin", 3.0)],
)  # fmt: skip
async def test_pid_1_stops_on_sigterm_at_any_moment(
    two_nodes: SysfsTree, sock_dir: Path, entrypoint: str, after: float, pid_namespace: None
) -> None:
    """SIGTERM at a moment after PID 1 has a handler for it (before that the kernel
    drops it: PID 1 ignores signals it does not catch; waiting for ``SigCgt`` is waiting
    for that event, not for a time that load can stretch)."""
    init = [str(DUMB_INIT), "--"] if entrypoint == "dumb-init" else []
    if init and not DUMB_INIT.is_file():
        pytest.fail(f"{DUMB_INIT} is missing: `make install` installs dumb-init (dev)")
    log = sock_dir.parent / f"{sock_dir.name}.log"
    async with KubeletStandIn(sock_dir) as kubelet:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with log.open("wb") as out:
            started = time.monotonic()
            unshare = subprocess.Popen(
                ["unshare", "--pid", "--fork", *init, *serve_args(two_nodes, sock_dir)],
                env=env,
                stderr=out,
                stdin=subprocess.DEVNULL,
            )
        plugin = 0
        try:
            plugin = await asyncio.to_thread(child_of, unshare.pid)
            assert pid_in_namespace(plugin) == 1, "the plugin is PID 1 of its namespace"
            await eventually(lambda: catches(plugin, signal.SIGTERM), timeout=30)
            await asyncio.sleep(max(0.0, after - (time.monotonic() - started)))
            if after >= 3:
                # The 3 s case is SIGTERM while serving: wait for that event (load once
                # stretched the start past 3 s and the case sent SIGTERM before it).
                try:
                    await kubelet.wait_until(lambda: kubelet.live("numa-align/numa-0"), 30)
                except TimeoutError:
                    raise AssertionError(f"not serving after 30 s:\n{log.read_text()}") from None
            os.kill(plugin, signal.SIGTERM)
            sent = time.monotonic()
            status = await asyncio.to_thread(unshare.wait, 10)
            took = time.monotonic() - sent
        finally:
            # SIGKILL reaches a namespace's PID 1 from outside; killing unshare alone
            # would leave the plugin running.
            if plugin and Path(f"/proc/{plugin}").exists():
                os.kill(plugin, signal.SIGKILL)
            if unshare.poll() is None:
                unshare.kill()
            unshare.wait(5)
            text = log.read_text()
            log.unlink()  # on every path: nothing left in /tmp
    assert took < 2.0, f"stopped {took:.2f} s after SIGTERM; its log:\n{text}"
    # 0 after an orderly stop; 143 (128 + SIGTERM) when the signal came before serve's
    # handlers (nothing was served yet: signals.catch_early ends the process at once),
    # or before the plugin's first handler under dumb-init (which exits as its child).
    assert status in (0, 128 + signal.SIGTERM), text
    assert sorted(p.name for p in sock_dir.glob("*.sock")) == [], "no socket left behind"


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that imports this checkout; its output and status."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_before_serves_handlers_ends_the_process_at_once(signum: int) -> None:
    """In a child process: after catch_early a stop signal ends it at once, 128 +
    the signal's number, however long the rest of start-up would take (a slow import
    under qemu's TCG kept a deleted pod's container alive 15 s)."""
    code = (
        "import os, signal, sys, time\n"
        "from numa_device_plugin.ops import signals\n"
        "signals.catch_early()\n"
        "print('caught', flush=True)\n"
        f"os.kill(os.getpid(), {int(signum)})\n"
        "time.sleep(30)  # a slow start-up\n"
        "print('not reached', flush=True)\n"
    )
    started = time.monotonic()
    result = run_python(code)
    assert result.stdout == "caught\n"
    assert result.returncode == 128 + signum
    assert time.monotonic() - started < 20, "it did not wait for the rest of start-up"


def test_sigusr1_before_serves_handler_is_ignored() -> None:
    """serve's log level switch: a SIGUSR1 during start-up (its default action ends a
    process) leaves the plugin running."""
    code = (
        "import os, signal\n"
        "from numa_device_plugin.ops import signals\n"
        "signals.catch_early()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('alive', flush=True)\n"
        "signals.release()\n"
        "assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL\n"
    )
    result = run_python(code)
    assert (result.stdout, result.returncode) == ("alive\n", 0), result.stderr


def test_release_gives_the_usual_actions_back() -> None:
    code = (
        "import os, signal\n"
        "from numa_device_plugin.ops import signals\n"
        "signals.catch_early()\n"
        "signals.release()\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('not reached', flush=True)\n"
    )
    result = run_python(code)
    assert result.stdout == ""
    assert result.returncode == -signal.SIGTERM


def test_release_without_catch_early_changes_nothing() -> None:
    """A handler set by someone else stays (it was the default either way before, so
    the test could not fail)."""

    def own(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGTERM, own)
    try:
        signals.release()
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, before)
