"""The model of :mod:`benchmarks.anynode` on a given trace, to check it against the real
kubelet: the cluster test (``tests/e2e/test_any.py``) records what it did (pods that
arrive, pinned to a worker or left to the scheduler, asking plain ``cpu``, a
``numa-align/numa-<k>`` or ``numa-align/any``; pods that leave) and what the cluster did
with each pod; :func:`replay` gives what the model does with the same trace, and the test
asserts the two agree at each of its checkpoints.

The same rules as the simulation, with the node status lag 0: the scheduler filters on
node totals (the exclusive CPUs the bound pods have not asked) and on each extended
resource's allocatable minus what bound pods asked, and picks the worker with the most
free CPUs (the lower name on a tie); the kubelet admits on the lowest NUMA node with
enough free CPUs and, for a device resource, enough Healthy free devices, else refuses
(TopologyAffinityError). ``numa-align/any`` offers the free devices of the node the
exposure rule chooses (:func:`numa_device_plugin.plugin.counts.exposure.choose`, the
plugin's own code). Pods the scheduler cannot place wait, and are tried again, oldest
first, after each departure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.anynode import Node

ANY = "any"


@dataclass(frozen=True)
class Arrive:
    """A pod: ``cpus`` exclusive CPUs, ``asks`` ``numa-<k>``, ``any`` or None (plain
    ``cpu``), as many devices as CPUs; ``worker`` its nodeSelector (None: any worker)."""

    pod: str
    cpus: int
    asks: str | None = None
    worker: str | None = None


@dataclass(frozen=True)
class Leave:
    """A pod deleted (bound, refused or still waiting)."""

    pod: str


Event = Arrive | Leave


def replay(workers: Mapping[str, Sequence[int]], events: Sequence[Event]) -> dict[str, str]:
    """Each pod of ``events`` (those that have not left) -> what became of it:
    ``admitted <worker>/<NUMA node>``, ``refused`` (bound by the scheduler, refused by
    the kubelet; its controller would make it again, to the same end while nothing
    changes) or ``pending``. ``workers``: name -> each NUMA node's exclusive CPUs."""
    nodes: dict[str, Node] = {}
    totals: dict[str, list[int]] = {}
    for name, cpus in workers.items():
        node = Node(len(cpus), max(cpus))
        node.free = list(cpus)
        node.held_over = [0] * len(cpus)
        node.expose()
        nodes[name], totals[name] = node, list(cpus)
    outcome: dict[str, str] = {}
    placed: dict[str, tuple[str, int, Arrive]] = {}
    waiting: list[Arrive] = []

    def allocatable(name: str, resource: str) -> int:
        node = nodes[name]
        if resource == ANY:
            return node.any_allocatable()
        return totals[name][int(resource.removeprefix("numa-"))]  # held + free

    def fits(name: str, pod: Arrive) -> bool:
        node = nodes[name]
        if sum(totals[name]) - node.asked < pod.cpus:
            return False
        if pod.asks is None:
            return True
        return allocatable(name, pod.asks) - node.asked_res.get(pod.asks, 0) >= pod.cpus

    def admits(name: str, pod: Arrive) -> list[int]:
        node = nodes[name]
        if pod.asks is None:
            return [k for k in range(node.numa) if node.free[k] >= pod.cpus]
        if pod.asks == ANY:
            return [k for k in range(node.numa) if node.offered(k) >= pod.cpus]
        k = int(pod.asks.removeprefix("numa-"))
        return [k] if node.free[k] >= pod.cpus else []

    def schedule(pod: Arrive) -> bool:
        feasible = [n for n in sorted(nodes) if (pod.worker in (None, n)) and fits(n, pod)]
        if not feasible:
            outcome[pod.pod] = "pending"
            return False
        name = max(feasible, key=lambda n: sum(totals[n]) - nodes[n].asked)  # first: lower
        choices = admits(name, pod)
        if not choices:
            outcome[pod.pod] = "refused"
            return True
        node, k = nodes[name], choices[0]
        node.free[k] -= pod.cpus
        node.asked += pod.cpus
        if pod.asks is not None:
            node.asked_res[pod.asks] = node.asked_res.get(pod.asks, 0) + pod.cpus
        if pod.asks == ANY:
            node.held_any += pod.cpus
        node.expose()  # at once, from Allocate
        placed[pod.pod] = (name, k, pod)
        outcome[pod.pod] = f"admitted {name}/{k}"
        return True

    for event in events:
        if isinstance(event, Arrive):
            if not schedule(event):
                waiting.append(event)
            continue
        outcome.pop(event.pod, None)
        waiting[:] = [pod for pod in waiting if pod.pod != event.pod]
        if event.pod not in placed:
            continue
        name, k, pod = placed.pop(event.pod)
        node = nodes[name]
        node.free[k] += pod.cpus
        node.asked -= pod.cpus
        if pod.asks is not None:
            node.asked_res[pod.asks] -= pod.cpus
        if pod.asks == ANY:
            node.held_any -= pod.cpus
        node.expose()
        waiting[:] = [pod for pod in waiting if not schedule(pod)]
    return outcome
