"""The figures the counts hand to the reports: one advertised NUMA node's CPUs as the
kubelet sees them (:class:`NodeCapacity`), and the holder labels of assigned CPUs and
memory. Plain frozen data, made by :mod:`numa_device_plugin.plugin.counts.capacity`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
