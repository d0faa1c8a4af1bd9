"""End to end on the test cluster of two workers, after tests/e2e/test_workers.py (files
run in name order): the plugin as a release installs it (by digest, from the registry),
the NetworkPolicy that closes its metrics port, and last the uninstall, which leaves
the cluster without the plugin.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from kubernetes import client

from tests.conftest import REPO
from tests.e2e.platforms import NAMESPACE, Platform, pod_ready
from tests.e2e.shipped import METRICS_PORT, RELEASE, ShippedPlatform
from tests.e2e.test_cluster import wait_phase
from tests.e2e.test_workers import Workers, two  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e


def released(platform: ShippedPlatform) -> dict[str, str] | None:
    found: dict[str, str] | None = getattr(platform, "description", {}).get("release")
    return found


def test_a_release_runs_on_both_workers_by_digest(two: Workers) -> None:  # noqa: F811
    """RELEASE=1: each worker's plugin pod runs the image index make release pushed, by
    its digest (the chart from the registry defaults to it), and is Ready."""
    release = released(two.platform)
    if release is None:
        pytest.skip("the chart was installed from the checkout: make test-e2e-local RELEASE=1")
    for node in two.names:
        pod = two.plugin_pod(node)
        assert pod is not None, f"no plugin pod on {node}"
        (plugin,) = pod.spec.containers
        (status,) = pod.status.container_statuses
        print(f"{node}: image {plugin.image}; imageID {status.image_id}; ready {pod_ready(pod)}")
        assert plugin.image.endswith(f":{release['version']}@{release['digest']}")
        assert pod_ready(pod)
    label = "jsonpath={.items[0].metadata.labels.helm\\.sh/chart}"
    chart = two.platform.kubectl("get", "ds", "-n", NAMESPACE, "-o", label)
    assert chart == f"numa-device-plugin-{release['version']}"


def fetch_metrics(platform: Platform, namespace: str, name: str, ip: str, want: str) -> str:
    """A pod in ``namespace`` asks the plugin pod at ``ip`` for /metrics with busybox's
    ``nc`` (5 s timeout; Debian's static busybox ``wget`` dies of a segmentation fault
    whatever the answer) until it gets what it ``want``s, ``answer`` or ``refused``, at
    most 20 tries 3 s apart: the network plugin applies a policy to a new pod's address
    a little after the pod starts (kube-router refused a fresh allowed pod once). Its
    output: the last answer or nc's error, ``tries=N``, then ``rc=N``, nc's status."""
    script = (
        "for try in $(seq 1 20); do "
        "printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' "
        f"| nc -w 5 {ip} {METRICS_PORT} > /tmp/answer 2>&1; rc=$?; "
        f"if [ {want} = answer ] && grep -q numa_device_plugin_registered /tmp/answer; "
        "then break; fi; "
        f"if [ {want} = refused ] && [ $rc != 0 ]; then break; fi; "
        "sleep 3; done; "
        "head -c 20000 /tmp/answer; echo; echo tries=$try; echo rc=$rc"
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            automount_service_account_token=False,
            termination_grace_period_seconds=1,
            containers=[client.V1Container(
                name="main", image="busybox:1.36", command=["sh", "-c", script],
            )],
        ),
    )  # fmt: skip
    platform.core.create_namespaced_pod(namespace, pod)
    wait_phase(platform, name, namespace, "Succeeded")
    return platform.pod_log(name, namespace)


def test_the_network_policy_admits_only_the_named_namespace_to_the_metrics_port(
    two: Workers,  # noqa: F811
) -> None:
    """networkPolicy.enabled with metricsFrom naming one namespace: a pod there reads
    /metrics of each worker's plugin, a pod of another namespace gets nothing, and the
    kubelet's probes still pass (the plugin pods stay Ready, not restarted)."""
    platform = two.platform
    if not getattr(platform, "description", {}).get("network_policy"):
        pytest.skip(
            "the test cluster's network plugin (bridge) enforces no NetworkPolicy: "
            "run with KUBE_ROUTER=<kube-router binary>"
        )
    allowed, denied = "np-allowed", "np-denied"
    selector = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": allowed}}}
    for name in (allowed, denied):
        platform.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    restarts = {n: two.plugin_pod(n).status.container_statuses[0].restart_count
                for n in two.names}  # fmt: skip
    try:
        # Only a NetworkPolicy is added: the pods stay (their template is unchanged).
        peers = f"networkPolicy.metricsFrom=[{json.dumps(selector)}]"
        platform.helm_upgrade("--reuse-values", "--set", "networkPolicy.enabled=true",
                              "--set-json", peers)  # fmt: skip
        for node in two.names:
            pod = two.plugin_pod(node)
            assert pod is not None
            ip, short = pod.status.pod_ip, node[-1]
            yes = fetch_metrics(platform, allowed, f"metrics-{short}", ip, "answer")
            no = fetch_metrics(platform, denied, f"metrics-{short}", ip, "refused")
            print(f"{node}: allowed namespace {yes[-70:]!r}; other namespace {no[-70:]!r}")
            assert "numa_device_plugin_registered" in yes
            assert yes.rstrip().endswith("rc=0"), yes[-200:]
            # Refused or timed out: nc fails to connect, it does not crash.
            assert "numa_device_plugin_registered" not in no
            assert no.rstrip().endswith("rc=1"), no[-200:]
        time.sleep(30 * platform.time_scale / 5)  # several probe periods under the policy
        for node in two.names:
            pod = two.plugin_pod(node)
            assert pod_ready(pod), f"{node}: the plugin pod is not Ready under the policy"
            assert pod.status.container_statuses[0].restart_count == restarts[node]
    finally:
        platform.helm_upgrade("--reuse-values", "--set", "networkPolicy.enabled=false")
        for name in (allowed, denied):
            platform.core.delete_namespace(name)


