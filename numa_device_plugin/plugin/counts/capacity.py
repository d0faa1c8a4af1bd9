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
this mode (:func:`~numa_device_plugin.plugin.counts.held.admissible`), so a confused or
hostile kubelet can never make a list longer than the mode allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.counts.held import (
    admissible,
    cpu_id,
    held_devices,
    held_in_cpus_mode,
    held_index,
)
from numa_device_plugin.plugin.model.figures import OTHERS, OURS, NodeCapacity
from numa_device_plugin.plugin.model.ids import device_index
from numa_device_plugin.plugin.model.resources import (
    CPUS,
    HEALTHY,
    UNHEALTHY,
    Capacity,
    Device,
    Resource,
)
from numa_device_plugin.topology import sysfs


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
    held = held_in_cpus_mode(held_devices(view, resource, node_id), node_id, node_cpus)
    assigned = frozenset() if view is None else view.assigned_cpus & allocatable
    ordered = [(cpu, cpu_id(node_id, cpu)) for cpu in sorted(allocatable)]
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
    node's devices counted from that node's CPUs (``node_cpus(node_id)``). A memory
    resource over several NUMA nodes lists each part's in turn (:attr:`Resource.parts`)."""
    if resource.memory is not None:
        return tuple(
            device
            for part in resource.parts or (resource,)
            for device in live_memory_devices(part, view, allow_unaligned=allow_unaligned)
        )
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
        ordered = sorted([*ordered, *((held_index(i, node_id), i) for i in extra)])
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

    held devices first, then the lowest-numbered
    (:mod:`numa_device_plugin.topology.memory`). ``view`` None
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
