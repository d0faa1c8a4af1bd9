"""What is served: the last discovery's resources, and one servicer per resource.

The servicers stage of the flow sysfs -> topology -> devices -> servicers ->
registration. A servicer outlives its server: it is built once per resource and
kept across kubelet restarts and reloads while the resource is unchanged, so its
device list (and the ListAndWatch message built from it) is not rebuilt at every
restart. A reload that changes a resource gets it a new servicer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from numa_device_plugin.plugin.advertised.discovery import Discovery
from numa_device_plugin.plugin.advertised.lost import same_served
from numa_device_plugin.plugin.model.resources import Resource
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer


class Catalog:
    """The resources of the last :class:`Discovery` and their servicers.

    ``make_servicer(resource)`` builds the servicer of a new or changed resource.
    """

    def __init__(self, make_servicer: Callable[[Resource], NumaDevicePluginServicer]) -> None:
        self._make_servicer = make_servicer
        self.discovery: Discovery | None = None
        self._servicers: dict[str, NumaDevicePluginServicer] = {}

    @property
    def resources(self) -> Mapping[str, Resource]:
        """Resource name -> Resource; empty before the first discovery."""
        return self.discovery.resources if self.discovery else {}

    @property
    def servicers(self) -> Mapping[str, NumaDevicePluginServicer]:
        """Resource name -> its servicer, one per resource of :attr:`resources`."""
        return self._servicers

    def node_cpus(self, node_id: int) -> frozenset[int]:
        """The usable CPUs of NUMA node ``node_id`` (an advertised one). Raises
        StopIteration for a node the last discovery did not plan."""
        assert self.discovery is not None
        return next(p.node.cpus for p in self.discovery.plans if p.node.id == node_id)

    def update(self, discovery: Discovery) -> None:
        """Take ``discovery``: keep the servicers of resources that serve the same
        (:func:`~numa_device_plugin.plugin.advertised.lost.same_served`: a lost resource whose
        reason's text changed keeps the servicer its running server holds), build the
        rest."""
        kept = {
            name: servicer
            for name, servicer in self._servicers.items()
            if same_served(self.resources.get(name), discovery.resources.get(name))
        }
        self.discovery = discovery
        self._servicers = {
            name: kept.get(name) or self._make_servicer(resource)
            for name, resource in discovery.resources.items()
        }
