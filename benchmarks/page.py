"""The node page: building and rendering it from a synthetic state, as the plugin's worker
thread does.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.figures import Figure
from numa_device_plugin.plugin.model.resources import CPUS

# -- the node page --------------------------------------------------------------------------

PAGE_TARGET_MS = 200.0  # issue: the page at 64 NUMA nodes in under 200 ms


def page_state(nodes: int, cpus_per_node: int = 32) -> Any:
    """A :class:`PluginState` of ``nodes`` NUMA nodes of ``cpus_per_node`` CPUs, half of
    each node's CPUs held by one-CPU containers (ours and others alternating), memory and
    2 MiB hugepages under the Memory Manager, ``--capacity cpus``."""
    from numa_device_plugin.kubelet.view import Holder, KubeletView
    from numa_device_plugin.plugin.model.resources import Device, Resource
    from numa_device_plugin.plugin.reports.snapshot import PluginState, Served
    from numa_device_plugin.plugin.settings.config import Config
    from numa_device_plugin.topology.numa import NumaNode
    from numa_device_plugin.topology.plan import NodePlan

    gib = 1 << 30
    plans, served, holders, others = [], {}, [], []
    for node in range(nodes):
        cpus = range(node * cpus_per_node, (node + 1) * cpus_per_node)
        distances = {other: 10 if other == node else 20 for other in range(nodes)}
        plans.append(
            NodePlan(NumaNode(node, frozenset(cpus), 256 * gib, distances, frozenset(cpus)), True)
        )
        name = f"numa-align/numa-{node}"
        devices = tuple(Device(f"numa{node}-cpu{c:04d}", node, c) for c in cpus)
        served[name] = Served(Resource(name, node, devices), devices, True, 1, True)
        for i, cpu in enumerate(cpus[: cpus_per_node // 2]):
            pod = f"pod-{node}-{i}"
            if i % 2:
                others.append(Holder("other", pod, "main", frozenset({cpu})))
                continue
            memory = {(node, "memory"): gib}
            holders.append(
                Holder("app", pod, "main", frozenset({cpu}), {name: (devices[i].id,)}, memory)
            )
    view = KubeletView(
        allocatable_cpus=frozenset(range(nodes * cpus_per_node)),
        holders=tuple(holders),
        others=tuple(others),
        foreign_cpus=frozenset(c for h in others for c in h.cpus),
        memory={n: {"memory": 250 * gib, "hugepages-2Mi": 4 * gib} for n in range(nodes)},
        assigned_memory={n: {"memory": 16 * gib} for n in range(nodes)},
    )
    return PluginState(
        taken_at=time.time(),
        config=Config(capacity=CPUS),
        plans=tuple(plans),
        served=served,
        view=view,
        pod_resources_up=True,
        pod_resources_read_at=time.time(),
        lock="held",
    )


async def page(nodes_list: tuple[int, ...], runs: int = 20) -> list[Figure]:
    """The node page (``/``) built and rendered from a state at each of ``nodes_list``
    NUMA nodes x 32 CPUs: median and slowest of ``runs`` renderings (ms), and bytes."""
    from numa_device_plugin.plugin.reports.nodepage import build_page, render_page

    figures = []
    for nodes in nodes_list:
        state = page_state(nodes)
        samples = []
        body = b""
        for _ in range(runs):
            started = time.perf_counter()
            body = render_page(build_page(state, node="bench"))
            samples.append((time.perf_counter() - started) * 1000)
        config = f"{nodes} NUMA nodes x 32 CPUs, half held"
        target = PAGE_TARGET_MS if nodes == 64 else None
        figures += [
            Figure("page", config, "render median", statistics.median(samples), "ms", target),
            Figure("page", config, "render slowest", max(samples), "ms"),
            Figure("page", config, "size", len(body) / 1024, "KiB"),
        ]
    return figures
