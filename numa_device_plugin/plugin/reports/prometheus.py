"""Prometheus metrics of the device plugin (prometheus-client, own registry).

Topology, per NUMA node (label ``numa_node``): ``numa_node_cpus_count`` (the
name openFuyao's numa-exporter dashboards query), ``numa_node_memory_bytes``,
``numa_node_distance`` (``numa_node``, ``to_numa_node``), ``numa_node_advertised``.
Plugin, per resource (label ``resource``):
``numa_device_plugin_devices`` (``health``), ``..._allocations_total``,
``..._allocate_errors_total``, ``..._registrations_total``,
``..._registration_failures_total``, ``..._kubelet_restarts_total`` (no labels:
one kubelet restart counts once),
``..._allocate_duration_seconds`` (histogram), ``..._registered`` (0/1).
Live capacity, per NUMA node (label ``numa_node``, from the kubelet's pod
resources API): ``numa_node_allocatable_cpus``, ``numa_node_assigned_cpus``
(``holder`` = ``numa-align`` or ``other``), ``numa_node_misaligned_containers``,
``numa_node_allocatable_memory_bytes`` (``memory_type``).
``numa_device_plugin_pod_resources_up`` (0/1: the last read of the pod resources
API answered) and ``numa_device_plugin_pod_resources_last_read_age_seconds`` (since
the last good read; NaN before the first).
``numa_device_plugin_build_info`` carries versions as labels.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from numa_device_plugin import __version__
from numa_device_plugin.plugin.model.figures import OTHERS, OURS, NodeCapacity
from numa_device_plugin.plugin.model.resources import HEALTHY, UNHEALTHY, Device
from numa_device_plugin.topology.plan import NodePlan

# Allocate answers in about a millisecond; buckets from 100 us to 1 s.
_ALLOCATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class PrometheusRecorder:
    """A :class:`~numa_device_plugin.plugin.model.recorder.Recorder` that keeps Prometheus metrics
    in its own ``registry``; :meth:`render` gives the text exposition format."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No *_created series: they double the series count and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # Process (RSS: the memory limit is sized from it), platform and GC collectors.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # The topology series come from the last discovery at each scrape, with no
        # object per series: the distance matrix alone is n² series (65,536 at 256
        # NUMA nodes, once 60 MB as Gauge children).
        self._plans: tuple[NodePlan, ...] = ()
        self._advertised: set[str] = set()  # the resources of the last topology()
        r.register(_TopologyCollector(lambda: self._plans))
        prefix = "numa_device_plugin"
        self.devices_gauge = Gauge(
            f"{prefix}_devices", "Devices advertised", ["resource", "health"], registry=r
        )
        self.allocations = Counter(
            f"{prefix}_allocations", "Allocate calls answered", ["resource"], registry=r
        )
        self.allocate_errors = Counter(
            f"{prefix}_allocate_errors", "Allocate calls refused", ["resource"], registry=r
        )
        self.registrations = Counter(
            f"{prefix}_registrations",
            "Register calls the kubelet accepted",
            ["resource"],
            registry=r,
        )
        self.registration_failures = Counter(
            f"{prefix}_registration_failures",
            "Register calls that failed",
            ["resource"],
            registry=r,
        )
        self.kubelet_restarts = Counter(
            f"{prefix}_kubelet_restarts",
            "Kubelet restarts seen (a new kubelet.sock)",
            registry=r,
        )
        self.allocate_duration = Histogram(
            f"{prefix}_allocate_duration_seconds",
            "Time to answer Allocate",
            ["resource"],
            buckets=_ALLOCATE_BUCKETS,
            registry=r,
        )
        self.registered_now = Gauge(
            f"{prefix}_registered", "1 while registered with the kubelet", ["resource"], registry=r
        )
        self.near_numa_node = Gauge(
            f"{prefix}_near_numa_node",
            "1 for each NUMA node a resource that follows a device (--near) is advertised on",
            ["resource", "numa_node"],
            registry=r,
        )
        self.near_advertised = Gauge(
            f"{prefix}_near_advertised",
            "1 when a resource that follows a device is advertised, 0 when its selector "
            "matched no device with NUMA locality (the log and /debug/state say why)",
            ["resource"],
            registry=r,
        )
        self.allocatable_cpus = Gauge(
            "numa_node_allocatable_cpus",
            "CPUs of the NUMA node the kubelet may hand out exclusively (pod resources API)",
            ["numa_node"],
            registry=r,
        )
        self.assigned_cpus = Gauge(
            "numa_node_assigned_cpus",
            "Exclusive CPUs of the NUMA node assigned to containers holding its resource "
            "(holder=numa-align) or not (holder=other)",
            ["numa_node", "holder"],
            registry=r,
        )
        self.misaligned = Gauge(
            "numa_node_misaligned_containers",
            "Containers holding the NUMA node's resource whose exclusive CPUs are elsewhere "
            "(or who have none)",
            ["numa_node"],
            registry=r,
        )
        self.allocatable_memory = Gauge(
            "numa_node_allocatable_memory_bytes",
            "Memory the kubelet's Memory Manager may hand out on the NUMA node, by type",
            ["numa_node", "memory_type"],
            registry=r,
        )
        self.assigned_memory = Gauge(
            "numa_node_assigned_memory_bytes",
            "Memory of the NUMA node in containers' memory blocks, by type, held by "
            "containers holding our resources (holder=numa-align) or not (holder=other); "
            "a block naming several NUMA nodes counts in full on each",
            ["numa_node", "memory_type", "holder"],
            registry=r,
        )
        self.exposed_node = Gauge(
            f"{prefix}_exposed_numa_node",
            "The NUMA node whose free devices a resource over several NUMA nodes offers "
            "now (numa-align/any, a device on several nodes): the one with the most room",
            ["resource"],
            registry=r,
        )
        self.exposure_switches = Counter(
            f"{prefix}_exposed_numa_node_changes_total",
            "Changes of a resource's exposed NUMA node",
            ["resource"],
            registry=r,
        )
        self._switches: dict[str, int] = {}
        self.pod_resources_up = Gauge(
            f"{prefix}_pod_resources_up",
            "1 when the last read of the kubelet's pod resources API answered, else 0",
            registry=r,
        )
        self._last_read: float | None = None
        self.pod_resources_age = Gauge(
            f"{prefix}_pod_resources_last_read_age_seconds",
            "Seconds since the last good read of the kubelet's pod resources API "
            "(NaN before the first)",
            registry=r,
        )
        self.pod_resources_age.set_function(self._read_age)
        build = Gauge(
            f"{prefix}_build_info",
            "Versions of the plugin and its runtime",
            ["version", "python", "grpcio"],
            registry=r,
        )
        build.labels(__version__, platform.python_version(), grpc.__version__).set(1)

    def topology(self, plans: tuple[NodePlan, ...], devices: dict[str, int]) -> None:
        self._plans = plans
        self.devices_gauge.clear()
        # A resource no longer advertised (its NUMA node lost its CPUs, another
        # configuration) loses its registered series: left at 0 it would read as a
        # registration missing forever (the chart's NumaDevicePluginNotRegistered alert).
        for gone in self._advertised - set(devices):
            with contextlib.suppress(KeyError):
                self.registered_now.remove(gone)
        # A resource advertised before keeps its registered value: a new look that
        # changes no resource (a NIC hot-plugged) registers nothing again.
        new, self._advertised = set(devices) - self._advertised, set(devices)
        for resource, count in devices.items():
            self.devices_gauge.labels(resource, HEALTHY).set(count)
            self.devices_gauge.labels(resource, UNHEALTHY).set(0)
            if resource in new:
                self.registered_now.labels(resource).set(0)
            # Create every per-resource series at 0, so a rate() sees the first event.
            for counter in (
                self.allocations,
                self.allocate_errors,
                self.registrations,
                self.registration_failures,
                self.allocate_duration,
            ):
                counter.labels(resource)

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        self.near_numa_node.clear()
        self.near_advertised.clear()
        for resource, node_ids in nodes.items():
            self.near_advertised.labels(resource).set(1 if node_ids else 0)
            for node_id in node_ids:
                self.near_numa_node.labels(resource, str(node_id)).set(1)

    def allocated(self, resource: str, seconds: float, ok: bool) -> None:
        (self.allocations if ok else self.allocate_errors).labels(resource).inc()
        self.allocate_duration.labels(resource).observe(seconds)

    def registration(self, resource: str, ok: bool) -> None:
        (self.registrations if ok else self.registration_failures).labels(resource).inc()

    def registered(self, resource: str, now: bool) -> None:
        if not now and resource not in self._advertised:
            return  # an endpoint of a resource no longer advertised, stopping
        self.registered_now.labels(resource).set(1 if now else 0)

    def kubelet_restart(self) -> None:
        self.kubelet_restarts.inc()

    def devices(self, resource: str, devices: Sequence[Device]) -> None:
        healthy = sum(1 for device in devices if device.health == HEALTHY)
        self.devices_gauge.labels(resource, HEALTHY).set(healthy)
        self.devices_gauge.labels(resource, UNHEALTHY).set(len(devices) - healthy)

    def exposed(self, resource: str, node_id: int, switches: int) -> None:
        self.exposed_node.labels(resource).set(node_id)
        counted = self._switches.get(resource, 0)
        self.exposure_switches.labels(resource).inc(max(0, switches - counted))
        self._switches[resource] = max(counted, switches)

    def capacity(
        self,
        nodes: Sequence[NodeCapacity],
        memory: Mapping[int, Mapping[str, int]],
        assigned_memory: Mapping[tuple[int, str, str], int],
    ) -> None:
        for metric in (
            self.allocatable_cpus,
            self.assigned_cpus,
            self.misaligned,
            self.allocatable_memory,
            self.assigned_memory,
        ):
            metric.clear()
        for node in nodes:
            label = str(node.node_id)
            self.allocatable_cpus.labels(label).set(len(node.allocatable_cpus))
            self.assigned_cpus.labels(label, OURS).set(len(node.assigned_ours))
            self.assigned_cpus.labels(label, OTHERS).set(len(node.assigned_other))
            self.misaligned.labels(label).set(node.misaligned)
        for node_id, per_type in memory.items():
            for memory_type, size in per_type.items():
                self.allocatable_memory.labels(str(node_id), memory_type).set(size)
        for (node_id, memory_type, holder), size in assigned_memory.items():
            self.assigned_memory.labels(str(node_id), memory_type, holder).set(size)

    def pod_resources(self, up: bool, last_read: float | None) -> None:
        self.pod_resources_up.set(1 if up else 0)
        self._last_read = last_read

    def _read_age(self) -> float:
        if self._last_read is None:
            return float("nan")
        return max(0.0, time.time() - self._last_read)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)


