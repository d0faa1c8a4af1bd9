"""Registering a device plugin with the kubelet (``v1beta1.Registration/Register``).

The kubelet answers Register only after it has dialed the plugin's endpoint,
called ``GetDevicePluginOptions`` and started ``ListAndWatch``: the plugin's
server must already be serving, and the caller's event loop must stay free
while the call is in flight (this module never blocks it).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import unix_target

API_VERSION = "v1beta1"
# A private subchannel pool per channel: grpc would otherwise reuse a connection
# another channel holds to the same path, i.e. to an old kubelet (or plugin)
# whose socket file has since been replaced.
FRESH_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)
KUBELET_SOCKET_NAME = "kubelet.sock"


class RegistrationError(Exception):
    """Register failed. ``code`` is the gRPC status code (UNAVAILABLE when the kubelet
    is not listening, DEADLINE_EXCEEDED on timeout, UNKNOWN for a kubelet refusal)."""

    def __init__(self, resource_name: str, code: grpc.StatusCode, details: str) -> None:
        self.resource_name = resource_name
        self.code = code
        self.details = details
        super().__init__(f"registering {resource_name} failed: {code.name}: {details}")


def register_request(
    resource_name: str, endpoint: str, options: api_pb2.DevicePluginOptions
) -> api_pb2.RegisterRequest:
    """The RegisterRequest: version ``v1beta1``, ``endpoint`` = socket file name only."""
    return api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=options
    )


async def register(
    kubelet_socket: Path,
    request: api_pb2.RegisterRequest,
    *,
    timeout: float,
    connection: KubeletConnection | None = None,
) -> None:
    """Call Register on the kubelet at ``kubelet_socket``; ``timeout`` in seconds.

    Without ``connection`` dials the socket anew; with one, shares its channel with
    the other calls in flight for the same kubelet (see :class:`KubeletConnection`).
    Fails fast (UNAVAILABLE) when nothing listens.
    Raises :class:`RegistrationError`.
    """
    if connection is None:
        connection = KubeletConnection(kubelet_socket)
    async with connection.channel() as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(request.resource_name, exc.code(), exc.details() or "") from exc


class KubeletConnection:
    """One connection to one kubelet's ``kubelet.sock``, shared by the Register calls
    in flight on it and closed when the last of them ends.

    After a kubelet restart every resource registers at once: one connection instead
    of one per resource (8 NUMA nodes: 8 dials, 8 HTTP/2 handshakes). A call that
    fails marks the connection broken: calls starting after it dial anew (a channel
    that saw the socket refuse would wait out grpc's reconnect backoff, 1 s and up).
    A call cancelled (its endpoint stopped, e.g. for a new ``kubelet.sock``) is a
    failure too.
    """

    def __init__(self, kubelet_socket: Path) -> None:
        self._target = unix_target(kubelet_socket)
        self._current: _Lease | None = None

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[grpc.aio.Channel]:
        """The shared channel for one call; raises what the call raises."""
        lease = self._current
        if lease is None or lease.broken:
            lease = _Lease(grpc.aio.insecure_channel(self._target, options=FRESH_CONNECTION))
            self._current = lease
        lease.users += 1
        try:
            yield lease.channel
        except BaseException:
            lease.broken = True
            raise
        finally:
            lease.users -= 1
            if lease.users == 0:
                if self._current is lease:
                    self._current = None
                await lease.channel.close()


@dataclass
class _Lease:
    channel: grpc.aio.Channel
    users: int = 0
    broken: bool = False


@dataclass
class Backoff:
    """Jittered exponential backoff: delays in seconds from ``initial`` up to ``maximum``."""

    initial: float = 0.05
    maximum: float = 5.0
    attempts: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (2**self.attempts))
        self.attempts += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
