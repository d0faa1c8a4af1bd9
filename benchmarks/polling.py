"""Pod resources polling: the CPU a read costs and the plugin's idle CPU while it polls."""

from __future__ import annotations

import asyncio

from benchmarks.figures import Figure
from benchmarks.floor import FLOOR
from benchmarks.harness import (
    Rig,
    rig,
    settle,
)
from benchmarks.registration import start_floor
from numa_device_plugin.plugin.model.resources import CPUS

# -- pod resources polling -------------------------------------------------------------------


def place_containers(
    bench: Rig, count: int, memory: bool = False, hold_memory: bool = False
) -> None:
    """``count`` Guaranteed containers: every other one holds a device of ours and a
    CPU on NUMA node 0 or 1, the rest a CPU without our devices. With ``memory`` each
    also has a 1 GiB memory block on its node; with ``hold_memory`` ours hold a memory
    device for it."""
    for index in range(count):
        node = index % 2
        cpu = node * 128 + index // 2
        devices: dict[str, list[str]] = {}
        if index % 4 < 2:
            resource = f"numa-align/numa-{node}"
            devices[resource] = [f"numa{node}-cpu{cpu:04d}"]
            if hold_memory:
                devices[f"{resource}-memory"] = [f"numa{node}-mem{index // 2:04d}"]
        blocks = [("memory", 1 << 30, [node])] if memory else []
        bench.kubelet.add_pod("bench", f"pod-{index}", [("app", devices, [cpu], blocks)])


async def cpu_per_read(bench: Rig, window: float) -> tuple[int, float]:
    """Reads of the pod resources API in ``window`` seconds, and the plugin's CPU per
    read (ms), after a second of settling."""
    await settle(1.0)
    calls, before = bench.kubelet.pod_resources_calls, bench.plugin.cpu_seconds()
    await asyncio.sleep(window)
    polls = bench.kubelet.pod_resources_calls - calls
    used = bench.plugin.cpu_seconds() - before
    return polls, used / max(polls, 1) * 1000


async def polling(idle_seconds: float, window: float = 8.0) -> list[Figure]:
    """Plugin CPU per pod resources read (List + GetAllocatableResources + the live
    count) at 10 and 200 containers, read every 100 ms (the floor) for a few seconds,
    with CPUs only and with ``--memory-unit 1Gi``, against the same kubelet (Memory
    Manager Static, 256 GiB per node, each container a 1 GiB memory block): memory on
    adds 3 resources per node (238 + 16 + 2 devices), and its figure's target is the
    CPUs-only figure plus 10%. Beside them the floor: :mod:`benchmarks.floor` reading
    ``List`` as often against the same kubelet (what any Python reader pays). Then idle
    CPU with the default 5 s interval. 2 NUMA nodes x 128 CPUs, cpus mode."""
    figures = []
    for containers in (10, 200):
        cpus_only = 0.0
        for memory in (False, True):
            fast = ("--pod-resources-interval", "0.1")  # the floor
            async with rig(2, CPUS, cpus_per_node=128, extra=fast, pod_resources=True,
                           memory=True, memory_unit=memory) as bench:  # fmt: skip
                place_containers(bench, containers, memory=True, hold_memory=memory)
                polls, per_read = await cpu_per_read(bench, window)
            target = 1.0 if containers == 200 and not memory else None
            if memory:
                target = cpus_only * 1.1
            else:
                cpus_only = per_read
            figures.append(
                Figure(
                    "pod resources",
                    f"{containers} containers{', memory on' if memory else ''}, {polls} reads",
                    "CPU per read",
                    per_read,
                    "ms",
                    target,
                    extra={"resolution_ms": 10 / max(polls, 1)},
                )
            )
        async with rig(2, CPUS, cpus_per_node=128, pod_resources=True, memory=True,
                       start=False) as bench:  # fmt: skip
            await start_floor(bench, pod_resources=bench.kubelet.pod_resources_socket,
                              interval=0.1)  # fmt: skip
            place_containers(bench, containers, memory=True)
            polls, per_read = await cpu_per_read(bench, window)
        figures.append(
            Figure(
                "pod resources",
                f"{containers} containers, {FLOOR}, {polls} reads",
                "CPU per read",
                per_read,
                "ms",
                extra={"resolution_ms": 10 / max(polls, 1)},
            )
        )
    async with rig(2, CPUS, cpus_per_node=128, pod_resources=True) as bench:
        place_containers(bench, 10)
        await settle(2.0)
        config = "10 containers, read every 5 s"
        figures.append(await idle_cpu(bench, idle_seconds, "pod resources", config))
    return figures


async def idle_cpu(
    bench: Rig, seconds: float, benchmark: str, config: str, target: float | None = None
) -> Figure:
    """The plugin's CPU seconds per minute over ``seconds`` of doing nothing asked
    (the clock counts 0.01 s steps)."""
    before = bench.plugin.cpu_seconds()
    await asyncio.sleep(seconds)
    used = bench.plugin.cpu_seconds() - before
    return Figure(
        benchmark,
        f"{config}, idle {seconds:g} s",
        "CPU per idle minute",
        used * 60 / seconds,
        "s",
        target,
        extra={"resolution_s": 0.01},
    )
