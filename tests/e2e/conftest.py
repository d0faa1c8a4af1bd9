"""Fixtures for the end-to-end tests on the KVM test cluster (test/infra/).

Run with `make test-e2e` and KUBECONFIG pointing at the cluster
(test/infra/create-cluster.sh writes test/infra/.state/kubeconfig). Every test
skips with the reason when no cluster is reachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.stream import stream

from tests.conftest import REPO

NAMESPACE = "kube-system"
PLUGIN = "numa-device-plugin"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
INFRA = REPO / "test" / "infra"
SSH_KEY = INFRA / ".state" / "id_ed25519"


@dataclass(frozen=True)
class ClusterConfig:
    """The workers' shape as test/infra/config.env (and config.local.env, and the
    environment, as create-cluster.sh read them) defines it."""

    numa_nodes: int
    cpus_per_numa_node: int
    reserved_cpus: frozenset[int]

    def numa_cpus(self, node: int) -> frozenset[int]:
        first = node * self.cpus_per_numa_node
        return frozenset(range(first, first + self.cpus_per_numa_node))

    def exclusive_cpus(self, node: int) -> int:
        """CPUs of NUMA node ``node`` the static CPU manager can hand out exclusively."""
        return len(self.numa_cpus(node) - self.reserved_cpus)


def read_cluster_config() -> ClusterConfig:
    script = (
        'source "$INFRA_DIR/lib.sh"; load_config; '
        'echo "$NUMA_NODES_PER_WORKER $CPUS_PER_NUMA_NODE $RESERVED_CPU_IDS"'
    )
    output = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, INFRA_DIR=str(INFRA)),
    ).stdout.split()
    return ClusterConfig(int(output[0]), int(output[1]), frozenset(map(int, output[2:])))


@pytest.fixture(scope="session")
def cluster() -> ClusterConfig:
    return read_cluster_config()


@pytest.fixture(scope="session")
def resources(cluster: ClusterConfig) -> tuple[str, ...]:
    return tuple(f"numa-align/numa-{n}" for n in range(cluster.numa_nodes))


@pytest.fixture(scope="session")
def core() -> client.CoreV1Api:
    path = os.environ.get("KUBECONFIG", "")
    if not path or not Path(path).is_file():
        pytest.skip(
            "no cluster: set KUBECONFIG to the test cluster's kubeconfig "
            "(test/infra/create-cluster.sh writes test/infra/.state/kubeconfig)"
        )
    try:
        config.load_kube_config(path)
        api = client.CoreV1Api()
        api.list_node(_request_timeout=5)
    except Exception as exc:  # any failure to reach the cluster is a skip reason
        pytest.skip(f"no cluster reachable through KUBECONFIG={path}: {exc}")
    return api


@pytest.fixture(scope="session")
def apps(core: client.CoreV1Api) -> client.AppsV1Api:
    return client.AppsV1Api()


@pytest.fixture(scope="session")
def workers(core: client.CoreV1Api) -> list[client.V1Node]:
    nodes = [n for n in core.list_node().items if CONTROL_PLANE not in (n.metadata.labels or {})]
    if not nodes:
        pytest.skip("the cluster has no worker nodes")
    return nodes


@pytest.fixture(scope="session")
def capacity(apps: client.AppsV1Api, core: client.CoreV1Api) -> int:
    """The slot count the DaemonSet runs with (its ConfigMap has a kustomize hash suffix)."""
    daemonset = apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE)
    (source,) = daemonset.spec.template.spec.containers[0].env_from
    data = core.read_namespaced_config_map(source.config_map_ref.name, NAMESPACE).data or {}
    value = data.get("NUMA_CAPACITY", "100")
    if not value.isdigit():
        pytest.skip(f"the tests expect slots; the DaemonSet runs NUMA_CAPACITY={value}")
    return int(value)


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A namespace of its own per test, deleted afterwards with all it holds."""
    name = f"numa-e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 2.0) -> Any:
    """Call ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except client.ApiException as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def plugin_pod(core: client.CoreV1Api, node: str) -> client.V1Pod | None:
    pods = core.list_namespaced_pod(
        NAMESPACE,
        label_selector=f"app.kubernetes.io/name={PLUGIN}",
        field_selector=f"spec.nodeName={node}",
    ).items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return running[0] if running else None


def pod_ready(pod: client.V1Pod | None) -> bool:
    if pod is None:
        return False
    conditions = pod.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def exec_in(core: client.CoreV1Api, pod: client.V1Pod, command: list[str]) -> str:
    output: str = stream(
        core.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        pod.metadata.namespace,
        command=command,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return output


def node_ip(node: client.V1Node) -> str:
    return next(a.address for a in node.status.addresses if a.type == "InternalIP")


def ssh(node: client.V1Node, *command: str) -> None:
    if not SSH_KEY.is_file():
        pytest.skip(f"{SSH_KEY} is missing: the cluster was not made by test/infra")
    subprocess.run(
        [
            "ssh", "-i", str(SSH_KEY), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", f"ubuntu@{node_ip(node)}", *command,
        ],
        check=True,
        timeout=120,
    )  # fmt: skip


def metrics(core: client.CoreV1Api, pod: client.V1Pod) -> dict[str, float]:
    """The plugin's /metrics (port 9201 in its pod), as {'name{labels}': value}."""
    script = (
        "import urllib.request as u;"
        "print(u.urlopen('http://127.0.0.1:9201/metrics', timeout=5).read().decode())"
    )
    values = {}
    for line in exec_in(core, pod, ["python", "-c", script]).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def status(core: client.CoreV1Api, pod: client.V1Pod) -> dict[str, Any]:
    """``numa-device-plugin status --output json`` run in the plugin's pod."""
    document: dict[str, Any] = json.loads(
        exec_in(core, pod, ["numa-device-plugin", "status", "--output", "json"])
    )
    return document
