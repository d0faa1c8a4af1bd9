"""Which one NUMA node a resource over several NUMA nodes offers: ``numa-align/any``, a
resource that follows devices on several nodes, and their memory resources. Pure.

The scheduler's fit test for an extended resource compares the request with the
node's allocatable minus what bound pods asked. The kubelet's device manager builds
its topology hints from the healthy devices not yet allocated
(``generateDeviceTopologyHints`` in ``pkg/kubelet/cm/devicemanager/topology_hints.go``),
and its allocatable is the count of healthy devices. So, at each moment, exactly one
NUMA node is **exposed**, the one with the most room:

- every device a container holds stays Healthy, on whatever node it is (the kubelet
  fails a pod whose devices turn Unhealthy in its ``allocatedResourcesStatus``, and its
  allocatable must keep counting them);
- the exposed node's free devices are Healthy; the other nodes' free devices are
  Unhealthy (not offered).

The kubelet's allocatable is then held + free(exposed), and what the scheduler sees
after subtracting the bound pods' requests is exactly the largest room one NUMA node
has: its fit test becomes exact for a pod that must sit on one NUMA node, and the
Topology Manager lands the pod on the exposed node.

Room is the node's free exclusive CPUs (the kubelet's allocatable CPUs of the node that
no container has, as ``--capacity cpus`` counts them); a tie goes to the node with more
free memory (``memory`` bytes, with ``--memory-unit``), then to the lower id. The exposed
node changes only when another node has strictly more room (free CPUs, then memory):
no flapping between equal nodes. A memory resource of such a resource
(``numa-align/any-memory``) offers its free devices on the node the resource exposes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from numa_device_plugin.plugin.model.resources import HEALTHY, UNHEALTHY, Device


@dataclass(frozen=True)
class Room:
    """What one NUMA node has free: ``cpus`` (exclusive CPUs no container has) and
    ``memory`` (bytes of regular memory the Memory Manager has not assigned; 0 without
    ``--memory-unit`` or its figures)."""

    node_id: int
    cpus: int
    memory: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """What "more room" compares: free CPUs, then free memory."""
        return (self.cpus, self.memory)


@dataclass(frozen=True)
class Exposure:
    """The NUMA node resource ``resource`` exposes (``node_id``), the rooms it chose
    among (node order) and ``why``, one line for the pages and logs."""

    resource: str
    node_id: int
    rooms: tuple[Room, ...]
    why: str

    def as_dict(self) -> dict[str, object]:
        """The JSON form (``/debug/state``, ``status``)."""
        return {
            "node": self.node_id,
            "why": self.why,
            "rooms": {str(r.node_id): {"cpus": r.cpus, "memory": r.memory} for r in self.rooms},
        }


def choose(resource: str, rooms: Sequence[Room], previous: int | None) -> Exposure:
    """The node to expose among ``rooms`` (at least one), ``previous`` the node exposed
    so far (None: none yet, or no longer among them): the node with the most room
    (:attr:`Room.key`), the lower id on a tie; but ``previous`` is kept unless another
    node has strictly more room. Raises ValueError for no rooms."""
    if not rooms:
        raise ValueError(f"{resource}: no NUMA node to expose")
    ordered = tuple(sorted(rooms, key=lambda room: room.node_id))
    best = max(ordered, key=lambda room: (room.key, -room.node_id))
    kept = next((room for room in ordered if room.node_id == previous), None)
    if kept is not None and not best.key > kept.key:
        if best.node_id == kept.node_id:
            return Exposure(resource, kept.node_id, ordered, _most(kept, ordered))
        return Exposure(
            resource, kept.node_id, ordered,
            f"kept: no NUMA node has more room than node {kept.node_id} "
            f"({_room(kept)}; node {best.node_id} has as much)",
        )  # fmt: skip
    return Exposure(resource, best.node_id, ordered, _most(best, ordered))


def _most(best: Room, rooms: Sequence[Room]) -> str:
    others = ", ".join(f"node {r.node_id}: {_room(r)}" for r in rooms if r is not best)
    return f"most room: node {best.node_id} has {_room(best)}" + (f" ({others})" if others else "")


def _room(room: Room) -> str:
    text = f"{room.cpus} free CPU{'s' if room.cpus != 1 else ''}"
    if room.memory:
        text += f", {room.memory >> 20} MiB free memory"
    return text


def expose(devices: Iterable[Device], node_id: int, held: frozenset[str]) -> tuple[Device, ...]:
    """``devices`` (a resource's live list: held and free devices Healthy, per node)
    with every Healthy device that is neither held nor on NUMA node ``node_id`` turned
    Unhealthy. Unhealthy ones stay so; held ones are never touched."""
    return tuple(
        device
        if device.health != HEALTHY or device.node_id == node_id or device.id in held
        else Device(device.id, device.node_id, device.index, UNHEALTHY)
        for device in devices
    )


def rooms_for(
    node_ids: Iterable[int],
    free_cpus: Mapping[int, int],
    free_memory: Mapping[int, int],
) -> tuple[Room, ...]:
    """The :class:`Room` of each of ``node_ids`` from per-node free CPUs and memory
    (missing: 0)."""
    return tuple(Room(node, free_cpus.get(node, 0), free_memory.get(node, 0)) for node in node_ids)
