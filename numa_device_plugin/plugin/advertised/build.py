"""Building the resources from a plan: per advertised NUMA node its resource (slots, or
one device per CPU in ``cpus`` mode) and, with ``--memory-unit``, its memory resources;
then the resources that follow a device. Pure: two builds from the same plan and settings
are equal (:mod:`numa_device_plugin.plugin.model.resources` says why that matters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_device_plugin.plugin.model.ids import cpu_device_id, device_id
from numa_device_plugin.plugin.model.names import (
    DEFAULT_RESOURCE_PREFIX,
    any_name,
    resource_name,
    socket_resource_name,
    validate_resource_prefix,
)
from numa_device_plugin.plugin.model.near import Near
from numa_device_plugin.plugin.model.resources import (
    DEFAULT_CAPACITY,
    Capacity,
    Device,
    Resource,
    validate_capacity,
)
from numa_device_plugin.topology.memory import (
    ReservedMemory,
    check_total_devices,
    memory_device_id,
    node_pools,
    resource_suffix,
)
from numa_device_plugin.topology.plan import NodePlan


def build_resource(prefix: str, node_id: int, capacity: int) -> Resource:
    """The resource of one NUMA node with ``capacity`` healthy slot devices."""
    devices = tuple(
        Device(id=device_id(node_id, index), node_id=node_id, index=index)
        for index in range(capacity)
    )
    return Resource(name=resource_name(prefix, node_id), node_id=node_id, devices=devices)


def cpu_devices(node_id: int, cpus: Iterable[int]) -> tuple[Device, ...]:
    """One healthy device per CPU, in CPU order (``cpus`` mode)."""
    return tuple(
        Device(id=cpu_device_id(node_id, cpu), node_id=node_id, index=cpu) for cpu in sorted(cpus)
    )


def memory_resources(
    prefix: str, plan: NodePlan, unit: int, reserved: ReservedMemory
) -> list[Resource]:
    """With ``--memory-unit`` ``unit`` (bytes): the memory resources of an advertised
    NUMA node, ``<prefix>/numa-<id>-memory`` and one per hugepage pool, each with one
    device per unit of the pool's size (:mod:`numa_device_plugin.topology.memory`).
    Raises ValueError when the unit makes too many devices."""
    node = plan.node
    resources = []
    for pool in node_pools(node.id, node.memory_bytes, dict(node.hugepages), unit, reserved):
        devices = tuple(
            Device(id=memory_device_id(node.id, pool.memory_type, index), node_id=node.id,
                   index=index)
            for index in range(pool.devices)
        )  # fmt: skip
        name = f"{resource_name(prefix, node.id)}-{resource_suffix(pool.memory_type)}"
        resources.append(Resource(name=name, node_id=node.id, devices=devices, memory=pool))
    return resources


def near_resource(
    prefix: str,
    near: Near,
    nodes: Iterable[NodePlan],
    capacity: Capacity,
    reserved_cpus: frozenset[int] = frozenset(),
) -> Resource:
    """The resource ``<prefix>/<near.name>`` on the advertised NUMA nodes of ``nodes``
    (at least one): per node, ``capacity`` slots or (``cpus``) one device per usable CPU
    not in ``reserved_cpus``, with the ids the node's own resource uses, so ids stay
    stable across restarts."""
    chosen = sorted(nodes, key=lambda plan: plan.node.id)
    devices: list[Device] = []
    for plan in chosen:
        node_id = plan.node.id
        if isinstance(capacity, int):
            devices.extend(build_resource(prefix, node_id, capacity).devices)
        else:
            devices.extend(cpu_devices(node_id, plan.node.cpus - reserved_cpus))
    node_ids = tuple(plan.node.id for plan in chosen)
    return Resource(
        name=f"{prefix}/{near.name}",
        node_id=node_ids[0],
        devices=tuple(devices),
        near=near,
        near_nodes=node_ids,
    )


def any_resource(prefix: str, node_resources: Iterable[Resource]) -> Resource | None:
    """``<prefix>/any``: over the NUMA nodes of ``node_resources`` (their ``numa-N``
    resources, CPU devices) with at least one device, their devices and ids (so ids stay
    stable across restarts and one CPU is one device whichever resource names it); None
    when no node has a device."""
    chosen = sorted((r for r in node_resources if r.devices), key=lambda r: r.node_id)
    if not chosen:
        return None
    return Resource(
        name=any_name(prefix),
        node_id=chosen[0].node_id,
        devices=tuple(device for resource in chosen for device in resource.devices),
        near_nodes=tuple(resource.node_id for resource in chosen),
        anywhere=True,
    )


def node_sockets(plans: Iterable[NodePlan]) -> dict[int, int]:
    """Each advertised NUMA node's socket (physical package), for those whose usable
    CPUs all sit in one (:attr:`~numa_device_plugin.topology.numa.NumaNode.sockets`): a
    node spanning sockets (AMD's NPS0) or of unknown socket is absent."""
    return {
        plan.node.id: next(iter(plan.node.sockets))
        for plan in plans
        if plan.advertised and len(plan.node.sockets) == 1
    }


def socket_resources(
    prefix: str, plans: Iterable[NodePlan], node_resources: Iterable[Resource]
) -> list[Resource]:
    """``<prefix>/socket-S`` for each socket S holding more than one advertised NUMA node
    (AMD NPS2/NPS4, Intel SNC-2/3/4): over those nodes' ``numa-N`` resources
    (``node_resources``), their devices and ids, as :func:`any_resource` is over all; in
    socket order. A node whose CPUs are all reserved (no device) still counts, so what
    is advertised does not hang on ``--reserved-cpus``; a node spanning sockets joins
    none (:func:`node_sockets`)."""
    sockets = node_sockets(plans)
    by_socket: dict[int, list[Resource]] = {}
    for resource in sorted(node_resources, key=lambda r: r.node_id):
        if resource.node_id in sockets:
            by_socket.setdefault(sockets[resource.node_id], []).append(resource)
    found = []
    for socket, chosen in sorted(by_socket.items()):
        if len(chosen) < 2:
            continue
        found.append(Resource(
            name=socket_resource_name(prefix, socket),
            node_id=chosen[0].node_id,
            devices=tuple(device for resource in chosen for device in resource.devices),
            near_nodes=tuple(resource.node_id for resource in chosen),
            socket=socket,
            sockets=tuple((resource.node_id, socket) for resource in chosen),
        ))  # fmt: skip
    return found


def build_resources(
    plans: Iterable[NodePlan],
    *,
    prefix: str = DEFAULT_RESOURCE_PREFIX,
    capacity: Capacity = DEFAULT_CAPACITY,
    reserved_cpus: frozenset[int] = frozenset(),
    memory_unit: int | None = None,
    reserved_memory: ReservedMemory = (),
    near: Iterable[tuple[Near, frozenset[int]]] = (),
    anywhere: bool = False,
    sockets: bool = False,
) -> Mapping[str, Resource]:
    """One resource per advertised NUMA node, keyed by resource name, in NUMA id order,
    and with ``memory_unit`` (bytes) its memory resources after it; then, per ``near``
    entry (a :class:`~numa_device_plugin.plugin.model.near.Near` and the NUMA nodes its device
    sits on), its resource on those of the nodes that are advertised (none: no resource);
    with ``anywhere`` (``cpus`` mode), ``<prefix>/any`` (:func:`any_resource`); with
    ``sockets``, ``<prefix>/socket-S`` per socket of several NUMA nodes
    (:func:`socket_resources`) last.

    In ``cpus`` mode a node's devices are its usable CPUs minus ``reserved_cpus``
    (the starting point; the kubelet's pod resources API refines it live).
    Raises ValueError for an invalid prefix or capacity, or a unit too small (for one
    pool, or for all together: ``MemoryUnitError``).
    """
    validate_resource_prefix(prefix)
    validate_capacity(capacity)
    resources = {}
    plans_seen = sorted(plans, key=lambda plan: plan.node.id)
    for plan in plans_seen:
        if not plan.advertised:
            continue
        node_id = plan.node.id
        if not isinstance(capacity, int):
            resource = Resource(
                name=resource_name(prefix, node_id),
                node_id=node_id,
                devices=cpu_devices(node_id, plan.node.cpus - reserved_cpus),
            )
        else:
            resource = build_resource(prefix, node_id, capacity)
        resources[resource.name] = resource
        if memory_unit is not None:
            for memory in memory_resources(prefix, plan, memory_unit, reserved_memory):
                resources[memory.name] = memory
    if memory_unit is not None:
        memory_devices = [len(r.devices) for r in resources.values() if r.memory is not None]
        nodes = sum(1 for plan in plans_seen if plan.advertised)
        check_total_devices(sum(memory_devices), memory_unit, nodes)
    for entry, node_ids in near:
        covered = [p for p in plans_seen if p.advertised and p.node.id in node_ids]
        if covered:
            resource = near_resource(prefix, entry, covered, capacity, reserved_cpus)
            resources[resource.name] = resource
    own = [r for r in resources.values() if r.memory is None and r.node_own]
    if anywhere:
        found = any_resource(prefix, own)
        if found is not None:
            resources[found.name] = found
    if sockets:
        for found in socket_resources(prefix, plans_seen, own):
            resources[found.name] = found
    return resources
