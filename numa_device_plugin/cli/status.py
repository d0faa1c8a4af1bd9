"""``numa-device-plugin status``: per NUMA node, capacity, allocatable, allocated and
the containers holding it, read from the kubelet's pod resources API (``List`` and
``GetAllocatableResources``); misaligned CPUs are flagged."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click

from numa_device_plugin.cli import options
from numa_device_plugin.logs import configure_logging
from numa_device_plugin.manager import discover


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
    options.output,
    options.log_level,
)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """0 after printing; 1 when the pod resources API cannot be read (said on stderr)."""
    from numa_device_plugin.podresources import PodResourcesError, fetch
    from numa_device_plugin.status import build_status, render_table

    configure_logging(params["log_level"], "text")
    try:
        config = options.config_from_params(params)
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None
    discovery = discover(config)
    try:
        pods, allocatable = asyncio.run(fetch(config.pod_resources_path))
    except PodResourcesError as exc:
        print(f"numa-device-plugin: {exc}", file=sys.stderr)
        return 1
    document = build_status(discovery, config, pods, allocatable)
    click.echo(
        json.dumps(document, indent=2) if params["output"] == "json" else render_table(document)
    )
    return 0
