"""One validation for chart and plugin: a hostile corpus of ``config.near``,
``config.named`` and interval values, each fed to ``helm template`` and to the plugin as
the chart feeds it (``NUMA_NEAR`` and the other variables to ``serve``'s command line,
``config.named`` as the file of named configurations), with the same verdict for every
entry. A value the plugin refuses at start and the chart let through stopped every node
at once (each pod exited 2); the chart refusing it stops ``helm install`` instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from numa_device_plugin.cli import serve
from numa_device_plugin.nodeconfig.configs import NodeConfigError, parse_node_configs
from numa_device_plugin.plugin.settings.config import config_from_params
from numa_device_plugin.topology import alphabet
from tests.deployments.test_helm import (
    CHART,
    RELEASE,
    env_of,
    of_kind,
    run_helm,
    serve_args,
)

LONG_NAME = "n" * 63

# (id, config values, whether the plugin and so the chart accept them)
CORPUS: list[tuple[str, dict[str, Any], bool]] = [
    ("path", {"near": {"data-a": "path:/mnt/disks/a"}}, True),
    ("path-below", {"near": {"es": "path-below:/var/lib/elasticsearch"}}, True),
    ("root", {"near": {"root": "path:/"}}, True),
    ("all-of", {"near": {"osd": ["path:/var/lib/ceph", "net:ens1"]}}, True),
    ("two-names-one-variable", {"near": {"data-a": "path:/a", "data_a": "path:/b"}}, False),
    ("dot-and-dash-one-variable", {"near": {"a.b": "net:x", "a-b": "net:y"}}, False),
    ("name-63", {"near": {LONG_NAME: "net:x"}}, True),
    ("name-64", {"near": {LONG_NAME + "n": "net:x"}}, False),
    ("name-numa-node", {"near": {"numa-1": "net:x"}}, False),
    ("name-leading-dash", {"near": {"-x": "net:x"}}, False),
    ("name-space", {"near": {"a b": "net:x"}}, False),
    ("serial-nbsp", {"near": {"d": "serial:S\u00a01"}}, False),
    ("serial-zero-width-space", {"near": {"d": "serial:S\u200b1"}}, False),
    ("serial-line-separator", {"near": {"d": "serial:S\u20281"}}, False),
    ("serial-soft-hyphen", {"near": {"d": "serial:S\u00ad1"}}, False),
    ("serial-escape", {"near": {"d": "serial:\x1b[31m"}}, False),
    ("serial-tab", {"near": {"d": "serial:S\t1"}}, False),
    ("serial-space", {"near": {"d": "serial:S 1"}}, False),
    ("serial-pattern", {"near": {"d": "serial:WD-[AB]?"}}, True),
    ("serial-unicode-letters", {"near": {"d": "serial:Ñandú-Ω1"}}, True),
    # assigned in Unicode 15 (Go's tables in helm), unassigned in the image's Python 3.11:
    # one pinned alphabet (topology/alphabet.py) accepts them on both sides
    ("serial-unicode-15-emoji", {"near": {"d": "serial:S\U0001fae81"}}, True),
    ("serial-unicode-15-kawi", {"near": {"d": "serial:S\U00011f001"}}, True),
    ("path-unicode-15-emoji", {"near": {"d": "path:/mnt/\U0001fae8"}}, True),
    ("serial-private-use", {"near": {"d": "serial:S\ue0001"}}, False),
    ("serial-replacement-character", {"near": {"d": "serial:S\ufffd1"}}, False),
    ("serial-byte-order-mark", {"near": {"d": "serial:\ufeffS1"}}, False),
    ("serial-right-to-left-override", {"near": {"d": "serial:S\u202e1"}}, False),
    ("serial-language-tag", {"near": {"d": "serial:S\U000e00411"}}, False),
    ("serial-noncharacter", {"near": {"d": "serial:S\U0001fffe"}}, False),
    ("path-egyptian-format-15", {"near": {"d": "path:/mnt/\U00013439"}}, False),
    ("wwid-nbsp", {"near": {"d": "wwid:eui.\u00a0"}}, False),
    ("path-nbsp", {"near": {"d": "path:/mnt/a\u00a0b"}}, False),
    ("path-line-separator", {"near": {"d": "path:/mnt/a\u2028b"}}, False),
    ("path-space", {"near": {"d": "path:/mnt/my disk"}}, False),
    ("path-escaped-space", {"near": {"d": "path:/mnt/my\\040disk"}}, True),
    ("path-escaped-tab", {"near": {"d": "path:/mnt/my\\011disk"}}, True),
    ("path-escaped-letter", {"near": {"d": "path:/mnt/\\101"}}, True),
    ("path-escaped-dots", {"near": {"d": "path:/mnt/\\056\\056/etc"}}, False),
    ("path-escaped-dot", {"near": {"d": "path:/mnt/\\056"}}, False),
    # a slash written \057 separates components too: these are ".." and "."
    ("path-escaped-slash-dots", {"near": {"d": "path:/a\\057..\\057b"}}, False),
    ("path-escaped-slash-dot", {"near": {"d": "path:/a\\057."}}, False),
    ("path-escaped-slash", {"near": {"d": "path:/a\\057b"}}, True),
    ("path-escaped-control", {"near": {"d": "path:/mnt/\\001"}}, False),
    ("path-escaped-delete", {"near": {"d": "path:/mnt/\\177"}}, False),
    ("path-escaped-c1", {"near": {"d": "path:/mnt/\\205"}}, False),
    ("path-escaped-nbsp", {"near": {"d": "path:/mnt/\\240"}}, False),
    ("path-escaped-soft-hyphen", {"near": {"d": "path:/mnt/\\255"}}, False),
    ("path-escaped-backslash", {"near": {"d": "path:/mnt/\\134001"}}, True),
    ("path-dotdot", {"near": {"d": "path:/mnt/../etc"}}, False),
    ("path-dotdot-name", {"near": {"d": "path:/mnt/..hidden"}}, True),
    ("path-below-relative", {"near": {"d": "path-below:var/lib"}}, False),
    ("path-long", {"near": {"d": "path:/" + "a" * 1023}}, True),
    ("path-too-long", {"near": {"d": "path:/" + "a" * 1024}}, False),
    # the same 1,024 characters of path after the longer kind's name
    ("path-below-long", {"near": {"d": "path-below:/" + "a" * 1023}}, True),
    ("path-below-too-long", {"near": {"d": "path-below:/" + "a" * 1024}}, False),
    ("unknown-kind", {"near": {"d": "disk:sda"}}, False),
    # NUMA_NEAR is space-separated: a comma made one path of two entries
    ("comma-joined-entries", {"near": {"ch": "path:/data/ch,kafka=net:ens1f0"}}, False),
    ("comma-joined-in-a-list", {"near": {"ch": ["net:a", "serial:S1,k=wwid:x"]}}, False),
    ("path-comma", {"near": {"d": "path:/data/a,b"}}, True),
    ("path-escaped-comma-and-equals", {"near": {"d": "path:/data/a\\054k=net:x"}}, True),
    ("all-of-8", {"near": {"d": [f"net:e{i}" for i in range(8)]}}, True),
    ("all-of-9", {"near": {"d": [f"net:e{i}" for i in range(9)]}}, False),
    ("near-64", {"near": {f"d{i}": "net:x" for i in range(64)}}, True),
    ("near-65", {"near": {f"d{i}": "net:x" for i in range(65)}}, False),
    ("device-interval-never", {"deviceInterval": 0}, True),
    ("device-interval-1", {"deviceInterval": 1}, True),
    ("device-interval-1e-9", {"deviceInterval": 1e-9}, False),
    ("device-interval-half", {"deviceInterval": 0.5}, False),
    ("device-interval-negative", {"deviceInterval": -1}, False),
    ("pod-resources-interval-floor", {"podResourcesInterval": 0.1}, True),
    ("pod-resources-interval-below", {"podResourcesInterval": 0.05}, False),
    ("named", {"named": {"a": {"near": {"d": ["net:a", "path-below:/b"]}}}}, True),
    ("named-two-names-one-variable",
     {"named": {"a": {"near": {"data-a": "path:/x", "data_a": "path:/y"}}}}, False),
    ("named-zero-width-space", {"named": {"a": {"near": {"d": "serial:S\u200b1"}}}}, False),
    ("named-escaped-dots", {"named": {"a": {"near": {"d": "path:/\\056\\056"}}}}, False),
    ("named-pod-resources-interval", {"named": {"a": {"podResourcesInterval": 0.01}}}, False),
]  # fmt: skip


def plugin_accepts(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether serve starts with ``values`` as the chart hands them over: config.near as
    NUMA_NEAR (NAME=SELECTOR, space-separated, a list's NAME repeated), intervals as
    their NUMA_* variables, config.named as the file of named configurations."""
    for variable in {p.envvar for p in serve.command.params if isinstance(p.envvar, str)}:
        monkeypatch.delenv(variable, raising=False)
    near = [
        f"{name}={selector}"
        for name, given in values.get("near", {}).items()
        for selector in (given if isinstance(given, list) else [given])
    ]
    if near:
        monkeypatch.setenv("NUMA_NEAR", " ".join(near))
    for key, variable in (("deviceInterval", "NUMA_DEVICE_INTERVAL"),
                          ("podResourcesInterval", "NUMA_POD_RESOURCES_INTERVAL")):  # fmt: skip
        if key in values:
            monkeypatch.setenv(variable, str(values[key]))
    try:
        with serve.command.make_context("serve", []) as ctx:
            params = ctx.params
        config_from_params(params)
        if "named" in values:
            keys = {"near": "near", "podResourcesInterval": "pod-resources-interval"}
            configs = {
                name: {keys[key]: value for key, value in settings.items()}
                for name, settings in values["named"].items()
            }
            text = yaml.safe_dump({"configs": configs}, allow_unicode=True)
            parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"), text, params)
    except (click.ClickException, ValueError, NodeConfigError):
        return False
    return True


