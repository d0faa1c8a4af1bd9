"""Structured logging (structlog): ``key=value`` text or one JSON object per line, on stderr."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Hashable
from typing import Literal

import structlog

LEVELS = ("debug", "info", "warning", "error")
LogFormat = Literal["text", "json"]


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write, not at configure time."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


# The level configure_logging set last.
_configured = {"level": "info"}


class _QuietShutdownRace(logging.Filter):
    """watchdog's inotify emitter logs an error when its read loop wakes after the
    observer stopped it ("queue_events() called when the thread is inactive"): a race
    of its own stop that loses nothing. Shown at debug (``--log-level debug``), not as
    an error at every shutdown that hits it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("watchdog.") and "thread is inactive" in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return _configured["level"] == "debug"
        return True


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler this module puts on the standard library's root logger: libraries'
    records (watchdog, grpc) rendered as the plugin's own lines."""


def configure_logging(level: str = "info", fmt: LogFormat = "text") -> None:
    """Route structlog output to stderr at ``level`` (one of LEVELS) in ``fmt``, and the
    standard library's records (watchdog's, grpc's) through the same renderer, so that
    every line on stderr is one whole line of one format: each is written in a single
    call (a line and its newline written apart once let another thread's line land in
    between, breaking a JSON line).

    Raises ValueError for an unknown level.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; choose from {', '.join(LEVELS)}")
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.processors.KeyValueRenderer(
            key_order=["timestamp", "level", "event"], drop_missing=True
        )
    _configured["level"] = level
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    handler = _StdlibHandler(_CurrentStderr())
    handler.addFilter(_QuietShutdownRace())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.processors.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries' warnings and errors only, at every level: their debug records are
    # theirs to chatter, and grpc's format the repr of an object it is deallocating
    # (its AioServer.__dealloc__), which crashed the interpreter (SIGSEGV) under pytest.
    root.setLevel(max(logging.WARNING, logging.getLevelNamesMapping()[level.upper()]))


class LevelSwitch:
    """The log level at run time: :meth:`toggle` (serve's SIGUSR1) switches between the
    configured level and ``debug`` (from ``debug``, to ``info``) without a restart,
    and says so in one warning line, which shows at any level."""

    def __init__(self, level: str, fmt: LogFormat) -> None:
        self.configured = level
        self.current = level
        self._fmt = fmt

    def toggle(self) -> str:
        """Switch and return the new level."""
        if self.current != "debug":
            new = "debug"
        else:
            new = self.configured if self.configured != "debug" else "info"
        configure_logging(new, self._fmt)
        self.current = new
        structlog.get_logger(__name__).warning(
            "log level changed", log_level=new, configured=self.configured, signal="SIGUSR1"
        )
        return new


class LogLimiter:
    """At most one log line per key (a failure kind) per ``period`` seconds, however
    many resources fail the same way; the lines held back are counted and reported
    with the next one that passes."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._last: dict[Hashable, float] = {}
        self._held: Counter[Hashable] = Counter()

    def allow(self, key: Hashable) -> int | None:
        """None when a line of ``key`` was let through less than ``period`` seconds
        ago (this one is held back); else the number held back since, to log with it."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.period:
            self._held[key] += 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The event loop's exception handler (``loop.set_exception_handler``): a callback or
    task that ended by cancellation (grpc's aio server cancels its own RPC tasks and
    callbacks, ``_schedule_rpc_coro``, when a server stops) is one debug line, not a
    traceback; anything else goes to asyncio's default handler (an error with its
    traceback)."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        structlog.get_logger("asyncio").debug(
            "a task or callback was cancelled while stopping",
            detail=str(context.get("message"))[:200],
        )
        return
    loop.default_exception_handler(context)
