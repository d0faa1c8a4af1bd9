"""The state behind the resources over several NUMA nodes, between reads of the pod
resources API: the node each exposes (and how often that changed), and what Allocate
has given that no read lists yet (:mod:`.pending`). The capacity poller keeps one and
passes it to every plan; the rule itself is :mod:`.exposure`, pure."""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.counts.exposure import Exposure
from numa_device_plugin.plugin.counts.pending import MAX_PENDING, Allocation, still_pending
from numa_device_plugin.plugin.model.recorder import Recorder

log = structlog.get_logger(__name__)


class Spanning:
    """``exposures``: per resource over several NUMA nodes, the node it exposes now and
    why; ``switches``: per resource, changes of that node since start; ``allocations``:
    the answered Allocates no read lists yet (oldest first, at most
    :data:`~.pending.MAX_PENDING`). Event-loop thread only."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.exposures: dict[str, Exposure] = {}
        self.switches: dict[str, int] = {}
        self.allocations: tuple[Allocation, ...] = ()

    def previous(self) -> dict[str, int]:
        """Per resource, the node it exposed so far (the rule keeps it unless another
        has strictly more room)."""
        return {name: exposure.node_id for name, exposure in self.exposures.items()}

    def allocated(self, resource: str, ids: frozenset[str]) -> None:
        """Allocate answered ``ids`` of ``resource`` now."""
        allocation = Allocation(resource, ids, time.monotonic())
        self.allocations = (*self.allocations, allocation)[-MAX_PENDING:]

    def read(self, view: KubeletView | None, read_at: float | None = None) -> None:
        """Drop the allocations ``view`` lists (or that are too old: :func:`still_pending`);
        ``read_at``: ``time.monotonic()`` when the read that gave it started (None: not a
        fresh read)."""
        self.allocations = still_pending(self.allocations, view, time.monotonic(), read_at)

    def note(self, exposures: Mapping[str, Exposure]) -> None:
        """Take a plan's exposures: log and count each change of a resource's exposed
        node, and tell the recorder."""
        for name, exposure in exposures.items():
            before = self.exposures.get(name)
            if before is not None and before.node_id != exposure.node_id:
                self.switches[name] = self.switches.get(name, 0) + 1
                log.info(
                    "exposed NUMA node changed", resource=name, node=exposure.node_id,
                    was=before.node_id, why=exposure.why,
                )  # fmt: skip
            self.recorder.exposed(name, exposure.node_id, self.switches.get(name, 0))
        self.exposures = dict(exposures)
