"""Registering a device plugin with the kubelet (``v1beta1.Registration/Register``).

The kubelet answers Register only after it has dialed the plugin's endpoint,
called ``GetDevicePluginOptions`` and started ``ListAndWatch``: the plugin's
server must already be serving, and the caller's event loop must stay free
while the call is in flight (this module never blocks it).
"""

from __future__ import annotations

import random
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
) -> None:
    """Call Register on the kubelet at ``kubelet_socket``; ``timeout`` in seconds.

    Always dials the socket anew. Fails fast (UNAVAILABLE) when nothing listens.
    Raises :class:`RegistrationError`.
    """
    target = unix_target(kubelet_socket)
    async with grpc.aio.insecure_channel(target, options=FRESH_CONNECTION) as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(request.resource_name, exc.code(), exc.details() or "") from exc


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
