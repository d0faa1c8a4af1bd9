"""Figures of a real ``serve`` under hostile input: a ``/metrics`` flood, readers that
never read, a YAML alias bomb as the per-node configuration file, a silent API
server, a pod resources API listing 69,000 containers, ``top`` against endless
pages, and sysfs roots no kernel can have. Prints probe latencies, RSS, times and
the time a SIGTERM takes; asserts nothing
(the tests assert behaviour: tests/ops/test_scrape_flood.py,
tests/nodeconfig/test_nodeconfig_hostile.py).

Usage: python -m benchmarks.hostile [--scrapers 32] [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import held_port, machine_info, percentile
from benchmarks.harness import http_get as get
from benchmarks.peak import peak_mb, wrapped
from numa_device_plugin.topology.fake import build_machine
from tests.apiserver_stub import Raw, node_api
from tests.nodeconfig.test_nodeconfig_hostile import BOMB
from tests.standin_helpers import ServeProcess, serve_process

MB = 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(0.2)


async def sigterm_seconds(plugin: ServeProcess) -> float:
    started = time.monotonic()
    plugin.process.send_signal(signal.SIGTERM)
    await plugin.wait_exit(120)
    return time.monotonic() - started


def latencies(ports: tuple[int, ...], seconds: float) -> list[float]:
    seen: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for port in ports:
            for path in ("/healthz", "/readyz"):
                seen.append(get(port, path)[1])
        time.sleep(0.05)
    return seen


def summary(seen: list[float]) -> dict[str, float]:
    return {
        "probes": len(seen),
        "p50_ms": percentile(seen, 0.5) * 1000,
        "p99_ms": percentile(seen, 0.99) * 1000,
        "max_ms": max(seen) * 1000,
        "over_1s": sum(1 for s in seen if s >= 1.0),
    }


async def flood(folder: Path, scrapers: int, seconds: float) -> dict[str, Any]:
    tree = build_machine(folder / "sys", nodes=64, cpus_per_node=2)
    metrics, health = held_port(), held_port()
    flags = ("--metrics-address", f"127.0.0.1:{metrics}", "--health-address",
             f"127.0.0.1:{health}", "--memory-unit", "16Mi")  # fmt: skip
    figures: dict[str, Any] = {}
    async with serve_process(tree, folder / "dp", *flags) as plugin:
        await until(lambda: get(metrics, "/metrics")[0] == 200, 120)
        figures["rss_before_mb"] = rss_mb(plugin.pid)
        stop = time.monotonic() + seconds
        answers: list[int] = []

        def scrape() -> None:
            while time.monotonic() < stop:
                answers.append(get(metrics, "/metrics")[0])

        threads = [threading.Thread(target=scrape) for _ in range(scrapers)]
        for thread in threads:
            thread.start()
        seen = await asyncio.to_thread(latencies, (metrics, health), seconds - 1)
        figures["rss_during_mb"] = rss_mb(plugin.pid)
        for thread in threads:
            thread.join()
        figures["scrapers"] = scrapers
        figures["scrapes"] = {str(code): answers.count(code) for code in sorted(set(answers))}
        figures["probes_during_flood"] = summary(seen)

        # Readers that never read: 50 new /metrics connections a second.
        idle: list[socket.socket] = []
        stop = time.monotonic() + seconds

        def open_idle() -> None:
            while time.monotonic() < stop:
                for _ in range(50):
                    client = socket.create_connection(("127.0.0.1", metrics))
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    idle.append(client)
                time.sleep(1.0)

        opener = threading.Thread(target=open_idle)
        opener.start()
        seen = await asyncio.to_thread(latencies, (metrics, health), seconds - 1)
        figures["rss_during_idle_readers_mb"] = rss_mb(plugin.pid)
        opener.join()
        for client in idle:
            client.close()
        await asyncio.sleep(8)  # past the write timeout
        figures["idle_readers"] = len(idle)
        figures["probes_during_idle_readers"] = summary(seen)
        figures["rss_after_mb"] = rss_mb(plugin.pid)
        figures["sigterm_s"] = await sigterm_seconds(plugin)
    return figures


async def bomb(folder: Path) -> dict[str, Any]:
    tree = build_machine(folder / "sys", nodes=2, cpus_per_node=2)
    health = held_port()
    path = folder / "configs.yaml"
    path.write_text(BOMB)
    figures: dict[str, Any] = {"file_bytes": len(BOMB)}
    with node_api("n1", folder, {}) as (api, kubeconfig):
        flags = ("--config-file", str(path), "--node-name", "n1", "--kubeconfig",
                 str(kubeconfig), "--health-address", f"127.0.0.1:{health}",
                 "--node-config-interval", "0.2")  # fmt: skip
        async with serve_process(tree, folder / "dp", *flags) as plugin:
            await until(lambda: get(health, "/readyz")[0] == 503, 60)
            await asyncio.sleep(2)  # ten looks at the bomb
            figures["rss_with_bomb_mb"] = rss_mb(plugin.pid)
            figures["sigterm_with_bomb_s"] = await sigterm_seconds(plugin)
            figures["log_bytes"] = len(plugin.log())
        path.write_text("configs: {a: {}}\ndefault: a\n")
        api.raw = Raw(silent=True)
        async with serve_process(tree, folder / "dp2", *flags) as plugin:
            await until(lambda: api.reads > 0, 60)
            await asyncio.sleep(1)
            figures["sigterm_while_api_silent_s"] = await sigterm_seconds(plugin)
    return figures


async def big_pod_resources(folder: Path, containers: int, seconds: float) -> dict[str, Any]:
    """``serve --capacity cpus`` polling a pod resources API that lists ``containers``
    containers (each holding one device) every 2 s: the probes' latencies."""
    from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
    from numa_device_plugin.kubelet_standin import KubeletStandIn

    tree = build_machine(folder / "sys", nodes=2, cpus_per_node=4)
    health = held_port()
    standin = KubeletStandIn(folder / "dp", pod_resources_dir=folder / "pr",
                             allocatable_cpus=range(1, 8))  # fmt: skip
    per_pod = 100
    for index in range(containers // per_pod):
        pod = pr_pb2.PodResources(name=f"pod-{index:05d}", namespace="bench")
        for number in range(per_pod):
            container = pod.containers.add(name=f"c{number:03d}")
            container.devices.add(resource_name="numa-align/numa-0",
                                  device_ids=[f"numa0-cpu{number % 4:04d}"])  # fmt: skip
        standin.model.pods.append(pod)
    size = pr_pb2.ListPodResourcesResponse(pod_resources=standin.model.pods).ByteSize()
    socket_path = str(folder / "pr" / "kubelet.sock")
    flags = ("--capacity", "cpus", "--pod-resources-socket", socket_path,
             "--pod-resources-interval", "2",
             "--health-address", f"127.0.0.1:{health}")  # fmt: skip
    figures: dict[str, Any] = {"containers": containers, "answer_bytes": size}
    async with standin as kubelet, serve_process(tree, folder / "dp", *flags) as plugin:
        await until(lambda: get(health, "/healthz")[0] == 200, 60)
        await until(lambda: kubelet.pod_resources_calls >= 2, 60)
        seen = await asyncio.to_thread(latencies, (health,), seconds)
        figures["pod_resources_calls"] = kubelet.pod_resources_calls
        figures["probes"] = summary(seen)
        figures["rss_mb"] = rss_mb(plugin.pid)
        figures["sigterm_s"] = await sigterm_seconds(plugin)
    return figures


def top_against_endless_pages(folder: Path) -> dict[str, Any]:
    """``top`` (a subprocess) against an API server answering every list request with
    another page (``continue`` set): empty pages, then 4 MiB pages. Time, exit status,
    requests served and the child's peak RSS."""
    import json as json_module
    import subprocess

    from tests.apiserver_stub import kubeconfig_text
    from tests.ops.test_bounded import raw_server

    def page(pad: int) -> bytes:
        body = json_module.dumps(
            {"kind": "NodeList", "items": [], "metadata": {"continue": "x", "pad": "p" * pad}}
        ).encode()
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body  # fmt: skip

    figures: dict[str, Any] = {}
    for name, pad, timeout in (("empty_pages", 0, "3"), ("4mib_pages", (4 << 20) - 200, "60")):
        answer = page(pad)
        served: list[int] = []

        def serve_page(
            conn: socket.socket, answer: bytes = answer, served: list[int] = served
        ) -> None:
            served.append(1)
            conn.sendall(answer)

        with raw_server(serve_page) as port:
            kubeconfig = folder / f"kubeconfig-{name}"
            kubeconfig.write_text(kubeconfig_text(f"http://127.0.0.1:{port}"))
            peak_file = folder / f"peak-{name}"
            started = time.monotonic()
            done = subprocess.run(
                wrapped([sys.executable], peak_file, "numa_device_plugin", "top",
                        "--kubeconfig", str(kubeconfig), "--timeout", timeout),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            took = time.monotonic() - started
        figures[name] = {
            "timeout_s": float(timeout),
            "seconds": took,
            "exit": done.returncode,
            "requests": len(served),
            "peak_rss_mb": peak_mb(peak_file),  # its own (benchmarks.peak)
            "stderr": done.stderr.strip()[-160:],
        }
    return figures


def discovery_of_absurd_sysfs(folder: Path) -> dict[str, Any]:
    """``discover`` on sysfs roots no kernel can have: ``node/online`` 0-65535, and
    1,024 NUMA nodes each listing CPUs 0-65535. Time and the first line of stderr."""
    import subprocess

    from numa_device_plugin.topology.fake import SysfsTree

    online = SysfsTree(folder / "online")
    online.cpus(2, online="0-1")
    online.write("node/online", "0-65535\n")
    dense = SysfsTree(folder / "dense")
    dense.cpus(4, online="0-3")
    dense.write("node/online", "0-1023\n")
    for node in range(1024):
        dense.node(node, "0-65535", mem_kb=None)
    figures: dict[str, Any] = {}
    for name, tree in (("node_online_0_65535", online), ("dense_1024_x_0_65535", dense)):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "numa_device_plugin", "discover", "--sysfs-root",
             str(tree.root)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        figures[name] = {
            "seconds": time.monotonic() - started,
            "exit": done.returncode,
            "stderr": done.stderr.strip().splitlines()[0][:200] if done.stderr.strip() else "",
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__)
    parser.add_argument("--scrapers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--containers", type=int, default=69_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ndph-", dir="/tmp") as folder:
        root = Path(folder)
        (root / "a").mkdir()
        (root / "b").mkdir()
        (root / "c").mkdir()
        (root / "d").mkdir()
        (root / "e").mkdir()
        document = {
            "machine": machine_info(),
            "load": os.getloadavg()[0],
            "metrics_flood": asyncio.run(flood(root / "a", args.scrapers, args.seconds)),
            "yaml_bomb_and_silent_api": asyncio.run(bomb(root / "b")),
            "big_pod_resources": asyncio.run(
                big_pod_resources(root / "c", args.containers, args.seconds)
            ),
            "top_against_endless_pages": top_against_endless_pages(root / "d"),
            "discovery_of_absurd_sysfs": discovery_of_absurd_sysfs(root / "e"),
        }
    print(json.dumps(document, indent=2) if args.json else json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
