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
    ClusterConfig,
    eventually,
    exec_in,
    metrics,
    plugin_pod,
    pod_ready,
    ssh,
    status,
)

pytestmark = pytest.mark.e2e
# What a pod prints to show where it runs, read from the kernel, not from the plugin.
WHERE = (
    "echo NUMA_NODE=$NUMA_NODE; "
    "grep -E 'Cpus_allowed_list|Mems_allowed_list' /proc/self/status; "
    "for n in /sys/devices/system/node/node[0-9]*; do "
    "echo ${n##*/}_cpulist: $(cat $n/cpulist); done"
)


def guaranteed_pod(
    name: str, node: str, resource: str, count: int, command: str, cpus: int = 2
) -> client.V1Pod:
    limits = {"cpu": str(cpus), "memory": "256Mi", resource: str(count)}
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


def placement(core: client.CoreV1Api, pod: str, namespace: str) -> dict[str, str]:
    """What ``WHERE`` printed: NUMA_NODE, Cpus_allowed_list, Mems_allowed_list and
    nodeN_cpulist for every NUMA node, as the pod's kernel shows them."""
    found = {}
    for line in core.read_namespaced_pod_log(pod, namespace).splitlines():
        key, sep, value = (
            line.partition("=") if line.startswith("NUMA_NODE=") else line.partition(":")
        )
        if sep:
            found[key.strip()] = value.strip()
    return found


def wait_phase(core: client.CoreV1Api, pod: str, namespace: str, phase: str) -> client.V1Pod:
    found: client.V1Pod = eventually(
        lambda: (p := core.read_namespaced_pod(pod, namespace)).status.phase == phase and p,
        180,
        f"{pod} to reach {phase}",
    )
    return found


def free_cpus(core: client.CoreV1Api, node: str, numa_node: int) -> int:
    pod = plugin_pod(core, node)
    assert pod is not None
    (entry,) = [n for n in status(core, pod)["nodes"] if n["id"] == numa_node]
    return int(entry["free_cpus"])


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


def test_every_worker_advertises_every_numa_node_at_capacity(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int, resources: tuple[str, ...]
) -> None:
    for node in workers:
        name = node.metadata.name
        eventually(
            lambda name=name: all(
                allocatable(core, name).get(r) == str(capacity) for r in resources
            ),
            120,
            f"{name} to advertise {resources} at {capacity}",
        )
        assert not [
            r for r in allocatable(core, name) if r.startswith("numa-align/") and r not in resources
        ], "no more NUMA nodes than the VMs have"


def test_pod_on_numa_node_1_gets_its_cpus_and_memory(
    core: client.CoreV1Api, workers: list[client.V1Node], namespace: str
) -> None:
    node = workers[0].metadata.name
    core.create_namespaced_pod(
        namespace, guaranteed_pod("numa1", node, "numa-align/numa-1", 1, WHERE)
    )
    wait_phase(core, "numa1", namespace, "Succeeded")
    seen = placement(core, "numa1", namespace)
    assert seen["NUMA_NODE"] == "1"
    # Checked against the kernel's cpulist read inside the pod, not the plugin's view.
    assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen["node1_cpulist"])
    assert parse_cpulist(seen["node1_cpulist"]) == numa_cpus(core, node, 1)
    assert seen["Mems_allowed_list"] == "1"


def test_more_exclusive_cpus_than_numa_node_0_has_fail_there_and_run_on_node_1(
    core: client.CoreV1Api, workers: list[client.V1Node], cluster: ClusterConfig, namespace: str
) -> None:
    """With CPU 0 reserved, NUMA node 0 has one exclusive CPU fewer than node 1: a pod
    asking node 1's count on numa-0 cannot be aligned; on numa-1 it runs there."""
    node = workers[0].metadata.name
    cpus = cluster.exclusive_cpus(1)
    assert cluster.exclusive_cpus(0) < cpus, "test/infra reserves a CPU of NUMA node 0"
    eventually(lambda: free_cpus(core, node, 1) >= cpus, 120, f"{cpus} free CPUs on node 1")
    too_big = guaranteed_pod("on-numa-0", node, "numa-align/numa-0", 1, WHERE, cpus=cpus)
    core.create_namespaced_pod(namespace, too_big)
    refused = wait_phase(core, "on-numa-0", namespace, "Failed")
    assert refused.status.reason == "TopologyAffinityError", refused.status
    fits = guaranteed_pod("on-numa-1", node, "numa-align/numa-1", 1, WHERE, cpus=cpus)
    core.create_namespaced_pod(namespace, fits)
    wait_phase(core, "on-numa-1", namespace, "Succeeded")
    seen = placement(core, "on-numa-1", namespace)
    assert parse_cpulist(seen["Cpus_allowed_list"]) == parse_cpulist(seen["node1_cpulist"])
    assert len(parse_cpulist(seen["Cpus_allowed_list"])) == cpus


