"""File descriptors: what the plugin needs, checked against ``RLIMIT_NOFILE`` at start.

Measured (``make bench``, scale): a registered resource holds 2 descriptors (its
gRPC server's listening socket and the kubelet's connection to it); registering
opens one more for a moment (a fresh connection to ``kubelet.sock``). The process
holds about 20 of its own (the event loop, gRPC's wakeup fds, inotify, the lock,
the pod resources connection, standard streams), and each HTTP listener up to
its connection cap. Without enough descriptors no resource registers, and the
process, alive, would only log; so the limit is checked before anything is served.
"""

from __future__ import annotations

import resource

# Descriptors of the process itself, with room to spare.
BASE_FDS = 64
# Per resource: its listening socket, the kubelet's connection, a registration's dial.
FDS_PER_RESOURCE = 3


class FdLimitError(Exception):
    """``RLIMIT_NOFILE``'s hard limit is below what the plugin needs."""

    def __init__(self, needed: int, resources: int, soft: int, hard: int) -> None:
        self.needed, self.soft, self.hard = needed, soft, hard
        super().__init__(
            f"{resources} resources need about {needed} file descriptors, but RLIMIT_NOFILE "
            f"is soft {soft}, hard {hard}: raise the hard limit (ulimit -Hn; the container "
            "runtime's LimitNOFILE or default_ulimits)"
        )


def fds_needed(resources: int, listener_connections: int = 0) -> int:
    """Descriptors for ``resources`` served resources and HTTP listeners allowing
    ``listener_connections`` connections in all."""
    return BASE_FDS + FDS_PER_RESOURCE * resources + listener_connections


def ensure_fds(needed: int, resources: int) -> tuple[int, int]:
    """Make ``RLIMIT_NOFILE``'s soft limit at least ``needed``, raising it up to the hard
    limit (to the hard limit itself, as Go programs do, so later growth fits too).

    Returns ``(soft, hard)`` as they are now. Raises :class:`FdLimitError` when the
    hard limit is below ``needed``; the limits are then left as they were.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed <= soft or soft == resource.RLIM_INFINITY:
        return soft, hard
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise FdLimitError(needed, resources, soft, hard)
    target = hard if hard != resource.RLIM_INFINITY else needed
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        raise FdLimitError(needed, resources, soft, hard) from None
    return resource.getrlimit(resource.RLIMIT_NOFILE)
