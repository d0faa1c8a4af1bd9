"""Fixtures for the end-to-end tests, on either of two clusters:

- the one-machine cluster of ``test/local/cluster.py`` (``make test-e2e-local``), which sets
  ``NUMA_E2E_LOCAL`` to its description: the plugin is a process the tests can restart and
  re-configure, the kubelet one they can SIGKILL and start again, the node's sysfs and the
  kubelet's pod resources API are at hand;
  with ``WORKERS=2`` the same harness runs the control plane here and two worker guests,
  the tests in worker A (the platform's node, as above) and ``workers`` in the
  description naming both (``test_workers.py``);
- the KVM cluster of ``test/infra/`` (``make test-e2e`` with ``KUBECONFIG``): the plugin is
  the DaemonSet, the kubelet an RKE2 agent reached over ssh.

:class:`~tests.e2e.platforms.Platform` is what the tests see of either
(:mod:`tests.e2e.localplatform`, :mod:`tests.e2e.kvmplatform`); each test's outcome goes
to the progress file (:mod:`tests.e2e.progress`). Without a cluster configured every
test skips; any other failure to reach it (a bad login, an API error) fails. This file
holds only the hooks and the fixtures.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.e2e import waits
from tests.e2e.kvmplatform import KvmPlatform
from tests.e2e.localplatform import LocalPlatform
from tests.e2e.platforms import CONTROL_PLANE, ClusterConfig, Platform
from tests.e2e.progress import PROGRESS, network_snapshot, plugin_log_tail, progress_record


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test's notes of what it waited for start empty."""
    waits.reset()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test's report carries what it waited for (setup and call, :mod:`waits`); a
    failed one also the plugin's last log lines (a section pytest prints with the
    failure, and the progress file's ``plugin_log``: a probe or ``/metrics`` that timed
    out once left no trace of what the plugin was doing) and, in a guest, what the
    node's network showed (:func:`network_snapshot`)."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and not report.passed):
        report.user_properties.append(("waits", waits.summary()))
    if report.when == "call" and report.failed:
        tail = plugin_log_tail(getattr(item, "funcargs", {}))
        if tail is not None:
            report.sections.append(("plugin log (last lines)", tail))
        if os.environ.get("NUMA_E2E_LOCAL"):
            snapshot = network_snapshot()
            report.user_properties.append(("network", snapshot))
            report.sections.append(("the node's network at the failure",
                                    json.dumps(snapshot, indent=1)))  # fmt: skip


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append the test's line to the progress file, on disk at once (fsync)."""
    target = os.environ.get(PROGRESS)
    record = progress_record(report)
    if not target or record is None:
        return
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


@pytest.fixture(scope="session")
def core() -> client.CoreV1Api:
    local = os.environ.get("NUMA_E2E_LOCAL", "")
    path = os.environ.get("KUBECONFIG", "")
    if not local and (not path or not Path(path).is_file()):
        pytest.skip(
            "no cluster: run `make test-e2e-local KUBE_BIN_DIR=DIR`, or set KUBECONFIG to the "
            "KVM test cluster's kubeconfig (test/infra/create-cluster.sh writes "
            "test/infra/.state/kubeconfig)"
        )
    config.load_kube_config(path)
    api = client.CoreV1Api()
    api.list_node(_request_timeout=10)  # an error here fails: the cluster is configured
    return api


@pytest.fixture(scope="session")
def platform(core: client.CoreV1Api) -> Platform:
    local = os.environ.get("NUMA_E2E_LOCAL", "")
    if local:
        description = json.loads(Path(local).read_text())
        if description.get("plugin", "process") != "process":
            from tests.e2e.shipped import ShippedPlatform

            return ShippedPlatform(core, description)
        return LocalPlatform(core, description)
    workers = [n for n in core.list_node().items if CONTROL_PLANE not in (n.metadata.labels or {})]
    assert workers, "the KVM cluster has no worker nodes"
    return KvmPlatform(core, workers[0])


@pytest.fixture(scope="session")
def cluster(platform: Platform) -> ClusterConfig:
    return platform.cluster_config()


@pytest.fixture(scope="session")
def resources(cluster: ClusterConfig) -> tuple[str, ...]:
    return tuple(f"numa-align/numa-{n}" for n in sorted(cluster.numa_cpus))


@pytest.fixture
def two_numa_nodes(cluster: ClusterConfig) -> ClusterConfig:
    """Skips where the node has fewer than two NUMA nodes with CPUs (the premise of the
    test cannot hold there; the NUMA_VM guest has two)."""
    if cluster.numa_nodes < 2:
        pytest.skip(f"this machine has {cluster.numa_nodes} NUMA node with CPUs; needs 2 "
                    "(run with NUMA_VM=1)")  # fmt: skip
    return cluster


@pytest.fixture
def namespace(platform: Platform) -> Iterator[str]:
    """A namespace of its own per test. Afterwards its pods are deleted and waited for
    (without a controller manager a deleted namespace keeps its pods, and their CPUs).
    Deletions keep a grace period: the kubelet then removes the object only after the
    container stopped and its exclusive CPUs are free again (a forced deletion removes
    it at once)."""
    core = platform.core
    name = f"numa-e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    if platform.service_accounts:
        platform.eventually(
            lambda: core.read_namespaced_service_account("default", name), 60,
            f"the default ServiceAccount of {name}", 0.5,
        )  # fmt: skip
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=1)
    platform.eventually(
        lambda: not core.list_namespaced_pod(name).items, 120, f"the pods of {name} to go", 1
    )
    core.delete_namespace(name)


@pytest.fixture
def plugin_mode(platform: Platform) -> Iterator[Callable[[str], None]]:
    """``plugin_mode("cpus")`` restarts the plugin with that capacity; the test's end
    restores exactly the settings it found (the KVM DaemonSet's env without the
    ``NUMA_CAPACITY`` the switch added, so the ConfigMap decides again)."""
    saved: list[Any] = []

    def switch(capacity: str) -> None:
        if not saved:
            saved.append(platform.plugin_settings())
        platform.restart_plugin(capacity)

    yield switch
    if saved:
        platform.restore_plugin(saved[0])
