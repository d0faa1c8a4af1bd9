"""What one answer of the kubelet's pod resources API calls for (pure, thread-safe):
each resource's device list, the held ids it never advertises, and the recorder's
figures. :class:`~numa_device_plugin.plugin.counts.poller.CapacityPoller` computes it off the
event loop and publishes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.advertised.lost import with_left_behind
from numa_device_plugin.plugin.counts.capacity import (
    assigned_memory,
    live_resource_devices,
    node_capacity,
)
from numa_device_plugin.plugin.counts.held import admissible, foreign_devices
from numa_device_plugin.plugin.model.figures import NodeCapacity
from numa_device_plugin.plugin.model.resources import Device, Resource
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.settings.config import Config


@dataclass(frozen=True)
class Planned:
    """What one answer of the pod resources API calls for: per resource its device
    list and the held ids it never advertises, and the recorder's figures."""

    lists: Mapping[str, tuple[tuple[Device, ...], set[str]]]
    capacities: list[NodeCapacity]
    memory: Mapping[int, Mapping[str, int]]
    assigned_memory: Mapping[tuple[int, str, str], int]


def plan(
    config: Config, catalog: Catalog, view: KubeletView | None, resources: Mapping[str, Resource]
) -> Planned:
    """Pure (thread-safe): each resource's device list and foreign held ids, and the
    figures the recorder takes, for ``view``."""
    lists: dict[str, tuple[tuple[Device, ...], set[str]]] = {}
    known = catalog.discovery.plans if catalog.discovery is not None else ()
    nodes = frozenset(p.node.id for p in known)  # ids held elsewhere are listed on these only
    for name, resource in resources.items():
        ours = {
            node_id: admissible(config.capacity, resource, node_id, catalog.node_cpus(node_id))
            for node_id in resource.node_ids
        }
        devices = with_left_behind(resource, live_resource_devices(
            config.capacity,
            resource,
            catalog.node_cpus,
            view,
            reserved_cpus=config.reserved_cpus,
            allow_unaligned=config.allow_unaligned,
        ), view, nodes)  # fmt: skip
        listed = {device.id for device in devices}
        lists[name] = (devices, foreign_devices(view, name, resource.node_ids, ours) - listed)
    return Planned(
        lists,
        node_capacities(config, catalog, view, resources, lambda name: lists[name][0]),
        view.memory if view is not None else {},
        assigned_memory(view, resources),
    )


def node_capacities(
    config: Config,
    catalog: Catalog,
    view: KubeletView | None,
    resources: Mapping[str, Resource],
    devices: Callable[[str], tuple[Device, ...]],
) -> list[NodeCapacity]:
    """Per advertised NUMA node its figures (:func:`node_capacity`), each resource's
    devices given by ``devices(name)``; holders of a resource that follows a device
    count for the node of the device they hold."""
    near = [r for r in resources.values() if r.near is not None]
    return [
        node_capacity(
            name,
            resource.node_id,
            catalog.node_cpus(resource.node_id),
            devices(name),
            view,
            config.reserved_cpus,
            related=[r.name for r in near if resource.node_id in r.near_nodes],
        )
        for name, resource in resources.items()
        if resource.memory is None and resource.near is None
    ]
