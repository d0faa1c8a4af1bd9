"""Soak: many kubelet restarts at random moments, with Allocate calls and deleted
plugin sockets in between, against a real ``numa-device-plugin serve`` process.

Usage: python -m benchmarks.soak [--restarts 1000] [--nodes 4] [--seed 1] [--json]

Bounded: it stops by itself after ``--restarts`` restarts. At the end it checks
that every resource has exactly one live registration, that every Allocate
was answered or refused with a gRPC status (none hung), and that the plugin's
open file descriptors and RSS are within 5% of their value after the first 50
restarts. Exit status 0 when all checks hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import grpc

from benchmarks.harness import Rig, machine_info, rig, settle

ALLOCATE_TIMEOUT = 2.0
# `make soak` bounds the settled fds and RSS to within 5% of their baseline.
GROWTH_BOUND = 0.05
# Under load grpc sometimes keeps a closed channel's connection open until the peer
# closes its end: a Register connection until that kubelet restarts, the kubelet's
# dial to a plugin socket until that server stops. At most one of each per resource
# at a time (they never pile up: fds after 1,000 restarts equal those after 50), so
# the invariant allows that many above the baseline.
LINGERING_PER_RESOURCE = 2


@dataclass
class SoakResult:
    """What a soak run saw; ``failures`` lists every check that did not hold."""

    restarts: int = 0
    sockets_deleted: int = 0
    allocate_ok: int = 0
    allocate_refused: dict[str, int] = field(default_factory=dict)
    allocate_no_plugin: int = 0
    allocate_interrupted: int = 0
    allocate_hung: int = 0
    registrations: int = 0
    baseline: dict[str, int] = field(default_factory=dict)
    final: dict[str, int] = field(default_factory=dict)
    rss_trace: list[int] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


async def _allocate_until(
    done: asyncio.Event, bench: Rig, rng: random.Random, result: SoakResult
) -> None:
    """Call Allocate as the kubelet would, on whichever resource is registered now,
    until ``done`` is set; a call in flight then still runs to its answer or deadline."""
    while not done.is_set():
        name = rng.choice(bench.names)
        client = bench.kubelet.clients.get(name)
        if client is None or client.disconnected or not client.devices:
            result.allocate_no_plugin += 1
            await asyncio.sleep(0.002)
            continue
        device = rng.choice(client.devices).ID
        try:
            await client.stub.Allocate(_request(device), timeout=ALLOCATE_TIMEOUT)
            result.allocate_ok += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                result.allocate_hung += 1
            else:
                refused = result.allocate_refused
                refused[exc.code().name] = refused.get(exc.code().name, 0) + 1
        except grpc.aio.UsageError:
            result.allocate_no_plugin += 1  # the kubelet closed that connection meanwhile
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the soak itself is cancelling us
            # grpc.aio cancels calls on a channel the (restarting) kubelet closes.
            result.allocate_interrupted += 1
        await asyncio.sleep(rng.uniform(0, 0.005))


def _request(device: str) -> object:
    from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2

    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device])]
    )


async def _settled_figures(bench: Rig, window: float = 1.0) -> dict[str, int]:
    """Open fds and RSS once every resource is live, over a ``window`` of seconds:
    the most common fd count (connections still coming and going are not leaks) and
    the lowest RSS (memory resident once the plugin has handed freed heap back)."""
    await bench.wait_live()
    await settle(0.5)
    fds: list[int] = []
    rss: list[int] = []
    for _ in range(max(1, int(window / 0.1))):
        fds.append(bench.plugin.open_fds())
        rss.append(bench.plugin.rss_bytes())
        await asyncio.sleep(0.1)
    return {"open_fds": Counter(fds).most_common(1)[0][0], "rss_bytes": min(rss)}


async def _fds_back_to(bench: Rig, limit: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for the plugin's open fds to drop to ``limit``
    (grpc closes connections a restarted peer left behind lazily); the last count."""
    deadline = time.monotonic() + timeout
    count = bench.plugin.open_fds()
    while count > limit and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        count = bench.plugin.open_fds()
    return count


