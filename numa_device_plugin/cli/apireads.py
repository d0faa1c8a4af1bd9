"""The commands that read the API server (``top``, ``devices``, ``check``): their shared
options, and one client of the API server (the kubeconfig kubectl would use) under the
command's one deadline (``--timeout``), with what a failure prints
(:mod:`numa_device_plugin.cluster.kubeapi`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from numa_device_plugin.cli.escaped import shown

T = TypeVar("T")

api_kubeconfig = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="NUMA_KUBECONFIG",
    show_envvar=True,
    help="the kubeconfig (default: $KUBECONFIG's first file, else ~/.kube/config, else "
    "the pod's service account)",
)
api_timeout = click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=30.0,
    show_default=True,
    envvar="NUMA_TIMEOUT",
    show_envvar=True,
    help="seconds the whole command may take: the kubeconfig, its exec credential plugin "
    "and every request to the API server",
)

# The plugin's pods, as devices and check find them.
DEFAULT_SELECTOR = "app.kubernetes.io/name=numa-device-plugin"
plugin_selector = click.option(
    "--selector",
    default=DEFAULT_SELECTOR,
    show_default=True,
    envvar="NUMA_SELECTOR",
    show_envvar=True,
    help="the label selector of the plugin's pods",
)
plugin_port = click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=9201,
    show_default=True,
    envvar="NUMA_PORT",
    show_envvar=True,
    help="the plugin's metrics port (config.metricsPort), where /debug/state is",
)

plugin_pod_timeout = click.option(
    "--pod-timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=5.0,
    show_default=True,
    envvar="NUMA_POD_TIMEOUT",
    show_envvar=True,
    help="seconds each plugin pod's /debug/state may take through the API server's proxy "
    "(a pod slower than that is named on stderr, the others are shown; never past "
    "--timeout)",
)


def read_within_deadline(
    command: str, params: dict[str, Any], reads: Callable[[Any], T], slow: str = ""
) -> T | None:
    """``reads(api)`` with a :class:`~numa_device_plugin.cluster.kubeapi.KubeApi` of
    ``params["kubeconfig"]``, all within ``params["timeout"]`` seconds; None after
    printing ``numa-device-plugin COMMAND: why`` on stderr when the deadline passed
    (``slow`` said after) or the API server could not be read (ApiError, ValueError)."""
    from numa_device_plugin.cluster.kubeapi import (
        ApiError,
        DeadlinePassed,
        KubeApi,
        load_client,
        total_deadline,
    )

    try:
        load_client()
        with total_deadline(params["timeout"]) as deadline:
            api = KubeApi(params["kubeconfig"], deadline)
            try:
                return reads(api)
            finally:
                api.close()
    except DeadlinePassed:
        why = f"not done within {params['timeout']:g} s (--timeout)"
        why += f": {slow}" if slow else ""
    except (ApiError, ValueError) as exc:
        why = shown(exc)
    print(f"{speaker(command)}: {why}", file=sys.stderr)
    return None


def speaker(command: str) -> str:
    """How ``command``'s messages name the program: ``numa-device-plugin check``, or
    under kubectl (``kubectl-numa``) ``kubectl numa check`` and, for ``top``, which is
    ``kubectl numa`` itself, ``kubectl numa``."""
    from numa_device_plugin import cli

    if cli.PROG != "numa-device-plugin" and command == "top":
        return cli.PROG
    return f"{cli.PROG} {command}"
