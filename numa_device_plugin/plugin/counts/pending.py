"""What the plugin has just given in Allocate and the kubelet's pod resources API does
not list yet: counted at once, so that a resource over several NUMA nodes switches its
exposed node (:mod:`~numa_device_plugin.plugin.counts.exposure`) right after an
Allocate, not at the next read. Pure.

The kubelet records a container's devices when Allocate answers
(``podDevices.insert`` in ``pkg/kubelet/cm/devicemanager/manager.go``); within the same
admission its CPU manager then assigns the container's CPUs, and the Memory Manager its
memory. So ``List()`` lists the ids a moment after the answer, and the CPUs a moment
after that. Until a read lists the ids held by a container that has exclusive CPUs or
memory blocks, each allocation counts as a container holding its ids and, in ``cpus``
mode, as many of its node's free allocatable CPUs (the lowest: which ones does not
matter, only how many), or for a memory resource its units. It is dropped then; when a
read that started :data:`LISTED_WITHIN` seconds or more after the answer lists none of
its ids (the pod ended, or its admission failed after Allocate); or after
:data:`PENDING_SECONDS` (a pod that is not Guaranteed). Until then it under-states the
room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.model.resources import Resource

# Seconds an allocation counts without the pod resources API listing it.
PENDING_SECONDS = 10.0
# Allocations remembered at most (a hostile or broken kubelet calling Allocate in a
# loop cannot grow this without bound); the oldest go first.
MAX_PENDING = 1024
PENDING_POD = "(allocating)"
# Seconds after Allocate's answer by which the kubelet lists the ids (it records them
# as the answer arrives): a read started later that lists none of them ends the
# allocation.
LISTED_WITHIN = 0.25


@dataclass(frozen=True)
class Allocation:
    """One answered Allocate of ``resource``: the device ``ids`` of its containers, at
    ``at`` (``time.monotonic()`` seconds)."""

    resource: str
    ids: frozenset[str]
    at: float


def still_pending(
    allocations: Iterable[Allocation],
    view: KubeletView | None,
    now: float,
    read_at: float | None = None,
) -> tuple[Allocation, ...]:
    """The ``allocations`` ``view`` does not list yet (some id not held by a container
    that has exclusive CPUs or memory blocks), younger than :data:`PENDING_SECONDS` and,
    when ``view`` is the answer of a read started at ``read_at`` (``time.monotonic()``
    seconds) :data:`LISTED_WITHIN` or more after the allocation, with at least one id
    listed; at most :data:`MAX_PENDING`, the newest."""
    assigned: dict[str, set[str]] = {}
    listed: dict[str, set[str]] = {}
    if view is not None:
        for holder in view.holders:
            for name, ids in holder.devices.items():
                listed.setdefault(name, set()).update(ids)
                if holder.cpus or holder.memory:  # else not assigned them yet
                    assigned.setdefault(name, set()).update(ids)
    kept = tuple(
        allocation
        for allocation in allocations
        if now - allocation.at < PENDING_SECONDS
        and not allocation.ids <= assigned.get(allocation.resource, set())
        and (
            read_at is None
            or view is None
            or read_at - allocation.at < LISTED_WITHIN
            or bool(allocation.ids & listed.get(allocation.resource, set()))
        )
    )
    return kept[-MAX_PENDING:]


def with_allocations(
    view: KubeletView | None,
    allocations: Iterable[Allocation],
    resources: Mapping[str, Resource],
    node_cpus: Callable[[int], frozenset[int]],
    cpus_mode: bool,
) -> KubeletView | None:
    """``view`` with each allocation as one more container (pod :data:`PENDING_POD`)
    holding its ids that are ``resources``' devices and, for a CPU resource in
    ``cpus_mode``, one free allocatable CPU of the device's node per device (none left:
    fewer); for a memory resource its units as assigned memory of the device's node.
    ``view`` None (the API never answered) stays None: nothing to count against."""
    items = tuple(allocations)
    if view is None or not items:
        return view
    taken = set(view.assigned_cpus)
    holders = list(view.holders)
    assigned = {node: dict(per_type) for node, per_type in view.assigned_memory.items()}
    for allocation in items:
        resource = resources.get(allocation.resource)
        if resource is None:
            continue
        nodes = {device.id: device.node_id for device in resource.devices}
        ids = tuple(sorted(i for i in allocation.ids if i in nodes))
        cpus: set[int] = set()
        for device_id in ids:
            node = nodes[device_id]
            pool = _pool(resource, node)
            if pool is not None:
                per_type = assigned.setdefault(node, {})
                per_type[pool[0]] = per_type.get(pool[0], 0) + pool[1]
            elif cpus_mode:
                free = sorted((view.allocatable_cpus & node_cpus(node)) - taken)
                if free:
                    cpus.add(free[0])
                    taken.add(free[0])
        holders.append(Holder("", PENDING_POD, "", frozenset(cpus), {allocation.resource: ids}))
    return replace(view, holders=tuple(holders), assigned_memory=assigned)


def _pool(resource: Resource, node: int) -> tuple[str, int] | None:
    """(memory type, bytes per device) of ``resource``'s pool on ``node``; None for a
    CPU resource."""
    for part in resource.parts or (resource,):
        if part.memory is not None and part.node_id == node:
            return (part.memory.memory_type, part.memory.unit)
    return None