async def soak(
    restarts: int = 1000,
    nodes: int = 4,
    seed: int = 1,
    baseline_after: int = 50,
    delete_probability: float = 0.1,
    growth_bound: float | None = GROWTH_BOUND,
    fd_settle_seconds: float = 30.0,
) -> SoakResult:
    """Run the soak; see the module docstring. Returns the result, never raises on a
    failed check (it is listed in ``failures``).

    Invariants always checked: one live registration per resource at the end, no
    hung Allocate, at least one answered, and the open fds back within
    ``LINGERING_PER_RESOURCE`` per resource of their baseline within
    ``fd_settle_seconds``. ``growth_bound`` (a fraction, 0.05 = 5%)
    also bounds the settled fd count and RSS against their baseline; None leaves
    growth thresholds out (the test suite: on a busy machine RSS figures are noise).
    """
    rng = random.Random(seed)
    result = SoakResult()
    started = time.perf_counter()
    async with rig(nodes) as bench:
        done = asyncio.Event()
        allocator = asyncio.create_task(
            _allocate_until(done, bench, random.Random(seed + 1), result)
        )
        try:
            for index in range(restarts):
                await asyncio.sleep(rng.uniform(0, 0.05))
                if rng.random() < delete_probability:
                    victim = bench.kubelet.directory / rng.choice(bench.names).replace("/", "_")
                    victim.with_suffix(".sock").unlink(missing_ok=True)
                    result.sockets_deleted += 1
                await bench.kubelet.restart()
                result.restarts += 1
                if index + 1 == baseline_after:
                    result.baseline = await _settled_figures(bench)
                if (index + 1) % 100 == 0:
                    result.rss_trace.append(bench.plugin.rss_bytes())
        finally:
            done.set()
            (outcome,) = await asyncio.gather(allocator, return_exceptions=True)
        if isinstance(outcome, BaseException):
            result.failures.append(f"the Allocate caller crashed: {outcome!r}")
        try:
            result.final = await _settled_figures(bench)
            baseline = result.baseline.get("open_fds")
            if baseline is not None:
                limit = baseline + LINGERING_PER_RESOURCE * nodes
                fds = await _fds_back_to(bench, limit, fd_settle_seconds)
                if fds > limit:
                    result.failures.append(
                        f"open fds still {fds} (baseline {baseline}, at most {limit} with "
                        f"lingering connections) after {fd_settle_seconds} s: "
                        + ", ".join(bench.plugin.fd_targets())
                    )
        except RuntimeError as exc:
            result.failures.append(str(exc))
        for name in bench.names:
            if not bench.kubelet.live(name):
                result.failures.append(f"{name}: no single live registration at the end")
        result.registrations = sum(1 for r in bench.kubelet.registrations if r.error is None)
    result.seconds = time.perf_counter() - started
    if result.allocate_hung:
        result.failures.append(f"{result.allocate_hung} Allocate calls hung (no gRPC answer)")
    if result.allocate_ok == 0:
        result.failures.append("no Allocate call was answered")
    if growth_bound is not None:
        for key in ("open_fds", "rss_bytes"):
            before, after = result.baseline.get(key), result.final.get(key)
            if before and after and abs(after - before) > growth_bound * before:
                result.failures.append(
                    f"{key} went from {before} to {after} (more than {growth_bound:.0%})"
                )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--restarts", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.restarts < 50:
        parser.error("--restarts must be at least 50 (the baseline is taken after 50)")
    result = asyncio.run(soak(args.restarts, args.nodes, args.seed))
    if args.json:
        print(json.dumps({"machine": machine_info(), **asdict(result), "ok": result.ok}, indent=2))
    else:
        print(f"machine: {machine_info()}")
        print(
            f"{result.restarts} kubelet restarts, {result.sockets_deleted} plugin sockets "
            f"deleted, {result.registrations} accepted registrations in {result.seconds:.1f} s"
        )
        print(
            f"Allocate: {result.allocate_ok} answered, refused {result.allocate_refused}, "
            f"{result.allocate_no_plugin} skipped (no plugin registered), "
            f"{result.allocate_interrupted} interrupted by a kubelet restart, "
            f"{result.allocate_hung} hung"
        )
        for key in ("open_fds", "rss_bytes"):
            before, after = result.baseline.get(key), result.final.get(key)
            print(f"{key}: {before} after 50 restarts, {after} at end")
        print("RSS every 100 restarts (MB):", [round(r / 2**20, 1) for r in result.rss_trace])
        print("OK" if result.ok else "FAILED:\n  " + "\n  ".join(result.failures))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
