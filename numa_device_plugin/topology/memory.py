"""Exact NUMA memory and hugepages (``--memory-unit``): quantities, the kubelet's
``--reserved-memory`` syntax, the memory resources and their live health. Pure.

With ``--memory-unit U``, every advertised NUMA node N gets, next to
``numa-align/numa-N``, one resource per memory type it has:

- ``numa-align/numa-N-memory``: one device per U of N's memory (``numa1-mem0007``);
- ``numa-align/numa-N-hugepages-2mi`` (pages under 1 GiB): one device per U, or per
  page when a page is larger than U (``numa1-hp2m0003``);
- ``numa-align/numa-N-hugepages-1gi`` (pages of 1 GiB and more): one device per page
  (``numa1-hp1g0003``).

A device's size is the pool's ``unit``; device ids count units from 0 and are stable
across restarts. How many devices a resource has comes from sysfs: ``MemTotal`` of
``nodeN/meminfo`` minus N's hugepages for ``memory`` (the kubelet's Memory Manager
subtracts them too), ``nr_hugepages`` times the page size for each pool. How many
are Healthy follows the kubelet, as for CPUs (:func:`live_memory_devices`)::

    healthy(N, type) = held + floor((allocatable_N - assigned_N) / unit)

``allocatable_N`` is ``GetAllocatableResources().memory`` for the type on N (the
Memory Manager's ``Static`` policy reports it: MemTotal minus ``--reserved-memory``
minus hugepages); ``assigned_N`` sums the memory blocks of ``List()`` of that type
whose topology names N. A block spanning several NUMA nodes counts in full against
each node it names: an over-count that errs on the safe side (the kubelet does not
say how a multi-node block is split).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"
GIB = 1 << 30
# Devices of one memory resource at most: as many as --capacity allows.
MAX_MEMORY_DEVICES = 10_000
# Memory devices of all pools together: each costs ~0.6 KB of RSS (objects, the
# ListAndWatch message), so this bounds them to ~20 MB over the plugin's ~90 MB.
MAX_TOTAL_MEMORY_DEVICES = 32_768

_SUFFIXES = {
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


class MemoryUnitError(ValueError):
    """``--memory-unit`` gives a pool more than :data:`MAX_MEMORY_DEVICES` devices, or
    all pools together more than :data:`MAX_TOTAL_MEMORY_DEVICES`."""


def check_total_devices(total: int, unit: int, nodes: int) -> None:
    """Raise :class:`MemoryUnitError` naming ``--memory-unit`` (``unit`` bytes) and the
    figures when ``total`` memory devices over ``nodes`` NUMA nodes are more than
    :data:`MAX_TOTAL_MEMORY_DEVICES`."""
    if total > MAX_TOTAL_MEMORY_DEVICES:
        raise MemoryUnitError(
            f"--memory-unit {format_quantity(unit)} gives {total} memory devices over "
            f"{nodes} NUMA nodes, more than {MAX_TOTAL_MEMORY_DEVICES} in all: choose a "
            "larger unit"
        )


def parse_quantity(text: str) -> int:
    """A Kubernetes memory quantity as bytes: a whole number with an optional binary
    (``Ki`` .. ``Ei``) or decimal (``k`` .. ``E``) suffix, ``1Gi``, ``512Mi``, ``1000000``.
    Fractions and exponents (``1.5Gi``, ``1e9``) are refused (ValueError naming the
    text): a device count needs whole bytes."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a memory quantity like 1Gi, 256Mi or 1000000")
    number, suffix = match.groups()
    return int(number) * (_SUFFIXES[suffix] if suffix else 1)


def format_quantity(size: int) -> str:
    """Bytes in the kubelet's canonical binary form: 2097152 -> ``2Mi``, 1073741824 ->
    ``1Gi``; a size no binary suffix divides stays a number of bytes."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if size and size % _SUFFIXES[suffix] == 0:
            return f"{size // _SUFFIXES[suffix]}{suffix}"
    return str(size)


def hugepages_type(page_size: int) -> str:
    """The kubelet's resource name of a hugepage pool: 2 MiB pages -> ``hugepages-2Mi``."""
    return HUGEPAGES_PREFIX + format_quantity(page_size)


def parse_memory_type(text: str) -> tuple[str, int | None]:
    """``memory`` -> (``memory``, None); ``hugepages-2Mi`` -> (``hugepages-2Mi``, page
    size in bytes). Raises ValueError naming the text for anything else."""
    if text == MEMORY:
        return text, None
    if text.startswith(HUGEPAGES_PREFIX):
        try:
            size = parse_quantity(text.removeprefix(HUGEPAGES_PREFIX))
        except ValueError:
            size = 0
        if size > 0:
            return hugepages_type(size), size
    raise ValueError(f"{text!r} is not a memory type (memory, hugepages-2Mi, hugepages-1Gi...)")


# --reserved-memory as Config keeps it (hashable): ((NUMA node, memory type, bytes), ...).
ReservedMemory = tuple[tuple[int, str, int], ...]