class _TopologyCollector(Collector):
    """``numa_node_cpus_count``, ``numa_node_memory_bytes``, ``numa_node_distance`` and
    ``numa_node_advertised``, built at each scrape from ``plans()``."""

    def __init__(self, plans: Callable[[], tuple[NodePlan, ...]]) -> None:
        self._plans = plans

    def collect(self) -> Iterator[Metric]:
        cpus = GaugeMetricFamily(
            "numa_node_cpus_count", "Usable (online) CPUs", labels=["numa_node"]
        )
        memory = GaugeMetricFamily(
            "numa_node_memory_bytes", "MemTotal of the NUMA node", labels=["numa_node"]
        )
        distance = GaugeMetricFamily(
            "numa_node_distance",
            "Kernel NUMA distance (10 = local)",
            labels=["numa_node", "to_numa_node"],
        )
        advertised = GaugeMetricFamily(
            "numa_node_advertised",
            "1 if the NUMA node has an extended resource",
            labels=["numa_node"],
        )
        for plan in self._plans():
            node = str(plan.node.id)
            cpus.add_metric([node], len(plan.node.cpus))
            if plan.node.memory_bytes is not None:
                memory.add_metric([node], plan.node.memory_bytes)
            for other, value in sorted((plan.node.distances or {}).items()):
                distance.add_metric([node, str(other)], value)
            advertised.add_metric([node], 1 if plan.advertised else 0)
        yield from (cpus, memory, distance, advertised)

    def describe(self) -> Iterator[Metric]:
        return iter(())


