"""The least a Python device plugin can be, for :mod:`benchmarks.peer`'s ``--floor``: one
``grpc.aio`` server per resource that registers with the kubelet and sends one list of
healthy devices, and nothing else (no discovery, logging, metrics or probes; with
``--watch``, the least restart handling: serve and register again on a new
``kubelet.sock``; with ``--pod-resources``, the least reading: ``List`` every interval).
What ``numa-device-plugin serve`` costs beyond this is ours to cut; this much is
CPython's and grpcio's. With ``--libraries`` it also imports the libraries the plugin is
built on, when the plugin imports them: click and structlog (argument parsing, logging)
before registering, watchdog and prometheus-client (file watching, metrics) a quarter
of a second after. What ``serve`` costs beyond that is its own code.

Usage: python -m benchmarks.floor [--watch] [--libraries] [--pod-resources SOCKET [--interval
S]] SOCKET_DIR RESOURCE... (100 devices each)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2

DEVICES = 100
# Register calls per server at most, and seconds between them, while kubelet.sock refuses.
REGISTER_ATTEMPTS = 1000
REGISTER_RETRY = 0.01
# How the benchmarks name this plugin in their tables.
FLOOR = "floor (empty grpc.aio plugin)"
LIBRARY_FLOOR = "floor + the libraries"
# What --libraries imports before registering and after (as serve does).
LIBRARIES_FIRST = ("click", "structlog")
LIBRARIES_AFTER = ("watchdog.observers", "prometheus_client")
AFTER_REGISTERING = 0.25  # seconds, as serve's (plugin.lifecycle.watches, plugin.reports.deferred)


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
        request = api_pb2.RegisterRequest(version="v1beta1", endpoint=endpoint,
                                          resource_name=resource)  # fmt: skip
        for attempt in range(REGISTER_ATTEMPTS):
            try:
                async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as ch:
                    await api_pb2_grpc.RegistrationStub(ch).Register(request)
                break
            except grpc.aio.AioRpcError as exc:
                # kubelet.sock refused: it exists a moment before its kubelet listens, and
                # a restarting kubelet's old one a moment after it stopped (CI: the floor
                # exited, and the re-registration benchmark with it). As any plugin must,
                # try again; a new channel each time (a channel's own backoff is 1 s).
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == REGISTER_ATTEMPTS:
                    raise
                await asyncio.sleep(REGISTER_RETRY)
        return server

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(resources))))


async def read_pod_resources(socket: Path, interval: float) -> None:
    """``List`` of the pod resources API every ``interval`` seconds over one channel,
    the answer kept as bytes (what the plugin does with an answer that did not change);
    until cancelled."""
    channel = grpc.aio.insecure_channel(f"unix://{socket}")
    serializer = pr_pb2.ListPodResourcesRequest.SerializeToString
    call: grpc.aio.UnaryUnaryMultiCallable[Any, bytes] = channel.unary_unary(
        "/v1.PodResourcesLister/List", request_serializer=serializer
    )
    last = b""
    try:
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await call(pr_pb2.ListPodResourcesRequest(), timeout=5.0)
                if answer != last:
                    last = answer
            await asyncio.sleep(interval)
    finally:
        await channel.close()


async def main(
    socket_dir: Path,
    resources: list[str],
    watch: bool = False,
    pod_resources: Path | None = None,
    interval: float = 5.0,
    libraries: bool = False,
) -> None:
    """Serve and register ``resources``; with ``watch`` also again whenever a new
    ``kubelet.sock`` appears (a kubelet restart: inotify through watchdog, as the
    plugin's own watch), the old servers stopped first; with ``pod_resources`` (its
    socket) also read it every ``interval`` seconds; with ``libraries`` the plugin's
    libraries imported (:data:`LIBRARIES_FIRST` before, :data:`LIBRARIES_AFTER` once
    registered). Until SIGTERM."""
    if libraries:
        for name in LIBRARIES_FIRST:
            importlib.import_module(name)
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
    if libraries:
        await asyncio.sleep(AFTER_REGISTERING)  # the lists go out first, as serve's do
        for name in LIBRARIES_AFTER:
            importlib.import_module(name)
    reader = None
    if pod_resources is not None:
        reader = asyncio.create_task(read_pod_resources(pod_resources, interval))
    stopping = asyncio.ensure_future(stop.wait())
    while not stop.is_set():
        waking = asyncio.ensure_future(restarted.wait())
        await asyncio.wait([stopping, waking], return_when=asyncio.FIRST_COMPLETED)
        waking.cancel()
        if restarted.is_set() and not stop.is_set():
            restarted.clear()
            await asyncio.gather(*(server.stop(0) for server in servers))
            servers = await serve(socket_dir, resources)
    if reader is not None:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    if observer is not None:
        observer.stop()
    await asyncio.gather(*(server.stop(0) for server in servers))


if __name__ == "__main__":
    PARSER = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    PARSER.add_argument("--watch", action="store_true", help="register again on a new kubelet")
    PARSER.add_argument("--pod-resources", type=Path, help="the pod resources API socket to read")
    PARSER.add_argument("--interval", type=float, default=5.0, help="seconds between reads")
    PARSER.add_argument("--libraries", action="store_true", help="import the plugin's libraries")
    PARSER.add_argument("socket_dir", type=Path)
    PARSER.add_argument("resources", nargs="+")
    ARGS = PARSER.parse_args()
    asyncio.run(main(ARGS.socket_dir, ARGS.resources, ARGS.watch, ARGS.pod_resources,
                     ARGS.interval, ARGS.libraries))  # fmt: skip


def argv(
    socket_dir: Path,
    resources: list[str],
    python: str = sys.executable,
    *,
    watch: bool = False,
    pod_resources: Path | None = None,
    interval: float = 5.0,
    libraries: bool = False,
) -> list[str]:
    """The floor plugin's command line for :mod:`benchmarks.peer` and :mod:`benchmarks.bench`
    (run from the repository's folder: ``benchmarks`` is not installed)."""
    flags = ["--watch"] if watch else []
    flags += ["--libraries"] if libraries else []
    if pod_resources is not None:
        flags += ["--pod-resources", str(pod_resources), "--interval", str(interval)]
    return [python, "-m", "benchmarks.floor", *flags, str(socket_dir), *resources]
