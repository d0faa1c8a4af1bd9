"""``numa-device-plugin status``: per NUMA node, capacity, allocatable, allocated and
the containers holding it, read from the kubelet's pod resources API (``List`` and
``GetAllocatableResources``); misaligned CPUs are flagged."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path
from typing import Any

import click

from numa_device_plugin.cli import hostviews, options
from numa_device_plugin.ops.logs import configure_logging


@click.command(
    "status",
    help="Show, per NUMA node, capacity, allocatable, allocated and the containers holding "
    "it (from the kubelet's pod resources API), flagging misaligned CPUs.",
)
@options.apply(
    options.pod_resources_socket,
    options.socket_dir,
    options.reserved_cpus,
    options.sysfs_root,
    options.resource_prefix,
    options.capacity_option,
    options.include_cpuless_nodes,
    options.memory_unit_option,
    options.any_resource,
    options.socket_resources,
    options.reserved_memory_option,
    options.near_option,
    options.output,
    options.quiet_log_level,
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=600),
    default=5.0,
    show_default=True,
    envvar="NUMA_TIMEOUT",
    show_envvar=True,
    help="seconds each pod resources call may take (more on a slow node)",
)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """0 after printing; 1 when the pod resources API cannot be read (said on stderr)."""
    from numa_device_plugin.kubelet.podresources import PodResourcesError, fetch
    from numa_device_plugin.plugin.reports.status import build_status, render_table

    configure_logging(params["log_level"], "text")
    hostviews.own_mount_table(ctx, params)
    try:
        config = options.config_from_params(params)
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None
    discovery = options.discover_or_usage(ctx, config)
    socket = config.pod_resources_path
    problem = socket_problem(socket)
    timeout = params["timeout"]
    if problem is None:
        try:
            pods, allocatable = asyncio.run(fetch(socket, timeout=timeout))
        except PodResourcesError as exc:
            problem = call_problem(exc.code.name, exc.details, timeout)
    if problem is not None:
        print(f"numa-device-plugin status: {socket}: {problem}", file=sys.stderr)
        return 1
    document = build_status(discovery, config, pods, allocatable)
    click.echo(
        json.dumps(document, indent=2) if params["output"] == "json" else render_table(document)
    )
    return 0


def socket_problem(path: Path) -> str | None:
    """Why nothing could answer at ``path`` (absent, a file, a folder), or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such socket (is the kubelet running, and this its pod-resources folder?)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISSOCK(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a socket"
    return "is a regular file, not a socket" if stat.S_ISREG(mode) else "is not a socket"


def call_problem(code: str, details: str, timeout: float) -> str:
    """One short line for a failed call, by its gRPC status code name (``timeout``: the
    seconds the call had)."""
    reasons = {
        "UNAVAILABLE": "nothing answers on it (connection refused)",
        "DEADLINE_EXCEEDED": f"no answer within {timeout:g} s (--timeout)",
        "UNIMPLEMENTED": "it does not serve the pod resources API v1 "
        "(List, GetAllocatableResources); a kubelet older than 1.23?",
        "PERMISSION_DENIED": "permission denied",
    }
    return reasons.get(code, f"{code}: {details.splitlines()[0][:120] if details else ''}")
