"""The deployment, offline: manifests are valid Kubernetes objects, the DaemonSet's
command line is one the CLI accepts, the security settings hold, and the wheel the
image installs works on its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from numa_device_plugin import __version__
from numa_device_plugin.cli import OPTIONS, SERVE_OPTIONS, _resolve_env, build_parser
from numa_device_plugin.probes import parse_address
from tests.conftest import REPO

DEPLOYMENTS = REPO / "deployments"
MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
}
_PRIMITIVES = {"str", "int", "bool", "float", "object", "datetime", "date"}


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOYMENTS.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((path, document))
    return found


def by_kind(kind: str) -> dict[str, Any]:
    (document,) = [d for p, d in manifests() if d["kind"] == kind and "examples" not in str(p)]
    found: dict[str, Any] = document
    return found


def daemonset() -> dict[str, Any]:
    return by_kind("DaemonSet")


def container() -> dict[str, Any]:
    (only,) = daemonset()["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = only
    return found


def check_fields(data: Any, type_name: str, where: str) -> None:
    """Fail on any key the kubernetes client's model for ``type_name`` does not know
    (the client itself silently drops unknown fields)."""
    if type_name in _PRIMITIVES:
        return
    # The client spells containers as list[X] / dict(str, X), or List[X] / Dict[str, X].
    if type_name[:5].lower() == "list[":
        assert isinstance(data, list), f"{where} must be a list"
        for index, item in enumerate(data):
            check_fields(item, type_name[5:-1], f"{where}[{index}]")
        return
    if type_name[:5].lower() in ("dict(", "dict["):
        assert isinstance(data, dict), f"{where} must be a mapping"
        value_type = type_name[5:-1].split(", ", 1)[1]
        for key, item in data.items():
            check_fields(item, value_type, f"{where}.{key}")
        return
    model = getattr(client.models, type_name)
    known = {json_key: attribute for attribute, json_key in model.attribute_map.items()}
    assert isinstance(data, dict), f"{where} must be a mapping ({type_name})"
    for key, item in data.items():
        assert key in known, f"{where}.{key}: not a field of {type_name}"
        check_fields(item, model.openapi_types[known[key]], f"{where}.{key}")


@pytest.mark.parametrize(
    ("path", "document"), manifests(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_manifest_is_a_valid_kubernetes_object(path: Path, document: dict[str, Any]) -> None:
    type_name = MODELS[(document["apiVersion"], document["kind"])]
    check_fields(document, type_name, f"{path.name}:{document['kind']}")
    model = client.ApiClient().deserialize(json.dumps(document), type_name, "application/json")
    assert model.metadata.name == document["metadata"]["name"]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOYMENTS / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    on_disk = sorted(p.name for p in DEPLOYMENTS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == on_disk
    assert kustomization["namespace"] == "kube-system"
    image = container()["image"]
    assert [i["name"] for i in kustomization["images"]] == [image.rsplit(":", 1)[0]]


def _serve_args(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Parse the DaemonSet's command line and env exactly as the image runs it."""
    dockerfile = (REPO / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M)[1])  # type: ignore[index]
    assert entrypoint == ["numa-device-plugin", "serve"]
    for name in [o.env for o in OPTIONS.values()]:
        monkeypatch.delenv(name, raising=False)
    for key, value in by_kind("ConfigMap")["data"].items():
        monkeypatch.setenv(key, value)
    for variable in container().get("env", []):
        monkeypatch.setenv(variable["name"], variable["value"])
    parser, parsers = build_parser()
    args = parser.parse_args([entrypoint[1], *container().get("args", [])])
    _resolve_env(parsers["serve"], args, args._options)
    return args


def test_daemonset_command_line_is_accepted_by_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _serve_args(monkeypatch)  # a renamed flag or bad value exits 2 here
    assert str(args.socket_dir) == "/var/lib/kubelet/device-plugins"
    assert str(args.sysfs_root) == "/sys"
    assert args.capacity == 100
    assert args.resource_prefix == "numa-align"
    assert args.metrics_address == ":9201"


def test_every_configmap_key_is_a_cli_setting() -> None:
    known = {OPTIONS[name].env for name in SERVE_OPTIONS}
    keys = set(by_kind("ConfigMap")["data"])
    assert keys <= known, f"unknown settings: {sorted(keys - known)}"


