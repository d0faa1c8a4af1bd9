"""The ``numa-device-plugin`` command line: ``serve``, ``discover``, ``demo``.

Every flag can also be set by an environment variable (listed by ``--help``);
a flag on the command line wins. A bad value, from either, exits 2 with usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from numa_device_plugin import __version__, sysfs
from numa_device_plugin.config import Config, check_socket_dir, detect_socket_dir
from numa_device_plugin.devices import (
    CPUS,
    DEFAULT_CAPACITY,
    DEFAULT_RESOURCE_PREFIX,
    Capacity,
    validate_capacity,
    validate_resource_prefix,
)
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.logs import LEVELS, configure_logging
from numa_device_plugin.manager import Discovery, PluginManager, discover
from numa_device_plugin.memory import limit_malloc_arenas
from numa_device_plugin.server import SocketPathError

log = structlog.get_logger(__name__)

ENV_PREFIX = "NUMA_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


# -- value types (argparse turns ValueError/ArgumentTypeError into exit 2 with usage) ------------


def _capacity(text: str) -> Capacity:
    if text.strip().lower() == CPUS:
        return CPUS
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or {CPUS!r}") from None
    try:
        return validate_capacity(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _prefix(text: str) -> str:
    try:
        return validate_resource_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or a positive number of seconds")
    return value


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (use true/false, 1/0)")


def _address(text: str) -> str:
    from numa_device_plugin.probes import parse_address

    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _cpulist(text: str) -> frozenset[int]:
    try:
        return sysfs.parse_cpulist(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a cpulist like 0-1,8: {exc}") from None


def _folder(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


@dataclass(frozen=True)
class _Option:
    flag: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    switch: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").replace("-", "_").upper()

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


OPTIONS = {
    option.dest: option
    for option in (
        _Option(
            "--sysfs-root", "sysfs root holding devices/system", _folder, Path("/sys"), None, "DIR"
        ),
        _Option(
            "--socket-dir",
            "the kubelet's device-plugin folder (default: the first of the standard, k0s and "
            "microk8s folders that holds kubelet.sock, else /var/lib/kubelet/device-plugins)",
            _folder,
            None,
            None,
            "DIR",
        ),
        _Option(
            "--resource-prefix",
            "domain of the resource names: <prefix>/numa-<id>",
            _prefix,
            DEFAULT_RESOURCE_PREFIX,
            None,
            "DOMAIN",
        ),
        _Option(
            "--capacity",
            "slot devices per NUMA node, or 'cpus': one device per exclusive CPU the NUMA "
            "node can still hand out (live, from the pod resources API)",
            _capacity,
            DEFAULT_CAPACITY,
            None,
            "N|cpus",
        ),
        _Option(
            "--include-cpuless-nodes",
            "also advertise NUMA nodes without a usable CPU (memory-only nodes)",
            _boolean,
            False,
            switch=True,
        ),
        _Option(
            "--register-timeout", "seconds one Register call may take", _seconds, 5.0, None, "S"
        ),
        _Option(
            "--shutdown-grace",
            "seconds in-flight calls get at shutdown (0: cancel them at once)",
            _grace,
            1.0,
            None,
            "S",
        ),
        _Option("--log-level", "log level", str, "info", LEVELS),
        _Option("--log-format", "log format", str, "text", ("text", "json")),
        _Option("--output", "output format", str, "table", ("table", "json")),
        _Option(
            "--metrics-address",
            "serve /metrics (and /healthz, /readyz) on HOST:PORT or :PORT; off when empty",
            _address,
            "",
            None,
            "ADDR",
        ),
        _Option(
            "--health-address",
            "serve /healthz and /readyz alone on HOST:PORT or :PORT",
            _address,
            "",
            None,
            "ADDR",
        ),
        _Option(
            "--address",
            "the plugin's health listener to ask",
            _address,
            "127.0.0.1:9201",
            None,
            "ADDR",
        ),
        _Option("--check", "which probe", str, "readyz", ("readyz", "healthz")),
        _Option(
            "--pod-resources-socket",
            "the kubelet's pod resources API socket (default: pod-resources/kubelet.sock "
            "beside the device-plugin folder)",
            _folder,
            None,
            None,
            "PATH",
        ),
        _Option(
            "--pod-resources-interval",
            "seconds between reads of the pod resources API",
            _seconds,
            5.0,
            None,
            "S",
        ),
        _Option(
            "--reserved-cpus",
            "with --capacity cpus: the kubelet's reserved CPUs (cpulist), used while the "
            "pod resources API cannot be read",
            _cpulist,
            frozenset(),
            None,
            "LIST",
        ),
        _Option(
            "--allow-unaligned",
            "keep devices Healthy on a kubelet whose CPU manager policy is not static",
            _boolean,
            False,
            switch=True,
        ),
    )
}

SERVE_OPTIONS = (
    "sysfs_root",
    "socket_dir",
    "resource_prefix",
    "capacity",
    "include_cpuless_nodes",
    "register_timeout",
    "shutdown_grace",
    "log_level",
    "log_format",
    "metrics_address",
    "health_address",
    "pod_resources_socket",
    "pod_resources_interval",
    "reserved_cpus",
    "allow_unaligned",
)
HEALTH_OPTIONS = ("address", "check", "log_level")
STATUS_OPTIONS = (
    "pod_resources_socket",
    "socket_dir",
    "reserved_cpus",
    "sysfs_root",
    "resource_prefix",
    "capacity",
    "include_cpuless_nodes",
    "output",
    "log_level",
)
DISCOVER_OPTIONS = ("sysfs_root", "resource_prefix", "include_cpuless_nodes", "output", "log_level")
DEMO_OPTIONS = (
    "sysfs_root",
    "resource_prefix",
    "capacity",
    "include_cpuless_nodes",
    "log_level",
    "log_format",
)


def _add_options(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    for name in names:
        option = OPTIONS[name]
        shown = "auto" if option.default is None else option.default
        help_text = f"{option.help} (env {option.env}; default {shown})"
        if option.switch:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                nargs="?",
                const=True,
                default=None,
                type=option.type,
                metavar="BOOL",
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                default=None,
                type=option.type,
                choices=option.choices,
                metavar=option.metavar,
                help=help_text,
            )


def _resolve_env(
    parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]
) -> None:
    """Fill each option not given on the command line from its env var, else its default."""
    for name in names:
        option = OPTIONS[name]
        if getattr(args, name) is not None:
            continue
        raw = os.environ.get(option.env)
        if raw is None:
            setattr(args, name, option.default)
            continue
        try:
            value = option.type(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.error(f"environment variable {option.env}={raw!r}: {exc}")
        if option.choices is not None and value not in option.choices:
            parser.error(
                f"environment variable {option.env}={raw!r}: "
                f"choose from {', '.join(option.choices)}"
            )
        setattr(args, name, value)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and the subcommand parsers by name."""
    parser = argparse.ArgumentParser(
        prog="numa-device-plugin",
        description="Kubernetes device plugin advertising one extended resource per NUMA node.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands = {
        "serve": (
            "run the device plugin daemon against the kubelet",
            SERVE_OPTIONS,
        ),
        "discover": (
            "print the NUMA nodes and the resources that would be advertised",
            DISCOVER_OPTIONS,
        ),
        "demo": (
            "run the plugin on this machine's sysfs against an in-process kubelet stand-in "
            "in a temp folder, print what registered and one Allocate, then exit",
            DEMO_OPTIONS,
        ),
        "status": (
            "show, per NUMA node, capacity, allocatable, allocated and the containers holding "
            "it (from the kubelet's pod resources API), flagging misaligned CPUs",
            STATUS_OPTIONS,
        ),
        "health": (
            "ask a running plugin's /readyz (or /healthz); exit 0 when it answers 200, else 1",
            HEALTH_OPTIONS,
        ),
    }
    parsers = {}
    for name, (help_text, names) in commands.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        _add_options(child, names)
        child.set_defaults(_options=names)
        parsers[name] = child
    return parser, parsers


