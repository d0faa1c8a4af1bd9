"""Resources that follow a device (``--near data-disk=serial:S3EV``, ``near:`` in a
node's configuration): the :class:`Near` entry, its parsing and its checks. Where such a
resource's devices lie is planned by
:func:`~numa_device_plugin.plugin.advertised.discovery.plan_near` and built by
:func:`~numa_device_plugin.plugin.advertised.build.near_resource`.

The device selectors (:mod:`~numa_device_plugin.topology.selectors`, with the mount
table's reading) are imported by the first ``--near`` parsed: a plugin without one
never loads them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numa_device_plugin.plugin.model.names import (
    ANY_NAME,
    DEFAULT_RESOURCE_PREFIX,
    quoted,
    validate_extended_resource_name,
)

if TYPE_CHECKING:
    from numa_device_plugin.topology.selectors import Selector


@dataclass(frozen=True)
class Near:
    """A resource that follows a device (``--near data-disk=serial:S3EV``): ``name``
    (the part after the prefix, ``data-disk``) and the ``selector`` of the device;
    ``also``: more selectors given for the same name, which must *all* agree (a data
    path and a NIC: the resource goes to the NUMA nodes every one of them covers)."""

    name: str
    selector: Selector | None
    also: tuple[Selector, ...] = ()
    scope: str = "node"

    @property
    def selectors(self) -> tuple[Selector, ...]:
        """Its device selectors, in the order given."""
        return self.also if self.selector is None else (self.selector, *self.also)

    @property
    def terms(self) -> list[str]:
        """Its selectors as text, then ``scope:socket`` when it follows the socket."""
        return [*map(str, self.selectors), *([f"scope:{self.scope}"] * (self.scope != "node"))]

    def flags(self) -> list[str]:
        """As ``NAME=SELECTOR`` arguments of ``--near``, one per selector (and scope)."""
        return [f"{self.name}={term}" for term in self.terms]

    def __str__(self) -> str:
        return f"{self.name}=" + " & ".join(self.terms)


def merge_near(entries: Iterable[Near]) -> tuple[Near, ...]:
    """``--near`` entries with one name given several times as one :class:`Near` whose
    selectors must all agree, in the order the names first came; a selector repeated
    for a name counts once."""
    merged: dict[str, Near] = {}
    for entry in entries:
        found = merged.get(entry.name)
        if found is None:
            merged[entry.name] = entry
            continue
        scope = "socket" if "socket" in (found.scope, entry.scope) else found.scope
        added = tuple(one for one in entry.selectors if one not in found.selectors)
        if found.selector is None and added:
            merged[entry.name] = Near(found.name, added[0], added[1:], scope)
        else:
            merged[entry.name] = Near(found.name, found.selector, (*found.also, *added), scope)
    return tuple(merged.values())


# --near NAME=scope:socket: the resource goes to every NUMA node with CPUs of the
# sockets its devices are on (node: their own NUMA nodes, the default).
SCOPES = ("node", "socket")


# Names of the NUMA-node and socket resources (numa-1, numa-1-memory,
# numa-1-hugepages-2Mi, socket-1, socket-1-memory): a near resource may not take one.
_NUMA_NAME = re.compile(r"numa-[0-9]")
_SOCKET_NAME = re.compile(r"socket-[0-9]")


def validate_near_name(prefix: str, name: str) -> str:
    """Return ``name`` when ``<prefix>/<name>`` is a valid extended resource name that
    is not one of the NUMA-node names (``numa-<id>...``), the socket names
    (``socket-<id>...``) nor ``any`` and its memory (``any-memory``, ``any-hugepages-...``).
    Raises ValueError."""
    if "/" in name:
        raise ValueError(f"{quoted(name)}: give the name without the prefix ({prefix}/ is added)")
    if _NUMA_NAME.match(name):
        raise ValueError(f"{quoted(name)} would collide with the NUMA-node resources numa-<id>...")
    if _SOCKET_NAME.match(name):
        raise ValueError(f"{quoted(name)} would collide with the socket resources socket-<id>...")
    if name in (ANY_NAME, f"{ANY_NAME}-memory") or name.startswith(f"{ANY_NAME}-hugepages-"):
        raise ValueError(
            f"{quoted(name)} would collide with the resource {ANY_NAME} (and its memory)"
        )
    validate_extended_resource_name(f"{prefix}/{name}")
    return name


def parse_near(text: str) -> Near:
    """``NAME=SELECTOR`` (``data-disk=serial:S3EV``) -> :class:`Near`. Raises ValueError
    naming the fault (no ``=``, a bad name for the default prefix, a bad selector); the
    name is checked again against the configured prefix by :class:`Config`."""
    name, sep, selector = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{quoted(text)} is not NAME=SELECTOR (e.g. data-disk=serial:S3EV)")
    validate_near_name(DEFAULT_RESOURCE_PREFIX, name)
    joined = _JOINED.search(selector)
    if joined is not None:
        raise ValueError(
            f"{quoted(text)}: a second entry follows a comma ({quoted(joined[0][1:])}): "
            "NUMA_NEAR separates entries with spaces (or give --near again); a comma in a "
            "path is written \\054"
        )
    kind, colon, value = selector.strip(" \t").partition(":")
    if colon and kind == "scope":
        if value not in SCOPES:
            raise ValueError(
                f"{quoted(text)}: scope must be one of {', '.join(SCOPES)} (scope:socket: "
                "every NUMA node with CPUs of the device's socket)"
            )
        return Near(name, None, (), value)
    from numa_device_plugin.topology.selectors import parse_selector

    return Near(name, parse_selector(selector))


# A second NAME=KIND: entry joined to a selector by a comma (NUMA_NEAR is space-separated:
# "ch=path:/data/ch,kafka=net:ens1f0" made one path of both).
_JOINED = re.compile(
    r",[A-Za-z0-9][-A-Za-z0-9_.]*=(?:block|serial|wwid|net|pci|pci-id|pci-class|path|path-below|scope):"
)


# Resources that follow a device, at most: each is a gRPC server, a socket and a
# registration of its own; real servers name a few (data disk, NIC, accelerator).
MAX_NEAR = 64
# Selectors that must all agree for one resource (a data path, a NIC, an accelerator).
MAX_ALL_OF = 8


def near_env(name: str) -> str:
    """The variable Allocate sets in a container holding ``<prefix>/<name>``:
    ``NUMA_NEAR_`` and the name in upper case, each character but a letter or digit an
    underscore (``data-disk`` -> ``NUMA_NEAR_DATA_DISK``); its value lists the devices
    on the NUMA node(s) allocated, comma-separated."""
    return "NUMA_NEAR_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


def check_near(prefix: str, near: Iterable[Near]) -> None:
    """Raise ValueError when a name is invalid under ``prefix``, given twice or the same
    as another's once made a variable (:func:`near_env`), or when there are more than
    :data:`MAX_NEAR` (or a name has more than :data:`MAX_ALL_OF` selectors)."""
    entries = list(near)
    if len(entries) > MAX_NEAR:
        raise ValueError(
            f"{len(entries)} resources that follow a device (--near, NUMA_NEAR or near:): "
            f"at most {MAX_NEAR}"
        )
    seen: dict[str, str] = {}
    for entry in entries:
        validate_near_name(prefix, entry.name)
        if not entry.selectors:
            raise ValueError(
                f"near resource {quoted(entry.name)}: scope:{entry.scope} names no device; "
                f"give a selector too ({entry.name}=net:ens1f0 {entry.name}=scope:socket)"
            )
        if entry.name in seen.values():
            raise ValueError(f"near resource {quoted(entry.name)} is given twice")
        variable = near_env(entry.name)
        if variable in seen:
            raise ValueError(
                f"near resources {quoted(seen[variable])} and {quoted(entry.name)} would both "
                f"set {variable} in their containers: rename one"
            )
        seen[variable] = entry.name
        if len(entry.selectors) > MAX_ALL_OF:
            raise ValueError(
                f"near resource {quoted(entry.name)}: {len(entry.selectors)} selectors, at "
                f"most {MAX_ALL_OF}"
            )
