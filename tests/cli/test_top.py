"""``top`` and ``kubectl numa`` against a stand-in API server: paged lists, refusals,
an exec credential plugin, kubectl running it as a plugin."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cluster.fit import node_usage, numa_resources
from numa_device_plugin.cluster.kubeapi import default_kubeconfig
from tests.apiserver_stub import cluster_api
from tests.cluster.test_fit import NODES, PODS, R1, container, node, pod
from tests.conftest import REPO, venv_tool

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
    code, _, err = run(["--kubeconfig", str(kubeconfig), "--timeout", "60"], capsys)
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
    kubectl = venv_tool("kubectl")
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


ANY = "numa-align/any"


def test_top_names_the_numa_node_any_offers_and_explain_says_what_no_numa_node_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node a: NUMA node 0 keeps 2 free CPUs, node 1 keeps 3; any is held 1 and offers
    node 1's 3. A pod asking any: 4 is short on a, and no NUMA node of a has 4."""
    cpus = {"cpu": "8", "memory": "8Gi", "pods": "110"}
    nodes = [node("a", {**cpus, "numa-align/numa-0": "2", R1: "3", ANY: "4"})]
    held = pod("web", [container("c", {"cpu": "1", ANY: "1"})], node="a", namespace="shop")
    waiting = pod("big", [container("c", {"cpu": "4", ANY: "4"})], namespace="shop")
    waiting["status"]["phase"] = "Pending"
    with cluster_api(tmp_path, nodes, [held, waiting]) as (_, kubeconfig):
        code, out, err = run(["--kubeconfig", str(kubeconfig)], capsys)
        assert (code, err) == (0, "")
        _, as_json, _ = run(["--kubeconfig", str(kubeconfig), "--output", "json"], capsys)
        _, explained, _ = run(["--kubeconfig", str(kubeconfig), "--explain", "shop/big"], capsys)
    assert ["a", "any", ANY, "4", "4", "1", "3"] in [line.split() for line in out.splitlines()]
    assert "NUMA near" not in out
    assert "a: any offers the free CPUs of NUMA node 1" in out.splitlines()
    assert json.loads(as_json)["nodes"][0]["exposed"] == [1]
    assert explained.splitlines()[-1] == (
        f"a: {ANY}: needs 4, free 3 (1 short); no NUMA node of 2 has 4 free CPUs; the most "
        "is 3 (NUMA node 1)"
    )
