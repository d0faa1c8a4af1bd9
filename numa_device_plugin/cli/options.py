"""The command line's options, shared by the commands: each a click option with its
environment variable (``NUMA_`` + the flag in upper case), shown by ``--help``.

A flag on the command line beats its variable, the variable beats the default. A bad
value, from either, is a :class:`click.BadParameter`: exit 2 with the command's usage,
naming the flag and, when the value came from there, the variable. A variable set but
empty is such an error too (it would otherwise silently mean the default), except for
the listener addresses, where empty means off as documented.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from numa_device_plugin.cli.paramtypes import MAX_ERROR as MAX_ERROR
from numa_device_plugin.cli.paramtypes import Converted as Converted
from numa_device_plugin.cli.paramtypes import Option as Option
from numa_device_plugin.cli.paramtypes import Switch as Switch
from numa_device_plugin.ops.logs import LEVELS
from numa_device_plugin.plugin.model.names import DEFAULT_RESOURCE_PREFIX, validate_resource_prefix
from numa_device_plugin.plugin.model.near import merge_near, parse_near
from numa_device_plugin.plugin.model.resources import DEFAULT_CAPACITY
from numa_device_plugin.plugin.settings.config import config_default
from numa_device_plugin.plugin.settings.config import config_from_params as config_from_params

if TYPE_CHECKING:
    from numa_device_plugin.plugin.advertised.discovery import Discovery
    from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.plugin.settings.values import (
    ANY_RESOURCE_VALUES,
    MIN_DEVICE_INTERVAL,
    MIN_INTERVAL,
    address,
    capacity,
    cpulist,
    existing_folder,
    file_path,
    folder,
    grace,
    interval,
    listener,
    memory_unit,
    node_name,
    reserved_memory,
    seconds,
)
from numa_device_plugin.plugin.settings.values import device_interval as device_interval_value

ENV_PREFIX = "NUMA_"


def param(ctx: click.Context, name: str) -> click.Parameter:
    """The command's parameter named ``name`` (for errors found after parsing)."""
    return next(p for p in ctx.command.params if p.name == name)


def discover_or_usage(ctx: click.Context, config: Config) -> Discovery:
    """:func:`~numa_device_plugin.plugin.advertised.discovery.discover` for a command: a
    ``--memory-unit`` that makes too many devices is a usage error naming the flag
    (exit 2), as ``serve`` gives it, never a traceback."""
    from numa_device_plugin.plugin.advertised.discovery import discover
    from numa_device_plugin.topology.memory import MemoryUnitError

    try:
        return discover(config)
    except MemoryUnitError as exc:
        raise click.BadParameter(str(exc), ctx, param=param(ctx, "memory_unit")) from None


def variable(flag: str) -> str:
    """The environment variable of ``flag``: ``--log-level`` -> ``NUMA_LOG_LEVEL``."""
    return ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()


