"""Benchmarks of a real ``numa-device-plugin serve`` process against the kubelet stand-in.

Usage: python -m benchmarks.bench
{all,reregistration,allocate,startup,footprint,polling,scale,page,locality,switch,
manynodes} [--json]

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
import sys
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any

from benchmarks.allocation import allocate
from benchmarks.figures import Figure
from benchmarks.footprint import MEMORY_NODES, SCALE_NODES, footprint, scale
from benchmarks.harness import (
    machine_info,
    pace_flag,
    paced,
)
from benchmarks.locality import locality
from benchmarks.manynodes import SIZES, many_nodes
from benchmarks.page import page
from benchmarks.polling import polling
from benchmarks.registration import reregistration, startup
from benchmarks.switch import switch


def node_counts(text: str) -> tuple[int, ...]:
    """``8,64`` -> (8, 64); empty: none."""
    return tuple(int(part) for part in text.split(",") if part.strip())


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
            "switch",
            "manynodes",
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
    parser.add_argument(
        "--switches", type=int, default=100,
        help="switch: single Allocates per size (a tenth as many bursts)",
    )  # fmt: skip
    parser.add_argument(
        "--many-nodes", type=node_counts, default=SIZES,
        help="manynodes: NUMA node counts (16,32,64); re-registrations: a tenth of --restarts",
    )  # fmt: skip
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

    async def run_switch() -> list[Figure]:
        return [f for nodes in (2, 8) for f in await switch(nodes, args.switches, burst=8)]

    jobs: dict[str, Callable[[], Coroutine[Any, Any, list[Figure]]]] = {
        "reregistration": run_reregistration,
        "allocate": lambda: allocate(args.calls, args.concurrency),
        "startup": lambda: startup(args.runs),
        "footprint": lambda: footprint(args.idle_seconds, args.calls),
        "polling": lambda: polling(args.idle_seconds, args.window),
        "scale": lambda: scale(args.nodes, args.memory_nodes),
        "page": lambda: page(args.nodes, args.runs * 7),
        "locality": lambda: locality(args.pci, args.block, args.runs * 7, args.mounts),
        "switch": lambda: run_switch(),
        "manynodes": lambda: many_nodes(args.many_nodes, args.runs, max(1, args.restarts // 10)),
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
