"""The chart's alerts (``monitoring.alerts.enabled``): the PrometheusRule as helm renders
it, its rules checked and unit-tested by promtool on synthetic series of the plugin's
own metric names (``make promtool`` unpacks Debian's; without it these tests skip, or
fail under CI).
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import venv_tool
from tests.deployments.test_helm import of_kind, template

ALERTS = (
    "NumaDevicePluginNotRegistered",
    "NumaDevicePluginPodResourcesDown",
    "NumaDevicePluginMisalignedContainers",
    "NumaDevicePluginNearNotAdvertised",
    "NumaNodeFull",
)
POD = {"namespace": "kube-system", "pod": "numa-device-plugin-a"}


def promtool() -> str:
    return venv_tool("promtool")


@functools.cache
def rule() -> dict[str, Any]:
    """The rendered PrometheusRule (helm runs once per test process)."""
    return of_kind(template("--set", "monitoring.alerts.enabled=true"), "PrometheusRule")


def write_rules(folder: Path) -> Path:
    """The rule's groups as a Prometheus rules file, ``folder/rules.yaml``."""
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule()["spec"]["groups"]}))
    return path


def rules_by_alert() -> dict[str, dict[str, Any]]:
    (group,) = rule()["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def expand(text: str, labels: dict[str, str], value: str) -> str:
    """Prometheus's expansion of the ``{{ $labels.X }}`` and ``{{ $value }}`` used here."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return text.replace("{{ $value }}", value)


# Each alert's severity and annotations as the docs promise them, written here (not read
# from the rule under test, which would test nothing but the firing windows).
WRITTEN: dict[str, tuple[str, str, str]] = {
    "NumaDevicePluginNotRegistered": (
        "warning",
        "{{ $labels.pod }}: {{ $labels.resource }} not registered with the kubelet",
        "The plugin in {{ $labels.namespace }}/{{ $labels.pod }} has advertised "
        "{{ $labels.resource }} for 5 minutes without a registration the kubelet accepted: "
        "pods asking for it stay Pending. Its log and /readyz say why.",
    ),
    "NumaDevicePluginPodResourcesDown": (
        "warning",
        "{{ $labels.pod }}: the kubelet's pod resources API cannot be read",
        "For 5 minutes the plugin in {{ $labels.namespace }}/{{ $labels.pod }} has not read "
        "the pod resources API: with --capacity cpus or --memory-unit its counts are stale, "
        "and status cannot see holders.",
    ),
    "NumaDevicePluginMisalignedContainers": (
        "warning",
        "{{ $labels.pod }}: {{ $value }} container(s) hold NUMA node {{ $labels.numa_node }} "
        "with CPUs elsewhere",
        "Containers that asked for NUMA node {{ $labels.numa_node }} run on exclusive CPUs of "
        "another node (or have none): check the kubelet's CPU manager and Topology Manager "
        "policies (numa-device-plugin status).",
    ),
    "NumaDevicePluginNearNotAdvertised": (
        "warning",
        "{{ $labels.pod }}: {{ $labels.resource }} follows no device on its node",
        "For 15 minutes the plugin in {{ $labels.namespace }}/{{ $labels.pod }} has advertised "
        "nothing for {{ $labels.resource }}: its selector matches no device with a NUMA node "
        "there, or the device it followed is gone (a data path unmounted, a disk pulled: the "
        "pods holding it see an Unhealthy device). Pods asking for it stay Pending on that "
        "node; kubectl numa check names the pods it leaves unaligned; discover, /debug/state "
        "and the log say why.",
    ),
    "NumaNodeFull": (
        "info",
        "{{ $labels.pod }}: NUMA node {{ $labels.numa_node }} has had no free exclusive CPU "
        "for 30 minutes",
        "Every exclusive CPU of NUMA node {{ $labels.numa_node }} on the node of "
        "{{ $labels.namespace }}/{{ $labels.pod }} is assigned: pods asking for it wait or go "
        "elsewhere.",
    ),
}


def test_every_alert_is_written_here() -> None:
    assert set(rules_by_alert()) == set(WRITTEN)


def expected(alert: str, value: str = "0", **labels: str) -> dict[str, Any]:
    """promtool's ``exp_alerts`` entry: the series' labels with the severity, the
    annotations (as :data:`WRITTEN` has them) expanded."""
    severity, summary, description = WRITTEN[alert]
    every = {**POD, **labels}
    return {
        "exp_labels": {**every, "severity": severity},
        "exp_annotations": {
            "summary": expand(summary, every, value),
            "description": expand(description, every, value),
        },
    }


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in {**POD, **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of ``tests`` against the rendered rules (1 m intervals)."""
    document = {
        "rule_files": [write_rules(tmp_path).name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **test} for test in tests],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", "test.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_no_rule_unless_enabled_and_extra_labels_reach_it() -> None:
    assert all(d["kind"] != "PrometheusRule" for d in template())
    enabled = ("--set", "monitoring.alerts.enabled=true")
    labelled = template(*enabled, "--set", "monitoring.alerts.labels.release=kps")
    assert of_kind(labelled, "PrometheusRule")["metadata"]["labels"]["release"] == "kps"


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(write_rules(tmp_path))],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout
    assert tuple(rules_by_alert()) == ALERTS


