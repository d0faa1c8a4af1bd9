"""Logging: every line on stderr is one whole line of the configured format, the
standard library's records (watchdog, grpc) included."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from numa_device_plugin.ops import logs
from numa_device_plugin.ops.logs import configure_logging


class Writes:
    """A stand-in stderr that records each write call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[Writes]:
    """Every write the log handlers make to stderr (at the write, as they look up
    sys.stderr then: pytest puts its own capture back on sys.stderr after fixtures)."""
    writes = Writes()
    monkeypatch.setattr(logs._CurrentStderr, "write", lambda self, text: writes.write(text))
    yield writes
    configure_logging("debug")  # as tests/conftest.py configures it


def test_every_line_is_written_whole_in_one_call(stderr: Writes) -> None:
    """A line and its newline written apart let watchdog's thread put its own line in
    between: '{...}InotifyEmitter.queue_events() …' broke a JSON line (seen in CI)."""
    configure_logging("info", "json")
    structlog.get_logger("t").info("from the plugin", resource="numa-align/numa-0")
    logging.getLogger("grpc._server").warning("from a library: %s", "odd")
    assert len(stderr.calls) == 2
    for call in stderr.calls:
        assert call.endswith("\n")
        assert call.count("\n") == 1
    plugin, library = (json.loads(call) for call in stderr.calls)
    assert (plugin["event"], plugin["level"]) == ("from the plugin", "info")
    assert (library["event"], library["level"]) == ("from a library: odd", "warning")
    assert library["logger"] == "grpc._server"
    assert "timestamp" in library


def test_libraries_lines_below_warning_never_show(stderr: Writes) -> None:
    """grpc's debug records format the repr of an object it is deallocating: creating
    them crashed the interpreter under pytest. Libraries speak at warning and up only."""
    for level in ("info", "debug"):
        configure_logging(level, "text")
        logging.getLogger("grpc._cython.cygrpc").debug("__dealloc__ called on %r", object())
        logging.getLogger("watchdog.observers").info("watching")
    assert stderr.calls == []
    assert not logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)


def test_watchdogs_stop_race_is_a_debug_line_not_an_error(stderr: Writes) -> None:
    race = "InotifyEmitter.queue_events() called when the thread is inactive"
    configure_logging("info", "json")
    logging.getLogger("watchdog.observers.inotify").error(race)
    logging.getLogger("watchdog.observers.inotify").error("a real watchdog error")
    assert [json.loads(c)["event"] for c in stderr.calls] == ["a real watchdog error"]
    configure_logging("debug", "json")
    logging.getLogger("watchdog.observers.inotify").error(race)
    assert json.loads(stderr.calls[-1])["level"] == "debug"


def test_configuring_again_keeps_one_handler(stderr: Writes) -> None:
    for _ in range(3):
        configure_logging("warning", "json")
    logging.getLogger("x").error("once")
    assert len(stderr.calls) == 1


async def test_a_callback_cancelled_while_stopping_is_no_traceback(stderr: Writes) -> None:
    """grpc's aio server cancels its RPC tasks and callbacks when it stops: asyncio's
    default handler once printed a CancelledError traceback (``_schedule_rpc_coro``)
    at SIGTERM. Other errors keep their traceback."""
    import asyncio

    configure_logging("info", "json")
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(logs.loop_exception_handler)
    try:

        def cancelled() -> None:
            raise asyncio.CancelledError

        def broken() -> None:
            raise ValueError("a real error")

        loop.call_soon(cancelled)
        loop.call_soon(broken)
        await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    written = "".join(stderr.calls)
    assert "CancelledError" not in written
    assert "a real error" in written
    assert "Traceback" in written