def test_status_reports_no_misaligned_container(
    core: client.CoreV1Api, workers: list[client.V1Node], namespace: str
) -> None:
    node = workers[0].metadata.name
    for numa_node in (0, 1):
        name = f"hold-{numa_node}"
        pod = guaranteed_pod(name, node, f"numa-align/numa-{numa_node}", 1, "sleep 3600")
        core.create_namespaced_pod(namespace, pod)
        wait_phase(core, name, namespace, "Running")
    plugin = plugin_pod(core, node)
    assert plugin is not None
    document = status(core, plugin)
    holders = [h for n in document["nodes"] for h in n["holders"] if h["namespace"] == namespace]
    assert len(holders) == 2
    assert document["misaligned"] == 0
    assert document["cpu_manager_static"] is True


def test_init_container_example_runs(
    core: client.CoreV1Api, workers: list[client.V1Node], namespace: str
) -> None:
    manifest = yaml.safe_load((REPO / "deployments" / "examples" / "pod-numa0.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    # On a worker: the server (one NUMA node) runs the plugin too and offers numa-0.
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": workers[0].metadata.name}
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
    pod = guaranteed_pod("too-many", node, "numa-align/numa-0", capacity + 1, "true")
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> str:
        for condition in core.read_namespaced_pod("too-many", namespace).status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return str(condition.message)
        return ""

    message = eventually(unschedulable, 60, "the scheduler to refuse the pod")
    assert "Insufficient numa-align/numa-0" in message
    assert core.read_namespaced_pod("too-many", namespace).status.phase == "Pending"


def test_kubelet_restart_brings_resources_back_and_spares_running_pods(
    core: client.CoreV1Api, workers: list[client.V1Node], capacity: int, namespace: str
) -> None:
    node = workers[-1]
    name = node.metadata.name
    core.create_namespaced_pod(
        namespace, guaranteed_pod("survivor", name, "numa-align/numa-0", 1, "sleep 3600")
    )
    eventually(
        lambda: core.read_namespaced_pod("survivor", namespace).status.phase == "Running",
        180,
        "the long-running pod",
    )
    before = core.read_namespaced_pod("survivor", namespace)
    ssh(node, "sudo", "systemctl", "restart", "rke2-agent")
    eventually(
        lambda: allocatable(core, name).get("numa-align/numa-1") == str(capacity),
        30,
        "the resources to come back within 30 s of the kubelet restart",
        interval=1,
    )
    after = core.read_namespaced_pod("survivor", namespace)
    assert after.metadata.uid == before.metadata.uid
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].restart_count == 0


def test_after_plugin_and_kubelet_restarts_a_fresh_pod_is_admitted(
    core: client.CoreV1Api,
    workers: list[client.V1Node],
    capacity: int,
    resources: tuple[str, ...],
    namespace: str,
) -> None:
    node = workers[0]
    name = node.metadata.name
    old = plugin_pod(core, name)
    assert old is not None
    core.delete_namespaced_pod(old.metadata.name, NAMESPACE)

    def replaced_and_registered() -> client.V1Pod | None:
        new = plugin_pod(core, name)
        if new is None or new.metadata.uid == old.metadata.uid or not pod_ready(new):
            return None
        values = metrics(core, new)
        live = all(
            values.get(f'numa_device_plugin_registered{{resource="{r}"}}') == 1 for r in resources
        )
        return new if live else None

    plugin = eventually(replaced_and_registered, 180, "a new plugin pod, registered (metrics)")
    restarts = metrics(core, plugin).get("numa_device_plugin_kubelet_restarts_total", 0.0)
    ssh(node, "sudo", "systemctl", "restart", "rke2-agent")

    def registered_again() -> bool:
        values = metrics(core, plugin)
        return values.get("numa_device_plugin_kubelet_restarts_total", 0.0) > restarts and all(
            values.get(f'numa_device_plugin_registered{{resource="{r}"}}') == 1 for r in resources
        )

    eventually(registered_again, 60, "re-registration after the kubelet restart (metrics)", 1)
    eventually(
        lambda: all(allocatable(core, name).get(r) == str(capacity) for r in resources),
        60,
        "the node's allocatable",
    )
    core.create_namespaced_pod(
        namespace, guaranteed_pod("fresh", name, "numa-align/numa-1", 1, WHERE)
    )
    wait_phase(core, "fresh", namespace, "Succeeded")
    assert placement(core, "fresh", namespace)["NUMA_NODE"] == "1"
