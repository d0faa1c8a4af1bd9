"""The Helm chart, offline: `helm lint --strict`, every rendering valid for the
Kubernetes API (kubernetes-validate --strict, 1.28 and the newest schema), the schema
refusing bad values, each kubelet flavour keeping hostPath, mount and --socket-dir in
step, and the defaults rendering what `kubectl apply -k deployments/` applies.

helm comes from PATH or `.venv/bin/helm` (`make helm` puts it there); without it the
tests skip, or, under CI, fail."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from numa_device_plugin import __version__
from numa_device_plugin.cli import options, serve
from numa_device_plugin.nodeconfig.configs import parse_node_configs
from tests.conftest import REPO, load_script, venv_tool
from tests.deployments.test_deployments import KUBERNETES_VERSIONS, check_pod_monitor, render

CHART = REPO / "deployments" / "helm" / "numa-device-plugin"
RELEASE = "numa-device-plugin"
FLAVOURS = {
    "standard": "/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "custom": "/data/kubelet",
}
# Renderings each test set covers: name -> --set arguments.
RENDERINGS: dict[str, list[str]] = {
    "defaults": [],
    **{f"flavour-{name}": ["--set", f"kubelet.flavour={name}"] for name in FLAVOURS},
    "nfd": ["--set", "nfd.enabled=true"],
    "monitoring": ["--set", "podMonitor.enabled=true"],
    "memory": [
        *("--set", "config.memoryUnit=1Gi"),
        *("--set", "config.reservedMemory=0:memory=1Gi;1:memory=2Gi"),
    ],
    "cpus": [
        *("--set", "config.capacity=cpus", "--set", "config.reservedCpus=0-1"),
        # --set reads floats as strings: --set-json gives the number.
        *("--set-json", "config.podResourcesInterval=2.5", "--set", "config.allowUnaligned=true"),
    ],
    "no-metrics": ["--set", "config.metricsPort=0"],
    "host-views": [
        *("--set", "host.sysfs=true", "--set", "host.mountTable=true"),
        *("--set-json", "config.deviceInterval=5"),
    ],
    "per-node": [
        "--set-json",
        'config.named={"exact": {"capacity": "cpus", "reservedCpus": "0-1",'
        ' "podResourcesInterval": 0.5}, "small": {"capacity": 10}, "plain": {}}',
        *("--set", "config.default=small"),
    ],
}
RENDERINGS["flavour-custom"] += ["--set", "kubelet.root=/data/kubelet"]


def helm() -> str:
    return venv_tool("helm")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=60)


def template(*args: str) -> list[dict[str, Any]]:
    result = run_helm("template", RELEASE, str(CHART), "--namespace", "kube-system", *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def of_kind(documents: list[dict[str, Any]], kind: str, name: str = RELEASE) -> dict[str, Any]:
    """The one object of ``kind``; where there are several (ConfigMaps), the one ``name``."""
    found = [d for d in documents if d["kind"] == kind]
    if len(found) > 1:
        found = [d for d in found if d["metadata"]["name"] == name]
    (only,) = found
    return only


def container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = of_kind(documents, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = only
    return found


def test_helm_lint_strict() -> None:
    result = run_helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", list(RENDERINGS))
def test_every_rendering_passes_kubernetes_validate_strict(name: str, version: str) -> None:
    documents = template(*RENDERINGS[name])
    assert {"DaemonSet", "ServiceAccount", "ConfigMap"} <= {d["kind"] for d in documents}
    for document in documents:
        if document["kind"] == "PodMonitor":
            check_pod_monitor(document)
            continue
        kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "config.capacity=lots"], "capacity"),
        (["--set", "config.capacity=0"], "capacity"),
        (["--set", "config.capacity=10001"], "capacity"),
        (["--set", "surprise=1"], "surprise"),
        (["--set", "config.bogus=1"], "bogus"),
        (["--set", "kubelet.flavour=k3s"], "flavour"),
        (["--set", "kubelet.flavour=custom"], "root"),
        (["--set", "kubelet.flavour=custom", "--set", "kubelet.root=relative"], "root"),
        (["--set", "config.reservedCpus=zero"], "reservedCpus"),
        (["--set-json", "config.podResourcesInterval=0.01"], "podResourcesInterval"),
        (["--set-json", "config.nodeConfigInterval=0"], "nodeConfigInterval"),
        (["--set", "config.nodeConfigInterval=soon"], "nodeConfigInterval"),
        (["--set", "config.metricsPort=9202"], "metricsPort"),
        (["--set", "config.logLevel=loud"], "logLevel"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "monitoring.alerts.enabled=yes"], "enabled"),
        (["--set", "monitoring.alerts.sound=loud"], "sound"),
        (["--set-json", 'monitoring.alerts.labels={"release": 1}'], "release"),
        (["--set-json", 'config.named={"a": {"capacity": "all"}}'], "capacity"),
        (["--set-json", 'config.named={"a": {"logLevel": "debug"}}'], "logLevel"),
        (["--set-json", 'config.named={"-a": {}}'], "-a"),
        (["--set-json", 'config.named={"a": {"podResourcesInterval": 0}}'], "podResources"),
        (["--set", "config.memoryUnit=1.5Gi"], "memoryUnit"),
        (
            ["--set", "config.memoryUnit=1Gi", "--set", "config.reservedMemory=memory"],
            "reservedMemory",
        ),
        (["--set-json", 'config.named={"a": {"memoryUnit": ""}}'], "memoryUnit"),
        # The plugin's floor is 1Mi (tests/plugin/test_memory_sizing.py compares every rule).
        (["--set-string", "config.memoryUnit=0"], "memoryUnit"),
        (["--set", "config.memoryUnit=512Ki"], "memoryUnit"),
        (["--set", "config.memoryUnit=1M"], "memoryUnit"),
        (["--set-json", 'config.named={"a": {"memoryUnit": "1048575"}}'], "memoryUnit"),
        (["--set-json", 'config.near={"data-disk": "sn:S1"}'], "data-disk"),
        (["--set", "config.anyResource=yes"], "anyResource"),
        (["--set", "config.anyResource=true"], "anyResource"),
        (["--set-json", 'config.named={"a": {"anyResource": "ON"}}'], "anyResource"),
        (["--set", "config.socketResources=yes"], "socketResources"),
        (["--set-json", 'config.named={"a": {"socketResources": 1}}'], "socketResources"),
        (["--set-json", 'config.near={"nic": ["net:x", "scope:rack"]}'], "scope:rack"),
        (["--set-json", 'config.near={"d": 1}'], "near"),
        (["--set-json", 'config.named={"a": {"near": {"d": "block:"}}}'], "near"),
    ],
)
def test_the_schema_refuses_bad_values(args: list[str], needle: str) -> None:
    result = run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0, f"{args} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert needle in result.stderr


@pytest.mark.parametrize("unit", ["1Mi", "1Pi", "1024Ki", "2M", "1048576", "1E"])
def test_the_schema_accepts_the_sizes_the_plugin_accepts(unit: str) -> None:
    result = run_helm("template", RELEASE, str(CHART), "--set-string", f"config.memoryUnit={unit}")
    assert result.returncode == 0, result.stderr
    assert f'NUMA_MEMORY_UNIT: "{unit}"' in result.stdout


def test_nfd_and_own_node_affinity_cannot_be_mixed() -> None:
    own = '{"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}'
    result = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--set",
        "nfd.enabled=true",
        "--set-json",
        f"affinity={own}",
    )
    assert result.returncode != 0
    assert "leave affinity.nodeAffinity out" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set-json", 'extraArgs=["--sysfs-root=/host/sys"]'], '"--sysfs-root=/host/sys"'),
        (["--set-json", 'extraArgs=["--socket-dir", "/x"]'], '"--socket-dir" overrides'),
        (["--set-json", 'extraArgs=["--health-address="]'], '"--health-address=" overrides'),
        (["--set-json", 'extraEnv=[{"name": "NUMA_NEAR", "value": "d=block:sda"}]'], "NUMA_NEAR"),
        (["--set-json", 'extraEnv=[{"name": "MALLOC_ARENA_MAX", "value": "8"}]'], "MALLOC_ARENA"),
        (["--set-json", 'podAnnotations={"checksum/config": "x"}'], '"checksum/config"'),
    ],
)
def test_values_that_would_break_every_node_fail_the_rendering_naming_the_value(
    args: list[str], needle: str
) -> None:
    result = run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0, f"{args} was accepted"
    assert needle in result.stderr


@pytest.mark.parametrize(
    "selector",
    [
        "pci-class:zz", "pci-id:1:2", "block:a/b", "pci:0000:41:00.8", "net:", "wwid:a b",
        "serial:\x1b[31m", "pci:100000000:01:00.0", "pci-class:0108020", "disk:sda",
        "block:nvme0n1", "serial:S3EVNX0K123", "wwid:eui.0025", "net:ib0", "pci:10000:01:00.0",
        "pci:0000:4A:00.0", "pci-id:0x15B3:101d", "pci-class:0x0108", "pci-class:02",
        "path:/mnt/disks/a", "path:/var/lib/elasticsearch/", "path:/", "path:relative",
        "path:/mnt/../etc", "path:/mnt/.", "path:/mnt/..hidden", "path:/" + "a" * 1024,
        "path:/" + "a" * 1023,
    ],
)  # fmt: skip
def test_the_schemas_selector_grammar_is_the_plugins(selector: str) -> None:
    """A selector the plugin refuses rendered, then every pod exited 2 (CrashLoopBackOff
    on every node): the chart accepts exactly what parse_selector does, alone and in a
    list of selectors that must all agree (more in test_one_validation's corpus)."""
    import json

    from numa_device_plugin.topology.selectors import parse_selector

    schema = json.loads((CHART / "values.schema.json").read_text())
    selectors = schema["definitions"]["selectors"]
    near = schema["properties"]["config"]["properties"]["near"]
    assert near["additionalProperties"] == {"$ref": "#/definitions/selectors"}
    # a list of selectors that must all agree: each the same as one alone
    assert selectors["then"] == selectors["else"]["items"] == {"$ref": "#/definitions/selector"}
    try:
        parse_selector(selector)
        accepted = True
    except ValueError:
        accepted = False
    result = run_helm("template", RELEASE, str(CHART), "--set-json",
                      f"config.near={json.dumps({'d': selector})}")  # fmt: skip
    assert (result.returncode == 0) == accepted, result.stderr[-400:]
    listed_result = run_helm("template", RELEASE, str(CHART), "--set-json",
                             f"config.near={json.dumps({'d': ['net:ib0', selector]})}")  # fmt: skip
    assert (listed_result.returncode == 0) == accepted
    if not accepted:  # named: by the schema, or by the templates in the plugin's words
        for refused in (result, listed_result):
            assert "/config/near/d" in refused.stderr or "config.near.d: " in refused.stderr
            assert "'not' failed" not in refused.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "config.default=a"], "config.default needs config.named"),
        # the names and path rules the schema's 'not' gave as "'not' failed", nowhere:
        # the templates say them in the plugin's words
        (
            ["--set-json", 'config.near={"numa-1": "serial:S1"}'],
            'config.near: "numa-1" would collide with the NUMA-node resources numa-<id>',
        ),
        (
            ["--set-json", 'config.near={"any": "serial:S1"}'],
            'config.near: "any" would collide with the resource any',
        ),
        (
            ["--set-json", 'config.named={"a": {"near": {"any-memory": "serial:S1"}}}'],
            'config.named.a.near: "any-memory" would collide with the resource any',
        ),
        (
            ["--set-json", 'config.near={"d": "path:/mnt/../etc"}'],
            'config.near.d: "path:/mnt/../etc": an absolute host path without . or ..',
        ),
        (
            ["--set-json", 'config.near={"d": ["net:x", "path:/a\\\\001"]}'],
            "an escape decodes to a control character",
        ),
        (
            ["--set-json", 'config.near={"disk": "sda"}'],
            "'sda' does not match pattern '^(block|serial|wwid|net|pci|pci-id|pci-class|path|"
            "path-below|scope):'",
        ),
        (
            ["--set-json", 'config.named={"z": {}, "a": {}}', "--set", "config.default=b"],
            'config.default "b" names no configuration in config.named (it has a, z)',
        ),
        (
            # reservedCpus inherited from the settings above, capacity made slots here
            [*RENDERINGS["cpus"], "--set-json", 'config.named={"a": {"capacity": 5}}'],
            'config.named.a: reservedCpus "0-1" need capacity "cpus"',
        ),
        (
            ["--set-json", 'config.named={"a": {"capacity": 5, "reservedCpus": "0"}}'],
            'config.named.a: reservedCpus "0" need capacity "cpus" (it has 5)',
        ),
        # Issue 38's trap 6: the schema said "at '/config/capacity': value must be 'cpus'".
        (
            ["--set-string", "config.reservedCpus=0"],
            'config.reservedCpus "0" needs config.capacity "cpus" (it is 100)',
        ),
        (
            ["--set", "config.reservedMemory=0:memory=1Gi"],
            'config.reservedMemory "0:memory=1Gi" needs config.memoryUnit',
        ),
        (
            ["--set", "config.anyResource=on"],
            'config.anyResource "on" needs config.capacity "cpus" (it is 100)',
        ),
        (
            ["--set", "config.socketResources=on"],
            'config.socketResources "on" needs config.capacity "cpus" (it is 100)',
        ),
        (
            ["--set-json", 'config.near={"socket-1": "net:x"}'],
            'config.near: "socket-1" would collide with the socket resources socket-<id>',
        ),
        (
            ["--set-json", 'config.named={"a": {"near": {"nic": ["scope:socket"]}}}'],
            "config.named.a.near.nic: a scope names no device: give a selector too",
        ),
    ],
)
def test_values_that_cannot_work_together_fail_the_rendering_naming_both(
    args: list[str], needle: str
) -> None:
    result = run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0, f"{args} was accepted"
    assert needle in result.stderr


