"""Fixtures for the end-to-end tests on the KVM test cluster (test/infra/).

Run with `make test-e2e` and KUBECONFIG pointing at the cluster
(test/infra/create-cluster.sh writes test/infra/.state/kubeconfig). Every test
skips with the reason when no cluster is reachable.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.stream import stream

from tests.conftest import REPO

NAMESPACE = "kube-system"
PLUGIN = "numa-device-plugin"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
SSH_KEY = REPO / "test" / "infra" / ".state" / "id_ed25519"


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
def capacity(core: client.CoreV1Api) -> int:
    data = core.read_namespaced_config_map(PLUGIN, NAMESPACE).data or {}
    return int(data.get("NUMA_CAPACITY", "100"))


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
