"""Discovery: one look at sysfs, turned into the plan per NUMA node and the resources.

The first stage of the one-way flow sysfs -> topology -> devices -> servicers ->
registration: :func:`discover` reads the topology (:mod:`.topology`), decides which
NUMA nodes to advertise, builds each resource's devices (:mod:`.devices`) and logs
the plan. It is called at start and on every reload (SIGHUP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.devices import Resource, build_resources
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.memory import format_quantity
from numa_device_plugin.topology.numa import NodePlan, plan_nodes, read_topology, topology_warnings

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Discovery:
    """What one look at sysfs yields: the per-node plan and the resources to serve."""

    plans: tuple[NodePlan, ...]
    resources: Mapping[str, Resource]


def discover(config: Config) -> Discovery:
    """Read the topology under ``config.sysfs_root`` and build the resources; log the plan.

    Raises :class:`~numa_device_plugin.topology.sysfs.SysfsError` (or its subclass
    ``SysfsFormatError``, naming the file and content) when sysfs cannot be read,
    ValueError when ``--memory-unit`` would give a pool too many devices.
    """
    topology = read_topology(config.sysfs_root)
    plans = plan_nodes(topology, include_cpuless=config.include_cpuless_nodes)
    resources = build_resources(
        plans,
        prefix=config.resource_prefix,
        capacity=config.capacity,
        reserved_cpus=config.reserved_cpus,
        memory_unit=config.memory_unit,
        reserved_memory=config.reserved_memory,
    )
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
    for warning in (*topology.warnings, *topology_warnings(plans)):
        log.warning(warning)
    if not resources:
        log.error("no NUMA node can be advertised; serving nothing until the next reload")
    return Discovery(plans=plans, resources=resources)
