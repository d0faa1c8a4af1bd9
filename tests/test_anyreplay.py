"""The model of where pods land (benchmarks/anyreplay.py), on the trace the cluster test
performs (tests/e2e/test_any.py): the outcomes the real kubelet gave there (v1.36.2 and
v1.28.7, docs/development.md), and the rules one by one."""

from __future__ import annotations

import pytest

from benchmarks.anyreplay import Arrive, Event, Leave, replay
from tests.e2e.any_trace import fragmented, trace_checkpoints

TWO = {"a": [2, 3], "b": [2, 3]}  # the workers' exclusive CPUs per NUMA node


def test_the_cluster_tests_trace_gives_what_the_real_kubelet_gave_at_each_checkpoint() -> None:
    """Each NUMA node fragmented to 1 free CPU: plain 2-CPU pods bound and refused;
    numa-align/any: 2 Pending on both workers; A's node 1 freed: one replica on A's
    node 1, the other still Pending (what the cluster test saw on both versions)."""
    events, checkpoints = trace_checkpoints(["a", "b"], e0=2, e1=3, size=2)
    for upto, recorded in checkpoints:
        found = replay(TWO, events[:upto])
        assert sorted(found[pod] for pod in recorded) == sorted(recorded.values()), upto
        for name, hold in fragmented(["a", "b"], 2, 3).items():
            if name in found:  # hold1-a leaves at the last checkpoint
                assert found[name] == f"admitted {hold.worker}/{hold.asks[-1]}"  # type: ignore[index]
    # Plain requests on that trace: refused, never Pending (the scheduler sees totals).
    assert replay(TWO, events[: checkpoints[0][0]])["plain"] == "refused"


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # A NUMA node with room: admitted on the lowest such node.
        ([Arrive("p", 2)], {"p": "admitted a/0"}),
        # The worker's total fits, no NUMA node does: bound, then refused.
        ([Arrive("h0", 1, "numa-0", "a"), Arrive("h1", 2, "numa-1", "a"),
          Arrive("p", 2, None, "a")], {"h0": "admitted a/0", "h1": "admitted a/1",
                                       "p": "refused"}),
        # any: the node with the most room is offered, so the scheduler waits.
        ([Arrive("h0", 1, "numa-0", "a"), Arrive("h1", 2, "numa-1", "a"),
          Arrive("p", 2, "any", "a")], {"h0": "admitted a/0", "h1": "admitted a/1",
                                        "p": "pending"}),
        # ...and places it once a departure makes room on one node.
        ([Arrive("h0", 1, "numa-0", "a"), Arrive("h1", 2, "numa-1", "a"),
          Arrive("p", 2, "any", "a"), Leave("h1")], {"h0": "admitted a/0",
                                                     "p": "admitted a/1"}),
        # any lands on the exposed node (node 1: 3 free), not the lowest id.
        ([Arrive("p", 2, "any", "a")], {"p": "admitted a/1"}),
        # numa-<k> only on k; the scheduler's fit counts held + free.
        ([Arrive("p", 3, "numa-0", "a")], {"p": "pending"}),
        # A pod that left is forgotten, and frees its CPUs.
        ([Arrive("p", 3, "numa-1", "a"), Leave("p"), Arrive("q", 3, "numa-1", "a")],
         {"q": "admitted a/1"}),
    ],
)  # fmt: skip
def test_the_models_rules(events: list[Event], expected: dict[str, str]) -> None:
    assert replay({"a": [2, 3]}, events) == expected
