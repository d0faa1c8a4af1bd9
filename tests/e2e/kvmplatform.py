"""The KVM cluster of ``test/infra/`` (``make test-e2e`` with ``KUBECONFIG``): the plugin
the DaemonSet, the kubelet an RKE2 agent reached over ssh."""

from __future__ import annotations

import shlex
import subprocess
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.stream import stream

from tests.e2e.platforms import (
    NAMESPACE,
    PLUGIN,
    SSH_KEY,
    ClusterConfig,
    Platform,
    daemonset_pod,
    parse_metrics,
    pod_ready,
    read_cluster_config,
)


class KvmPlatform(Platform):
    """A worker of the KVM cluster of test/infra: the plugin is the DaemonSet's pod there,
    the kubelet the RKE2 agent (restarted over ssh)."""

    def __init__(self, core: client.CoreV1Api, worker: client.V1Node) -> None:
        super().__init__(core)
        self.worker = worker
        self.node = worker.metadata.name
        self.apps = client.AppsV1Api()

    def cluster_config(self) -> ClusterConfig:
        return read_cluster_config()

    def plugin_pod(self) -> client.V1Pod | None:
        return daemonset_pod(self.core, self.node)

    def plugin_ready(self) -> bool:
        return pod_ready(self.plugin_pod())

    def _exec(self, command: list[str], timeout: float = 180.0) -> str:
        """``command`` in the node's plugin container: its stdout alone. stdout and
        stderr are read apart (merged, one warning line on stderr made the JSON of
        ``status`` unreadable) and the exit status is checked: a command that fails, or
        is still running after ``timeout`` seconds, fails the test with its stderr."""
        pod = self.plugin_pod()
        assert pod is not None, f"no running plugin pod on {self.node}"
        started = time.monotonic()
        session = stream(
            self.core.connect_get_namespaced_pod_exec, pod.metadata.name, NAMESPACE,
            command=command, stderr=True, stdin=False, stdout=True, tty=False,
            _preload_content=False,
        )  # fmt: skip
        try:
            session.run_forever(timeout=timeout)
            still_running = session.is_open()
            out, err = session.read_stdout(), session.read_stderr()
            code = None if still_running else session.returncode
        finally:
            session.close()
        took = time.monotonic() - started
        shown = shlex.join(command)
        if still_running:
            raise AssertionError(f"`{shown}` in {pod.metadata.name} still ran after {took:.0f} s; "
                                 f"stderr so far: {err[-2000:]!r}")  # fmt: skip
        if code != 0:
            raise AssertionError(
                f"`{shown}` in {pod.metadata.name} exited {code} after {took:.1f} s; "
                f"stderr: {err[-2000:]!r}; stdout: {out[-500:]!r}"
            )
        return str(out)

    def metrics(self) -> dict[str, float]:
        script = (
            "import urllib.request as u;"
            "print(u.urlopen('http://127.0.0.1:9201/metrics', timeout=5).read().decode())"
        )
        return parse_metrics(self._exec(["python", "-c", script]))

    def cli(self, *args: str) -> str:
        return self._exec(["numa-device-plugin", *args])

    def restart_plugin(self, capacity: str | None = None) -> None:
        """Delete the node's plugin pod (the DaemonSet makes a new one); a ``capacity``
        is set as ``NUMA_CAPACITY`` in the container's env (it beats the ConfigMap)."""
        if capacity is not None:
            env = [client.V1EnvVar(name="NUMA_CAPACITY", value=capacity)]
            patch = {"spec": {"template": {"spec": {"containers": [{"name": PLUGIN, "env": env}]}}}}
            self.apps.patch_namespaced_daemon_set(PLUGIN, NAMESPACE, patch)
        old = self.plugin_pod()
        if old is not None:
            self.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        self.eventually(
            lambda: (
                (new := self.plugin_pod()) is not None
                and (old is None or new.metadata.uid != old.metadata.uid)
                and self.plugin_ready()
            ),
            300,
            "a new plugin pod, ready",
        )

    def reload_plugin(self) -> None:
        self._exec(["python", "-c", "import os, signal; os.kill(1, signal.SIGHUP)"])

    def plugin_settings(self) -> Any:
        """The DaemonSet's container env (a list of dicts, or None), which
        :meth:`restart_plugin` patches."""
        daemonset = self.apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE)
        (container,) = [c for c in daemonset.spec.template.spec.containers if c.name == PLUGIN]
        return (
            None
            if container.env is None
            else [self.apps.api_client.sanitize_for_serialization(e) for e in container.env]
        )

    def restore_plugin(self, settings: Any) -> None:
        """Put the container's env back exactly (a JSON patch replaces the list, where a
        strategic merge would keep the NUMA_CAPACITY added), then restart the pod."""
        daemonset = self.apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE)
        names = [c.name for c in daemonset.spec.template.spec.containers]
        path = f"/spec/template/spec/containers/{names.index(PLUGIN)}/env"
        operation = (
            {"op": "remove", "path": path}
            if settings is None
            else {"op": "replace", "path": path, "value": settings}
        )
        self.apps.api_client.call_api(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{PLUGIN}",
            "PATCH",
            header_params={"Content-Type": "application/json-patch+json"},
            body=[operation],
            auth_settings=["BearerToken"],
            response_type="object",
        )
        self.restart_plugin()

    def restart_kubelet(self, cpu_manager: str | None = None) -> None:
        if cpu_manager is not None:
            pytest.skip("the KVM cluster's kubelet configuration is fixed by test/infra")
        if not SSH_KEY.is_file():
            pytest.fail(f"{SSH_KEY} is missing: the cluster was not made by test/infra")
        address = next(a.address for a in self.worker.status.addresses if a.type == "InternalIP")
        subprocess.run(
            ["ssh", "-i", str(SSH_KEY), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", f"ubuntu@{address}",
             "sudo", "systemctl", "kill", "-s", "KILL", "rke2-agent", "&&",
             "sudo", "systemctl", "start", "rke2-agent"],
            check=True, timeout=120,
        )  # fmt: skip

    def set_cpu_online(self, cpu: int, online: bool) -> None:
        pytest.skip("CPU hotplug is only done in the NUMA_VM guest's disposable kernel")
