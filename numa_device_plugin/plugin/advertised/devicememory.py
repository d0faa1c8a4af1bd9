"""Memory that follows a resource over NUMA nodes: with ``--memory-unit``, a resource
that follows a device (``numa-align/data-disk``), and ``numa-align/any``, get their
nodes' memory resources under their own names (``numa-align/data-disk-memory``,
``numa-align/any-hugepages-2mi``), so a pod that asks for the disk's node (or any node)
can ask for that node's memory too without knowing which node it is.

On one NUMA node N the memory resource is N's own under another name; on several it
has one part per node holding that memory type (:attr:`Resource.parts`), and its free
devices are offered on the node the resource it follows exposes
(:mod:`~numa_device_plugin.plugin.counts.exposure`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from numa_device_plugin.plugin.model.names import validate_extended_resource_name
from numa_device_plugin.plugin.model.resources import Resource

log = structlog.get_logger(__name__)


def near_memory(resources: Mapping[str, Resource]) -> dict[str, Resource]:
    """The memory resources of each resource of ``resources`` that follows a device or
    is ``any`` or ``socket-S``: for each memory type its NUMA nodes have
    (``<prefix>/numa-N-memory``,
    ``<prefix>/numa-N-hugepages-2mi``), ``<name>-memory`` (…``-hugepages-2mi``) with the
    same pools and device ids, so each is counted live as its node's (the Memory
    Manager's allocatable minus assigned there, :func:`~numa_device_plugin.plugin.counts.
    capacity.live_memory_devices`), and the resource's ``near``, ``near_nodes`` (the
    nodes that have the type) and ``near_devices`` (Allocate sets its variable);
    ``follows`` names the resource. A name taken or invalid is left out with a warning.
    Returns the new resources only, in the order found."""
    found: dict[str, Resource] = {}
    for base in resources.values():
        spanning = base.anywhere or base.socket is not None
        if (base.near is None and not spanning) or base.memory is not None:
            continue
        prefix = base.name.split("/", 1)[0]
        by_suffix: dict[str, list[Resource]] = {}
        for node_id in base.node_ids:
            own = f"{prefix}/numa-{node_id}"
            for memory in resources.values():
                if memory.memory is None or memory.near is not None or memory.follows:
                    continue
                if memory.node_id == node_id and memory.name.startswith(own + "-"):
                    by_suffix.setdefault(memory.name.removeprefix(own), []).append(memory)
        for suffix, pools in by_suffix.items():
            name = base.name + suffix
            try:
                validate_extended_resource_name(name)
            except ValueError as exc:
                log.warning("no memory resource for a resource over NUMA nodes",
                            resource=name, reason=str(exc))  # fmt: skip
                continue
            if name in resources or name in found:
                log.warning("no memory resource for a resource over NUMA nodes", resource=name,
                            reason="the name is taken by another resource")  # fmt: skip
                continue
            parts = tuple(replace(pool, name=name) for pool in pools)
            nodes = {part.node_id for part in parts}
            found[name] = replace(
                parts[0],
                name=name,
                devices=tuple(device for part in parts for device in part.devices),
                near=base.near,
                near_nodes=tuple(part.node_id for part in parts),
                near_devices=base.near_devices,
                follows=base.name,
                parts=parts if len(parts) > 1 else (),
                sockets=tuple(pair for pair in base.sockets if pair[0] in nodes),
            )
    return found