def test_each_alert_fires_after_its_time_and_not_before(tmp_path: Path) -> None:
    numa0, numa1 = {"resource": "numa-align/numa-0"}, {"resource": "numa-align/numa-1"}
    registered = "numa_device_plugin_registered"
    tests = [
        {   # numa-0 never registers; numa-1 does; another pod's numa-0 registers at 3 m.
            "input_series": [
                series(registered, "0x10", **numa0),
                series(registered, "1x10", **numa1),
                series(registered, "0 0 0 1x7", **{**numa0, "pod": "numa-device-plugin-b"}),
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "NumaDevicePluginNotRegistered", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "NumaDevicePluginNotRegistered",
                 "exp_alerts": [expected("NumaDevicePluginNotRegistered", **numa0)]},
            ],
        },
        {   # the pod resources API answers for 4 minutes, then not.
            "input_series": [series("numa_device_plugin_pod_resources_up", "1x3 0x10")],
            "alert_rule_test": [
                {"eval_time": "8m", "alertname": "NumaDevicePluginPodResourcesDown",
                 "exp_alerts": []},
                {"eval_time": "10m", "alertname": "NumaDevicePluginPodResourcesDown",
                 "exp_alerts": [expected("NumaDevicePluginPodResourcesDown")]},
            ],
        },
        {   # two misaligned containers on NUMA node 1 from minute 2; none on node 0.
            "input_series": [
                series("numa_node_misaligned_containers", "0 0 2x10", numa_node="1"),
                series("numa_node_misaligned_containers", "0x12", numa_node="0"),
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": "NumaDevicePluginMisalignedContainers",
                 "exp_alerts": []},
                {"eval_time": "8m", "alertname": "NumaDevicePluginMisalignedContainers",
                 "exp_alerts": [expected("NumaDevicePluginMisalignedContainers", "2",
                                         numa_node="1")]},
            ],
        },
        {   # data-a follows nothing from the start; data-b is advertised, then not at 10 m.
            "input_series": [
                series("numa_device_plugin_near_advertised", "0x40",
                       resource="numa-align/data-a"),
                series("numa_device_plugin_near_advertised", "1x9 0x30",
                       resource="numa-align/data-b"),
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "NumaDevicePluginNearNotAdvertised",
                 "exp_alerts": []},
                {"eval_time": "16m", "alertname": "NumaDevicePluginNearNotAdvertised",
                 "exp_alerts": [expected("NumaDevicePluginNearNotAdvertised",
                                         resource="numa-align/data-a")]},
                {"eval_time": "26m", "alertname": "NumaDevicePluginNearNotAdvertised",
                 "exp_alerts": [
                     expected("NumaDevicePluginNearNotAdvertised", resource="numa-align/data-a"),
                     expected("NumaDevicePluginNearNotAdvertised", resource="numa-align/data-b"),
                 ]},
            ],
        },
        {   # node 0: 4 allocatable, 2 ours + 2 others' = full; node 1: 4, 1 + 1.
            "input_series": [
                series("numa_node_allocatable_cpus", "4x40", numa_node="0"),
                series("numa_node_assigned_cpus", "2x40", numa_node="0", holder="numa-align"),
                series("numa_node_assigned_cpus", "2x40", numa_node="0", holder="other"),
                series("numa_node_allocatable_cpus", "4x40", numa_node="1"),
                series("numa_node_assigned_cpus", "1x40", numa_node="1", holder="numa-align"),
                series("numa_node_assigned_cpus", "1x40", numa_node="1", holder="other"),
            ],
            "alert_rule_test": [
                {"eval_time": "29m", "alertname": "NumaNodeFull", "exp_alerts": []},
                {"eval_time": "31m", "alertname": "NumaNodeFull",
                 "exp_alerts": [expected("NumaNodeFull", "4", numa_node="0")]},
            ],
        },
    ]  # fmt: skip
    done = promtool_test(tmp_path, tests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """promtool really evaluates: the pod resources alert expected at 4 m, when the API
    went away only then, is reported as a failure."""
    tests = [
        {
            "input_series": [series("numa_device_plugin_pod_resources_up", "1x3 0x10")],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "NumaDevicePluginPodResourcesDown",
                 "exp_alerts": [expected("NumaDevicePluginPodResourcesDown")]},
            ],
        }
    ]  # fmt: skip
    done = promtool_test(tmp_path, tests)
    assert done.returncode != 0
    assert "NumaDevicePluginPodResourcesDown" in done.stdout + done.stderr