def config_from_args(args: argparse.Namespace) -> Config:
    """The frozen :class:`Config` for resolved ``serve``/``demo`` arguments."""
    socket_dir = getattr(args, "socket_dir", None) or detect_socket_dir()
    values: dict[str, Any] = {
        "sysfs_root": args.sysfs_root,
        "socket_dir": socket_dir,
        "resource_prefix": args.resource_prefix,
        "capacity": getattr(args, "capacity", DEFAULT_CAPACITY),
        "include_cpuless_nodes": args.include_cpuless_nodes,
    }
    for name in (
        "register_timeout",
        "shutdown_grace",
        "pod_resources_socket",
        "pod_resources_interval",
        "reserved_cpus",
        "allow_unaligned",
    ):
        if hasattr(args, name):
            values[name] = getattr(args, name)
    return Config(**values)


# -- discover --------------------------------------------------------------------------------


def discovery_json(discovery: Discovery) -> dict[str, Any]:
    """The ``discover --output json`` document: nodes sorted by id, then resource names."""
    nodes = []
    for plan in sorted(discovery.plans, key=lambda plan: plan.node.id):
        node = plan.node
        nodes.append(
            {
                "id": node.id,
                "cpus": sysfs.format_cpulist(node.cpus),
                "memory_bytes": node.memory_bytes,
                "distances": None
                if node.distances is None
                else {str(other): value for other, value in sorted(node.distances.items())},
                "advertised": plan.advertised,
                "reason": plan.reason,
            }
        )
    return {"nodes": nodes, "resources": list(discovery.resources)}


