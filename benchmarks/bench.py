"""Benchmarks of a real ``numa-device-plugin serve`` process against the kubelet stand-in.

Usage: python -m benchmarks.bench
{all,reregistration,allocate,startup,footprint,polling,scale,page,locality} [--json]

Every figure but the page's comes from a real plugin process on a synthetic sysfs
tree, talking to the in-process kubelet stand-in over unix sockets in /tmp; the
page's renders a synthetic state in this process, as the plugin's worker thread does.
Latencies include the stand-in's own Python gRPC client, as they would include the
kubelet's.
The table marks each figure that has a target with ok or MISSED; the exit
status is 0 either way (figures are reported, not asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.floor import FLOOR
from benchmarks.floor import argv as floor_argv
from benchmarks.harness import (
    Rig,
    fully_up,
    held_port,
    machine_info,
    pace_flag,
    paced,
    percentile,
    rig,
    settle,
)
from numa_device_plugin.plugin.devices import CPUS

MB = 1024 * 1024


@dataclass
class Figure:
    """One measured figure; ``target`` is a bound and ``higher_is_worse`` its direction."""

    benchmark: str
    config: str
    name: str
    value: float
    unit: str
    target: float | None = None
    higher_is_worse: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        ok = self.value <= self.target if self.higher_is_worse else self.value >= self.target
        return "ok" if ok else "MISSED"


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


# -- the node page --------------------------------------------------------------------------

PAGE_TARGET_MS = 200.0  # issue: the page at 64 NUMA nodes in under 200 ms


def page_state(nodes: int, cpus_per_node: int = 32) -> Any:
    """A :class:`PluginState` of ``nodes`` NUMA nodes of ``cpus_per_node`` CPUs, half of
    each node's CPUs held by one-CPU containers (ours and others alternating), memory and
    2 MiB hugepages under the Memory Manager, ``--capacity cpus``."""
    from numa_device_plugin.kubelet.view import Holder, KubeletView
    from numa_device_plugin.plugin.config import Config
    from numa_device_plugin.plugin.devices import Device, Resource
    from numa_device_plugin.plugin.snapshot import PluginState, Served
    from numa_device_plugin.topology.numa import NodePlan, NumaNode

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
    from numa_device_plugin.plugin.nodepage import build_page, render_page

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


# -- device locality --------------------------------------------------------------------------


def device_machine(root: Path, pci: int, block: int) -> None:
    """Two NUMA nodes of 16 CPUs with ``pci`` PCI devices (alternating nodes 0 and 1,
    every tenth at -1), the first ``block`` of them NVMe controllers with a disk (serial
    ``S<n>``) and two partitions each, the rest Ethernet controllers with a NIC."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    build_machine(root, nodes=2, cpus_per_node=16)
    tree = DeviceTree(root)
    for index in range(pci):
        address = f"0000:{index // 32:02x}:{index % 32:02x}.0"
        node = -1 if index % 10 == 9 else index % 2
        if index < block:
            tree.pci(address, node, "0x010802")
            tree.disk(f"nvme{index}n1", address, serial=f"S{index}", partitions=2)
        else:
            tree.pci(address, node, "0x020000")
            tree.nic(f"eth{index}", address)


