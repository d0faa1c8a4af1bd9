"""More than 8 NUMA nodes: a process start to every resource registered, and a kubelet
restart to every resource registered again, at 16, 32 and 64 NUMA nodes, against the
kubelet stand-in (``python -m benchmarks.bench manynodes``).

The machine is what such sizes look like in the field: ``--capacity cpus`` with the pod
resources API (4 CPUs a NUMA node), two sockets of half the NUMA nodes each (so
``numa-align/any`` and two ``numa-align/socket-S`` resources are served beside the
``numa-N`` ones), the kubelet's Topology Manager limit warned about once at start. The
figures are bounds to watch, not targets: the plugin must start, register and answer in
bounded time; they grow with the resources (one gRPC server and one registration each).
"""

from __future__ import annotations

import statistics
import time

from benchmarks.figures import Figure
from benchmarks.harness import percentile, rig

SIZES = (16, 32, 64)
CPUS_PER_NODE = 4


async def many_nodes(sizes: tuple[int, ...], runs: int, restarts: int) -> list[Figure]:
    """Per size: start to registered (median and max of ``runs`` process starts, s) and
    re-registration after a kubelet restart (p50, p99 of ``restarts``, ms)."""
    figures = []
    for nodes in sizes:
        starts: list[float] = []
        again: list[float] = []
        for run in range(runs):
            async with rig(nodes, "cpus", start=False, cpus_per_node=CPUS_PER_NODE,
                           pod_resources=True) as bench:  # fmt: skip
                root = bench.plugin.sysfs_root
                for cpu in range(nodes * CPUS_PER_NODE):
                    socket = 0 if cpu < nodes * CPUS_PER_NODE // 2 else 1
                    path = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
                    path.mkdir(parents=True, exist_ok=True)
                    (path / "physical_package_id").write_text(f"{socket}\n")
                bench.names += ["numa-align/any", "numa-align/socket-0", "numa-align/socket-1"]
                bench.plugin.start()
                await bench.wait_live()
                starts.append(time.perf_counter() - bench.plugin.started_at)
                if run == 0:
                    for _ in range(restarts):
                        await bench.kubelet.restart()
                        await bench.wait_live()
                        again.append((time.perf_counter() - bench.kubelet.restarted_at) * 1000)
        config = f"{nodes} NUMA nodes x {CPUS_PER_NODE} CPUs, cpus mode, any + 2 sockets"
        figures += [
            Figure("start to registered", config, f"median of {runs}",
                   statistics.median(starts), "s", extra={"samples": starts}),
            Figure("start to registered", config, f"max of {runs}", max(starts), "s"),
            Figure("re-registration", config, f"p50 of {restarts}", percentile(again, 0.5), "ms"),
            Figure("re-registration", config, f"p99 of {restarts}", percentile(again, 0.99),
                   "ms"),
        ]  # fmt: skip
    return figures
