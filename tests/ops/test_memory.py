"""glibc heap settings: the malloc arena limit set in-process at start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.standin_helpers import REPO

# Eight threads each allocate; glibc gives every new thread its own arena up to the
# limit (8 per core by default), and malloc_stats() prints one "Arena N:" per arena.
PROGRAM = """
import ctypes, sys, threading
if sys.argv[1] == "limit":
    from numa_device_plugin.ops.heap import limit_malloc_arenas
    assert limit_malloc_arenas()
barrier = threading.Barrier(8)
def work():
    kept = [bytearray(2048) for _ in range(200)]
    barrier.wait()  # all eight alive at once: no arena is handed on by an exited thread
    kept += [bytearray(2048) for _ in range(200)]
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
sys.stderr.flush()
ctypes.CDLL(None).malloc_stats()
"""


def arenas(mode: str, **env: str) -> int:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    environment.update(env, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return sum(1 for line in result.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_the_arena_limit_holds_without_the_environment_variable() -> None:
    unlimited = arenas("none")
    if unlimited <= 2:
        pytest.skip(f"this C library made {unlimited} arenas for 8 threads anyway")
    assert arenas("limit") <= 2


def test_an_explicit_environment_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from numa_device_plugin.ops.heap import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_serve_sets_the_limit_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    from numa_device_plugin.cli import main, serve

    calls: list[str] = []

    def limit() -> bool:
        calls.append("limit")
        return True

    monkeypatch.setattr(serve, "limit_malloc_arenas", limit)
    monkeypatch.setattr(serve, "check_socket_dir", lambda folder: calls.append("check"))

    async def fake_serve(*args: object, **kwargs: object) -> int:
        calls.append("serve")
        return 0

    monkeypatch.setattr(serve, "serve", fake_serve)
    assert main(["serve", "--socket-dir", "/nonexistent-dp"]) == 0
    assert calls == ["limit", "check", "serve"]
