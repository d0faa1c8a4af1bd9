"""The deployment, offline: every kustomize rendering (base, overlays, components) is
valid for the Kubernetes API (`kubernetes-validate --strict`), the DaemonSet's command
line is one the CLI accepts, the overlays keep host folders, mounts and flags in step,
the security settings hold, and the wheel the image installs works on its own.

Manifests are rendered by `kubectl kustomize`, as `kubectl apply -k` would apply them."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml

from numa_device_plugin import __version__
from numa_device_plugin.cli import options, serve
from numa_device_plugin.ops.probes import parse_address
from numa_device_plugin.plugin.settings.config import KNOWN_SOCKET_DIRS, Config
from tests.conftest import REPO, require_tool, run_in_group, venv_tool

DEPLOYMENTS = REPO / "deployments"
# Every rendering an operator can apply: the default, the base, each overlay, and each
# component on top of the base (rendered through a kustomization of its own).
OVERLAYS = ("nfd", "k0s", "microk8s")
COMPONENTS = ("nfd", "monitoring", "host-views")
RENDERINGS = (
    "deployments",
    "base",
    *(f"overlays/{name}" for name in OVERLAYS),
    *(f"components/{name}" for name in COMPONENTS),
)
# The oldest Kubernetes the README supports, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
FOLDERS = {
    "base": Path("/var/lib/kubelet"),
    "overlays/nfd": Path("/var/lib/kubelet"),
    "overlays/k0s": Path("/var/lib/k0s/kubelet"),
    "overlays/microk8s": Path("/var/snap/microk8s/common/var/lib/kubelet"),
}


def kubectl() -> str:
    return venv_tool("kubectl")


@functools.cache
def _render(name: str) -> str:
    program = kubectl()  # skips first: a skip must not leave a scratch folder made
    if name == "deployments":
        folder = DEPLOYMENTS
    elif name.startswith("components/"):
        # A component cannot be built alone: build it on the base, as its comment says.
        folder = Path(_scratch()) / name.replace("/", "-")
        folder.mkdir()
        (folder / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    # kustomize takes only relative paths to other folders.
                    "resources": [os.path.relpath(DEPLOYMENTS / "base", folder)],
                    "components": [os.path.relpath(DEPLOYMENTS / name, folder)],
                }
            )
        )
    else:
        folder = DEPLOYMENTS / name
    result = subprocess.run(
        [program, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {name}: {result.stderr}"
    return result.stdout


@functools.cache
def _scratch() -> str:
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="ndp-kustomize-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def render(name: str = "base") -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize deployments/<name>`` prints (a fresh copy)."""
    return [d for d in yaml.safe_load_all(_render(name)) if d]


def by_kind(kind: str, name: str = "base") -> dict[str, Any]:
    (document,) = [d for d in render(name) if d["kind"] == kind]
    return document


def daemonset(name: str = "base") -> dict[str, Any]:
    return by_kind("DaemonSet", name)


def pod_spec(name: str = "base") -> dict[str, Any]:
    spec: dict[str, Any] = daemonset(name)["spec"]["template"]["spec"]
    return spec


def container(name: str = "base") -> dict[str, Any]:
    (only,) = pod_spec(name)["containers"]
    found: dict[str, Any] = only
    return found