def documented_families() -> list[Metric]:
    """Every metric family the plugin serves, each with at least one series (so its
    labels show): a recorder that has seen one of each event on two NUMA nodes, as the
    documentation's metrics reference lists them (process, platform and GC included)."""
    from numa_device_plugin.topology.numa import NumaNode

    recorder = PrometheusRecorder()
    nodes = [NumaNode(n, frozenset({2 * n, 2 * n + 1}), 1 << 30, {0: 10 + 11 * n, 1: 21 - 11 * n})
             for n in (0, 1)]  # fmt: skip
    recorder.topology(tuple(NodePlan(node, True) for node in nodes), {"numa-align/numa-0": 2})
    recorder.near({"numa-align/data-disk": [1]})
    recorder.allocated("numa-align/numa-0", 0.001, True)
    recorder.allocated("numa-align/numa-0", 0.001, False)
    recorder.registration("numa-align/numa-0", True)
    recorder.registered("numa-align/numa-0", True)
    recorder.kubelet_restart()
    recorder.devices("numa-align/numa-0", [Device("numa0-cpu0000", 0, 0)])
    recorder.exposed("numa-align/any", 1, 1)
    capacity = NodeCapacity(0, "numa-align/numa-0", frozenset({0, 1}), frozenset({0}),
                            frozenset(), frozenset({"numa0-cpu0000"}), 2, 1, 0)  # fmt: skip
    recorder.capacity([capacity], {0: {"memory": 1 << 30}}, {(0, "memory", OURS): 1 << 28})
    recorder.pod_resources(True, time.time())
    return list(recorder.registry.collect())
