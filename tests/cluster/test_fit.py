"""The scheduler's arithmetic of ``top``: quantities as the API server reads them, a
pod's effective request, per-node figures, why a Pending pod fits nowhere."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from numa_device_plugin.cluster.fit import (
    explain,
    format_quantity,
    node_usage,
    numa_resources,
    parse_quantity,
    pod_requests,
)

R1 = "numa-align/numa-1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", Fraction(4)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("1Gi", Fraction(1 << 30)),
        ("1.5Gi", Fraction(3 << 29)),
        ("2k", Fraction(2000)),
        ("2e3", Fraction(2000)),
        ("1E", Fraction(10**18)),  # exa, not an exponent
        ("1E2", Fraction(100)),
        (".5", Fraction(1, 2)),
        ("-1", Fraction(-1)),
        # Once refused ("invalid literal for int() ... 'i'"):
        ("1Ei", Fraction(1 << 60)),
        # The API server's bounds: magnitudes capped at 2^63-1, precision at 10^-9,
        # however large the exponent (1e99999999 once took over 200 s).
        ("9999999999999999999Ei", Fraction(2**63 - 1)),
        ("1e9999999", Fraction(2**63 - 1)),
        ("-1e99999999", Fraction(-(2**63 - 1))),
        ("1e-9999999", Fraction(1, 10**9)),
        ("0.0000000001", Fraction(1, 10**9)),
        ("1.0000000001", Fraction(1000000001, 10**9)),
        ("0e99999999", Fraction(0)),
    ],
)
def test_quantities_parse_exactly(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "1 Gi", "1gi", "1.2.3", "1Kib", "0x10", "1e", "NaN", "Infinity", "1_000",
     "1" * 65],
)  # fmt: skip
def test_malformed_quantities_are_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("cpu", Fraction(7, 2), "3500m"),
        ("cpu", Fraction(4), "4"),
        ("memory", Fraction(4 << 30), "4Gi"),
        ("memory", Fraction(1000), "1000"),
        ("hugepages-2Mi", Fraction(4 << 20), "4Mi"),
        (R1, Fraction(3), "3"),
    ],
)
def test_quantities_format_as_people_read_them(
    resource: str, value: Fraction, expected: str
) -> None:
    assert format_quantity(resource, value) == expected


def container(name: str, requests: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if "limits" in extra:
        resources["limits"] = extra.pop("limits")
    return {"name": name, "resources": resources, **extra}


def pod(
    name: str,
    containers: list[dict[str, Any]],
    *,
    node: str | None = None,
    phase: str = "Running",
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers, **spec}
    if node:
        body["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
        "status": {"phase": phase},
    }


def test_a_request_defaults_to_its_limit() -> None:
    p = pod("p", [container("a", limits={"cpu": "2", R1: "2"}, requests={"cpu": "1"})])
    assert pod_requests(p) == {"cpu": 1, R1: 2, "pods": 1}


def test_init_containers_count_at_their_peak_and_sidecars_all_along() -> None:
    p = pod(
        "p",
        [container("app", {"cpu": "1", R1: "1"})],
        initContainers=[
            container("sidecar", {"cpu": "500m"}, restartPolicy="Always"),
            container("setup", {"cpu": "3", R1: "4"}),
        ],
        overhead={"cpu": "250m"},
    )
    # app + sidecar = 1.5 cpu; setup + the sidecar before it = 3.5; plus the overhead
    assert pod_requests(p) == {"cpu": Fraction(15, 4), R1: 4, "pods": 1}


def node(name: str, allocatable: dict[str, str], **extra: Any) -> dict[str, Any]:
    ready = extra.pop("ready", True)
    return {
        "metadata": {"name": name},
        "spec": extra,
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


NODES = [
    node("b", {"cpu": "8", "memory": "8Gi", "pods": "110", "numa-align/numa-0": "4", R1: "4"}),
    node("a", {"cpu": "8", "memory": "8Gi", "pods": "110", "numa-align/numa-0": "4", R1: "4"}),
]
PODS = [
    pod("on-a", [container("c", {"cpu": "2", R1: "3"})], node="a"),
    pod("on-b", [container("c", {"cpu": "4", R1: "4"})], node="b"),
    pod("done", [container("c", {R1: "4"})], node="a", phase="Succeeded"),  # ended: free
    pod("waiting", [container("c", {"cpu": "2", R1: "2"})]),  # not bound: counts nowhere
]


def test_node_usage_counts_bound_pods_that_have_not_ended() -> None:
    usage = node_usage(NODES, PODS)
    assert [u.name for u in usage] == ["a", "b"]
    a = usage[0].resources
    assert [a[R1].allocatable, a[R1].requested, a[R1].free] == [4, 3, 1]
    assert [a["cpu"].requested, a["pods"].requested] == [2, 1]
    rows = numa_resources(usage[0], "numa-align")
    assert [(numa, name) for numa, name, _ in rows] == [(0, "numa-align/numa-0"), (1, R1)]


def test_explain_names_each_node_and_what_it_lacks() -> None:
    usage = node_usage(
        [*NODES, node("c", {"cpu": "8", "pods": "9", R1: "8"}, ready=False, unschedulable=True)],
        PODS,
    )
    verdicts = {
        v.node: v for v in explain(pod("p", [container("c", {"cpu": "2", R1: "2"})]), usage)
    }
    a = [(s.resource, s.needs, s.free, s.short) for s in verdicts["a"].shortfalls]
    assert a == [(R1, Fraction(2), Fraction(1), Fraction(1))]
    assert [(s.resource, s.short) for s in verdicts["b"].shortfalls] == [(R1, Fraction(2))]
    assert verdicts["c"].shortfalls == ()
    assert verdicts["c"].notes == ("not Ready", "unschedulable (cordoned)")
    assert not any(v.fits for v in verdicts.values())


def test_a_node_without_the_resource_has_none_free() -> None:
    usage = node_usage([node("plain", {"cpu": "8", "pods": "9"})], [])
    (verdict,) = explain(pod("p", [container("c", {R1: "1"})]), usage)
    assert [(s.resource, s.free) for s in verdict.shortfalls] == [(R1, Fraction(0))]


def test_malformed_quantities_in_the_cluster_name_the_object() -> None:
    with pytest.raises(ValueError, match=r"pod default/bad: '2 cores'"):
        node_usage(NODES, [pod("bad", [container("c", {"cpu": "2 cores"})], node="a")])


def test_the_init_container_peak_is_the_largest_not_the_last() -> None:
    """Mutant: the init-container peak taken from the last init container."""
    p = pod(
        "p",
        [container("app", {"cpu": "1"})],
        initContainers=[container("big", {"cpu": "4"}), container("small", {"cpu": "2"})],
    )
    assert pod_requests(p)["cpu"] == 4


def test_pods_that_ended_request_nothing() -> None:
    """Mutant: ``Failed`` pods counted (the API server's field selector is not trusted
    alone)."""
    pods = [
        pod("done", [container("c", {R1: "2"})], node="a", phase="Succeeded"),
        pod("failed", [container("c", {R1: "2"})], node="a", phase="Failed"),
        pod("running", [container("c", {R1: "1"})], node="a"),
    ]
    (use, _) = node_usage(NODES, pods)
    assert use.name == "a"
    assert use.resources[R1].requested == 1


def test_an_exact_fit_is_no_shortfall() -> None:
    """Mutant: free == needs reported as short."""
    usage = node_usage([node("n", {R1: "2", "cpu": "2", "pods": "9"})], [])
    (verdict,) = explain(pod("p", [container("c", {R1: "2", "cpu": "2"})]), usage)
    assert verdict.fits
    assert verdict.shortfalls == ()


def test_the_table_says_when_no_node_has_a_numa_resource() -> None:
    """Mutant: the "no numa-align resources" hint lost."""
    from numa_device_plugin.cli.top import render_top, top_document

    document = top_document(node_usage([node("plain", {"cpu": "8"})], []), "numa-align")
    text = render_top(document)
    assert text.splitlines()[0] == (
        "no node advertises a NUMA resource (is the plugin's DaemonSet running?)"
    )
    assert "without NUMA resources: plain" in text
