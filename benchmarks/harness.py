"""What the benchmarks and the soak share: a real ``numa-device-plugin serve`` process
on a synthetic sysfs tree, next to the in-process kubelet stand-in, and /proc readings."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.topology.fake import build_machine

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


_HELD: list[socket.socket] = []


def held_port() -> int:
    """A TCP port on 127.0.0.1 held until this process ends: bound with SO_REUSEADDR and
    never listening, so a server that binds it with SO_REUSEADDR (asyncio's servers,
    Go's listeners: the plugin, Prometheus) can listen on it, while other programs'
    binds (an ephemeral port, a bind without SO_REUSEADDR) cannot take it in between. A
    port picked by binding and releasing it could be taken before the server binds it."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    _HELD.append(holder)
    port: int = holder.getsockname()[1]
    return port


def http_get(port: int, path: str, timeout: float = 30.0) -> tuple[int, float]:
    """GET ``path`` from 127.0.0.1:``port``: the status (0 when no answer) and the
    seconds it took; the body is read and dropped. Blocking."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as answer:
            answer.read()
            return int(answer.status), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, time.monotonic() - started
    except OSError:
        return 0, time.monotonic() - started


async def fully_up(port: int, timeout: float = 30.0) -> None:
    """Until the plugin listening on ``port`` answers ``/readyz`` with 200 (registered,
    the folder watched and the devices read after registering), then one ``/metrics``
    (the metrics are made after registration, or at the first scrape): what a running
    plugin holds, whatever the pace. Raises TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while (await asyncio.to_thread(http_get, port, "/readyz", 5.0))[0] != 200:  # noqa: ASYNC110 - a probe is polled, as the kubelet does
            await asyncio.sleep(0.05)
        await asyncio.to_thread(http_get, port, "/metrics", 5.0)


def resource_names(nodes: int) -> list[str]:
    return [f"numa-align/numa-{node}" for node in range(nodes)]


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))  # 1-based nearest rank
    return ordered[min(rank, len(ordered)) - 1]


