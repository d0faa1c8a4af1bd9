"""The cluster's processes: each started in its own session with its log and pid file
(:class:`Processes`), waited for with its log's tail on failure (:func:`wait_for`), and
the API server reached over HTTPS without a client library (:func:`http_get`,
:func:`untaint`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# --- the processes -------------------------------------------------------------------------


@dataclass
class Process:
    """A cluster process as the fixtures see it: its command line, log and pid file."""

    name: str
    argv: list[str]
    log: str
    pidfile: str


class Processes:
    """Starts cluster processes in their own sessions, logs to files, pid files beside."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self.described: dict[str, Process] = {}

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        entry = Process(name, list(argv), str(logs / f"{name}.log"), str(logs / f"{name}.pid"))
        with open(entry.log, "ab") as out:
            child = subprocess.Popen(
                entry.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        Path(entry.pidfile).write_text(f"{child.pid}\n")
        self.started[name] = child
        self.described[name] = entry

    def alive(self, name: str) -> bool:
        return self.started[name].poll() is None

    def tail(self, name: str, lines: int = 30) -> str:
        text = Path(self.described[name].log).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def wait_for(what: str, check: object, timeout: float, processes: Processes, name: str) -> None:
    """Call ``check()`` until truthy; raise RuntimeError with the process's log tail when
    ``timeout`` seconds pass or the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes.alive(name):
            raise RuntimeError(f"{name} exited while waiting for {what}:\n{processes.tail(name)}")
        with contextlib.suppress(Exception):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"timed out after {timeout:.0f} s waiting for {what}:\n{processes.tail(name)}"
    )


def http_get(url: str, token: str = "", timeout: float = 3.0, accept: str = "") -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} | ({"Accept": accept} if accept else {})
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            return int(answer.status), answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def untaint(node_url: str, token: str) -> bool:
    """Remove every taint from the node (a JSON merge patch); True once none is left."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(
        node_url, method="PATCH", data=json.dumps({"spec": {"taints": None}}).encode(),
        headers={"Authorization": f"Bearer {token}",
                 "Content-Type": "application/merge-patch+json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5, context=context) as answer:
        return not json.loads(answer.read()).get("spec", {}).get("taints")


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
