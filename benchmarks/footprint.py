"""What the plugin costs the node: RSS and idle CPU (footprint), and RSS, start and
ListAndWatch size at 8 to 256 NUMA nodes (scale).
"""

from __future__ import annotations

from benchmarks.allocation import allocate_sequential
from benchmarks.figures import MB, Figure
from benchmarks.harness import (
    fully_up,
    held_port,
    rig,
    settle,
)
from benchmarks.polling import idle_cpu

# -- footprint ------------------------------------------------------------------------------


async def footprint(idle_seconds: float, calls: int) -> list[Figure]:
    """RSS after start and after an Allocate run; CPU used while idle (8 NUMA nodes)."""
    figures = []
    for nodes in (2, 8, 64):
        async with rig(nodes) as bench:
            await settle()
            after_start = bench.plugin.rss_bytes() / MB
            await allocate_sequential(bench, calls)
            after_allocate = bench.plugin.rss_bytes() / MB
            config = f"{nodes} NUMA nodes x 100 devices"
            target = 45.0 if nodes == 8 else None
            figures += [
                Figure("footprint", config, "RSS after start", after_start, "MB", target),
                Figure(
                    "footprint",
                    config,
                    f"RSS after {calls} Allocate",
                    after_allocate,
                    "MB",
                    target,
                ),
            ]
            if nodes == 8:
                await settle(2.0)  # let the Allocate run's aftermath pass
                figures.append(
                    await idle_cpu(bench, idle_seconds, "footprint", config, target=0.01)
                )
    return figures


# -- scale -------------------------------------------------------------------------------------

# NUMA nodes per scale run; the DaemonSet's memory limit must cover 64 with a 2x margin.
SCALE_NODES = (8, 64, 256)
# NUMA nodes per run with memory resources (--memory-unit 1Gi, 256 GiB per node).
MEMORY_NODES = (8, 64)
MEMORY_LIMIT_MB = 160


async def scale(
    nodes_list: tuple[int, ...] = SCALE_NODES, memory_nodes: tuple[int, ...] = MEMORY_NODES
) -> list[Figure]:
    """RSS, open fds and threads of a registered plugin with metrics on, at each of
    ``nodes_list`` NUMA nodes x 100 slots; the cost of one more NUMA node (the slope
    between the smallest and the largest); then RSS with memory resources on
    (``--memory-unit 1Gi`` over 256 GiB per node) at each of ``memory_nodes``."""
    figures = []
    rss: dict[int, float] = {}
    fds: dict[int, int] = {}
    for nodes in nodes_list:
        port = held_port()
        extra = ("--metrics-address", f"127.0.0.1:{port}")
        async with rig(nodes, extra=extra) as bench:
            await settle(2.0)
            await fully_up(port)
            rss[nodes] = bench.plugin.rss_bytes() / MB
            fds[nodes] = bench.plugin.open_fds()
            threads = bench.plugin.threads()
        config = f"{nodes} NUMA nodes x 100 slots, metrics on"
        target = MEMORY_LIMIT_MB / 2 if nodes == 64 else None
        figures += [
            Figure("scale", config, "RSS", rss[nodes], "MB", target),
            Figure("scale", config, "open fds", fds[nodes], "fds"),
            Figure("scale", config, "threads", threads, "threads"),
        ]
    low, high = min(nodes_list), max(nodes_list)
    if high > low:
        per_node = f"per NUMA node ({low} -> {high})"
        figures += [
            Figure("scale", per_node, "RSS", (rss[high] - rss[low]) / (high - low), "MB"),
            Figure("scale", per_node, "open fds", (fds[high] - fds[low]) / (high - low), "fds"),
        ]
    for nodes in memory_nodes:
        port = held_port()
        extra = ("--metrics-address", f"127.0.0.1:{port}")
        async with rig(nodes, extra=extra, memory=True, memory_unit=True) as bench:
            await settle(2.0)
            await fully_up(port)
            devices = sum(len(bench.kubelet.devices(name)) for name in bench.names)
            config = f"{nodes} NUMA nodes x 256 GiB, --memory-unit 1Gi, metrics on"
            # Memory devices are capped (32,768 in all: ~105 MB): within the limit.
            target = MEMORY_LIMIT_MB if nodes == 64 else None
            figures += [
                Figure("scale", config, "RSS", bench.plugin.rss_bytes() / MB, "MB", target),
                Figure("scale", config, "devices", devices, "devices"),
            ]
    return figures
