"""``devices`` and ``kubectl numa devices`` against a stand-in API server: the plugin's
pods listed by label, each one's /debug/state read through the pod proxy, the table and
the config.named map; refusals named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from numa_device_plugin.cli import main
from numa_device_plugin.cli.devices import devices_document, disk_size, render_devices
from tests.apiserver_stub import cluster_api
from tests.cluster.test_fit import pod

LABELS = {"app.kubernetes.io/name": "numa-device-plugin"}


def plugin_pod(name: str, node: str, phase: str = "Running") -> dict[str, Any]:
    found = pod(name, [], node=node, phase=phase, namespace="kube-system")
    found["metadata"]["labels"] = dict(LABELS)
    return found


def state(*disks: dict[str, Any], nics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A /debug/state document: only its inventory matters here."""
    return {"ready": True, "inventory": {"disks": list(disks), "nics": nics or [],
                                         "accelerators": []}}  # fmt: skip


def disk(name: str, serial: str | None, nodes: list[int]) -> dict[str, Any]:
    return {"name": name, "nodes": nodes, "serial": serial, "wwid": f"eui.{name}",
            "model": "QEMU", "size_bytes": 16 << 20, "pci": ["0000:41:00.0"]}  # fmt: skip


NIC = {"name": "eth0", "nodes": [1], "pci": ["0000:81:00.0"], "driver": "virtio_net"}


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], pods: list[dict[str, Any]],
        proxied: dict[str, Any], *args: str) -> tuple[int, str, str, list[str]]:  # fmt: skip
    with cluster_api(tmp_path, [], pods) as (api, kubeconfig):
        api.proxied.update(proxied)
        code = main(["devices", "--kubeconfig", str(kubeconfig), *args])
    out, err = capsys.readouterr()
    return code, out, err, api.paths


def test_devices_reads_each_running_plugin_pod_through_the_proxy_and_prints_a_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [
        plugin_pod("p-a", "a"), plugin_pod("p-b", "b"), plugin_pod("p-c", "c", "Pending"),
        pod("other", [], node="a", namespace="kube-system"),  # not the plugin's: no label
    ]  # fmt: skip
    proxied = {
        "p-a": state(disk("vda", "DISK-A", [1]), disk("vdb", None, [0]), nics=[NIC]),
        "p-b": state(disk("vda", "DISK-B", [0]), disk("md0", "X", [0, 1])),
    }
    code, out, err, paths = run(tmp_path, capsys, pods, proxied)
    assert (code, err) == (0, "")
    assert "/api/v1/namespaces/kube-system/pods/p-a:9201/proxy/debug/state" in paths
    assert not any("p-c" in p or "other" in p for p in paths)  # not Running / not ours
    table, _, rest = out.partition("\n\n")
    warning, _, named = rest.partition("\n\n")
    assert "a name written twice in YAML keeps only the last" in warning
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["NODE", "NUMA", "KIND", "NAME", "ID", "MODEL", "SIZE", "PCI", "DRIVER",
                       "MOUNTPOINTS"]  # fmt: skip
    assert ["a", "1", "disk", "vda", "DISK-A", "QEMU", "16M", "0000:41:00.0", "-", "-"] in rows
    assert rows[2][:5] == ["a", "0", "disk", "vdb", "eui.vdb"]
    assert ["a", "1", "nic", "eth0", "-", "-", "-", "0000:81:00.0", "virtio_net", "-"] in rows
    # each name's selectors a list: a second one is added there, never as a second key
    assert yaml.safe_load(named) == {"config": {"named": {
        "a": {"near": {"disk-vda": ["serial:DISK-A"], "disk-vdb": ["wwid:eui.vdb"],
                       "nic-eth0": ["net:eth0"]}},
        "b": {"near": {"disk-vda": ["serial:DISK-B"]}},  # md0 spans two nodes: none
    }}}  # fmt: skip


def test_a_pod_that_cannot_be_read_is_named_and_the_others_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [plugin_pod("p-a", "a"), plugin_pod("p-b", "b")]
    code, out, err, _ = run(
        tmp_path, capsys, pods, {"p-a": state(), "p-b": 403}, "--output", "json"
    )
    assert code == 0
    assert "b (p-b):" in err
    assert "403" in err
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["a"]


