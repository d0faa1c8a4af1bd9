"""The least a Python device plugin can be, for :mod:`benchmarks.peer`'s ``--floor``: one
``grpc.aio`` server per resource that registers with the kubelet and sends one list of
healthy devices, and nothing else (no discovery, logging, metrics or probes; with
``--watch``, the least restart handling: serve and register again on a new
``kubelet.sock``). What ``numa-device-plugin serve`` costs beyond this is ours to cut; this
much is CPython's and grpcio's.

Usage: python -m benchmarks.floor [--watch] SOCKET_DIR RESOURCE... (100 devices each)
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


async def serve(socket_dir: Path, resources: list[str]) -> list[grpc.aio.Server]:
    """A server per resource, all at once, each registered as soon as it listens."""

    async def one(index: int, resource: str) -> grpc.aio.Server:
        endpoint = f"floor-{index}.sock"
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(Servicer(), server)
        server.add_insecure_port(f"unix://{socket_dir / endpoint}")
        await server.start()
        async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
                version="v1beta1", endpoint=endpoint, resource_name=resource))  # fmt: skip
        return server

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(resources))))


async def main(socket_dir: Path, resources: list[str], watch: bool = False) -> None:
    """Serve and register ``resources``; with ``watch`` also again whenever a new
    ``kubelet.sock`` appears (a kubelet restart: inotify through watchdog, as the
    plugin's own watch), the old servers stopped first. Until SIGTERM."""
    loop = asyncio.get_running_loop()
    stop, restarted = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    observer = None
    if watch:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        class Handler(FileSystemEventHandler):
            def on_created(self, event: FileSystemEvent) -> None:
                if Path(str(event.src_path)).name == "kubelet.sock":
                    loop.call_soon_threadsafe(restarted.set)

        observer = Observer()
        observer.schedule(Handler(), str(socket_dir))
        observer.start()
    servers = await serve(socket_dir, resources)
    stopping = asyncio.ensure_future(stop.wait())
    while not stop.is_set():
        waking = asyncio.ensure_future(restarted.wait())
        await asyncio.wait([stopping, waking], return_when=asyncio.FIRST_COMPLETED)
        waking.cancel()
        if restarted.is_set() and not stop.is_set():
            restarted.clear()
            await asyncio.gather(*(server.stop(0) for server in servers))
            servers = await serve(socket_dir, resources)
    if observer is not None:
        observer.stop()
    await asyncio.gather(*(server.stop(0) for server in servers))


if __name__ == "__main__":
    WATCH = sys.argv[1] == "--watch"
    ARGS = sys.argv[2:] if WATCH else sys.argv[1:]
    asyncio.run(main(Path(ARGS[0]), ARGS[1:], WATCH))


def argv(
    socket_dir: Path, resources: list[str], python: str = sys.executable, watch: bool = False
) -> list[str]:
    """The floor plugin's command line for :mod:`benchmarks.peer` and the re-registration
    benchmark (run from the repository's folder: ``benchmarks`` is not installed)."""
    return [python, "-m", "benchmarks.floor", *(["--watch"] if watch else []), str(socket_dir),
            *resources]  # fmt: skip
