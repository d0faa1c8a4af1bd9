"""``check`` and ``kubectl numa check`` against a stand-in API server: the fleet recipe's
pods aligned, and each way one is not (a PV on the other disk, CPUs off the device's
node, memory elsewhere, the device lost, no exclusive CPUs, the node unread)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cluster.alignment import check_pod, disk_under, local_path
from tests.apiserver_stub import cluster_api
from tests.cli.test_devices import plugin_pod
from tests.cluster.test_fit import container, pod


def holder(
    name: str, cpus: str, resource: str, ids: list[str], memory: int | None = None
) -> dict[str, Any]:
    """A /debug/state holder of pod ``search/<name>``."""
    return {"pod": f"search/{name}", "container": "es", "cpus": cpus,
            "devices": {f"numa-align/{resource}": ids},
            "memory": [] if memory is None else [{"numa_node": memory, "type": "memory",
                                                  "bytes": 1 << 30}]}  # fmt: skip


def node_state(holders: list[dict[str, Any]], lost: str | None = None) -> dict[str, Any]:
    """Worker a of the test cluster: disk a (vdb) on NUMA node 1 at /mnt/disks/a, disk b
    (vdc) on node 0 at /mnt/disks/b, the root disk vda."""
    return {
        "numa_nodes": [{"id": 0, "cpus": "0-1"}, {"id": 1, "cpus": "2-3"}],
        "resources": {"numa-align/data-a": {"lost": lost}, "numa-align/data-b": {"lost": None},
                      "numa-align/numa-1": {"lost": None}},
        "near": [
            {"resource": "numa-align/data-a", "nodes": [1], "by_node": {"1": ["vdb"]},
             "reason": lost},
            {"resource": "numa-align/data-b", "nodes": [0], "by_node": {"0": ["vdc"]},
             "reason": None},
        ],
        "inventory": {"disks": [
            {"name": "vda", "nodes": [0], "mountpoints": ["/", "/boot"]},
            {"name": "vdb", "nodes": [1], "mountpoints": ["/mnt/disks/a"]},
            {"name": "vdc", "nodes": [0], "mountpoints": ["/mnt/disks/b"]},
        ], "nics": [], "accelerators": []},
        "pod_resources": {"holders": holders},
    }  # fmt: skip


def search_pod(name: str, resource: str, claim: str | None = None) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi", f"numa-align/{resource}": "1"}
    volumes = [] if claim is None else [{"name": "data", "persistentVolumeClaim": {
        "claimName": claim}}]  # fmt: skip
    return pod(name, [container("es", requests, limits=requests)], node="a",
               namespace="search", volumes=volumes)  # fmt: skip


def claim(name: str, volume: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "search"}, "spec": {"volumeName": volume}}


def local_pv(name: str, path: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"local": {"path": path}}}


def run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pods: list[dict[str, Any]],
    state: dict[str, Any] | int, *args: str, delay: float = 0.0,
) -> tuple[int, str, str]:  # fmt: skip
    """``check ARGS`` against the stand-in with plugin pod p-a on node a answering
    ``state`` (a status code: that error) after ``delay`` seconds."""
    with cluster_api(tmp_path, [], [plugin_pod("p-a", "a"), *pods]) as (api, kubeconfig):
        api.proxied["p-a"] = state
        if delay:
            api.delays["p-a"] = delay
        api.claims = [claim("data-a-0", "pv-a"), claim("data-b-0", "pv-b"),
                      claim("mixed", "pv-b"), claim("elsewhere", "pv-nfs")]  # fmt: skip
        nfs = {"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"path": "/x"}}}
        api.volumes = [local_pv("pv-a", "/mnt/disks/a"), local_pv("pv-b", "/mnt/disks/b/"), nfs]
        code = main(["check", "--kubeconfig", str(kubeconfig), *args])
    out, err = capsys.readouterr()
    return code, out, err


RECIPE = [search_pod("search-a-0", "data-a", "data-a-0"),
          search_pod("search-b-0", "data-b", "data-b-0")]  # fmt: skip
RECIPE_HOLDERS = [holder("search-a-0", "3", "data-a", ["numa1-slot0000"], memory=1),
                  holder("search-b-0", "1", "data-b", ["numa0-slot0003"], memory=0)]  # fmt: skip


def test_the_recipes_pods_are_all_aligned_and_it_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(tmp_path, capsys, RECIPE, node_state(RECIPE_HOLDERS))
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["POD", "NODE", "RESOURCE", "DEVICE", "NUMA", "CPUS", "MEMORY",
                       "VOLUMES", "VERDICT"]  # fmt: skip
    assert rows[1] == ["search/search-a-0", "a", "data-a", "vdb", "1", "1", "1",
                       "/mnt/disks/a:vdb", "aligned"]  # fmt: skip
    assert rows[2][-1] == "aligned"
    assert len(rows) == 3


@pytest.mark.parametrize(
    ("extra_pod", "extra_holder", "verdict", "why"),
    [
        # data-a with its PV under /mnt/disks/b: "aligned" by CPUs, on the wrong disk
        (search_pod("mixup-0", "data-a", "mixed"),
         holder("mixup-0", "2", "data-a", ["numa1-slot0001"], memory=1), "misaligned",
         "volume mixed (/mnt/disks/b) is on vdc, NUMA node(s) 0; numa-align/data-a follows vdb"),
        (search_pod("cpus-0", "data-a"), holder("cpus-0", "0", "data-a", ["numa1-slot0002"]),
         "misaligned", "container es: CPUs on NUMA node(s) 0, numa-align/data-a's device(s) on 1"),
        (search_pod("mem-0", "data-a"),
         holder("mem-0", "3", "data-a", ["numa1-slot0002"], memory=0), "misaligned",
         "container es: memory on NUMA node(s) 0"),
        (search_pod("shared-0", "data-a"), holder("shared-0", "", "data-a", ["numa1-slot0002"]),
         "misaligned", "container es: no exclusive CPUs"),
        (search_pod("ghost-0", "data-a"), None, "unknown",
         "the plugin lists no container of it holding a resource"),
        # a NUMA node's own resource with its volume on the other node's disk
        (search_pod("plain-0", "numa-1", "data-b-0"),
         holder("plain-0", "2", "numa-1", ["numa1-slot0000"]), "misaligned",
         "volume data-b-0 (/mnt/disks/b) is on vdc, NUMA node(s) 0; the pod's devices are on 1"),
        # CPUs partly on the device's node: all of them must be
        (search_pod("span-0", "data-a"),
         holder("span-0", "1-2", "data-a", ["numa1-slot0002"], memory=1), "misaligned",
         "container es: CPUs on NUMA node(s) 0,1, numa-align/data-a's device(s) on 1"),
        # memory partly on the device's node: all of it must be
        (search_pod("halves-0", "data-a"),
         {**holder("halves-0", "3", "data-a", ["numa1-slot0002"]),
          "memory": [{"numa_node": 1, "type": "memory", "bytes": 1 << 30},
                     {"numa_node": 0, "type": "memory", "bytes": 1 << 30}]},
         "misaligned", "container es: memory on NUMA node(s) 0,1, numa-align/data-a's device(s)"),
    ],
)  # fmt: skip
def test_a_pod_off_its_devices_node_is_named_with_why_and_it_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra_pod: dict[str, Any],
    extra_holder: dict[str, Any] | None, verdict: str, why: str,
) -> None:  # fmt: skip
    holders = [*RECIPE_HOLDERS, *([extra_holder] if extra_holder else [])]
    code, out, _ = run(tmp_path, capsys, [*RECIPE, extra_pod], node_state(holders),
                       "--output", "json")  # fmt: skip
    assert code == 1
    found = {p["pod"]: p for p in json.loads(out)["pods"]}
    name = f"search/{extra_pod['metadata']['name']}"
    assert found[name]["verdict"] == verdict
    assert any(why in line for line in found[name]["why"]), found[name]["why"]
    assert found["search/search-a-0"]["verdict"] == "aligned"


def test_a_lost_device_is_reported_for_the_pods_that_hold_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/mnt/disks/a unmounted on the node: the resource stays, lost, and its pods are
    "device lost" with the plugin's reason."""
    reason = "path:/mnt/disks/a: nothing is mounted there: it is on the root filesystem"
    code, out, _ = run(tmp_path, capsys, RECIPE, node_state(RECIPE_HOLDERS, lost=reason))
    assert code == 1
    assert "search/search-a-0: numa-align/data-a: device lost: path:/mnt/disks/a" in out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:3]}
    assert rows == {"search/search-a-0": "lost", "search/search-b-0": "aligned"}


