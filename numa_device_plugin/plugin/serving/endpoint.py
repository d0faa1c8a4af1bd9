"""The endpoints: per resource, a gRPC server on its socket in the device-plugin folder,
and a registration with the kubelet.

The registration stage of the flow sysfs -> topology -> devices -> servicers ->
registration. Rules, from the kubelet's device manager:

- The kubelet dials back the ``endpoint`` named in RegisterRequest (the socket's file
  name in its own folder) as soon as it accepts the registration, and opens
  ListAndWatch: the server must listen *before* Register is called.
- Each endpoint registers in its own task, retried with jittered exponential backoff
  until the kubelet accepts it; stopping the endpoint cancels it. A Register call that
  finishes after its endpoint was replaced does not count.
- An endpoint remembers the ``kubelet.sock`` (its file identity) it was started for:
  a new file there is a new kubelet, which knows none of the old registrations.
- Stopping ends the servicer's streams first, then stops the server (the grace period
  then only waits for in-flight Allocate calls): an old stream ending after a new
  registration would make the kubelet drop the new endpoint.
- Failures are logged once per kind per longest backoff for all endpoints together
  (1,024 endpoints failing alike once wrote 560 lines a second).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import structlog

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet.registration import (
    Backoff,
    KubeletConnection,
    RegistrationError,
    register,
    register_request,
)
from numa_device_plugin.ops.logs import LogLimiter
from numa_device_plugin.plugin.model.recorder import Recorder
from numa_device_plugin.plugin.model.resources import HEALTHY, Resource
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from numa_device_plugin.plugin.settings.config import Config

log = structlog.get_logger(__name__)

PLUGIN_OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)

# The file identity of a kubelet.sock (server.file_identity): (st_dev, st_ino, st_ctime_ns).
KubeletIdentity = tuple[int, int, int]


class Endpoint:
    """One server exposing a resource's servicer on its socket, the identity of the
    ``kubelet.sock`` it was started for, and its registration task."""

    def __init__(
        self,
        config: Config,
        resource: Resource,
        servicer: NumaDevicePluginServicer,
        kubelet: KubeletIdentity,
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


class Endpoints:
    """The running endpoints by resource name, and which of them the kubelet accepted.

    ``registered``: names registered with the current kubelet whose server still runs.
    ``on_registered(name)`` runs after each accepted registration of a current endpoint;
    ``on_change()`` after every registration task that ends with an accepted call.
    """

    def __init__(
        self,
        config: Config,
        recorder: Recorder,
        *,
        on_registered: Callable[[str], None],
        on_change: Callable[[], None],
    ) -> None:
        self.config = config
        self.recorder = recorder
        self._on_registered = on_registered
        self._on_change = on_change
        self._running: dict[str, Endpoint] = {}
        self.registered: set[str] = set()
        self.seen_kubelet: KubeletIdentity | None = None  # the last kubelet.sock seen
        # One line per failure kind per longest backoff, for every resource together.
        self._log_limiter = LogLimiter(Backoff().maximum)
        # Registrations in flight together share one connection to kubelet.sock. A new
        # kubelet.sock restarts every endpoint first: stopping cancels the old calls,
        # which breaks that connection, so the new ones dial the new socket.
        self._connection = KubeletConnection(config.kubelet_socket)

    @property
    def running(self) -> Mapping[str, Endpoint]:
        return self._running

    def note_kubelet(self, kubelet: KubeletIdentity | None) -> None:
        """Count a kubelet restart (once) when a kubelet.sock other than the last one
        seen appears (the first one seen is not a restart); None (no kubelet.sock)
        changes nothing."""
        if kubelet is None:
            return
        if self.seen_kubelet is not None and kubelet != self.seen_kubelet:
            self.recorder.kubelet_restart()
        self.seen_kubelet = kubelet

    def registrations_done(self) -> bool:
        """True when no registration is in flight."""
        return all(
            endpoint.registration is None or endpoint.registration.done()
            for endpoint in self._running.values()
        )

    async def start(
        self, resource: Resource, servicer: NumaDevicePluginServicer, kubelet: KubeletIdentity
    ) -> None:
        """Listen on the resource's socket, then register it in a task of its own.
        Raises what the server's start raises (OSError, SocketPathError)."""
        endpoint = Endpoint(self.config, resource, servicer, kubelet)
        await endpoint.server.start()
        self._running[resource.name] = endpoint
        endpoint.registration = asyncio.create_task(
            self.keep_registering(endpoint), name=f"register {resource.name}"
        )
        log.debug("serving", resource=resource.name, socket=str(endpoint.server.path))

    async def start_all(
        self,
        served: Iterable[tuple[Resource, NumaDevicePluginServicer]],
        kubelet: KubeletIdentity,
    ) -> dict[str, str]:
        """:meth:`start` each, all at once; the ones that failed, name -> error. One log
        line per call however many failed (out of file descriptors, 1,024 resources
        once wrote 560 lines a second)."""
        served = list(served)
        results = await asyncio.gather(
            *(self.start(resource, servicer, kubelet) for resource, servicer in served),
            return_exceptions=True,
        )
        failed = {
            resource.name: str(result)
            for (resource, _), result in zip(served, results, strict=True)
            if isinstance(result, BaseException)
        }
        if failed:
            log.error(
                "cannot serve resources; retrying",
                count=len(failed),
                resources=sorted(failed)[:5],
                error=next(iter(failed.values())),
            )
        return failed

    async def stop(self, names: Iterable[str], grace: float) -> None:
        """Stop the named endpoints (those running), all at once."""
        names = set(names) & set(self._running)
        endpoints = [self._running.pop(name) for name in sorted(names)]
        self.registered -= names
        for name in names:
            self.recorder.registered(name, False)
        await asyncio.gather(*(endpoint.stop(grace) for endpoint in endpoints))

    def stream_lost(self, name: str) -> None:
        """The kubelet closed the resource's ListAndWatch stream: no longer registered."""
        self.registered.discard(name)
        self.recorder.registered(name, False)

    async def keep_registering(self, endpoint: Endpoint) -> None:
        """Register ``endpoint`` until the kubelet accepts it; cancelled when it stops."""
        name = endpoint.resource.name
        request = register_request(name, endpoint.resource.socket_name, PLUGIN_OPTIONS)
        backoff = Backoff()
        while True:
            try:
                endpoint.servicer.expect_kubelet()
                await register(
                    self.config.kubelet_socket,
                    request,
                    timeout=self.config.register_timeout,
                    connection=self._connection,
                )
                break
            except RegistrationError as exc:
                if endpoint.servicer.kubelet_stream_open:
                    # The kubelet dialed back and opened ListAndWatch, which it does only
                    # for a registration it accepted; its answer was late or lost.
                    # Registering again would leave it two clients with two streams.
                    log.info("Register failed after the kubelet accepted it; registered",
                             resource=name, code=exc.code.name)  # fmt: skip
                    break
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
        self._on_change()
        if self._running.get(name) is not endpoint:
            return  # replaced or stopped meanwhile: this registration is stale
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
        self._on_registered(name)