@pytest.mark.parametrize(
    ("proxied", "message"),
    [
        ({}, "no running plugin pod could be read"),  # every proxy GET 404
        ({"p-a": 503}, "no running plugin pod could be read"),
    ],
)
def test_no_readable_pod_exits_1_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], proxied: dict[str, Any], message: str
) -> None:
    code, out, err, _ = run(tmp_path, capsys, [plugin_pod("p-a", "a")], proxied)
    assert code == 1
    assert out == ""
    assert message in err


@pytest.mark.parametrize(
    ("size", "shown"),
    [(0, "0B"), (512, "512B"), (1023, "1023B"), (1024, "1K"), (16 << 20, "16M"),
     (64 << 20, "64M"), (1000204886016, "931.5G"), (3840755982336, "3.5T"),
     (None, "-"), (-1, "-"), ("16M", "-"), (True, "-"), (1.5e9, "-")],
)  # fmt: skip
def test_a_disk_size_is_shown_in_binary_units_as_lsblk_does(size: object, shown: str) -> None:
    """The test cluster's 16 MiB disks once showed as ``0.0G`` (decimal gigabytes)."""
    assert disk_size(size) == shown


@pytest.mark.parametrize(
    "inventory",
    [
        {"disks": [{"name": "sda", "nodes": "1", "serial": "S1"}]},  # nodes a text
        {"disks": [{"name": "sda", "nodes": [True], "serial": "S1"}]},  # a bool, not 1
        {"disks": [{"name": "sda", "nodes": [1], "serial": "with space"}]},
        {"disks": [{"name": "sda", "nodes": [1], "serial": 7}]},
        {"disks": [{"name": 5, "nodes": [1], "serial": "S1"}]},
        {"nics": [{"nodes": [0]}]},  # no name
        {"nics": [{"name": "eth0: x", "nodes": [0]}]},  # no kernel name: refused
        {"accelerators": [{"node": True, "pci": "0000:00:01.0"}]},
        {"accelerators": [{"node": "0", "pci": "0000:00:01.0"}]},
        {"accelerators": [{"node": -1, "pci": "0000:00:01.0"}]},
        {"disks": ["junk", {}], "nics": {"eth0": 1}, "accelerators": "x"},
    ],
)
def test_wrong_types_make_no_selector_and_show_a_dash(inventory: dict[str, Any]) -> None:
    document = devices_document({"a": {"inventory": inventory}})
    assert document["named"] == {}
    table = render_devices(document)
    assert "True" not in table
    assert "-1" not in table


