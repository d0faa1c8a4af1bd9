"""Serve the configuration the node's label chooses, and follow it when it changes.

:class:`ConfigSupervisor` asks a selection function (blocking, run in a thread) which
configuration to serve: at start, every ``interval`` seconds, and on SIGHUP. For each
new choice it stops the running :class:`PluginManager` (an orderly teardown: sockets
removed, so the kubelet sees the old devices go) and starts one for the new
:class:`Config`. The same choice keeps the manager running.

When no configuration can be chosen (the label names none, the file is malformed,
the node cannot be read at start, or the chosen configuration cannot be served on
this node: ``check`` refuses it before the served one is torn down) nothing is
served: the manager is stopped, the readiness probe reports the reason, and one log
line names the label and the reason (again only when the reason changes). A failed
read of the labels while a configuration is served keeps it: an API server outage is
not the operator's choice.

The selection runs in a daemon thread of its own, and a stop does not wait for it:
whatever the file or the API server does, SIGTERM ends the plugin at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from numa_device_plugin.nodeconfig.configs import (
    CONFIG_LABEL,
    NodeConfigError,
    load_node_configs,
    resolve,
)
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.reports.snapshot import PluginState
from numa_device_plugin.plugin.settings.config import Config

log = structlog.get_logger(__name__)

# Seconds between looks at the node's label and the configuration file.
DEFAULT_INTERVAL = 60.0

Selection = tuple[str | None, Config]
Selector = Callable[[], Selection]
T = TypeVar("T")


async def in_daemon_thread(function: Callable[[], T], name: str) -> T:
    """``function()`` in a new daemon thread; its result or its exception. Cancelling
    the wait abandons the thread (it ends on its own; a daemon thread never holds up
    the process's exit, unlike ``asyncio.to_thread``'s executor)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (function(), None)
        except BaseException as exc:  # handed to the awaiting task
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