@pytest.mark.parametrize(
    ("values", "accepted"), [(v, a) for _, v, a in CORPUS], ids=[i for i, _, _ in CORPUS]
)
def test_the_chart_and_the_plugin_give_one_verdict(
    values: dict[str, Any], accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert plugin_accepts(values, monkeypatch) == accepted, "the plugin's verdict"
    rendered = run_helm("template", RELEASE, str(CHART), "--namespace", "kube-system",
                        "--set-json", f"config={json.dumps(values)}")  # fmt: skip
    assert (rendered.returncode == 0) == accepted, rendered.stderr[-600:]
    if not accepted:  # said as the plugin would, never a bare "'not' failed"
        assert "'not' failed" not in rendered.stderr, rendered.stderr
        assert "got string, want array" not in rendered.stderr, rendered.stderr
    if accepted:  # and what the chart renders is what the plugin was given
        documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        params = serve_args(documents, monkeypatch)
        config = config_from_params(params)
        if "near" in values:
            assert sorted(n.name for n in config.near) == sorted(values["near"])
        if "named" in values:
            text = of_kind(documents, "ConfigMap", f"{RELEASE}-node-configs")["data"]
            parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"),
                               text["configs.yaml"], params)  # fmt: skip


def test_the_charts_selector_alphabet_is_the_plugins_refused_list() -> None:
    """The schema's character class for a serial, a wwid and a path is written from
    alphabet.REFUSED (both its places), not from a Unicode version's tables."""
    schema = (CHART / "values.schema.json").read_text(encoding="utf-8")
    written = json.loads(schema)
    text = json.dumps(written, ensure_ascii=False)
    assert text.count(json.dumps(alphabet.schema_class(), ensure_ascii=False)[1:-1]) == 2
    assert "\\p{" not in text


