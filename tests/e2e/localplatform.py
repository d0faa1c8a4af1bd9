"""The one-machine cluster of ``test/local/cluster.py`` (``NUMA_E2E_LOCAL``): the plugin a
process the tests can restart and re-configure, the kubelet one they can SIGKILL and
start again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.e2e.platforms import (
    ClusterConfig,
    Platform,
    _running,
    parse_metrics,
    read_sysfs_layout,
    run_checked,
)


class LocalPlatform(Platform):
    """The one-machine cluster (``test/local/cluster.py``): processes in the same PID and
    mount namespace as the tests (or the same qemu guest)."""

    def __init__(self, core: client.CoreV1Api, description: dict[str, Any]) -> None:
        super().__init__(core)
        self.description = description
        self.node = description["node"]
        self.time_scale = float(description["time_scale"])
        self.host_network = True  # no CNI plugin: pods share the node's network
        self.memory_manager_static = description["memory_manager"] == "Static"
        self.disposable_kernel = bool(description["disposable_kernel"])
        self.processes: dict[str, dict[str, Any]] = description["processes"]

    def cluster_config(self) -> ClusterConfig:
        return ClusterConfig(read_sysfs_layout(), parse_cpulist(self.description["reserved_cpus"]))

    def _get(self, address: str, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode(errors="replace")

    def readyz(self) -> tuple[int, str]:
        """The plugin's ``/readyz``: status and text (the reasons when 503)."""
        return self._get(self.description["health"], "/readyz")

    def plugin_ready(self) -> bool:
        return self._get(self.description["health"], "/readyz")[0] == 200

    def metrics_get(self, path: str) -> tuple[int, str]:
        return self._get(self.description["metrics"], path)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self._get(self.description["metrics"], "/metrics")[1])

    def plugin_log(self) -> str:
        """The plugin process's log file."""
        return Path(self.processes["plugin"]["log"]).read_text(errors="replace")

    def cli(self, *args: str) -> str:
        command = [sys.executable, "-m", "numa_device_plugin", *args]
        if args[0] == "status":
            command += ["--pod-resources-socket", self.description["pod_resources_socket"]]
        return run_checked(
            command, timeout=60 * self.time_scale,
            plugin_log=self.plugin_log,
        )  # fmt: skip

    def _pid(self, name: str) -> int:
        return int(Path(self.processes[name]["pidfile"]).read_text())

    def _stop(self, name: str, signum: signal.Signals) -> None:
        pid = self._pid(name)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        self.eventually(lambda: not _running(pid), 30, f"{name} (pid {pid}) to exit", 0.2)

    def _start(self, name: str, argv: list[str]) -> None:
        entry = self.processes[name]
        with open(entry["log"], "ab") as out:
            child = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        Path(entry["pidfile"]).write_text(f"{child.pid}\n")
        entry["argv"] = argv

    def restart_plugin(self, capacity: str | None = None) -> None:
        argv = list(self.processes["plugin"]["argv"])
        if capacity is not None:
            argv = _with_capacity(argv, capacity, self.description["reserved_cpus"])
        self._stop("plugin", signal.SIGTERM)
        self._start("plugin", argv)
        self.eventually(self.plugin_ready, 60, "the restarted plugin to be ready", 0.5)

    def reload_plugin(self) -> None:
        os.kill(self._pid("plugin"), signal.SIGHUP)

    def plugin_settings(self) -> Any:
        return self.plugin_argv

    def restore_plugin(self, settings: Any) -> None:
        self.start_plugin_with(list(settings))

    def configure(self, settings: dict[str, str]) -> None:
        argv = self.plugin_argv
        for flag, value in settings.items():
            argv = _with_flag(argv, f"--{flag}", value)
        self.start_plugin_with(argv)

    def start_plugin_with(self, argv: list[str], ready: bool = True) -> None:
        """Stop the plugin and start ``argv`` in its place (``plugin_argv`` gives the
        current one); wait until it is ready when ``ready``."""
        self._stop("plugin", signal.SIGTERM)
        self._start("plugin", argv)
        if ready:
            self.eventually(self.plugin_ready, 60, "the restarted plugin to be ready", 0.5)

    @property
    def plugin_argv(self) -> list[str]:
        return list(self.processes["plugin"]["argv"])

    def restart_kubelet(self, cpu_manager: str | None = None) -> None:
        self._stop("kubelet", signal.SIGKILL)
        if cpu_manager is not None:
            path = Path(self.description["kubelet_config"])
            settings = json.loads(path.read_text())
            settings["cpuManagerPolicy"] = cpu_manager
            path.write_text(json.dumps(settings, indent=1))
            # The kubelet refuses a cpu_manager_state written under another policy.
            (Path(self.description["kubelet_root"]) / "cpu_manager_state").unlink(missing_ok=True)
        self._start("kubelet", self.processes["kubelet"]["argv"])

    def pod_log(self, pod: str, namespace: str, container: str | None = None) -> str:
        """The container's log file (the API server cannot reach a kubelet on 127.0.0.1),
        CRI lines ``<time> <stream> <tag> <text>``."""
        found = self.core.read_namespaced_pod(pod, namespace)
        name = container or found.spec.containers[0].name
        folder = Path(self.description["pod_logs"]) / f"{namespace}_{pod}_{found.metadata.uid}"
        files = sorted((folder / name).glob("*.log"))
        if not files:
            return ""
        return "\n".join(
            line.split(" ", 3)[3]
            for line in files[-1].read_text().splitlines()
            if line.count(" ") >= 3
        )

    def pod_resources(self) -> pr_pb2.ListPodResourcesResponse:
        target = f"unix://{self.description['pod_resources_socket']}"
        with grpc.insecure_channel(target) as channel:
            answer: pr_pb2.ListPodResourcesResponse = pr_grpc.PodResourcesListerStub(channel).List(
                pr_pb2.ListPodResourcesRequest(), timeout=10 * self.time_scale
            )
        return answer

    def kubelet_devices(self, resource: str) -> set[str]:
        """From the kubelet's pod resources API (``GetAllocatableResources``)."""
        target = f"unix://{self.description['pod_resources_socket']}"
        with grpc.insecure_channel(target) as channel:
            answer = pr_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
                pr_pb2.AllocatableResourcesRequest(), timeout=10 * self.time_scale
            )
        return {i for d in answer.devices if d.resource_name == resource for i in d.device_ids}

    def kubelet_memory(self) -> dict[int, dict[str, int]]:
        """Per NUMA node and memory type, the bytes the kubelet's Memory Manager may hand
        out (``GetAllocatableResources().memory``); empty unless its policy is Static."""
        target = f"unix://{self.description['pod_resources_socket']}"
        with grpc.insecure_channel(target) as channel:
            answer = pr_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
                pr_pb2.AllocatableResourcesRequest(), timeout=10 * self.time_scale
            )
        found: dict[int, dict[str, int]] = {}
        for block in answer.memory:
            for node in block.topology.nodes:
                found.setdefault(node.ID, {})[block.memory_type] = block.size
        return found

    def set_cpu_online(self, cpu: int, online: bool) -> None:
        if not self.disposable_kernel:
            pytest.fail("CPU hotplug is only done in the NUMA_VM guest's disposable kernel")
        Path(f"/sys/devices/system/cpu/cpu{cpu}/online").write_text("1" if online else "0")


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` (``flag value`` or ``flag=value``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag value`` in place of any earlier ``flag``."""
    return [*_without(argv, flag), flag, value]


def _with_capacity(argv: list[str], capacity: str, reserved: str) -> list[str]:
    """``argv`` with ``--capacity capacity`` and ``--reserved-cpus`` only in cpus mode."""
    out = _with_flag(_without(argv, "--reserved-cpus"), "--capacity", capacity)
    return _with_flag(out, "--reserved-cpus", reserved) if capacity == "cpus" else out