def test_a_node_whose_plugin_cannot_be_read_leaves_its_pods_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(tmp_path, capsys, RECIPE, 503, "--output", "json")
    assert code == 1
    assert "a (p-a):" in err
    assert {p["verdict"] for p in json.loads(out)["pods"]} == {"unknown"}


@pytest.mark.parametrize(("pod_timeout", "read"), [("0.3", False), ("10", True)])
def test_a_slow_plugin_is_read_within_the_pod_timeout_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pod_timeout: str, read: bool
) -> None:
    """A plugin answering after 1 s: past a 0.3 s --pod-timeout its node's pods are
    unknown and the limit is named; with 10 s (a loaded cluster) it is read."""
    code, out, err = run(tmp_path, capsys, RECIPE, node_state(RECIPE_HOLDERS),
                         "--pod-timeout", pod_timeout, "--output", "json", delay=1.0)  # fmt: skip
    verdicts = {p["verdict"] for p in json.loads(out)["pods"]}
    if read:
        assert (code, err, verdicts) == (0, "", {"aligned"})
    else:
        assert code == 1
        assert verdicts == {"unknown"}
        assert "a (p-a): not read within the deadline (0.3 s a pod, --timeout in all)" in err


def test_one_pod_and_one_namespace_are_checked_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = pod("web-0", [container("w", {"cpu": "1"})], node="a", namespace="search")
    code, out, _ = run(tmp_path, capsys, [*RECIPE, other], node_state(RECIPE_HOLDERS),
                       "-n", "search", "search-b-0", "--output", "json")  # fmt: skip
    assert code == 0
    assert [p["pod"] for p in json.loads(out)["pods"]] == ["search/search-b-0"]
    code, _, err = run(tmp_path, capsys, RECIPE, node_state(RECIPE_HOLDERS), "search-b-0")
    assert code == 2
    assert "POD needs --pod-namespace (-n)" in err


