"""The plugin lifecycle: discover, serve one device plugin per resource, register, recover.

Data flows one way: sysfs -> topology -> resources -> servicers -> registration.
:class:`PluginManager` runs a single restart loop (``serve``). It sleeps until
something wakes it: the watcher (``kubelet.sock`` created, a socket deleted), a
servicer whose ListAndWatch stream the kubelet dropped, SIGHUP (``reload``) or
SIGTERM (``stop``), or a registration retry timer. Each wake first gathers the
burst of events that usually comes with it (``Config.debounce``), then acts on
the state it finds, not on the events one by one, so a restart storm ends in
exactly one server and one registration per resource.

Rules, from the kubelet's device manager:

- A new ``kubelet.sock`` is a new kubelet: every resource is served again and
  registered again (its old registrations are gone with the old kubelet).
- A resource whose socket was deleted, or whose ListAndWatch stream the kubelet
  closed, is stopped, served again and registered again. The old server is
  stopped (and its streams ended) *before* the new registration: an old stream
  closing after a new registration makes the kubelet drop the new endpoint.
- Each served resource has its own registration task, retried with jittered
  exponential backoff until the kubelet accepts it. The loop never waits for a
  Register call: a new kubelet, a deleted socket or a lost stream is acted on at
  once, and stopping a resource cancels its registration in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from numa_device_plugin import sysfs
from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.capacity import KubeletView, NodeCapacity, live_devices, node_capacity
from numa_device_plugin.config import Config
from numa_device_plugin.devices import HEALTHY, Resource, build_resources
from numa_device_plugin.limits import FdLimitError, ensure_fds, fds_needed
from numa_device_plugin.lock import InstanceLock
from numa_device_plugin.logs import LogLimiter
from numa_device_plugin.memory import release_free_memory
from numa_device_plugin.podresources import PodResourcesClient, PodResourcesError
from numa_device_plugin.recorder import NullRecorder, Recorder
from numa_device_plugin.registration import Backoff, RegistrationError, register, register_request
from numa_device_plugin.server import UnixSocketServer, check_socket_path, file_identity
from numa_device_plugin.servicer import NumaDevicePluginServicer
from numa_device_plugin.topology import (
    NodePlan,
    plan_nodes,
    read_topology,
    topology_warnings,
)
from numa_device_plugin.watcher import SocketDirWatcher

log = structlog.get_logger(__name__)


# Seconds between attempts to take the instance lock while another instance holds it.
LOCK_POLL = 0.2
# Seconds between checks that the lock file is still the one this instance locked (its
# subfolder is not watched: the file may be deleted, or replaced, without an event).
LOCK_CHECK = 2.0
# Seconds after an Allocate to read the pod resources API again: the kubelet's CPU
# manager assigns the container's CPUs right after the device manager's Allocate.
ALLOCATE_POLL_DELAY = 0.5
# Seconds one pod resources call may take at most.
POLL_TIMEOUT = 2.0
# GetAllocatableResources (the kubelet's allocatable CPUs, its CPU manager policy)
# changes only when the kubelet restarts, and every registration reads it; between
# registrations it is read again every this many polls, List at every poll.
ALLOCATABLE_EVERY = 12

STREAM_LOST = "ListAndWatch stream lost"
RELOAD = "reload requested"
STOP = "stop requested"
LOCK_CHANGED = "lock file changed"

PLUGIN_OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


@dataclass(frozen=True)
class Discovery:
    """What one look at sysfs yields: the per-node plan and the resources to serve."""

    plans: tuple[NodePlan, ...]
    resources: Mapping[str, Resource]


def discover(config: Config) -> Discovery:
    """Read the topology under ``config.sysfs_root`` and build the resources; log the plan.

    Raises :class:`~numa_device_plugin.sysfs.SysfsError` (or its subclass
    ``SysfsFormatError``, naming the file and content) when sysfs cannot be read.
    """
    topology = read_topology(config.sysfs_root)
    plans = plan_nodes(topology, include_cpuless=config.include_cpuless_nodes)
    resources = build_resources(
        plans,
        prefix=config.resource_prefix,
        capacity=config.capacity,
        reserved_cpus=config.reserved_cpus,
    )
    for plan in plans:
        node = plan.node
        fields = {
            "node": node.id,
            "cpus": sysfs.format_cpulist(node.cpus),
            "memory_bytes": node.memory_bytes,
        }
        if plan.reason is not None:
            fields["reason"] = plan.reason
        if plan.advertised:
            log.info("advertising NUMA node", **fields)
        else:
            log.warning("not advertising NUMA node", **fields)
    for warning in (*topology.warnings, *topology_warnings(plans)):
        log.warning(warning)
    if not resources:
        log.error("no NUMA node can be advertised; serving nothing until the next reload")
    return Discovery(plans=plans, resources=resources)


class _Endpoint:
    """One server exposing a resource's servicer on its socket, the identity of the
    ``kubelet.sock`` it was started for, and its registration task."""

    def __init__(
        self,
        config: Config,
        resource: Resource,
        servicer: NumaDevicePluginServicer,
        kubelet: tuple[int, int, int],
    ) -> None:
        self.resource = resource
        self.kubelet = kubelet
        self.servicer = servicer
        self.server = UnixSocketServer(
            config.socket_dir / resource.socket_name,
            lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server),
        )

        self.registration: asyncio.Task[None] | None = None

    async def stop(self, grace: float) -> None:
        """Cancel the registration in flight, end the streams, stop the server."""
        if self.registration is not None:
            self.registration.cancel()
            await asyncio.gather(self.registration, return_exceptions=True)
        self.servicer.close()
        await self.server.stop(grace)


class PluginManager:
    """Serves and registers one device plugin per advertised NUMA node until stopped.

    ``discover_fn`` (default :func:`discover`) is called at start and on every
    reload; tests can pass their own. Public state for probes and tests:
    ``resources`` (name -> Resource), ``registered`` (names registered with the
    current kubelet whose server still runs) and ``servicers``.
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
        self._listener_connections = listener_connections
        self.recorder: Recorder = recorder or NullRecorder()
        self._discover_fn = discover_fn
        self.discovery: Discovery | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._servicers: dict[str, NumaDevicePluginServicer] = {}
        self.registered: set[str] = set()
        self._reasons: list[tuple[str, str]] = []
        self._woken: asyncio.Event | None = None
        self._stopping = False
        self._reload = False
        self._to_restart: set[str] = set()
        self._backoff = Backoff()
        self._trim_pending = False
        self._seen_kubelet: tuple[int, int, int] | None = None
        self.lock = InstanceLock(config.socket_dir)
        self._lock_problem: str | None = None
        self._serve_problem: str | None = None
        # One line per failure kind per longest backoff, for every resource together.
        self._log_limiter = LogLimiter(Backoff().maximum)
        self._lock_lost = False
        self.started = asyncio.Event()
        self._idle = False
        self._state_changed = asyncio.Event()
        self.view: KubeletView | None = None
        self._polled = False
        self._api_reachable: bool | None = None
        self._poll_now: asyncio.Event | None = None
        self._poll_timer: asyncio.TimerHandle | None = None
        self._poll_allocatable = False
        self._polls = 0
        # time.time() of the last good read of the pod resources API; None: never since start.
        self._read_at: float | None = None

    # -- public API ------------------------------------------------------------------------

    @property
    def resources(self) -> Mapping[str, Resource]:
        return self.discovery.resources if self.discovery else {}

    @property
    def servicers(self) -> Mapping[str, NumaDevicePluginServicer]:
        """One servicer per resource, kept across restarts (its device list is built once)."""
        return self._servicers

    def _set_discovery(self, discovery: Discovery) -> None:
        kept = {
            name: servicer
            for name, servicer in self._servicers.items()
            if self.resources.get(name) == discovery.resources.get(name)
        }
        self.discovery = discovery
        self._servicers = {
            name: kept.get(name)
            or NumaDevicePluginServicer(
                resource,
                on_stream_lost=self._stream_lost,
                on_allocate=self._allocated,
                recorder=self.recorder,
            )
            for name, resource in discovery.resources.items()
        }
        self.recorder.topology(
            discovery.plans, {name: len(r.devices) for name, r in discovery.resources.items()}
        )
        if self._polled:
            self._apply_view(self.view)

    # -- live capacity (the pod resources API) ----------------------------------------------

    def _node_cpus(self, node_id: int) -> frozenset[int]:
        assert self.discovery is not None
        return next(p.node.cpus for p in self.discovery.plans if p.node.id == node_id)

    def capacities(self) -> list[NodeCapacity]:
        """Per advertised NUMA node, its CPUs and devices as the kubelet last showed them."""
        return [
            node_capacity(
                name,
                resource.node_id,
                self._node_cpus(resource.node_id),
                self._servicers[name].devices,
                self.view,
                self.config.reserved_cpus,
            )
            for name, resource in self.resources.items()
        ]

    def _apply_view(self, view: KubeletView | None) -> None:
        """Advertise the device lists ``view`` calls for (ListAndWatch sends changes)."""
        self.view = view
        self._polled = True
        for name, resource in self.resources.items():
            servicer = self._servicers[name]
            devices = live_devices(
                self.config.capacity,
                resource.node_id,
                self._node_cpus(resource.node_id),
                name,
                resource.devices,
                view,
                reserved_cpus=self.config.reserved_cpus,
                allow_unaligned=self.config.allow_unaligned,
            )
            if devices != servicer.devices:
                healthy = sum(1 for device in devices if device.health == HEALTHY)
                log.info(
                    "device list changed",
                    resource=name,
                    devices=len(devices),
                    healthy=healthy,
                )
                servicer.set_devices(devices)
            self.recorder.devices(name, servicer.devices)
        self.recorder.capacity(self.capacities(), view.memory if view is not None else {})

    def unaligned(self) -> bool:
        """True when the kubelet's CPU manager is not static and devices are withheld."""
        return (
            self.view is not None
            and not self.view.cpu_manager_static
            and not self.config.allow_unaligned
        )

    def _warn_unaligned(self, resources: list[str]) -> None:
        log.warning(
            "the kubelet's CPU manager is not static (its pod resources API lists no "
            "allocatable CPUs): nothing can be aligned, so every device is reported "
            "Unhealthy. Set cpuManagerPolicy: static (--cpu-manager-policy=static) and "
            "topologyManagerPolicy: single-numa-node, or pass --allow-unaligned",
            resources=resources,
        )

    def request_poll(self, delay: float = 0.0, *, allocatable: bool = False) -> None:
        """Read the pod resources API ``delay`` seconds from now (loop thread only);
        ``allocatable``: read ``GetAllocatableResources`` too, not only ``List``."""
        if self._poll_now is None:
            return
        self._poll_allocatable |= allocatable
        if delay <= 0:
            self._poll_now.set()
            return
        if self._poll_timer is None or self._poll_timer.cancelled():
            loop = asyncio.get_running_loop()
            self._poll_timer = loop.call_later(delay, self._poll_timer_fired)

    def _poll_timer_fired(self) -> None:
        self._poll_timer = None
        if self._poll_now is not None:
            self._poll_now.set()

    def _allocated(self, name: str) -> None:
        # The kubelet assigns the container's CPUs right after Allocate (device manager
        # first, then CPU manager): look again a moment later.
        self.request_poll(ALLOCATE_POLL_DELAY)

    async def _poll_once(self, client: PodResourcesClient) -> None:
        timeout = min(self.config.pod_resources_interval, POLL_TIMEOUT)
        self._polls += 1
        allocatable = self._poll_allocatable or self._polls % ALLOCATABLE_EVERY == 0
        self._poll_allocatable = False
        try:
            view: KubeletView | None = await client.view(timeout, allocatable=allocatable)
        except PodResourcesError as exc:
            if self._api_reachable is not False:
                if self._read_at is None:
                    what = (
                        "counting each NUMA node's usable CPUs minus --reserved-cpus and "
                        "skipping the CPU manager check until it can"
                    )
                else:
                    what = "keeping the counts of its last answer until it can"
                log.warning(
                    f"the kubelet's pod resources API cannot be read; {what}",
                    socket=str(exc.socket),
                    code=exc.code.name,
                    details=exc.details[:200],
                )
            self._api_reachable = False
            self.recorder.pod_resources(False, self._read_at)
            if self._read_at is not None:
                # An outage (a kubelet restart, most often) after the API has answered:
                # the last answer is the truth until the next one. Sysfs arithmetic
                # would count every busy exclusive CPU as free.
                return
            view = None
        else:
            if self._api_reachable is False:
                log.info("the kubelet's pod resources API can be read again")
            self._api_reachable = True
            self._read_at = time.time()
            self.recorder.pod_resources(True, self._read_at)
        if self._polled and view == self.view:
            return  # nothing changed since the last read: the usual case, kept cheap
        was_unaligned = self.unaligned()
        self._apply_view(view)
        if self.unaligned() and not was_unaligned:
            self._warn_unaligned(sorted(self.resources))

    async def _poll_loop(self, client: PodResourcesClient) -> None:
        """Read the API every ``pod_resources_interval`` seconds, or when asked sooner."""
        assert self._poll_now is not None
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
            # cancellation that arrives as the event is set, and the poller would
            # outlive the plugin's shutdown by an interval.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.pod_resources_interval):
                    await self._poll_now.wait()
            self._poll_now.clear()
            try:
                await self._poll_once(client)
            except Exception:
                log.exception("reading the pod resources API failed unexpectedly")

    def readiness_problems(self) -> list[str]:
        """Why the plugin is not ready, one line per resource; [] when every advertised
        resource is registered with the kubelet and its ListAndWatch stream is open."""
        if self._lock_problem is not None:
            return [self._lock_problem]
        if not self.resources:
            return ["no NUMA node is advertised"]
        problems = [] if self._serve_problem is None else [self._serve_problem]
        for name in self.resources:
            if name not in self.registered:
                problems.append(f"{name}: not registered with the kubelet")
            elif not self._servicers[name].kubelet_stream_open:
                problems.append(f"{name}: the kubelet has no ListAndWatch stream open")
        return problems

    def wake(self, reason: str, name: str = "") -> None:
        """Record why the loop should look at the world again, and wake it (loop thread only)."""
        self._reasons.append((reason, name))
        self._announce()
        if self._woken is not None:
            self._woken.set()

    def stop(self) -> None:
        """Ask :meth:`serve` to stop serving, remove its sockets and return (SIGTERM)."""
        self._stopping = True
        self.wake(STOP)

    def reload(self) -> None:
        """Ask :meth:`serve` to discover again and re-register every resource (SIGHUP)."""
        self._reload = True
        self.wake(RELOAD)

    async def serve(self) -> None:
        """Startup, main loop, shutdown. Returns after :meth:`stop`.

        Startup: discover, create the device-plugin folder if missing, watch it,
        then take the folder's instance lock (:class:`InstanceLock`), waiting as
        long as another instance holds it. Only then are sockets touched.

        Raises :class:`~numa_device_plugin.sysfs.SysfsError` when the first
        discovery fails, :class:`~numa_device_plugin.limits.FdLimitError` when its
        resources cannot get the file descriptors they need,
        :class:`~numa_device_plugin.server.SocketPathError` when
        a socket path is too long, and OSError when the device-plugin folder
        cannot be created, watched or locked. Later failures are logged and
        retried, never raised.
        """
        self._woken = asyncio.Event()
        if self._reasons:
            self._woken.set()
        discovery = await asyncio.to_thread(self._discover_fn, self.config)
        self._check_fds(discovery)
        self._set_discovery(discovery)
        self._check_socket_paths()
        self.config.socket_dir.mkdir(parents=True, exist_ok=True)
        watcher = SocketDirWatcher(self.config.socket_dir, self.wake, asyncio.get_running_loop())
        watcher.start()
        client = PodResourcesClient(self.config.pod_resources_path)
        self._poll_now = asyncio.Event()
        lock_check = asyncio.create_task(self._check_lock(), name="lock check")
        first = True
        try:
            while not self._stopping:
                if not await self._acquire_lock(raise_errors=first):
                    break
                first = False
                log.info(
                    "device plugin started",
                    socket_dir=str(self.config.socket_dir),
                    resources=list(self.resources),
                )
                self._to_restart = set(self.resources)
                self._lock_lost = False
                await self._poll_once(client)  # advertise live counts from the start
                poller = asyncio.create_task(self._poll_loop(client), name="pod resources")
                self.started.set()
                try:
                    await self._main_loop()
                finally:
                    poller.cancel()
                    await asyncio.gather(poller, return_exceptions=True)
                if self._lock_lost:
                    await self._stop_endpoints(set(self._endpoints), self.config.shutdown_grace)
        finally:
            lock_check.cancel()
            await asyncio.gather(lock_check, return_exceptions=True)
            watcher.stop()
            if self._poll_timer is not None:
                self._poll_timer.cancel()
            await client.close()
            await self._stop_endpoints(set(self._endpoints), self.config.shutdown_grace)
            self.lock.release()
            log.info("device plugin stopped")

    def _check_fds(self, discovery: Discovery) -> None:
        """Raise the soft RLIMIT_NOFILE as far as ``discovery``'s resources need;
        raises :class:`~numa_device_plugin.limits.FdLimitError` when they cannot fit."""
        count = len(discovery.resources)
        soft, hard = ensure_fds(fds_needed(count, self._listener_connections), count)
        log.debug("file descriptor limit", soft=soft, hard=hard, resources=count)

    def _check_socket_paths(self) -> None:
        """Raise SocketPathError when kubelet.sock's or a resource's socket path is too long."""
        check_socket_path(self.config.kubelet_socket)
        for resource in self.resources.values():
            check_socket_path(self.config.socket_dir / resource.socket_name)

    async def _acquire_lock(self, *, raise_errors: bool) -> bool:
        """Take the instance lock, waiting (polling every LOCK_POLL seconds) while another
        instance holds it, or, unless ``raise_errors`` (at start, where OSError is
        raised), while the lock file cannot be locked. Meanwhile nothing is served and
        ``/readyz`` says why. False when asked to stop meanwhile."""
        assert self._woken is not None
        announced: str | None = None
        while not self._stopping:
            error: OSError | None = None
            try:
                acquired = self.lock.try_acquire()
            except OSError as exc:
                if raise_errors:
                    raise
                acquired, error = False, exc
            if acquired:
                if announced:
                    log.info("took over the instance lock", lock=str(self.lock.path))
                self._lock_problem = None
                return True
            if error is not None:
                kind = "error"
                problem = f"cannot lock {self.lock.path}: {error}; serving nothing until it can"
                if announced != kind:
                    log.error(
                        "cannot lock the device-plugin folder; serving nothing until it can",
                        lock=str(self.lock.path),
                        error=str(error),
                    )
            else:
                kind = "holder"
                holder = self.lock.holder()
                problem = (
                    f"another instance ({holder}) holds the lock {self.lock.path}; "
                    "waiting for it to exit"
                )
                if announced != kind:
                    log.warning(
                        "another instance serves this device-plugin folder; waiting for it to exit",
                        holder=holder,
                        lock=str(self.lock.path),
                    )
            announced = kind
            if problem != self._lock_problem:
                self._lock_problem = problem
                self._announce()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOCK_POLL):
                    await self._woken.wait()
            if not self._stopping:
                self._woken.clear()
        return False

    # -- the loop --------------------------------------------------------------------------

    async def _main_loop(self) -> None:
        while not self._stopping and not self._lock_lost:
            try:
                await self._step()
            except Exception:
                # Never crash on a surprise: log it, serve everything afresh after a backoff.
                log.exception("unexpected error in the plugin loop; starting over")
                self._to_restart |= set(self.resources) | set(self._endpoints)
            if self._stopping or self._lock_lost:
                break
            delay: float | None = None
            if self._to_restart:  # a server failed to start: try again later
                delay = self._backoff.next_delay()
            else:
                self._backoff.reset()
            if self._trim_pending and not self._woken_now():
                # Settled after serving again: give the burst's memory back.
                self._trim_pending = False
                release_free_memory()
            self._set_idle(delay is None)
            await self._sleep(delay)
            self._set_idle(False)
            self._evaluate(self._drain())

    async def _step(self) -> None:
        """One pass: rediscover if asked, then serve again what needs it."""
        if self._reload:
            self._reload = False
            await self._rediscover()
        if self._to_restart:
            names, self._to_restart = self._to_restart, set()
            await self._restart(names)
            self._trim_pending = True

    async def _sleep(self, delay: float | None) -> None:
        assert self._woken is not None
        try:
            async with asyncio.timeout(delay):
                await self._woken.wait()
        except TimeoutError:
            return
        if self.config.debounce and not self._stopping:
            await asyncio.sleep(self.config.debounce)

    def _set_idle(self, idle: bool) -> None:
        self._idle = idle
        self._announce()

    def _announce(self) -> None:
        changed, self._state_changed = self._state_changed, asyncio.Event()
        changed.set()

    def settled(self) -> bool:
        """True when the loop sleeps with nothing left to do: no event unhandled, no
        retry timer, no registration in flight (what tests wait for instead of a
        fixed sleep)."""
        return (
            self._idle
            and not self._reasons
            and not self._reload
            and not self._to_restart
            and all(
                endpoint.registration is None or endpoint.registration.done()
                for endpoint in self._endpoints.values()
            )
        )

    async def wait_settled(self, timeout: float = 10.0) -> None:
        """Wait until :meth:`settled`; raises TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not self.settled():
                await self._state_changed.wait()

    def _woken_now(self) -> bool:
        return self._woken is not None and self._woken.is_set()

    def _drain(self) -> list[tuple[str, str]]:
        assert self._woken is not None
        self._woken.clear()
        reasons, self._reasons = self._reasons, []
        return reasons

    def _evaluate(self, reasons: list[tuple[str, str]]) -> None:
        """Decide which resources to serve (again), from the state found now.

        Events only say *when* to look. Per resource: not served while a kubelet
        is there; served for another kubelet than the ``kubelet.sock`` there now;
        its socket file gone or replaced; or its ListAndWatch stream lost.
        """
        if not self._keep_lock():
            return
        kubelet = file_identity(self.config.kubelet_socket)
        self._note_kubelet(kubelet)
        lost = {name for reason, name in reasons if reason == STREAM_LOST}
        for name in self.resources:
            endpoint = self._endpoints.get(name)
            if endpoint is None:
                why = "not served" if kubelet is not None else None
            elif kubelet is not None and endpoint.kubelet != kubelet:
                why = "a new kubelet.sock: the kubelet restarted"
            elif not endpoint.server.is_intact():
                why = "its socket is gone"
            elif name in lost:
                why = "the kubelet closed its ListAndWatch stream"
            else:
                why = None
            if why is not None and name not in self._to_restart:
                log.info("serving and registering again", resource=name, reason=why)
                self._to_restart.add(name)
        if self._to_restart:
            log.debug("restart planned", resources=sorted(self._to_restart), reasons=reasons)

    def _keep_lock(self) -> bool:
        """After the folder (and the lock file with it) was deleted and created again,
        lock the new file; False, and the loop ends, when another instance got it first."""
        if self.lock.intact() or not self.config.socket_dir.is_dir():
            return True  # still ours, or no folder to serve in yet
        try:
            if self.lock.try_acquire():
                log.warning(
                    "the lock file was replaced; locked the new one", lock=str(self.lock.path)
                )
                return True
        except OSError as exc:
            # Serving without the lock could fight a newcomer: stand down until it can.
            log.error(
                "cannot lock the device-plugin folder; standing down",
                lock=str(self.lock.path),
                error=str(exc),
            )
            self._lock_problem = f"cannot lock {self.lock.path}: {exc}"
        else:
            log.warning("another instance took the lock; standing down", holder=self.lock.holder())
            self._lock_problem = f"another instance ({self.lock.holder()}) holds the lock"
        self._lock_lost = True
        return False

    async def _check_lock(self) -> None:
        """Every LOCK_CHECK seconds, wake the loop when the lock file is no longer the
        one this instance locked (deleted, replaced, or a folder put in its place)."""
        while True:
            await asyncio.sleep(LOCK_CHECK)
            if self.lock.held and not self.lock.intact():
                self.wake(LOCK_CHANGED)

    def _note_kubelet(self, kubelet: tuple[int, int, int] | None) -> None:
        """Count a kubelet restart (once) when a kubelet.sock other than the last
        one seen appears (the first one seen is not a restart)."""
        if kubelet is None:
            return
        if self._seen_kubelet is not None and kubelet != self._seen_kubelet:
            self.recorder.kubelet_restart()
        self._seen_kubelet = kubelet

    async def _rediscover(self) -> None:
        # Off the event loop: sysfs reads can be slow, and the loop must keep serving.
        try:
            discovery = await asyncio.to_thread(self._discover_fn, self.config)
            for resource in discovery.resources.values():
                check_socket_path(self.config.socket_dir / resource.socket_name)
            self._check_fds(discovery)
        except (sysfs.SysfsError, ValueError, FdLimitError) as exc:
            log.error("rediscovery failed; keeping the current resources", error=str(exc))
            return
        old = set(self.resources)
        self._set_discovery(discovery)
        self._to_restart |= old | set(self.resources)

    # -- actions ---------------------------------------------------------------------------

    async def _restart(self, names: set[str]) -> None:
        """Stop the named endpoints, then, if a kubelet is there, serve them again.

        Streams are ended first, so the grace period only waits for in-flight
        Allocate calls and costs nothing when there are none.
        """
        await self._stop_endpoints(names & set(self._endpoints), self.config.shutdown_grace)
        kubelet = file_identity(self.config.kubelet_socket)
        self._note_kubelet(kubelet)
        if kubelet is None:
            log.info("waiting for the kubelet", kubelet_socket=str(self.config.kubelet_socket))
            return
        to_start = sorted(names & set(self.resources))
        results = await asyncio.gather(
            *(self._start_endpoint(self.resources[name], kubelet) for name in to_start),
            return_exceptions=True,
        )
        failed = {
            name: str(result)
            for name, result in zip(to_start, results, strict=True)
            if isinstance(result, BaseException)
        }
        self._to_restart |= set(failed)
        self._serve_problem = None
        if failed:
            # One line per pass, however many resources failed (out of file descriptors,
            # 1,024 resources once wrote 560 lines a second); /readyz says it too.
            first = next(iter(failed.values()))
            self._serve_problem = (
                f"cannot serve {len(failed)} resource(s) (first error: {first}); retrying"
            )
            log.error(
                "cannot serve resources; retrying",
                count=len(failed),
                resources=sorted(failed)[:5],
                error=first,
            )

    async def _start_endpoint(self, resource: Resource, kubelet: tuple[int, int, int]) -> None:
        servicer = self._servicers[resource.name]
        endpoint = _Endpoint(self.config, resource, servicer, kubelet)
        await endpoint.server.start()
        self._endpoints[resource.name] = endpoint
        endpoint.registration = asyncio.create_task(
            self._keep_registering(endpoint), name=f"register {resource.name}"
        )
        log.debug("serving", resource=resource.name, socket=str(endpoint.server.path))

    async def _stop_endpoints(self, names: set[str], grace: float) -> None:
        endpoints = [self._endpoints.pop(name) for name in sorted(names)]
        self.registered -= names
        for name in names:
            self.recorder.registered(name, False)
        await asyncio.gather(*(endpoint.stop(grace) for endpoint in endpoints))

    async def _keep_registering(self, endpoint: _Endpoint) -> None:
        """Register ``endpoint`` until the kubelet accepts it; cancelled when it stops."""
        name = endpoint.resource.name
        request = register_request(name, endpoint.resource.socket_name, PLUGIN_OPTIONS)
        backoff = Backoff()
        while True:
            try:
                endpoint.servicer.expect_kubelet()
                await register(
                    self.config.kubelet_socket, request, timeout=self.config.register_timeout
                )
                break
            except RegistrationError as exc:
                self.recorder.registration(name, False)
                held = self._log_limiter.allow(("registration failed", exc.code))
                if held is not None:
                    log.warning(
                        "registration failed; will retry",
                        resource=name,
                        code=exc.code.name,
                        details=exc.details[:200],
                        attempt=backoff.attempts + 1,
                        similar_held_back=held,
                    )
            except Exception:
                self.recorder.registration(name, False)
                if self._log_limiter.allow("registration crashed") is not None:
                    log.exception("registration crashed; will retry", resource=name)
            await asyncio.sleep(backoff.next_delay())
        self.recorder.registration(name, True)
        self._announce()
        if self._endpoints.get(name) is endpoint:
            self.registered.add(name)
            self.recorder.registered(name, True)
            devices = endpoint.servicer.devices
            log.info(
                "registered with the kubelet",
                resource=name,
                endpoint=request.endpoint,
                devices=len(devices),
                healthy=sum(1 for device in devices if device.health == HEALTHY),
            )
            if self.unaligned():
                self._warn_unaligned([name])
            # A (new) kubelet: its allocatable CPUs may differ from the last one's.
            self.request_poll(allocatable=True)

    def _stream_lost(self, name: str) -> None:
        self.registered.discard(name)
        self.recorder.registered(name, False)
        self.wake(STREAM_LOST, name)