def parse_reserved_memory(text: str) -> ReservedMemory:
    """The kubelet's ``--reserved-memory`` syntax as ((NUMA node, memory type, bytes),
    ...) sorted by node and type:
    entries separated by ``;`` (or given as separate flag values joined by ``;``),
    each ``<node>:<type>=<quantity>[,<type>=<quantity>...]``, e.g.
    ``0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi``. A node and type given twice add
    up, as the kubelet's flag does. Raises ValueError naming the entry and the fault."""
    reserved: dict[tuple[int, str], int] = {}
    for entry in (part.strip() for part in text.split(";")):
        if not entry:
            continue
        node_text, colon, pairs = entry.partition(":")
        if not colon or not node_text.strip().isdigit():
            raise ValueError(f"{entry!r}: expected <NUMA node>:<type>=<quantity>[,...]")
        node = int(node_text)
        for pair in pairs.split(","):
            name, equals, quantity = pair.partition("=")
            if not equals:
                raise ValueError(f"{entry!r}: {pair!r} is not <type>=<quantity>")
            try:
                memory_type, _ = parse_memory_type(name.strip())
                size = parse_quantity(quantity)
            except ValueError as exc:
                raise ValueError(f"{entry!r}: {exc}") from None
            reserved[(node, memory_type)] = reserved.get((node, memory_type), 0) + size
    return tuple((node, kind, size) for (node, kind), size in sorted(reserved.items()))


def resource_suffix(memory_type: str) -> str:
    """The resource name's tail for a type: ``memory``, ``hugepages-2mi`` (lower case:
    the kubelet accepts upper case in extended resource names, but the name reads
    like the rest)."""
    return memory_type.lower()


def device_tag(memory_type: str) -> str:
    """The device id's tag: ``mem``, ``hp2m`` (``hugepages-2Mi``), ``hp1g``."""
    if memory_type == MEMORY:
        return "mem"
    size = memory_type.removeprefix(HUGEPAGES_PREFIX)
    return "hp" + size.replace("i", "").lower()


def device_unit(memory_type: str, unit: int) -> int:
    """Bytes per device of ``memory_type`` for ``--memory-unit`` ``unit``: ``unit`` for
    memory and pages smaller than it; one page for pages larger than ``unit`` and for
    pages of 1 GiB or more (a pod asks 1Gi pages one by one)."""
    _, page = parse_memory_type(memory_type)
    if page is None:
        return unit
    if page >= GIB:
        return page
    return max(unit, page)


@dataclass(frozen=True)
class MemoryPool:
    """What a memory resource stands for: ``memory_type`` (the kubelet's name,
    ``memory``, ``hugepages-2Mi``), ``unit`` (bytes per device), ``total`` (bytes of
    the type on the NUMA node per sysfs: the device count is ``total // unit``) and
    ``fallback`` (bytes allocatable per sysfs minus ``--reserved-memory``: used while
    the pod resources API has never answered, or with ``--allow-unaligned`` when the
    Memory Manager reports nothing)."""

    memory_type: str
    unit: int
    total: int
    fallback: int

    @property
    def devices(self) -> int:
        return self.total // self.unit


def node_pools(
    node_id: int,
    memory_bytes: int | None,
    hugepages: Mapping[int, int],
    unit: int,
    reserved: ReservedMemory,
) -> list[MemoryPool]:
    """The memory pools of NUMA node ``node_id``: ``memory_bytes`` (MemTotal, None:
    unknown, no memory resource), ``hugepages`` (page size in bytes -> pages). Pools
    without a whole device are left out. Raises :class:`MemoryUnitError` when a pool
    would have more than :data:`MAX_MEMORY_DEVICES` devices (the unit is too small)."""
    pools = []
    huge_total = sum(size * count for size, count in hugepages.items())
    if memory_bytes is not None:
        total = max(0, memory_bytes - huge_total)
        pools.append((MEMORY, total))
    for size, count in sorted(hugepages.items()):
        pools.append((hugepages_type(size), size * count))
    kept = {(node, kind): size for node, kind, size in reserved}
    found = []
    for memory_type, total in pools:
        per_device = device_unit(memory_type, unit)
        fallback = max(0, total - kept.get((node_id, memory_type), 0))
        pool = MemoryPool(memory_type, per_device, total, fallback)
        if pool.devices > MAX_MEMORY_DEVICES:
            raise MemoryUnitError(
                f"--memory-unit {format_quantity(unit)} gives NUMA node {node_id} "
                f"{pool.devices} {memory_type} devices, more than {MAX_MEMORY_DEVICES}: "
                "choose a larger unit"
            )
        if pool.devices > 0:
            found.append(pool)
    return found


def memory_device_id(node_id: int, memory_type: str, index: int) -> str:
    """``numa1-mem0007``, ``numa1-hp2m0003``, ``numa1-hp1g0000`` (at most 63 characters)."""
    return f"numa{node_id}-{device_tag(memory_type)}{index:04d}"
