"""Which resources the restart loop serves (and registers) again, and serving them.

The loop decides from the state it finds, never from the events alone
(:func:`~.verdicts.restart_reason`): a new ``kubelet.sock``, a deleted socket, a lost
ListAndWatch stream. A server that fails to start is retried with backoff, and
``/readyz`` says why meanwhile (:func:`~.verdicts.serve_problem`).
"""

from __future__ import annotations

import structlog

from numa_device_plugin.kubelet.grpcserver import file_identity
from numa_device_plugin.kubelet.registration import Backoff
from numa_device_plugin.ops.wakeups import STREAM_LOST
from numa_device_plugin.plugin.lifecycle.verdicts import restart_reason, serve_problem
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.serving.endpoint import Endpoints
from numa_device_plugin.plugin.serving.lock import LockKeeper
from numa_device_plugin.plugin.settings.config import Config

log = structlog.get_logger(__name__)


class Restarts:
    """The resources to serve again (``pending``: resource names), the backoff of
    retries and why serving failed last (``problem``, for ``/readyz``; None when every
    server started). Loop thread only."""

    def __init__(
        self, config: Config, catalog: Catalog, endpoints: Endpoints, lock_keeper: LockKeeper
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.endpoints = endpoints
        self.lock_keeper = lock_keeper
        self.pending: set[str] = set()
        self.problem: str | None = None
        self._backoff = Backoff()

    def retry_delay(self) -> float | None:
        """Seconds until the loop tries the pending resources again (a server failed to
        start: the backoff's next delay), or None when none is pending (the backoff
        starts over)."""
        if self.pending:
            return self._backoff.next_delay()
        self._backoff.reset()
        return None

    def evaluate(self, reasons: list[tuple[str, str]]) -> None:
        """Decide which resources to serve (again), from the state found now.

        Events only say *when* to look (:func:`restart_reason` says why, per resource).
        """
        if not self.lock_keeper.keep():
            return
        kubelet = file_identity(self.config.kubelet_socket)
        self.endpoints.note_kubelet(kubelet)
        lost = {name for reason, name in reasons if reason == STREAM_LOST}
        for name in self.catalog.resources:
            why = restart_reason(self.endpoints.running.get(name), kubelet, name in lost)
            if why is not None and name not in self.pending:
                log.info("serving and registering again", resource=name, reason=why)
                self.pending.add(name)
        if self.pending:
            log.debug("restart planned", resources=sorted(self.pending), reasons=reasons)

    async def restart(self, names: set[str]) -> None:
        """Stop the named endpoints, then, if a kubelet is there, serve them again.

        Streams are ended first, so the grace period only waits for in-flight
        Allocate calls and costs nothing when there are none. Servers that fail to
        start are retried with backoff; /readyz says so meanwhile.
        """
        await self.endpoints.stop(names, self.config.shutdown_grace)
        kubelet = file_identity(self.config.kubelet_socket)
        self.endpoints.note_kubelet(kubelet)
        if kubelet is None:
            log.info("waiting for the kubelet", kubelet_socket=str(self.config.kubelet_socket))
            return
        to_start = sorted(names & set(self.catalog.resources))
        failed = await self.endpoints.start_all(
            [(self.catalog.resources[name], self.catalog.servicers[name]) for name in to_start],
            kubelet,
        )
        self.pending |= set(failed)
        self.problem = serve_problem(failed)
