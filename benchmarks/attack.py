"""The HTTP listeners under attack: a slowloris crowd, then a burst, against a real
``numa-device-plugin serve`` process, while a prober asks ``/readyz`` as the kubelet
would. Prints figures (threads, RSS, probe latency, what the burst got); asserts
nothing.

Usage: python -m benchmarks.attack [--slowloris 2000] [--burst 1000] [--json]

Slowloris: ``--slowloris`` connections each send an unfinished request head and
wait. Burst: ``--burst`` connections opened at once, each sending a whole
``GET /healthz``; each ends answered, refused (closed without an answer, at the
connection cap) or hung (no answer within ``--burst-timeout`` seconds). The
attacks go to the health listener; the prober asks it every 0.2 s with a 3 s
timeout (the DaemonSet's ``timeoutSeconds``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import (
    PluginProcess,
    fully_up,
    held_port,
    machine_info,
    pace_flag,
    paced,
    percentile,
    rig,
    settle,
)

MB = 1024 * 1024
PROBE_TIMEOUT = 3.0


@dataclass
class Prober:
    """Asks ``/readyz`` every 0.2 s until stopped; latencies in ms, failures counted."""

    port: int
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                async with asyncio.timeout(PROBE_TIMEOUT):
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                    writer.write(b"GET /readyz HTTP/1.1\r\nHost: probe\r\n\r\n")
                    answer = await reader.read()
                    writer.close()
                if answer.startswith(b"HTTP/1.1 200 "):
                    self.latencies.append((time.perf_counter() - began) * 1000)
                else:
                    self.failures.append(answer[:40].decode(errors="replace") or "closed")
            except (OSError, TimeoutError) as exc:
                self.failures.append(type(exc).__name__)
            await asyncio.sleep(0.2)

    def summary(self) -> dict[str, Any]:
        ok = self.latencies
        return {
            "probes": len(ok) + len(self.failures),
            "failed": len(self.failures),
            "failures": sorted(set(self.failures)),
            "p50_ms": round(statistics.median(ok), 2) if ok else None,
            "p99_ms": round(percentile(ok, 0.99), 2) if ok else None,
            "max_ms": round(max(ok), 2) if ok else None,
        }


def threads(plugin: PluginProcess) -> int:
    return plugin.threads()


async def slowloris(port: int, count: int) -> list[asyncio.StreamWriter]:
    crowd = []
    for _ in range(count):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: slow")
        crowd.append(writer)
    return crowd


async def one_request(port: int, timeout: float) -> str:
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            answer = await reader.read()
            writer.close()
    except TimeoutError:
        return "hung"
    except OSError:
        return "refused"
    return "answered" if answer.startswith(b"HTTP/1.1 200 ") else "refused"


async def attack(slow: int, burst: int, burst_timeout: float) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # our side needs the fds
    health, metrics = held_port(), held_port()
    extra = (
        *("--health-address", f"127.0.0.1:{health}"),
        *("--metrics-address", f"127.0.0.1:{metrics}"),
    )
    figures: dict[str, Any] = {}
    async with rig(8, extra=extra) as bench:
        plugin = bench.plugin
        await fully_up(metrics)  # ready (the probes expect 200), its threads all made
        await settle(1.0)
        figures["before"] = {"threads": threads(plugin), "rss_mb": plugin.rss_bytes() / MB}

        stop = asyncio.Event()
        prober = Prober(health)
        probing = asyncio.create_task(prober.run(stop))
        crowd = await slowloris(health, slow)
        await settle(2.0)
        figures["slowloris"] = {
            "connections_opened": len(crowd),
            "threads": threads(plugin),
            "rss_mb": plugin.rss_bytes() / MB,
        }
        await settle(3.0)
        stop.set()
        await probing
        figures["slowloris"]["probe"] = prober.summary()
        for writer in crowd:
            writer.close()
        await settle(6.0)  # at pace 1, past the read timeout: every slow connection is gone
        figures["after_slowloris"] = {
            "threads": threads(plugin),
            "rss_mb": plugin.rss_bytes() / MB,
        }

        stop = asyncio.Event()
        prober = Prober(health)
        probing = asyncio.create_task(prober.run(stop))
        outcomes = await asyncio.gather(*(one_request(health, burst_timeout) for _ in range(burst)))
        during = {"threads": threads(plugin), "rss_mb": plugin.rss_bytes() / MB}
        await settle(1.0)
        stop.set()
        await probing
        figures["burst"] = {
            "connections": burst,
            **{kind: outcomes.count(kind) for kind in ("answered", "refused", "hung")},
            **during,
            "probe": prober.summary(),
        }
        await settle(2.0)
        figures["after_burst"] = {"threads": threads(plugin), "rss_mb": plugin.rss_bytes() / MB}
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for value in figures.values():
        if "rss_mb" in value:
            value["rss_mb"] = round(value["rss_mb"], 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attack", description=__doc__)
    parser.add_argument("--slowloris", type=int, default=2000, help="half-open connections")
    parser.add_argument("--burst", type=int, default=1000, help="connections at once")
    parser.add_argument("--burst-timeout", type=float, default=30.0, help="seconds")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--pace", type=pace_flag, default=1.0, help="multiply every hold time (below 1: tests only)"
    )
    args = parser.parse_args(argv)
    with paced(args.pace):
        figures = asyncio.run(attack(args.slowloris, args.burst, args.burst_timeout))
    document = {"machine": machine_info(), **figures}
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        for key, value in document.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
