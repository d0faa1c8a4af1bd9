"""The live device list of each resource, from what the kubelet's pod resources API says.

Pure functions over a :class:`KubeletView` (the answers of the kubelet's
``v1.PodResourcesLister``: ``GetAllocatableResources`` and ``List``) and the
topology; nothing here does I/O.

``cpus`` mode (``--capacity cpus``): NUMA node N's resource has one device per
CPU in (the kubelet's allocatable CPUs ∩ N's usable CPUs), plus any device a
container still holds. Exclusive CPUs of N already assigned to containers
(other Guaranteed pods, or ours holding more CPUs than devices) cannot go to a
new pod, so only

    healthy(N) = held(N) + |allocatable CPUs of N that no container has|

devices are Healthy: every held device, then the lowest-numbered free ones.
The kubelet's allocatable for the resource is that healthy count, and the
scheduler subtracts what running pods requested, leaving exactly the free
exclusive CPUs of N.

Both modes: a kubelet whose CPU manager is not ``static`` reports no
allocatable ``cpu_ids`` and can align nothing; every device is then Unhealthy
unless ``allow_unaligned``. Without the API (``view`` None) the check is
skipped and allocatable CPUs are N's usable CPUs minus ``reserved_cpus``. The
manager passes None only while the API has never answered since start; during
a later outage it keeps passing the last answer.

Held ids count only when they are ids this plugin advertises for that NUMA node in
this mode (:func:`admissible`), so a confused or hostile kubelet can never make a
list longer than the mode allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.devices import (
    CPUS,
    HEALTHY,
    MAX_CAPACITY,
    UNHEALTHY,
    Capacity,
    Device,
    Resource,
    cpu_device_id,
    device_index,
)
from numa_device_plugin.plugin.devices import device_id as slot_id
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.memory import MAX_MEMORY_DEVICES, memory_device_id

# The label value of our own containers in numa_node_assigned_cpus{holder=...}.
OURS = "numa-align"
OTHERS = "other"


@dataclass(frozen=True)
class NodeCapacity:
    """One advertised NUMA node's CPUs as the kubelet sees them, for metrics and status.

    ``allocatable_cpus``: CPUs of the node the kubelet may hand out exclusively;
    ``assigned_ours``/``assigned_other``: those already assigned to containers
    that hold / do not hold the node's resource; ``held``: device ids of the
    resource held by containers; ``healthy``/``devices``: device counts;
    ``misaligned``: containers holding the resource whose exclusive CPUs are not
    all on the node (or who have none).
    """

    node_id: int
    resource: str
    allocatable_cpus: frozenset[int]
    assigned_ours: frozenset[int]
    assigned_other: frozenset[int]
    held: frozenset[str]
    devices: int
    healthy: int
    misaligned: int

    @property
    def free_cpus(self) -> int:
        """Allocatable CPUs of the node no container has yet."""
        return len(self.allocatable_cpus - self.assigned_ours - self.assigned_other)


def misalignment(holder: Holder, node_id: int, node_cpus: frozenset[int]) -> str | None:
    """Why a container holding NUMA node ``node_id``'s resource is not aligned to it,
    or None when all its exclusive CPUs lie on the node."""
    if not holder.cpus:
        return "no exclusive CPUs (not Guaranteed with integer CPUs?)"
    outside = holder.cpus - node_cpus
    if outside:
        return f"CPUs {sysfs.format_cpulist(outside)} are not on NUMA node {node_id}"
    return None


def node_capacity(
    resource: str,
    node_id: int,
    node_cpus: frozenset[int],
    devices: Iterable[Device],
    view: KubeletView | None,
    reserved_cpus: frozenset[int] = frozenset(),
    related: Iterable[str] = (),
) -> NodeCapacity:
    """Figures of one NUMA node (``node_cpus``: its usable CPUs) from ``view``.

    ``related``: resources that follow a device on this node (``numa-align/data-disk``):
    a container holding one of their devices on this node counts as ours too (its CPUs
    in ``assigned_ours``, and checked for alignment), though only ``resource``'s ids
    are ``held``."""
    near = tuple(related)
    device_list = tuple(devices)
    if view is None:
        allocatable = node_cpus - reserved_cpus
        holders: tuple[Holder, ...] = ()
        assigned: frozenset[int] = frozenset()
    else:
        allocatable = view.allocatable_cpus & node_cpus
        holders = view.holders
        assigned = view.assigned_cpus & allocatable
    held: set[str] = set()
    ours: set[int] = set()
    misaligned = 0
    for holder in holders:
        ids = holder.devices.get(resource, ())
        held.update(ids)
        if ids or _holds_near(holder, near, node_id):
            ours.update(holder.cpus & allocatable)
            misaligned += misalignment(holder, node_id, node_cpus) is not None
    return NodeCapacity(
        node_id=node_id,
        resource=resource,
        allocatable_cpus=frozenset(allocatable),
        assigned_ours=frozenset(ours),
        assigned_other=frozenset(assigned - ours),
        held=frozenset(held),
        devices=len(device_list),
        healthy=sum(1 for device in device_list if device.health == HEALTHY),
        misaligned=misaligned,
    )


def _holds_near(holder: Holder, near: tuple[str, ...], node_id: int) -> bool:
    """True when ``holder`` holds a device of NUMA node ``node_id`` of a resource in
    ``near``."""
    return any(
        device_index(device_id, node_id) is not None
        for name in near
        for device_id in holder.devices.get(name, ())
    )


def live_devices(
    capacity: Capacity,
    node_id: int,
    node_cpus: frozenset[int],
    resource: str,
    base: tuple[Device, ...],
    view: KubeletView | None,
    *,
    reserved_cpus: frozenset[int] = frozenset(),
    allow_unaligned: bool = False,
) -> tuple[Device, ...]:
    """The device list to advertise for ``resource`` (NUMA node ``node_id``) now.

    ``base``: the resource's devices as built at discovery (the slots, in slots
    mode). ``view`` None: the pod resources API is unreachable. Deterministic:
    the same inputs give the same list, ids in CPU (or slot) order.
    """
    unaligned = view is not None and not view.cpu_manager_static and not allow_unaligned
    if capacity != CPUS:
        health = UNHEALTHY if unaligned else HEALTHY
        return tuple(_device(d.id, node_id, d.index, health) for d in base)
    if view is None or not view.cpu_manager_static:
        # No API, or no exclusive CPUs at all: the CPUs the kubelet would have.
        allocatable = node_cpus - reserved_cpus
    else:
        allocatable = view.allocatable_cpus & node_cpus
    held = _held_in_cpus_mode(held_devices(view, resource, node_id), node_id, node_cpus)
    assigned = frozenset() if view is None else view.assigned_cpus & allocatable
    ordered = [(cpu, _cpu_id(node_id, cpu)) for cpu in sorted(allocatable)]
    free = len(allocatable - assigned)  # assigned ⊆ allocatable: never negative
    return _with_health(node_id, ordered, held, free, unaligned)


def live_resource_devices(
    capacity: Capacity,
    resource: Resource,
    node_cpus: Callable[[int], frozenset[int]],
    view: KubeletView | None,
    *,
    reserved_cpus: frozenset[int] = frozenset(),
    allow_unaligned: bool = False,
) -> tuple[Device, ...]:
    """The device list to advertise for ``resource`` now: :func:`live_memory_devices`
    for a memory resource, else :func:`live_devices` on each of its NUMA nodes in turn
    (one for ``numa-N``; every node a resource that follows a device covers), each
    node's devices counted from that node's CPUs (``node_cpus(node_id)``)."""
    if resource.memory is not None:
        return live_memory_devices(resource, view, allow_unaligned=allow_unaligned)
    return tuple(
        device
        for node_id in resource.node_ids
        for device in live_devices(
            capacity,
            node_id,
            node_cpus(node_id),
            resource.name,
            resource.devices_on(node_id),
            view,
            reserved_cpus=reserved_cpus,
            allow_unaligned=allow_unaligned,
        )
    )


def held_devices(view: KubeletView | None, resource: str, node_id: int) -> set[str]:
    """The ids of ``resource`` that containers hold (``List()``) and that this plugin
    could have advertised for NUMA node ``node_id`` (:func:`device_index`); empty
    without a view. Other ids are left out: :func:`foreign_devices`."""
    return {
        device_id
        for device_id in _held_ids(view, resource)
        if device_index(device_id, node_id) is not None
    }


def admissible(
    capacity: Capacity, resource: Resource | None, node_id: int, node_cpus: frozenset[int]
) -> Callable[[str], bool]:
    """Whether a held id is one this plugin advertises on NUMA node ``node_id`` in this
    mode: for a memory resource (``resource.memory`` set), a unit of its pool under
    :data:`MAX_MEMORY_DEVICES`; in ``cpus`` mode, the id of one of ``node_cpus`` (or a
    slot id of an earlier slots-mode run: :func:`_held_in_cpus_mode` bounds how many);
    with slots, a slot under :data:`MAX_CAPACITY`. The test is exact (``numa0-cpu0100``
    is no CPU of a 4-CPU node; a slot id is no CPU id)."""
    pool = None if resource is None else resource.memory
    if pool is not None:
        kind = pool.memory_type

        def memory_unit(held: str) -> bool:
            index = device_index(held, node_id)
            return (
                index is not None
                and index < MAX_MEMORY_DEVICES
                and held == memory_device_id(node_id, kind, index)
            )

        return memory_unit

    if capacity == CPUS:
        cpu_ids = frozenset(_cpu_id(node_id, cpu) for cpu in node_cpus)
        return lambda held: held in cpu_ids or _is_slot(held, node_id)
    return lambda held: _is_slot(held, node_id)


def _is_slot(held: str, node_id: int) -> bool:
    """Whether ``held`` is a slot id of NUMA node ``node_id`` under :data:`MAX_CAPACITY`."""
    index = device_index(held, node_id)
    return index is not None and index < MAX_CAPACITY and held == slot_id(node_id, index)


def _held_in_cpus_mode(held: set[str], node_id: int, node_cpus: frozenset[int]) -> set[str]:
    """The held ids that count in ``cpus`` mode: those of ``node_cpus``, and slot ids of
    an earlier slots-mode run (the kubelet re-admits a pod by them), at most one per
    CPU, lowest first: never past twice the node's CPUs, whatever the kubelet says."""
    cpu_ids = {_cpu_id(node_id, cpu) for cpu in node_cpus}
    slots = sorted(
        (i for i in held - cpu_ids if _is_slot(i, node_id)), key=lambda i: _held_index(i, node_id)
    )
    return (held & cpu_ids) | set(slots[: len(node_cpus)])