def _option(
    flag: str,
    help: str,
    convert: Callable[[str], Any] | click.ParamType[Any],
    default: Any,
    metavar: str | None = None,
    *,
    shown: str | None = None,
    allow_empty: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    kind = convert if isinstance(convert, click.ParamType) else Converted(metavar or "", convert)
    return click.option(
        flag,
        cls=Option,
        allow_empty=allow_empty,
        type=kind,
        default=default,
        envvar=variable(flag),
        show_envvar=True,
        show_default=shown if shown is not None else True,
        metavar=metavar,
        help=help,
    )


def _switch(flag: str, help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An on/off option: ``--x`` / ``--no-x`` (the flag beats a variable set either way)."""
    return click.option(
        f"{flag}/--no-{flag.removeprefix('--')}",
        cls=Option,
        is_flag=True,
        default=False,
        envvar=variable(flag),
        show_envvar=True,
        help=help + " (variable: true/false, 1/0, yes/no, on/off)",
    )


sysfs_root = _option(
    "--sysfs-root",
    "sysfs root holding devices/system",
    existing_folder,
    config_default("sysfs_root"),
    "DIR",
)
socket_dir = _option(
    "--socket-dir",
    "the kubelet's device-plugin folder (auto: the first of the standard, k0s and "
    "microk8s folders that holds kubelet.sock, else /var/lib/kubelet/device-plugins)",
    folder,
    None,
    "DIR",
    shown="auto",
)
resource_prefix = _option(
    "--resource-prefix",
    "domain of the resource names: <prefix>/numa-<id>",
    validate_resource_prefix,
    DEFAULT_RESOURCE_PREFIX,
    "DOMAIN",
)
capacity_option = _option(
    "--capacity",
    "slot devices per NUMA node, or 'cpus': one device per exclusive CPU the NUMA node "
    "can still hand out (live, from the pod resources API)",
    capacity,
    DEFAULT_CAPACITY,
    "N|cpus",
)
include_cpuless_nodes = _switch(
    "--include-cpuless-nodes", "also advertise NUMA nodes without a usable CPU (memory-only)"
)
register_timeout = _option(
    "--register-timeout",
    "seconds one Register call may take; above the kubelet's 10 s dial back to the plugin "
    "inside Register, so a Register the kubelet is still working on is not sent again",
    seconds,
    config_default("register_timeout"),
    "S",
)
shutdown_grace = _option(
    "--shutdown-grace",
    "seconds in-flight calls get at shutdown (0: cancel them at once)",
    grace,
    config_default("shutdown_grace"),
    "S",
)
log_level = _option("--log-level", "log level", click.Choice(LEVELS), "info")
# The one-shot commands (discover, status) say only what went wrong unless asked.
quiet_log_level = _option("--log-level", "log level", click.Choice(LEVELS), "warning")
log_format = _option("--log-format", "log format", click.Choice(("text", "json")), "text")
output = _option("--output", "output format", click.Choice(("table", "json")), "table")
metrics_address = _option(
    "--metrics-address",
    "serve /metrics, /healthz, /readyz, the node page (/) and /debug/state on HOST:PORT "
    "or :PORT; off when empty",
    listener,
    "",
    "ADDR",
    shown="off",
    allow_empty=True,
)


debug_endpoints = _option(
    "--debug-endpoints",
    "with --metrics-address: serve the node page (/) and /debug/state there too (they "
    "name the node's pods and devices); false: /metrics, /healthz and /readyz only",
    Switch(),
    True,
    "BOOL",
)

health_address = _option(
    "--health-address",
    "serve /healthz and /readyz (no /metrics) on HOST:PORT or :PORT; off when empty",
    listener,
    "",
    "ADDR",
    shown="off",
    allow_empty=True,
)
probe_address = _option(
    "--address", "the plugin's health listener to ask", address, "127.0.0.1:9201", "ADDR"
)
check = _option("--check", "which probe", click.Choice(("readyz", "healthz")), "readyz")
pod_resources_socket = _option(
    "--pod-resources-socket",
    "the kubelet's pod resources API socket (auto: pod-resources/kubelet.sock beside the "
    "device-plugin folder)",
    folder,
    None,
    "PATH",
    shown="auto",
)
device_interval = _option(
    "--device-interval",
    "seconds between re-reads of the devices and NUMA nodes, so that a disk hot-plugged, "
    "replaced or moved is followed without a restart (only what changed registers "
    f"again); at least {MIN_DEVICE_INTERVAL:g}; 0: never",
    device_interval_value,
    config_default("device_interval"),
    "SECONDS",
)
pod_resources_interval = _option(
    "--pod-resources-interval",
    f"seconds between reads of the pod resources API (at least {MIN_INTERVAL})",
    interval,
    config_default("pod_resources_interval"),
    "S",
)
cgroup_root = _option(
    "--cgroup-root",
    "the host's cgroup folder (its /sys/fs/cgroup, e.g. a read-only hostPath): the "
    "kubelet's kubepods folder in it is watched, and the pod resources API read when a "
    "Guaranteed pod's cgroup comes or goes, else only every 60 s (or the interval, if "
    "longer); off: every interval",
    folder,
    None,
    "PATH",
    shown="off",
)
reserved_cpus = _option(
    "--reserved-cpus",
    "with --capacity cpus: the kubelet's reserved CPUs (cpulist), used while the pod "
    "resources API cannot be read",
    cpulist,
    frozenset(),
    "LIST",
    shown="none",
)
config_file = _option(
    "--config-file",
    "named configurations, one chosen by the node's label numa-align/config (YAML: "
    "default, configs); serve reads the labels of --node-name, demo takes --node-label",
    file_path,
    None,
    "PATH",
    shown="none",
)
node_name_option = _option(
    "--node-name",
    "this node's name, to read its labels from the API server (the downward API's spec.nodeName)",
    node_name,
    None,
    "NAME",
    shown="none",
)
kubeconfig = _option(
    "--kubeconfig",
    "with --config-file: the kubeconfig to reach the API server (none: in-cluster)",
    file_path,
    None,
    "PATH",
    shown="in-cluster",
)
node_config_interval = _option(
    "--node-config-interval",
    "with --config-file: seconds between looks at the node's label and the file",
    interval,
    60.0,
    "S",
)
demo_metrics_address = _option(
    "--metrics-address",
    "with --keep: serve /metrics, /healthz, /readyz (what `health` asks), the node page (/) "
    "and /debug/state on HOST:PORT or :PORT; off when empty",
    listener,
    "127.0.0.1:9201",
    "ADDR",
    allow_empty=True,
)


def label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; ValueError naming the text otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value.strip()


node_label = click.option(
    "--node-label",
    cls=Option,
    multiple=True,
    type=Converted("KEY=VALUE", label),
    envvar=variable("--node-label"),
    show_envvar=True,
    metavar="KEY=VALUE",
    help="with --config-file: a label of the stand-in API server's node (repeat for more), "
    "e.g. numa-align/config=exact; none: the file's default",
)
_near = click.option(
    "--near",
    "near",
    cls=Option,
    multiple=True,
    type=Converted("NAME=SELECTOR", parse_near),
    callback=lambda ctx, param, value: merge_near(value),
    envvar=variable("--near"),
    show_envvar=True,
    metavar="NAME=SELECTOR",
    help="a resource <prefix>/NAME on the NUMA node(s) of a device (repeat for more; a "
    "NAME given again adds a selector that must agree: the nodes all of them cover): "
    "SELECTOR is block:NAME, serial:S, wwid:W, net:IFNAME, pci:DOMAIN:BUS:DEV.FN, "
    "pci-id:VENDOR:DEVICE, pci-class:PREFIX, path:/HOST/PATH (the disk mounted there) or "
    "path-below:/HOST/PATH (or at a parent other than /), e.g. "
    "data-disk=serial:S3EVNX0K123 or data-a=path:/mnt/disks/a (variable: space-separated)",
)
mount_table = _option(
    "--mount-table",
    "the host's mount table (proc(5) mountinfo) the path: and path-below: selectors look "
    "paths up in",
    file_path,
    config_default("mount_table"),
    "PATH",
)


def near_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--near`` and the ``--mount-table`` its ``path:`` selectors read."""
    return _near(mount_table(function))


keep = _switch("--keep", "after the Allocate, keep serving until Ctrl-C (SIGINT) or SIGTERM")
allow_unaligned = _switch(
    "--allow-unaligned",
    "keep devices Healthy on a kubelet whose CPU manager policy is not static (memory "
    "devices: whose Memory Manager policy is not Static)",
)
memory_unit_option = _option(
    "--memory-unit",
    "advertise NUMA memory and hugepages too: numa-N-memory and numa-N-hugepages-<size>, "
    "one device per SIZE (1Gi pages: one per page); off when unset",
    memory_unit,
    None,
    "SIZE",
    shown="off",
)
any_resource = _option(
    "--any-resource",
    "advertise <prefix>/any, one resource over every NUMA node with CPUs whose devices "
    "are the free CPUs of the node with the most room (a pod asks for as many as its "
    "CPUs and lands where they fit on one node): auto (with --capacity cpus), on (needs "
    "--capacity cpus) or off",
    click.Choice(ANY_RESOURCE_VALUES),
    config_default("any_resource"),
    "auto|on|off",
)
socket_resources = _option(
    "--socket-resources",
    "advertise <prefix>/socket-S for each socket holding more than one NUMA node with "
    "CPUs (AMD NPS2/NPS4, Intel SNC), whose devices are the free CPUs of its node with "
    "the most room, as for <prefix>/any: auto (with --capacity cpus), on (needs "
    "--capacity cpus) or off",
    click.Choice(ANY_RESOURCE_VALUES),
    config_default("socket_resources"),
    "auto|on|off",
)
reserved_memory_option = _option(
    "--reserved-memory",
    "with --memory-unit: the kubelet's --reserved-memory (0:memory=1Gi;1:memory=2Gi), "
    "used while the pod resources API cannot be read",
    reserved_memory,
    (),
    "LIST",
    shown="none",
)


def apply(*options: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """Decorate a command with ``options``, listed in ``--help`` in the order given."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


# The API server commands' own options (top, devices).
