"""From advertised NUMA nodes to extended resources and their slot devices.

The model is a plain tree, resource name -> :class:`Resource` -> its
:class:`Device` tuple, built purely from a plan (:func:`build_resources`).

Two capacity modes: an integer N gives every NUMA node N "slot" devices
(``numa1-slot0042``); ``cpus`` gives a NUMA node one device per CPU it can hand
out exclusively (``numa1-cpu0012``, numbered by CPU id), so a pod asks for as
many devices as it asks integer CPUs and the count the scheduler sees is a CPU
count (:mod:`numa_device_plugin.plugin.capacity` keeps it live). Two
builds from the same plan and settings are equal, which is what makes device
ids stable across plugin and kubelet restarts: the kubelet re-admits running
pods by the device ids it recorded, and fails them if those ids vanish.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from numa_device_plugin.plugin.ids import cpu_device_id as cpu_device_id
from numa_device_plugin.plugin.ids import device_id as device_id
from numa_device_plugin.plugin.ids import device_index as device_index
from numa_device_plugin.plugin.ids import socket_name as socket_name
from numa_device_plugin.topology.memory import (
    MemoryPool,
    ReservedMemory,
    check_total_devices,
    memory_device_id,
    node_pools,
    resource_suffix,
)
from numa_device_plugin.topology.numa import NodePlan

if TYPE_CHECKING:
    from numa_device_plugin.plugin.near import Near

DEFAULT_RESOURCE_PREFIX = "numa-align"
DEFAULT_CAPACITY = 100
# --capacity cpus: one device per exclusive CPU of the NUMA node.
CPUS: Literal["cpus"] = "cpus"
Capacity = int | Literal["cpus"]
# Each Device costs ~40 bytes in a ListAndWatch message; the kubelet's default
# 4 MiB gRPC limit would allow ~100k, this keeps messages far below it.
MAX_CAPACITY = 10_000
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# v1beta1 Device.ID: "Max length of this field is 63 characters".
MAX_DEVICE_ID_LENGTH = 63

# Kubernetes apimachinery validation, as the kubelet applies it to resource names.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_REQUESTS_PREFIX = "requests."


@dataclass(frozen=True)
class Device:
    """One device of a NUMA node's resource: v1beta1 ``Device{ID, health, topology}``,
    where ``topology`` is ``TopologyInfo{nodes: [NUMANode{ID: node_id}]}``.
    ``index`` orders devices (the slot number, or the CPU id in ``cpus`` mode)."""

    id: str
    node_id: int
    index: int
    health: str = HEALTHY


@dataclass(frozen=True)
class Resource:
    """One extended resource (``numa-align/numa-<node_id>``) served by one device plugin.

    ``socket_name`` is the file name of its unix socket in the device-plugin
    folder, which is also the ``endpoint`` of its RegisterRequest. ``memory``: for
    a memory resource (``numa-align/numa-1-memory``, ``--memory-unit``), the pool
    its devices stand for; None for the NUMA node's CPU (or slot) resource.
    ``near``: for a resource that follows a device (``numa-align/data-disk``), its
    :class:`~numa_device_plugin.plugin.near.Near`; its devices then lie on each of
    ``near_nodes`` (the selected device's NUMA nodes, sorted), each device's
    TopologyInfo naming its own node, ``node_id`` is the first of them, and
    ``near_devices`` says which devices are on each node
    (:attr:`~numa_device_plugin.topology.selectors.Selection.by_node`), for the
    container's :func:`~numa_device_plugin.plugin.near.near_env` variable; ``lost``: why
    its device is gone since it was served (it is kept, every device Unhealthy:
    :mod:`.nearhealth`), else None.
    """

    name: str
    node_id: int
    devices: tuple[Device, ...]
    memory: MemoryPool | None = None
    near: Near | None = None
    near_nodes: tuple[int, ...] = ()
    near_devices: tuple[tuple[int, tuple[str, ...]], ...] = ()
    lost: str | None = None

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The NUMA nodes its devices lie on: ``near_nodes``, else ``(node_id,)``."""
        return self.near_nodes or (self.node_id,)

    def devices_on(self, node_id: int) -> tuple[Device, ...]:
        """Its devices whose TopologyInfo names NUMA node ``node_id``."""
        return tuple(device for device in self.devices if device.node_id == node_id)


def validate_extended_resource_name(name: str) -> None:
    """Raise ValueError unless the kubelet accepts ``name`` as an extended resource name.

    The kubelet's Register handler checks ``IsExtendedResourceName``: the name
    contains ``/``, is not in the ``kubernetes.io/`` domain, does not start with
    ``requests.``, and ``requests.`` + name is a qualified name (a DNS-1123
    subdomain of at most 253 characters, ``/``, a name part of at most 63).
    """
    if "/" not in name:
        raise ValueError(
            f"{quoted(name)} has no domain: extended resource names look like domain/name"
        )
    if "kubernetes.io/" in name:
        raise ValueError(
            f"{quoted(name)} is in the kubernetes.io domain, reserved for native resources"
        )
    if name.startswith(_REQUESTS_PREFIX):
        raise ValueError(f"{quoted(name)} must not start with {_REQUESTS_PREFIX!r}")
    domain, _, part = (_REQUESTS_PREFIX + name).partition("/")
    if "/" in part:
        raise ValueError(f"{quoted(name)} has more than one '/'")
    if len(domain) > 253 or not _DNS1123_SUBDOMAIN.match(domain):
        raise ValueError(
            f"{quoted(name)}: domain {quoted(domain.removeprefix(_REQUESTS_PREFIX))} must be a "
            "lowercase DNS subdomain (a-z, 0-9, '-', '.'; at most 244 characters)"
        )
    if len(part) > 63 or not _QUALIFIED_NAME_PART.match(part):
        raise ValueError(
            f"{quoted(name)}: name part {quoted(part)} must be 1-63 characters of A-Z, a-z, "
            "0-9, '-', '_', '.', starting and ending with a letter or digit"
        )


def quoted(text: str) -> str:
    """``repr(text)`` for an error message, cut to 80 characters with the length said
    (a 120 KB name echoed whole made a 240 KB usage error)."""
    if len(text) <= 80:
        return repr(text)
    return f"{text[:60]!r}... ({len(text)} characters)"


def resource_name(prefix: str, node_id: int) -> str:
    """``<prefix>/numa-<node_id>``, e.g. ``numa-align/numa-1``."""
    return f"{prefix}/numa-{node_id}"


def validate_resource_prefix(prefix: str) -> str:
    """Return ``prefix`` when ``<prefix>/numa-N`` is a valid extended resource name.

    Raises ValueError with the kubelet's reason otherwise.
    """
    validate_extended_resource_name(resource_name(prefix, 0))
    return prefix


def validate_capacity(capacity: Capacity) -> Capacity:
    """Return ``capacity`` when it is ``cpus`` or 1 <= capacity <= MAX_CAPACITY; raise
    ValueError otherwise."""
    if capacity == CPUS:
        return capacity
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"capacity must be a whole number or {CPUS!r}, got {capacity!r}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY}, got {capacity}")
    return capacity


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


def build_resources(
    plans: Iterable[NodePlan],
    *,
    prefix: str = DEFAULT_RESOURCE_PREFIX,
    capacity: Capacity = DEFAULT_CAPACITY,
    reserved_cpus: frozenset[int] = frozenset(),
    memory_unit: int | None = None,
    reserved_memory: ReservedMemory = (),
    near: Iterable[tuple[Near, frozenset[int]]] = (),
) -> Mapping[str, Resource]:
    """One resource per advertised NUMA node, keyed by resource name, in NUMA id order,
    and with ``memory_unit`` (bytes) its memory resources after it; then, per ``near``
    entry (a :class:`~numa_device_plugin.plugin.near.Near` and the NUMA nodes its device
    sits on), its resource on those of the nodes that are advertised (none: no resource).

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
    return resources