def foreign_devices(
    view: KubeletView | None, resource: str, node_ids: int | Iterable[int],
    ours: Mapping[int, Callable[[str], bool]] | None = None,
) -> set[str]:  # fmt: skip
    """Held ids of ``resource`` that this plugin never advertises on its NUMA node(s)
    ``node_ids`` (another form, another node, non-ASCII digits, an index of over 9
    digits; with ``ours`` (NUMA node id -> :func:`admissible`), any id it refuses):
    they count for nothing. The kubelet reports only ids a plugin advertised, so these
    mean a confused or hostile kubelet; the caller says so once per id."""
    nodes = (node_ids,) if isinstance(node_ids, int) else tuple(node_ids)
    return {
        device_id
        for device_id in _held_ids(view, resource)
        if all(
            device_index(device_id, node_id) is None
            or (ours is not None and not ours[node_id](device_id))
            for node_id in nodes
        )
    }


def _held_ids(view: KubeletView | None, resource: str) -> set[str]:
    held: set[str] = set()
    for holder in () if view is None else view.holders:
        ids = holder.devices.get(resource)
        if ids:
            held.update(ids)
    return held


def _with_health(
    node_id: int, ordered: list[tuple[int, str]], held: set[str], free: int, unaligned: bool
) -> tuple[Device, ...]:
    """Devices for ``ordered`` (index, id) pairs: every one Unhealthy when
    ``unaligned``; else the ``held`` ones Healthy, then the first ``free`` others
    (``free`` at or below 0: none).
    Held ids missing from ``ordered`` (no longer allocatable: the kubelet's reserved
    set changed, a slot id from an earlier run) are still listed, or the kubelet fails
    the pod that holds them when it re-admits it."""
    extra = held.difference(device_id for _, device_id in ordered)
    if extra:
        ordered = sorted([*ordered, *((_held_index(i, node_id), i) for i in extra)])
    devices = []
    for index, device_id in ordered:
        if unaligned:
            health = UNHEALTHY
        elif device_id in held:
            health = HEALTHY
        elif free > 0:
            health = HEALTHY
            free -= 1
        else:
            health = UNHEALTHY
        devices.append(_device(device_id, node_id, index, health))
    return tuple(devices)