@pytest.mark.parametrize(
    ("values", "mounted"),
    [
        ({}, False),
        ({"config": {"near": {"d": "net:eth0"}}}, False),
        ({"config": {"near": {"d": "path:/mnt/disks/a"}}}, True),
        ({"config": {"near": {"d": ["net:eth0", "path-below:/data"]}}}, True),
        ({"config": {"named": {"a": {"near": {"d": "path:/x"}}}}}, True),
        ({"host": {"mountTable": True}}, True),
        ({"host": {"mountTable": False}, "config": {"near": {"d": "net:eth0"}}}, False),
    ],
)
def test_a_path_selector_mounts_the_hosts_mount_table_unless_refused(
    values: dict[str, Any], mounted: bool
) -> None:
    """path: in the DaemonSet without the host's table read the container's own
    (overlay at /) and advertised nothing: the chart mounts it when a selector needs it."""
    args = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
    rendered = run_helm("template", RELEASE, str(CHART), *args)
    assert rendered.returncode == 0, rendered.stderr
    variables = env_of([d for d in yaml.safe_load_all(rendered.stdout) if d])
    assert (variables.get("NUMA_MOUNT_TABLE") == "/host/proc/1/mountinfo") == mounted
    assert ("path: /proc/1/mountinfo" in rendered.stdout) == mounted


