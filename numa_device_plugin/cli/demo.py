"""``numa-device-plugin demo``: the plugin on this machine's sysfs against an in-process
kubelet stand-in in a temp folder; prints what registered and one Allocate, then exits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import signal
import sys
import tempfile
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import click

from numa_device_plugin.cli import hostviews, options
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.nodeconfig.supervisor import ConfigSupervisor, Selector
from numa_device_plugin.ops.logs import configure_logging
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.memory import MEMORY, hugepages_type
from numa_device_plugin.topology.numa import NumaNode


@click.command(
    "demo",
    help="Run the plugin on this machine's sysfs against an in-process kubelet stand-in in "
    "a temp folder, print what registered and one Allocate, then exit (with --keep: add "
    "pods holding CPUs and memory, open the metrics listener and serve until Ctrl-C, for "
    "`status`, `health`, /metrics and the node page to look at).",
)
@options.apply(
    options.sysfs_root,
    options.resource_prefix,
    options.capacity_option,
    options.include_cpuless_nodes,
    options.memory_unit_option,
    options.any_resource,
    options.socket_resources,
    options.near_option,
    options.log_level,
    options.log_format,
    options.keep,
    options.demo_metrics_address,
    options.config_file,
    options.node_label,
    options.device_interval,
)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """0 after the Allocate; 1 when nothing can be advertised or serving failed; 2 (usage)
    when the metrics listener cannot listen."""
    from numa_device_plugin.cli.serve import ListenerError

    configure_logging(params["log_level"], params["log_format"])
    if params["node_label"] and params["config_file"] is None:
        raise click.BadParameter(
            "only applies with --config-file", ctx, param=options.param(ctx, "node_label")
        )
    hostviews.own_mount_table(ctx, params)
    try:
        return asyncio.run(_demo(ctx, params))
    except ListenerError as exc:
        raise click.BadParameter(str(exc), ctx, param=options.param(ctx, exc.option)) from None


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


async def _demo(ctx: click.Context, params: dict[str, Any]) -> int:
    with tempfile.TemporaryDirectory(prefix="ndp-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        base = {
            **params,
            "socket_dir": folder / "dp",
            "pod_resources_socket": folder / "pr" / "kubelet.sock",
        }
        config = options.config_from_params(base)
        # A kubelet with the static CPU manager policy that reserves no CPU, and the
        # Memory Manager's Static policy that hands out each NUMA node's memory.
        discovery = options.discover_or_usage(ctx, config)
        cpus = sorted({cpu for plan in discovery.plans for cpu in plan.node.cpus})
        memory = {plan.node.id: _allocatable_memory(plan.node) for plan in discovery.plans}
        standin = KubeletStandIn(
            config.socket_dir,
            pod_resources_dir=folder / "pr",
            allocatable_cpus=cpus,
            allocatable_memory={node: per_type for node, per_type in memory.items() if per_type},
        )
        select = None
        if params["config_file"] is not None:
            select = _label_selection(stack, params, base, folder)
        address = params["metrics_address"] if params["keep"] else ""
        async with standin as kubelet:
            recorder = None
            if address:
                from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder

                recorder = PrometheusRecorder()
            runner: PluginManager | ConfigSupervisor
            if select is None:
                # the first look is the one made above; later ones read the tree again
                # (--device-interval: a disk unmounted or moved shows without a cluster)
                looks = iter([discovery])

                def look(again: Config) -> Discovery:
                    return next(looks, None) or discover(again)

                runner = PluginManager(config, discover_fn=look, recorder=recorder)
            else:
                runner = ConfigSupervisor(
                    select, lambda chosen: PluginManager(chosen, recorder=recorder), 60.0
                )
            listeners = []
            if address:
                from numa_device_plugin.cli.serve import start_listeners

                assert recorder is not None
                listeners = await start_listeners(runner, address, "", recorder.render)
            serving = asyncio.create_task(runner.serve())
            try:
                chosen: list[PluginManager] = []
                if not await _until(serving, _started(runner, chosen)) or not chosen:
                    return 1
                manager = chosen[0]
                names = list(manager.resources)
                if not names:
                    print("no NUMA node can be advertised on this machine", file=sys.stderr)
                    return 1
                everyone_live = kubelet.wait_until(lambda: all(map(kubelet.live, names)))
                if not await _until(serving, everyone_live):
                    return 1
                if isinstance(runner, ConfigSupervisor) and runner.current is not None:
                    name = runner.current[0] or "(flags and variables)"
                    labels = ", ".join(f"{k}={v}" for k, v in params["node_label"])
                    if labels:
                        print(f"configuration {name}, chosen by the node's labels ({labels})")
                    else:
                        print(f"configuration {name}, the file's default (no --node-label)")
                _print_demo(kubelet, names, folder)
                # What serve only logs: a resource that follows a device but has none.
                shown = discovery if select is None else discover(manager.config)
                for plan in shown.near:
                    if plan.reason is not None:
                        print(f"  {plan.resource}: not advertised: {plan.reason}")
                near = [
                    name for name in names
                    if manager.resources[name].near is not None
                    and manager.resources[name].memory is None
                ]  # fmt: skip
                print()
                for name in [names[0], *near]:
                    device = kubelet.devices(name)[0].ID
                    response = await kubelet.allocate(name, [device])
                    envs = dict(response.container_responses[0].envs)
                    print(
                        f"Allocate({name}, [{device}]) -> envs {json.dumps(envs, sort_keys=True)}"
                    )
                if params["keep"]:
                    port = listeners[0].port if listeners else None
                    await _keep_serving(kubelet, manager.config, discovery, serving, port)
            finally:
                runner.stop()
                await asyncio.wait({serving})
                for listener in listeners:
                    await listener.stop()
    return 0


def _label_selection(
    stack: contextlib.ExitStack, params: dict[str, Any], base: dict[str, Any], folder: Path
) -> Selector:
    """Per-node configuration against a stand-in API server whose node ``demo-node``
    has the ``--node-label`` labels: the selection ``serve --config-file`` makes."""
    from numa_device_plugin.kubelet_standin.apiserver import node_api_standin
    from numa_device_plugin.nodeconfig.supervisor import label_selection

    labels = dict(params["node_label"])
    _, kubeconfig = stack.enter_context(node_api_standin("demo-node", labels, folder))
    return label_selection(params["config_file"], "demo-node", kubeconfig, base)


async def _started(runner: PluginManager | ConfigSupervisor, chosen: list[PluginManager]) -> None:
    """Until the plugin serves (put into ``chosen``), or per-node configuration says why
    nothing is served (printed; ``chosen`` stays empty)."""
    if isinstance(runner, PluginManager):
        await runner.started.wait()
        chosen.append(runner)
        return
    while True:
        if runner.problem is not None:
            print(runner.problem, file=sys.stderr)
            return
        if runner.manager is not None and runner.manager.started.is_set():
            chosen.append(runner.manager)
            return
        await asyncio.sleep(0.05)


def _allocatable_memory(node: NumaNode) -> dict[str, int]:
    """What the stand-in's Memory Manager hands out on ``node``: its MemTotal and its
    hugepage pools (bytes per memory type), as sysfs gives them."""
    per_type = {MEMORY: node.memory_bytes} if node.memory_bytes else {}
    per_type.update({hugepages_type(size): size * pages for size, pages in node.hugepages if pages})
    return per_type


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
    serving: asyncio.Task[None],
    port: int | None,
) -> None:
    """Put pods into the stand-in's pod resources API (:func:`_demo_pods`), say how to
    look, and serve until SIGINT or SIGTERM."""
    for namespace, pod, containers in _demo_pods(discovery, config):
        kubelet.add_pod(namespace, pod, containers)
    look = "  " + shlex.join([*command_prefix(), *status_argv(config)])
    if port is not None:
        look += (
            f"\n  {shlex.join(command_prefix())} health --address 127.0.0.1:{port}"
            f"\n  the node page: http://127.0.0.1:{port}/  (also /metrics, /debug/state)"
        )
    print(f"\nServing until Ctrl-C. In another terminal:\n{look}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await _until(serving, stop.wait())
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def status_argv(config: Config) -> list[str]:
    """``status`` and the flags that make it read what ``config`` serves: the folders,
    and every setting that shapes the resources (``--capacity``, ``--memory-unit``,
    ``--near``, ...), so that the printed command reports what the demo advertises."""
    from numa_device_plugin.plugin.model.names import DEFAULT_RESOURCE_PREFIX
    from numa_device_plugin.topology.memory import format_quantity
    from numa_device_plugin.topology.sysfs import format_cpulist

    argv = ["status", "--socket-dir", str(config.socket_dir),
            "--pod-resources-socket", str(config.pod_resources_socket),
            "--sysfs-root", str(config.sysfs_root), "--capacity", str(config.capacity)]  # fmt: skip
    if config.resource_prefix != DEFAULT_RESOURCE_PREFIX:
        argv += ["--resource-prefix", config.resource_prefix]
    if config.include_cpuless_nodes:
        argv.append("--include-cpuless-nodes")
    if config.reserved_cpus:
        argv += ["--reserved-cpus", format_cpulist(config.reserved_cpus)]
    if config.memory_unit is not None:
        argv += ["--memory-unit", format_quantity(config.memory_unit)]
    if config.any_resource != "auto":
        argv += ["--any-resource", config.any_resource]
    if config.socket_resources != "auto":
        argv += ["--socket-resources", config.socket_resources]
    if config.reserved_memory:
        entries = ";".join(
            f"{node}:{kind}={format_quantity(size)}" for node, kind, size in config.reserved_memory
        )
        argv += ["--reserved-memory", entries]
    for near in config.near:
        for flag in near.flags():
            argv += ["--near", flag]
    if config.near:  # the table its path: selectors read, the same as the demo's
        argv += ["--mount-table", str(config.mount_table)]
    return argv


def command_prefix() -> list[str]:
    """How to run this program again as it was run: ``numa-device-plugin`` when that is
    what PATH finds, else this interpreter with ``-m numa_device_plugin`` (after
    ``make run`` the command lives in ``.venv/bin``, not on PATH)."""
    import shutil
    import sys

    found = shutil.which("numa-device-plugin")
    ours = Path(sys.executable).parent / "numa-device-plugin"
    if found is not None and Path(found).resolve() == ours.resolve():
        return ["numa-device-plugin"]
    return [sys.executable, "-m", "numa_device_plugin"]


Container = tuple[str, dict[str, list[str]], list[int], list[tuple[str, int, list[int]]]]


def _demo_pods(discovery: Discovery, config: Config) -> list[tuple[str, str, list[Container]]]:
    """The pods the demo shows: per advertised NUMA node, ``demo/app-N`` holding one
    device of its resource and the node's first CPU exclusively, and with
    ``--memory-unit`` one memory device's worth of its memory; on the first NUMA node
    with two CPUs or more, ``other/db`` holding its last CPU without our resources
    (what a foreign exclusive pod looks like); per resource that follows a device,
    ``demo/<name>`` holding its first device and a free CPU of that device's NUMA node.
    The stand-in's Allocate is not asked:
    these are what the kubelet would list after admitting them."""
    pods: list[tuple[str, str, list[Container]]] = []
    foreign_done = False
    for plan in discovery.plans:
        if not plan.advertised or not plan.node.cpus:
            continue
        node = plan.node.id
        cpus = sorted(plan.node.cpus)
        devices: dict[str, list[str]] = {}
        blocks: list[tuple[str, int, list[int]]] = []
        for name, resource in discovery.resources.items():
            if resource.node_id != node or not resource.devices or not resource.node_own:
                continue
            if resource.memory is None:
                device = next(
                    (d for d in resource.devices if d.index == cpus[0]), resource.devices[0]
                )
                devices[name] = [device.id]
            elif resource.memory.memory_type == MEMORY:
                devices[name] = [resource.devices[0].id]
                blocks.append((MEMORY, resource.memory.unit, [node]))
        if not devices:
            continue
        pods.append(("demo", f"app-{node}", [("app", devices, cpus[:1], blocks)]))
        if not foreign_done and len(cpus) > 1:
            foreign_done = True
            pods.append(("other", "db", [("db", {}, cpus[-1:], [])]))
    taken = {cpu for _, _, containers in pods for c in containers for cpu in c[2]}
    for name, resource in discovery.resources.items():
        if resource.near is None or resource.memory is not None or not resource.devices:
            continue  # one pod per device followed (its memory resource: none of its own)
        device = resource.devices[0]
        free = [cpu for cpu in sorted(_node_cpus(discovery, device.node_id)) if cpu not in taken]
        taken.update(free[:1])
        pods.append(("demo", resource.near.name, [("app", {name: [device.id]}, free[:1], [])]))
    return pods


def _node_cpus(discovery: Discovery, node_id: int) -> frozenset[int]:
    return next((p.node.cpus for p in discovery.plans if p.node.id == node_id), frozenset())
