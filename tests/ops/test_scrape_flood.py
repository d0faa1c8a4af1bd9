"""Probes first: however many ``/metrics`` scrapes run, and however slowly their
clients read, ``/healthz`` and ``/readyz`` on either listener answer within a second
and the memory held stays bounded. A real ``serve`` at 64 NUMA nodes with memory
resources on (a scrape of several hundred kilobytes)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from pathlib import Path

from numa_device_plugin.ops.probes import MAX_SCRAPES, MetricsCache
from numa_device_plugin.topology.fake import SysfsTree, build_machine
from tests.plugin.test_observability import _rss
from tests.standin_helpers import ServeProcess, bound_port, eventually, serve_process

SCRAPERS = 16
# The DaemonSet's probes' timeoutSeconds (deployments/base/daemonset.yaml).
PROBE_TIMEOUT = 3.0
FLOOD_SECONDS = 3.0


def fetch(port: int, path: str) -> tuple[int, int, float]:
    """``(status, bytes, seconds)`` of one GET."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            size = len(answer.read())
            return answer.status, size, time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, 0, time.monotonic() - started


def big_machine(root: Path) -> SysfsTree:
    return build_machine(root, nodes=64, cpus_per_node=2)


async def wait_listening(plugin: ServeProcess, metrics: int, *ports: int) -> None:
    """Until every listener answers and the metrics carry the 64 NUMA nodes' topology
    (a scrape of over 200 KB: the distance matrix alone is 4,096 series)."""

    def up() -> bool:
        try:
            return all(fetch(port, "/healthz")[0] == 200 for port in ports) and (
                fetch(metrics, "/metrics")[1] > 200_000
            )
        except OSError:
            return False

    await eventually(up, timeout=60)
    assert plugin.process.poll() is None


def probe_latencies(ports: tuple[int, ...], until: float) -> list[float]:
    """Every 50 ms, /healthz and /readyz on each port: their latencies in seconds."""
    seen: list[float] = []
    while time.monotonic() < until:
        for port in ports:
            for path in ("/healthz", "/readyz"):
                status, _, took = fetch(port, path)
                assert status in (200, 503)
                seen.append(took)
        time.sleep(0.05)
    return seen


async def test_sixteen_scrapers_at_64_numa_nodes_leave_the_probes_answered(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = big_machine(tmp_path / "sys")
    flags = (
        *("--metrics-address", "127.0.0.1:0"),
        *("--health-address", "127.0.0.1:0"),
        *("--memory-unit", "16Mi"),
    )
    async with serve_process(tree, sock_dir, *flags) as plugin:
        metrics, health = await bound_port(plugin, "metrics"), await bound_port(plugin, "health")
        await wait_listening(plugin, metrics, health)
        until = time.monotonic() + FLOOD_SECONDS
        answers: list[int] = []

        def scrape() -> None:
            while time.monotonic() < until:
                answers.append(fetch(metrics, "/metrics")[0])

        scrapers = [threading.Thread(target=scrape) for _ in range(SCRAPERS)]
        for thread in scrapers:
            thread.start()
        try:
            latencies = await asyncio.to_thread(probe_latencies, (metrics, health), until)
        finally:
            for thread in scrapers:
                thread.join(15)
        assert latencies
        # What matters: the kubelet's probes (timeoutSeconds 3 in the DaemonSet) never
        # time out during the flood. The figures themselves are benchmarks.hostile's.
        assert max(latencies) < PROBE_TIMEOUT, sorted(latencies)[-5:]
        assert answers.count(200) >= SCRAPERS, "the scrapes were answered too"
        assert set(answers) <= {200, 503}
        assert await plugin.terminate() == 0


async def test_scrapers_that_read_nothing_hold_a_bounded_amount(
    tmp_path: Path, sock_dir: Path
) -> None:
    tree = big_machine(tmp_path / "sys")
    flags = ("--metrics-address", "127.0.0.1:0", "--memory-unit", "16Mi")
    async with serve_process(tree, sock_dir, *flags) as plugin:
        metrics = await bound_port(plugin, "metrics")
        await wait_listening(plugin, metrics)
        await asyncio.to_thread(fetch, metrics, "/metrics")
        before = _rss(plugin.pid)
        idle: list[socket.socket] = []
        try:
            for _ in range(3):  # 3 waves of 50 connections that never read
                for _ in range(50):
                    client = socket.create_connection(("127.0.0.1", metrics))
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    idle.append(client)
                status, _, took = await asyncio.to_thread(fetch, metrics, "/healthz")
                assert status == 200
                assert took < 1.0
                await asyncio.sleep(0.3)
            during = _rss(plugin.pid)
        finally:
            for client in idle:
                client.close()
        await asyncio.sleep(1)
        after = _rss(plugin.pid)
        assert await plugin.terminate() == 0
    limit = before + (MAX_SCRAPES + 4) * 1_000_000 + 20_000_000
    assert during < limit, (before, during)
    assert after < limit, (before, after)


async def test_the_cache_renders_once_for_concurrent_scrapes_and_again_when_old() -> None:
    started = threading.Event()
    calls: list[float] = []

    def render() -> bytes:
        calls.append(time.monotonic())
        started.set()
        time.sleep(0.05)
        return f"x {len(calls)}\n".encode()

    cache = MetricsCache(render, max_age=0.2)
    bodies = await asyncio.gather(*(cache.get() for _ in range(10)))
    assert set(bodies) == {b"x 1\n"}
    assert len(calls) == 1
    assert await cache.get() == b"x 1\n", "fresh enough"
    await asyncio.sleep(0.25)
    assert await cache.get() == b"x 2\n"
    assert cache.renderings == 2
