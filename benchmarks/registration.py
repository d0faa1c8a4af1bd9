"""Registering: a kubelet restart to every resource registered again (re-registration), and
a process start to registered (startup), for ours and the floor plugin.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.figures import Figure
from benchmarks.floor import FLOOR
from benchmarks.floor import argv as floor_argv
from benchmarks.harness import (
    Rig,
    percentile,
    rig,
)

# -- re-registration ------------------------------------------------------------------------


async def start_floor(bench: Rig, **flags: Any) -> None:
    """Run :mod:`benchmarks.floor` as ``bench``'s plugin (a rig made with ``start``
    False), with ``flags`` of :func:`benchmarks.floor.argv`, until it is live."""
    bench.plugin.args = floor_argv(bench.kubelet.directory, bench.names, **flags)
    bench.plugin.start()
    await bench.wait_live()


async def reregistration(nodes: int, restarts: int, floor: bool = False) -> list[Figure]:
    """Kubelet restart (every socket deleted, kubelet.sock created anew) to every
    resource registered again with its device list delivered; ms. With ``floor`` the
    plugin is :mod:`benchmarks.floor` with ``--watch`` (the least a Python plugin can
    do: a watchdog watch, new servers, Register) under the same stand-in."""
    samples: list[float] = []
    async with rig(nodes, start=not floor) as bench:
        if floor:
            await start_floor(bench, watch=True)
        for _ in range(restarts):
            await bench.kubelet.restart()
            await bench.wait_live()
            samples.append((time.perf_counter() - bench.kubelet.restarted_at) * 1000)
    config = f"{nodes} NUMA nodes, {restarts} restarts"
    if floor:
        config = f"{config}, {FLOOR}"
    target = 20.0 if nodes == 8 and not floor else None
    return [
        Figure("re-registration", config, "p50", percentile(samples, 0.50), "ms"),
        Figure("re-registration", config, "p99", percentile(samples, 0.99), "ms", target),
        Figure("re-registration", config, "max", max(samples), "ms"),
    ]


# -- start to registered --------------------------------------------------------------------

STARTUP_TARGETS = {(8, 100): 0.1, (64, 1000): 2.0}


async def startup(runs: int) -> list[Figure]:
    """Process start (exec) to every resource registered with its list delivered; s.

    The package's bytecode is compiled first, as in the image (pip compiles it at
    install); a checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise compile
    every module from source at each start (about 30 ms here)."""
    import compileall

    import numa_device_plugin

    compileall.compile_dir(Path(numa_device_plugin.__file__).parent, quiet=1)
    figures = []
    for nodes in (1, 8, 64):
        for capacity in (100, 1000):
            samples = []
            for _ in range(runs):
                async with rig(nodes, capacity, start=False) as bench:
                    bench.plugin.start()
                    await bench.wait_live()
                    samples.append(time.perf_counter() - bench.plugin.started_at)
            figures.append(
                Figure(
                    "start to registered",
                    f"{nodes} NUMA nodes x {capacity} devices",
                    f"median of {runs}",
                    statistics.median(samples),
                    "s",
                    STARTUP_TARGETS.get((nodes, capacity)),
                    extra={"samples": samples},
                )
            )
    return figures
