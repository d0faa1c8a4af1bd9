"""End to end on the KVM test cluster: the plugin as users meet it."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client

from numa_device_plugin.sysfs import parse_cpulist
from tests.conftest import REPO
from tests.e2e.conftest import (
    NAMESPACE,
    PLUGIN,
    eventually,
    exec_in,
    plugin_pod,
    pod_ready,
    ssh,
)

pytestmark = pytest.mark.e2e
RESOURCES = ("numa-align/numa-0", "numa-align/numa-1")


def guaranteed_pod(name: str, node: str, resource: str, count: int, command: str) -> client.V1Pod:
    limits = {"cpu": "2", "memory": "256Mi", resource: str(count)}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="main",
                    image="busybox:1.36",
                    command=["sh", "-c", command],
                    resources=client.V1ResourceRequirements(requests=limits, limits=limits),
                )
            ],
        ),
    )


def allocatable(core: client.CoreV1Api, node: str) -> dict[str, str]:
    found: dict[str, str] = core.read_node(node).status.allocatable
    return found


def numa_cpus(core: client.CoreV1Api, node: str, numa_node: int) -> frozenset[int]:
    """The node's NUMA cpulist, as the plugin on it discovers it."""
    pod = plugin_pod(core, node)
    assert pod is not None
    document = json.loads(
        exec_in(core, pod, ["numa-device-plugin", "discover", "--output", "json"])
    )
    (entry,) = [n for n in document["nodes"] if n["id"] == numa_node]
    return parse_cpulist(entry["cpus"])


def test_daemonset_is_ready_on_every_worker(
    apps: client.AppsV1Api, core: client.CoreV1Api, workers: list[client.V1Node]
) -> None:
    def ready() -> bool:
        status = apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE).status
        return bool(status.desired_number_scheduled) and (
            status.number_ready == status.desired_number_scheduled
        )

    eventually(ready, 300, "the DaemonSet to be ready")
    for node in workers:
        assert pod_ready(plugin_pod(core, node.metadata.name)), node.metadata.name


def test_every_worker_advertises_both_numa_nodes_at_capacity(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int
) -> None:
    for node in workers:
        name = node.metadata.name
        eventually(
            lambda name=name: all(
                allocatable(core, name).get(r) == str(capacity) for r in RESOURCES
            ),
            120,
            f"{name} to advertise {RESOURCES} at {capacity}",
        )


def test_pod_on_numa_node_1_gets_its_cpus_and_memory(
    core: client.CoreV1Api, workers: list[client.V1Node], namespace: str
) -> None:
    node = workers[0].metadata.name
    command = (
        "echo NUMA_NODE=$NUMA_NODE; grep -E 'Cpus_allowed_list|Mems_allowed_list' /proc/self/status"
    )
    core.create_namespaced_pod(namespace, guaranteed_pod("numa1", node, RESOURCES[1], 1, command))
    eventually(
        lambda: core.read_namespaced_pod("numa1", namespace).status.phase == "Succeeded",
        180,
        "the pod to finish",
    )
    lines = dict(
        line.split(None, 1) if ":" in line else line.split("=", 1)
        for line in core.read_namespaced_pod_log("numa1", namespace).splitlines()
        if line.strip()
    )
    assert lines["NUMA_NODE"] == "1"
    assert parse_cpulist(lines["Cpus_allowed_list:"]) <= numa_cpus(core, node, 1)
    assert lines["Mems_allowed_list:"].strip() == "1"


def test_init_container_example_runs(core: client.CoreV1Api, namespace: str) -> None:
    manifest = yaml.safe_load((REPO / "deployments" / "examples" / "pod-numa0.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    core.create_namespaced_pod(namespace, manifest)
    name = manifest["metadata"]["name"]
    eventually(
        lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running",
        180,
        "the example pod to run",
    )
    init_log = core.read_namespaced_pod_log(name, namespace, container="init")
    assert "init on NUMA node 0" in init_log


def test_more_devices_than_capacity_stays_pending(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int, namespace: str
) -> None:
    node = workers[0].metadata.name
    pod = guaranteed_pod("too-many", node, RESOURCES[0], capacity + 1, "true")
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> str:
        for condition in core.read_namespaced_pod("too-many", namespace).status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return str(condition.message)
        return ""

    message = eventually(unschedulable, 60, "the scheduler to refuse the pod")
    assert f"Insufficient {RESOURCES[0]}" in message
    assert core.read_namespaced_pod("too-many", namespace).status.phase == "Pending"


def test_kubelet_restart_brings_resources_back_and_spares_running_pods(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int, namespace: str
) -> None:
    node = workers[-1]
    name = node.metadata.name
    core.create_namespaced_pod(
        namespace, guaranteed_pod("survivor", name, RESOURCES[0], 1, "sleep 3600")
    )
    eventually(
        lambda: core.read_namespaced_pod("survivor", namespace).status.phase == "Running",
        180,
        "the long-running pod",
    )
    before = core.read_namespaced_pod("survivor", namespace)
    ssh(node, "sudo", "systemctl", "restart", "rke2-agent")
    eventually(
        lambda: allocatable(core, name).get(RESOURCES[1]) == str(capacity),
        30,
        "the resources to come back within 30 s of the kubelet restart",
        interval=1,
    )
    after = core.read_namespaced_pod("survivor", namespace)
    assert after.metadata.uid == before.metadata.uid
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].restart_count == 0


def test_deleted_plugin_pod_comes_back_registered(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int
) -> None:
    name = workers[0].metadata.name
    old = plugin_pod(core, name)
    assert old is not None
    core.delete_namespaced_pod(old.metadata.name, NAMESPACE)

    def replaced_and_ready() -> bool:
        new = plugin_pod(core, name)
        return new is not None and new.metadata.uid != old.metadata.uid and pod_ready(new)

    eventually(replaced_and_ready, 180, "a new, ready plugin pod")
    assert all(allocatable(core, name).get(r) == str(capacity) for r in RESOURCES)
