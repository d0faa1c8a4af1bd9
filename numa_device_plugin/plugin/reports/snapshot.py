"""One moment of the plugin's state as plain data, for the node page and ``/debug/state``.

:meth:`PluginManager.snapshot` takes a :class:`PluginState` on the event loop: it
only copies references to frozen objects (the discovery, the device lists, the last
:class:`~numa_device_plugin.plugin.counts.capacity.KubeletView`), so it costs microseconds and
the page can be rendered from it in a worker thread while the loop goes on.
:func:`debug_document` turns it into the JSON of ``/debug/state``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.advertised.discovery import NearPlan, near_document
from numa_device_plugin.plugin.counts.exposure import Exposure
from numa_device_plugin.plugin.model.resources import HEALTHY, Device, Resource
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.bynode import NO_DEVICES, devices_by_node
from numa_device_plugin.topology.locality import Inventory
from numa_device_plugin.topology.nearest import Nearest
from numa_device_plugin.topology.plan import NodePlan

if TYPE_CHECKING:
    from numa_device_plugin.plugin.counts.poller import CapacityPoller
    from numa_device_plugin.plugin.serving.catalog import Catalog
    from numa_device_plugin.plugin.serving.lock import LockKeeper


@dataclass(frozen=True)
class Served:
    """How one resource is served: ``devices`` (its live device list, as ListAndWatch
    sends it), ``registered`` (with the current kubelet), ``streams`` (ListAndWatch
    streams open now) and ``kubelet_stream`` (the kubelet's stream among them)."""

    resource: Resource
    devices: tuple[Device, ...]
    registered: bool
    streams: int
    kubelet_stream: bool

    @property
    def healthy(self) -> int:
        """Devices advertised Healthy: what the kubelet counts as allocatable."""
        return sum(1 for device in self.devices if device.health == HEALTHY)


@dataclass(frozen=True)
class PluginState:
    """The plugin at ``taken_at`` (``time.time()``, seconds).

    ``config``: the Config served (None: none, per-node configuration serving
    nothing); ``configuration``: the per-node configuration's name and why it was
    chosen (None without ``--config-file``); ``plans``: the NUMA nodes of the last
    discovery; ``served``: resource name -> :class:`Served`; ``view``: the last
    answer of the kubelet's pod resources API (None: none yet);
    ``pod_resources_up``: whether the last read succeeded (None: not read yet);
    ``pod_resources_read_at``: ``time.time()`` of the last good read;
    ``pod_resources_period``: seconds between reads while nothing asks sooner (60 while
    the kubepods cgroup folder is watched, else the interval; None: not serving);
    ``pod_resources_on_change``: whether that folder is watched (a Guaranteed pod's
    cgroup coming or going asks for a read);
    ``lock``: who holds the instance lock (``pid=12 host=node-a``) or why it is not
    held; ``problems``: the readiness problems (empty: ready); ``inventory``: the PCI
    devices, disks and interfaces of the last discovery, with their NUMA nodes;
    ``near``: the plan of each resource that follows a device; ``details``: each
    disk's, NIC's and accelerator's ids, from the last discovery; ``exposures``: per
    resource over several NUMA nodes, the node it exposes and why, and ``switches``, how
    often that node changed (:mod:`~numa_device_plugin.plugin.counts.exposure`);
    ``nearest``: where a device on each NUMA node not advertised goes (the discovery's).
    """

    taken_at: float
    config: Config | None
    plans: tuple[NodePlan, ...] = ()
    served: Mapping[str, Served] = field(default_factory=dict)
    view: KubeletView | None = None
    pod_resources_up: bool | None = None
    pod_resources_read_at: float | None = None
    pod_resources_period: float | None = None
    pod_resources_on_change: bool = False
    lock: str = ""
    problems: tuple[str, ...] = ()
    configuration: Mapping[str, str] | None = None
    inventory: Inventory = field(default_factory=Inventory)
    near: tuple[NearPlan, ...] = ()
    details: Mapping[str, list[dict[str, Any]]] | None = None
    exposures: Mapping[str, Exposure] = field(default_factory=dict)
    switches: Mapping[str, int] = field(default_factory=dict)
    nearest: Mapping[int, Nearest] = field(default_factory=dict)

    def exposure(self, resource: Resource) -> Exposure | None:
        """The exposure ``resource`` follows: its own, or for a memory resource of a
        resource over several NUMA nodes, that resource's; None for a resource on one."""
        if not resource.spans:
            return None
        return self.exposures.get(resource.follows or resource.name)

    @property
    def pod_resources_age(self) -> float | None:
        """Seconds since the last good pod resources read, None when there was none."""
        if self.pod_resources_read_at is None:
            return None
        return max(0.0, self.taken_at - self.pod_resources_read_at)


def take(
    config: Config,
    catalog: Catalog,
    registered: Iterable[str],
    poller: CapacityPoller,
    keeper: LockKeeper,
    problems: Iterable[str],
) -> PluginState:
    """The :class:`PluginState` of a manager's parts now: the catalog's discovery and
    servicers, the names registered, the poller's last view and reads, the instance
    lock; copies references only (loop thread)."""
    discovery = catalog.discovery
    names = set(registered)
    return PluginState(
        taken_at=time.time(),
        config=config,
        plans=discovery.plans if discovery is not None else (),
        inventory=discovery.inventory if discovery is not None else Inventory(),
        near=discovery.near if discovery is not None else (),
        details=discovery.details if discovery is not None else None,
        nearest=discovery.nearest if discovery is not None else {},
        served={
            name: Served(
                resource=catalog.resources[name],
                devices=servicer.devices,
                registered=name in names,
                streams=servicer.open_streams,
                kubelet_stream=servicer.kubelet_stream_open,
            )
            for name, servicer in catalog.servicers.items()
        },
        view=poller.view,
        pod_resources_up=poller.reachable,
        pod_resources_read_at=poller.read_at,
        pod_resources_period=poller.schedule.period(),
        pod_resources_on_change=poller.schedule.signalled(),
        lock=keeper.problem or f"held by this instance ({keeper.lock.path})",
        problems=tuple(problems),
        exposures=dict(poller.spanning.exposures),
        switches=dict(poller.spanning.switches),
    )


def debug_document(state: PluginState) -> dict[str, Any]:
    """The JSON document of ``/debug/state``; pure.

    ``{"taken_at", "ready", "problems", "configuration", "config": {flag name:
    value} | null, "lock", "numa_nodes": [{"id", "cpus", "advertised", "reason",
    "devices": {"disks", "nics", "accelerators", "pci"}, "nearest": {"node", "to",
    "distance", "why"} | null}], "resources": {name:
    {"numa_node", "numa_nodes", "near", "lost", "memory_type", "devices", "healthy",
    "registered", "streams", "kubelet_stream", "exposed": {"node", "why", "rooms",
    "switches", "follows"} | null}}, "near": [{"resource", "selector",
    "matched", "matched_count", "unlocated", "nodes", "by_node", "followed", "reason"}],
    "inventory": {"disks",
    "nics", "accelerators", "mounts"} | null, "pod_resources":
    {"up", "read_at", "age_seconds", "period_seconds", "on_change", "holders", "others",
    "allocatable_cpus"}}``.
    """
    view = state.view
    age = state.pod_resources_age
    on_node = devices_by_node(state.inventory)
    nearest = state.nearest
    return {
        "taken_at": state.taken_at,
        "ready": not state.problems,
        "problems": list(state.problems),
        "configuration": dict(state.configuration) if state.configuration else None,
        "config": None if state.config is None else config_document(state.config),
        "lock": state.lock,
        "numa_nodes": [
            {
                "id": plan.node.id,
                "cpus": sysfs.format_cpulist(plan.node.cpus),
                "advertised": plan.advertised,
                "reason": plan.reason,
                "devices": on_node.get(plan.node.id, NO_DEVICES).document(),
                "nearest": nearest[plan.node.id].document() if plan.node.id in nearest else None,
            }
            for plan in state.plans
        ],
        "resources": {
            name: {
                "numa_node": served.resource.node_id,
                "numa_nodes": list(served.resource.node_ids),
                "near": None if served.resource.near is None else str(served.resource.near),
                "lost": served.resource.lost,
                "memory_type": None
                if served.resource.memory is None
                else served.resource.memory.memory_type,
                "devices": len(served.devices),
                "healthy": served.healthy,
                "registered": served.registered,
                "streams": served.streams,
                "kubelet_stream": served.kubelet_stream,
                "exposed": _exposed(state, served.resource),
            }
            for name, served in state.served.items()
        },
        "near": [near_document(entry) for entry in state.near],
        "inventory": state.details,
        "pod_resources": {
            "up": state.pod_resources_up,
            "read_at": state.pod_resources_read_at,
            "age_seconds": None if age is None else round(age, 3),
            "period_seconds": state.pod_resources_period,
            "on_change": state.pod_resources_on_change,
            "holders": None if view is None else [_holder(h, devices=True) for h in view.holders],
            "others": None if view is None else [_holder(h) for h in view.others],
            "allocatable_cpus": None
            if view is None
            else sysfs.format_cpulist(view.allocatable_cpus),
        },
    }


# Device ids of one holder and resource listed in /debug/state (a flood held 200,000
# ids and the document grew to 4.9 MB); "device_counts" gives the whole number.
MAX_LISTED_IDS = 32


def _holder(holder: Holder, *, devices: bool = False) -> dict[str, Any]:
    """One holder: ``{"pod", "container", "cpus"}``, and with ``devices`` its memory
    blocks (``[{"numa_node", "type", "bytes"}]``, Memory Manager Static), its device ids
    per resource (at most :data:`MAX_LISTED_IDS` each), ``"device_counts"`` (all of
    them) and ``"devices_cut"`` (the resources whose list was cut)."""
    document: dict[str, Any] = {
        "pod": f"{holder.namespace}/{holder.pod}",
        "container": holder.container,
        "cpus": sysfs.format_cpulist(holder.cpus),
    }
    if devices:
        document["memory"] = [
            {"numa_node": node, "type": kind, "bytes": size}
            for (node, kind), size in sorted(holder.memory.items())
        ]
        document["devices"] = {
            name: list(ids[:MAX_LISTED_IDS]) for name, ids in holder.devices.items()
        }
        document["device_counts"] = {name: len(ids) for name, ids in holder.devices.items()}
        document["devices_cut"] = sorted(
            name for name, ids in holder.devices.items() if len(ids) > MAX_LISTED_IDS
        )
    return document


def config_document(config: Config) -> dict[str, Any]:
    """The settings of ``config`` that shape what is served, JSON-ready: paths as
    text, CPU sets as cpulists, bytes as integers."""
    return {
        "sysfs_root": str(config.sysfs_root),
        "socket_dir": str(config.socket_dir),
        "resource_prefix": config.resource_prefix,
        "capacity": config.capacity,
        "include_cpuless_nodes": config.include_cpuless_nodes,
        "reserved_cpus": sysfs.format_cpulist(config.reserved_cpus),
        "allow_unaligned": config.allow_unaligned,
        "memory_unit": config.memory_unit,
        "reserved_memory": [list(entry) for entry in config.reserved_memory],
        "pod_resources_socket": str(config.pod_resources_path),
        "pod_resources_interval": config.pod_resources_interval,
        "near": [str(entry) for entry in config.near],
    }


def _exposed(state: PluginState, resource: Resource) -> dict[str, Any] | None:
    """A resource's exposure as JSON: the node, why, the rooms compared, the changes
    counted, and the resource it follows (a memory resource); None on one NUMA node."""
    exposure = state.exposure(resource)
    if exposure is None:
        return None
    return {
        **exposure.as_dict(),
        "switches": state.switches.get(exposure.resource, 0),
        "follows": resource.follows if resource.memory is not None else None,
    }
