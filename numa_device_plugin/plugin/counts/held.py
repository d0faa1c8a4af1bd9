"""The ids containers hold, as the kubelet's pod resources API lists them (``List()``),
and which of them this plugin would ever have advertised: the held ids that count
(:func:`held_devices`, :func:`admissible`) and those that count for nothing
(:func:`foreign_devices`). Pure functions over a :class:`KubeletView`; a confused or
hostile kubelet can never make a device list longer than the mode allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.model.ids import cpu_device_id, device_index
from numa_device_plugin.plugin.model.ids import device_id as slot_id
from numa_device_plugin.plugin.model.resources import CPUS, MAX_CAPACITY, Capacity, Resource
from numa_device_plugin.topology.memory import MAX_MEMORY_DEVICES, memory_device_id


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
    slot id of an earlier slots-mode run: :func:`held_in_cpus_mode` bounds how many);
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
        cpu_ids = frozenset(cpu_id(node_id, cpu) for cpu in node_cpus)
        return lambda held: held in cpu_ids or is_slot(held, node_id)
    return lambda held: is_slot(held, node_id)


def is_slot(held: str, node_id: int) -> bool:
    """Whether ``held`` is a slot id of NUMA node ``node_id`` under :data:`MAX_CAPACITY`."""
    index = device_index(held, node_id)
    return index is not None and index < MAX_CAPACITY and held == slot_id(node_id, index)


def held_in_cpus_mode(held: set[str], node_id: int, node_cpus: frozenset[int]) -> set[str]:
    """The held ids that count in ``cpus`` mode: those of ``node_cpus``, and slot ids of
    an earlier slots-mode run (the kubelet re-admits a pod by them), at most one per
    CPU, lowest first: never past twice the node's CPUs, whatever the kubelet says."""
    cpu_ids = {cpu_id(node_id, cpu) for cpu in node_cpus}
    slots = sorted(
        (i for i in held - cpu_ids if is_slot(i, node_id)), key=lambda i: held_index(i, node_id)
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


@lru_cache(maxsize=65536)
def cpu_id(node_id: int, cpu: int) -> str:
    """:func:`~numa_device_plugin.plugin.model.ids.cpu_device_id`, cached: one string per
    CPU across polls."""
    return cpu_device_id(node_id, cpu)


def held_index(device_id: str, node_id: int) -> int:
    index = device_index(device_id, node_id)
    assert index is not None, f"{device_id!r} is not one of node {node_id}'s ids"
    return index