def _discover_rss(root: Path, *flags: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one ``discover`` process on ``root``."""
    import resource
    import subprocess

    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "numa_device_plugin", "discover", "--sysfs-root", str(root),
         "--output", "json", *flags],
        capture_output=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    assert json.loads(done.stdout)["nodes"], "discover found no NUMA node"
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, peak


def mount_table(root: Path, table: Path, block: int, mounts: int) -> None:
    """A mountinfo of ``mounts`` lines: ``/`` and the first partition of each disk
    (``/mnt/disks/d<n>``, its ``dev/block`` link made) up to ``mounts``, then tmpfs
    mounts."""
    lines = ["1 0 8:1 / / rw - ext4 /dev/sda1 rw"]
    for index in range(mounts - 1):
        if index < block:
            device = f"259:{index}"
            link = root / "dev" / "block" / device
            link.parent.mkdir(parents=True, exist_ok=True)
            part = (root / "class" / "block" / f"nvme{index}n1p1").resolve()
            link.symlink_to(os.path.relpath(part, link.parent))
            lines.append(f"{index + 2} 1 {device} / /mnt/disks/d{index} rw - xfs /dev/x rw")
        else:
            lines.append(f"{index + 2} 1 0:{index} / /run/t{index} rw - tmpfs tmpfs rw")
    table.write_text("\n".join(lines) + "\n")


async def locality(pci: int, block: int, runs: int, mounts: int = 200) -> list[Figure]:
    """Device locality (``bus/pci``, ``class/block``, ``class/net``) on a synthetic tree
    of ``pci`` PCI devices and ``block`` disks (3 block devices each) and a mount table
    of ``mounts`` mounts: read_inventory's median and slowest of ``runs`` (ms), one
    selector of each kind resolved (ms), the mount table read (ms), one full quiet look
    of the device watch and one look at unchanged devices (its look key, what it reads
    every interval but each tenth; ms), and a ``discover`` process's wall
    time and peak RSS with and without the devices."""
    import shutil
    import tempfile

    from numa_device_plugin.plugin.config import Config
    from numa_device_plugin.plugin.discovery import discover, look_key
    from numa_device_plugin.plugin.near import parse_near
    from numa_device_plugin.topology.locality import read_inventory
    from numa_device_plugin.topology.mounts import read_mount_table
    from numa_device_plugin.topology.selectors import parse_selector, select

    figures = []
    with tempfile.TemporaryDirectory(prefix="ndp-locality-") as folder:
        root = Path(folder) / "sys"
        device_machine(root, pci, block)
        samples = []
        inventory = read_inventory(root)
        for _ in range(runs):
            started = time.perf_counter()
            inventory = read_inventory(root)
            samples.append((time.perf_counter() - started) * 1000)
        shape = f"{pci} PCI devices, {block} disks ({len(inventory.block)} block devices)"
        selectors = [parse_selector(text) for text in (
            f"serial:S{block - 1}", "block:nvme0n1p2", f"net:eth{pci - 1}", "pci:0000:00:01.0",
            "pci-id:144d:a808", "pci-class:0200",
        )]  # fmt: skip
        started = time.perf_counter()
        for selector in selectors:
            select(inventory, selector)
        select_ms = (time.perf_counter() - started) * 1000 / len(selectors)
        table = Path(folder) / "mountinfo"
        mount_table(root, table, block, mounts)
        started = time.perf_counter()
        mount_read = read_mount_table(table, root)
        table_ms = (time.perf_counter() - started) * 1000
        path = parse_selector("path-below:/mnt/disks/d0/data")
        assert select(inventory, path, mount_read).nodes, "the path selector found no node"
        near = (parse_near(f"disk=serial:S{block - 1}"), parse_near("data=path:/mnt/disks/d0"))
        config = Config(sysfs_root=root, near=near, mount_table=table)
        rereads, keys = [], []
        for _ in range(max(1, runs // 7)):
            started = time.perf_counter()
            discover(config, quiet=True)  # the device watch's full look
            rereads.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            look_key(config)  # what it reads every interval while the key is unchanged
            keys.append((time.perf_counter() - started) * 1000)
        flags = ["--near", f"disk=serial:S{block - 1}", "--near", "data=path:/mnt/disks/d0"]
        with_devices = _discover_rss(root, *flags, "--mount-table", str(table))
        for kind in ("bus", "class"):
            shutil.rmtree(root / kind)
        without = _discover_rss(root)
    figures += [
        Figure("locality", shape, "read_inventory median", statistics.median(samples), "ms"),
        Figure("locality", shape, "read_inventory slowest", max(samples), "ms"),
        Figure("locality", shape, "one selector resolved", select_ms, "ms"),
        Figure("locality", f"{mounts} mounts", "read_mount_table", table_ms, "ms"),
        Figure(
            "locality",
            shape,
            "one look of the device watch (quiet)",
            statistics.median(rereads),
            "ms",
        ),
        Figure(
            "locality",
            shape,
            "one look at unchanged devices (the look key)",
            statistics.median(keys),
            "ms",
        ),
        Figure("locality", shape, "discover process, with devices", with_devices[0], "s"),
        Figure("locality", "no PCI, block or net", "discover process", without[0], "s"),
        Figure("locality", shape, "discover peak RSS, with devices", with_devices[1], "MB"),
    ]
    return figures


def node_counts(text: str) -> tuple[int, ...]:
    """``8,64`` -> (8, 64); empty: none."""
    return tuple(int(part) for part in text.split(",") if part.strip())


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


# -- output ---------------------------------------------------------------------------------


def render_table(figures: list[Figure], machine: dict[str, Any]) -> str:
    rows = [("benchmark", "config", "figure", "value", "target", "")]
    for figure in figures:
        bound = "<=" if figure.higher_is_worse else ">="
        target = "" if figure.target is None else f"{bound} {figure.target:g} {figure.unit}"
        precision = 3 if figure.unit in ("ms", "s") else 1
        value = f"{figure.value:.{precision}f} {figure.unit}"
        rows.append((figure.benchmark, figure.config, figure.name, value, target, figure.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    header = ", ".join(f"{key} {value}" for key, value in machine.items())
    return "machine: " + header + "\n\n" + "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__)
    parser.add_argument(
        "which",
        choices=(
            "all",
            "reregistration",
            "allocate",
            "startup",
            "footprint",
            "polling",
            "scale",
            "page",
            "locality",
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--restarts", type=int, default=200, help="kubelet restarts per size")
    parser.add_argument("--calls", type=int, default=10_000, help="Allocate calls")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent Allocate callers")
    parser.add_argument("--runs", type=int, default=3, help="process starts per size")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window")
    parser.add_argument(
        "--window", type=float, default=8.0, help="seconds of fast pod resources reads"
    )
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=SCALE_NODES,
        help="scale and page: NUMA node counts, comma-separated (8,64,256)",
    )
    parser.add_argument(
        "--memory-nodes",
        type=node_counts,
        default=MEMORY_NODES,
        help="scale: NUMA node counts with --memory-unit 1Gi (8,64; empty: none)",
    )
    parser.add_argument("--pci", type=int, default=1000, help="locality: PCI devices")
    parser.add_argument("--block", type=int, default=500, help="locality: disks among them")
    parser.add_argument("--mounts", type=int, default=200, help="locality: mounts in the table")
    parser.add_argument(
        "--pace", type=pace_flag, default=1.0,
        help="multiply every fixed settle time (below 1 only to show a benchmark runs)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    async def run_reregistration() -> list[Figure]:
        return [
            figure
            for nodes in (2, 8)
            for floor in (False, True)
            for figure in await reregistration(nodes, args.restarts, floor)
        ]

    jobs: dict[str, Callable[[], Coroutine[Any, Any, list[Figure]]]] = {
        "reregistration": run_reregistration,
        "allocate": lambda: allocate(args.calls, args.concurrency),
        "startup": lambda: startup(args.runs),
        "footprint": lambda: footprint(args.idle_seconds, args.calls),
        "polling": lambda: polling(args.idle_seconds, args.window),
        "scale": lambda: scale(args.nodes, args.memory_nodes),
        "page": lambda: page(args.nodes, args.runs * 7),
        "locality": lambda: locality(args.pci, args.block, args.runs * 7, args.mounts),
    }
    selected = list(jobs) if args.which == "all" else [args.which]
    figures: list[Figure] = []
    for name in selected:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        with paced(args.pace):
            figures += asyncio.run(jobs[name]())
    machine = machine_info()
    if args.json:
        document = {
            "machine": machine,
            "figures": [asdict(figure) | {"verdict": figure.verdict} for figure in figures],
        }
        print(json.dumps(document, indent=2))
    else:
        print(render_table(figures, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
