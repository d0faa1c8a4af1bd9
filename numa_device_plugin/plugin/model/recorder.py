"""What the plugin reports as it works, for metrics (no metrics library imported here).

The servicer, the poller and the manager call a :class:`Recorder`. Without
``--metrics-address`` it is :class:`NullRecorder` and costs nothing; with it,
:class:`~numa_device_plugin.plugin.reports.prometheus.PrometheusRecorder` (which imports
prometheus-client only then), made once the plugin has registered
(:class:`~numa_device_plugin.plugin.reports.deferred.DeferredRecorder`): metrics can
wait, registering cannot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from numa_device_plugin.topology.plan import NodePlan

if TYPE_CHECKING:
    from numa_device_plugin.plugin.model.figures import NodeCapacity
    from numa_device_plugin.plugin.model.resources import Device


class Recorder(Protocol):
    """Events worth counting. Resource names are extended resource names."""

    def topology(self, plans: tuple[NodePlan, ...], devices: dict[str, int]) -> None:
        """The discovered NUMA nodes and, per advertised resource, its device count."""

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        """Per resource that follows a device, the NUMA nodes its devices lie on (empty:
        nothing advertised: the selector matched nothing with locality)."""

    def allocated(self, resource: str, seconds: float, ok: bool) -> None:
        """One Allocate call answered (``ok``) or refused, and how long it took."""

    def registration(self, resource: str, ok: bool) -> None:
        """One Register call accepted or failed."""

    def registered(self, resource: str, now: bool) -> None:
        """Whether the resource is registered with the kubelet now."""

    def kubelet_restart(self) -> None:
        """A new kubelet.sock appeared: the kubelet restarted (counted once)."""

    def devices(self, resource: str, devices: Sequence[Device]) -> None:
        """The device list the resource advertises now (its health follows the live count)."""

    def capacity(
        self,
        nodes: Sequence[NodeCapacity],
        memory: Mapping[int, Mapping[str, int]],
        assigned_memory: Mapping[tuple[int, str, str], int],
    ) -> None:
        """Per advertised NUMA node its CPUs as the kubelet sees them, the memory the
        kubelet reports per NUMA node and type (bytes; empty without the Memory
        Manager), and the bytes assigned per (NUMA node, type, holder)."""

    def exposed(self, resource: str, node_id: int, switches: int) -> None:
        """A resource over several NUMA nodes exposes ``node_id`` now, after ``switches``
        changes of its exposed node since start."""

    def pod_resources(self, up: bool, last_read: float | None) -> None:
        """One read of the kubelet's pod resources API succeeded (``up``) or failed;
        ``last_read``: ``time.time()`` of the last good read (None: none since start)."""


class NullRecorder:
    """Records nothing."""

    def topology(self, plans: tuple[NodePlan, ...], devices: dict[str, int]) -> None:
        pass

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        pass

    def allocated(self, resource: str, seconds: float, ok: bool) -> None:
        pass

    def registration(self, resource: str, ok: bool) -> None:
        pass

    def registered(self, resource: str, now: bool) -> None:
        pass

    def kubelet_restart(self) -> None:
        pass

    def devices(self, resource: str, devices: Sequence[Device]) -> None:
        pass

    def exposed(self, resource: str, node_id: int, switches: int) -> None:
        pass

    def capacity(
        self,
        nodes: Sequence[NodeCapacity],
        memory: Mapping[int, Mapping[str, int]],
        assigned_memory: Mapping[tuple[int, str, str], int],
    ) -> None:
        pass

    def pod_resources(self, up: bool, last_read: float | None) -> None:
        pass
