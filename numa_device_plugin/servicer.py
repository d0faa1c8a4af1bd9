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
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NoReturn

import grpc
import structlog

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.devices import Device, Resource
from numa_device_plugin.recorder import NullRecorder, Recorder

log = structlog.get_logger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

NUMA_NODE_ENV = "NUMA_NODE"
# Device ids quoted in an error message at most; the rest are counted.
_MAX_IDS_IN_MESSAGE = 5


def device_message(device: Device) -> api_pb2.Device:
    """The v1beta1 ``Device`` for a slot, with ``TopologyInfo`` naming its NUMA node."""
    return api_pb2.Device(
        ID=device.id,
        health=device.health,
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.node_id)]),
    )


def _quote_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(device_id) for device_id in ids[:_MAX_IDS_IN_MESSAGE])
    more = len(ids) - _MAX_IDS_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


class RequestError(ValueError):
    """A request the servicer refuses; the text becomes the INVALID_ARGUMENT message."""


class NumaDevicePluginServicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """``v1beta1.DevicePlugin`` for one resource (``numa-align/numa-N``).

    ``on_stream_lost(resource_name)`` is called when a ListAndWatch stream ends
    because the client (the kubelet) went away: the kubelet never reopens a
    stream by itself, so the plugin must register again. It is not called for
    streams that :meth:`close` ends. One servicer may sit behind successive
    servers: :meth:`close` ends the streams opened so far, later ones run anew.
    """

    def __init__(
        self,
        resource: Resource,
        *,
        on_stream_lost: Callable[[str], None] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.resource_name = resource.name
        self._recorder: Recorder = recorder or NullRecorder()
        self.node_id = resource.node_id
        self._on_stream_lost = on_stream_lost
        self._devices: tuple[Device, ...] = ()
        self._by_id: dict[str, Device] = {}
        self._response = api_pb2.ListAndWatchResponse()
        self._changed = asyncio.Event()
        self._generation = 0
        self.open_streams = 0
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

    def close(self) -> None:
        """End every open ListAndWatch stream (status OK), e.g. before its server stops."""
        self._generation += 1
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
        self.open_streams += 1
        log.debug("ListAndWatch opened", resource=self.resource_name, peer=context.peer())
        try:
            while generation == self._generation:
                changed = self._changed
                yield self._response
                await changed.wait()
        finally:
            self.open_streams -= 1
            if generation == self._generation:
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
            for position, container in enumerate(request.container_requests):
                self._check_ids(list(container.devices_ids), f"container request {position}")
                responses.append(
                    api_pb2.ContainerAllocateResponse(envs={NUMA_NODE_ENV: str(self.node_id)})
                )
        except RequestError as exc:
            self._recorder.allocated(self.resource_name, time.perf_counter() - started, False)
            await self._refuse(context, "Allocate", exc)
        self._recorder.allocated(self.resource_name, time.perf_counter() - started, True)
        log.debug("Allocate", resource=self.resource_name, containers=len(responses))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        try:
            if not request.container_requests:
                raise RequestError("GetPreferredAllocation request has no container requests")
            responses = [
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=self._prefer(container, f"container request {position}")
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
        log.warning(f"{method} refused", resource=self.resource_name, reason=str(exc))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource_name}: {exc}")
        raise AssertionError("grpc.aio context.abort() returned instead of raising")

    def _check_ids(self, ids: Sequence[str], where: str, *, allow_empty: bool = False) -> None:
        if not ids and not allow_empty:
            raise RequestError(f"{where} names no device ids")
        unknown = [device_id for device_id in ids if device_id not in self._by_id]
        if unknown:
            raise RequestError(
                f"{where}: device ids {_quote_ids(unknown)} are not devices of this resource"
            )
        repeated = [device_id for device_id, count in Counter(ids).items() if count > 1]
        if repeated:
            raise RequestError(f"{where}: device ids {_quote_ids(repeated)} are listed twice")

    def _prefer(
        self, container: api_pb2.ContainerPreferredAllocationRequest, where: str
    ) -> list[str]:
        available = list(container.available_deviceIDs)
        must = list(container.must_include_deviceIDs)
        size = container.allocation_size
        self._check_ids(available, f"{where} available_deviceIDs", allow_empty=True)
        self._check_ids(must, f"{where} must_include_deviceIDs", allow_empty=True)
        if size < 1:
            raise RequestError(f"{where}: allocation_size must be at least 1, got {size}")
        if len(must) > size:
            raise RequestError(
                f"{where}: {len(must)} must-include devices do not fit allocation_size {size}"
            )
        chosen = sorted(must, key=lambda device_id: self._by_id[device_id].index)
        rest = sorted(
            set(available) - set(must), key=lambda device_id: self._by_id[device_id].index
        )
        if len(chosen) + len(rest) < size:
            raise RequestError(
                f"{where}: allocation_size {size} exceeds the {len(chosen) + len(rest)} "
                "available and must-include devices"
            )
        return chosen + rest[: size - len(chosen)]
