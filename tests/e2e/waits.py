"""What each end-to-end test waited for, and how long; waits that follow progress.

A loaded machine makes every step of a cluster slower, and a fixed wall-clock limit then
fails a test whose pod was still making its way (pulled, created, started). So a wait
here has two limits: ``timeout`` seconds *without progress* (what it watches did not
change) and a hard limit of :data:`PROGRESS_LIMIT` times that from its start. Every wait,
and every command that took long or had to be tried again, is noted; the progress file
carries the test's notes (:func:`summary`), so a slow run says per test what it waited
for and how long.

The notes are process-wide (one test runs at a time in the tests' worker):
:func:`reset` at each test's setup, :func:`summary` in its report.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Hashable
from typing import Any

# A wait that keeps seeing progress may go on for this many times its timeout.
PROGRESS_LIMIT = 3.0
# A command that took at least this many seconds is noted even when it passed.
SLOW_COMMAND = 5.0
# Seconds between two runs of a kubectl that could not reach the API server.
RETRY_PAUSE = 2.0
# Notes kept per test (a loop of waits is summed by what it waited for anyway).
MAX_NOTES = 400

# kubectl's own failures to reach the API server before anything ran (the command it
# carries never started, so running it again changes nothing twice): a dial that timed
# out or was refused, a TLS handshake that timed out, a connection reset mid-handshake.
UNREACHED = re.compile(
    r"Unable to connect to the server|dial tcp [^ ]+: (i/o timeout|connect: connection refused)"
    r"|TLS handshake timeout|error dialing backend"
)

NOTES: list[dict[str, Any]] = []


def reset() -> None:
    """Forget the notes of the previous test."""
    NOTES.clear()


def note(what: str, seconds: float, outcome: str, **extra: Any) -> None:
    """One wait or slow command: ``what`` (as a failure would name it), ``seconds`` it
    took, ``outcome`` (``met``, ``timed out``, ``retried``, ``slow``) and any of
    ``tries`` (checks made), ``progress`` (changes seen), ``detail`` (a short text)."""
    if len(NOTES) < MAX_NOTES:
        NOTES.append({"what": what[:200], "seconds": round(seconds, 1), "outcome": outcome,
                      **extra})  # fmt: skip


def summary(notes: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The notes grouped by what was waited for, in first-seen order: ``{"what",
    "times", "seconds" (summed), "longest", "outcomes": {outcome: count}, "progress"
    (changes seen, summed), "detail" and "network" (the last given)}``."""
    grouped: dict[str, dict[str, Any]] = {}
    for entry in NOTES if notes is None else notes:
        group = grouped.setdefault(entry["what"], {
            "what": entry["what"], "times": 0, "seconds": 0.0, "longest": 0.0,
            "outcomes": {}, "progress": 0,
        })  # fmt: skip
        group["times"] += 1
        group["seconds"] = round(group["seconds"] + entry["seconds"], 1)
        group["longest"] = max(group["longest"], entry["seconds"])
        group["outcomes"][entry["outcome"]] = group["outcomes"].get(entry["outcome"], 0) + 1
        group["progress"] += int(entry.get("progress", 0))
        for key in ("detail", "network"):
            if entry.get(key):
                group[key] = entry[key]
    return list(grouped.values())


class Progress:
    """Watches ``snapshot`` (any hashable view of what a wait waits for, e.g. a pod's
    phase and container states) and says when it changed. A snapshot that raises counts
    as no change (the API server being slow is not progress)."""

    def __init__(self, snapshot: Callable[[], Hashable] | None) -> None:
        self.snapshot = snapshot
        self.changes = 0
        self.last: Hashable = None
        self._seen = False

    def moved(self) -> bool:
        """Take a snapshot: True when it differs from the previous one (never on the
        first)."""
        if self.snapshot is None:
            return False
        try:
            now = self.snapshot()
        except Exception:  # a failed read is no news either way
            return False
        changed = self._seen and now != self.last
        self.last, self._seen = now, True
        self.changes += int(changed)
        return changed


def wait(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    interval: float = 2.0,
    progress: Callable[[], Hashable] | None = None,
    tolerated: tuple[type[BaseException], ...] = (OSError, ValueError),
) -> tuple[Any, str | None]:
    """Call ``check`` every ``interval`` s until it returns something truthy: ``(value,
    None)``; or ``(last, message)`` once ``timeout`` s (already scaled) passed without a
    change of ``progress``, or :data:`PROGRESS_LIMIT` times ``timeout`` since the start.
    Exceptions of the ``tolerated`` kinds count as a falsy answer (kept as ``last``).
    Notes the wait either way."""
    started = time.monotonic()
    deadline, limit = started + timeout, started + timeout * PROGRESS_LIMIT
    watched = Progress(progress)
    tries, last = 0, None
    while True:
        tries += 1
        try:
            last = check()
        except tolerated as exc:
            last = exc
        now = time.monotonic()
        if last and not isinstance(last, BaseException):
            note(what, now - started, "met", tries=tries, progress=watched.changes)
            return last, None
        if watched.moved():
            deadline = min(limit, now + timeout)
        if now >= deadline:
            break
        time.sleep(max(0.0, min(interval, deadline - now)))
    took = time.monotonic() - started
    note(what, took, "timed out", tries=tries, progress=watched.changes,
         detail=repr(watched.last)[:200] if watched.changes else None)  # fmt: skip
    moved = ""
    if watched.changes:
        moved = f"; it changed {watched.changes} time(s), last {watched.last!r}"
    elif progress is not None:
        moved = "; nothing it watches changed"
    return last, f"timed out after {took:.0f} s waiting for {what} (last: {last!r}{moved})"
