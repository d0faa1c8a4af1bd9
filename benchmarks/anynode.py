"""Where pods that fit on one NUMA node land, and how often the kubelet refuses them: a
simulated cluster under a trace of pod arrivals and departures (``make bench-any``).

The scheduler is modelled as its filter on node totals (``cpu``) plus the extended
resources' fit (allocatable as the kubelet last reported it, minus what bound pods ask),
choosing the node with the most free CPUs; the kubelet as the Topology Manager's
``single-numa-node`` merge of the CPU manager's and the device manager's hints (a NUMA
node with enough free CPUs and, for a device resource, enough Healthy free devices; the
lowest such id, as the kubelet takes), refusing the pod (TopologyAffinityError) when no
node has both. A refused pod is made again by its controller one second later.

Ways compared, each on the same trace:

- ``cpu``: plain ``cpu`` requests (what a Deployment asks without this plugin);
- ``numa-N``: each pod asks ``numa-align/numa-<i mod K>`` (round-robin over the nodes);
- ``any``: ``numa-align/any`` under the exposure rule
  (:mod:`numa_device_plugin.plugin.counts.exposure`), the rule's own code choosing the
  exposed node;
- ``any+hold``: the same, a departed pod's devices on a node that is not exposed still
  offered for ``--lag`` seconds (the lag handling weighed in docs/performance.md);
- ``nrt``: the peer's way, NodeResourceTopology with a second scheduler's single-NUMA
  filter, its per-NUMA view refreshed at NFD topology-updater's default 60 s interval.

``--lag`` models the kubelet's ``nodeStatusUpdateFrequency``: a node's allocatable
reaches the scheduler at its next status update (each node at its own phase); 0 means at
once. Figures per 1,000 pods of the trace: TopologyAffinityErrors (every refusal) and pods
refused at least once; pods that waited Pending, and the share of CPUs in use when the
first pod had to wait.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from numa_device_plugin.plugin.counts.exposure import Room, choose

SIZES = (1, 2, 2, 4, 4, 8)  # CPUs a pod asks, drawn uniformly: mixed sizes
RETRY = 1.0  # seconds before a controller makes a refused pod again
NRT_INTERVAL = 60.0  # NFD topology-updater's default sleep interval
WAYS = ("cpu", "numa-N", "any", "any+hold", "nrt")
ANY_WAYS = ("any", "any+hold")
# Refusals of one pod the model counts; then it is bound only where the kubelet admits it
# (the real controller goes on making it again: the figures are a floor).
MAX_REFUSALS = 10


@dataclass
class Node:
    """One worker: ``free[k]`` CPUs of NUMA node k no pod has, what the scheduler has
    bound here (``asked``: CPUs, ``asked_res``: per extended resource), the allocatable
    it last saw (``seen``) and, for ``any``, the exposed node."""

    numa: int
    cpus: int
    free: list[int] = field(default_factory=list)
    asked: int = 0
    asked_res: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    snapshot: list[int] = field(default_factory=list)  # nrt: per-NUMA free, as published
    exposed: int | None = None
    held_any: int = 0
    held_over: list[int] = field(default_factory=list)  # any+hold: departed, still offered

    def __post_init__(self) -> None:
        self.free = [self.cpus] * self.numa
        self.snapshot = list(self.free)
        self.held_over = [0] * self.numa

    def offered(self, k: int) -> int:
        """numa-align/any's Healthy free devices on NUMA node k: all its free ones when
        exposed, else those a departed pod left there, still offered (any+hold)."""
        return self.free[k] if k == self.exposed else min(self.free[k], self.held_over[k])

    def any_allocatable(self) -> int:
        """numa-align/any's allocatable: held + the free devices offered."""
        return self.held_any + sum(self.offered(k) for k in range(self.numa))

    def expose(self) -> None:
        rooms = [Room(k, self.free[k]) for k in range(self.numa)]
        self.exposed = choose("any", rooms, self.exposed).node_id

    def allocatable(self, way: str) -> dict[str, int]:
        if way in ANY_WAYS:
            return {"any": self.any_allocatable()}
        if way == "numa-N":
            return {f"numa-{k}": self.cpus for k in range(self.numa)}  # held + free
        return {}


