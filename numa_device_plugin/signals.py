"""Stop signals from the first moment a command runs.

In its container the plugin is PID 1 of a PID namespace, and the kernel drops every
signal PID 1 has no handler for: a SIGTERM that came before ``serve`` installed its
handlers on the event loop was lost, and the kubelet killed the plugin 30 s later,
leaving a stale socket behind. So the entry point (:mod:`numa_device_plugin.__main__`)
calls :func:`catch_early` before it imports anything else: SIGTERM and SIGINT are
remembered from then on, and ``serve`` stops at once when it finds one remembered
(:func:`early_stop`) as it installs its own handlers. The other commands give the
signals back their usual meaning (:func:`release`). Standard library only, so that
importing it costs nothing.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []
_installed = False


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Remember SIGTERM and SIGINT instead of their usual action. Main thread only."""
    global _installed
    for signum in STOP_SIGNALS:
        signal.signal(signum, _remember)
    _installed = True


def early_stop() -> int | None:
    """The first stop signal received since :func:`catch_early`, or None."""
    return _received[0] if _received else None


def release() -> None:
    """Give SIGTERM and SIGINT their usual action back (a command that installs no
    handlers of its own); a signal that came meanwhile is delivered again now. Does
    nothing unless :func:`catch_early` ran."""
    global _installed
    if not _installed:
        return
    _installed = False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _received:
        os.kill(os.getpid(), _received.pop(0))
