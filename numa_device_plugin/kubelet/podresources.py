"""A client of the kubelet's pod resources API (``v1.PodResourcesLister``).

The kubelet serves it on ``pod-resources/kubelet.sock`` beside the
device-plugin folder (``/var/lib/kubelet/pod-resources/kubelet.sock``).
``List`` gives every container's devices and exclusive CPUs;
``GetAllocatableResources`` the CPUs the CPU manager may hand out (all but the
reserved ones under the ``static`` policy, none under ``none``), healthy
devices and, under the Memory Manager's ``Static`` policy, memory per NUMA node.

An answer can be large (69,000 containers are 2.2 MB): it is taken as bytes and
parsed and converted in a worker thread, so the event loop (and the probes it
answers) never waits on it. gRPC bounds its size (4 MiB, the default receive limit).

Most reads find what the last one found. :meth:`PodResourcesClient.view` then returns the
last view itself, at the cost of comparing bytes: the same bytes, or the same pods in
another order (the kubelet lists its pods from a Go map, in no fixed order; each pod's
own bytes compared, sorted, in the worker thread).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
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


_LIST = "/v1.PodResourcesLister/List"
_ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"

Answers = tuple[pr_pb2.ListPodResourcesResponse, pr_pb2.AllocatableResourcesResponse]


def parse_answers(socket: Path, pods: bytes, allocatable: bytes) -> Answers:
    """The ``List`` and ``GetAllocatableResources`` answers from their bytes; raises
    :class:`PodResourcesError` (INTERNAL) when they are not those messages."""
    try:
        return (
            pr_pb2.ListPodResourcesResponse.FromString(pods),
            pr_pb2.AllocatableResourcesResponse.FromString(allocatable),
        )
    except (DecodeError, RecursionError) as exc:
        raise PodResourcesError(
            socket, grpc.StatusCode.INTERNAL, f"an answer that does not parse: {exc}"[:200]
        ) from None


class PodResourcesClient:
    """Keeps one connection to the API for repeated polls; a failed call drops it,
    so the next poll dials the (possibly new) kubelet afresh."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._channel: grpc.aio.Channel | None = None
        self._allocatable: bytes | None = None
        # The last view and what it was made of: List's bytes, its pods' bytes sorted,
        # GetAllocatableResources' bytes.
        self._last: tuple[bytes, tuple[bytes, ...], bytes, KubeletView] | None = None

    async def _raw(self, timeout: float, allocatable: bool) -> tuple[bytes, bytes]:
        """The bytes of ``List`` and ``GetAllocatableResources`` (the last answer of
        the latter reused unless ``allocatable``)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                unix_target(self.socket), options=FRESH_CONNECTION
            )
        list_call: grpc.aio.UnaryUnaryMultiCallable[Any, bytes] = self._channel.unary_unary(
            _LIST, request_serializer=pr_pb2.ListPodResourcesRequest.SerializeToString
        )
        try:
            pods: bytes = await list_call(pr_pb2.ListPodResourcesRequest(), timeout=timeout)
            if allocatable or self._allocatable is None:
                allocatable_call: grpc.aio.UnaryUnaryMultiCallable[Any, bytes]
                allocatable_call = self._channel.unary_unary(
                    _ALLOCATABLE,
                    request_serializer=pr_pb2.AllocatableResourcesRequest.SerializeToString,
                )
                self._allocatable = await allocatable_call(
                    pr_pb2.AllocatableResourcesRequest(), timeout=timeout
                )
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise PodResourcesError(self.socket, exc.code(), exc.details() or "") from exc
        return pods, self._allocatable

    async def responses(self, timeout: float, *, allocatable: bool = True) -> Answers:
        """``List`` and ``GetAllocatableResources`` (``timeout`` seconds per call),
        parsed in a worker thread; with ``allocatable`` False the last
        ``GetAllocatableResources`` answer is reused (it changes only when the kubelet
        restarts with other settings), saving a call. Raises
        :class:`PodResourcesError` (and drops the connection and that answer)."""
        pods, allocatable_raw = await self._raw(timeout, allocatable)
        try:
            return await asyncio.to_thread(parse_answers, self.socket, pods, allocatable_raw)
        except PodResourcesError:
            await self.close()
            raise

    async def view(self, timeout: float, *, allocatable: bool = True) -> KubeletView:
        """The answers as a :class:`KubeletView`, parsed and converted in a worker
        thread; the very object of the last call when the answers are the same (the same
        bytes, or the same pods in another order): a caller can tell "unchanged" with
        ``is``. Raises :class:`PodResourcesError`."""
        pods, allocatable_raw = await self._raw(timeout, allocatable)
        last = self._last
        if last is not None and last[0] == pods and last[2] == allocatable_raw:
            return last[3]

        def convert() -> KubeletView:
            answers = parse_answers(self.socket, pods, allocatable_raw)
            each = tuple(sorted(pod.SerializeToString() for pod in answers[0].pod_resources))
            if last is not None and last[1] == each and last[2] == allocatable_raw:
                self._last = (pods, each, allocatable_raw, last[3])
                return last[3]
            found = view_from(*answers)
            self._last = (pods, each, allocatable_raw, found)
            return found

        try:
            return await asyncio.to_thread(convert)
        except PodResourcesError:
            await self.close()
            raise

    @property
    def connected(self) -> bool:
        """True while a connection is kept for the next read."""
        return self._channel is not None

    async def disconnect(self) -> None:
        """Close the connection and keep the last answers: the next read dials anew
        (~2 ms of CPU) and still tells an unchanged answer by identity. When the
        poller does it: ``numa_device_plugin.plugin.counts.poller.KEEP_CONNECTION_BELOW``."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        """Close the connection and forget the last answers (after an error: the next
        read may reach another kubelet)."""
        self._allocatable = self._last = None
        await self.disconnect()

    async def __aenter__(self) -> PodResourcesClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
