"""The stand-in's device-manager side: what the kubelet does toward device plugins
(device plugin API v1beta1; see ``shared/KUBELET.md``).

- It serves ``v1beta1.Registration/Register`` on ``kubelet.sock`` in a folder.
- Register refuses a version other than ``v1beta1`` and a resource name that is
  not a valid extended resource name, with gRPC status UNKNOWN (the kubelet
  returns a plain Go error).
- Inside Register it dials ``<folder>/<endpoint>`` (10 s), calls
  ``GetDevicePluginOptions``, keeps the options from that answer, makes the
  client the resource's current one, then opens ``ListAndWatch`` and keeps the
  latest device list.
- When any ListAndWatch stream of a resource ends, the kubelet disconnects the
  resource's *current* client and marks its devices unhealthy (allocatable 0):
  an old stream ending after a new registration drops the new endpoint. It
  never reopens a stream by itself.
- Allocate and GetPreferredAllocation are sent as the kubelet sends them, one
  container request per call; the latter only to a plugin that offered it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer, unix_target
from numa_device_plugin.kubelet.registration import (
    API_VERSION,
    FRESH_CONNECTION,
    KUBELET_SOCKET_NAME,
)
from numa_device_plugin.plugin.model.names import validate_extended_resource_name
from numa_device_plugin.plugin.model.resources import HEALTHY
from numa_device_plugin.plugin.serving.servicer import Context

DIAL_TIMEOUT = 10.0


@dataclass
class PluginClient:
    """The stand-in's connection to one registered plugin endpoint (one Register call)."""

    resource_name: str
    endpoint: str
    channel: grpc.aio.Channel
    generation: int
    options: api_pb2.DevicePluginOptions = field(default_factory=api_pb2.DevicePluginOptions)
    devices: tuple[api_pb2.Device, ...] = ()
    lists_received: int = 0
    stream_open: bool = False
    disconnected: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def stub(self) -> api_pb2_grpc.DevicePluginStub:
        return api_pb2_grpc.DevicePluginStub(self.channel)


@dataclass(frozen=True)
class RegisterRecord:
    """One Register call as the stand-in saw it; ``error`` is None when it was accepted."""

    resource_name: str
    endpoint: str
    version: str
    error: str | None