@pytest.mark.parametrize(
    ("values", "host_sys"),
    [
        ({}, False),
        ({"config": {"near": {"d": "path:/mnt/disks/a"}}}, False),
        ({"config": {"near": {"kafka": "net:ens1f0"}}}, True),
        ({"config": {"near": {"osd": ["path:/var/lib/ceph", "net:ens1"]}}}, True),
        ({"config": {"named": {"a": {"near": {"nic": "net:ib0"}}}}}, True),
        ({"host": {"sysfs": True}}, True),
        ({"host": {"sysfs": False}, "config": {"near": {"d": "serial:S1"}}}, False),
    ],
)
def test_a_net_selector_reads_the_hosts_sysfs_unless_refused(
    values: dict[str, Any], host_sys: bool
) -> None:
    """net: against the container's /sys saw only the pod's own interfaces: never
    advertised, every pod Pending. The chart mounts the host's /sys when a selector
    needs it, as it does the mount table for path:."""
    args = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
    rendered = run_helm("template", RELEASE, str(CHART), *args)
    assert rendered.returncode == 0, rendered.stderr
    variables = env_of([d for d in yaml.safe_load_all(rendered.stdout) if d])
    assert variables["NUMA_SYSFS_ROOT"] == ("/host/sys" if host_sys else "/sys")
    assert ("mountPath: /host/sys" in rendered.stdout) == host_sys


def test_a_net_selector_with_the_hosts_sysfs_turned_off_fails_naming_both() -> None:
    rendered = run_helm("template", RELEASE, str(CHART), "--set", "host.sysfs=false",
                        "--set-json", 'config.near={"kafka": "net:ens1f0"}')  # fmt: skip
    assert rendered.returncode != 0
    assert "host.sysfs is false, but config.near.kafka selects a network interface" in (
        rendered.stderr
    )


def test_a_path_selector_with_the_mount_table_turned_off_fails_naming_both() -> None:
    rendered = run_helm(
        "template", RELEASE, str(CHART), "--set", "host.mountTable=false",
        "--set-json", 'config.named={"rack-a": {"near": {"data-a": "path:/mnt/disks/a"}}}',
    )  # fmt: skip
    assert rendered.returncode != 0
    assert "host.mountTable is false, but config.named.rack-a.near.data-a" in rendered.stderr


@pytest.mark.parametrize(("value", "rendered"), [(None, None), (0, "0"), (1, "1"), (90.5, "90.5")])
def test_the_device_interval_reaches_the_plugin_zero_included(
    value: float | None, rendered: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0 is "never", not "unset": it must not fall back to the default of 60."""
    result = run_helm("template", RELEASE, str(CHART), "--namespace", "kube-system",
                      "--set-json", f"config.deviceInterval={json.dumps(value)}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert of_kind(documents, "ConfigMap")["data"].get("NUMA_DEVICE_INTERVAL") == rendered
    config = config_from_params(serve_args(documents, monkeypatch))
    assert config.device_interval == (60 if value is None else value)


def test_the_devices_proposal_pasted_as_values_reaches_the_plugin_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubectl numa devices`' YAML, pasted as the chart's values: each name's selectors
    in a list (a second one goes there, not under a second key YAML would drop), and the
    plugin given every one of them."""
    from numa_device_plugin.cli.devices import render_devices

    document = {
        "nodes": [],
        "pool": {"near": {"data-ch": "path:/data/ch", "data-kafka": "path:/data/kafka"}},
        "named": {"n1": {"near": {"nic-ens1f0": "net:ens1f0"}}},
        "config_names": {},
        "left_out": [],
    }
    text = render_devices(document)
    pool = yaml.safe_load(text[text.index("# One configuration") :].partition("\n\n")[0])
    assert pool["config"]["near"]["data-ch"] == ["path:/data/ch"]
    pool["config"]["near"]["data-ch"].append("net:ens1f0")  # the second selector, in the list
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(pool))
    rendered = run_helm("template", RELEASE, str(CHART), "--namespace", "kube-system",
                        "--values", str(values))  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    config = config_from_params(serve_args(documents, monkeypatch))
    assert {n.name: [str(s) for s in n.selectors] for n in config.near} == {
        "data-ch": ["path:/data/ch", "net:ens1f0"], "data-kafka": ["path:/data/kafka"],
    }  # fmt: skip
