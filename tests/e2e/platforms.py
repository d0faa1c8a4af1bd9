"""What the end-to-end tests see of a cluster, whichever it is: :class:`Platform` (the
plugin, the kubelet, the node's sysfs and pod resources API), the cluster's
description (:class:`ClusterConfig`), commands run with their output on failure
(:func:`run_checked`) and the plugin's pods and their progress."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.conftest import REPO
from tests.e2e import waits
from tests.e2e.progress import network_snapshot

NAMESPACE = "kube-system"
PLUGIN = "numa-device-plugin"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
INFRA = REPO / "test" / "infra"
SSH_KEY = INFRA / ".state" / "id_ed25519"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as ``{"name{labels}": value}``, each key the sample's
    name and labels as the plugin wrote them (comments skipped). Raises ValueError on a
    value that is not a number."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@dataclass(frozen=True)
class ClusterConfig:
    """A worker's NUMA shape: ``numa_cpus[n]`` is NUMA node n's cpulist (nodes with CPUs
    only), ``reserved_cpus`` the kubelet's reserved CPUs."""

    numa_cpus: dict[int, frozenset[int]]
    reserved_cpus: frozenset[int]

    @property
    def numa_nodes(self) -> int:
        return len(self.numa_cpus)

    def exclusive_cpus(self, node: int) -> int:
        """CPUs of NUMA node ``node`` the static CPU manager can hand out exclusively."""
        return len(self.numa_cpus[node] - self.reserved_cpus)


def run_checked(
    command: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    plugin_log: Callable[[], str] | None = None,
    retries: int = 4,
) -> str:
    """``command``'s stdout; when it exits non-zero, an AssertionError that shows the
    command, its exit status, the end of its stderr and stdout and, with ``plugin_log``,
    the plugin's last log lines (a bare CalledProcessError once hid why ``status``
    failed on a loaded machine).

    A kubectl that could not reach the API server at all (:data:`waits.UNREACHED`: the
    command it carries never ran) is run again, up to ``retries`` times, each time noted
    with what the node's network showed then (:func:`network_snapshot`). A run that took
    :data:`waits.SLOW_COMMAND` s or more is noted too. Raises subprocess.TimeoutExpired
    after ``timeout`` s of one run."""
    shown = shlex.join(command)
    for attempt in range(retries + 1):
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=env, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            waits.note(f"`{shown[:150]}`", time.monotonic() - started, "timed out")
            raise
        took = time.monotonic() - started
        if done.returncode == 0:
            if took >= waits.SLOW_COMMAND:
                waits.note(f"`{shown[:150]}`", took, "slow")
            return done.stdout
        if attempt == retries or not waits.UNREACHED.search(done.stderr):
            break
        network = network_snapshot() if os.environ.get("NUMA_E2E_LOCAL") else None
        waits.note(f"`{shown[:150]}` to reach the API server", took, "retried",
                   detail=done.stderr.strip().splitlines()[-1][:200], network=network)  # fmt: skip
        time.sleep(waits.RETRY_PAUSE)
    parts = [
        f"{shown} exited {done.returncode}",
        f"--- its stderr (end) ---\n{done.stderr[-4000:].rstrip()}",
        f"--- its stdout (end) ---\n{done.stdout[-2000:].rstrip()}",
    ]
    if plugin_log is not None:
        try:
            lines = plugin_log().splitlines()[-40:]
            parts.append("--- the plugin's last log lines ---\n" + "\n".join(lines))
        except Exception as exc:  # the failure at hand matters more
            parts.append(f"(the plugin's log could not be read: {exc})")
    raise AssertionError("\n".join(parts))


def read_cluster_config() -> ClusterConfig:
    """The KVM workers' shape as test/infra/config.env (and the environment) defines it."""
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
    nodes, per_node = int(output[0]), int(output[1])
    return ClusterConfig(
        {n: frozenset(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)},
        frozenset(map(int, output[2:])),
    )


def read_sysfs_layout(root: Path = Path("/sys")) -> dict[int, frozenset[int]]:
    """NUMA node → online cpulist for every node with a CPU, read from the kernel."""
    layout = {}
    for folder in sorted((root / "devices/system/node").glob("node[0-9]*")):
        cpus = parse_cpulist((folder / "cpulist").read_text())
        online = parse_cpulist((root / "devices/system/cpu/online").read_text())
        if cpus & online:
            layout[int(folder.name[4:])] = cpus & online
    return layout


