"""numa-align/any's switch at Allocate: the time from Allocate's answer to the ListAndWatch
update that offers the next NUMA node, against a real plugin (``--capacity cpus``), alone
and under a burst of Allocates.

The stand-in lists no pod, so every allocation is counted from Allocate alone (the
plugin reads the pod resources API only every 60 s here, and once
``ALLOCATE_POLL_DELAY`` after an Allocate, which ends the allocation: the list goes back).
"""

from __future__ import annotations

import asyncio
import time

from benchmarks.figures import Figure
from benchmarks.harness import percentile, rig

ANY = "numa-align/any"
CPUS_PER_NODE = 4
TARGET_P99_MS = 5.0


def _listed(bench_kubelet: object) -> tuple[tuple[str, str], ...]:
    devices = bench_kubelet.devices(ANY)  # type: ignore[attr-defined]
    return tuple((d.ID, d.health) for d in devices)


async def _changed(kubelet: object, before: tuple[tuple[str, str], ...]) -> float:
    """``time.perf_counter()`` when the stand-in's list of any first differs from
    ``before``."""
    await kubelet.wait_until(lambda: _listed(kubelet) != before, 5)  # type: ignore[attr-defined]
    return time.perf_counter()


async def switch(nodes: int, samples: int, burst: int) -> list[Figure]:
    """p50/p99 (ms) from one Allocate's answer to the next ListAndWatch list of any, at
    ``nodes`` NUMA nodes (negative: the list came first, the plugin sends it before its
    answer), and the share that came first; and from the last answer of ``burst``
    concurrent Allocates to the list holding all of them."""
    extra = ("--pod-resources-interval", "60")
    async with rig(nodes, "cpus", cpus_per_node=CPUS_PER_NODE, pod_resources=True,
                   extra=extra) as bench:  # fmt: skip
        kubelet = bench.kubelet
        await kubelet.wait_until(lambda: kubelet.live(ANY), 30)
        await kubelet.wait_until(lambda: kubelet.allocatable(ANY) == CPUS_PER_NODE, 30)
        single: list[float] = []
        for _ in range(samples):
            await asyncio.sleep(0.7)  # the read after the last Allocate has ended it
            await kubelet.wait_until(lambda: kubelet.allocatable(ANY) == CPUS_PER_NODE, 30)
            before = _listed(kubelet)
            healthy = [d.ID for d in kubelet.devices(ANY) if d.health == "Healthy"]
            arrived = asyncio.create_task(_changed(kubelet, before))
            await kubelet.allocate(ANY, healthy[:1])
            answered = time.perf_counter()
            # Negative: the update came before the answer (the plugin sends it first).
            single.append((await arrived - answered) * 1000)
        bursts: list[float] = []
        for _ in range(max(1, samples // 10)):
            await asyncio.sleep(0.7)
            await kubelet.wait_until(lambda: kubelet.allocatable(ANY) == CPUS_PER_NODE, 30)
            healthy = [d.ID for d in kubelet.devices(ANY) if d.health == "Healthy"]
            wanted = healthy[: min(burst, len(healthy))]
            await asyncio.gather(*(kubelet.allocate(ANY, [device]) for device in wanted))
            answered = time.perf_counter()

            def all_held(ids: list[str] = wanted) -> bool:
                listed = dict(_listed(kubelet))
                return all(listed.get(i) == "Healthy" for i in ids) and (
                    kubelet.allocatable(ANY) >= len(ids) + 1
                )

            await kubelet.wait_until(all_held, 5)
            bursts.append((time.perf_counter() - answered) * 1000)
    config = f"{nodes} NUMA nodes x {CPUS_PER_NODE} CPUs"
    first = sum(1 for sample in single if sample <= 0)
    return [
        Figure("any switch", config, "p50", percentile(single, 0.50), "ms"),
        Figure("any switch", config, "p99", percentile(single, 0.99), "ms", TARGET_P99_MS),
        Figure("any switch", config, "updates before the answer", 100 * first / len(single),
               "%"),
        Figure("any switch", f"{config}, burst of {burst}", "p99 after the last answer",
               percentile(bursts, 0.99), "ms"),
    ]  # fmt: skip
