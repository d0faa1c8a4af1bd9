"""The platform of the one-machine cluster when the plugin is what we ship: the image from
the local registry, installed by the README's kustomize or Helm command
(``make test-e2e-local PLUGIN=kustomize|helm``).

The plugin is then the DaemonSet's pod. The tests restart it by deleting its pod, change
its settings through the ConfigMap (kustomize) or ``helm upgrade`` (helm), read its output
with ``kubectl logs`` and run its CLI with ``kubectl exec``. The kubelet, containerd and the
pod-resources socket are still processes and files of the same namespace (or guest).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.localplatform import LocalPlatform
from tests.e2e.platforms import (
    NAMESPACE,
    PLUGIN,
    daemonset_pod,
    parse_metrics,
    pod_progress,
    pod_ready,
    run_checked,
)

RELEASE = "numa-device-plugin"
CHART = Path(__file__).resolve().parents[2] / "deployments" / "helm" / "numa-device-plugin"
METRICS_PORT, HEALTH_PORT = 9201, 9202
# The plugin's flags as chart values (config.*); the ConfigMap's keys are NUMA_<FLAG>.
CHART_VALUES = {
    "capacity": "capacity",
    "reserved-cpus": "reservedCpus",
    "memory-unit": "memoryUnit",
    "reserved-memory": "reservedMemory",
    "near": "near",
    "pod-resources-interval": "podResourcesInterval",
}
# Settings the chart takes as numbers.
NUMERIC = ("capacity", "pod-resources-interval")


class ShippedPlatform(LocalPlatform):
    """The node of the one-machine cluster with the plugin installed as a DaemonSet
    (``mode``: ``kustomize`` or ``helm``). Settings are the plugin's flag names without
    dashes' prefix (``{"capacity": "cpus"}``), as :meth:`configure` takes them."""

    def __init__(self, core: client.CoreV1Api, description: dict[str, Any]) -> None:
        super().__init__(core, description)
        self.mode: str = description["plugin"]
        self.host_network = False  # the bridge CNI plugin gives pods their own network
        self.service_accounts = True  # the controller manager makes them
        self.apps = client.AppsV1Api(core.api_client)
        self.kubectl_env = dict(os.environ, KUBECONFIG=description["kubeconfig"])
        self.helm = description["helm"]

    def eventually(
        self,
        check: Callable[[], Any],
        timeout: float,
        what: str,
        interval: float = 2.0,
        progress: Callable[[], Hashable] | None = None,
    ) -> Any:
        """As :meth:`Platform.eventually`; a timeout also shows the plugin's log tail and,
        when its container has restarted, why (a restart resets what its metrics
        count: a kubelet restart's test once waited for a counter of the run before)."""
        try:
            return super().eventually(check, timeout, what, interval, progress)
        except pytest.fail.Exception as failure:
            try:
                tail = "\n".join(self.plugin_log().splitlines()[-15:])
            except (AssertionError, subprocess.SubprocessError) as exc:
                tail = f"(no log: {exc})"
            restarted = ""
            with contextlib.suppress(client.ApiException, ValueError, TypeError):
                pod = self.plugin_pod()
                if pod is not None and any(
                    s.restart_count for s in pod.status.container_statuses or []
                ):
                    restarted = "\nthe plugin's container restarted:\n" + self.why_restarted(pod)
            pytest.fail(f"{failure}\nthe plugin's log ends:\n{tail}{restarted}")

    # --- the pod ---------------------------------------------------------------------------

    def plugin_pod(self) -> client.V1Pod | None:
        """The node's running plugin pod that is not being deleted, or None."""
        return daemonset_pod(self.core, self.node)

    def plugin_ready(self) -> bool:
        """The pod's Ready condition: its own readiness probe (``/readyz``)."""
        return pod_ready(self.plugin_pod())

    def why_restarted(self, pod: client.V1Pod) -> str:
        """What ended the plugin container's last run: its last state (reason, exit code,
        times), the pod's events and the end of the previous run's log."""
        (status,) = pod.status.container_statuses
        ended = status.last_state.terminated if status.last_state else None
        lines = [f"restarts: {status.restart_count}"]
        if ended is not None:
            lines.append(f"last run: {ended.reason} exit {ended.exit_code} signal {ended.signal},"
                         f" {ended.started_at} .. {ended.finished_at}")  # fmt: skip
        events = self.core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={pod.metadata.name}"
        )
        lines += [f"event: {e.type} {e.reason} x{e.count}: {e.message}" for e in events.items]
        with contextlib.suppress(subprocess.SubprocessError):
            previous = self.kubectl("-n", NAMESPACE, "logs", "--previous", pod.metadata.name,
                                    "-c", PLUGIN)  # fmt: skip
            lines += ["previous run's log ends:", *previous.splitlines()[-15:]]
        return "\n".join(lines)

    def _pod_get(self, port: int, path: str) -> tuple[int, str]:
        pod = self.plugin_pod()
        if pod is None or not pod.status.pod_ip:
            return 0, "no running plugin pod"
        try:
            url = f"http://{pod.status.pod_ip}:{port}{path}"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode(errors="replace")

    def rss(self) -> int:
        """The largest VmRSS (bytes) among the plugin container's processes (the plugin;
        dumb-init is tiny), read from /proc (the test shares the node's PID namespace)."""
        from tests.e2e.test_cluster import container_processes

        pod = self.plugin_pod()
        assert pod is not None, f"no running plugin pod on {self.node}"
        (status,) = pod.status.container_statuses
        sizes = []
        for pid in container_processes(status.container_id):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes.append(int(line.split()[1]) * 1024)
        assert sizes, "the container's processes are visible here"
        return max(sizes)

    def readyz(self) -> tuple[int, str]:
        return self._pod_get(HEALTH_PORT, "/readyz")

    def metrics_get(self, path: str) -> tuple[int, str]:
        return self._pod_get(METRICS_PORT, path)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self._pod_get(METRICS_PORT, "/metrics")[1])

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        """``kubectl ARGS`` against the cluster; its stdout. Raises AssertionError with
        its stderr (:func:`run_checked`)."""
        return run_checked(["kubectl", *args], timeout=timeout * self.time_scale,
                           env=self.kubectl_env)  # fmt: skip

    def cli(self, *args: str) -> str:
        """``kubectl exec`` of ``numa-device-plugin ARGS`` in the plugin's container."""
        pod = self.plugin_pod()
        assert pod is not None, f"no running plugin pod on {self.node}"
        return run_checked(
            ["kubectl", "-n", NAMESPACE, "exec", str(pod.metadata.name), "-c", PLUGIN, "--",
             "numa-device-plugin", *args],
            timeout=60 * self.time_scale, env=self.kubectl_env, plugin_log=self.plugin_log,
        )  # fmt: skip

    def plugin_log(self) -> str:
        """``kubectl logs`` of the node's plugin pod."""
        pod = self.plugin_pod()
        assert pod is not None, f"no running plugin pod on {self.node}"
        return self.kubectl("-n", NAMESPACE, "logs", pod.metadata.name, "-c", PLUGIN)

    def pod_log(self, pod: str, namespace: str, container: str | None = None) -> str:
        """Through the API server and the kubelet, as ``kubectl logs`` does."""
        text: str = self.core.read_namespaced_pod_log(pod, namespace, container=container)
        return text

    # --- restarts and settings -----------------------------------------------------------------

    def replace_pod(self) -> None:
        """Delete the node's plugin pod; return once the DaemonSet's new one is Ready."""
        old = self.plugin_pod()
        if old is not None:
            self.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        self.wait_new_pod(None if old is None else old.metadata.uid)

    def wait_new_pod(self, old_uid: str | None) -> None:
        def state() -> Hashable:
            new = self.plugin_pod()
            return None if new is None or new.metadata.uid == old_uid else pod_progress(new)

        self.eventually(
            lambda: (
                (new := self.plugin_pod()) is not None
                and new.metadata.uid != old_uid
                and self.plugin_ready()
            ),
            120,
            "a new plugin pod, Ready",
            0.5,
            progress=state,
        )

    def restart_plugin(self, capacity: str | None = None) -> None:
        if capacity is None:
            self.replace_pod()
            return
        settings = {"capacity": capacity}
        if capacity == "cpus":
            settings["reserved-cpus"] = self.description["reserved_cpus"]
        self.configure(settings)

    def reload_plugin(self) -> None:
        """SIGHUP to the container's PID 1 (dumb-init), which forwards it to the plugin."""
        pod = self.plugin_pod()
        assert pod is not None, f"no running plugin pod on {self.node}"
        script = f"import os; os.kill(1, {int(signal.SIGHUP)})"
        self.kubectl("-n", NAMESPACE, "exec", pod.metadata.name, "--", "python", "-c", script)

    def configure(self, settings: dict[str, str]) -> None:
        """Set the plugin's flags (``{"memory-unit": "256Mi"}``) as users do: the
        ConfigMap's ``NUMA_*`` keys and a new pod (kustomize), or ``helm upgrade
        --reuse-values`` (helm, whose config checksum rolls the pod); return once the
        new pod is Ready."""
        old = self.plugin_pod()
        if self.mode == "helm":
            sets: list[str] = []
            for flag, value in settings.items():
                typed: object = int(value) if value.isdigit() and flag in NUMERIC else value
                if flag == "near":  # NAME=SELECTOR ...: the chart's map NAME: SELECTOR
                    typed = dict(pair.split("=", 1) for pair in value.split())
                sets += ["--set-json", f"config.{CHART_VALUES[flag]}={json.dumps(typed)}"]
            self.helm_upgrade("--reuse-values", *sets)
        else:
            name = self.configmap()
            data = {f"NUMA_{f.upper().replace('-', '_')}": v for f, v in settings.items()}
            self.core.patch_namespaced_config_map(name, NAMESPACE, {"data": data})
            if old is not None:
                self.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        self.wait_new_pod(None if old is None else old.metadata.uid)

    def upgrade(self, *args: str) -> None:
        """``helm upgrade ARGS``; return once the node's new pod is Ready."""
        old = self.plugin_pod()
        self.helm_upgrade(*args)
        self.wait_new_pod(None if old is None else old.metadata.uid)

    def helm_upgrade(self, *args: str) -> None:
        """``helm upgrade`` of the release with ``args``; a failure names helm's own
        message (its output was captured). Raises AssertionError."""
        done = subprocess.run(
            [self.helm, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
            env=self.kubectl_env, capture_output=True, text=True,
            timeout=120 * self.time_scale,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"helm upgrade {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}"
        )

    def configmap(self) -> str:
        """The name of the ConfigMap the DaemonSet's container reads its env from."""
        daemonset = self.apps.read_namespaced_daemon_set(PLUGIN, NAMESPACE)
        (container,) = [c for c in daemonset.spec.template.spec.containers if c.name == PLUGIN]
        (source,) = [s for s in container.env_from or [] if s.config_map_ref is not None]
        return str(source.config_map_ref.name)

    def plugin_settings(self) -> Any:
        """helm: the release's user-supplied values; kustomize: the ConfigMap's data."""
        if self.mode == "helm":
            done = subprocess.run(
                [self.helm, "get", "values", RELEASE, "--namespace", NAMESPACE, "-o", "json"],
                env=self.kubectl_env, check=True, capture_output=True, text=True,
                timeout=60 * self.time_scale,
            )  # fmt: skip
            return json.loads(done.stdout) or {}
        return dict(self.core.read_namespaced_config_map(self.configmap(), NAMESPACE).data)

    def restore_plugin(self, settings: Any) -> None:
        """Exactly the settings :meth:`plugin_settings` read, on a new pod."""
        old = self.plugin_pod()
        if self.mode == "helm":
            values = Path(self.description["kubeconfig"]).parent / "restore-values.json"
            values.write_text(json.dumps(settings))
            self.helm_upgrade("--reset-values", "-f", str(values))
        else:
            # A merge patch keeps keys it does not name: replace the object's data whole.
            found = self.core.read_namespaced_config_map(self.configmap(), NAMESPACE)
            found.data = settings
            self.core.replace_namespaced_config_map(found.metadata.name, NAMESPACE, found)
        if old is not None:
            self.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        self.wait_new_pod(None if old is None else old.metadata.uid)
