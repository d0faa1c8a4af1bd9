"""The chart's values for adapting it to a cluster (issue 38): names, image digest and
pull secrets, pod labels and annotations, extra arguments and environment, security
contexts, scheduling, the NetworkPolicy and the debug endpoints. Each value reaches the
rendered objects (and the plugin's command line), all of them at once render objects
the Kubernetes API accepts, and the schema still refuses a typo at every level."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from numa_device_plugin import __version__
from numa_device_plugin.cli import options
from tests.deployments.test_deployments import KUBERNETES_VERSIONS
from tests.deployments.test_helm import CHART, RELEASE, container, of_kind, run_helm, template
from tests.deployments.test_helm import serve_args as chart_serve_args

DIGEST = "sha256:" + "ab" * 32
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def js(key: str, value: Any) -> tuple[str, str]:
    """``--set-json KEY=<value as JSON>``."""
    return "--set-json", f"{key}={json.dumps(value)}"


NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "numa", "operator": "Exists"}]}]
    }
}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "numa", "effect": "NoSchedule"}
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
# Every adaptation value at once.
EVERYTHING = [
    *("--set", "fullnameOverride=ndp", "--set", "nameOverride=numa-plugin"),
    *("--set", f"image.digest={DIGEST}", "--set", "image.pullPolicy=Always"),
    *js("imagePullSecrets", [{"name": "regcred"}]),
    *js("podAnnotations", {"example.com/team": "platform"}),
    *js("podLabels", {"team": "platform", "app.kubernetes.io/name": "mine"}),
    *js("extraArgs", ["--shutdown-grace=2", "--log-level=debug"]),
    *js("extraEnv", [{"name": "TZ", "value": "UTC"}, POD_IP]),
    *("--set", "securityContext.seLinuxOptions.type=spc_t"),
    *js("podSecurityContext", {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0}),
    *js("tolerations", [TOLERATION]),
    *js("nodeSelector", {"node-role.kubernetes.io/numa": ""}),
    *js("affinity", {"nodeAffinity": NODE_AFFINITY}),
    *("--set", "priorityClassName=numa-critical"),
    *js(
        "updateStrategy",
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}},
    ),
    *("--set", "networkPolicy.enabled=true"),
    *js("networkPolicy.metricsFrom", [PROMETHEUS]),
    *("--set", "config.debugEndpoints=false"),
    *("--set", "podMonitor.enabled=true"),
]


def pod_spec(documents: list[dict[str, Any]], name: str = RELEASE) -> dict[str, Any]:
    spec: dict[str, Any] = of_kind(documents, "DaemonSet", name)["spec"]["template"]["spec"]
    return spec


def test_every_adaptation_value_at_once_passes_helm_lint_strict() -> None:
    result = run_helm("lint", "--strict", str(CHART), *EVERYTHING)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_adaptation_value_at_once_renders_valid_objects(version: str) -> None:
    documents = template(*EVERYTHING)
    assert {"DaemonSet", "NetworkPolicy", "PodMonitor"} <= {d["kind"] for d in documents}
    for document in documents:
        if document["kind"] != "PodMonitor":  # a CRD: checked in test_helm
            kubernetes_validate.validate(document, version, strict=True)


def test_every_adaptation_value_reaches_the_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = template(*EVERYTHING)
    assert {d["metadata"]["name"] for d in documents if d["kind"] == "DaemonSet"} == {"ndp"}
    daemonset = of_kind(documents, "DaemonSet", "ndp")
    template_meta = daemonset["spec"]["template"]["metadata"]
    # The selector's labels win a clash with podLabels (the selector cannot change).
    selector = {"app.kubernetes.io/name": "numa-plugin", "app.kubernetes.io/instance": RELEASE}
    assert daemonset["spec"]["selector"]["matchLabels"] == selector
    assert template_meta["labels"] == {**selector, "team": "platform"}
    assert template_meta["annotations"]["example.com/team"] == "platform"
    assert "checksum/config" in template_meta["annotations"]
    spec = pod_spec(documents, "ndp")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "numa-critical"
    assert spec["tolerations"] == [TOLERATION]  # the list replaces the default one
    # Maps merge with the defaults (kubernetes.io/os stays unless set to null).
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role.kubernetes.io/numa": ""}
    assert spec["affinity"] == {"nodeAffinity": NODE_AFFINITY}
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0}
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "25%",
        "maxSurge": 0,
    }
    (plugin,) = spec["containers"]
    assert plugin["image"] == f"registry.local:5000/numa-device-plugin:{__version__}@{DIGEST}"
    assert plugin["imagePullPolicy"] == "Always"
    # Only the SELinux type changed: the defaults around it are kept.
    assert plugin["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert plugin["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in plugin["env"]}
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}
    assert env["POD_IP"] == POD_IP
    assert {"GRPC_VERBOSITY", "MALLOC_ARENA_MAX"} <= set(env)
    assert plugin["args"][-2:] == ["--shutdown-grace=2", "--log-level=debug"]
    assert of_kind(documents, "ConfigMap", "ndp")["data"]["NUMA_DEBUG_ENDPOINTS"] == "false"
    service = of_kind(documents, "Service", "ndp-metrics")
    assert service["spec"]["selector"] == selector
    assert of_kind(documents, "PodMonitor", "ndp")["spec"]["selector"]["matchLabels"] == selector


def test_extra_args_and_debug_endpoints_reach_the_plugins_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendered command line and ConfigMap parse as the image runs them: the extra
    arguments after the chart's win, debugEndpoints false turns the pages off."""
    documents = template(
        *("--set-json", 'extraArgs=["--shutdown-grace=2", "--log-level=debug"]'),
        *("--set", "config.debugEndpoints=false"),
    )
    params = chart_serve_args(documents, monkeypatch)
    assert params["shutdown_grace"] == 2.0
    assert params["log_level"] == "debug"
    assert params["debug_endpoints"] is False
    assert options.config_from_params(params).capacity == 100
    assert chart_serve_args(template(), monkeypatch)["debug_endpoints"] is True
    assert "NUMA_DEBUG_ENDPOINTS" not in of_kind(template(), "ConfigMap")["data"]


