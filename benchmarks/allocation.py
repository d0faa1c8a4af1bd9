"""Allocate: latency of sequential and concurrent calls against a real plugin."""

from __future__ import annotations

import asyncio
import time

from benchmarks.figures import Figure
from benchmarks.harness import (
    Rig,
    percentile,
    rig,
)

# -- Allocate -------------------------------------------------------------------------------


async def allocate_sequential(bench: Rig, calls: int) -> list[float]:
    """Per-call latencies (ms) of ``calls`` sequential one-device Allocate calls."""
    name = bench.names[0]
    device = bench.kubelet.devices(name)[0].ID
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await bench.kubelet.allocate(name, [device])
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def allocate(calls: int, concurrency: int) -> list[Figure]:
    async with rig(2) as bench:
        samples = await allocate_sequential(bench, calls)
        name = bench.names[0]
        devices = [d.ID for d in bench.kubelet.devices(name)]

        async def caller(index: int) -> None:
            for call in range(calls // concurrency):
                await bench.kubelet.allocate(name, [devices[(index + call) % len(devices)]])

        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    config = f"{calls} sequential calls, 1 container, 1 device"
    throughput = (calls // concurrency) * concurrency / elapsed
    return [
        Figure("Allocate", config, "p50", percentile(samples, 0.50), "ms"),
        Figure("Allocate", config, "p99", percentile(samples, 0.99), "ms", 1.0),
        Figure(
            "Allocate", f"{concurrency} concurrent callers", "throughput", throughput, "calls/s"
        ),
    ]
