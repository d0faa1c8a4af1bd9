"""``numa-device-plugin serve``: the device plugin daemon.

Signals: SIGTERM and SIGINT stop it (orderly: streams closed, sockets removed),
SIGHUP re-reads sysfs and re-registers (:meth:`PluginManager.reload`), SIGUSR1
switches the log level between the configured one and ``debug``
(:class:`~numa_device_plugin.ops.logs.LevelSwitch`). A stop signal
that came before the event loop's handlers were installed (caught from the first
moment: :mod:`numa_device_plugin.ops.signals`) stops it as soon as they are.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import click
import structlog

from numa_device_plugin.cli import options
from numa_device_plugin.kubelet.grpcserver import SocketPathError
from numa_device_plugin.ops.heap import limit_malloc_arenas
from numa_device_plugin.ops.limits import FdLimitError
from numa_device_plugin.ops.logs import LevelSwitch, configure_logging, loop_exception_handler
from numa_device_plugin.ops.probes import MAX_CONNECTIONS
from numa_device_plugin.ops.signals import LEVEL_SIGNAL, STOP_SIGNALS
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.reports.deferred import DeferredRecorder
from numa_device_plugin.plugin.settings.config import Config, check_socket_dir
from numa_device_plugin.topology.memory import MemoryUnitError

log = structlog.get_logger(__name__)

if TYPE_CHECKING:
    from numa_device_plugin.nodeconfig.supervisor import Selector
    from numa_device_plugin.ops.probes import Pages
    from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder
    from numa_device_plugin.plugin.reports.snapshot import PluginState


class Runner(Protocol):
    """What serve drives: a :class:`PluginManager` or a ``ConfigSupervisor``."""

    def readiness_problems(self) -> list[str]: ...
    def snapshot(self) -> PluginState: ...
    def stop(self) -> None: ...
    def reload(self) -> None: ...
    async def serve(self) -> None: ...


@click.command("serve", help="Run the device plugin daemon against the kubelet.")
@options.apply(
    options.sysfs_root,
    options.socket_dir,
    options.resource_prefix,
    options.capacity_option,
    options.include_cpuless_nodes,
    options.register_timeout,
    options.shutdown_grace,
    options.log_level,
    options.log_format,
    options.metrics_address,
    options.debug_endpoints,
    options.health_address,
    options.pod_resources_socket,
    options.pod_resources_interval,
    options.cgroup_root,
    options.device_interval,
    options.reserved_cpus,
    options.allow_unaligned,
    options.memory_unit_option,
    options.any_resource,
    options.socket_resources,
    options.reserved_memory_option,
    options.near_option,
    options.config_file,
    options.node_name_option,
    options.kubeconfig,
    options.node_config_interval,
)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """Serve until SIGTERM/SIGINT; 0 then. Exit 2 for an unusable configuration (named)."""
    configure_logging(params["log_level"], params["log_format"])
    try:
        config = options.config_from_params(params)
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None
    select = _node_selection(ctx, params)
    limit_malloc_arenas()
    try:
        check_socket_dir(config.socket_dir)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param=options.param(ctx, "socket_dir")) from None
    try:
        return asyncio.run(
            serve(
                config,
                params["metrics_address"],
                params["health_address"],
                select=select,
                select_interval=params["node_config_interval"],
                levels=LevelSwitch(params["log_level"], params["log_format"]),
                debug_endpoints=params["debug_endpoints"],
            )
        )
    except SocketPathError as exc:
        raise click.BadParameter(
            str(exc), ctx, param_hint="'--socket-dir' / '--resource-prefix'"
        ) from None
    except ListenerError as exc:
        raise click.BadParameter(str(exc), ctx, param=options.param(ctx, exc.option)) from None
    except FdLimitError as exc:
        raise click.UsageError(str(exc), ctx) from None
    except MemoryUnitError as exc:
        raise click.BadParameter(str(exc), ctx, param=options.param(ctx, "memory_unit")) from None


def _node_selection(ctx: click.Context, params: dict[str, Any]) -> Selector | None:
    """With ``--config-file``: the selection of the node's configuration by its label
    (:func:`label_selection`); None without. Usage errors for the flags that need it."""
    path = params["config_file"]
    if path is None:
        for name in ("node_name", "kubeconfig"):
            if params[name] is not None:
                raise click.BadParameter(
                    "only applies with --config-file", ctx, param=options.param(ctx, name)
                )
        return None
    if params["node_name"] is None:
        raise click.BadParameter(
            "--config-file needs this node's name (the chart sets NUMA_NODE_NAME from "
            "spec.nodeName)",
            ctx,
            param=options.param(ctx, "node_name"),
        )
    from numa_device_plugin.nodeconfig.supervisor import label_selection

    return label_selection(path, params["node_name"], params["kubeconfig"], dict(params))


class ListenerError(Exception):
    """An HTTP listener could not be resolved or bound: ``option`` is its parameter
    name (``metrics_address``), ``address`` the text given, ``error`` the OSError."""

    def __init__(self, option: str, address: str, error: OSError) -> None:
        self.option = option
        self.address = address
        self.error = error
        if error.errno is not None and not isinstance(error, socket.gaierror):
            reason = os.strerror(error.errno)  # asyncio wraps it in a longer text
        else:
            reason = error.strerror or str(error)
        super().__init__(f"cannot listen on {address!r}: {reason}")


async def serve(
    config: Config,
    metrics_address: str,
    health_address: str,
    *,
    select: Selector | None = None,
    select_interval: float = 60.0,
    levels: LevelSwitch | None = None,
    debug_endpoints: bool = True,
) -> int:
    """Run a :class:`PluginManager` for ``config`` with the HTTP listeners asked for
    (``""``: none) until a stop signal; 0 then. With ``select`` (per-node
    configuration), a :class:`ConfigSupervisor` runs the manager for the Config it
    chooses, looking again every ``select_interval`` seconds. With ``levels``, SIGUSR1
    toggles the log level (:class:`LevelSwitch`). ``debug_endpoints`` False: the
    metrics listener serves no node page and no ``/debug/state``. Raises
    :class:`ListenerError` when a listener cannot be bound, before anything else is
    served."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception_handler)
    recorder: DeferredRecorder[PrometheusRecorder] | None = None
    render = None
    if metrics_address:
        recorder = DeferredRecorder(_prometheus_recorder)
        render = _renderer(recorder)
    listeners = sum(1 for address in (metrics_address, health_address) if address)

    def make_manager(chosen: Config) -> PluginManager:
        return PluginManager(
            chosen, recorder=recorder, listener_connections=listeners * MAX_CONNECTIONS
        )

    def check(chosen: Config) -> None:
        from numa_device_plugin.nodeconfig.configs import NodeConfigError
        from numa_device_plugin.plugin.lifecycle.manager import servable
        from numa_device_plugin.topology.sysfs import SysfsError

        try:
            servable(chosen, listeners * MAX_CONNECTIONS)
        except (SysfsError, SocketPathError, FdLimitError, ValueError, OSError) as exc:
            raise NodeConfigError(str(exc)) from None

    manager: Runner
    if select is None:
        manager = make_manager(config)
    else:
        from numa_device_plugin.nodeconfig.supervisor import ConfigSupervisor

        manager = ConfigSupervisor(select, make_manager, select_interval, check)
    servers = await start_listeners(
        manager, metrics_address, health_address, render, debug_endpoints=debug_endpoints
    )
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, manager.stop)
    # Until here a stop signal ended the process at once (signals.catch_early): nothing
    # was held. From here on the manager tears down what it makes.
    loop.add_signal_handler(signal.SIGHUP, manager.reload)
    if levels is not None:
        loop.add_signal_handler(LEVEL_SIGNAL, levels.toggle)
    if recorder is not None:
        recorder.start()
    try:
        await manager.serve()
    finally:
        if recorder is not None:
            recorder.stop()
        for server in servers:
            await server.stop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, LEVEL_SIGNAL):
            loop.remove_signal_handler(signum)
        signal.signal(LEVEL_SIGNAL, signal.SIG_IGN)  # its default action ends the process
    return 0