def assigned_memory(
    view: KubeletView | None, ours: Iterable[str]
) -> dict[tuple[int, str, str], int]:
    """Bytes of memory blocks per (NUMA node, memory type, holder): ``holder`` is
    :data:`OURS` for containers that hold any resource of ``ours`` (our resource
    names), :data:`OTHERS` for the rest. Empty without a view."""
    if view is None:
        return {}
    names = set(ours)
    held: dict[tuple[int, str], int] = {}
    for holder in view.holders:
        if names.intersection(holder.devices):
            for key, size in holder.memory.items():
                held[key] = held.get(key, 0) + size
    found = {}
    for node, per_type in view.assigned_memory.items():
        for memory_type, total in per_type.items():
            mine = held.get((node, memory_type), 0)
            found[(node, memory_type, OURS)] = mine
            found[(node, memory_type, OTHERS)] = total - mine
    return found


def live_memory_devices(
    resource: Resource, view: KubeletView | None, *, allow_unaligned: bool = False
) -> tuple[Device, ...]:
    """The device list to advertise for a memory resource (``resource.memory`` set)::

        healthy = held + floor((allocatable - assigned) / unit)

    held devices first, then the lowest-numbered (:mod:`.numamemory`). ``view`` None
    (the API never answered): allocatable is the pool's sysfs ``fallback``, nothing
    assigned. A view without memory (the Memory Manager's policy is not ``Static``):
    every device Unhealthy, unless ``allow_unaligned`` (then as without the API).
    Deterministic, ids in unit order; held ids no longer in the list stay listed.
    """
    pool = resource.memory
    assert pool is not None, f"{resource.name} is not a memory resource"
    unaligned = False
    if view is None or not view.memory:
        unaligned = view is not None and not allow_unaligned
        allocatable, assigned = pool.fallback, 0
    else:
        allocatable = view.memory.get(resource.node_id, {}).get(pool.memory_type, 0)
        assigned = view.assigned_memory.get(resource.node_id, {}).get(pool.memory_type, 0)
    ordered = [(device.index, device.id) for device in resource.devices]
    free = (allocatable - assigned) // pool.unit  # below 0 (over-assigned): none free
    ours = admissible(CPUS, resource, resource.node_id, frozenset())
    held = {i for i in held_devices(view, resource.name, resource.node_id) if ours(i)}
    return _with_health(resource.node_id, ordered, held, free, unaligned)


@lru_cache(maxsize=65536)
def _device(device_id: str, node_id: int, index: int, health: str) -> Device:
    """Devices are immutable: one object per (id, health), reused across polls, so a
    poll builds no objects and an unchanged list compares by identity."""
    return Device(id=device_id, node_id=node_id, index=index, health=health)


@lru_cache(maxsize=65536)
def _cpu_id(node_id: int, cpu: int) -> str:
    return cpu_device_id(node_id, cpu)


def _held_index(device_id: str, node_id: int) -> int:
    index = device_index(device_id, node_id)
    assert index is not None, f"{device_id!r} is not one of node {node_id}'s ids"
    return index