def check_pod_monitor(document: dict[str, Any]) -> None:
    """kubernetes-validate has no schema for prometheus-operator's CRDs: check the fields
    this PodMonitor uses against monitoring.coreos.com/v1 by hand."""
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(document["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector"}
    for endpoint in document["spec"]["podMetricsEndpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings"}
        for relabeling in endpoint.get("relabelings", []):  # RelabelConfig's fields
            assert set(relabeling) <= {"sourceLabels", "separator", "targetLabel", "regex",
                                       "modulus", "replacement", "action"}  # fmt: skip
            assert all(isinstance(label, str) for label in relabeling.get("sourceLabels", []))
    # The dashboard selects by node: the node label comes from the pod's node.
    (first,) = document["spec"]["podMetricsEndpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        first.get("relabelings", [])
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", RENDERINGS)
def test_every_rendering_passes_kubernetes_validate_strict(name: str, version: str) -> None:
    documents = render(name)
    assert documents, f"{name} renders nothing"
    for document in documents:
        if document["kind"] == "PodMonitor":
            check_pod_monitor(document)
            continue
        kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_example_pod_passes_kubernetes_validate_strict(version: str) -> None:
    for path in sorted((DEPLOYMENTS / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The check above can fail: a misspelt field is refused."""
    document = daemonset()
    document["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[0], strict=True)


def test_apply_k_deployments_installs_the_base() -> None:
    assert render("deployments") == render("base")
    assert {d["metadata"]["namespace"] for d in render("base")} == {"kube-system"}


def test_every_file_in_the_base_is_used() -> None:
    kustomization = yaml.safe_load((DEPLOYMENTS / "base" / "kustomization.yaml").read_text())
    used = set(kustomization["resources"])
    used |= {env for gen in kustomization["configMapGenerator"] for env in gen["envs"]}
    on_disk = {p.name for p in (DEPLOYMENTS / "base").iterdir()} - {"kustomization.yaml"}
    assert used == on_disk


def test_image_tag_is_the_version() -> None:
    assert container()["image"] == f"registry.local:5000/numa-device-plugin:{__version__}"


def test_configmap_is_generated_so_an_edit_rolls_the_daemonset(tmp_path: Path) -> None:
    configmap = by_kind("ConfigMap")
    name = configmap["metadata"]["name"]
    assert re.fullmatch(r"numa-device-plugin-[a-z0-9]{10}", name), name
    (reference,) = container()["envFrom"]
    assert reference == {"configMapRef": {"name": name}}
    # Edit the settings in a copy: the name, and so the pod template, changes.
    copy = tmp_path / "deployments"
    shutil.copytree(DEPLOYMENTS, copy)
    settings = copy / "base" / "settings.env"
    settings.write_text(settings.read_text().replace("NUMA_LOG_LEVEL=info", "NUMA_LOG_LEVEL=debug"))
    edited = subprocess.run(
        [kubectl(), "kustomize", str(copy / "base")], capture_output=True, text=True, check=True
    ).stdout
    (edited_map,) = [d for d in yaml.safe_load_all(edited) if d and d["kind"] == "ConfigMap"]
    assert edited_map["data"]["NUMA_LOG_LEVEL"] == "debug"
    assert edited_map["metadata"]["name"] != name
    assert f"name: {edited_map['metadata']['name']}" in edited


def serve_variables() -> set[str]:
    """The environment variables ``serve`` reads (one per option)."""
    return {p.envvar for p in serve.command.params if isinstance(p.envvar, str)}


def _serve_args(
    monkeypatch: pytest.MonkeyPatch, name: str = "base", settings: dict[str, str] | None = None
) -> Any:
    """Parse the DaemonSet's command line and env exactly as the image runs it
    (``settings``: the ConfigMap's data instead of the rendered one)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M)[1])  # type: ignore[index]
    assert entrypoint[:2] == ["dumb-init", "--"], "an init as PID 1 forwards SIGTERM"
    entrypoint = entrypoint[2:]
    assert entrypoint == ["numa-device-plugin", "serve"]
    for variable in serve_variables():
        monkeypatch.delenv(variable, raising=False)
    if settings is None:
        settings = by_kind("ConfigMap", name)["data"]
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    for variable in container(name).get("env", []):
        monkeypatch.setenv(variable["name"], variable["value"])
    assert entrypoint[1] == serve.command.name
    with serve.command.make_context(entrypoint[1], list(container(name).get("args", []))) as ctx:
        return SimpleNamespace(**ctx.params)


def _config(monkeypatch: pytest.MonkeyPatch, name: str) -> Config:
    return options.config_from_params(vars(_serve_args(monkeypatch, name)))


def test_daemonset_command_line_is_accepted_by_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _serve_args(monkeypatch)  # a renamed flag or bad value exits 2 here
    assert str(args.socket_dir) == "/var/lib/kubelet/device-plugins"
    assert str(args.sysfs_root) == "/sys"
    assert args.capacity == 100
    assert args.resource_prefix == "numa-align"
    assert args.metrics_address == ":9201"


def test_every_configmap_key_is_a_cli_setting() -> None:
    known = serve_variables()
    keys = set(by_kind("ConfigMap")["data"])
    assert keys <= known, f"unknown settings: {sorted(keys - known)}"


@pytest.mark.parametrize("name", list(FOLDERS))
def test_host_folders_mounts_and_flags_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flavour mounts the kubelet's folders at their host paths and points
    --socket-dir (and so the pod resources socket beside it) at them."""
    root = FOLDERS[name]
    volumes = {v["name"]: v["hostPath"] for v in pod_spec(name)["volumes"] if "hostPath" in v}
    assert volumes == {
        "device-plugins": {"path": str(root / "device-plugins"), "type": "Directory"},
        "pod-resources": {"path": str(root / "pod-resources"), "type": "Directory"},
        "host-cgroup": {"path": "/sys/fs/cgroup", "type": "Directory"},
    }
    mounts = {m["name"]: m["mountPath"] for m in container(name)["volumeMounts"]}
    assert mounts["host-cgroup"] == "/host/cgroup"
    assert mounts["device-plugins"] == volumes["device-plugins"]["path"]
    assert mounts["pod-resources"] == volumes["pod-resources"]["path"]
    config = _config(monkeypatch, name)
    assert config.socket_dir == Path(mounts["device-plugins"])
    assert config.pod_resources_path == Path(mounts["pod-resources"]) / "kubelet.sock"
    assert config.socket_dir in KNOWN_SOCKET_DIRS, "serve's auto-detection knows it too"
    assert config.cgroup_root == Path("/host/cgroup")


@pytest.mark.parametrize("name", ["k0s", "microk8s"])
def test_folder_overlays_change_only_the_folders(name: str) -> None:
    base, overlay = daemonset("base"), daemonset(f"overlays/{name}")
    for document in (base, overlay):
        spec = document["spec"]["template"]["spec"]
        for volume in spec["volumes"]:
            volume.get("hostPath", {}).pop("path", None)
        for mount in spec["containers"][0]["volumeMounts"]:
            mount.pop("mountPath")
        spec["containers"][0]["env"] = [e for e in spec["containers"][0]["env"]
                                        if e["name"] != "NUMA_SOCKET_DIR"]  # fmt: skip
    assert overlay == base


def test_nfd_overlay_requires_nodes_with_several_numa_nodes() -> None:
    assert pod_spec("base")["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "affinity" not in pod_spec("base")
    for name in ("overlays/nfd", "components/nfd"):
        spec = pod_spec(name)
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
        terms = spec.pop("affinity")["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert terms == {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "feature.node.kubernetes.io/memory-numa",
                            "operator": "In",
                            "values": ["true"],
                        }
                    ]
                }
            ]
        }
        assert spec == pod_spec("base"), "nothing else changes"


def test_monitoring_component_adds_a_pod_monitor_for_the_metrics_port() -> None:
    documents = render("components/monitoring")
    (monitor,) = [d for d in documents if d["kind"] == "PodMonitor"]
    assert [d for d in documents if d["kind"] != "PodMonitor"] == render("base")
    assert monitor["metadata"]["namespace"] == "kube-system"
    labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    ports = {port["name"] for port in container()["ports"]}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert "metrics" in ports
    assert all(d["kind"] != "PodMonitor" for d in render("base")), "optional"


def test_probes_use_a_fixed_health_listener_independent_of_the_configmap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = _serve_args(monkeypatch)
    ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    assert ports["metrics"] == parse_address(args.metrics_address)[1]
    assert {"name": "NUMA_HEALTH_ADDRESS", "value": ":9202"} in container()["env"], (
        "not from the ConfigMap"
    )
    assert ports["health"] == parse_address(args.health_address)[1] == 9202
    assert container()["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container()["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert "NUMA_HEALTH_ADDRESS" not in by_kind("ConfigMap")["data"]


def test_a_slow_start_gets_two_minutes_before_the_liveness_probe_may_kill_it() -> None:
    """The kubelet runs the liveness probe only once the startup probe has passed, so a
    plugin that takes long to import and listen (a cold image cache, a busy node: a TCG
    test worker took over 26 s) is not killed and restarted while it starts. Without a
    startup probe, liveness (3 misses, 10 s apart) killed it after about 26 s."""
    probes = container()
    startup = probes["startupProbe"]
    assert startup["httpGet"] == probes["livenessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    assert startup["timeoutSeconds"] == probes["livenessProbe"]["timeoutSeconds"]
    assert "initialDelaySeconds" not in probes["livenessProbe"], "the startup probe gates it"


def test_the_liveness_probe_waits_a_minute_before_it_restarts_a_stalled_plugin() -> None:
    """A plugin restarted by its liveness probe loses its registrations for a while (the
    kubelet marks every device Unhealthy): a worker stalled 16 s under load ("housekeeping
    took too long") had it killed with 3 misses of 3 s, 10 s apart."""
    live = container()["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60
    assert live["timeoutSeconds"] >= 5


def test_probes_survive_removing_the_metrics_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _serve_args(monkeypatch, settings={})
    assert args.metrics_address == ""
    assert parse_address(args.health_address)[1] == 9202


def test_selinux_type_for_device_plugins() -> None:
    options = container()["securityContext"]["seLinuxOptions"]
    assert options == {"type": "container_device_plugin_t"}


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


def test_host_paths_are_only_the_kubelet_folders_and_the_cgroup_folder() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "host-cgroup": "/sys/fs/cgroup",
    }
    mounts = {m["name"]: m for m in container()["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True
    assert mounts["host-cgroup"]["readOnly"] is True
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
    # No CPU request: under the static CPU manager it would come out of the node's
    # schedulable CPU and hide the last exclusive CPU the plugin advertises.
    assert "cpu" not in resources["requests"]
    assert "cpu" not in resources.get("limits", {})
    # `make bench` (scale) holds the RSS at 64 NUMA nodes to half of this limit.
    from benchmarks.footprint import MEMORY_LIMIT_MB

    assert int(mebibytes["limits"][:-2]) == MEMORY_LIMIT_MB


def test_headless_metrics_service() -> None:
    service = by_kind("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == daemonset()["spec"]["selector"]["matchLabels"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_example_pod_is_guaranteed_and_asks_for_numa_node_0_in_every_container() -> None:
    pod = yaml.safe_load((DEPLOYMENTS / "examples" / "pod-numa0.yaml").read_text())
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    assert len(pod["spec"]["initContainers"]) >= 1
    for each in containers:
        requests, limits = each["resources"]["requests"], each["resources"]["limits"]
        assert requests == limits, f"{each['name']}: Guaranteed QoS needs requests == limits"
        assert str(requests["cpu"]).isdigit(), f"{each['name']}: integer CPUs"
        assert requests["numa-align/numa-0"] == "1"


def _stages() -> list[str]:
    """The Dockerfile's stages, each from its FROM line on (continuation lines joined)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return re.split(r"^(?=FROM )", "\n".join(lines), flags=re.M)[1:]


def test_image_installs_only_hash_pinned_dependencies_and_keeps_no_installer() -> None:
    build, final = _stages()
    assert re.search(r"install .*--require-hashes .*--requirement requirements\.lock", build)
    wheel_install = re.search(r"install [^\n]*/dist/\*\.whl", build)
    assert wheel_install is not None
    assert "--no-deps" in wheel_install[0], "its dependencies come only from the lock"
    # The build backend too: from its own lock, hash-checked, never fetched by an
    # isolated build.
    assert re.search(r"install .*--require-hashes .*--requirement requirements-build\.lock", build)
    assert re.search(r"pip wheel [^\n]*--no-build-isolation", build)
    assert "pip install" not in final
    assert " install " not in final
    assert re.search(r"pip uninstall --yes --quiet pip setuptools wheel", final)
    assert "COPY --from=build /opt/venv /opt/venv" in final
    labels = dict(re.findall(r"org\.opencontainers\.image\.(\w+)=\"([^\"]*)\"", final))
    assert labels["source"] == "${SOURCE}"
    assert labels["revision"] == "${REVISION}"
    makefile = (REPO / "Makefile").read_text()
    assert "--build-arg SOURCE=$(SOURCE)" in makefile
    assert "SOURCE   ?= $(shell git remote get-url origin" in makefile


def _lock() -> dict[str, tuple[str, list[str], str]]:
    """requirements.lock as {name: (version, hashes, via comments)}."""
    entries: dict[str, tuple[str, list[str], str]] = {}
    text = (REPO / "requirements.lock").read_text()
    for block in re.split(r"\n(?=[a-z0-9])", text.split("\n\n", 1)[1] if "\n\n" in text else text):
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if match is None:
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        via = " ".join(re.findall(r"#\s+(?:via)?\s*(.+)", block))
        entries[match[1].lower()] = (match[2], hashes, via)
    return entries


def test_lock_file_is_fresh_and_hash_pinned() -> None:
    """requirements.lock is pip-compile's output for pyproject.toml's dependencies: every
    dependency pinned within its range, nothing left from a removed one, all hashed."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = (REPO / "requirements.lock").read_text()
    assert "pip-compile --allow-unsafe --extra=image --generate-hashes" in text, "`make lock`"
    lock = _lock()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    image_extra = project["optional-dependencies"]["image"]  # the lock has it too
    wanted: dict[str, Requirement] = {
        canonicalize_name(r.name): r
        for r in map(Requirement, [*project["dependencies"], *image_extra])
    }
    direct = {
        name for name, (_, _, via) in lock.items() if "numa-device-plugin (pyproject.toml)" in via
    }
    assert direct == set(wanted), "pyproject.toml's dependencies changed: run `make lock`"
    for name, requirement in wanted.items():
        version = lock[name][0]
        assert requirement.specifier.contains(version), f"{name}=={version} vs {requirement}"
    for package, (_, hashes, via) in lock.items():
        assert hashes, f"{package} has no hash"
        assert via, f"{package}: pip-compile says why it is there"


def test_the_build_backend_lock_pins_every_build_requirement() -> None:
    import tomllib

    from packaging.requirements import Requirement

    text = (REPO / "requirements-build.lock").read_text()
    assert "--build-deps-for=wheel" in text, "made by `make lock`"
    assert "--only-build-deps" in text
    pins = dict(re.findall(r"^([a-z0-9_.-]+)==(\S+)", text, re.M))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for requirement in map(Requirement, pyproject["build-system"]["requires"]):
        assert requirement.name in pins, f"{requirement.name}: run `make lock`"
        assert requirement.specifier.contains(pins[requirement.name])
    blocks = re.split(r"\n(?=[a-z0-9])", text)
    for block in blocks:
        if re.match(r"[a-z0-9_.-]+==", block):
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), block.splitlines()[0]


def test_lock_parser_sees_every_pin() -> None:
    text = (REPO / "requirements.lock").read_text()
    assert len(_lock()) == len(re.findall(r"^[a-z0-9][^ ]*==", text, re.M)) > 3


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in patterns)

    for path in (".git", ".venv", "test/infra/.state", ".mypy_cache", ".pytest_cache"):
        assert ignored(path), path
    for path in ("pyproject.toml", "README.md", "requirements.lock", "numa_device_plugin"):
        assert not ignored(path), f"the Dockerfile copies {path}"


def _make_image(folder: Path) -> str:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "image-name"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_image_tag_names_the_commit_and_a_dirty_tree(tmp_path: Path) -> None:
    require_tool("git", "the Debian package git")
    # A repository of its own holding the Makefile and the version: this one's state
    # (uncommitted edits while developing) must not decide the outcome.
    (tmp_path / "numa_device_plugin").mkdir()
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copy(REPO / "numa_device_plugin" / "__init__.py", tmp_path / "numa_device_plugin")
    name = "registry.local:5000/numa-device-plugin"
    assert _make_image(tmp_path) == f"{name}:{__version__}", "outside git: the version alone"

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "--quiet")
    git("add", ".")
    git("commit", "--quiet", "-m", "one")
    commit = git("rev-parse", "--short=12", "HEAD")
    assert _make_image(tmp_path) == f"{name}:{__version__}-{commit}"
    makefile = (tmp_path / "Makefile").read_text()
    (tmp_path / "Makefile").write_text(makefile + "\n")
    one = _make_image(tmp_path)
    assert re.fullmatch(rf"{name}:{__version__}-{commit}-dirty-[0-9a-f]{{8}}", one), one
    (tmp_path / "Makefile").write_text(makefile + "\n\n")
    two = _make_image(tmp_path)
    assert two.startswith(f"{name}:{__version__}-{commit}-dirty-")
    assert two != one, "another uncommitted change, another tag"
    assert _make_image(tmp_path) == two, "the same tree, the same tag"
    git("checkout", "--quiet", "Makefile")
    (tmp_path / "new-file").write_text("x")
    three = _make_image(tmp_path)
    assert three.startswith(f"{name}:{__version__}-{commit}-dirty-"), "untracked files too"
    (tmp_path / "new-file").write_text("y")
    assert _make_image(tmp_path) != three


@pytest.mark.timeout(900)
def test_wheel_installs_into_a_fresh_venv(tmp_path: Path) -> None:
    """What the image does: the locked dependencies with --require-hashes into a venv
    without pip, then only the wheel, then the CLI runs from it. Every step runs in a
    process group killed whole when the test ends (run_in_group): an interrupted pip
    once stayed behind."""
    dist = tmp_path / "dist"
    run_in_group(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO)],
        timeout=300,
    )
    (wheel,) = dist.glob("numa_device_plugin-*.whl")
    venv = tmp_path / "venv"
    run_in_group([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    lock = REPO / "requirements.lock"
    run_in_group(
        [*pip, "--quiet", "--require-hashes", "--only-binary=:all:", "-r", str(lock)],
        timeout=300,
    )
    run_in_group([*pip, "--quiet", "--no-deps", str(wheel)], timeout=120)
    assert not (venv / "bin" / "pip").exists()
    version = run_in_group(
        [str(venv / "bin" / "numa-device-plugin"), "--version"],
        timeout=60,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert version.stdout.strip() == f"numa-device-plugin {__version__}"
    discover = run_in_group(
        [str(venv / "bin" / "numa-device-plugin"), "discover", "--output", "json"],
        timeout=60,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert json.loads(discover.stdout)["resources"]


def test_run_in_group_leaves_no_process_behind(tmp_path: Path) -> None:
    """A child that outlives its timeout, and its own child, are both gone after."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo $$ >> {pids}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group(["sh", "-c", script], timeout=2)

    def gone(pid: int) -> bool:
        """Exited: no such process, or a zombie left for its new parent to reap."""
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        return state in ("Z", "X")

    # SIGKILL is delivered at once but acted on when the process next runs: on a loaded
    # machine that takes a moment, so the check waits for it (bounded), never a sleep.
    deadline = time.monotonic() + 30
    for pid in map(int, pids.read_text().split()):
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid), f"process {pid} outlived the call by 30 s"


def test_the_manifests_comments_cite_pages_and_headings_that_exist() -> None:
    """settings.env once cited a README section, "Exact NUMA capacity", that did not
    exist (issue 38's trap 9)."""
    import re

    cited = 0
    for path in sorted((REPO / "deployments").rglob("*")):
        if not path.is_file() or path.suffix not in (".env", ".yaml", ".tpl", ".txt"):
            continue
        for page, title in re.findall(r"\((docs/[\w./-]+\.md), \"([^\"]+)\"\)", path.read_text()):
            cited += 1
            headings = [
                line.lstrip("#").strip().replace("`", "")
                for line in (REPO / page).read_text().splitlines()
                if line.startswith("#")
            ]
            assert title.replace("`", "") in headings, f"{path}: {page} has no heading {title!r}"
        assert "(README, " not in path.read_text(), f"{path} cites a README section"
    assert cited, "no citation found: the test would check nothing"


def test_the_configuration_page_points_at_top_where_it_is() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    assert "top` (below)" not in text
    assert "observability.md#the-cluster-view-top-and-kubectl-numa" in text


def test_the_documented_digest_overlay_pins_the_image_by_digest(tmp_path: Path) -> None:
    """docs/deployment.md's kustomization (Releases) on deployments/: the DaemonSet's
    image becomes the registry's name at the release's digest."""
    page = (REPO / "docs" / "deployment.md").read_text()
    section = page.split("## Releases", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    digest = "sha256:" + "12" * 32
    overlay = yaml.safe_load(snippet.replace("sha256:…", digest))
    overlay["resources"] = [os.path.relpath(DEPLOYMENTS, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    result = subprocess.run([kubectl(), "kustomize", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (document,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet"]
    (plugin,) = document["spec"]["template"]["spec"]["containers"]
    assert plugin["image"] == f"registry.example.com:5000/numa-device-plugin@{digest}"


def test_the_host_views_component_gives_the_plugin_the_hosts_mount_table_and_sys() -> None:
    """path: and net: in the kustomize base need the host's mount table and /sys, as the
    chart's host.mountTable and host.sysfs give them: the same mounts and flags."""
    variables = {e["name"]: e["value"] for e in container("components/host-views")["env"]}
    assert variables["NUMA_SYSFS_ROOT"] == "/host/sys"
    assert variables["NUMA_MOUNT_TABLE"] == "/host/proc/1/mountinfo"
    assert [e["name"] for e in container("components/host-views")["env"]].count(
        "NUMA_SYSFS_ROOT"
    ) == 1
    mounts = {m["name"]: m for m in container("components/host-views")["volumeMounts"]}
    assert mounts["host-sys"] == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    assert mounts["host-mounts"] == {
        "name": "host-mounts", "mountPath": "/host/proc/1/mountinfo", "readOnly": True,
    }  # fmt: skip
    volumes = {v["name"]: v for v in pod_spec("components/host-views")["volumes"]}
    assert volumes["host-sys"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    assert volumes["host-mounts"]["hostPath"] == {"path": "/proc/1/mountinfo", "type": "File"}
    spec = pod_spec("components/host-views")
    base = pod_spec("base")
    assert len(spec["volumes"]) == len(base["volumes"]) + 2
    assert "NUMA_MOUNT_TABLE" not in {e["name"] for e in container("base")["env"]}