class ConfigSupervisor:
    """One :class:`PluginManager` at a time, for the configuration ``select`` returns.

    ``select``: blocking, returns (configuration name or None for the flags alone,
    :class:`Config`), raises :class:`NodeConfigError`. ``make_manager``: a manager for
    a Config. ``interval``: seconds between selections. ``check``: blocking, run in
    the same thread for a new choice before anything is torn down; raises
    :class:`NodeConfigError` when that Config cannot be served on this node.
    """

    def __init__(
        self,
        select: Callable[[], Selection],
        make_manager: Callable[[Config], PluginManager],
        interval: float = DEFAULT_INTERVAL,
        check: Callable[[Config], None] | None = None,
    ) -> None:
        self._select = select
        self._check = check
        self._make_manager = make_manager
        self.interval = interval
        self.manager: PluginManager | None = None
        self.current: Selection | None = None
        self.problem: str | None = None
        self.looks = 0  # selections made so far (tests wait for it)
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self._stopping = False
        self._reload = False
        self._logged: str | None = None
        self._selecting: asyncio.Future[Selection] | None = None

    def readiness_problems(self) -> list[str]:
        """Why the plugin is not ready: the reason no configuration is served, else
        the manager's problems ([] when ready)."""
        if self.problem is not None:
            return [self.problem]
        if self.manager is None:
            return ["the node's configuration is not chosen yet"]
        return self.manager.readiness_problems()

    def snapshot(self) -> PluginState:
        """The running manager's :meth:`PluginManager.snapshot` with the configuration
        served and why; without a manager, a state that says why nothing is served."""
        if self.manager is None or self.current is None:
            return PluginState(
                taken_at=time.time(),
                config=None,
                problems=tuple(self.readiness_problems()),
                configuration={"name": "", "why": self.problem or "not chosen yet"},
            )
        name = self.current[0]
        why = (
            f"the node's label {CONFIG_LABEL}, or the file's default where it has none"
            if name
            else f"no label {CONFIG_LABEL} and no default: the flags and variables"
        )
        return replace(
            self.manager.snapshot(),
            problems=tuple(self.readiness_problems()),
            configuration={"name": name or "(flags and variables)", "why": why},
        )

    def stop(self) -> None:
        """Stop the manager and return from :meth:`serve` (SIGTERM), without waiting for
        a selection under way."""
        self._stopping = True
        if self.manager is not None:
            self.manager.stop()
        if self._selecting is not None:
            self._selecting.cancel()
        self._woken.set()

    def reload(self) -> None:
        """Choose again now; an unchanged choice makes the manager reload (SIGHUP)."""
        self._reload = True
        self._woken.set()

    async def serve(self) -> None:
        """Until :meth:`stop`. Raises what a manager's ``serve`` raises (a manager
        that fails ends the supervisor, as it ends ``serve`` without one)."""
        try:
            while not self._stopping:
                self._woken.clear()
                await self._look()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), self.interval)
                if self._task is not None and self._task.done() and not self._stopping:
                    self._task.result()  # a manager that ended on its own: raises its error
        finally:
            await self._retire()

    async def _look(self) -> None:
        await self._choose()
        self.looks += 1

    async def _choose(self) -> None:
        reload, self._reload = self._reload, False
        current = self.current if self.manager is not None else None
        self._selecting = asyncio.ensure_future(
            in_daemon_thread(lambda: self._select_checked(current), "node configuration")
        )
        try:
            selection = await self._selecting
        except asyncio.CancelledError:
            if self._stopping and self._selecting.cancelled():
                return
            raise
        except NodeConfigError as exc:
            self._failed(exc)
            if not exc.transient:  # an outage keeps what is served (nothing, at start)
                await self._retire()
            return
        self.problem = None
        self._logged = None
        if self.manager is not None and selection == self.current:
            if reload:
                self.manager.reload()
            return
        await self._retire()
        if self._stopping:
            return
        name, config = selection
        log.info(
            "serving the node's configuration",
            label=CONFIG_LABEL,
            configuration=name or "(flags and variables)",
            capacity=str(config.capacity),
        )
        self.current = selection
        self.manager = self._make_manager(config)
        self._task = asyncio.create_task(self.manager.serve(), name="plugin manager")
        self._task.add_done_callback(lambda _: self._woken.set())

    def _select_checked(self, current: Selection | None) -> Selection:
        """The selection; a new one passed through ``check`` (in the selection's
        thread)."""
        selection = self._select()
        if self._check is not None and selection != current:
            try:
                self._check(selection[1])
            except NodeConfigError as exc:
                name = selection[0] or "(flags and variables)"
                raise NodeConfigError(
                    f"configuration {name!r} chosen by {CONFIG_LABEL} cannot be served on "
                    f"this node: {exc}"
                ) from None
        return selection

    def _failed(self, exc: NodeConfigError) -> None:
        message = str(exc)
        if exc.transient and self.manager is not None:
            if self._logged != message:
                log.warning(
                    "cannot read the node's label; keeping the configuration served",
                    label=CONFIG_LABEL,
                    reason=message,
                )
            self._logged = message
            return
        self.problem = f"no configuration served: {message}"
        if self._logged != message:
            log.error("serving nothing", label=CONFIG_LABEL, reason=message)
        self._logged = message

    async def _retire(self) -> None:
        """Stop the running manager and wait for its teardown."""
        manager, task = self.manager, self._task
        self.manager, self._task, self.current = None, None, None
        if manager is None or task is None:
            return
        manager.stop()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise


def label_selection(
    path: Path, node: str, kubeconfig: Path | None, base: Mapping[str, Any]
) -> Callable[[], Selection]:
    """A ``select`` for :class:`ConfigSupervisor`: reads node ``node``'s labels from the
    API server (:class:`NodeLabelReader`), then the file at ``path`` (read again each
    time, so an updated ConfigMap is followed), and resolves them over ``base`` (serve's
    parameters). Its NodeConfigErrors name the label and its value."""
    from numa_device_plugin.nodeconfig.labels import NodeLabelReader

    reader = NodeLabelReader(node, kubeconfig)

    def select() -> Selection:
        labels = reader.read()
        try:
            configs = load_node_configs(path, base)
        except NodeConfigError as exc:
            value = labels.get(CONFIG_LABEL)
            shown = "unset" if value is None else f"{value!r}"
            raise NodeConfigError(f"node {node} (label {CONFIG_LABEL} {shown}): {exc}") from None
        return resolve(configs, node, labels, base)

    return select
