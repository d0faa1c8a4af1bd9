"""The trace ``test_any``'s counterfactual performs, as the model of where pods land reads
it (:mod:`benchmarks.anyreplay`): both workers fragmented, a plain ``cpu`` pod, two
replicas asking ``numa-align/any``, worker A's node 1 freed. Shared by the cluster test,
which checks the model against what the real kubelet did at each checkpoint, and by the
offline test, which checks the model against what it did in the recorded runs."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.anyreplay import Arrive, Event, Leave

# Where the trace stops to compare: after the plain pod, after the two replicas asking
# any, after worker A's node 1 is freed; with the pods compared there.
CHECKPOINTS = (("plain",), ("aligned-0", "aligned-1"), ("aligned-0", "aligned-1"))


def fragmented(workers: Sequence[str], e0: int, e1: int) -> dict[str, Arrive]:
    """The pods holding all but 1 exclusive CPU of each NUMA node (``e0``, ``e1``: its
    exclusive CPUs), by name (``hold<k>-<worker's last letter>``, as the test names them)."""
    holds = {}
    for worker in workers:
        for numa, free in ((0, e0), (1, e1)):
            if free > 1:
                name = f"hold{numa}-{worker[-1]}"
                holds[name] = Arrive(name, free - 1, f"numa-{numa}", worker)
    return holds


def trace_checkpoints(
    workers: Sequence[str], e0: int, e1: int, size: int
) -> tuple[list[Event], list[tuple[int, dict[str, str]]]]:
    """The events, and per checkpoint how many of them had happened and the outcomes the
    cluster runs recorded there (v1.36.2, v1.28.7: docs/development.md), the worker's
    name as given. Raises ValueError for fewer than 2 workers."""
    if len(workers) < 2:
        raise ValueError("the counterfactual needs two workers")
    a = workers[0]
    events: list[Event] = list(fragmented(workers, e0, e1).values())
    events.append(Arrive("plain", size))
    first = len(events)
    events += [Leave("plain"), Arrive("aligned-0", size, "any"), Arrive("aligned-1", size, "any")]
    second = len(events)
    events.append(Leave(f"hold1-{a[-1]}"))
    recorded = [
        {"plain": "refused"},
        {"aligned-0": "pending", "aligned-1": "pending"},
        {"aligned-0": f"admitted {a}/1", "aligned-1": "pending"},
    ]
    return events, list(zip((first, second, len(events)), recorded, strict=True))