def machine_info() -> dict[str, Any]:
    """The machine the figures come from."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "kernel": platform.release(),
    }


class PluginProcess:
    """A ``numa-device-plugin serve`` child process; /proc figures about it."""

    def __init__(
        self, sysfs_root: Path, socket_dir: Path, capacity: int | str, extra: Sequence[str] = ()
    ) -> None:
        self.sysfs_root = sysfs_root
        self.args = [
            sys.executable,
            "-m",
            "numa_device_plugin",
            "serve",
            "--sysfs-root",
            str(sysfs_root),
            "--socket-dir",
            str(socket_dir),
            "--capacity",
            str(capacity),
            "--log-level",
            "warning",
            *extra,
        ]
        self.log_path = socket_dir.parent / "plugin.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.started_at = time.perf_counter()
            self.process = subprocess.Popen(self.args, stderr=log, stdin=subprocess.DEVNULL)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status (kills after 10 s)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/PID/status")

    def threads(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise RuntimeError("no Threads in /proc/PID/status")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def fd_targets(self) -> list[str]:
        """What each open fd points at (``socket:[123]``, ``anon_inode:[eventfd]``...)."""
        targets = []
        for fd in sorted(os.listdir(f"/proc/{self.pid}/fd"), key=int):
            try:
                targets.append(f"{fd}->{os.readlink(f'/proc/{self.pid}/fd/{fd}')}")
            except OSError:
                continue
        return targets

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Rig:
    """A plugin process registered with a stand-in, on a machine of ``nodes`` NUMA nodes."""

    kubelet: KubeletStandIn
    plugin: PluginProcess
    names: list[str]
    devices: int = 0  # the devices to register, in all (for the deadline)

    def all_live(self) -> bool:
        return all(self.kubelet.live(name) for name in self.names)

    def live_count(self) -> int:
        return sum(1 for name in self.names if self.kubelet.live(name))

    async def wait_live(self, timeout: float | None = None) -> None:
        """Until every resource is live. ``timeout`` None: :func:`registration_deadline`
        of the resources and devices to register, so a loaded machine gets the time its
        work needs; when it still runs out, the error says how far it got."""
        if timeout is None:
            timeout = registration_deadline(len(self.names), self.devices)
        try:
            await self.kubelet.wait_until(self.all_live, timeout)
        except TimeoutError:
            raise RuntimeError(
                f"plugin did not register in {timeout:.0f} s: {self.live_count()} of "
                f"{len(self.names)} resources live; its log ends:\n" + self.plugin.log_tail()
            ) from None


def registration_deadline(resources: int, devices: int = 0) -> float:
    """Seconds to allow for ``resources`` registrations with ``devices`` devices in all:
    20 s, plus 0.5 s a resource and 1 ms a device (a quiet machine needs ~40 ms a
    resource; both cores busy, up to ten times that)."""
    return 20.0 + 0.5 * resources + 0.001 * devices


# GiB of memory per NUMA node in rigs with memory.
MEMORY_GIB = 256


@asynccontextmanager
async def rig(
    nodes: int,
    capacity: int | str = 100,
    *,
    start: bool = True,
    cpus_per_node: int = 2,
    extra: Sequence[str] = (),
    pod_resources: bool = False,
    memory: bool = False,
    memory_unit: bool = False,
) -> AsyncIterator[Rig]:
    """A temp folder (short path) with a sysfs tree, the stand-in and the plugin process.

    With ``start`` the plugin is started and registered before the block runs. With
    ``pod_resources`` the stand-in also serves the pod resources API (every CPU
    allocatable) and the plugin is pointed at it. With ``memory`` every NUMA node has
    :data:`MEMORY_GIB` GiB (16 of them in 1Gi pages, 2 in 2Mi pages) and the stand-in's
    Memory Manager is Static; with ``memory_unit`` too, the plugin runs with
    ``--memory-unit 1Gi``.
    """
    folder = Path(tempfile.mkdtemp(prefix="ndpb-", dir="/tmp"))
    try:
        tree = build_machine(folder / "sys", nodes, cpus_per_node)
        socket_dir = folder / "dp"
        standin = KubeletStandIn(socket_dir)
        allocatable_memory: dict[int, int | dict[str, int]] = {}
        if memory:
            for node in range(nodes):
                tree.node(node, mem_kb=MEMORY_GIB << 20, hugepages={1048576: 16, 2048: 1024})
                allocatable_memory[node] = {
                    "memory": (MEMORY_GIB - 18) << 30,
                    "hugepages-1Gi": 16 << 30,
                    "hugepages-2Mi": 2 << 30,
                }
            if memory_unit:
                extra = (*extra, "--memory-unit", "1Gi")
        if pod_resources:
            standin = KubeletStandIn(
                socket_dir,
                pod_resources_dir=folder / "pr",
                allocatable_cpus=range(nodes * cpus_per_node),
                allocatable_memory=allocatable_memory,
            )
            extra = (*extra, "--pod-resources-socket", str(folder / "pr" / "kubelet.sock"))
        async with standin as kubelet:
            plugin = PluginProcess(tree.root, socket_dir, capacity, extra)
            names = resource_names(nodes)
            if memory and memory_unit:
                names += [
                    f"{name}-{suffix}"
                    for name in resource_names(nodes)
                    for suffix in ("memory", "hugepages-1gi", "hugepages-2mi")
                ]
            per_node = capacity if isinstance(capacity, int) else cpus_per_node
            bench = Rig(kubelet, plugin, names, nodes * per_node)
            try:
                if start:
                    plugin.start()
                    await bench.wait_live()
                yield bench
            finally:
                status = plugin.stop()
                if status != 0:
                    raise RuntimeError(f"plugin exited {status}:\n{plugin.log_tail()}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Multiplies every fixed settle and hold time of the benchmarks (the idle and read
# windows are flags of their own): 1.0 for figures, less where a test only shows that a
# benchmark runs (``--pace``).
PACE = [1.0]


def pace_flag(text: str) -> float:
    """``--pace``: a number above 0 (argparse turns the ArgumentTypeError into exit 2)."""
    try:
        pace = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not pace > 0 or pace == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text!r}")
    return pace


@contextlib.contextmanager
def paced(pace: float) -> Iterator[None]:
    """Every :func:`settle` inside waits ``pace`` times its seconds; the pace before is
    back afterwards (a test calling one benchmark leaves the next at its own pace)."""
    before, PACE[0] = PACE[0], pace
    try:
        yield
    finally:
        PACE[0] = before


async def settle(seconds: float = 0.2) -> None:
    """Give late events a moment to run: ``seconds`` times the pace (1.0 for figures)."""
    await asyncio.sleep(seconds * PACE[0])
