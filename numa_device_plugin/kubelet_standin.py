"""An in-process stand-in for the kubelet's device manager, for tests and the demo.

No kubelet can run on a developer's machine or in CI, so this module behaves
as the kubelet does toward device plugins (device plugin API v1beta1; see
``shared/KUBELET.md``):

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
- With ``pod_resources_dir`` it also serves ``v1.PodResourcesLister`` (List,
  GetAllocatableResources, Get) on ``kubelet.sock`` there, for the pods that
  :meth:`KubeletStandIn.add_pod` placed (containers holding exclusive CPUs,
  with or without devices). ``GetAllocatableResources().cpu_ids`` are
  ``allocatable_cpus`` (every CPU minus the reserved set) under
  ``cpu_manager_policy`` ``static``, and empty under ``none``, as the kubelet's
  CPU manager reports them; ``memory`` lists ``allocatable_memory`` per NUMA node.
- :meth:`KubeletStandIn.restart` does what a kubelet restart does: the old
  process's connections go away, every file in the folder except
  ``kubelet_internal_checkpoint`` is deleted, and ``kubelet.sock`` is created anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.devices import HEALTHY, validate_extended_resource_name
from numa_device_plugin.registration import API_VERSION, FRESH_CONNECTION, KUBELET_SOCKET_NAME
from numa_device_plugin.server import UnixSocketServer, unix_target
from numa_device_plugin.servicer import Context

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
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


class KubeletStandIn:
    """Behaves like the kubelet's device manager toward plugins in ``directory``.

    ``clients`` maps each resource name to its current :class:`PluginClient`;
    ``registrations`` lists every Register call. Use :meth:`wait_until` to wait
    for a state instead of sleeping.
    """

    def __init__(
        self,
        directory: Path,
        *,
        dial_timeout: float = DIAL_TIMEOUT,
        pod_resources_dir: Path | None = None,
        allocatable_cpus: Sequence[int] = (),
        cpu_manager_policy: str = "static",
        allocatable_memory: dict[int, int] | None = None,
    ) -> None:
        self.directory = directory
        self.pods: list[pr_pb2.PodResources] = []
        self.allocatable_cpus = list(allocatable_cpus)
        self.cpu_manager_policy = cpu_manager_policy
        self.allocatable_memory = dict(allocatable_memory or {})
        self.pod_resources_calls = 0
        self._pod_resources: UnixSocketServer | None = None
        if pod_resources_dir is not None:
            self._pod_resources = UnixSocketServer(
                pod_resources_dir / KUBELET_SOCKET_NAME,
                lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                    _PodResourcesServicer(self), server
                ),
            )
        self.dial_timeout = dial_timeout
        self.clients: dict[str, PluginClient] = {}
        self.registrations: list[RegisterRecord] = []
        self.restarts = 0
        self.restarted_at = 0.0
        self._all_clients: list[PluginClient] = []
        self._generation = 0
        self._changed = asyncio.Event()
        self._server = UnixSocketServer(
            directory / KUBELET_SOCKET_NAME,
            lambda server: api_pb2_grpc.add_RegistrationServicer_to_server(
                _RegistrationServicer(self), server
            ),
        )

    @property
    def socket_path(self) -> Path:
        return self._server.path

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create ``kubelet.sock`` and serve Registration."""
        self.directory.mkdir(parents=True, exist_ok=True)
        await self._server.start()
        if self._pod_resources is not None and not self._pod_resources.serving:
            self._pod_resources.path.parent.mkdir(parents=True, exist_ok=True)
            await self._pod_resources.start()
        self._notify()

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
        await self._server.stop(0)
        self._notify()

    async def restart(self) -> None:
        """As a kubelet restart: stop, delete every socket in the folder, create kubelet.sock.

        ``restarted_at`` is the ``time.perf_counter()`` just before the new
        ``kubelet.sock`` is created, for latency measurements.
        """
        await self.stop()
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT_NAME and not entry.is_dir():
                entry.unlink(missing_ok=True)
        self.restarts += 1
        self.restarted_at = time.perf_counter()
        await self.start()

    async def stop_pod_resources(self) -> None:
        """The pod resources API goes away (its socket too); the device manager stays."""
        if self._pod_resources is not None:
            await self._pod_resources.stop(0)

    async def start_pod_resources(self) -> None:
        """The pod resources API serves again, on a new socket."""
        if self._pod_resources is not None and not self._pod_resources.serving:
            await self._pod_resources.start()

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
        if self._pod_resources is not None:
            await self._pod_resources.stop(0)

    @property
    def pod_resources_socket(self) -> Path | None:
        return self._pod_resources.path if self._pod_resources is not None else None

    def add_pod(
        self,
        namespace: str,
        name: str,
        containers: Sequence[tuple[str, dict[str, list[str]], Sequence[int]]],
    ) -> None:
        """Place a pod: per container its name, ``{resource: device ids}`` and exclusive
        CPU ids. Device topology is taken from what the plugins reported."""
        pod = pr_pb2.PodResources(name=name, namespace=namespace)
        for container_name, devices, cpus in containers:
            container = pod.containers.add(name=container_name, cpu_ids=list(cpus))
            for resource, ids in devices.items():
                nodes = sorted(
                    {
                        node.ID
                        for device in self.devices(resource)
                        if device.ID in ids
                        for node in device.topology.nodes
                    }
                )
                container.devices.add(
                    resource_name=resource,
                    device_ids=ids,
                    topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n) for n in nodes]),
                )
        self.pods.append(pod)

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod is gone: its containers no longer hold devices or CPUs."""
        self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def allocatable_resources(self) -> pr_pb2.AllocatableResourcesResponse:
        """As the kubelet: every healthy device of every registered plugin, with its
        topology, and the CPUs the CPU manager may hand out."""
        cpus = self.allocatable_cpus if self.cpu_manager_policy == "static" else []
        response = pr_pb2.AllocatableResourcesResponse(cpu_ids=cpus)
        for node, size in sorted(self.allocatable_memory.items()):
            response.memory.add(
                memory_type="memory",
                size=size,
                topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=node)]),
            )
        for resource, client in sorted(self.clients.items()):
            if not client.stream_open:
                continue
            for device in client.devices:
                if device.health == HEALTHY:
                    response.devices.add(
                        resource_name=resource,
                        device_ids=[device.ID],
                        topology=pr_pb2.TopologyInfo(
                            nodes=[pr_pb2.NUMANode(ID=n.ID) for n in device.topology.nodes]
                        ),
                    )
        return response

    # -- what the kubelet knows ------------------------------------------------------------

    def devices(self, resource_name: str) -> tuple[api_pb2.Device, ...]:
        """The latest device list of the resource's current client; () when none."""
        client = self.clients.get(resource_name)
        return client.devices if client is not None else ()

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

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; raises TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                changed = self._changed
                await changed.wait()

    # -- calls a kubelet makes -------------------------------------------------------------

    def _client(self, resource_name: str) -> PluginClient:
        client = self.clients.get(resource_name)
        if client is None:
            raise LookupError(f"no plugin is registered for {resource_name}")
        return client

    async def allocate(
        self, resource_name: str, device_ids: Sequence[str]
    ) -> api_pb2.AllocateResponse:
        """Allocate as the kubelet does: one container request per call.

        Raises LookupError when the resource has no plugin, grpc.aio.AioRpcError
        when the plugin refuses.
        """
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        return await self.call_allocate(resource_name, request)

    async def call_allocate(
        self, resource_name: str, request: api_pb2.AllocateRequest
    ) -> api_pb2.AllocateResponse:
        """Send any AllocateRequest, even one a kubelet would not build."""
        response: api_pb2.AllocateResponse = await self._client(resource_name).stub.Allocate(
            request
        )
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
        client = self._client(resource_name)
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

    # -- internals -------------------------------------------------------------------------

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _register(self, request: api_pb2.RegisterRequest) -> str | None:
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
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    async def Register(self, request: api_pb2.RegisterRequest, context: Context) -> api_pb2.Empty:
        error = await self._kubelet._register(request)
        self._kubelet.registrations.append(
            RegisterRecord(request.resource_name, request.endpoint, request.version, error)
        )
        if error is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()


class _PodResourcesServicer(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    async def List(
        self, request: pr_pb2.ListPodResourcesRequest, context: Context
    ) -> pr_pb2.ListPodResourcesResponse:
        self._kubelet.pod_resources_calls += 1
        return pr_pb2.ListPodResourcesResponse(pod_resources=self._kubelet.pods)

    async def GetAllocatableResources(
        self, request: pr_pb2.AllocatableResourcesRequest, context: Context
    ) -> pr_pb2.AllocatableResourcesResponse:
        return self._kubelet.allocatable_resources()

    async def Get(
        self, request: pr_pb2.GetPodResourcesRequest, context: Context
    ) -> pr_pb2.GetPodResourcesResponse:
        for pod in self._kubelet.pods:
            if (pod.name, pod.namespace) == (request.pod_name, request.pod_namespace):
                return pr_pb2.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
        raise AssertionError("unreachable")