def test_names_follow_name_and_fullname_overrides() -> None:
    named = template("--set", "nameOverride=numa")
    assert (
        of_kind(named, "DaemonSet", f"{RELEASE}-numa")["metadata"]["labels"][
            "app.kubernetes.io/name"
        ]
        == "numa"
    )
    full = template("--set", "fullnameOverride=plugin")
    kinds = {d["kind"]: d["metadata"]["name"] for d in full}
    assert kinds["DaemonSet"] == kinds["ServiceAccount"] == "plugin"
    assert pod_spec(full, "plugin")["serviceAccountName"] == "plugin"
    assert {d["metadata"]["name"] for d in full if d["kind"] == "ConfigMap"} == {"plugin"}


def test_the_image_is_the_tag_alone_without_a_digest() -> None:
    assert "@" not in container(template())["image"]
    digested = container(template("--set", f"image.digest={DIGEST}", "--set", "image.tag=0.2.0"))
    assert digested["image"] == f"registry.local:5000/numa-device-plugin:0.2.0@{DIGEST}"


def test_the_default_tolerations_and_security_context_are_kept() -> None:
    spec = pod_spec(template())
    assert {"operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "imagePullSecrets" not in spec
    context = container(template())["securityContext"]
    assert context["seLinuxOptions"] == {"type": "container_device_plugin_t"}
    assert context["allowPrivilegeEscalation"] is False
    assert all(d["kind"] != "NetworkPolicy" for d in template())


@pytest.mark.parametrize(
    ("args", "ingress"),
    [
        (
            [*js("networkPolicy.metricsFrom", [PROMETHEUS])],
            [{"from": [PROMETHEUS], "ports": [{"port": "metrics", "protocol": "TCP"}]}],
        ),
        ([], []),
        (
            [
                *("--set", "config.metricsPort=0"),
                *js("networkPolicy.metricsFrom", [PROMETHEUS]),
            ],
            [],
        ),
    ],
    ids=["prometheus-namespace", "nobody", "no-metrics-port"],
)
def test_the_network_policy_admits_only_the_named_peers_to_the_metrics_port(
    args: list[str], ingress: list[dict[str, Any]]
) -> None:
    """Isolated for ingress; the metrics port (by name) only from metricsFrom; nothing
    else (the node, where the kubelet probes from, is always let in)."""
    policy = of_kind(template("--set", "networkPolicy.enabled=true", *args), "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "numa-device-plugin",
        "app.kubernetes.io/instance": RELEASE,
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == ingress


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "nameOverride=Numa"], "nameOverride"),
        (["--set", "fullnameOverride=a_b"], "fullnameOverride"),
        (["--set", "image.digest=sha256:abc"], "digest"),
        (["--set", "image.digset=sha256:abc"], "digset"),
        (["--set-json", 'imagePullSecrets=[{"nmae": "regcred"}]'], "nmae"),
        (["--set-json", 'imagePullSecrets=["regcred"]'], "imagePullSecrets"),
        (["--set-json", 'podLabels={"team": 1}'], "podLabels"),
        (["--set-json", "extraArgs=[5]"], "extraArgs"),
        (["--set-json", 'extraEnv=[{"name": "A", "vaule": "b"}]'], "vaule"),
        (["--set-json", 'extraEnv=[{"value": "b"}]'], "name"),
        (["--set", "securityContext.readOnlyRootFileSystem=true"], "readOnlyRootFileSystem"),
        (["--set", "securityContext.seLinuxOptions.typ=spc_t"], "typ"),
        (["--set", "podSecurityContext.runAsUsr=0"], "runAsUsr"),
        (["--set-json", 'tolerations=[{"operator": "Exists", "efect": "NoSchedule"}]'], "efect"),
        (["--set-json", 'affinity={"nodeAfinity": {}}'], "nodeAfinity"),
        (["--set", "updateStrategy.rollingUpdate.maxSurg=1"], "maxSurg"),
        (["--set", "updateStrategy.type=Recreate"], "type"),
        (["--set", "resources.limit.memory=1Gi"], "limit"),
        (["--set", "networkPolicy.enable=true"], "enable"),
        (["--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelecter": {}}]'], "Selecter"),
        (["--set-json", "networkPolicy.metricsFrom=[{}]"], "metricsFrom"),
        (["--set", "config.debugEndpoints=sometimes"], "debugEndpoints"),
    ],
)
def test_the_schema_refuses_a_typo_in_every_adaptation_value(args: list[str], needle: str) -> None:
    result = run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0, f"{args} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert needle in result.stderr