def _discovery_table(document: dict[str, Any]) -> str:
    header = ("NODE", "CPUS", "MEMORY_BYTES", "DISTANCES", "ADVERTISED", "REASON")
    rows = [header]
    for node in document["nodes"]:
        distances = ",".join(f"{k}:{v}" for k, v in (node["distances"] or {}).items()) or "-"
        memory = "-" if node["memory_bytes"] is None else str(node["memory_bytes"])
        rows.append(
            (
                str(node["id"]),
                node["cpus"] or "-",
                memory,
                distances,
                "yes" if node["advertised"] else "no",
                node["reason"] or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    lines.append("")
    lines.append("resources: " + (", ".join(document["resources"]) or "(none)"))
    return "\n".join(lines)


def _run_discover(args: argparse.Namespace) -> int:
    config = Config(
        sysfs_root=args.sysfs_root,
        resource_prefix=args.resource_prefix,
        include_cpuless_nodes=args.include_cpuless_nodes,
    )
    document = discovery_json(discover(config))
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        print(_discovery_table(document))
    return 0


# -- serve -----------------------------------------------------------------------------------


async def _serve(config: Config, metrics_address: str, health_address: str) -> int:
    loop = asyncio.get_running_loop()
    recorder = None
    render = None
    if metrics_address:
        from numa_device_plugin.metrics import PrometheusRecorder

        recorder = PrometheusRecorder()
        render = recorder.render
    manager = PluginManager(config, recorder=recorder)
    probes = _probe_servers(manager, loop, metrics_address, health_address, render)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, manager.stop)
    loop.add_signal_handler(signal.SIGHUP, manager.reload)
    try:
        for server in probes:
            server.start()
        await manager.serve()
    finally:
        for server in probes:
            server.stop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
    return 0


def _probe_servers(
    manager: PluginManager,
    loop: asyncio.AbstractEventLoop,
    metrics_address: str,
    health_address: str,
    render: Callable[[], bytes] | None,
) -> list[Any]:
    """The HTTP listeners asked for: metrics (with health unless it has its own) and health."""
    if not metrics_address and not health_address:
        return []
    from numa_device_plugin.probes import ProbeServer, parse_address

    servers = []
    if metrics_address:
        servers.append(
            ProbeServer(
                parse_address(metrics_address),
                loop,
                manager.readiness_problems,
                render,
                health=not health_address,
            )
        )
    if health_address:
        servers.append(
            ProbeServer(parse_address(health_address), loop, manager.readiness_problems, None)
        )
    return servers


def _run_status(args: argparse.Namespace) -> int:
    from numa_device_plugin.podresources import PodResourcesError, fetch
    from numa_device_plugin.status import build_status, render_table

    config = config_from_args(args)
    discovery = discover(config)
    try:
        pods, allocatable = asyncio.run(fetch(config.pod_resources_path))
    except PodResourcesError as exc:
        print(f"numa-device-plugin: {exc}", file=sys.stderr)
        return 1
    document = build_status(discovery, config, pods, allocatable)
    print(json.dumps(document, indent=2) if args.output == "json" else render_table(document))
    return 0


def _run_health(args: argparse.Namespace) -> int:
    """GET /readyz (or /healthz) of a running plugin; 0 on 200, 1 otherwise."""
    import urllib.error
    import urllib.request

    from numa_device_plugin.probes import parse_address

    host, port = parse_address(args.address)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"http://{host}:{port}/{args.check}"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            print(response.read().decode().strip())
            return 0
    except urllib.error.HTTPError as exc:
        print(exc.read().decode().strip() or f"{url}: HTTP {exc.code}", file=sys.stderr)
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
    return 1


# -- demo ------------------------------------------------------------------------------------


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


async def _demo(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ndp-") as tmp:
        folder = Path(tmp)
        config = Config(
            sysfs_root=args.sysfs_root,
            socket_dir=folder / "dp",
            resource_prefix=args.resource_prefix,
            capacity=args.capacity,
            include_cpuless_nodes=args.include_cpuless_nodes,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``numa-device-plugin``; returns the exit status (2 for bad usage)."""
    parser, parsers = build_parser()
    args, extra = parser.parse_known_args(argv)
    child = parsers[args.command]
    if extra:
        child.error(f"unrecognized arguments: {' '.join(extra)}")
    _resolve_env(child, args, args._options)
    configure_logging(args.log_level, getattr(args, "log_format", "text"))
    if args.command == "health":
        return _run_health(args)
    try:
        if args.command == "discover":
            return _run_discover(args)
        if args.command == "status":
            try:
                return _run_status(args)
            except ValueError as exc:
                child.error(str(exc))
        try:
            config = config_from_args(args)
        except ValueError as exc:
            child.error(str(exc))
        if args.command == "serve":
            limit_malloc_arenas()
            try:
                check_socket_dir(config.socket_dir)
            except ValueError as exc:
                child.error(f"argument --socket-dir ({OPTIONS['socket_dir'].env}): {exc}")
            try:
                return asyncio.run(_serve(config, args.metrics_address, args.health_address))
            except SocketPathError as exc:
                child.error(f"argument --socket-dir/--resource-prefix: {exc}")
        return asyncio.run(_demo(args))
    except (sysfs.SysfsError, OSError) as exc:
        # SysfsError: discovery failed (the message names the file and content);
        # OSError: e.g. the device-plugin folder cannot be created or watched.
        print(f"numa-device-plugin: {exc}", file=sys.stderr)
        return 1
