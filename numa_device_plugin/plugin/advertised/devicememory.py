"""Memory that follows a device: with ``--memory-unit``, a resource that follows a
device on one NUMA node (``numa-align/data-disk`` on node 1) gets that node's memory
resources under its own name (``numa-align/data-disk-memory``,
``numa-align/data-disk-hugepages-2mi``), so a pod that asks for the disk's node can ask
for that node's memory too without knowing which node it is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from numa_device_plugin.plugin.model.names import validate_extended_resource_name
from numa_device_plugin.plugin.model.resources import Resource

log = structlog.get_logger(__name__)


def near_memory(resources: Mapping[str, Resource]) -> dict[str, Resource]:
    """The memory resources of each resource of ``resources`` that follows a device on
    exactly one NUMA node N: for each memory resource of N (``<prefix>/numa-N-memory``,
    ``<prefix>/numa-N-hugepages-2mi``), ``<near name>-memory`` (…``-hugepages-2mi``) with
    the same pool and device ids, so it is counted live as N's (the Memory Manager's
    allocatable minus assigned on N, :func:`~numa_device_plugin.plugin.counts.capacity.
    live_memory_devices`), and the near resource's ``near``, ``near_nodes`` and
    ``near_devices`` (Allocate sets its variable). A resource on several nodes gets none
    (whose memory would it be?); a name taken or invalid is left out with a warning.
    Returns the new resources only, in the order found."""
    found: dict[str, Resource] = {}
    for near in resources.values():
        if near.near is None or near.memory is not None or len(near.near_nodes) != 1:
            continue
        (node_id,) = near.near_nodes
        prefix = near.name.split("/", 1)[0]
        base = f"{prefix}/numa-{node_id}"
        for memory in resources.values():
            if memory.memory is None or memory.near is not None or memory.node_id != node_id:
                continue
            name = near.name + memory.name.removeprefix(base)
            try:
                validate_extended_resource_name(name)
            except ValueError as exc:
                log.warning("no memory resource for a near resource", resource=name,
                            reason=str(exc))  # fmt: skip
                continue
            if name in resources or name in found:
                log.warning("no memory resource for a near resource", resource=name,
                            reason="the name is taken by another resource")  # fmt: skip
                continue
            found[name] = replace(
                memory, name=name, near=near.near, near_nodes=near.near_nodes,
                near_devices=near.near_devices,
            )  # fmt: skip
    return found
