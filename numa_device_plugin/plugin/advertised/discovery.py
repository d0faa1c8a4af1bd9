"""Discovery: one look at sysfs, turned into the plan per NUMA node and the resources.

The first stage of the one-way flow sysfs -> topology -> devices -> servicers ->
registration: :func:`discover` reads the topology (:mod:`numa_device_plugin.topology`),
decides which NUMA nodes to advertise, builds each resource's devices (:mod:`.build`) and logs
the plan. It is called at start and on every reload (SIGHUP).

At start, when no resource follows a device, the devices (PCI devices, disks, NICs: the
node page's inventory and details) are not needed to register and are read after
(:func:`discover` with ``devices=False``, then :func:`read_devices`): a server with a
thousand PCI devices registers without waiting for a third of a second of reading. The
device selectors (:mod:`~numa_device_plugin.topology.selectors`), the mount table and
the details are imported when first used.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog

from numa_device_plugin.ops.bounded import BoundError, read_file
from numa_device_plugin.plugin.advertised.build import build_resources
from numa_device_plugin.plugin.advertised.devicememory import near_memory
from numa_device_plugin.plugin.model.near import Near
from numa_device_plugin.plugin.model.resources import Resource
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.locality import Inventory, read_inventory
from numa_device_plugin.topology.memory import format_quantity
from numa_device_plugin.topology.nearest import Nearest, nearest_nodes
from numa_device_plugin.topology.numa import read_topology
from numa_device_plugin.topology.plan import (
    NodePlan,
    numa_limit_warning,
    plan_nodes,
    topology_warnings,
)

if TYPE_CHECKING:
    from numa_device_plugin.topology.mounts import MountTable
    from numa_device_plugin.topology.selectors import Selection

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class NearPlan:
    """Where a resource that follows a device goes: ``near`` (name and selector),
    ``resource`` (``<prefix>/<name>``), ``selection`` (what the selector matched, and
    their NUMA nodes), ``nodes`` (the advertised ones among them, sorted: where its
    devices lie) and ``reason`` (why nothing is advertised; None when ``nodes`` is
    not empty); ``followed``: per matched device on a NUMA node without CPUs, the line
    saying which node(s) it follows (:mod:`~numa_device_plugin.topology.nearest`);
    ``sockets``: with ``scope:socket``, (NUMA node, socket) of each of ``nodes``."""

    near: Near
    resource: str
    selection: Selection
    nodes: tuple[int, ...]
    reason: str | None
    followed: tuple[str, ...] = ()
    sockets: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Discovery:
    """What one look at sysfs yields: the per-node plan, the resources to serve, the
    devices with their NUMA locality (``inventory``), the plan of each resource that
    follows a device (``near``, in the order given) and ``details``: each disk's, NIC's
    and accelerator's ids (:func:`~numa_device_plugin.topology.details.details`).
    ``devices_read`` False: a first look that left the devices out (``inventory`` empty,
    ``details`` None) until :func:`read_devices`. ``nearest``: per NUMA node that is not
    advertised, where a device on it goes (:func:`~numa_device_plugin.topology.nearest.
    nearest_nodes` of ``plans``, made once a look for the plan and every page)."""

    plans: tuple[NodePlan, ...]
    resources: Mapping[str, Resource]
    inventory: Inventory = field(default_factory=Inventory)
    near: tuple[NearPlan, ...] = ()
    # What a selector can name, per device (topology.details.details); not compared.
    details: Mapping[str, list[dict[str, Any]]] | None = field(default=None, compare=False)
    devices_read: bool = field(default=True, compare=False)
    nearest: Mapping[int, Nearest] = field(default_factory=dict, compare=False)


def near_document(entry: NearPlan) -> dict[str, object]:
    """One near resource as JSON (``discover``, ``/debug/state``): ``{"resource",
    "selector", "matched", "matched_count", "unlocated", "nodes", "by_node": {node:
    [device…]}, "reason"}``; ``by_node``: what a pod allocated on that NUMA node is told
    (``NUMA_NEAR_<NAME>``), keys as text (JSON)."""
    return {
        "resource": entry.resource,
        "selector": " & ".join(entry.near.terms),
        "matched": list(entry.selection.matched),
        "matched_count": entry.selection.count,
        "unlocated": list(entry.selection.unlocated),
        "nodes": list(entry.nodes),
        "by_node": {str(node): list(names) for node, names in entry.selection.by_node},
        "followed": list(entry.followed),
        "reason": entry.reason,
    }


def plan_near(
    config: Config,
    plans: tuple[NodePlan, ...],
    inventory: Inventory,
    mounts: MountTable | None = None,
    nearest: Mapping[int, Nearest] | None = None,
) -> tuple[NearPlan, ...]:
    """Each ``config.near`` entry's selection in ``inventory`` (``path:`` selectors in
    ``mounts``, the host's mount table) and the advertised NUMA nodes it covers; pure.
    A device on a NUMA node that is not advertised (a memory-only node, all CPUs
    offline) follows the advertised node(s) nearest to it by the SLIT
    (:mod:`~numa_device_plugin.topology.nearest`), before the selectors of one name are
    matched against each other; a selection that still covers no advertised node
    advertises nothing, and says so."""
    if not config.near:
        return ()
    from numa_device_plugin.topology.nearest import follow_selection, nearest_nodes
    from numa_device_plugin.topology.selectors import all_of, select

    advertised = {plan.node.id for plan in plans if plan.advertised}
    nearest = nearest_nodes(plans)
    found = []
    for near in config.near:
        followed: list[str] = []
        selections = []
        for one in near.selectors:
            selection, lines = follow_selection(select(inventory, one, mounts), nearest, one)
            selections.append(selection)
            followed.extend(line for line in lines if line not in followed)
        selection = all_of(selections, near.selectors)
        nodes = tuple(sorted(selection.nodes & advertised))
        sockets: tuple[tuple[int, int], ...] = ()
        if near.scope == "socket" and nodes:
            selection, nodes, sockets, unknown = _socket_scope(selection, nodes, plans)
            followed.extend(unknown)
        reason = selection.reason
        if reason is None and not nodes:
            shown = ",".join(map(str, sorted(selection.nodes)))
            given = " & ".join(near.terms)
            reason = f"{given}: on NUMA node(s) {shown}, none of which is advertised"
        found.append(NearPlan(near, f"{config.resource_prefix}/{near.name}", selection, nodes,
                              reason, tuple(followed), sockets))  # fmt: skip
    return tuple(found)


def _socket_scope(
    selection: Selection, nodes: tuple[int, ...], plans: tuple[NodePlan, ...]
) -> tuple[Selection, tuple[int, ...], tuple[tuple[int, int], ...], list[str]]:
    """A ``scope:socket`` selection widened to every advertised NUMA node of its nodes'
    sockets: the selection (each node of a socket told of every device of that socket),
    the nodes, (node, socket) pairs, and a line per node whose socket is unknown (it
    stays as it is)."""
    from numa_device_plugin.plugin.advertised.build import node_sockets
    from numa_device_plugin.topology.selectors import MAX_NAMED

    socket_of = node_sockets(plans)
    unknown = [f"NUMA node {node} has no single known socket (physical_package_id); "
               "the resource stays on it" for node in nodes if node not in socket_of]  # fmt: skip
    chosen = {socket_of[node] for node in nodes if node in socket_of}
    widened = sorted({*nodes, *(n for n, s in socket_of.items() if s in chosen)})

    def group(node: int) -> tuple[str, int]:  # a node's socket, or itself when unknown
        return ("socket", socket_of[node]) if node in socket_of else ("node", node)

    told: dict[tuple[str, int], list[str]] = {}
    for node, names in selection.by_node:
        listed = told.setdefault(group(node), [])
        listed.extend(name for name in names if name not in listed)
    by_node = tuple((node, tuple(told[group(node)][:MAX_NAMED]))
                    for node in widened if told.get(group(node)))  # fmt: skip
    pairs = tuple((node, socket_of[node]) for node in widened if node in socket_of)
    return (replace(selection, nodes=frozenset(widened), by_node=by_node), tuple(widened),
            pairs, unknown)  # fmt: skip


# Warnings said once a process (the kubelet setting a machine of more than 8 NUMA nodes
# needs: the machine does not change between reloads).
LOGGED_ONCE: set[str] = set()


# Where devices come and go (read_inventory's folders): a device removed and added
# again is a new sysfs node, with a new inode, even under the same name.
DEVICE_FOLDERS = ("bus/pci/devices", "class/block", "class/net")


def look_key(config: Config) -> Hashable:
    """What a quiet look (:func:`discover` with ``quiet``) depends on, read cheaply:
    the topology (``devices/system``: cpulists, memory, huge pages; a few files a NUMA
    node), each entry's name and inode in :data:`DEVICE_FOLDERS` (the folder listings,
    no file read: a hot-plugged, removed or replaced device changes them, and so does
    a renamed NIC), and the mount table's bytes (``path:`` selectors follow it, and so
    do the disks' mount points the inventory lists). Equal keys: the quiet look would
    find what it found before.
    A device attribute that changes in place (a driver bound anew) is not in it: the
    device watch still reads everything every :data:`~..lifecycle.devicewatch.FULL_LOOK_EVERY`
    looks. Raises what :func:`discover` raises for the topology; an unreadable mount
    table (a FIFO, over the table limit) is part of the key (its error text), never a
    wait."""
    folders: list[tuple[tuple[str, int | str], ...]] = []
    for relative in DEVICE_FOLDERS:
        try:
            with os.scandir(config.sysfs_root / relative) as entries:
                folders.append(tuple(sorted((e.name, e.inode()) for e in entries)))
        except OSError as exc:
            folders.append((("error", str(exc)),))  # as read_inventory sees it: empty
    from numa_device_plugin.topology.mounts import MAX_TABLE_BYTES

    mounts: bytes | str
    try:  # as read_mount_table reads it: a FIFO never blocks, a huge table is refused
        mounts = read_file(config.mount_table, MAX_TABLE_BYTES)
    except BoundError as exc:
        mounts = str(exc)
    return (read_topology(config.sysfs_root), tuple(folders), mounts)


def _selects_paths(config: Config) -> bool:
    """Whether a ``config.near`` selector is a ``path:`` or ``path-below:`` one (the
    mount table is read at every look)."""
    if not config.near:
        return False
    from numa_device_plugin.topology.selectors import PATH_KINDS

    return any(one.kind in PATH_KINDS for entry in config.near for one in entry.selectors)


def discover(config: Config, *, quiet: bool = False, devices: bool = True) -> Discovery:
    """Read the topology under ``config.sysfs_root`` and build the resources; log the plan.
    ``quiet`` (the device watch's looks, every ``--device-interval``): no log lines and
    no ``details`` (they are read again, loud, only when something changed).
    ``devices`` False (serve's first look): when no resource follows a device, the
    devices are left out (``devices_read`` False), for :func:`read_devices` once the
    resources are registered.

    Raises :class:`~numa_device_plugin.topology.sysfs.SysfsError` (or its subclass
    ``SysfsFormatError``, naming the file and content) when sysfs cannot be read,
    ValueError when ``--memory-unit`` would give a pool too many devices.
    """
    topology = read_topology(config.sysfs_root)
    plans = plan_nodes(topology, include_cpuless=config.include_cpuless_nodes)
    devices = devices or bool(config.near)  # a near resource lies where its devices are
    inventory = read_inventory(config.sysfs_root) if devices else Inventory()
    mounts = None  # read only for path: selectors, at every look (a disk may move)
    if _selects_paths(config):
        from numa_device_plugin.topology.mounts import read_mount_table

        mounts = read_mount_table(config.mount_table, config.sysfs_root)
    nearest = nearest_nodes(plans)
    near = plan_near(config, plans, inventory, mounts, nearest)
    resources = build_resources(
        plans,
        prefix=config.resource_prefix,
        capacity=config.capacity,
        reserved_cpus=config.reserved_cpus,
        memory_unit=config.memory_unit,
        reserved_memory=config.reserved_memory,
        near=[(entry.near, frozenset(entry.nodes)) for entry in near],
        anywhere=config.serves_any,
        sockets=config.serves_sockets,
    )
    by_name = {entry.resource: entry for entry in near}
    resources = {  # each near resource knows which devices (sockets) are on its nodes
        name: resource
        if resource.near is None
        else replace(
            resource, near_devices=by_name[name].selection.by_node, sockets=by_name[name].sockets
        )
        for name, resource in resources.items()
    }
    if config.memory_unit is not None:  # the memory of a near resource's (any's) nodes
        resources.update(near_memory(resources))
    if quiet:
        return Discovery(plans=plans, resources=resources, inventory=inventory, near=near,
                         devices_read=devices, nearest=nearest)  # fmt: skip
    _log_plan(plans, near)
    limit = numa_limit_warning(plans)
    for warning in (*topology.warnings, *topology_warnings(plans)):
        if warning == limit:
            if warning in LOGGED_ONCE:
                continue  # the kubelet's setting: said once a process, not at every reload
            LOGGED_ONCE.add(warning)
        log.warning(warning)
    _log_inventory_warnings(inventory)  # none when the devices were left out
    if not resources:
        log.error("no NUMA node can be advertised; serving nothing until the next reload")
    if not devices:
        return Discovery(plans=plans, resources=resources, near=near, devices_read=False,
                         nearest=nearest)  # fmt: skip
    return Discovery(plans=plans, resources=resources, inventory=inventory, near=near,
                     details=_details(config, inventory, mounts), nearest=nearest)  # fmt: skip


def with_mount_points(config: Config, discovery: Discovery) -> Discovery:
    """``discovery`` with its details read again from the mount table now (the disks'
    mount points), the devices as they were: a mount that came, went or moved, without
    a look at sysfs. Blocking (the mount table's read)."""
    if not discovery.devices_read:
        return discovery
    return replace(discovery, details=_details(config, discovery.inventory, None))


def read_devices(config: Config, discovery: Discovery) -> Discovery:
    """``discovery`` with the devices its first look left out (``devices_read`` False)
    read: the inventory (its warnings logged, as :func:`discover` logs them) and the
    details. Blocking (sysfs reads, off the event loop); raises nothing for sysfs
    content (:func:`~numa_device_plugin.topology.locality.read_inventory` and the
    mount table's read warn instead)."""
    inventory = read_inventory(config.sysfs_root)
    _log_inventory_warnings(inventory)
    details = _details(config, inventory, None)
    return replace(discovery, inventory=inventory, details=details, devices_read=True)


def _details(
    config: Config, inventory: Inventory, mounts: MountTable | None
) -> Mapping[str, list[dict[str, Any]]]:
    """Each device's ids (:func:`~numa_device_plugin.topology.details.details`), with
    each disk's mount points (``mounts``, read here when None)."""
    from numa_device_plugin.topology.details import details
    from numa_device_plugin.topology.mounts import read_mount_table

    if mounts is None:
        mounts = read_mount_table(config.mount_table, config.sysfs_root)
    return details(config.sysfs_root, inventory, mounts)


def _log_plan(plans: tuple[NodePlan, ...], near: tuple[NearPlan, ...]) -> None:
    """One line per NUMA node (advertised or not, and why) and per resource that
    follows a device."""
    for plan in plans:
        node = plan.node
        fields = {
            "node": node.id,
            "cpus": sysfs.format_cpulist(node.cpus),
            "memory_bytes": node.memory_bytes,
        }
        if node.hugepages:
            fields["hugepages"] = {format_quantity(size): n for size, n in node.hugepages}
        if plan.reason is not None:
            fields["reason"] = plan.reason
        if plan.advertised:
            log.info("advertising NUMA node", **fields)
        else:
            log.warning("not advertising NUMA node", **fields)
    if not near:
        return
    from numa_device_plugin.topology.selectors import MAX_NAMED

    for entry in near:
        cut = [node for node, names in entry.selection.by_node if len(names) >= MAX_NAMED]
        if entry.reason is None and cut and entry.selection.count > MAX_NAMED:
            log.warning(
                "a resource near a device matches more devices than its variable lists",
                resource=entry.resource,
                matched=entry.selection.count,
                listed_per_node=MAX_NAMED,
                nodes=cut,
            )
        if entry.reason is None:
            followed = {"followed": list(entry.followed)} if entry.followed else {}
            log.info(
                "advertising a resource near a device",
                resource=entry.resource,
                selector=" & ".join(entry.near.terms),
                nodes=list(entry.nodes),
                matched=list(entry.selection.matched),
                **followed,
            )
        else:
            log.warning(
                "not advertising a resource near a device",
                resource=entry.resource,
                reason=entry.reason,
            )


def _log_inventory_warnings(inventory: Inventory) -> None:
    """The inventory's warnings (odd sysfs content), the first 20 and a count."""
    for warning in inventory.warnings[:20]:
        log.warning(warning)
    if len(inventory.warnings) > 20:
        log.warning(f"... and {len(inventory.warnings) - 20} more warnings about devices")
