"""``numa-device-plugin demo``: the plugin on this machine's sysfs against an in-process
kubelet stand-in in a temp folder; prints what registered and one Allocate, then exits."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import click

from numa_device_plugin.cli import options
from numa_device_plugin.config import Config
from numa_device_plugin.discovery import Discovery, discover
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.logs import configure_logging
from numa_device_plugin.manager import PluginManager


@click.command(
    "demo",
    help="Run the plugin on this machine's sysfs against an in-process kubelet stand-in in "
    "a temp folder, print what registered and one Allocate, then exit (with --keep: serve "
    "until Ctrl-C, for `status` and `health` to look at).",
)
@options.apply(
    options.sysfs_root,
    options.resource_prefix,
    options.capacity_option,
    options.include_cpuless_nodes,
    options.log_level,
    options.log_format,
    options.keep,
)
def command(**params: Any) -> int:
    """0 after the Allocate; 1 when nothing can be advertised or serving failed."""
    configure_logging(params["log_level"], params["log_format"])
    return asyncio.run(_demo(params))


async def _until(serving: asyncio.Task[None], awaitable: Awaitable[Any]) -> bool:
    """Wait for ``awaitable`` unless ``serving`` ends first; False (and its error raised) then."""
    waiting = asyncio.ensure_future(awaitable)
    await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        serving.result()  # raises what made serve() fail
        return False
    waiting.result()
    return True


async def _demo(params: dict[str, Any]) -> int:
    with tempfile.TemporaryDirectory(prefix="ndp-") as tmp:
        folder = Path(tmp)
        config = Config(
            sysfs_root=params["sysfs_root"],
            socket_dir=folder / "dp",
            resource_prefix=params["resource_prefix"],
            capacity=params["capacity"],
            include_cpuless_nodes=params["include_cpuless_nodes"],
            pod_resources_socket=folder / "pr" / "kubelet.sock",
        )
        # A kubelet with the static CPU manager policy that reserves no CPU.
        discovery = discover(config)
        cpus = sorted({cpu for plan in discovery.plans for cpu in plan.node.cpus})
        standin = KubeletStandIn(
            config.socket_dir, pod_resources_dir=folder / "pr", allocatable_cpus=cpus
        )
        async with standin as kubelet:
            manager = PluginManager(config, discover_fn=lambda _: discovery)  # read sysfs once
            serving = asyncio.create_task(manager.serve())
            try:
                if not await _until(serving, manager.started.wait()):
                    return 1
                names = list(manager.resources)
                if not names:
                    print("no NUMA node can be advertised on this machine", file=sys.stderr)
                    return 1
                everyone_live = kubelet.wait_until(lambda: all(map(kubelet.live, names)))
                if not await _until(serving, everyone_live):
                    return 1
                _print_demo(kubelet, names, folder)
                first = names[0]
                device = kubelet.devices(first)[0].ID
                response = await kubelet.allocate(first, [device])
                envs = dict(response.container_responses[0].envs)
                print(f"\nAllocate({first}, [{device}]) -> envs {json.dumps(envs)}")
                if params["keep"]:
                    await _keep_serving(kubelet, config, discovery, first, device, serving)
            finally:
                manager.stop()
                await asyncio.wait({serving})
    return 0


def _print_demo(kubelet: KubeletStandIn, names: Sequence[str], folder: Path) -> None:
    print(f"kubelet stand-in in {folder}: {len(names)} resource(s) registered")
    for name in names:
        devices = kubelet.devices(name)
        nodes = sorted({n.ID for d in devices for n in d.topology.nodes})
        healthy = sum(1 for d in devices if d.health == "Healthy")
        shown = ", ".join(d.ID for d in devices[:3]) + (", ..." if len(devices) > 3 else "")
        print(
            f"  {name}: {len(devices)} devices ({healthy} Healthy), "
            f"TopologyInfo NUMA node(s) {nodes}; allocatable {kubelet.allocatable(name)}"
        )
        print(f"    ids: {shown}")


async def _keep_serving(
    kubelet: KubeletStandIn,
    config: Config,
    discovery: Discovery,
    name: str,
    device: str,
    serving: asyncio.Task[None],
) -> None:
    """Show the Allocate's container in the stand-in's pod resources API (with the first
    CPU of its NUMA node), say how to look, and serve until SIGINT or SIGTERM."""
    node = discovery.resources[name].node_id
    cpus = sorted(next(p.node.cpus for p in discovery.plans if p.node.id == node))
    kubelet.add_pod("demo", "demo", [("app", {name: [device]}, cpus[:1])])
    print(
        "\nServing until Ctrl-C. In another terminal:\n"
        f"  numa-device-plugin status --socket-dir {config.socket_dir} "
        f"--pod-resources-socket {config.pod_resources_socket} --sysfs-root {config.sysfs_root}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await _until(serving, stop.wait())
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
