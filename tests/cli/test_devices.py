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
    table, _, named = out.partition("\n\n")
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["NODE", "NUMA", "KIND", "NAME", "ID", "MODEL", "SIZE", "PCI", "DRIVER"]
    assert ["a", "1", "disk", "vda", "DISK-A", "QEMU", "16M", "0000:41:00.0", "-"] in rows
    assert rows[2][:5] == ["a", "0", "disk", "vdb", "eui.vdb"]
    assert ["a", "1", "nic", "eth0", "-", "-", "-", "0000:81:00.0", "virtio_net"] in rows
    assert yaml.safe_load(named) == {"config": {"named": {
        "a": {"near": {"disk-vda": "serial:DISK-A", "disk-vdb": "wwid:eui.vdb",
                       "nic-eth0": "net:eth0"}},
        "b": {"near": {"disk-vda": "serial:DISK-B"}},  # md0 spans two nodes: none
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


def test_a_hostile_inventory_is_shown_without_a_crash() -> None:
    """Fields of the wrong type or missing: cells show '-', no selector is made."""
    document = devices_document({"a": {"inventory": {
        "disks": [{"name": "x y", "nodes": "1", "serial": "with space"}, "junk", {}],
        "nics": [{"nodes": [0]}], "accelerators": [{"node": "0", "pci": "0000:00:01.0"}],
    }}})  # fmt: skip
    assert document["named"] == {}
    assert len(document["nodes"][0]["disks"]) == 2


def test_kubectl_numa_devices_runs_devices_and_anything_else_runs_top(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.cli.top import kubectl_main

    for argv, usage in ((["devices", "--help"], "Usage: numa-device-plugin devices"),
                        (["--help"], "Usage: numa-device-plugin top")):  # fmt: skip
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