class DeviceManagerStandIn:
    """The kubelet's device manager toward plugins in ``directory``.

    ``clients`` maps each resource name to its current :class:`PluginClient`;
    ``registrations`` lists every Register call. ``notify()`` is called on every
    change of state.
    """

    def __init__(
        self, directory: Path, notify: Callable[[], None], *, dial_timeout: float = DIAL_TIMEOUT
    ) -> None:
        self.directory = directory
        self.dial_timeout = dial_timeout
        self.clients: dict[str, PluginClient] = {}
        self.registrations: list[RegisterRecord] = []
        self._all_clients: list[PluginClient] = []
        self._generation = 0
        self._notify = notify
        self.server = UnixSocketServer(
            directory / KUBELET_SOCKET_NAME,
            lambda server: api_pb2_grpc.add_RegistrationServicer_to_server(
                _RegistrationServicer(self), server
            ),
        )

    async def start(self) -> None:
        """Create ``kubelet.sock`` and serve Registration."""
        self.directory.mkdir(parents=True, exist_ok=True)
        await self.server.start()

    async def stop(self) -> None:
        """The kubelet process goes away: every plugin connection closes, the socket too."""
        self._generation += 1
        clients, self._all_clients = self._all_clients, []
        self.clients.clear()
        for client in clients:
            client.disconnected = True
            client.stream_open = False
            if client.task is not None:
                client.task.cancel()
        await asyncio.gather(
            *(client.task for client in clients if client.task is not None),
            return_exceptions=True,
        )
        await asyncio.gather(*(client.channel.close() for client in clients))
        await self.server.stop(0)

    # -- what the kubelet knows ------------------------------------------------------------

    def devices(self, resource_name: str) -> tuple[api_pb2.Device, ...]:
        """The latest device list of the resource's current client; () when none."""
        client = self.clients.get(resource_name)
        return client.devices if client is not None else ()

    def open_devices(self) -> dict[str, tuple[api_pb2.Device, ...]]:
        """The device lists of the resources whose current client has its stream open."""
        return {name: c.devices for name, c in self.clients.items() if c.stream_open}

    def allocatable(self, resource_name: str) -> int:
        """Healthy devices of a connected client with an open stream; 0 otherwise."""
        client = self.clients.get(resource_name)
        if client is None or not client.stream_open:
            return 0
        return sum(1 for device in client.devices if device.health == HEALTHY)

    def open_streams(self, resource_name: str) -> int:
        """ListAndWatch streams open for the resource, counting superseded clients too."""
        return sum(
            1
            for client in self._all_clients
            if client.resource_name == resource_name and client.stream_open
        )

    def live(self, resource_name: str) -> bool:
        """Exactly one live registration: a current client with the only open stream,
        whose device list has arrived."""
        client = self.clients.get(resource_name)
        return (
            client is not None
            and client.stream_open
            and client.lists_received > 0
            and self.open_streams(resource_name) == 1
        )

    # -- calls a kubelet makes -------------------------------------------------------------

    def client(self, resource_name: str) -> PluginClient:
        """The resource's current client; raises LookupError when it has none."""
        client = self.clients.get(resource_name)
        if client is None:
            raise LookupError(f"no plugin is registered for {resource_name}")
        return client

    async def call_allocate(
        self, resource_name: str, request: api_pb2.AllocateRequest
    ) -> api_pb2.AllocateResponse:
        """Send any AllocateRequest, even one a kubelet would not build."""
        response: api_pb2.AllocateResponse = await self.client(resource_name).stub.Allocate(request)
        return response

    async def get_preferred_allocation(
        self,
        resource_name: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> api_pb2.PreferredAllocationResponse:
        """GetPreferredAllocation for one container, only if the plugin offered it.

        Raises RuntimeError when the plugin's options do not offer it.
        """
        client = self.client(resource_name)
        if not client.options.get_preferred_allocation_available:
            raise RuntimeError(f"{resource_name}'s plugin does not offer GetPreferredAllocation")
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response: api_pb2.PreferredAllocationResponse = await client.stub.GetPreferredAllocation(
            request
        )
        return response

    # -- the kubelet's side of registration --------------------------------------------------

    async def register(self, request: api_pb2.RegisterRequest) -> str | None:
        """The kubelet's Register handler; returns an error text, or None when accepted."""
        if request.version != API_VERSION:
            return (
                f"Unsupported device plugin API version {request.version!r}; "
                f"supported: [{API_VERSION}]"
            )
        try:
            validate_extended_resource_name(request.resource_name)
        except ValueError as exc:
            return f"invalid resource name {request.resource_name!r}: {exc}"
        generation = self._generation
        channel = grpc.aio.insecure_channel(
            unix_target(self.directory / request.endpoint), options=FRESH_CONNECTION
        )
        client = PluginClient(request.resource_name, request.endpoint, channel, generation)
        try:
            async with asyncio.timeout(self.dial_timeout):
                await channel.channel_ready()
                client.options = await client.stub.GetDevicePluginOptions(api_pb2.Empty())
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            await channel.close()
            return f"failed to dial device plugin at {request.endpoint}: {exc!r}"
        if generation != self._generation:
            await channel.close()
            return "kubelet is shutting down"
        self.clients[request.resource_name] = client
        self._all_clients.append(client)
        client.task = asyncio.create_task(self._run_client(client))
        self._notify()
        return None

    async def _run_client(self, client: PluginClient) -> None:
        try:
            stream = client.stub.ListAndWatch(api_pb2.Empty())
            client.stream_open = True
            self._notify()
            async for response in stream:
                client.devices = tuple(response.devices)
                client.lists_received += 1
                self._notify()
        except grpc.aio.AioRpcError:
            pass
        finally:
            client.stream_open = False
            self._notify()
        if client.generation != self._generation:
            return
        # The kubelet's runClient: when a stream ends, disconnect whatever client is
        # current for the resource now -- possibly a newer one.
        current = self.clients.pop(client.resource_name, None)
        self._all_clients = [c for c in self._all_clients if c is not client]
        if current is not None and current is not client:
            current.disconnected = True
            with contextlib.suppress(Exception):
                await current.channel.close()
        client.disconnected = True
        await client.channel.close()
        self._notify()


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, manager: DeviceManagerStandIn) -> None:
        self._manager = manager

    async def Register(self, request: api_pb2.RegisterRequest, context: Context) -> api_pb2.Empty:
        error = await self._manager.register(request)
        self._manager.registrations.append(
            RegisterRecord(request.resource_name, request.endpoint, request.version, error)
        )
        if error is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()
