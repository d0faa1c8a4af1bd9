"""What the kubelet must hear about a resource that follows a device once that device
is gone or has moved to another NUMA node (a disk pulled, hot-removed or replaced).

The kubelet reports each container's devices in ``ContainerStatus.
allocatedResourcesStatus`` (v1.36 and later, feature ResourceHealthStatus) from the
health of the ids the plugin last listed in ListAndWatch; an id missing from the list
is reported Healthy (``UpdateAllocatedResourcesStatus`` in
``pkg/kubelet/cm/devicemanager/manager.go``). So a resource whose device vanished keeps
being served, every device Unhealthy (:func:`keep_lost`: allocatable falls to 0, running
pods are told), and ids held on a NUMA node the resource left stay listed, Unhealthy,
with their old node (:func:`with_left_behind`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.advertised.discovery import Discovery
from numa_device_plugin.plugin.model.ids import device_node
from numa_device_plugin.plugin.model.resources import UNHEALTHY, Device, Resource


def keep_lost(served: Mapping[str, Resource], found: Discovery) -> Discovery:
    """``found`` with each resource that follows a device (its memory resources too,
    :mod:`.devicememory`), served now and still configured (a :attr:`Discovery.near`
    entry of its name) but absent from ``found`` (its device
    gone, or on no advertised NUMA node), kept as served with ``lost`` set to the near
    plan's reason; a resource lost before and still absent keeps its devices."""
    plans = {entry.near.name: entry for entry in found.near}
    kept = {
        name: replace(resource, lost=plans[resource.near.name].reason or "its device is gone")
        for name, resource in served.items()
        if resource.near is not None and resource.near.name in plans and name not in found.resources
    }
    if not kept:
        return found
    return replace(found, resources={**found.resources, **kept})


# Held ids of a node a resource left that are listed again (a hostile kubelet could name
# any number).
MAX_LEFT_BEHIND = 1024


def with_left_behind(
    resource: Resource,
    devices: tuple[Device, ...],
    view: KubeletView | None,
    nodes: frozenset[int],
) -> tuple[Device, ...]:
    """The list to advertise for a resource that follows a device, from ``devices``
    (its live list): every device Unhealthy when :attr:`Resource.lost`; then, Unhealthy
    on the NUMA node its id names, each id of the resource that a container holds and
    the list lacks (the device moved: the id names the node it left), in id order: only
    ids of this plugin's form on one of ``nodes`` (the machine's NUMA nodes), at most
    :data:`MAX_LEFT_BEHIND`, so a kubelet's answer never names a node that is not here."""
    if resource.near is None:
        return devices
    if resource.lost is not None:
        devices = tuple(replace(device, health=UNHEALTHY) for device in devices)
    listed = {device.id for device in devices}
    held = set() if view is None else {
        device_id
        for holder in view.holders
        for device_id in holder.devices.get(resource.name, ())
    }  # fmt: skip
    left: list[Device] = []
    for device_id in sorted(held - listed):
        where = device_node(device_id)
        if where is not None and where[0] in nodes and len(left) < MAX_LEFT_BEHIND:
            left.append(Device(device_id, where[0], where[1], UNHEALTHY))
    return (*devices, *left)


def same_served(old: Resource | None, new: Resource | None) -> bool:
    """Whether ``old`` and ``new`` serve the same (devices, health, TopologyInfo, what
    Allocate names): equal but for the text of why a lost resource is lost (a mount
    table's line number), never whether it is. None: no resource."""

    def served(resource: Resource | None) -> Resource | None:
        if resource is None or resource.lost is None:
            return resource
        return replace(resource, lost="lost")

    return served(old) == served(new)