def capacity_entries(platform: Platform) -> dict[str, dict[str, str]]:
    """Per node, its ``numa-align/*`` entries of capacity and allocatable."""
    found: dict[str, dict[str, str]] = {}
    for node in platform.core.list_node().items:
        status = node.status
        found[node.metadata.name] = {
            f"{part}:{key}": value
            for part, values in (("capacity", status.capacity), ("allocatable", status.allocatable))
            for key, value in (values or {}).items() if key.startswith("numa-align/")
        }  # fmt: skip
    return found


def test_uninstall_then_clear_capacity_leaves_no_numa_align_resource(
    two: Workers,  # noqa: F811
) -> None:
    """Last of the run (it removes the plugin): helm uninstall; the kubelet keeps each
    resource in node status (5 minutes counted, then at capacity 0); the Uninstall
    page's deployments/clear-capacity.sh, run until it exits 0, leaves no numa-align/*
    in any node's capacity or allocatable, and the kubelets do not put them back."""
    platform = two.platform
    subprocess.run([platform.helm, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"],
                   check=True, capture_output=True, timeout=300 * platform.time_scale,
                   env=platform.kubectl_env)  # fmt: skip
    platform.eventually(lambda: all(two.plugin_pod(n) is None for n in two.names), 120,
                        "no plugin pod left")  # fmt: skip
    print(f"after uninstall: {capacity_entries(platform)}")
    runs: list[Any] = []

    def cleared() -> bool:
        done = subprocess.run(
            ["bash", str(REPO / "deployments" / "clear-capacity.sh")], capture_output=True,
            text=True, timeout=120 * platform.time_scale, env=platform.kubectl_env,
        )  # fmt: skip
        runs.append((time.monotonic(), done.returncode, done.stdout.strip()))
        assert done.returncode in (0, 1), done.stdout + done.stderr
        return done.returncode == 0

    started = time.monotonic()
    # The kubelet's grace period is 5 minutes of wall time whatever the guests' speed.
    platform.eventually(cleared, max(600, 600 * 5 / platform.time_scale), "clear-capacity.sh", 20)
    for at, code, said in runs:
        print(f"clear-capacity.sh at {at - started:.0f} s: exit {code}: {said}")
    assert capacity_entries(platform) == {
        n.metadata.name: {} for n in platform.core.list_node().items
    }
    time.sleep(30)  # three node status updates: the kubelets leave them out
    left = capacity_entries(platform)
    print(f"30 s later: {left}")
    assert all(not entries for entries in left.values()), left