def _prometheus_recorder() -> PrometheusRecorder:
    from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder

    return PrometheusRecorder()


def _renderer(recorder: DeferredRecorder[PrometheusRecorder]) -> Callable[[], bytes]:
    """``/metrics``' text for ``recorder``, made first if not yet (a scrape before
    registration ended; worker thread)."""
    return lambda: recorder.load().render()


def node_pages(snapshot: Callable[[], PluginState]) -> Pages:
    """The metrics listener's ``/`` and ``/debug/state`` for a runner's ``snapshot``;
    what renders them is imported at the first request (not before registering)."""

    def page(state: PluginState) -> bytes:
        from numa_device_plugin.plugin.reports.nodepage import build_page, render_page

        return render_page(build_page(state))

    def debug(state: PluginState) -> bytes:
        import json

        from numa_device_plugin.plugin.reports.snapshot import debug_document

        return (json.dumps(debug_document(state), indent=1) + "\n").encode()

    return snapshot, page, debug


async def start_listeners(
    manager: Runner,
    metrics_address: str,
    health_address: str,
    render: Callable[[], bytes] | None,
    *,
    debug_endpoints: bool = True,
) -> list[Any]:
    """The HTTP listeners asked for, listening: both serve ``/healthz`` and ``/readyz``,
    the metrics one ``/metrics`` too, and with ``debug_endpoints`` the node page (``/``)
    and ``/debug/state``; each logs ``listening`` with its ``listener``
    (``metrics``, ``health``) and the ``port`` it bound (port 0: one the kernel picks).
    Raises :class:`ListenerError`."""
    from numa_device_plugin.ops.probes import ProbeServer, parse_address

    started: list[tuple[str, ProbeServer]] = []
    for option, address, metrics in (
        ("metrics_address", metrics_address, render),
        ("health_address", health_address, None),
    ):
        if not address:
            continue
        listener = ProbeServer(
            parse_address(address),
            manager.readiness_problems,
            metrics,
            pages=node_pages(manager.snapshot) if metrics and debug_endpoints else None,
        )
        try:
            await listener.start()
        except OSError as exc:  # socket.gaierror too
            for _, other in started:
                await other.stop()
            raise ListenerError(option, address, exc) from None
        started.append((option, listener))
    # Once all listen (a failure says nothing but its usage error): the ports bound,
    # which port 0 leaves to the kernel (a free one, no race).
    for option, listener in started:
        log.info("listening", listener=option.removesuffix("_address"), port=listener.port)
    return [listener for _, listener in started]
