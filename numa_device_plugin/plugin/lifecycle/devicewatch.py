"""Devices that come, go or move while the plugin serves (a disk hot-plugged or
replaced, a mount moved to another disk, CPUs taken offline): sysfs is read again every
``device_interval`` seconds, off the event loop, and a discovery that differs from the
one served is handed to the manager, which serves again only the resources that
changed (no re-registration when nothing did). At start it first reads the devices
serve's first look left out (:func:`~..advertised.discovery.read_devices`), once the manager has
acted on that look (registered, or found no kubelet). It only feeds the manager."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import replace
from functools import partial

import structlog

from numa_device_plugin.plugin.advertised.discovery import (
    Discovery,
    discover,
    look_key,
    read_devices,
    with_mount_points,
)
from numa_device_plugin.plugin.advertised.lost import keep_lost, same_served
from numa_device_plugin.plugin.model.resources import Resource
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs

log = structlog.get_logger(__name__)

# Every this many looks the quiet look runs even when the look key is unchanged (what
# the key leaves out: a device attribute that changes in place).
FULL_LOOK_EVERY = 10


def differs(old: Discovery | None, new: Discovery) -> bool:
    """Whether ``new`` would serve or show anything other than ``old``: other resources
    (names, devices, NUMA nodes, the devices a near resource names), other near plans,
    or other devices on the NUMA nodes (the node page and ``/debug/state`` list them;
    only :func:`changed` resources register again)."""
    if old is None:
        return True
    return (
        dict(old.resources) != dict(new.resources)
        or old.near != new.near
        or old.inventory != new.inventory
    )


def changed(old: Mapping[str, Resource], new: Mapping[str, Resource]) -> set[str]:
    """The names of the resources added, gone or different between ``old`` and ``new``
    in what their server serves (:func:`~..advertised.lost.same_served`): a lost resource whose
    reason's text changed (a mount table's line number) registers nothing again."""
    return {name for name in {*old, *new} if not same_served(old.get(name), new.get(name))}


class DeviceWatch:
    """Reads sysfs every ``config.device_interval`` seconds (0: never) with ``quiet_fn``
    (no log lines, no details; default: :func:`discover` with ``quiet``, when
    ``discover_fn`` is it, else ``discover_fn``); when that :func:`differs` from
    ``current()`` it reads again with ``discover_fn`` and keeps that discovery for
    :meth:`take` and calls ``woken()``. A failed read is logged once per fault and
    the served discovery kept.

    Before the quiet look, ``key_fn`` (default: :func:`~..advertised.discovery.look_key` with
    :func:`discover`, none otherwise) reads what the look depends on, cheaply; while it
    equals the key of the last look that matched what is served, the look is skipped
    (a 1,000-device machine is not read every interval to find nothing), except every
    :data:`FULL_LOOK_EVERY` looks.

    :attr:`first_look` is serve's look at start: :func:`discover` without the devices
    when ``discover_fn`` is it (else ``discover_fn``); :meth:`run` reads what it left out
    once ``acted()`` returns (the manager's loop has acted on it), and hands that over
    like a change."""

    def __init__(
        self,
        config: Config,
        discover_fn: Callable[[Config], Discovery],
        current: Callable[[], Discovery | None],
        woken: Callable[[], None],
        quiet_fn: Callable[[Config], Discovery] | None = None,
        key_fn: Callable[[Config], Hashable] | None = None,
        acted: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self._discover_fn = discover_fn
        real = discover_fn is discover
        self.first_look = partial(discover, devices=False) if real else discover_fn
        self._acted = acted
        if quiet_fn is None:  # discover's own quiet look, or the injected function's
            quiet_fn = partial(discover, quiet=True) if real else discover_fn
        self._quiet_fn = quiet_fn
        self._key_fn = key_fn if key_fn is not None or discover_fn is not discover else look_key
        self._key: Hashable = None  # the key of the last look that matched what is served
        self._mounts: object = None  # the mount table's part of the last key read
        self._skipped = 0
        self.skipped_looks = 0  # looks the key skipped
        self._current = current
        self._woken = woken
        # The discovery found, and the one served when it was found (what it changes).
        self._found: tuple[Discovery, Discovery | None] | None = None
        self._last_error: str | None = None

    def take(self) -> Discovery | None:
        """The changed discovery found since the last call, or None; None too when what
        is served changed since it was found (a reload: its own look is as new)."""
        found, self._found = self._found, None
        if found is None or found[1] is not self._current():
            return None
        return found[0]

    def caught_up(self) -> bool:
        """False while the served discovery lacks the devices its first look left out."""
        current = self._current()
        return current is None or current.devices_read

    async def run(self) -> None:
        """Until cancelled: the devices the first look left out, then a look every
        ``config.device_interval`` seconds (0: no more)."""
        await self._read_left_out()
        interval = self.config.device_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            await self.look()

    async def look(self) -> None:
        """One reading of sysfs; ``found`` when it differs from what is served (a
        resource that follows a device whose device is gone is kept, lost:
        :func:`~numa_device_plugin.plugin.advertised.lost.keep_lost`)."""
        key: Hashable = None
        moved = False
        try:
            if self._key_fn is not None:
                key = await asyncio.to_thread(self._key_fn, self.config)
                mounts = key[2] if isinstance(key, tuple) and len(key) == 3 else None
                moved = mounts is not None and mounts != self._mounts  # mount points too
                self._mounts = mounts
                if self._same(key) and self._skipped + 1 < FULL_LOOK_EVERY:
                    self._skipped += 1
                    self.skipped_looks += 1
                    if moved:
                        await self._fresh_mount_points()
                    return
            self._skipped, self._key = 0, None
            discovery = await asyncio.to_thread(self._quiet_fn, self.config)
            current = self._current()
            if current is not None and not differs(current, keep_lost(current.resources,
                                                                       discovery)):  # fmt: skip
                self._last_error = None
                self._key = key
                if moved:
                    await self._fresh_mount_points()
                return
            # Something changed: read again, logging the new plan and reading the details.
            discovery = await asyncio.to_thread(self._discover_fn, self.config)
        except (sysfs.SysfsError, ValueError) as exc:
            if str(exc) != self._last_error:
                log.warning("re-reading the devices failed; serving what was found before",
                            error=str(exc))  # fmt: skip
            self._last_error = str(exc)
            return
        self._last_error = None
        current = self._current()
        if current is not None:
            discovery = keep_lost(current.resources, discovery)
        if differs(current, discovery):
            self._found = (discovery, current)
            self._woken()

    def _same(self, key: Hashable) -> bool:
        """Whether ``key`` says the quiet look would find what the last matching look
        found: equal to its key, or, with no ``path:`` selector to follow the mount
        table, equal but for the table (:func:`~..advertised.discovery.look_key`'s last
        part, whose mount points :meth:`_fresh_mount_points` follows alone)."""
        if key == self._key:
            return True
        last = self._key
        return (
            isinstance(key, tuple) and isinstance(last, tuple) and len(key) == len(last) == 3
            and key[:2] == last[:2]
            and not any(one.kind.startswith("path") for entry in self.config.near
                        for one in entry.selectors)
        )  # fmt: skip

    async def _fresh_mount_points(self) -> None:
        """The served discovery with its disks' mount points read again (the mount
        table alone, no sysfs look); handed over when they changed (nothing registers
        again: its resources are the same)."""
        current = self._current()
        if current is None or not current.devices_read:
            return
        found = await asyncio.to_thread(with_mount_points, self.config, current)
        if found.details != current.details and self._current() is current:
            self._found = (found, current)
            self._woken()

    async def _read_left_out(self) -> None:
        """Once ``acted()``: the served discovery with the devices its first look left
        out, handed over as :meth:`take`'s (unless a reload served another meanwhile)."""
        if self.caught_up() or self._acted is None:
            return
        await self._acted()
        current = self._current()
        if current is None or current.devices_read:
            return
        try:
            found = await asyncio.to_thread(read_devices, self.config, current)
        except (sysfs.SysfsError, OSError, ValueError) as exc:  # ready all the same
            log.warning("reading the devices failed; the next look reads them again",
                        error=str(exc))  # fmt: skip
            found = replace(current, devices_read=True)
        if self._current() is current:
            self._found = (found, current)
            self._woken()
