"""The capacity poller: the kubelet's pod resources API -> :class:`KubeletView` -> the
device list (and health) each servicer advertises.

It only feeds the servicers; the restart loop never waits for it. Rules, from the
kubelet:

- ``List`` is read every ``--pod-resources-interval`` seconds, and sooner when asked:
  right after every registration (a new kubelet may have other allocatable CPUs) and
  :data:`ALLOCATE_POLL_DELAY` after every Allocate (the kubelet's CPU manager assigns
  a container's CPUs right after the device manager's Allocate).
- With ``--cgroup-root`` and the kubelet's ``kubepods`` folder watched
  (:mod:`numa_device_plugin.kubelet.kubepods`), a Guaranteed pod's cgroup coming or
  going is when a pod without devices may have taken or given back CPUs or memory:
  ``List`` is read then (and once more a few seconds later), and the interval becomes
  a backstop of at least
  :data:`~numa_device_plugin.plugin.counts.schedule.SIGNALLED_INTERVAL`; while the watch
  is not live (no such folder, replaced, no inotify watch left) the interval is as
  given. When the next read is due: :mod:`numa_device_plugin.plugin.counts.schedule`.
- ``GetAllocatableResources`` changes only when the kubelet restarts with other
  settings, so it is read after registrations and every :data:`ALLOCATABLE_EVERY`
  polls, not at every one.
- A read gives up after ``min(interval, POLL_TIMEOUT)`` seconds: a silent API holds up
  nothing, and the first read at start-up never delays registration by more.
- An outage after the API has answered keeps the last answer's counts (busy CPUs
  stay busy); only before the first answer does :mod:`.capacity` count from sysfs.
- A kubelet whose CPU manager is not ``static`` lists no allocatable CPUs: every
  device turns Unhealthy (unless ``--allow-unaligned``), said once per change and at
  each registration.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import Mapping

import structlog

from numa_device_plugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.counts.planning import Planned, node_capacities, plan
from numa_device_plugin.plugin.counts.schedule import ReadSchedule
from numa_device_plugin.plugin.counts.spanning import Spanning
from numa_device_plugin.plugin.model.figures import NodeCapacity
from numa_device_plugin.plugin.model.recorder import Recorder
from numa_device_plugin.plugin.model.resources import HEALTHY, Resource
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.settings.config import Config

log = structlog.get_logger(__name__)

# Seconds after an Allocate to read the pod resources API again.
ALLOCATE_POLL_DELAY = 0.5
# Seconds one pod resources call may take at most.
POLL_TIMEOUT = 2.0
# Reads this many seconds apart or more each dial anew (~2 ms of CPU); closer ones
# share a kept connection. A pod resources connection kept from before the plugin's
# registrations to after them was seen to leave grpc's worker threads waking ~20 times
# a second (the floor's ~10; ~20 ms of CPU per 30 s more) for as long as the plugin
# then ran, in 13 of 19 starts; closed after each read, in none of 15; closed as here,
# in none of 7 (grpc core's own doing, not understood: docs/performance.md).
KEEP_CONNECTION_BELOW = 10.0
# Between registrations, GetAllocatableResources is read again every this many polls.
ALLOCATABLE_EVERY = 12
# Foreign device ids remembered as already warned about (then no more warnings).
MAX_FOREIGN_WARNED = 1024


class CapacityPoller:
    """Reads the pod resources API and sets the device list of every servicer in
    ``catalog`` from it (ListAndWatch sends the changes).

    ``view`` is the last answer (None before the first, or while the API has never
    answered). :meth:`run` is the polling task; ``schedule.request()`` asks for a read
    sooner.
    """

    def __init__(self, config: Config, catalog: Catalog, recorder: Recorder) -> None:
        self.config = config
        self.catalog = catalog
        self.recorder = recorder
        self.client = PodResourcesClient(config.pod_resources_path)
        self.view: KubeletView | None = None
        self._applied = False
        self._reachable: bool | None = None
        # time.time() of the last good read; None: never since start.
        self._read_at: float | None = None
        self.schedule = ReadSchedule(config.pod_resources_interval)
        self._polls = 0
        self._foreign_warned: set[tuple[str, str]] = set()
        self.spanning = Spanning(recorder)  # exposed nodes; Allocates not listed yet

    # -- what the kubelet showed ------------------------------------------------------------

    @property
    def reachable(self) -> bool | None:
        """Whether the last read of the pod resources API succeeded; None before the first."""
        return self._reachable

    @property
    def read_at(self) -> float | None:
        """``time.time()`` of the last good read; None when there was none."""
        return self._read_at

    def capacities(self) -> list[NodeCapacity]:
        """Per advertised NUMA node, its CPUs and devices as the kubelet last showed them
        (holders of a resource that follows a device count for the node of the device
        they hold)."""
        servicers = self.catalog.servicers
        return node_capacities(
            self.config, self.catalog, self.view, self.catalog.resources,
            lambda name: servicers[name].devices,
        )  # fmt: skip

    def memory_unaligned(self) -> bool:
        """True when the kubelet's Memory Manager reports no memory (its policy is not
        Static) and memory devices are withheld."""
        return self.view is not None and not self.view.memory and not self.config.allow_unaligned

    def withheld(self, name: str) -> bool:
        """True when every device of resource ``name`` is withheld for a kubelet
        manager's policy (the CPU manager's for CPU resources, the Memory Manager's for
        memory resources)."""
        resource = self.catalog.resources.get(name)
        if resource is not None and resource.memory is not None:
            return self.memory_unaligned()
        return self.unaligned()

    def warn_withheld(self, names: list[str]) -> None:
        """Say, once for the CPU resources and once for the memory ones among
        ``names``, why their devices are Unhealthy and what to set."""
        known = set(self._resources(memory=True))
        memory = [n for n in names if n in known]
        cpus = [n for n in names if n not in memory]
        if cpus and self.unaligned():
            warn_unaligned(cpus)
        if memory and self.memory_unaligned():
            warn_memory(memory)

    def _resources(self, *, memory: bool) -> list[str]:
        """The names of the memory resources (``memory``) or of the CPU ones, sorted."""
        return sorted(
            name
            for name, resource in self.catalog.resources.items()
            if (resource.memory is not None) == memory
        )

    def unaligned(self) -> bool:
        """True when the kubelet's CPU manager is not static and devices are withheld."""
        return (
            self.view is not None
            and not self.view.cpu_manager_static
            and not self.config.allow_unaligned
        )

    # -- feeding the servicers --------------------------------------------------------------

    def apply(self, view: KubeletView | None) -> None:
        """Advertise the device lists ``view`` calls for, on every servicer (on the
        event loop: after a rediscovery, for the new servicers)."""
        self.spanning.read(view)
        self._publish(view, self._plan(view, self.catalog.resources))

    async def apply_off_loop(self, view: KubeletView | None, read_at: float | None = None) -> None:
        """:meth:`apply`, its work (linear in the containers, for every resource) done
        in a worker thread; only the new lists are handed to the servicers on the loop.
        ``read_at``: ``time.monotonic()`` when the read that gave ``view`` started."""
        resources = self.catalog.resources
        self.spanning.read(view, read_at)
        allocations = self.spanning.allocations
        planned = await asyncio.to_thread(self._plan, view, resources)
        if self.catalog.resources is not resources or self.spanning.allocations != allocations:
            planned = self._plan(view, self.catalog.resources)  # rediscovered, or allocated
        self._publish(view, planned)

    def allocated(self, resource: str, ids: frozenset[str]) -> None:
        """Allocate answered ``ids`` of ``resource``: read soon (:data:`ALLOCATE_POLL_DELAY`)
        and, when a resource spans NUMA nodes, count them at once (its exposed node
        switches before that read)."""
        self.schedule.request(ALLOCATE_POLL_DELAY)
        if not self._applied or not any(r.spans for r in self.catalog.resources.values()):
            return
        self.spanning.allocated(resource, ids)
        self._publish(self.view, self._plan(self.view, self.catalog.resources))

    def _plan(self, view: KubeletView | None, resources: Mapping[str, Resource]) -> Planned:
        spans = self.spanning
        return plan(self.config, self.catalog, view, resources, spans.previous(), spans.allocations)

    def _publish(self, view: KubeletView | None, planned: Planned) -> None:
        self.view = view
        self._applied = True
        self.spanning.note(planned.exposures)
        for name, (devices, foreign) in planned.lists.items():
            servicer = self.catalog.servicers[name]
            self._warn_foreign(name, foreign)
            if devices != servicer.devices:
                healthy = sum(1 for device in devices if device.health == HEALTHY)
                log.info(
                    "device list changed", resource=name, devices=len(devices), healthy=healthy
                )
                servicer.set_devices(devices)
            self.recorder.devices(name, servicer.devices)
        self.recorder.capacity(planned.capacities, planned.memory, planned.assigned_memory)

    def _warn_foreign(self, resource: str, ids: set[str]) -> None:
        """One warning per held id of ``resource`` this plugin never advertises (they
        count for nothing), for the first :data:`MAX_FOREIGN_WARNED` such ids."""
        for device_id in sorted(ids):
            key = (resource, device_id)
            if key in self._foreign_warned or len(self._foreign_warned) >= MAX_FOREIGN_WARNED:
                continue
            self._foreign_warned.add(key)
            log.warning(
                "the kubelet lists a device id this plugin never advertises; ignoring it",
                resource=resource,
                device_id=device_id[:80],
            )

    def reapply(self) -> None:
        """After a rediscovery: the new servicers get the last answer's device lists."""
        if self._applied:
            self.apply(self.view)

    # -- reading ----------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """One read, applied when its answer differs from the last one. With a
        ``schedule.period()`` of :data:`KEEP_CONNECTION_BELOW` seconds or more, the connection
        is closed after it (the answers kept)."""
        try:
            await self._read()
        finally:
            if self.schedule.period() >= KEEP_CONNECTION_BELOW:
                await self.client.disconnect()

    async def read_before_registering(self) -> None:
        """The read that gives the first ListAndWatch answers their live counts; its
        connection is closed after it, whatever the period (see
        :data:`KEEP_CONNECTION_BELOW`: not kept across the registrations)."""
        try:
            await self._read()
        finally:
            await self.client.disconnect()

    async def _read(self) -> None:
        timeout = min(self.config.pod_resources_interval, POLL_TIMEOUT)
        self._polls += 1
        allocatable = self.schedule.take_allocatable() or self._polls % ALLOCATABLE_EVERY == 0
        started = time.monotonic()
        try:
            view: KubeletView | None = await self.client.view(timeout, allocatable=allocatable)
        except PodResourcesError as exc:
            self._unreachable(exc)
            if self._read_at is not None:
                return  # an outage after an answer: the last answer holds
            view = None
        else:
            if self._reachable is False:
                log.info("the kubelet's pod resources API can be read again")
            self._reachable = True
            self._read_at = time.time()
            self.recorder.pod_resources(True, self._read_at)
        if (
            self._applied
            and not self.spanning.allocations
            and (view is self.view or await asyncio.to_thread(operator.eq, view, self.view))
        ):
            # Nothing changed since the last read: the usual case, kept cheap. An equal
            # answer in a new object (the kubelet lists from Go maps, in no fixed order)
            # is kept, so that the client's next unchanged answer is told by identity.
            self.view = view
            return
        was_cpus, was_memory = self.unaligned(), self.memory_unaligned()
        await self.apply_off_loop(view, started)
        if self.unaligned() and not was_cpus:
            warn_unaligned(self._resources(memory=False))
        memory = self._resources(memory=True)
        if memory and self.memory_unaligned() and not was_memory:
            warn_memory(memory)

    def _unreachable(self, exc: PodResourcesError) -> None:
        if self._reachable is not False:
            if self._read_at is None:
                what = (
                    "counting each NUMA node's usable CPUs minus --reserved-cpus and "
                    "skipping the CPU manager check until it can"
                )
                if self._resources(memory=True):
                    what = what.replace(
                        "and skipping the CPU manager check",
                        "and its memory per sysfs minus --reserved-memory, and skipping "
                        "the CPU and Memory Manager checks",
                    )
            else:
                what = "keeping the counts of its last answer until it can"
            log.warning(
                f"the kubelet's pod resources API cannot be read; {what}",
                socket=str(exc.socket),
                code=exc.code.name,
                details=exc.details[:200],
            )
        self._reachable = False
        self.recorder.pod_resources(False, self._read_at)

    async def run(self) -> None:
        """Read whenever :attr:`schedule` says; until cancelled."""
        while True:
            await self.schedule.wait()
            try:
                await self.poll_once()
            except Exception:
                log.exception("reading the pod resources API failed unexpectedly")

    async def close(self) -> None:
        """Cancel the pending timers and close the connection."""
        self.schedule.cancel()
        await self.client.close()


def warn_memory(resources: list[str]) -> None:
    """Say why every device of the memory ``resources`` is Unhealthy and what to set."""
    log.warning(
        "the kubelet's Memory Manager is not Static (its pod resources API lists "
        "no allocatable memory): memory cannot be aligned, so every memory device "
        "is reported Unhealthy. Set memoryManagerPolicy: Static "
        "(--memory-manager-policy=Static) with --reserved-memory (e.g. "
        "0:memory=1Gi), or pass --allow-unaligned",
        resources=resources,
    )


def warn_unaligned(resources: list[str]) -> None:
    """Say why every device of ``resources`` is Unhealthy and what to set."""
    log.warning(
        "the kubelet's CPU manager is not static (its pod resources API lists no "
        "allocatable CPUs): nothing can be aligned, so every device is reported "
        "Unhealthy. Set cpuManagerPolicy: static (--cpu-manager-policy=static) and "
        "topologyManagerPolicy: single-numa-node, or pass --allow-unaligned",
        resources=resources,
    )