def test_no_pod_holding_a_resource_is_aligned_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(tmp_path, capsys, [], node_state([]))
    assert code == 0
    assert "no running pod holds a numa-align resource" in out


@pytest.mark.parametrize(
    "state",
    [
        {"pod_resources": {"holders": "x"}},
        {"pod_resources": {"holders": [{"pod": "search/search-a-0", "devices": []}]}},
        {"numa_nodes": "x", "pod_resources": {"holders": [
            {"pod": "search/search-a-0", "cpus": 5, "devices": {"numa-align/data-a": [1, None]},
             "memory": "x"}]}},
        {"near": [{"resource": "numa-align/data-a", "by_node": []}], "inventory": {"disks": {}}},
    ],
)  # fmt: skip
def test_odd_plugin_states_give_a_verdict_never_a_crash(state: dict[str, Any]) -> None:
    check = check_pod(RECIPE[0], state, [("data-a-0", "/mnt/disks/a")], "numa-align")
    assert check.verdict in ("unknown", "misaligned")


def test_a_volumes_disk_is_the_nearest_mount_point_at_or_above_its_path() -> None:
    state = node_state([])
    assert disk_under(state, "/mnt/disks/a/pv-1") == ("vdb", [1])
    assert disk_under(state, "/mnt/disks/ab") == ("vda", [0])  # a prefix of the text only
    assert local_path({"spec": {"local": {"path": "//mnt/disks/a/"}}}) == "/mnt/disks/a"
    assert local_path({"spec": {"hostPath": {"path": "relative"}}}) is None
    # '..' resolved as the kernel does, never matched by its text's prefix
    assert local_path({"spec": {"local": {"path": "/mnt/disks/a/../b/pv"}}}) == "/mnt/disks/b/pv"
    assert local_path({"spec": {"local": {"path": "/../../mnt/disks/a"}}}) == "/mnt/disks/a"