class Platform:
    """How the tests reach the plugin and the kubelet of one node. Timeouts passed to
    :meth:`eventually` are seconds on a fast machine, multiplied by ``time_scale``."""

    node: str
    time_scale: float = 1.0
    host_network: bool = False
    memory_manager_static: bool = True
    disposable_kernel: bool = False
    # True where a controller manager makes each namespace's "default" ServiceAccount
    # (pods cannot be created in a new namespace before it exists).
    service_accounts: bool = False
    # How the plugin runs: process (from the checkout), kustomize or helm (the image).
    mode: str = "process"

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def eventually(
        self,
        check: Callable[[], Any],
        timeout: float,
        what: str,
        interval: float = 2.0,
        progress: Callable[[], Hashable] | None = None,
    ) -> Any:
        """Call ``check`` until it returns something truthy; fail after ``timeout`` s
        (scaled) without a change of ``progress`` (a view of what is awaited, e.g.
        :func:`pod_progress`), or after :data:`waits.PROGRESS_LIMIT` times that in all.
        The wait is noted in the test's line of the progress file."""
        found, failed = waits.wait(
            check, timeout * self.time_scale, what, interval=interval, progress=progress,
            tolerated=(client.ApiException, OSError, ValueError),
        )  # fmt: skip
        if failed is not None:
            pytest.fail(failed)
        return found

    def allocatable(self) -> dict[str, str]:
        found: dict[str, str] = self.core.read_node(self.node).status.allocatable
        return found

    # What each platform provides.
    def cluster_config(self) -> ClusterConfig:
        raise NotImplementedError

    def plugin_ready(self) -> bool:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        raise NotImplementedError

    def metrics_get(self, path: str) -> tuple[int, str]:
        """GET ``path`` of the plugin's metrics listener (``/``, ``/debug/state``):
        status and text."""
        raise NotImplementedError

    def cli(self, *args: str) -> str:
        """``numa-device-plugin ARGS`` run where the plugin runs; its stdout."""
        raise NotImplementedError

    def restart_plugin(self, capacity: str | None = None) -> None:
        """Stop the plugin and start it again (with ``--capacity capacity`` when given);
        return once it is ready."""
        raise NotImplementedError

    def reload_plugin(self) -> None:
        """SIGHUP: discover again and re-register."""
        raise NotImplementedError

    def plugin_settings(self) -> Any:
        """What :meth:`restart_plugin` changes, as it is now (for :meth:`restore_plugin`)."""
        raise NotImplementedError

    def restore_plugin(self, settings: Any) -> None:
        """Restart the plugin with ``settings`` from :meth:`plugin_settings`, exactly."""
        raise NotImplementedError

    def configure(self, settings: dict[str, str]) -> None:
        """Restart the plugin with these flags set (``{"memory-unit": "256Mi"}``) on top
        of its current settings; return once it is ready."""
        raise NotImplementedError

    def restart_kubelet(self, cpu_manager: str | None = None) -> None:
        """Kill the kubelet (SIGKILL where possible) and start it again, with the CPU
        manager policy ``cpu_manager`` when given."""
        raise NotImplementedError

    def pod_log(self, pod: str, namespace: str, container: str | None = None) -> str:
        text: str = self.core.read_namespaced_pod_log(pod, namespace, container=container)
        return text

    def pod_resources(self) -> pr_pb2.ListPodResourcesResponse | None:
        """The kubelet's pod resources ``List``, read by the test itself, where reachable."""
        return None

    def kubelet_devices(self, resource: str) -> set[str]:
        """The device ids the kubelet lists as allocatable for ``resource``."""
        raise NotImplementedError

    def set_cpu_online(self, cpu: int, online: bool) -> None:
        raise NotImplementedError

    # Shared helpers.
    def status(self) -> dict[str, Any]:
        # Each pod resources call may take longer on slow (TCG) guests.
        timeout = 10 * float(getattr(self, "time_scale", 1.0))
        document: dict[str, Any] = json.loads(
            self.cli("status", "--output", "json", "--timeout", f"{timeout:g}")
        )
        return document

    def registered(self, resources: tuple[str, ...]) -> bool:
        values = self.metrics()
        return all(
            values.get(f'numa_device_plugin_registered{{resource="{r}"}}') == 1 for r in resources
        )


def daemonset_pod(core: client.CoreV1Api, node: str) -> client.V1Pod | None:
    """The plugin DaemonSet's running pod on ``node`` that is not being deleted, or None."""
    pods = core.list_namespaced_pod(
        NAMESPACE,
        label_selector=f"app.kubernetes.io/name={PLUGIN}",
        field_selector=f"spec.nodeName={node}",
    ).items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return running[0] if running else None


def pod_ready(pod: client.V1Pod | None) -> bool:
    """The pod's Ready condition (its readiness probes); False for None."""
    conditions = (pod.status.conditions or []) if pod is not None else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def pod_progress(pod: client.V1Pod | None) -> Hashable:
    """A view of how far a pod got, for a wait's ``progress``: its phase, each condition's
    status and each container's state and reason (waiting ContainerCreating, running,
    terminated), ready and restarts. It changes as the pod is scheduled, pulled, started
    and probed; None for no pod."""
    if pod is None:
        return None
    status = pod.status
    containers = []
    for found in (status.init_container_statuses or []) + (status.container_statuses or []):
        state = found.state
        kinds = [k for k in ("waiting", "running", "terminated")
                 if state is not None and getattr(state, k) is not None]  # fmt: skip
        kind = kinds[0] if kinds else "unknown"
        reason = getattr(getattr(state, kind, None), "reason", None)
        containers.append((found.name, kind, reason, found.ready, found.restart_count))
    conditions = tuple(sorted((c.type, c.status) for c in status.conditions or []))
    return (status.phase, conditions, tuple(containers))


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
