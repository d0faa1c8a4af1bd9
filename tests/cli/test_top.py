"""``top`` and ``kubectl numa``: quantities, a pod's effective request, per-node figures,
why a Pending pod fits nowhere, and the command against a stand-in API server (paged
lists, refusals, an exec credential plugin, kubectl running it as a plugin)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cli.clusterview import (
    explain,
    format_quantity,
    node_usage,
    numa_resources,
    parse_quantity,
    pod_requests,
)
from numa_device_plugin.cli.top import default_kubeconfig
from tests.apiserver_stub import cluster_api
from tests.conftest import REPO

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
    ],
)
def test_quantities_parse_exactly(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1gi", "1.2.3", "1Kib", "0x10", "1e"])
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


# -- the command against a stand-in API server ------------------------------------------------

PENDING = pod("web-0", [container("c", {"cpu": "2", R1: "2"})], namespace="shop")
PENDING["status"]["phase"] = "Pending"
PENDING["status"]["conditions"] = [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/2 nodes are available: 2 Insufficient numa-align/numa-1."}
]  # fmt: skip


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["top", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_top_pages_through_the_lists_and_prints_each_numa_resource(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    many = [node(f"n{i:03d}", {R1: "2"}) for i in range(60)]  # 3 pages of 25
    pods = [pod(f"p{i}", [container("c", {R1: "1"})], node="n000") for i in range(250)]
    with cluster_api(tmp_path, [*NODES, *many], [*PODS, *pods]) as (api, kubeconfig):
        code, out, err = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE", "NUMA", "RESOURCE", "CAPACITY", "ALLOCATABLE", "REQUESTED", "FREE"
    ]  # fmt: skip
    assert lines[1].split() == ["a", "0", "numa-align/numa-0", "4", "4", "0", "4"]
    assert lines[2].split() == ["a", "1", R1, "4", "4", "3", "1"]
    assert ["n000", "1", R1, "2", "2", "250", "-248"] in [line.split() for line in lines]
    assert len(lines) == 1 + 4 + 60
    assert sum(1 for p in api.paths if p.startswith("/api/v1/nodes")) == 3
    assert sum(1 for p in api.paths if p.startswith("/api/v1/pods")) == 3
    assert set(api.tokens) == {"stand-in"}


def test_a_node_that_is_not_ready_is_named_below_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    down = node("c", {R1: "2"}, ready=False)
    with cluster_api(tmp_path, [*NODES, down], PODS) as (_, kubeconfig):
        code, out, _ = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert ["c", "1", R1, "2", "2", "0", "2"] in [line.split() for line in lines]
    assert lines[-1] == "not Ready: c"


def test_top_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with cluster_api(tmp_path, NODES, PODS) as (_, kubeconfig):
        code, out, _ = run(["--kubeconfig", str(kubeconfig), "--output", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    a = document["nodes"][0]
    assert (a["name"], a["ready"]) == ("a", True)
    assert a["numa_nodes"][1] == {
        "id": 1,
        "resources": {R1: {"capacity": 4, "allocatable": 4, "requested": 3, "free": 1}},
    }


def test_explain_a_pending_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with cluster_api(tmp_path, NODES, [*PODS, PENDING]) as (_, kubeconfig):
        code, out, err = run(["--kubeconfig", str(kubeconfig), "--explain", "shop/web-0"], capsys)
        assert (code, err) == (0, "")
        _, as_json, _ = run(
            ["--kubeconfig", str(kubeconfig), "--explain", "shop/web-0", "--output", "json"],
            capsys,
        )
    assert out.splitlines() == [
        f"pod shop/web-0 is Pending; it asks cpu: 2, {R1}: 2, pods: 1",
        "the scheduler said: 0/2 nodes are available: 2 Insufficient numa-align/numa-1.",
        f"a: {R1}: needs 2, free 1 (1 short)",
        f"b: {R1}: needs 2, free 0 (2 short)",
    ]
    document = json.loads(as_json)
    assert document["nodes"][0]["lacks"] == [
        {"resource": R1, "needs": "2", "free": "1", "short": "1"}
    ]
    assert document["node"] is None


def test_api_refusals_and_missing_pods_exit_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cluster_api(tmp_path, NODES, PODS) as (api, kubeconfig):
        code, _, err = run(["--kubeconfig", str(kubeconfig), "--explain", "shop/nope"], capsys)
        assert code == 1
        assert "404" in err
        assert "/api/v1/namespaces/shop/pods/nope" in err
        api.status = 403
        code, _, err = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert code == 1
    assert "403" in err
    assert "stubbed refusal" in err


@pytest.mark.parametrize("ref", ["web-0", "a/b/c", "/web-0", "shop/"])
def test_explain_needs_namespace_slash_pod(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--explain", ref], capsys)
    assert code == 2
    assert "give NAMESPACE/POD" in err


def test_an_unreachable_api_server_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cluster_api(tmp_path, NODES, PODS) as (_, kubeconfig):
        pass  # stopped: nothing listens there any more
    code, _, err = run(["--kubeconfig", str(kubeconfig), "--timeout", "2"], capsys)
    assert code == 1
    assert "cannot reach the API server" in err


def exec_plugin(folder: Path, token: str) -> Path:
    """A kubeconfig exec credential plugin that prints ``token`` and records the
    KUBERNETES_EXEC_INFO it was given."""
    script = folder / "get-token"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib\n"
        f"info = pathlib.Path({str(folder / 'info.json')!r})\n"
        "info.write_text(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        f"'kind': 'ExecCredential', 'status': {{'token': {token!r}}}}}))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def with_exec(kubeconfig: Path, command: str) -> None:
    document = json.loads(kubeconfig.read_text())
    document["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": command}
    }
    kubeconfig.write_text(json.dumps(document))


def test_top_runs_the_kubeconfigs_exec_credential_plugin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = exec_plugin(tmp_path, "from-exec")
    with cluster_api(tmp_path, NODES, PODS) as (api, kubeconfig):
        with_exec(kubeconfig, str(script))
        code, _, err = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert (code, err) == (0, "")
    assert set(api.tokens) == {"from-exec"}
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["kind"] == "ExecCredential"
    assert info["spec"] == {"interactive": False}


def test_a_failing_exec_plugin_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with cluster_api(tmp_path, NODES, PODS) as (api, kubeconfig):
        with_exec(kubeconfig, "/bin/false")
        code, _, err = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert code == 1
    assert "exec credential plugin '/bin/false' exited 1" in err
    assert api.paths == []


def test_default_kubeconfig_follows_kubectl(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    second.write_text("{}")
    env = {"KUBECONFIG": f"{first}{os.pathsep}{second}", "HOME": str(tmp_path)}
    assert default_kubeconfig(env) == second, "the first file that exists"
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert default_kubeconfig({"HOME": str(tmp_path)}) == tmp_path / ".kube" / "config"
    assert default_kubeconfig({"HOME": str(tmp_path / "nobody")}) is None


def test_kubectl_runs_it_as_the_numa_plugin(tmp_path: Path) -> None:
    """``kubectl numa`` finds ``kubectl-numa`` on PATH (pip puts it beside
    numa-device-plugin) and passes its arguments on."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    plugin = Path(sys.executable).parent / "kubectl-numa"
    if not plugin.exists():
        pytest.fail(f"{plugin} is missing: `pip install -e .` installs it")
    with cluster_api(tmp_path, NODES, [*PODS, PENDING]) as (_, kubeconfig):
        env = dict(os.environ, PATH=f"{plugin.parent}{os.pathsep}{os.environ['PATH']}",
                   KUBECONFIG=str(kubeconfig), PYTHONPATH=str(REPO))  # fmt: skip
        result = subprocess.run(
            [kubectl, "numa", "--explain", "shop/web-0"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"b: {R1}: needs 2, free 0 (2 short)" in result.stdout


@pytest.mark.parametrize(
    "hostile",
    [
        {"metadata": {"name": "x"}, "status": ["not", "an", "object"]},
        {"metadata": {"name": "x"}, "status": {"conditions": "Ready"}},
        {"metadata": {"name": "x"}, "spec": {"taints": [42]}},
    ],
)
def test_objects_of_the_wrong_shape_exit_1_saying_so(
    hostile: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cluster_api(tmp_path, [*NODES, hostile], PODS) as (_, kubeconfig):
        code, _, err = run(["--kubeconfig", str(kubeconfig)], capsys)
    assert code == 1
    assert "the API server's objects are not usable" in err


def test_top_lists_near_resources_per_node_and_explain_counts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """numa-align/data-disk on each server (on whichever NUMA node its disk is): a row
    per node with NUMA "near", requests counted like any resource."""
    disk = "numa-align/data-disk"
    nodes = [
        node("a", {R1: "4", disk: "3"}),
        node("b", {R1: "4", disk: "2"}),
        node("c", {"cpu": "2"}),
    ]
    pods = [pod("es-0", [container("es", {"cpu": "2", disk: "2"})], node="a")]
    with cluster_api(tmp_path, nodes, pods) as (_, kubeconfig):
        code, out, _ = run(["--kubeconfig", str(kubeconfig)], capsys)
        assert code == 0
        rows = [line.split() for line in out.splitlines()]
        assert ["a", "near", disk, "3", "3", "2", "1"] in rows
        assert ["b", "near", disk, "2", "2", "0", "2"] in rows
        assert not any(row[0] == "c" and row[1] == "near" for row in rows)
        assert "NUMA near: a resource that follows a device" in out
        code, out, _ = run(["--kubeconfig", str(kubeconfig), "--output", "json"], capsys)
    document = json.loads(out)
    assert document["nodes"][0]["near"] == {
        disk: {"capacity": 3, "allocatable": 3, "requested": 2, "free": 1}
    }
    assert document["nodes"][2]["near"] == {}
    assert [(n, r) for n, r, _ in numa_resources(node_usage(nodes, pods)[0], "numa-align")] == [
        (1, R1)
    ]