def test_kubectl_numa_help_names_top_devices_and_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.cli.top import kubectl_main

    monkeypatch.setattr("sys.argv", ["kubectl-numa", "--help"])
    assert kubectl_main() == 0
    out = capsys.readouterr().out
    for line in ("kubectl numa devices [OPTIONS]", "kubectl numa check [POD] [OPTIONS]",
                 "Usage: kubectl numa top"):  # fmt: skip
        assert line in out
    monkeypatch.setattr("sys.argv", ["kubectl-numa", "check", "--help"])
    assert kubectl_main() == 0
    assert "Usage: kubectl numa check" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["check", "pod-x"], "Usage: kubectl numa check"),  # POD needs -n
        (["devices", "-n", "search"], "Usage: kubectl numa devices"),
        (["--no-such-flag"], "Usage: kubectl numa top"),
    ],
)
def test_under_kubectl_usage_and_errors_say_kubectl_numa(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    """kubectl runs kubectl-numa for `kubectl numa ...`: its usage lines and messages
    name that, not numa-device-plugin (which the user never typed)."""
    from numa_device_plugin.cli.top import kubectl_main

    monkeypatch.setattr("sys.argv", ["kubectl-numa", *argv])
    assert kubectl_main() == 2
    err = capsys.readouterr().err
    assert said in err
    assert "numa-device-plugin" not in err
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("sys.argv", ["kubectl-numa", "check"])
    assert kubectl_main() == 1
    assert capsys.readouterr().err.startswith("kubectl numa check: ")
    assert main(["check"]) == 1  # and the plain command is itself again
    assert capsys.readouterr().err.startswith("numa-device-plugin check: ")


def test_devices_takes_the_plugin_namespace_as_check_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-n is kubectl's namespace of workloads: devices, which reads none, refuses it
    and names --plugin-namespace, the option check has (devices' was --namespace)."""
    assert main(["devices", "--namespace", "kube-system"]) == 2
    assert "the plugin's namespace is --plugin-namespace (as in check)" in (capsys.readouterr().err)
    for command in ("devices", "check"):
        assert main([command, "--help"]) == 0
        assert "--plugin-namespace" in capsys.readouterr().out


def test_without_a_kubeconfig_it_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["check"]) == 1
    assert "no kubeconfig" in capsys.readouterr().err


def test_a_lost_device_outranks_misalignment_which_outranks_unknown() -> None:
    """A pod with every fault: its device lost, CPUs and memory off its node, a volume
    on a node whose mount points are unknown. The verdict is the worst, every fault is
    listed."""
    state = node_state([holder("search-a-0", "0", "data-a", ["numa1-slot0000"], memory=0)],
                       lost="pulled")  # fmt: skip
    state["inventory"]["disks"] = [{"name": "vdb", "nodes": [1], "mountpoints": None}]
    check = check_pod(RECIPE[0], state, [("data-a-0", "/mnt/disks/a")], "numa-align")
    assert check.verdict == "device lost"
    assert [why.split(":")[0] for why in check.why] == [
        "numa-align/data-a", "container es", "container es", "volume data-a-0 (/mnt/disks/a)",
    ]  # fmt: skip
    state["resources"]["numa-align/data-a"]["lost"] = None
    assert check_pod(RECIPE[0], state, [("data-a-0", "/mnt/disks/a")], "numa-align").verdict == (
        "misaligned"
    )


def test_a_volume_on_a_node_whose_mount_points_are_unknown_is_unknown_never_aligned() -> None:
    """The plugin read no host mount table (or not yet): a local volume's disk cannot be
    told, so the pod is not shown to be aligned."""
    state = node_state(RECIPE_HOLDERS)
    state["inventory"]["disks"] = [{**d, "mountpoints": None} for d in state["inventory"]["disks"]]
    check = check_pod(RECIPE[0], state, [("data-a-0", "/mnt/disks/a")], "numa-align")
    assert check.verdict == "unknown"
    assert check.why == [
        "volume data-a-0 (/mnt/disks/a): the node's mount points are unknown (the plugin "
        "reads no host mount table)"
    ]
    assert check.volumes[0]["disk"] is None
    state["inventory"] = None  # a plugin just started: its devices not read yet
    check = check_pod(RECIPE[0], state, [("data-a-0", "/mnt/disks/a")], "numa-align")
    assert check.verdict == "unknown"
    assert check.why == [
        "volume data-a-0 (/mnt/disks/a): the node's mount points are unknown (the plugin "
        "has not read its devices yet (it reads them once registered))"
    ]


def test_a_non_local_volume_and_a_numa_nodes_volume_on_its_own_disk_are_aligned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NFS claim has no disk on the node: checked by its CPUs alone; a NUMA node's own
    resource whose local volume is on that node's disk is aligned."""
    pods = [search_pod("nfs-0", "data-a", "elsewhere"), search_pod("plain-1", "numa-1", "data-a-0")]
    holders = [holder("nfs-0", "3", "data-a", ["numa1-slot0004"], memory=1),
               holder("plain-1", "2", "numa-1", ["numa1-slot0001"], memory=1)]  # fmt: skip
    code, out, err = run(tmp_path, capsys, pods, node_state(holders), "--output", "json")
    found = {p["pod"]: p for p in json.loads(out)["pods"]}
    assert (code, err) == (0, "")
    assert found["search/nfs-0"]["verdict"] == "aligned"
    assert found["search/nfs-0"]["volumes"] == [
        {"claim": "elsewhere", "path": None, "disk": None, "numa_nodes": [], "followed": None}
    ]
    assert found["search/plain-1"]["verdict"] == "aligned"
    assert found["search/plain-1"]["volumes"][0]["disk"] == "vdb"


def test_a_namespace_alone_checks_only_that_namespaces_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-n search`` without POD: the pods of search, not those of another namespace
    that hold the same resource on the same node."""
    requests = {"cpu": "1", "memory": "1Gi", "numa-align/data-a": "1"}
    other = pod("x-0", [container("es", requests, limits=requests)], node="a",
                namespace="other")  # fmt: skip
    other_holder = {**holder("x-0", "0", "data-a", ["numa1-slot0009"]), "pod": "other/x-0"}
    state = node_state([*RECIPE_HOLDERS, other_holder])
    code, out, _ = run(tmp_path, capsys, [*RECIPE, other], state, "-n", "search",
                       "--output", "json")  # fmt: skip
    assert code == 0
    assert sorted(p["pod"] for p in json.loads(out)["pods"]) == [
        "search/search-a-0", "search/search-b-0",
    ]  # fmt: skip
    code, out, _ = run(tmp_path, capsys, [*RECIPE, other], state, "--output", "json")
    assert code == 1  # all namespaces: other/x-0's CPUs are off its device's node
    assert "other/x-0" in {p["pod"] for p in json.loads(out)["pods"]}


def test_check_prints_reasons_with_terminal_controls_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin's reason is untrusted text: an escape sequence in it reaches the
    terminal as visible characters, never as a control."""
    reason = "gone\x1b[2J\x1b]0;owned\x07\r\nsearch/fake: aligned"
    code, out, _ = run(tmp_path, capsys, RECIPE, node_state(RECIPE_HOLDERS, lost=reason))
    assert code == 1
    assert not any(c in out for c in "\x1b\x07\r"), out
    assert "search/search-a-0: numa-align/data-a: device lost: gone\\x1b[2J" in out
    assert "\nsearch/fake: aligned" not in out


async def test_check_on_a_real_plugins_debug_state_follows_its_disk(
    tmp_path: Path, sock_dir: Path
) -> None:
    """Not a hand-made document: a real plugin (data-a=path:/mnt/disks/a, nvme1n1 on NUMA
    node 1) against the kubelet stand-in, a pod holding data-a with CPUs of node 1 and
    its volume on that disk; the plugin's own /debug/state makes ``check`` say aligned,
    naming the disk it follows; the same pod with its CPUs on node 0 is misaligned."""
    import asyncio

    from numa_device_plugin.kubelet_standin import KubeletStandIn
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.plugin.reports.snapshot import debug_document
    from tests.plugin.test_devicewatch import mounted_machine
    from tests.plugin.test_manager import make_config
    from tests.standin_helpers import eventually, running, wait_all_live

    tree, table = mounted_machine(tmp_path / "sys")
    standin = KubeletStandIn(sock_dir / "dp", pod_resources_dir=sock_dir / "pr",
                             allocatable_cpus=range(4))  # fmt: skip
    async with standin as kubelet:
        config = make_config(
            tree, sock_dir / "dp", near=(parse_near("data-a=path:/mnt/disks/a"),),
            mount_table=table, pod_resources_socket=kubelet.pod_resources_socket,
        )  # fmt: skip
        async with running(config) as manager:
            await wait_all_live(kubelet, ["numa-align/data-a"])
            kubelet.add_pod("search", "search-a-0",
                            [("es", {"numa-align/data-a": ["numa1-slot0000"]}, [2])])  # fmt: skip
            kubelet.add_pod("search", "search-a-1",
                            [("es", {"numa-align/data-a": ["numa1-slot0001"]}, [1])])  # fmt: skip
            manager.poller.schedule.request()

            def state() -> dict[str, Any]:
                found: dict[str, Any] = json.loads(json.dumps(debug_document(manager.snapshot())))
                return found

            await eventually(lambda: len(state()["pod_resources"]["holders"]) == 2)
            await eventually(lambda: state()["inventory"] is not None)
            document = await asyncio.to_thread(state)
    good = check_pod(search_pod("search-a-0", "data-a", "data-a-0"), document,
                     [("data-a-0", "/mnt/disks/a/pv-1")], "numa-align")  # fmt: skip
    assert (good.verdict, good.why) == ("aligned", [])
    assert good.resources["numa-align/data-a"]["devices"] == ["nvme1n1"]
    assert good.volumes[0]["disk"] == "nvme1n1"
    assert good.volumes[0]["followed"] is True
    bad = check_pod(search_pod("search-a-1", "data-a"), document, [], "numa-align")
    assert bad.verdict == "misaligned"
    assert bad.why == ["container es: CPUs on NUMA node(s) 0, numa-align/data-a's device(s) on 1"]


def test_a_generic_ephemeral_volume_is_checked_by_the_claim_kubernetes_makes_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ephemeral.volumeClaimTemplate``: Kubernetes makes the claim <pod>-<volume>; bound
    to a local PV on the other NUMA node's disk, the pod is misaligned (it was reported
    aligned, exit 0)."""
    from numa_device_plugin.cluster.alignment import claims

    scratch = search_pod("eph-0", "data-a")
    scratch["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
        "spec": {"storageClassName": "local"}}}}]  # fmt: skip
    assert claims(scratch) == ["eph-0-scratch"]
    holders = [*RECIPE_HOLDERS, holder("eph-0", "3", "data-a", ["numa1-slot0005"], memory=1)]
    with cluster_api(tmp_path, [], [plugin_pod("p-a", "a"), *RECIPE, scratch]) as (api, config):
        api.proxied["p-a"] = node_state(holders)
        api.claims = [claim("data-a-0", "pv-a"), claim("data-b-0", "pv-b"),
                      claim("eph-0-scratch", "pv-b")]  # fmt: skip
        api.volumes = [local_pv("pv-a", "/mnt/disks/a"), local_pv("pv-b", "/mnt/disks/b")]
        code = main(["check", "--kubeconfig", str(config), "--output", "json"])
    found = {p["pod"]: p for p in json.loads(capsys.readouterr().out)["pods"]}
    assert code == 1
    assert found["search/eph-0"]["verdict"] == "misaligned"
    assert found["search/eph-0"]["volumes"][0]["claim"] == "eph-0-scratch"
    assert found["search/eph-0"]["volumes"][0]["disk"] == "vdc"


def test_a_lying_cpulist_is_read_within_its_bounds() -> None:
    """A plugin pod answering 2 MB of ``0-4095,`` once took check 46-79 s past its
    --timeout: each CPU is added once (ranges merged), at most MAX_CPUS parts are read
    and no id at or above MAX_CPUS is kept."""
    from numa_device_plugin.cluster.alignment import MAX_CPUS, parse_cpulist

    assert parse_cpulist("0-4095," * 300_000) == set(range(4096))
    assert parse_cpulist("0-3,8,2-5,7-6,x,,10-") == {0, 1, 2, 3, 4, 5, 8}
    assert parse_cpulist(f"{MAX_CPUS - 2}-99999") == {MAX_CPUS - 2, MAX_CPUS - 1}
    assert parse_cpulist("0," * MAX_CPUS + "5") == {0}  # the parts past the bound unread
    assert parse_cpulist(5) == set()
    state = node_state([holder("search-a-0", "0-4095," * 100_000 + "3", "data-a",
                               ["numa1-slot0000"], memory=1)])  # fmt: skip
    state["numa_nodes"] = [{"id": 0, "cpus": "0-1," * 100_000}, {"id": 1, "cpus": "2-3"}]
    check = check_pod(RECIPE[0], state, [], "numa-align")
    assert check.cpu_nodes == [0, 1]
    assert check.verdict == "misaligned"


@pytest.mark.parametrize(
    ("path", "verdict", "why"),
    [
        ("/mnt/nfs/pv-1", "unknown", "is on nfs4 at /mnt/nfs, a filesystem on no local disk"),
        ("/scratch/pv", "unknown", "is on tmpfs at /scratch, a filesystem on no local disk"),
        # a disk mounted below the NFS mount is that disk's, and on the device's node
        ("/mnt/nfs/local/pv", "aligned", None),
        ("/srv/pv", "misaligned", "is on vda, NUMA node(s) 0"),  # the root disk's, truly
    ],
)
def test_a_volume_on_a_filesystem_without_a_local_disk_is_unknown_never_the_root_disk(
    path: str, verdict: str, why: str | None
) -> None:
    """An NFS or tmpfs mount's path was put on the root disk (the nearest disk mount
    above it: /), so the pod was called misaligned; the plugin's inventory lists the
    mounts on no local disk, and check says unknown, with which."""
    state = node_state(RECIPE_HOLDERS)
    state["inventory"]["disks"][1]["mountpoints"] = ["/mnt/disks/a", "/mnt/nfs/local"]
    state["inventory"]["mounts"] = [{"point": "/mnt/nfs", "type": "nfs4"},
                                    {"point": "/scratch", "type": "tmpfs"}]  # fmt: skip
    check = check_pod(RECIPE[0], state, [("data-a-0", path)], "numa-align")
    assert check.verdict == verdict, check.why
    if why is not None:
        assert any(why in line for line in check.why), check.why


@pytest.mark.parametrize(
    ("cpus", "ids", "verdict", "why"),
    [
        ("2-3", ["numa1-cpu0002", "numa1-cpu0003"], "aligned", []),
        ("2-3", ["numa1-cpu0002"], "misconfigured",
         ["container es: asks numa-align/any: 1 for 2 exclusive CPUs (ask as many as its CPUs: "
          "any's count is the free CPUs of one NUMA node)"]),
        ("1-2", ["numa0-cpu0001", "numa0-cpu0000"], "misaligned",
         ["container es: CPUs on NUMA node(s) 0,1, numa-align/any's device(s) on 0"]),
    ],
)  # fmt: skip
def test_a_pod_holding_any_is_checked_like_the_others_and_its_count_against_its_cpus(
    cpus: str, ids: list[str], verdict: str, why: list[str]
) -> None:
    state = node_state([holder("web-0", cpus, "any", ids)])
    check = check_pod(search_pod("web-0", "any"), state, [], "numa-align")
    assert (check.verdict, check.why) == (verdict, why)


def test_a_pods_own_host_path_volume_is_checked_like_a_local_pv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An inline hostPath volume on the other NUMA node's disk: misaligned, named by the
    volume (it was not checked: aligned, exit 0)."""
    inline = search_pod("inline-0", "data-a")
    inline["spec"]["volumes"] = [{"name": "scratch", "hostPath": {"path": "/mnt/disks/b/x/"}}]
    holders = [holder("inline-0", "3", "data-a", ["numa1-slot0001"], memory=1)]
    code, out, _ = run(tmp_path, capsys, [inline], node_state(holders), "--output", "json")
    (found,) = json.loads(out)["pods"]
    assert code == 1
    assert found["verdict"] == "misaligned"
    assert found["volumes"][0]["claim"] == "scratch (hostPath)"
    assert found["volumes"][0]["path"] == "/mnt/disks/b/x"
    assert found["volumes"][0]["disk"] == "vdc"


