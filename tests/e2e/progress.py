"""What an end-to-end run records as it goes: one progress line per test (its outcome,
the failure's chain of causes, the plugin's log tail and the network's state when it
failed), read back by the harness on any exit."""

from __future__ import annotations

import contextlib
import functools
import urllib.parse
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from tests.conftest import REPO

# The harness names a file (in the results share that comes back to the host): one JSON
# line per test, written as the test ends, so a run cut by a time limit still says what
# passed, what failed and why (test/local/render.py's progress_summary reads it).
PROGRESS = "NUMA_E2E_PROGRESS"
# Lines of a test's output kept as what it observed, and characters of each.
OBSERVED_LINES, OBSERVED_CHARS = 6, 300


def failure_chain(longrepr: object, keep: int = 4) -> list[str]:
    """``path:line`` of each frame of a failure's traceback, the test's own first and the
    raising frame last (a bare ``TimeoutError: timed out`` says nothing of which call
    timed out); at most ``keep``: the first and the last ``keep - 1`` with ``...``
    between. Empty for a skip or a traceback without locations (``--tb=native``)."""
    entries = getattr(getattr(longrepr, "reprtraceback", None), "reprentries", None) or []
    found = [f"{loc.path}:{loc.lineno}" for entry in entries
             if (loc := getattr(entry, "reprfileloc", None)) is not None]  # fmt: skip
    return found if len(found) <= keep else [found[0], "...", *found[1 - keep :]]


def progress_record(report: pytest.TestReport) -> dict[str, Any] | None:
    """The line :envvar:`NUMA_E2E_PROGRESS` gets for ``report``: one per test (its call,
    or a setup that failed or skipped, or a teardown that failed): ``{"test", "when",
    "outcome", "seconds", "observed": [its last printed lines], "why", "where":
    [:func:`failure_chain`], "plugin_log": [the plugin's last log lines, a failure's],
    "waits": [what it waited for and how long, :func:`waits.summary`], "network": {what
    the node's network showed at a failure, :func:`network_snapshot`}}``; None for the
    other phases."""
    if (
        report.when == "call"
        or (report.when == "setup" and not report.passed)
        or (report.when == "teardown" and report.failed)
    ):
        printed = [line for line in report.capstdout.splitlines() if line.strip()]
        why = None
        if not report.passed:
            crash = getattr(report.longrepr, "reprcrash", None)
            why = crash.message if crash is not None else str(report.longrepr)
            if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
                why = str(report.longrepr[2])
        return {
            "test": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "seconds": round(report.duration, 1),
            "observed": [line[:OBSERVED_CHARS] for line in printed[-OBSERVED_LINES:]],
            "why": None if why is None else why[:2000],
            "where": [] if report.passed else failure_chain(report.longrepr),
            "plugin_log": next((text.splitlines()[-OBSERVED_LINES:] for name, text
                                in report.sections if name.startswith("plugin log")), []),
            "waits": dict(report.user_properties).get("waits", []),
            "network": dict(report.user_properties).get("network"),
        }  # fmt: skip
    return None


# Lines of the plugin's log a failed test's report carries.
PLUGIN_LOG_LINES = 40


def plugin_log_tail(funcargs: dict[str, Any], lines: int = PLUGIN_LOG_LINES) -> str | None:
    """The last ``lines`` of the plugin's log, from the first of a test's fixtures that is
    a platform or holds one (``platform``, ``two.platform``, ``fleet.two.platform``);
    None when none does. A log that cannot be read gives the reason instead."""
    for value in funcargs.values():
        holders = (value, getattr(value, "platform", None),
                   getattr(getattr(value, "two", None), "platform", None))  # fmt: skip
        for candidate in holders:
            read = getattr(candidate, "plugin_log", None)
            if callable(read):
                try:
                    text = str(read())
                except Exception as exc:  # a report must not fail on it
                    return f"(the plugin's log could not be read: {exc})"
                return "\n".join(text.splitlines()[-lines:])
    return None


@functools.cache
def _netstate() -> Any:
    """``test/local/netstate.py``, loaded once (it is no package of the tests)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("netstate", REPO / "test/local/netstate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def network_snapshot() -> dict[str, Any]:
    """What this node's network shows (``test/local/netstate.py``: interface counters,
    TCP failures and retransmits, load, a timed TCP connect to the API server), for a
    failed test's report: beside the host's samples (``logs/network.jsonl``) it tells a
    guest that cannot reach the API server from one whose API server does not answer."""
    netstate = _netstate()
    target = None
    with contextlib.suppress(Exception):  # a report must not fail on it
        parsed = urllib.parse.urlsplit(client.Configuration.get_default_copy().host)
        if parsed.hostname and parsed.port:
            target = (parsed.hostname, parsed.port)
    found: dict[str, Any] = netstate.snapshot(target)
    return found