def test_kubectl_numa_devices_runs_devices_and_anything_else_runs_top(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.cli.top import kubectl_main

    for argv, usage in ((["devices", "--help"], "Usage: kubectl numa devices"),
                        (["--help"], "Usage: kubectl numa top")):  # fmt: skip
        monkeypatch.setattr("sys.argv", ["kubectl-numa", *argv])
        assert kubectl_main() == 0
        assert usage in capsys.readouterr().out


HOSTILE_TEXT = ["\x1b]0;owned\x07", "\x1b[2J\x1b[H", "A\nforged line", "\u2028x", "\x9b31m"]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_the_devices_table_shows_every_terminal_control_escaped(text: str) -> None:
    """An OSC or CSI sequence in a serial, model, driver or node name would act on the
    terminal; the table shows it escaped, one line per device."""
    document = devices_document({text: {"inventory": {
        "disks": [{"name": "sda", "nodes": [0], "serial": text, "model": text,
                   "size_bytes": 512, "pci": [text]}],
        "nics": [{"name": "eth0", "nodes": [1], "pci": ["0000:01:00.0"], "driver": text}],
        "accelerators": [],
    }}})  # fmt: skip
    table = render_devices(document).split("\n\n")[0]
    assert all(c.isprintable() for line in table.splitlines() for c in line), table
    assert len(table.splitlines()) == 3
    assert repr(text)[1:-1] in table  # shown as Python writes it in a string


def test_accelerators_on_numa_node_0_are_proposed() -> None:
    document = devices_document({"a": {"inventory": {"accelerators": [
        {"pci": "0000:17:00.0", "node": 0, "class": "030200", "class_name": "3D controller",
         "id": "10de:20b0"},
        {"pci": "0000:a1:00.0", "node": 1, "class": "030200", "class_name": "3D controller",
         "id": "10de:20b0"},
    ]}}})  # fmt: skip
    assert document["named"] == {
        "a": {
            "near": {"pci-0000-17-00-0": "pci:0000:17:00.0", "pci-0000-a1-00-0": "pci:0000:a1:00.0"}
        }
    }
    rows = [line.split() for line in render_devices(document).splitlines()[1:3]]
    assert [row[1] for row in rows] == ["0", "1"]


def test_a_pod_list_refused_exits_1_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cluster_api(tmp_path, [], [plugin_pod("p-a", "a")]) as (api, kubeconfig):
        api.status = 403
        code = main(["devices", "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "403" in err
    assert "/api/v1/namespaces/kube-system/pods" in err


@pytest.mark.parametrize(("timeout", "per_pod"), [("12", 30.0), ("60", 4.0)])
def test_a_slow_pod_is_named_and_holds_up_neither_the_others_nor_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: str, per_pod: float
) -> None:
    """Of 40 plugin pods one answers after 30 s: read concurrently, each within its own
    deadline (--pod-timeout, or what is left of --timeout), the 39 print and the slow
    one is named, long before the slow answer."""
    import time

    pods = [plugin_pod(f"p-{i:02}", f"n{i:02}") for i in range(40)]
    proxied = {f"p-{i:02}": state(disk("vda", f"S{i}", [i % 2])) for i in range(40)}
    with cluster_api(tmp_path, [], pods) as (api, kubeconfig):
        api.proxied.update(proxied)
        api.delays["p-07"] = 30.0
        started = time.monotonic()
        code = main(["devices", "--kubeconfig", str(kubeconfig), "--timeout", timeout,
                     "--pod-timeout", str(per_pod), "--output", "json"])  # fmt: skip
        took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 0, err
    assert took < 20  # the slow answer comes after 30 s
    assert f"n07 (p-07): not read within the deadline ({per_pod:g} s a pod" in err
    assert "Connection pool" not in err  # no reader left behind to log after the command
    names = [n["name"] for n in json.loads(out)["nodes"]]
    assert len(names) == 39
    assert "n07" not in names


def test_two_plugin_pods_on_one_node_are_both_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [plugin_pod("p-a", "a"), plugin_pod("p-a2", "a")]
    proxied = {"p-a": state(disk("vda", "S1", [0])), "p-a2": state(disk("vda", "S1", [0]))}
    code, out, err, _ = run(tmp_path, capsys, pods, proxied, "--output", "json")
    assert code == 0
    assert "node a has 2 plugin pods (p-a, p-a2); shown: p-a" in err
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["a"]


def mounted_disk(name: str, serial: str, node: int, *points: str) -> dict[str, Any]:
    return {**disk(name, serial, [node]), "mountpoints": list(points)}


def test_the_pool_configuration_names_the_mount_points_every_node_shares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The align page's recipe from the test cluster's shape: each worker's root disk,
    and data disks at /mnt/disks/a and /mnt/disks/b on opposite NUMA nodes."""
    pods = [plugin_pod("p-a", "a"), plugin_pod("p-b", "b")]
    proxied = {
        "p-a": state(mounted_disk("vda", "ROOT-A", 0, "/", "/boot"),
                     mounted_disk("vdb", "DA", 1, "/mnt/disks/a"),
                     mounted_disk("vdc", "DB", 0, "/mnt/disks/b", "/var/lib/kubelet/pods/x")),
        "p-b": state(mounted_disk("vda", "ROOT-B", 1, "/"),
                     mounted_disk("vdb", "DA2", 0, "/mnt/disks/a"),
                     mounted_disk("vdc", "DB2", 1, "/mnt/disks/b", "/mnt/only-here")),
    }  # fmt: skip
    code, out, err, _ = run(tmp_path, capsys, pods, proxied)
    assert (code, err) == (0, "")
    assert "/mnt/disks/a" in out.splitlines()[2]  # the MOUNTPOINTS column
    pool = out[out.index("# One configuration for every node") :]
    assert yaml.safe_load(pool.partition("\n\n")[0]) == {"config": {"near": {
        "mnt-disks-a": ["path:/mnt/disks/a"], "mnt-disks-b": ["path:/mnt/disks/b"],
    }}}  # fmt: skip


def test_without_the_hosts_mount_table_no_pool_is_proposed_and_it_says_why() -> None:
    document = devices_document({"a": state(disk("vda", "S1", [0]))})
    assert document["pool"] == {}
    assert any("mount points of 1 node(s) are unknown" in why for why in document["left_out"])


HOSTILE_INVENTORY: dict[str, Any] = {
    "disks": [
        {"name": "sda", "nodes": [0], "serial": "*"},  # a pattern matching every disk
        {"name": "sdb", "nodes": [0], "serial": "WD-[AB]?"},
        {"name": "-", "nodes": [1], "serial": "S-DASH"},  # the name would be "disk-"
        {"name": "a.b", "nodes": [1], "serial": "S-DOT"},  # a.b and a-b: one variable
        {"name": "a-b", "nodes": [1], "serial": "S-DASHED"},
        {"name": "numa-1x", "nodes": [1], "serial": "S-NUMA"},
        {"name": "x" * 80, "nodes": [1], "wwid": "eui." + "f" * 300},  # a wwid too long
        {"name": "sdz", "nodes": [1], "serial": "S\u200bZ"},  # refused by the plugin
        {"name": "mnt", "nodes": [1], "serial": "M", "mountpoints": ["/mnt/my disk"]},
    ],
    "nics": [{"name": "eth0: x", "nodes": [0]}, {"name": "ens1f0", "nodes": [1]}],
    "accelerators": [{"pci": "0000:41:00.0", "node": 1}, {"pci": "bogus", "node": 0}],
}


def test_everything_it_proposes_is_accepted_by_the_plugin_and_the_chart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A serial copied verbatim became a pattern matching every disk; `disk-` from a
    device named `-`; node names over 63 characters as configuration names: the
    proposal escapes, renames or leaves out, and says what it left out."""
    from numa_device_plugin.nodeconfig.configs import parse_node_configs
    from numa_device_plugin.topology.selectors import id_matches
    from tests.deployments.test_helm import CHART, RELEASE, of_kind, run_helm, serve_args

    long_node = "worker-" + "7" * 70 + ".example.com"
    disks: list[dict[str, Any]] = HOSTILE_INVENTORY["disks"]
    points = {**HOSTILE_INVENTORY, "disks": [{**d, "mountpoints": d.get("mountpoints", [])}
                                             for d in disks]}  # fmt: skip
    document = devices_document({long_node: {"inventory": points}, "b": {"inventory": points}})
    named = document["named"]
    (short,) = document["config_names"]
    assert document["config_names"][short] == long_node
    assert len(short) <= 63
    assert set(named) == {"b", short}
    near = named["b"]["near"]
    assert near["disk-sda"] == "serial:[*]"
    assert id_matches("*", "[*]")
    assert not id_matches("S-OTHER", "[*]")
    assert near["disk-sdb"] == "serial:WD-[[]AB][?]"
    assert {near["disk-a-b"], near["disk-a-b-2"]} == {"serial:S-DOT", "serial:S-DASHED"}
    assert "disk-" not in near
    assert "disk-sdz" not in near
    assert any("disk 'sdz'" in why for why in document["left_out"])
    values = {"config": {"named": named, "near": document["pool"].get("near", {})}}
    rendered = run_helm("template", RELEASE, str(CHART), "--namespace", "kube-system",
                        "--set-json", f"config={json.dumps(values['config'])}")  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    params = serve_args(documents, monkeypatch)
    text = of_kind(documents, "ConfigMap", f"{RELEASE}-node-configs")["data"]["configs.yaml"]
    configs = parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"), text, params)
    assert set(configs.configs) == set(named)
    pool = document["pool"]["near"]
    assert pool == {"mnt-my-disk": "path:/mnt/my\\040disk"}


def test_a_passed_deadline_exits_1_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pod list itself answers after 5 s: --timeout 1 ends the command at 1 s."""
    import time

    with cluster_api(tmp_path, [], [plugin_pod("p-a", "a")]) as (api, kubeconfig):
        api.list_delay = 5.0
        started = time.monotonic()
        code = main(["devices", "--kubeconfig", str(kubeconfig), "--timeout", "1"])
        took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "numa-device-plugin devices: not done within 1 s (--timeout)" in err
    assert took < 4


def test_two_plugin_pods_on_one_node_show_the_first_in_name_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rolling update's overlap: p-a and p-a2 on node a answer differently; the
    first in name order is shown, and said to be, whichever answers last."""
    pods = [plugin_pod("p-a2", "a"), plugin_pod("p-a", "a")]
    proxied = {"p-a": state(disk("vda", "FIRST", [0])), "p-a2": state(disk("vda", "SECOND", [1]))}
    with cluster_api(tmp_path, [], pods) as (api, kubeconfig):
        api.proxied.update(proxied)
        api.delays["p-a"] = 0.3  # the shown one answers last
        code = main(["devices", "--kubeconfig", str(kubeconfig), "--output", "json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "node a has 2 plugin pods (p-a, p-a2); shown: p-a\n" in err
    (node,) = json.loads(out)["nodes"]
    assert [d["serial"] for d in node["disks"]] == ["FIRST"]


@pytest.mark.parametrize(
    ("part", "value", "kind"),
    [("inventory", [], "list"), ("pod_resources", "x", "str"), ("near", {}, "dict")],
)
def test_a_plugin_pod_with_an_odd_debug_state_is_named_with_the_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str, value: object, kind: str
) -> None:
    pods = [plugin_pod("p-a", "a"), plugin_pod("p-b", "b")]
    proxied = {"p-a": {**state(disk("vda", "S1", [0])), part: value},
               "p-b": state(disk("vda", "S2", [0]))}  # fmt: skip
    code, out, err, _ = run(tmp_path, capsys, pods, proxied, "--output", "json")
    assert code == 0
    assert f"a (p-a): its /debug/state has {part} of type {kind}" in err
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["b"]


def test_the_fleets_readers_are_gone_when_the_read_returns(tmp_path: Path) -> None:
    """Every reader thread is joined before :func:`read_fleet` returns, the straggler's
    too: none is left to use the client after the command closed it."""
    import threading

    from numa_device_plugin.cluster.fleet import FleetRead, read_fleet
    from numa_device_plugin.cluster.kubeapi import KubeApi, load_client, total_deadline

    pods = [plugin_pod(f"p-{i}", f"n{i}") for i in range(6)]
    load_client()
    with cluster_api(tmp_path, [], pods) as (stub, kubeconfig):
        stub.proxied.update({f"p-{i}": state(disk("vda", f"S{i}", [0])) for i in range(6)})
        stub.delays["p-5"] = 0.4
        with total_deadline(30) as deadline:
            api = KubeApi(kubeconfig, deadline)
            try:
                assert read_fleet(api, "kube-system", [], 8080) == FleetRead()  # no pods
                before = set(threading.enumerate())
                read = read_fleet(api, "kube-system", [(f"p-{i}", f"n{i}") for i in range(6)],
                                  8080, readers=4)  # fmt: skip
                # the fleet's readers (a pool's threads), not the stand-in's handlers
                left = [t.name for t in threading.enumerate()
                        if t not in before and t.name.startswith("ThreadPoolExecutor")]  # fmt: skip
            finally:
                api.close()
    assert left == []
    assert sorted(read.states) == [f"n{i}" for i in range(6)]


def test_the_root_disks_other_mount_points_and_system_folders_are_never_proposed() -> None:
    """On every node: /data on the root filesystem's disk (the root disk is never a
    data disk), a data disk also mounted at /boot, /var/lib/kubelet and
    /var/lib/containerd (the system's folders): only the data disk's own mount point is
    proposed for the pool."""
    from numa_device_plugin.cli.proposal import propose

    def node(data: str) -> dict[str, list[dict[str, Any]]]:
        return {"disks": [
            mounted_disk("vda", "ROOT", 0, "/", "/data"),
            mounted_disk("vdb", data, 1, "/mnt/disks/a", "/boot", "/var/lib/kubelet",
                         "/var/lib/containerd", "/var/lib/kubelet/pods/x/volumes/v",
                         "/var/lib/k0s", "/var/snap/microk8s/common", "/var/lib/rancher"),
        ], "nics": [], "accelerators": []}  # fmt: skip

    found = propose({"a": node("DA"), "b": node("DB")})
    assert found["pool"] == {"near": {"mnt-disks-a": "path:/mnt/disks/a"}}


def test_a_proposal_past_the_plugins_limits_says_what_it_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More disks than a configuration may follow (MAX_NEAR), a hundred disks whose
    names all make one variable, two nodes whose configuration names clash: each named
    in ``left_out``, never proposed for the plugin to refuse."""
    from numa_device_plugin.cli import proposal
    from numa_device_plugin.plugin.model.near import MAX_NEAR

    def inventory(disks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        return {"disks": disks, "nics": [], "accelerators": []}

    many = [mounted_disk(f"sd{i:03}", f"S{i}", 0) for i in range(MAX_NEAR + 2)]
    found = proposal.propose({"a": inventory(many)})
    assert len(found["named"]["a"]["near"]) == MAX_NEAR
    assert [why for why in found["left_out"] if "entries" in why] == [
        f"a: disk 'sd{i:03}': over {MAX_NEAR} entries" for i in (MAX_NEAR, MAX_NEAR + 1)
    ]
    # Unreachable at today's limit (64 entries, 99 names a base): a limit raised past it
    monkeypatch.setattr(proposal, "MAX_NEAR", 1000)
    monkeypatch.setattr("numa_device_plugin.plugin.model.near.MAX_NEAR", 1000)
    alike = [mounted_disk("x" + "." * i, f"X{i}", 0) for i in range(101)]  # all disk-x
    found = proposal.propose({"a": inventory(alike)})
    assert len(found["named"]["a"]["near"]) == 99  # disk-x, disk-x-2 ... disk-x-99
    assert [why for why in found["left_out"] if "no free name" in why] == [
        f"a: disk {'x' + '.' * i!r}: no free name" for i in (99, 100)
    ]
    monkeypatch.setattr(proposal, "config_name", lambda node: "same")
    found = proposal.propose({"a": inventory(many[:1]), "b": inventory(many[1:2])})
    assert found["named"] == {"same": {"near": {"disk-sd000": "serial:S0"}}}
    assert "b: its configuration name same is taken" in found["left_out"]


def test_an_answer_of_too_many_objects_is_refused_unparsed_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lying pod's 4 MiB of ``[{},{}...]`` parsed was a million dicts (sixteen at once
    reached 1.7 GB): past MAX_CONTAINERS objects and arrays the answer is refused before
    parsing, and the pod named; the others are printed."""
    from numa_device_plugin.cluster import kubeapi

    monkeypatch.setattr(kubeapi, "MAX_CONTAINERS", 2000)
    pods = [plugin_pod("p-a", "a"), plugin_pod("p-b", "b")]
    liar = {"ready": True, "inventory": {"disks": [{}] * 3000, "nics": [], "accelerators": []}}
    proxied = {"p-a": liar, "p-b": state(disk("vda", "S2", [0]))}
    code, out, err, _ = run(tmp_path, capsys, pods, proxied, "--output", "json")
    assert code == 0
    assert "a (p-a): GET " in err
    assert "the answer holds over 2000 JSON objects and arrays" in err
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["b"]


def test_a_list_longer_than_the_plugin_makes_is_cut_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin lists at most MAX_LISTED devices of a kind: a longer list is a lie,
    its first MAX_LISTED entries are read and the cut is named."""
    from numa_device_plugin.cluster import fleet

    monkeypatch.setattr(fleet, "MAX_LISTED", 5)
    pods = [plugin_pod("p-a", "a")]
    many = state(*(disk(f"sd{i}", f"S{i}", [0]) for i in range(8)))
    code, out, err, _ = run(tmp_path, capsys, pods, {"p-a": many}, "--output", "json")
    assert code == 0
    assert "a (p-a): its /debug/state lists over 5 of inventory.disks (8): the first 5" in err
    (node,) = json.loads(out)["nodes"]
    assert [d["name"] for d in node["disks"]] == [f"sd{i}" for i in range(5)]


def test_a_plugin_that_has_not_read_its_devices_yet_is_named_and_the_pool_made_of_the_rest() -> (
    None
):
    """Just after start a plugin serves a null inventory (it reads the devices once
    registered): the pool proposal once came out empty with nothing said; now that node
    is named as not read yet, and the others' shared mount points are proposed."""

    def node(serial: str) -> dict[str, Any]:
        return {"ready": True, "inventory": {"disks": [
            mounted_disk("vda", f"ROOT-{serial}", 0, "/"),
            mounted_disk("vdb", serial, 1, "/mnt/disks/a"),
        ], "nics": [], "accelerators": []}}  # fmt: skip

    document = devices_document({"a": node("DA"), "b": node("DB"), "c": {"inventory": None}})
    assert document["pool"] == {"near": {"mnt-disks-a": "path:/mnt/disks/a"}}
    assert document["left_out"][0].startswith("c: its plugin has not read its devices yet")
    assert [n["name"] for n in document["nodes"]] == ["a", "b", "c"]
