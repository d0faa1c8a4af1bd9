"""Stop signals from the first moment a command runs.

In its container the plugin is PID 1 of a PID namespace (or the child of dumb-init), and
the kernel drops every signal PID 1 has no handler for: a SIGTERM that came before
``serve`` installed its handlers on the event loop was lost, and the kubelet killed the
plugin 30 s later, leaving a stale socket behind. So the entry point
(:mod:`numa_device_plugin.__main__`) calls :func:`catch_early` before it imports anything
else. Until ``serve`` installs its own handlers, the process holds nothing that needs
tearing down (no socket file, no registration), so a SIGTERM or SIGINT then ends it at
once, exit status 128 + the signal's number, even as PID 1 and even while a slow machine
is still importing gRPC (under qemu's TCG that took seconds: remembering the signal
until ``serve`` could act on it kept a deleted pod's container alive 15 s). The other
commands give the signals back their usual meaning (:func:`release`). Standard library
only, so that importing it costs nothing.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# serve's log level switch (logs.LevelSwitch). Its default action ends a process, so it
# is ignored from the first moment until serve handles it: a SIGUSR1 sent while the
# plugin starts must not kill it.
LEVEL_SIGNAL = signal.SIGUSR1

_installed = False


def _stop_now(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)  # nothing to tear down yet; exit(3) would run atexit hooks


def catch_early() -> None:
    """End the process at once on SIGTERM or SIGINT (exit status 128 + signal) and
    ignore SIGUSR1, until ``serve`` replaces these handlers with its own or
    :func:`release` restores the usual ones. Main thread only."""
    global _installed
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop_now)
    signal.signal(LEVEL_SIGNAL, signal.SIG_IGN)
    _installed = True


def release() -> None:
    """Give SIGTERM, SIGINT and SIGUSR1 their usual action back (a command that installs no
    handlers of its own). Does nothing unless :func:`catch_early` ran."""
    global _installed
    if not _installed:
        return
    _installed = False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(LEVEL_SIGNAL, signal.SIG_DFL)
