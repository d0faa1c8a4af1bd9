"""The plugin lifecycle: wires the parts and decides what to serve again, and when.

Data flows one way: sysfs -> topology -> devices (:mod:`..advertised.discovery`) ->
servicers (:mod:`..serving.catalog`) -> registration (:mod:`..serving.endpoint`). The
watcher, the signals and the lock check only wake the loop
(:mod:`numa_device_plugin.ops.wakeups`, :mod:`.watches`); the capacity poller
(:mod:`..counts.poller`) only feeds the servicers; the lock keeper (:mod:`..serving.lock`)
says whether serving is allowed. :class:`PluginManager` runs the single restart
loop, and on each wake decides from the state it finds, not from the events
(:mod:`.verdicts`, pure):

- A new ``kubelet.sock`` is a new kubelet: every resource is served again and
  registered again (its old registrations are gone with the old kubelet).
- A resource whose socket was deleted, or whose ListAndWatch stream the kubelet
  closed, is stopped, served again and registered again. The old server is
  stopped (and its streams ended) *before* the new registration.
- The loop never waits for a Register call (each endpoint registers in its own
  task): a new kubelet, a deleted socket or a lost stream is acted on at once.
- A server that fails to start is retried with backoff; /readyz says why meanwhile.
- Without the instance lock nothing is served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import structlog

from numa_device_plugin.kubelet.grpcserver import check_socket_path
from numa_device_plugin.ops.heap import release_free_memory
from numa_device_plugin.ops.limits import FdLimitError, ensure_fds, fds_needed
from numa_device_plugin.ops.wakeups import DEVICES_CHANGED, STREAM_LOST, Wakeups
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover
from numa_device_plugin.plugin.counts.poller import CapacityPoller
from numa_device_plugin.plugin.lifecycle.devicewatch import DeviceWatch, changed
from numa_device_plugin.plugin.lifecycle.restarts import Restarts
from numa_device_plugin.plugin.lifecycle.verdicts import readiness
from numa_device_plugin.plugin.lifecycle.watches import Watches
from numa_device_plugin.plugin.model.recorder import NullRecorder, Recorder
from numa_device_plugin.plugin.model.resources import Resource
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.serving.endpoint import Endpoints
from numa_device_plugin.plugin.serving.lock import LockKeeper
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs

if TYPE_CHECKING:
    from numa_device_plugin.plugin.reports.snapshot import PluginState

log = structlog.get_logger(__name__)


class PluginManager:
    """Serves and registers one device plugin per advertised NUMA node until stopped.

    ``discover_fn`` (default :func:`discover`) is called at start and on every
    reload; tests can pass their own. ``listener_connections``: connections the HTTP
    listeners may hold, counted in the file descriptors needed.
    """

    def __init__(
        self,
        config: Config,
        *,
        discover_fn: Callable[[Config], Discovery] = discover,
        recorder: Recorder | None = None,
        listener_connections: int = 0,
    ) -> None:
        self.config = config
        self.recorder: Recorder = recorder or NullRecorder()
        self._discover_fn = discover_fn
        self._listener_connections = listener_connections
        self.wakeups = Wakeups()
        self.catalog = Catalog(self._make_servicer)
        self.poller = CapacityPoller(config, self.catalog, self.recorder)
        self.endpoints = Endpoints(
            config, self.recorder, on_registered=self._registered, on_change=self.wakeups.announce
        )
        self.lock_keeper = LockKeeper(config.socket_dir, self.wakeups.announce)
        self.started = asyncio.Event()
        self.restarts = Restarts(config, self.catalog, self.endpoints, self.lock_keeper)
        self._trim_pending = False
        current, woken = (lambda: self.catalog.discovery), partial(self.wake, DEVICES_CHANGED)
        acted = partial(self.wakeups.wait_until, self.acted, None)
        self.device_watch = DeviceWatch(config, discover_fn, current, woken, acted=acted)
        self.watches = Watches(config, self.wake, self.lock_keeper, self.device_watch,
                               self.poller.schedule.pods_changed, acted=acted,
                               stop=self.stop)  # fmt: skip
        self.poller.schedule.signalled = lambda: self.watches.pods_signalled

    # -- what is served, for probes, status and tests -----------------------------------------

    @property
    def resources(self) -> Mapping[str, Resource]:
        return self.catalog.resources

    @property
    def servicers(self) -> Mapping[str, NumaDevicePluginServicer]:
        """One servicer per resource, kept across restarts (its device list is built once)."""
        return self.catalog.servicers

    @property
    def registered(self) -> set[str]:
        """Names registered with the current kubelet whose server still runs."""
        return self.endpoints.registered

    def readiness_problems(self) -> list[str]:
        """Why the plugin is not ready, one line per problem; [] when every advertised
        resource is registered with the kubelet, its ListAndWatch stream is open, the
        device-plugin folder is watched and the devices the first look left out are read
        (the node page lists them)."""
        return readiness(self.lock_keeper.problem, self.restarts.problem, self.servicers,
                         self.registered, self.device_watch.caught_up(),
                         self.watches.watching)  # fmt: skip

    def snapshot(self) -> PluginState:
        """The state now as plain data
        (:func:`numa_device_plugin.plugin.reports.snapshot.take`), for the node page and
        ``/debug/state`` (loop thread; imported at the first call)."""
        from numa_device_plugin.plugin.reports.snapshot import take

        return take(
            self.config, self.catalog, self.registered, self.poller, self.lock_keeper,
            self.readiness_problems(),
        )  # fmt: skip

    def settled(self) -> bool:
        """True when :meth:`acted`, the devices the first look left out are read and the
        device-plugin folder is watched (what tests wait for, not a sleep)."""
        return self.acted() and self.device_watch.caught_up() and self.watches.watching

    def acted(self) -> bool:
        """True when the loop sleeps with nothing left to do: no event unhandled, no
        retry timer, no registration in flight."""
        return (
            self.wakeups.idle
            and not self.wakeups.pending
            and not self.restarts.pending
            and self.endpoints.registrations_done()
        )

    async def wait_settled(self, timeout: float = 10.0) -> None:
        """Wait until :meth:`settled`; raises TimeoutError after ``timeout`` seconds."""
        await self.wakeups.wait_until(self.settled, timeout)

    # -- requests (loop thread only) ----------------------------------------------------------

    def wake(self, reason: str, name: str = "") -> None:
        """Record why the loop should look at the world again, and wake it."""
        self.wakeups.wake(reason, name)

    def stop(self) -> None:
        """Ask :meth:`serve` to stop serving, remove its sockets and return (SIGTERM)."""
        self.wakeups.stop()

    def reload(self) -> None:
        """Ask :meth:`serve` to discover again and re-register every resource (SIGHUP)."""
        self.wakeups.reload()

    # -- wiring -------------------------------------------------------------------------------

    def _make_servicer(self, resource: Resource) -> NumaDevicePluginServicer:
        return NumaDevicePluginServicer(
            resource,
            on_stream_lost=self._stream_lost,
            on_allocate=self.poller.allocated,
            recorder=self.recorder,
        )

    def _stream_lost(self, name: str) -> None:
        self.endpoints.stream_lost(name)
        self.wake(STREAM_LOST, name)

    def _registered(self, name: str) -> None:
        if self.poller.withheld(name):
            self.poller.warn_withheld([name])
        # Before the read: the kubepods watch signals the rest.
        self.watches.ensure_kubepods(self.endpoints.seen_kubelet)
        # A (new) kubelet: its allocatable CPUs may differ from the last one's.
        self.poller.schedule.request(allocatable=True)

    def _set_discovery(self, discovery: Discovery) -> None:
        self.catalog.update(discovery)
        counts = {name: len(r.devices) for name, r in discovery.resources.items()}
        self.recorder.topology(discovery.plans, counts)
        self.recorder.near({entry.resource: entry.nodes for entry in discovery.near})
        self.poller.reapply()

    # -- the loop -----------------------------------------------------------------------------

    async def serve(self) -> None:
        """Startup, main loop, shutdown. Returns after :meth:`stop`.

        Startup: discover, create the device-plugin folder if missing, then take the
        folder's instance lock, waiting as long as another instance holds it. Only then
        are sockets touched. The folder is watched once the loop has first acted
        (:mod:`.watches`).

        Raises :class:`~numa_device_plugin.topology.sysfs.SysfsError` when the first
        discovery fails, :class:`~numa_device_plugin.ops.limits.FdLimitError` when its
        resources cannot get the file descriptors they need,
        :class:`~numa_device_plugin.kubelet.grpcserver.SocketPathError` when a socket path is
        too long, and OSError when the device-plugin folder cannot be created,
        locked, or watched (then after registering). Later failures are logged and
        retried, never raised.
        """
        discovery = await asyncio.to_thread(self.device_watch.first_look, self.config)
        check_serving(self.config, discovery, self._listener_connections)
        self._set_discovery(discovery)
        self.config.socket_dir.mkdir(parents=True, exist_ok=True)
        self.watches.start()
        first = True
        try:
            while await self.lock_keeper.acquire(
                raise_errors=first, stopping=lambda: self.wakeups.stopping, nap=self.wakeups.nap
            ):
                first = False
                if self.lock_keeper.took_over:  # sysfs may have changed while it waited
                    found = await rediscover(self.config, self._discover_fn,
                                             self._listener_connections)  # fmt: skip
                    if found is not None:
                        self._set_discovery(found)
                folder, names = str(self.config.socket_dir), list(self.resources)
                log.info("device plugin started", socket_dir=folder, resources=names)
                self.restarts.pending = set(self.resources)
                self.wakeups.drain()  # events from before (the holder's sockets going): moot
                await self.poller.read_before_registering()  # live counts from the start
                poller = asyncio.create_task(self.poller.run(), name="pod resources")
                self.started.set()
                try:
                    await self._main_loop()
                finally:
                    poller.cancel()
                    await asyncio.gather(poller, return_exceptions=True)
                await self.endpoints.stop(self.endpoints.running, self.config.shutdown_grace)
                if self.wakeups.stopping:
                    break
        finally:
            await self.watches.stop()
            await self.poller.close()
            await self.endpoints.stop(self.endpoints.running, self.config.shutdown_grace)
            self.lock_keeper.release()
            log.info("device plugin stopped")
        if self.watches.error is not None:
            raise self.watches.error

    async def _main_loop(self) -> None:
        """Act, sleep until woken, decide; until stopped or the lock is lost."""
        reasons: list[tuple[str, str]] | None = None  # why it woke; None at first
        while not self.wakeups.stopping and not self.lock_keeper.lost:
            try:
                if reasons is not None:
                    self.restarts.evaluate(reasons)
                if self.wakeups.take_reload():
                    found = await rediscover(
                        self.config, self._discover_fn, self._listener_connections
                    )
                    if found is not None:  # serve everything again
                        self.restarts.pending |= set(self.resources) | set(found.resources)
                        self._set_discovery(found)
                if (found := self.device_watch.take()) is not None:  # (a reload drops it)
                    self.restarts.pending |= (names := changed(self.resources, found.resources))
                    caught_up = self.device_watch.caught_up()  # else: what was left out
                    self._set_discovery(found)
                    if caught_up and names:  # else the mount points alone, or nothing
                        log.info("devices changed; serving again what changed",
                                 resources=sorted(names))  # fmt: skip
                if self.restarts.pending:
                    names, self.restarts.pending = self.restarts.pending, set()
                    await self.restarts.restart(names)
                    self._trim_pending = True
            except Exception:
                # Never crash on a surprise: log it, serve everything afresh after a backoff.
                log.exception("unexpected error in the plugin loop; starting over")
                self.restarts.pending |= set(self.resources) | set(self.endpoints.running)
            if self.wakeups.stopping or self.lock_keeper.lost:
                break
            delay = self.restarts.retry_delay()
            if self._trim_pending and not self.wakeups.woken_now():
                # Settled after serving again: give the burst's memory back.
                self._trim_pending = False
                release_free_memory()
            self.wakeups.set_idle(delay is None)
            await self.wakeups.sleep(delay, self.config.debounce)
            self.wakeups.set_idle(False)
            reasons = self.wakeups.drain()


async def rediscover(
    config: Config, discover_fn: Callable[[Config], Discovery], listener_connections: int
) -> Discovery | None:
    """SIGHUP's look: ``discover_fn(config)`` off the event loop (sysfs reads can be
    slow, and the loop must keep serving), checked by :func:`check_serving`; None when
    it fails (logged: the current resources are kept)."""
    try:
        discovery = await asyncio.to_thread(discover_fn, config)
        check_serving(config, discovery, listener_connections)
    except (sysfs.SysfsError, ValueError, FdLimitError) as exc:
        log.error("rediscovery failed; keeping the current resources", error=str(exc))
        return None
    return discovery


def servable(config: Config, listener_connections: int) -> None:
    """What :meth:`PluginManager.serve` checks at start, without serving: its first look
    (the devices left out, as the manager's own) and :func:`check_serving` for
    ``config``. Blocking. Raises what they raise:
    :class:`~numa_device_plugin.topology.sysfs.SysfsError`, ``MemoryUnitError`` (a ValueError),
    :class:`~numa_device_plugin.kubelet.grpcserver.SocketPathError`,
    :class:`~numa_device_plugin.ops.limits.FdLimitError`."""
    check_serving(config, discover(config, devices=False), listener_connections)


def check_serving(config: Config, discovery: Discovery, listener_connections: int) -> None:
    """Raise SocketPathError for a socket path too long, FdLimitError when the
    resources cannot get the file descriptors they need (the soft limit is raised as
    far as it must; ``listener_connections``: what the HTTP listeners may hold)."""
    check_socket_path(config.kubelet_socket)
    for resource in discovery.resources.values():
        check_socket_path(config.socket_dir / resource.socket_name)
    count = len(discovery.resources)
    soft, hard = ensure_fds(fds_needed(count, listener_connections), count)
    log.debug("file descriptor limit", soft=soft, hard=hard, resources=count)
