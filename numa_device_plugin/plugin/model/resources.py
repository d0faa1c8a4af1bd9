"""The resource model: extended resources and their devices, and the rules for their
names.

The model is a plain tree, resource name -> :class:`Resource` -> its
:class:`Device` tuple, built purely from a plan
(:func:`~numa_device_plugin.plugin.advertised.build.build_resources`).

Two capacity modes: an integer N gives every NUMA node N "slot" devices
(``numa1-slot0042``); ``cpus`` gives a NUMA node one device per CPU it can hand
out exclusively (``numa1-cpu0012``, numbered by CPU id), so a pod asks for as
many devices as it asks integer CPUs and the count the scheduler sees is a CPU
count (:mod:`numa_device_plugin.plugin.counts.capacity` keeps it live). Two
builds from the same plan and settings are equal, which is what makes device
ids stable across plugin and kubelet restarts: the kubelet re-admits running
pods by the device ids it recorded, and fails them if those ids vanish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from numa_device_plugin.plugin.model.ids import socket_name
from numa_device_plugin.topology.memory import MemoryPool

if TYPE_CHECKING:
    from numa_device_plugin.plugin.model.near import Near

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
    :class:`~numa_device_plugin.plugin.model.near.Near`; its devices then lie on each of
    ``near_nodes`` (the selected device's NUMA nodes, sorted), each device's
    TopologyInfo naming its own node, ``node_id`` is the first of them, and
    ``near_devices`` says which devices are on each node
    (:attr:`~numa_device_plugin.topology.selectors.Selection.by_node`), for the
    container's :func:`~numa_device_plugin.plugin.model.near.near_env` variable; ``lost``: why
    its device is gone since it was served (it is kept, every device Unhealthy:
    :mod:`~numa_device_plugin.plugin.advertised.lost`), else None.

    ``anywhere``: the resource over every advertised NUMA node (``numa-align/any``),
    its nodes in ``near_nodes``. ``follows``: for a memory resource of a resource that
    spans NUMA nodes (``numa-align/any-memory``, ``numa-align/data-disk-memory``), the
    name of that resource: its free devices are offered on the NUMA node that resource
    exposes (:mod:`~numa_device_plugin.plugin.counts.exposure`). ``parts``: for such a
    memory resource over several NUMA nodes, one memory resource per node (same name,
    that node's pool and device ids), whose devices it lists in node order.
    ``socket``: for ``numa-align/socket-S`` (the NUMA nodes with CPUs of socket S), S;
    ``sockets``: (NUMA node, socket) of each of its nodes, for a resource whose
    containers are told their socket (``NUMA_SOCKET``: a socket resource, a resource
    that follows a device to its socket, and their memory).
    """

    name: str
    node_id: int
    devices: tuple[Device, ...]
    memory: MemoryPool | None = None
    near: Near | None = None
    near_nodes: tuple[int, ...] = ()
    near_devices: tuple[tuple[int, tuple[str, ...]], ...] = ()
    lost: str | None = None
    anywhere: bool = False
    follows: str | None = None
    parts: tuple[Resource, ...] = ()
    socket: int | None = None
    sockets: tuple[tuple[int, int], ...] = ()

    @property
    def spans(self) -> bool:
        """True when its devices lie on more than one NUMA node: exactly one of them is
        exposed at a time (:mod:`~numa_device_plugin.plugin.counts.exposure`)."""
        return len(self.node_ids) > 1

    @property
    def node_own(self) -> bool:
        """True for a NUMA node's own resources (``numa-N``, ``numa-N-memory``...), False
        for those that follow a device, ``any``, ``socket-S`` and their memory."""
        return (self.near is None and not self.anywhere and self.follows is None
                and self.socket is None)  # fmt: skip

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
