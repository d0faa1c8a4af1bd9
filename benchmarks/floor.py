"""The least a Python device plugin can be, for :mod:`benchmarks.peer`'s ``--floor``: one
``grpc.aio`` server per resource that registers with the kubelet and sends one list of
healthy devices, and nothing else (no discovery, logging, metrics, probes, watch or
restart handling). What ``numa-device-plugin serve`` costs beyond this is ours to cut;
this much is CPython's and grpcio's.

Usage: python -m benchmarks.floor SOCKET_DIR RESOURCE... (100 devices each)
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

DEVICES = 100


class Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Options, one list, and Allocate answering with nothing."""

    def __init__(self) -> None:
        self.devices = [api_pb2.Device(ID=f"d{i}", health="Healthy") for i in range(DEVICES)]

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: object
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: object
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        yield api_pb2.ListAndWatchResponse(devices=self.devices)
        await asyncio.Event().wait()

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: object
    ) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse() for _ in request.container_requests])  # fmt: skip


async def main(socket_dir: Path, resources: list[str]) -> None:
    servers = []
    for index, resource in enumerate(resources):
        endpoint = f"floor-{index}.sock"
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(Servicer(), server)
        server.add_insecure_port(f"unix://{socket_dir / endpoint}")
        await server.start()
        servers.append(server)
        async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
                version="v1beta1", endpoint=endpoint, resource_name=resource))  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2:]))


def argv(socket_dir: Path, resources: list[str], python: str = sys.executable) -> list[str]:
    """The floor plugin's command line for :mod:`benchmarks.peer` (run from the
    repository's folder: ``benchmarks`` is not installed)."""
    return [python, "-m", "benchmarks.floor", str(socket_dir), *resources]