def test_probes_use_a_fixed_health_listener_independent_of_the_configmap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = _serve_args(monkeypatch)
    ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    assert ports["metrics"] == parse_address(args.metrics_address)[1]
    assert "--health-address=:9202" in container()["args"], "not from the ConfigMap"
    assert ports["health"] == parse_address(args.health_address)[1] == 9202
    assert container()["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container()["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert "NUMA_HEALTH_ADDRESS" not in by_kind("ConfigMap")["data"]


def test_selinux_type_for_device_plugins() -> None:
    options = container()["securityContext"]["seLinuxOptions"]
    assert options == {"type": "container_device_plugin_t"}


def test_kubelet_folders_are_never_created_by_the_plugin_pod() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    types = {v["name"]: v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v}
    assert types == {"device-plugins": "Directory", "pod-resources": "Directory"}


# -- security settings, one test each ---------------------------------------------------------


def test_not_privileged() -> None:
    assert container()["securityContext"]["privileged"] is False


def test_no_privilege_escalation() -> None:
    assert container()["securityContext"]["allowPrivilegeEscalation"] is False


def test_all_capabilities_dropped() -> None:
    capabilities = container()["securityContext"]["capabilities"]
    assert capabilities["drop"] == ["ALL"]
    assert "add" not in capabilities


def test_read_only_root_filesystem() -> None:
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True


def test_seccomp_runtime_default() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container()["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_no_host_namespaces_and_no_api_token() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(field, False)
    assert pod["automountServiceAccountToken"] is False


def test_host_paths_are_only_the_kubelet_folders() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
    }
    mounts = {m["name"]: m for m in container()["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True
    assert not mounts["device-plugins"].get("readOnly", False), "plugins create their sockets"


def test_system_node_critical_in_kube_system() -> None:
    assert daemonset()["metadata"]["namespace"] == "kube-system"
    assert daemonset()["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"


def test_rolling_update_never_runs_two_plugins_on_a_node() -> None:
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxSurge"] == 0


def test_tolerates_tainted_nodes() -> None:
    tolerations = daemonset()["spec"]["template"]["spec"]["tolerations"]
    effects = {
        t.get("effect") for t in tolerations if t.get("operator") == "Exists" and "key" not in t
    }
    assert {"NoSchedule", "NoExecute"} <= effects


def test_requests_and_limits_cover_the_measured_footprint() -> None:
    resources = container()["resources"]
    mebibytes = {
        "requests": resources["requests"]["memory"],
        "limits": resources["limits"]["memory"],
    }
    assert all(value.endswith("Mi") for value in mebibytes.values())
    # Measured for 8 NUMA nodes: ~42 MB RSS without metrics, ~46 MB with them; restart
    # storms briefly add more (up to ~59 MB seen before the plugin trims freed heap).
    assert int(mebibytes["requests"][:-2]) >= 70
    assert int(mebibytes["limits"][:-2]) >= 2 * int(mebibytes["requests"][:-2])
    assert "cpu" in resources["requests"]


def test_headless_metrics_service() -> None:
    service = by_kind("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == daemonset()["spec"]["selector"]["matchLabels"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_example_pod_is_guaranteed_and_asks_for_numa_node_0_in_every_container() -> None:
    (pod,) = [d for p, d in manifests() if "examples" in str(p)]
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    assert len(pod["spec"]["initContainers"]) >= 1
    for each in containers:
        requests, limits = each["resources"]["requests"], each["resources"]["limits"]
        assert requests == limits, f"{each['name']}: Guaranteed QoS needs requests == limits"
        assert str(requests["cpu"]).isdigit(), f"{each['name']}: integer CPUs"
        assert requests["numa-align/numa-0"] == "1"


def test_wheel_installs_into_a_fresh_venv(tmp_path: Path) -> None:
    """What the image does: build the wheel, install only it, run the CLI from it."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO)],
        check=True,
    )
    (wheel,) = dist.glob("numa_device_plugin-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True, timeout=600
    )
    version = subprocess.run(
        [str(venv / "bin" / "numa-device-plugin"), "--version"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert version.stdout.strip() == f"numa-device-plugin {__version__}"
    discover = subprocess.run(
        [str(venv / "bin" / "numa-device-plugin"), "discover", "--output", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert discover.returncode == 0, discover.stderr
    assert json.loads(discover.stdout)["resources"]
