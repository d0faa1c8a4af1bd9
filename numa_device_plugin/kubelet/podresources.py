"""A client of the kubelet's pod resources API (``v1.PodResourcesLister``).

The kubelet serves it on ``pod-resources/kubelet.sock`` beside the
device-plugin folder (``/var/lib/kubelet/pod-resources/kubelet.sock``).
``List`` gives every container's devices and exclusive CPUs;
``GetAllocatableResources`` the CPUs the CPU manager may hand out (all but the
reserved ones under the ``static`` policy, none under ``none``), healthy
devices and, under the Memory Manager's ``Static`` policy, memory per NUMA node.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.kubelet.grpcserver import unix_target
from numa_device_plugin.kubelet.registration import FRESH_CONNECTION
from numa_device_plugin.kubelet.view import KubeletView, view_from


class PodResourcesError(Exception):
    """The API could not be read. ``code`` is the gRPC status code (UNAVAILABLE when
    nothing listens, UNIMPLEMENTED for a kubelet without the call)."""

    def __init__(self, socket: Path, code: grpc.StatusCode, details: str) -> None:
        self.socket = socket
        self.code = code
        self.details = details
        super().__init__(f"cannot read the pod resources API at {socket}: {code.name}: {details}")


async def fetch(
    socket: Path, timeout: float = 5.0
) -> tuple[pr_pb2.ListPodResourcesResponse, pr_pb2.AllocatableResourcesResponse]:
    """``List`` and ``GetAllocatableResources`` over a fresh connection; ``timeout`` in
    seconds per call. Raises :class:`PodResourcesError`."""
    async with PodResourcesClient(socket) as client:
        return await client.responses(timeout)


class PodResourcesClient:
    """Keeps one connection to the API for repeated polls; a failed call drops it,
    so the next poll dials the (possibly new) kubelet afresh."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._channel: grpc.aio.Channel | None = None
        self._allocatable: pr_pb2.AllocatableResourcesResponse | None = None

    async def responses(
        self, timeout: float, *, allocatable: bool = True
    ) -> tuple[pr_pb2.ListPodResourcesResponse, pr_pb2.AllocatableResourcesResponse]:
        """``List`` and ``GetAllocatableResources``; with ``allocatable`` False the last
        ``GetAllocatableResources`` answer is reused (it changes only when the kubelet
        restarts with other settings), saving a call. Raises
        :class:`PodResourcesError` (and drops the connection and that answer)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                unix_target(self.socket), options=FRESH_CONNECTION
            )
        stub = pr_grpc.PodResourcesListerStub(self._channel)
        try:
            pods = await stub.List(pr_pb2.ListPodResourcesRequest(), timeout=timeout)
            if allocatable or self._allocatable is None:
                self._allocatable = await stub.GetAllocatableResources(
                    pr_pb2.AllocatableResourcesRequest(), timeout=timeout
                )
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(self.socket, exc.code(), exc.details() or "") from exc
        return pods, self._allocatable

    async def view(self, timeout: float, *, allocatable: bool = True) -> KubeletView:
        """The answers as a :class:`KubeletView`; raises :class:`PodResourcesError`."""
        return view_from(*await self.responses(timeout, allocatable=allocatable))

    async def close(self) -> None:
        self._allocatable = None
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> PodResourcesClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
