"""The v1beta1 ``DevicePlugin`` service for one NUMA node's extended resource.

One :class:`NumaDevicePluginServicer` serves one resource. It holds the
current device list, streams it on ``ListAndWatch`` (the full list at once and
again on every change), answers ``Allocate`` with ``NUMA_NODE=<id>`` and
``GetPreferredAllocation`` with the lowest-numbered slots. Bad requests get a
gRPC ``INVALID_ARGUMENT`` status naming what is wrong; the servicer keeps its
state and goes on serving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NoReturn

import grpc
import structlog

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.plugin.model.near import near_env
from numa_device_plugin.plugin.model.recorder import NullRecorder, Recorder
from numa_device_plugin.plugin.model.resources import Device, Resource
from numa_device_plugin.plugin.serving.requests import (
    RequestError,
    bounded,
    check_ids,
    preferred,
)
from numa_device_plugin.topology import sysfs

log = structlog.get_logger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

NUMA_NODE_ENV = "NUMA_NODE"
# The socket (physical package) of the NUMA node(s) allocated, for a resource that names
# sockets (numa-align/socket-S, a resource that follows a device to its socket).
NUMA_SOCKET_ENV = "NUMA_SOCKET"


def device_message(device: Device) -> api_pb2.Device:
    """The v1beta1 ``Device`` for a slot, with ``TopologyInfo`` naming its NUMA node."""
    return api_pb2.Device(
        ID=device.id,
        health=device.health,
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.node_id)]),
    )


class NumaDevicePluginServicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """``v1beta1.DevicePlugin`` for one resource (``numa-align/numa-N``).

    Only the kubelet's stream counts: the first ListAndWatch opened after
    :meth:`expect_kubelet` (called just before each Register, inside which the
    kubelet dials back and opens it). ``on_stream_lost(resource_name)`` is
    called when *that* stream ends because the kubelet went away: the kubelet
    never reopens a stream by itself, so the plugin must register again. Other
    clients (an operator's grpcurl, a probe) may open and close streams freely;
    nor is it called for streams that :meth:`close` ends. One servicer may sit
    behind successive servers: :meth:`close` ends the streams opened so far,
    later ones run anew.
    """

    def __init__(
        self,
        resource: Resource,
        *,
        on_stream_lost: Callable[[str], None] | None = None,
        on_allocate: Callable[[str, frozenset[str]], None] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.resource_name = resource.name
        self._near = resource.near
        # Names of a kernel name's form only, filtered once here, not at each Allocate
        # (discovery already leaves any other without locality).
        self._near_devices = {
            node: tuple(name for name in names if sysfs.is_kernel_name(name))
            for node, names in resource.near_devices
        }
        self._sockets = dict(resource.sockets)
        self._recorder: Recorder = recorder or NullRecorder()
        self.node_id = resource.node_id
        self._on_stream_lost = on_stream_lost
        self._on_allocate = on_allocate
        self._devices: tuple[Device, ...] = ()
        self._by_id: dict[str, Device] = {}
        self._response = api_pb2.ListAndWatchResponse()
        self._changed = asyncio.Event()
        self._generation = 0
        self.open_streams = 0
        self._awaiting_kubelet = False
        self._kubelet_stream: object | None = None
        self.set_devices(resource.devices)

    # -- state -----------------------------------------------------------------------------

    def set_devices(self, devices: Iterable[Device]) -> None:
        """Replace the device list; every open ListAndWatch stream sends the new list."""
        self._devices = tuple(devices)
        self._by_id = {device.id: device for device in self._devices}
        self._response = api_pb2.ListAndWatchResponse(
            devices=[device_message(device) for device in self._devices]
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    @property
    def kubelet_stream_open(self) -> bool:
        """True while the stream the kubelet opened for the current registration is open."""
        return self._kubelet_stream is not None

    def expect_kubelet(self) -> None:
        """A Register call is about to go out: the next ListAndWatch stream to open is
        the kubelet's (it dials back inside Register); forget any earlier one."""
        self._awaiting_kubelet = True
        self._kubelet_stream = None

    def close(self) -> None:
        """End every open ListAndWatch stream (status OK), e.g. before its server stops."""
        self._generation += 1
        self._awaiting_kubelet = False
        self._kubelet_stream = None
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- RPCs ------------------------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        generation = self._generation
        stream = object()
        if self._awaiting_kubelet:
            self._awaiting_kubelet = False
            self._kubelet_stream = stream
        self.open_streams += 1
        kubelet = self._kubelet_stream is stream
        log.debug("ListAndWatch opened", resource=self.resource_name, kubelet=kubelet)
        try:
            while generation == self._generation:
                changed = self._changed
                yield self._response
                await changed.wait()
        finally:
            self.open_streams -= 1
            if generation != self._generation:
                log.debug("ListAndWatch ended by the plugin", resource=self.resource_name)
            elif self._kubelet_stream is not stream:
                log.debug("ListAndWatch closed", resource=self.resource_name, kubelet=False)
            else:
                self._kubelet_stream = None
                log.info(
                    "ListAndWatch stream lost: the kubelet went away", resource=self.resource_name
                )
                if self._on_stream_lost is not None:
                    self._on_stream_lost(self.resource_name)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Context
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        try:
            if not request.container_requests:
                raise RequestError("Allocate request has no container requests")
            responses = []
            given: set[str] = set()
            for position, container in enumerate(request.container_requests):
                ids = list(container.devices_ids)
                check_ids(self._by_id, ids, f"container request {position}")
                responses.append(api_pb2.ContainerAllocateResponse(envs=self._envs(ids)))
                given.update(ids)
        except RequestError as exc:
            self._recorder.allocated(self.resource_name, time.perf_counter() - started, False)
            await self._refuse(context, "Allocate", exc)
        self._recorder.allocated(self.resource_name, time.perf_counter() - started, True)
        log.debug("Allocate", resource=self.resource_name, containers=len(responses))
        if self._on_allocate is not None:
            self._on_allocate(self.resource_name, frozenset(given))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        try:
            if not request.container_requests:
                raise RequestError("GetPreferredAllocation request has no container requests")
            responses = [
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(self._by_id, container, f"container request {position}")
                )
                for position, container in enumerate(request.container_requests)
            ]
        except RequestError as exc:
            await self._refuse(context, "GetPreferredAllocation", exc)
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    # -- helpers ---------------------------------------------------------------------------

    async def _refuse(self, context: Context, method: str, exc: Exception) -> NoReturn:
        message = bounded(f"{self.resource_name}: {exc}")
        log.warning(f"{method} refused", resource=self.resource_name, reason=message)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        raise AssertionError("grpc.aio context.abort() returned instead of raising")

    def _envs(self, ids: Sequence[str]) -> dict[str, str]:
        """The container's variables for ``ids`` (known devices): ``NUMA_NODE``, and for
        a resource that follows a device its :func:`near_env` variable: the devices of
        its selection on the NUMA node(s) allocated, comma-separated (kernel names of
        disks and interfaces, addresses of PCI devices), each once, at most
        :data:`~numa_device_plugin.topology.selectors.MAX_NAMED` a NUMA node (the log
        says when a node has more); a name not of a kernel name's form (a comma, a
        control character: a hostile sysfs) is never written (discovery already leaves
        such a device without locality). For a resource that names sockets
        (:attr:`~numa_device_plugin.plugin.model.resources.Resource.sockets`), also
        ``NUMA_SOCKET``: the socket of the NUMA node(s) allocated (comma-separated when
        several)."""
        envs = {NUMA_NODE_ENV: self._numa_node(ids)}
        if self._sockets:
            held = {self._by_id[device_id].node_id for device_id in ids}
            found = sorted({self._sockets[node] for node in held if node in self._sockets})
            envs[NUMA_SOCKET_ENV] = ",".join(map(str, found))
        if self._near is not None:
            nodes = sorted({self._by_id[device_id].node_id for device_id in ids})
            names = [name for node in nodes for name in self._near_devices.get(node, ())]
            envs[near_env(self._near.name)] = ",".join(dict.fromkeys(names))
        return envs

    def _numa_node(self, ids: Sequence[str]) -> str:
        """``NUMA_NODE`` for a container given ``ids`` (known devices): the NUMA node
        their TopologyInfo names, or the nodes comma-separated (``0,1``) when a resource
        that follows a device on several nodes gave it devices of more than one (a
        Topology Manager policy that does not align, e.g. ``best-effort``)."""
        nodes = sorted({self._by_id[device_id].node_id for device_id in ids})
        return ",".join(map(str, nodes))
