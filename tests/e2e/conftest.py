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

:class:`Platform` is what the tests see of either. Without a cluster configured every test
skips; any other failure to reach it (a bad login, an API error) fails.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, config
from kubernetes.stream import stream

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.conftest import REPO
from tests.e2e import waits

NAMESPACE = "kube-system"
PLUGIN = "numa-device-plugin"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
INFRA = REPO / "test" / "infra"
SSH_KEY = INFRA / ".state" / "id_ed25519"


# The harness names a file (in the results share that comes back to the host): one JSON
# line per test, written as the test ends, so a run cut by a time limit still says what
# passed, what failed and why (test/local/render.py's progress_summary reads it).
PROGRESS = "NUMA_E2E_PROGRESS"
# Lines of a test's output kept as what it observed, and characters of each.
OBSERVED_LINES, OBSERVED_CHARS = 6, 300


def failure_chain(longrepr: object, keep: int = 4) -> list[str]:
    """``path:line`` of each frame of a failure's traceback, the test's own first and the
    raising frame last (a bare ``TimeoutError: timed out`` says nothing of which call
    timed out); at most ``keep``: the first and the last ``keep - 1`` with ``...``
    between. Empty for a skip or a traceback without locations (``--tb=native``)."""
    entries = getattr(getattr(longrepr, "reprtraceback", None), "reprentries", None) or []
    found = [f"{loc.path}:{loc.lineno}" for entry in entries
             if (loc := getattr(entry, "reprfileloc", None)) is not None]  # fmt: skip
    return found if len(found) <= keep else [found[0], "...", *found[1 - keep :]]


def progress_record(report: pytest.TestReport) -> dict[str, Any] | None:
    """The line :envvar:`NUMA_E2E_PROGRESS` gets for ``report``: one per test (its call,
    or a setup that failed or skipped, or a teardown that failed): ``{"test", "when",
    "outcome", "seconds", "observed": [its last printed lines], "why", "where":
    [:func:`failure_chain`], "plugin_log": [the plugin's last log lines, a failure's],
    "waits": [what it waited for and how long, :func:`waits.summary`], "network": {what
    the node's network showed at a failure, :func:`network_snapshot`}}``; None for the
    other phases."""
    if (
        report.when == "call"
        or (report.when == "setup" and not report.passed)
        or (report.when == "teardown" and report.failed)
    ):
        printed = [line for line in report.capstdout.splitlines() if line.strip()]
        why = None
        if not report.passed:
            crash = getattr(report.longrepr, "reprcrash", None)
            why = crash.message if crash is not None else str(report.longrepr)
            if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
                why = str(report.longrepr[2])
        return {
            "test": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "seconds": round(report.duration, 1),
            "observed": [line[:OBSERVED_CHARS] for line in printed[-OBSERVED_LINES:]],
            "why": None if why is None else why[:2000],
            "where": [] if report.passed else failure_chain(report.longrepr),
            "plugin_log": next((text.splitlines()[-OBSERVED_LINES:] for name, text
                                in report.sections if name.startswith("plugin log")), []),
            "waits": dict(report.user_properties).get("waits", []),
            "network": dict(report.user_properties).get("network"),
        }  # fmt: skip
    return None


# Lines of the plugin's log a failed test's report carries.
PLUGIN_LOG_LINES = 40


def plugin_log_tail(funcargs: dict[str, Any], lines: int = PLUGIN_LOG_LINES) -> str | None:
    """The last ``lines`` of the plugin's log, from the first of a test's fixtures that is
    a platform or holds one (``platform``, ``two.platform``, ``fleet.two.platform``);
    None when none does. A log that cannot be read gives the reason instead."""
    for value in funcargs.values():
        holders = (value, getattr(value, "platform", None),
                   getattr(getattr(value, "two", None), "platform", None))  # fmt: skip
        for candidate in holders:
            read = getattr(candidate, "plugin_log", None)
            if callable(read):
                try:
                    text = str(read())
                except Exception as exc:  # a report must not fail on it
                    return f"(the plugin's log could not be read: {exc})"
                return "\n".join(text.splitlines()[-lines:])
    return None


@functools.cache
def _netstate() -> Any:
    """``test/local/netstate.py``, loaded once (it is no package of the tests)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("netstate", REPO / "test/local/netstate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def network_snapshot() -> dict[str, Any]:
    """What this node's network shows (``test/local/netstate.py``: interface counters,
    TCP failures and retransmits, load, a timed TCP connect to the API server), for a
    failed test's report: beside the host's samples (``logs/network.jsonl``) it tells a
    guest that cannot reach the API server from one whose API server does not answer."""
    netstate = _netstate()
    target = None
    with contextlib.suppress(Exception):  # a report must not fail on it
        parsed = urllib.parse.urlsplit(client.Configuration.get_default_copy().host)
        if parsed.hostname and parsed.port:
            target = (parsed.hostname, parsed.port)
    found: dict[str, Any] = netstate.snapshot(target)
    return found


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
