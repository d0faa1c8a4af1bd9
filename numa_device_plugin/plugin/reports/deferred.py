"""The recorder made once the plugin has registered: metrics can wait, registering
cannot. :class:`DeferredRecorder` keeps the calls made before its real
:class:`~numa_device_plugin.plugin.model.recorder.Recorder` (a
:class:`~numa_device_plugin.plugin.reports.prometheus.PrometheusRecorder`, ~20 ms of
imports) exists, and replays them into it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog

from numa_device_plugin.plugin.model.recorder import Recorder
from numa_device_plugin.topology.plan import NodePlan

if TYPE_CHECKING:
    from numa_device_plugin.plugin.model.figures import NodeCapacity
    from numa_device_plugin.plugin.model.resources import Device


R = TypeVar("R", bound=Recorder)
# Seconds from the last advertised resource's accepted registration to making the
# recorder: the kubelet opens each ListAndWatch stream right after its Register call
# returns, and its first answer should not wait behind prometheus-client's import.
SETTLE = 0.25
# Seconds from :meth:`DeferredRecorder.start` after which the recorder is made however
# far registration got (no kubelet yet, a server that cannot start): the calls kept
# until then stay few.
DEADLINE = 5.0


class DeferredRecorder(Generic[R]):
    """A :class:`Recorder` whose real one (``make()``, e.g. a ``PrometheusRecorder``:
    ~20 ms of imports) is made after registration: :data:`SETTLE` seconds after every
    resource of the last ``topology()`` call has been ``registered(name, True)``, or
    :data:`DEADLINE` seconds after :meth:`start`, or at the first :meth:`load` (a
    scrape), whichever comes first. Calls before then are kept in order and replayed
    into it, so it ends as it would had it been there from the start.

    Thread-safe: the loop records while a scrape may :meth:`load` in a worker thread.
    ``make`` raising propagates from :meth:`load` (kept calls are kept for the next
    try)."""

    def __init__(self, make: Callable[[], R]) -> None:
        self._make = make
        self._real: R | None = None
        self._kept: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()  # _kept and _real
        self._making = threading.Lock()  # one make() at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[str] = set()  # advertised, not yet registered
        self._timers: list[asyncio.TimerHandle] = []

    @property
    def loaded(self) -> bool:
        """True once the real recorder is made."""
        return self._real is not None

    def start(self) -> None:
        """Arm the deadline on the running loop (loop thread). Until called, the real
        recorder is made only by :meth:`load`."""
        self._loop = asyncio.get_running_loop()
        self._timers.append(self._loop.call_later(DEADLINE, self._load_soon))

    def stop(self) -> None:
        """Disarm the timers (the loop is ending); :meth:`load` still works."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._loop = None

    def load(self) -> R:
        """The real recorder, made now (blocking: imports) if not yet, with every kept
        call replayed into it."""
        with self._making:
            if self._real is not None:
                return self._real
            real = self._make()
            with self._lock:
                for name, args in self._kept:
                    getattr(real, name)(*args)
                self._kept.clear()
                self._real = real
            return real

    def _load_soon(self) -> None:
        """Make the real recorder in a worker thread (the loop keeps answering)."""
        self.stop()
        if self._real is None:
            task = asyncio.ensure_future(asyncio.to_thread(self.load))
            task.add_done_callback(_log_failure)

    def _now(self, name: str, *args: Any) -> R | None:
        """The real recorder to call, or None when the call was kept for it."""
        real = self._real
        if real is not None:
            return real
        with self._lock:
            if self._real is None:
                self._kept.append((name, args))
                return None
            return self._real

    def topology(self, plans: tuple[NodePlan, ...], devices: dict[str, int]) -> None:
        if (real := self._now("topology", plans, devices)) is not None:
            real.topology(plans, devices)
        else:
            self._waiting = set(devices)

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        if (real := self._now("near", nodes)) is not None:
            real.near(nodes)

    def allocated(self, resource: str, seconds: float, ok: bool) -> None:
        if (real := self._now("allocated", resource, seconds, ok)) is not None:
            real.allocated(resource, seconds, ok)

    def registration(self, resource: str, ok: bool) -> None:
        if (real := self._now("registration", resource, ok)) is not None:
            real.registration(resource, ok)

    def registered(self, resource: str, now: bool) -> None:
        if (real := self._now("registered", resource, now)) is not None:
            real.registered(resource, now)
        elif now and resource in self._waiting:
            self._waiting.discard(resource)
            if not self._waiting and self._loop is not None:
                self._timers.append(self._loop.call_later(SETTLE, self._load_soon))

    def kubelet_restart(self) -> None:
        if (real := self._now("kubelet_restart")) is not None:
            real.kubelet_restart()

    def devices(self, resource: str, devices: Sequence[Device]) -> None:
        if (real := self._now("devices", resource, devices)) is not None:
            real.devices(resource, devices)

    def exposed(self, resource: str, node_id: int, switches: int) -> None:
        if (real := self._now("exposed", resource, node_id, switches)) is not None:
            real.exposed(resource, node_id, switches)

    def capacity(
        self,
        nodes: Sequence[NodeCapacity],
        memory: Mapping[int, Mapping[str, int]],
        assigned_memory: Mapping[tuple[int, str, str], int],
    ) -> None:
        if (real := self._now("capacity", nodes, memory, assigned_memory)) is not None:
            real.capacity(nodes, memory, assigned_memory)

    def pod_resources(self, up: bool, last_read: float | None) -> None:
        if (real := self._now("pod_resources", up, last_read)) is not None:
            real.pod_resources(up, last_read)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        structlog.get_logger(__name__).error(
            "cannot make the metrics recorder; /metrics will try again", error=str(exc)
        )