def test_a_named_pod_that_is_not_running_is_unknown_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check search-a-0 while it is Pending: it was "no running pod holds a numa-align
    resource", exit 0, which read as a pass."""
    pending = search_pod("search-a-0", "data-a", "data-a-0")
    pending["status"]["phase"] = "Pending"
    code, out, _ = run(tmp_path, capsys, [pending], node_state([]),
                       "-n", "search", "search-a-0", "--output", "json")  # fmt: skip
    (found,) = json.loads(out)["pods"]
    assert code == 1
    assert found["verdict"] == "unknown"
    assert found["why"] == ["phase Pending: not running, nothing placed to check yet"]


def test_checking_one_pod_reads_only_its_nodes_plugin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forty plugin pods, one pod checked: one /debug/state read (it was forty)."""
    plugins = [plugin_pod(f"p-{n}", n) for n in ("a", *(f"n{i}" for i in range(39)))]
    with cluster_api(tmp_path, [], [*plugins, *RECIPE]) as (api, config):
        for plugin in plugins:
            api.proxied[plugin["metadata"]["name"]] = node_state(RECIPE_HOLDERS)
        api.claims = [claim("data-a-0", "pv-a"), claim("data-b-0", "pv-b")]
        api.volumes = [local_pv("pv-a", "/mnt/disks/a"), local_pv("pv-b", "/mnt/disks/b")]
        code = main(["check", "--kubeconfig", str(config), "-n", "search", "search-a-0"])
        reads = [path for path in api.paths if path.endswith("/proxy/debug/state")]
    capsys.readouterr()
    assert code == 0
    assert reads == ["/api/v1/namespaces/kube-system/pods/p-a:9201/proxy/debug/state"]