@dataclass
class Result:
    way: str
    numa: int
    lag: float
    pods: int = 0
    errors: int = 0
    refused: int = 0
    waited: int = 0
    first_wait_use: float | None = None

    def row(self) -> dict[str, object]:
        return {
            "way": self.way, "numa_nodes": self.numa, "lag_s": self.lag, "pods": self.pods,
            "topology_affinity_errors_per_1000": round(1000 * self.errors / max(1, self.pods), 2),
            "pods_refused_per_1000": round(1000 * self.refused / max(1, self.pods), 2),
            "waited": self.waited,
            "use_at_first_wait": None if self.first_wait_use is None
            else round(self.first_wait_use, 3),
        }  # fmt: skip


def trace(pods: int, seed: int, rate: float, life: float) -> list[tuple[float, int, float]]:
    """``pods`` arrivals: (time, CPUs, lifetime seconds), Poisson at ``rate`` per second."""
    rng = random.Random(seed)
    now, found = 0.0, []
    for _ in range(pods):
        now += rng.expovariate(rate)
        found.append((now, rng.choice(SIZES), rng.expovariate(1 / life)))
    return found


def simulate(way: str, numa: int, lag: float, arrivals: Sequence[tuple[float, int, float]],
             workers: int, cpus: int, seed: int) -> Result:  # fmt: skip
    """Run the trace; see the module's docstring."""
    rng = random.Random(seed + 1)
    nodes = [Node(numa, cpus) for _ in range(workers)]
    for node in nodes:
        if way in ANY_WAYS:
            node.expose()
        node.seen = node.allocatable(way)
    result = Result(way, numa, lag, pods=len(arrivals))
    events: list[tuple[float, int, str, tuple[int, ...]]] = []
    order = 0

    work = 0  # arrive and leave events queued: the periodic ones stop when none is left

    def push(at: float, kind: str, *data: int) -> None:
        nonlocal order, work
        order += 1
        work += kind in ("arrive", "leave")
        heapq.heappush(events, (at, order, kind, data))

    sizes: dict[int, int] = {}
    lives: dict[int, float] = {}
    for index, (at, size, life) in enumerate(arrivals):
        sizes[index], lives[index] = size, life
        push(at, "arrive", index)
    period = lag if lag > 0 else None
    for number in range(workers):
        if period is not None:
            push(rng.uniform(0, period), "status", number)
        if way == "nrt":
            push(rng.uniform(0, NRT_INTERVAL), "nrt", number)
    pending: list[int] = []  # pods the scheduler could not place, oldest first
    refused: dict[int, int] = {}
    placed: dict[int, tuple[int, int]] = {}  # pod -> (worker, NUMA node)
    total = workers * numa * cpus

    def asks(pod: int) -> str | None:
        if way in ANY_WAYS:
            return "any"
        if way == "numa-N":
            return f"numa-{pod % numa}"
        return None

    def fits(node: Node, pod: int) -> bool:
        size = sizes[pod]
        if node.numa * node.cpus - node.asked < size:
            return False
        name = asks(pod)
        if name is not None and node.seen.get(name, 0) - node.asked_res.get(name, 0) < size:
            return False
        if way == "nrt":
            return max(node.snapshot) >= size
        return True

    def publish(node: Node) -> None:
        if period is None:
            node.seen = node.allocatable(way)

    def kubelet(node: Node, pod: int) -> list[int]:
        """The NUMA nodes where the kubelet can admit ``pod`` on ``node``: enough free CPUs
        and, for a device resource, enough Healthy free devices (lowest id first)."""
        size = sizes[pod]
        if way == "numa-N":
            return [pod % numa] if node.free[pod % numa] >= size else []
        if way in ANY_WAYS:
            return [k for k in range(numa) if node.offered(k) >= size]
        return [k for k in range(numa) if node.free[k] >= size]

    def schedule(pod: int, now: float) -> bool:
        capped = refused.get(pod, 0) >= MAX_REFUSALS
        feasible = [n for n in range(workers) if fits(nodes[n], pod)
                    and (not capped or kubelet(nodes[n], pod))]  # fmt: skip
        if not feasible:
            return False
        number = max(feasible, key=lambda n: (nodes[n].numa * cpus - nodes[n].asked, -n))
        node, size, name = nodes[number], sizes[pod], asks(pod)
        choices = kubelet(node, pod)
        if not choices:
            result.errors += 1
            result.refused += pod not in refused
            refused[pod] = refused.get(pod, 0) + 1
            push(now + RETRY, "arrive", pod)
            return True  # bound, then refused: made again by its controller
        numa_node = choices[0]
        node.free[numa_node] -= size
        node.asked += size
        if name is not None:
            node.asked_res[name] = node.asked_res.get(name, 0) + size
        if way in ANY_WAYS:
            if numa_node != node.exposed:
                node.held_over[numa_node] -= size
            node.held_any += size
            node.expose()  # at once, from Allocate
        publish(node)
        placed[pod] = (number, numa_node)
        push(now + lives[pod], "leave", pod)
        return True

    def retry_pending(now: float) -> None:
        # The scheduler tries every pending pod; one that cannot fit means every larger
        # one asking the same resource cannot either (nothing frees in between).
        still: list[int] = []
        smallest_refused: dict[tuple[str | None, bool], int] = {}
        for pod in pending:
            key = (asks(pod), refused.get(pod, 0) >= MAX_REFUSALS)
            if sizes[pod] >= smallest_refused.get(key, sizes[pod] + 1) or not schedule(pod, now):
                smallest_refused[key] = min(smallest_refused.get(key, sizes[pod]), sizes[pod])
                still.append(pod)
        pending[:] = still

    while events and work:
        now, _, kind, data = heapq.heappop(events)
        work -= kind in ("arrive", "leave")
        if kind == "arrive":
            (pod,) = data
            if not schedule(pod, now):
                if result.first_wait_use is None:
                    used = sum(n.numa * cpus - sum(n.free) for n in nodes)
                    result.first_wait_use = used / total
                result.waited += 1
                pending.append(pod)
        elif kind == "leave":
            (pod,) = data
            number, numa_node = placed.pop(pod)
            node, size, name = nodes[number], sizes[pod], asks(pod)
            node.free[numa_node] += size
            node.asked -= size
            if name is not None:
                node.asked_res[name] -= size
            if way in ANY_WAYS:
                node.held_any -= size
                if way == "any+hold" and numa_node != node.exposed and lag > 0:
                    node.held_over[numa_node] += size
                    push(now + lag, "expire", number, numa_node, size)
                node.expose()
            publish(node)
            retry_pending(now)
        elif kind == "expire":
            number, numa_node, size = data
            node = nodes[number]
            node.held_over[numa_node] = max(0, node.held_over[numa_node] - size)
            publish(node)
        elif kind == "status":
            (number,) = data
            nodes[number].seen = nodes[number].allocatable(way)
            assert period is not None
            push(now + period, "status", number)
            retry_pending(now)
        elif kind == "nrt":
            (number,) = data
            nodes[number].snapshot = list(nodes[number].free)
            push(now + NRT_INTERVAL, "nrt", number)
            retry_pending(now)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=8, help="CPUs per NUMA node")
    parser.add_argument("--load", type=float, default=0.8, help="offered load, of all CPUs")
    parser.add_argument("--lags", type=float, nargs="+", default=[0.0, 2.0, 10.0],
                        help="node status lags to run, seconds")  # fmt: skip
    parser.add_argument("--life", type=float, default=300.0, help="mean pod lifetime, s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    mean = sum(SIZES) / len(SIZES)
    for numa in (2, 4, 8):
        capacity = args.workers * numa * args.cpus
        rate = args.load * capacity / (mean * args.life)
        arrivals = trace(args.pods, args.seed, rate, args.life)
        for lag in args.lags:
            for way in WAYS:
                found = simulate(way, numa, lag, arrivals, args.workers, args.cpus, args.seed)
                rows.append(found.row())
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    header = ("numa", "lag_s", "way", "TAE/1000", "refused/1000", "waited", "use@first wait")
    print("  ".join(f"{h:>14}" for h in header))
    for row in rows:
        cells = (row["numa_nodes"], row["lag_s"], row["way"],
                 row["topology_affinity_errors_per_1000"], row["pods_refused_per_1000"],
                 row["waited"],
                 row["use_at_first_wait"])  # fmt: skip
        print("  ".join(f"{c!s:>14}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