def test_per_node_configuration_reaches_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = template(*RENDERINGS["per-node"])
    params = serve_args(documents, monkeypatch)
    path = Path("/etc/numa-device-plugin/configs.yaml")
    assert params["config_file"] == path
    text = of_kind(documents, "ConfigMap", f"{RELEASE}-node-configs")["data"]["configs.yaml"]
    configs = parse_node_configs(path, text, params)
    assert configs.default == "small"
    assert configs.configs == {
        "exact": {"capacity": "cpus", "reserved_cpus": {0, 1}, "pod_resources_interval": 0.5},
        "small": {"capacity": 10},
        "plain": {},
    }
    spec = of_kind(documents, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in container(documents)["env"]}
    assert env["NUMA_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (mount,) = [m for m in container(documents)["volumeMounts"] if m["name"] == "node-configs"]
    assert (mount["mountPath"], mount["subPath"]) == (str(path), "configs.yaml")
    (volume,) = [v for v in spec["volumes"] if v["name"] == "node-configs"]
    assert volume["configMap"]["name"] == f"{RELEASE}-node-configs"
    role = of_kind(documents, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = of_kind(documents, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "kube-system"}
    ]
    # Without named configurations: no token, no API access, no file.
    plain = template()
    assert (
        of_kind(plain, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is False
    )
    assert not {"ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in plain}
    assert "NUMA_CONFIG_FILE" not in of_kind(plain, "ConfigMap")["data"]


def test_the_node_label_interval_is_set_only_with_named_configurations() -> None:
    named = ("--set-json", 'config.named={"a": {}}')
    settings = of_kind(template(*named), "ConfigMap")["data"]
    assert "NUMA_NODE_CONFIG_INTERVAL" not in settings, "the plugin's default: 60 s"
    quick = template(*named, "--set-json", "config.nodeConfigInterval=1.5")
    assert of_kind(quick, "ConfigMap")["data"]["NUMA_NODE_CONFIG_INTERVAL"] == "1.5"
    alone = template("--set-json", "config.nodeConfigInterval=1.5")
    assert "NUMA_NODE_CONFIG_INTERVAL" not in of_kind(alone, "ConfigMap")["data"]


def test_a_named_configuration_change_rolls_the_pods() -> None:
    def checksum(named: str) -> str:
        documents = template("--set-json", f"config.named={named}")
        metadata = of_kind(documents, "DaemonSet")["spec"]["template"]["metadata"]
        value: str = metadata["annotations"]["checksum/node-configs"]
        return value

    assert checksum('{"a": {"capacity": 5}}') == checksum('{"a": {"capacity": 5}}')
    assert checksum('{"a": {"capacity": 5}}') != checksum('{"a": {"capacity": 6}}')


def serve_args(documents: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The rendered DaemonSet's command line, ConfigMap and variables, parsed by the CLI
    as the image runs them (a bad value exits 2 here); the host's /sys mounted at
    /host/sys is this machine's /sys."""
    for variable in {p.envvar for p in serve.command.params if isinstance(p.envvar, str)}:
        monkeypatch.delenv(variable, raising=False)
    for key, value in of_kind(documents, "ConfigMap")["data"].items():
        monkeypatch.setenv(key, value)
    for key, value in env_of(documents).items():  # beats the ConfigMap, as in a pod
        monkeypatch.setenv(key, "/sys" if value == "/host/sys" else value)
    with serve.command.make_context("serve", list(container(documents).get("args", []))) as ctx:
        return ctx.params


def env_of(documents: list[dict[str, Any]]) -> dict[str, str]:
    """The plugin container's own variables with a value (``env``, not ``envFrom``)."""
    return {e["name"]: e["value"] for e in container(documents).get("env", []) if "value" in e}


def test_the_host_views_mount_read_only_and_reach_the_plugins_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host.sysfs: the host's /sys (its network namespace's interfaces, for net:);
    host.mountTable: the host's mount table (for path:). Neither by default."""
    documents = template(*RENDERINGS["host-views"])
    spec = of_kind(documents, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v.get("hostPath") for v in spec["volumes"]}
    assert volumes["host-sys"] == {"path": "/sys", "type": "Directory"}
    assert volumes["host-mounts"] == {"path": "/proc/1/mountinfo", "type": "File"}
    mounts = {m["name"]: m for m in container(documents)["volumeMounts"]}
    assert mounts["host-sys"] == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    assert mounts["host-mounts"]["mountPath"] == "/host/proc/1/mountinfo"
    assert mounts["host-mounts"]["readOnly"] is True
    variables = env_of(documents)  # variables: every subcommand in the pod reads them
    assert variables["NUMA_SYSFS_ROOT"] == "/host/sys"
    assert variables["NUMA_MOUNT_TABLE"] == "/host/proc/1/mountinfo"
    assert serve_args(documents, monkeypatch)["mount_table"] == Path("/host/proc/1/mountinfo")
    default = template()
    assert not {"host-sys", "host-mounts"} & {v["name"] for v in of_kind(default, "DaemonSet")[
        "spec"]["template"]["spec"]["volumes"]}  # fmt: skip
    assert serve_args(default, monkeypatch)["sysfs_root"] == Path("/sys")


def test_the_cgroup_view_is_on_by_default_read_only_and_off_with_host_cgroups_false(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host.cgroups (default true): the host's /sys/fs/cgroup read-only and --cgroup-root
    at it; false: neither (the API read every interval)."""
    default = template()
    spec = of_kind(default, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v.get("hostPath") for v in spec["volumes"]}
    assert volumes["host-cgroup"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    mounts = {m["name"]: m for m in container(default)["volumeMounts"]}
    assert mounts["host-cgroup"] == {"name": "host-cgroup", "mountPath": "/host/cgroup",
                                     "readOnly": True}  # fmt: skip
    assert serve_args(default, monkeypatch)["cgroup_root"] == Path("/host/cgroup")
    off = template("--set", "host.cgroups=false")
    spec = of_kind(off, "DaemonSet")["spec"]["template"]["spec"]
    assert "host-cgroup" not in {v["name"] for v in spec["volumes"]}
    assert "host-cgroup" not in {m["name"] for m in container(off)["volumeMounts"]}
    assert serve_args(off, monkeypatch)["cgroup_root"] is None


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_each_flavour_moves_host_folder_mount_and_flag_together(
    flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(FLAVOURS[flavour])
    documents = template(*RENDERINGS[f"flavour-{flavour}"])
    spec = of_kind(documents, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert volumes == {
        "device-plugins": {"path": str(root / "device-plugins"), "type": "Directory"},
        "pod-resources": {"path": str(root / "pod-resources"), "type": "Directory"},
        "host-cgroup": {"path": "/sys/fs/cgroup", "type": "Directory"},
    }
    mounts = {m["name"]: m["mountPath"] for m in container(documents)["volumeMounts"]}
    assert mounts["device-plugins"] == str(root / "device-plugins")
    assert mounts["pod-resources"] == str(root / "pod-resources")
    config = options.config_from_params(serve_args(documents, monkeypatch))
    assert config.socket_dir == root / "device-plugins"
    assert config.pod_resources_path == root / "pod-resources" / "kubelet.sock"


def test_every_setting_reaches_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = template(*RENDERINGS["cpus"], "--set", "config.logLevel=debug")
    params = serve_args(documents, monkeypatch)
    config = options.config_from_params(params)
    assert config.capacity == "cpus"
    assert config.reserved_cpus == {0, 1}
    assert config.pod_resources_interval == 2.5
    assert config.allow_unaligned is True
    assert params["log_level"] == "debug"
    assert params["metrics_address"] == ":9201"
    no_metrics = template(*RENDERINGS["no-metrics"])
    assert "NUMA_METRICS_ADDRESS" not in of_kind(no_metrics, "ConfigMap")["data"]
    assert all(d["kind"] != "Service" for d in no_metrics)


@pytest.mark.parametrize(
    ("args", "env", "serves_any"),
    [
        ([], None, False),  # auto, slots
        (["--set", "config.capacity=cpus"], None, True),  # auto, cpus: the default
        (["--set", "config.capacity=cpus", "--set", "config.anyResource=off"], "off", False),
        (["--set", "config.capacity=cpus", "--set", "config.anyResource=on"], "on", True),
    ],
)
def test_any_resource_reaches_the_plugin(
    args: list[str], env: str | None, serves_any: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = template(*args)
    assert of_kind(documents, "ConfigMap")["data"].get("NUMA_ANY_RESOURCE") == env
    config = options.config_from_params(serve_args(documents, monkeypatch))
    assert config.serves_any is serves_any


@pytest.mark.parametrize(
    ("args", "env", "serves_sockets"),
    [
        (["--set", "config.capacity=cpus"], None, True),
        (["--set", "config.capacity=cpus", "--set", "config.socketResources=off"], "off", False),
        (["--set", "config.socketResources=off"], "off", False),
    ],
)
def test_socket_resources_and_a_socket_scope_reach_the_plugin(
    args: list[str], env: str | None, serves_sockets: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = template(*args, "--set-json", 'config.near={"nic": ["net:ens1f0", "scope:socket"]}')
    assert of_kind(documents, "ConfigMap")["data"].get("NUMA_SOCKET_RESOURCES") == env
    config = options.config_from_params(serve_args(documents, monkeypatch))
    assert config.serves_sockets is serves_sockets
    (nic,) = config.near
    assert (str(nic), nic.scope) == ("nic=net:ens1f0 & scope:socket", "socket")


def test_any_resource_of_a_named_configuration_reaches_the_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configs_json = (
        '{"plain": {"anyResource": "off", "socketResources": "off"}, "slots": {"capacity": 4}}'
    )
    named = template("--set", "config.capacity=cpus", "--set-json", f"config.named={configs_json}")
    text = of_kind(named, "ConfigMap", f"{RELEASE}-node-configs")["data"]["configs.yaml"]
    params = serve_args(named, monkeypatch)
    configs = parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"), text, params)
    assert configs.configs == {
        "plain": {"any_resource": "off", "socket_resources": "off"},
        "slots": {"capacity": 4},
    }


def test_memory_settings_reach_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = template(*RENDERINGS["memory"])
    config = options.config_from_params(serve_args(documents, monkeypatch))
    assert config.memory_unit == 2**30
    assert config.reserved_memory == ((0, "memory", 2**30), (1, "memory", 2 * 2**30))
    named = template(
        "--set-json",
        'config.named={"big": {"memoryUnit": "4Gi", "reservedMemory": "0:memory=1Gi"}}',
    )
    text = of_kind(named, "ConfigMap", f"{RELEASE}-node-configs")["data"]["configs.yaml"]
    params = serve_args(named, monkeypatch)
    configs = parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"), text, params)
    assert configs.configs["big"] == {
        "memory_unit": 4 * 2**30,
        "reserved_memory": ((0, "memory", 2**30),),
    }


def test_near_settings_reach_the_plugin_from_values_and_named_configurations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """config.near (a map) becomes NUMA_NEAR, which serve parses back to the same
    resources; config.named's near lands in the file of named configurations."""
    documents = template(
        "--set-string", "config.near.data-disk=serial:S3EVNX0K123",
        "--set-string", "config.near.nic=pci:0000:41:00.0",
    )  # fmt: skip
    assert of_kind(documents, "ConfigMap")["data"]["NUMA_NEAR"] == (
        "data-disk=serial:S3EVNX0K123 nic=pci:0000:41:00.0"
    )
    config = options.config_from_params(serve_args(documents, monkeypatch))
    assert [str(n) for n in config.near] == ["data-disk=serial:S3EVNX0K123", "nic=pci:0000:41:00.0"]
    listed = template("--set-json", 'config.near={"osd": ["path:/var/lib/ceph", "net:ens1"]}')
    assert of_kind(listed, "ConfigMap")["data"]["NUMA_NEAR"] == (
        "osd=path:/var/lib/ceph osd=net:ens1"
    )
    config = options.config_from_params(serve_args(listed, monkeypatch))
    assert [str(n) for n in config.near] == ["osd=path:/var/lib/ceph & net:ens1"]
    named = template("--set-json", 'config.named={"a": {"near": {"data-disk": "wwid:eui.1"}}}')
    text = of_kind(named, "ConfigMap", f"{RELEASE}-node-configs")["data"]["configs.yaml"]
    params = serve_args(named, monkeypatch)
    configs = parse_node_configs(Path("/etc/numa-device-plugin/configs.yaml"), text, params)
    assert [str(n) for n in configs.configs["a"]["near"]] == ["data-disk=wwid:eui.1"]


def test_a_settings_change_rolls_the_pods() -> None:
    def checksum(*args: str) -> str:
        metadata = of_kind(template(*args), "DaemonSet")["spec"]["template"]["metadata"]
        value: str = metadata["annotations"]["checksum/config"]
        return value

    assert checksum() == checksum()
    assert checksum() != checksum("--set", "config.capacity=50")


def test_the_image_tag_defaults_to_the_apps_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert container(template())["image"] == f"registry.local:5000/numa-device-plugin:{__version__}"
    assert container(template("--set", "image.tag=dev"))["image"].endswith(":dev")


def test_nfd_and_monitoring() -> None:
    nfd = of_kind(template("--set", "nfd.enabled=true"), "DaemonSet")
    terms = nfd["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    expression = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert expression[0]["matchExpressions"][0]["key"] == "feature.node.kubernetes.io/memory-numa"
    assert all(d["kind"] != "PodMonitor" for d in template())
    monitor = of_kind(template("--set", "podMonitor.enabled=true"), "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def normalised(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Kind -> object, without what differs by tool alone: labels and annotations,
    the ConfigMap's hash suffix, helm's instance selector and config checksum."""
    found = {}
    for original in documents:
        document = copy.deepcopy(original)
        kind = document["kind"]
        for metadata in (
            document["metadata"],
            document.get("spec", {}).get("template", {}).get("metadata", {}),
        ):
            metadata.pop("labels", None)
            metadata.pop("annotations", None)
        document["metadata"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", document["metadata"]["name"])
        text = json.dumps(document, sort_keys=True)
        text = re.sub(r'"numa-device-plugin-[a-z0-9]{10}"', '"numa-device-plugin"', text)
        text = text.replace(', "app.kubernetes.io/instance": "numa-device-plugin"', "")
        text = text.replace('"app.kubernetes.io/instance": "numa-device-plugin", ', "")
        found[kind] = json.loads(text)
    return found


def test_the_defaults_render_what_kustomize_applies() -> None:
    kustomize = normalised(render("deployments"))
    chart = normalised(template())
    assert set(chart) == set(kustomize) == {"DaemonSet", "ServiceAccount", "Service", "ConfigMap"}
    for kind in sorted(kustomize):
        assert chart[kind] == kustomize[kind], kind


def docs_hooks() -> Any:
    """docs/hooks.py, which generates the docs' reference pages."""
    return load_script(REPO / "docs" / "hooks.py", "docs_hooks")


def test_the_values_reference_documents_every_value() -> None:
    """The docs' Helm values page is generated from values.schema.json and values.yaml:
    every top-level value has rows, each with its default."""
    table = docs_hooks().helm_values_table()
    rows = [line for line in table.splitlines()[2:]]
    documented = {row.split("`")[1].split(".")[0] for row in rows}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert documented == set(defaults)
    assert "| `config.capacity` | `100` |" in table
    page = (REPO / "docs" / "reference" / "helm-values.md").read_text()
    assert "<!-- generated: helm-values -->" in page


def test_the_values_reference_keeps_its_placeholders() -> None:
    """``<resourcePrefix>/numa-<id>`` once rendered as "/numa-": the ``<…>`` reached the
    page as HTML tags (issue 38's trap 1; mkdocs --strict does not see it)."""
    table = docs_hooks().helm_values_table()
    assert "&lt;resourcePrefix&gt;/numa-&lt;id&gt;" in table
    assert "<resourcePrefix>" not in table
    for row in table.splitlines()[2:]:
        assert row.count(" | ") == 2, row  # no | inside a cell
