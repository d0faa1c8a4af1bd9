"""End to end on the test cluster of two workers (``make test-e2e-local WORKERS=2
PLUGIN=helm``): what only shows at cluster scale.

The tests run in worker A; worker B is reached only through the API server (allocatable,
pod placement and status, events, ``kubectl logs``) and its plugin pod's IP. Where a pod
runs is read from the kernel inside the pod (``Cpus_allowed_list``,
``Mems_allowed_list``, the NUMA nodes' cpulists), not from the plugin's account.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.e2e.platforms import NAMESPACE, PLUGIN, ClusterConfig, Platform, parse_metrics, pod_ready
from tests.e2e.shipped import METRICS_PORT, ShippedPlatform
from tests.e2e.test_cluster import (
    DATA_DISK,
    DATA_DISK_SERIAL,
    WHERE,
    container_processes,
    create,
    label,
    placement,
    pod_manifest,
    unschedulable,
    wait_phase,
    why_ended,
)
from tests.e2e.test_shipped import image_parts, retag, set_tag

pytestmark = pytest.mark.e2e
NUMA0, NUMA1 = "numa-align/numa-0", "numa-align/numa-1"
MEMORY1 = "numa-align/numa-1-memory"
UNIT_MIB = 256


class Workers:
    """The two workers as the tests see them: ``a`` (this guest, the platform's node) and
    ``b``, each a node name."""

    def __init__(self, platform: ShippedPlatform) -> None:
        self.platform = platform
        names = [w["name"] for w in platform.description["workers"]]
        self.a = platform.node
        (self.b,) = [n for n in names if n != self.a][:1]
        self.names = (self.a, self.b)

    def allocatable(self, node: str) -> dict[str, str]:
        """The node's allocatable as the API server (and so the scheduler) has it."""
        found: dict[str, str] = self.platform.core.read_node(node).status.allocatable
        return found

    def ours(self, node: str) -> dict[str, str]:
        """The node's ``numa-align/…`` allocatable entries."""
        return {k: v for k, v in self.allocatable(node).items() if k.startswith("numa-align/")}

    def plugin_pod(self, node: str) -> client.V1Pod | None:
        from tests.e2e.platforms import daemonset_pod

        return daemonset_pod(self.platform.core, node)

    def metrics(self, node: str) -> dict[str, float]:
        """The node's plugin's ``/metrics``, fetched from its pod IP (worker B's pod
        subnet is routed to B)."""
        pod = self.plugin_pod(node)
        assert pod is not None, f"no running plugin pod on {node}"
        assert pod.status.pod_ip, f"the plugin pod on {node} has no IP yet"
        url = f"http://{pod.status.pod_ip}:{METRICS_PORT}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return parse_metrics(answer.read().decode())

    def rolled_out(self) -> None:
        """Wait until the DaemonSet's rollout is complete on every worker (each node's
        pod is of the current template and Ready)."""
        self.platform.kubectl("-n", NAMESPACE, "rollout", "status", f"ds/{PLUGIN}",
                              f"--timeout={int(300 * self.platform.time_scale)}s",
                              timeout=320)  # fmt: skip
        self.platform.eventually(
            lambda: all(pod_ready(self.plugin_pod(n)) for n in self.names), 120,
            "a Ready plugin pod on every worker", 1,
        )  # fmt: skip

    def configure(self, settings: dict[str, str]) -> None:
        """The plugin's flags on every worker (``helm upgrade``/the ConfigMap), then the
        rollout on both."""
        self.platform.configure(settings)
        self.everywhere()

    def restore(self, saved: Any) -> None:
        """The settings :meth:`ShippedPlatform.plugin_settings` read, on every worker."""
        self.platform.restore_plugin(saved)
        self.everywhere()

    def everywhere(self) -> None:
        """After the platform changed worker A's settings: kustomize's ConfigMap reaches
        B only with a new pod (helm's config checksum rolls both); wait for both."""
        if self.platform.mode != "helm":
            pod = self.plugin_pod(self.b)
            if pod is not None:
                self.platform.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
        self.rolled_out()


@pytest.fixture(scope="module")
def two(platform: Platform) -> Workers:
    """The test cluster's two workers; skips on a one-node cluster."""
    found = getattr(platform, "description", {}).get("workers", [])
    if not isinstance(platform, ShippedPlatform) or len(found) < 2:
        pytest.skip("needs the test cluster of two workers: make test-e2e-local WORKERS=2 "
                    "PLUGIN=helm")  # fmt: skip
    return Workers(platform)


@pytest.fixture
def cpus_everywhere(two: Workers, cluster: ClusterConfig) -> Iterator[Workers]:
    """Every worker's plugin with ``--capacity cpus`` (reserved CPUs as the kubelets');
    the test's end restores the settings found."""
    saved = two.platform.plugin_settings()
    reserved = ",".join(map(str, sorted(cluster.reserved_cpus)))
    two.configure({"capacity": "cpus", "reserved-cpus": reserved})
    yield two
    two.restore(saved)


def on(platform: Platform, node: str | None, name: str, command: str, cpus: int,
       resource: str | None = None, count: int = 1, memory: str = "64Mi",
       more: dict[str, str] | None = None) -> client.V1Pod:  # fmt: skip
    """:func:`pod_manifest` pinned to ``node``, or left to the scheduler (None)."""
    pod = pod_manifest(platform, name, command, cpus, resource, count, memory, more)
    pod.spec.node_selector = None if node is None else {"kubernetes.io/hostname": node}
    return pod


def probe(node: str, name: str) -> client.V1Pod:
    """A pod on ``node`` asking only numa-0 (no CPUs or memory: BestEffort, so it needs
    no exclusive CPU), that exits at once: the kubelet admits it or fails it."""
    wanted = {NUMA0: "1"}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            restart_policy="Never",
            automount_service_account_token=False,
            termination_grace_period_seconds=1,
            containers=[client.V1Container(
                name="main", image="busybox:1.36", command=["true"],
                resources=client.V1ResourceRequirements(requests=wanted, limits=wanted),
            )],
        ),
    )  # fmt: skip


def runs(platform: Platform, namespace: str, pod: client.V1Pod) -> client.V1Pod:
    create(platform, namespace, pod)
    return wait_phase(platform, pod.metadata.name, namespace, "Running")


def where(platform: Platform, pod: str, namespace: str) -> dict[str, str]:
    """The pod's own account of where it runs (``WHERE``'s output), once the log holds
    node 1's cpulist: ``WHERE`` prints it after NUMA_NODE and the allowed lists, and a
    log read while the pod is still printing lacks it (KeyError seen on v1.36.2)."""
    found: dict[str, str] = platform.eventually(
        lambda: (seen := placement(platform, pod, namespace)).get("node1_cpulist") and seen,
        120, f"{pod}'s placement",
    )  # fmt: skip
    return found


def on_node_1(seen: dict[str, str]) -> bool:
    """True when the pod's CPUs are all in NUMA node 1's cpulist, both as its kernel says."""
    return parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen["node1_cpulist"])


def admission_failures(platform: Platform, namespace: str) -> list[str]:
    """Events of the namespace that say a pod failed admission or topology alignment."""
    events = platform.core.list_namespaced_event(namespace).items
    return [
        f"{e.involved_object.name}: {e.reason}: {e.message}"
        for e in events
        if e.reason in ("TopologyAffinityError", "UnexpectedAdmissionError")
        or "TopologyAffinityError" in (e.message or "")
    ]


def failed_pods(platform: Platform, namespace: str) -> list[str]:
    return [
        f"{p.metadata.name}: {p.status.reason}: {p.status.message}"
        for p in platform.core.list_namespaced_pod(namespace).items
        if p.status.phase == "Failed"
    ]


def free_after(platform: Platform, namespace: str, name: str) -> None:
    """Delete a pod (1 s grace) and wait until it is gone, its CPUs free again."""
    platform.core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)

    def gone() -> bool:
        try:
            platform.core.read_namespaced_pod(name, namespace)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        return False

    platform.eventually(gone, 120, f"{name} to go", 1)


def test_both_workers_advertise_numa_0_and_numa_1_and_nothing_for_the_memory_only_node(
    two: Workers, namespace: str
) -> None:
    """Each worker's kernel (read inside a pod there) has NUMA nodes 0 and 1 with CPUs,
    worker A a memory-only node 2 as well; the API server lists exactly numa-0 and numa-1
    for each."""
    platform = two.platform
    kernels = {}
    for node in two.names:
        name = f"kernel-{node[-1]}"
        create(platform, namespace, on(platform, node, name, WHERE, 1))
        wait_phase(platform, name, namespace, "Succeeded")
        kernels[node] = placement(platform, name, namespace)
    for node, seen in kernels.items():
        with_cpus = sorted(k for k, v in seen.items() if k.endswith("_cpulist") and v)
        print(f"{node}: {dict(sorted((k, v) for k, v in seen.items() if k.endswith('_cpulist')))}"
              f"; allocatable {two.ours(node)}")  # fmt: skip
        assert with_cpus == ["node0_cpulist", "node1_cpulist"]
        # Resources an earlier test's settings added (numa-N-memory) stay listed at 0.
        platform.eventually(
            lambda n=node: {k for k, v in two.ours(n).items() if v != "0"} == {NUMA0, NUMA1},
            120, f"{node}: numa-0 and numa-1",
        )  # fmt: skip
        assert not [k for k in two.ours(node) if k.startswith("numa-align/numa-2")]
    assert kernels[two.a].get("node2_cpulist", None) == "", "worker A has a memory-only node"
    assert "node2_cpulist" not in kernels[two.b]


def test_capacity_cpus_sends_the_pod_to_the_worker_whose_numa_node_1_has_room(
    cpus_everywhere: Workers, cluster: ClusterConfig, namespace: str
) -> None:
    """Node 0 full everywhere; worker A's node 1 full of a foreign exclusive pod: a pod
    asking numa-1 lands on B, on node 1's CPUs. B's node 1 full too: the next one waits
    Pending, Insufficient numa-1 on both workers. A freed: it runs on A, on node 1."""
    two, platform = cpus_everywhere, cpus_everywhere.platform
    e0, e1 = cluster.exclusive_cpus(0), cluster.exclusive_cpus(1)
    for node in two.names:
        platform.eventually(
            # Only these two: numa-N-memory of an earlier --memory-unit test stay at 0.
            lambda n=node: (two.ours(n).get(NUMA0), two.ours(n).get(NUMA1)) == (str(e0), str(e1)),
            120,
            f"{node}: numa-0={e0}, numa-1={e1}",
        )  # fmt: skip
        # Node 0's exclusive CPUs taken, so every later foreign CPU comes from node 1.
        runs(platform, namespace, on(platform, node, f"fill0-{node[-1]}", "sleep 3600", e0))
    runs(platform, namespace, on(platform, two.a, "fill1-a", "sleep 3600", e1))
    platform.eventually(lambda: two.ours(two.a).get(NUMA1) == "0", 120, "A: numa-1=0")

    first = runs(platform, namespace, on(platform, None, "first", WHERE + "; sleep 3600", 1,
                                         NUMA1))  # fmt: skip
    seen = where(platform, "first", namespace)
    print(f"first: {first.spec.node_name}, NUMA_NODE={seen['NUMA_NODE']}, "
          f"CPUs {seen['Cpus_allowed_list']} (node 1: {seen['node1_cpulist']})")  # fmt: skip
    assert first.spec.node_name == two.b
    assert on_node_1(seen)
    assert seen["NUMA_NODE"] == "1"

    if e1 > 1:
        runs(platform, namespace, on(platform, two.b, "fill1-b", "sleep 3600", e1 - 1))
    # B's node 1 full as the scheduler sees it: only first's device left. Before the
    # plugin's next count reaches B's node status, B shows room for numa-1 and the
    # scheduler's first refusal names B for cpu alone ("1 Insufficient numa-1").
    platform.eventually(lambda: two.ours(two.b).get(NUMA1) == "1", 120, "B: numa-1=1")
    create(platform, namespace, on(platform, None, "second", WHERE + "; sleep 3600", 1, NUMA1))
    refusal = platform.eventually(lambda: unschedulable(platform, "second", namespace), 120,
                                  "second to be refused")  # fmt: skip
    print(f"second: {refusal}")
    assert f"2 Insufficient {NUMA1}" in refusal
    assert platform.core.read_namespaced_pod("second", namespace).status.phase == "Pending"

    free_after(platform, namespace, "fill1-a")
    second = wait_phase(platform, "second", namespace, "Running")
    seen = where(platform, "second", namespace)
    print(f"second after A was freed: {second.spec.node_name}, CPUs {seen['Cpus_allowed_list']}")
    assert second.spec.node_name == two.a
    assert on_node_1(seen)
    assert seen["NUMA_NODE"] == "1"
    assert not admission_failures(platform, namespace)
    assert not failed_pods(platform, namespace)


@pytest.fixture
def memory_everywhere(two: Workers) -> Iterator[Workers]:
    """Every worker's plugin with ``--memory-unit 256Mi`` and the kubelets' reserved
    memory (both run the Memory Manager Static); restored afterwards."""
    if not two.platform.memory_manager_static:
        pytest.skip("needs the kubelets' Memory Manager policy Static")
    saved = two.platform.plugin_settings()
    two.configure({"memory-unit": f"{UNIT_MIB}Mi",
                   "reserved-memory": two.platform.description["reserved_memory"]})  # fmt: skip
    yield two
    two.restore(saved)


def test_memory_unit_sends_the_pod_to_the_worker_whose_numa_node_1_has_memory(
    memory_everywhere: Workers, namespace: str
) -> None:
    """The same placement with the Memory Manager Static: A's node 1 memory taken by a
    foreign pod, a pod asking 4 units of numa-1 memory lands on B with its memory on node
    1; B taken too, the next waits Pending for both; A freed, it runs on A."""
    two, platform = memory_everywhere, memory_everywhere.platform
    units = {}
    for node in two.names:
        # Non-zero: an earlier test's numa-1-memory stays listed at "0" until this
        # rollout's plugin registers it again and the kubelet's next node status says so.
        units[node] = platform.eventually(
            lambda n=node: int(two.ours(n).get(MEMORY1, "0")), 120, f"{node}: {MEMORY1} > 0"
        )  # fmt: skip
    print(f"{MEMORY1} allocatable (units of {UNIT_MIB}Mi): {units}")
    assert min(units.values()) >= 8, "NUMA node 1 needs at least 2 GiB for the test"
    # Foreign to the memory resource: it holds numa-1 (so its memory is on node 1), not
    # numa-1-memory, and leaves 2 units there.
    big = (units[two.a] - 2) * UNIT_MIB
    runs(platform, namespace, on(platform, two.a, "take-a", "sleep 3600", 1, NUMA1,
                                 memory=f"{big}Mi"))  # fmt: skip
    platform.eventually(lambda: two.ours(two.a).get(MEMORY1) == "2", 120, f"A: {MEMORY1}=2")

    wanted = {MEMORY1: "4"}
    four = f"{4 * UNIT_MIB}Mi"
    first = runs(platform, namespace, on(platform, None, "first", WHERE + "; sleep 3600", 1,
                                         NUMA1, memory=four, more=wanted))  # fmt: skip
    seen = where(platform, "first", namespace)
    print(f"first: {first.spec.node_name}, Mems_allowed_list {seen['Mems_allowed_list']}")
    assert first.spec.node_name == two.b
    assert seen["Mems_allowed_list"] == "1"
    assert on_node_1(seen)

    # B keeps 2 units free after first's 4: the next pod's 4 fit nowhere.
    big = (units[two.b] - 6) * UNIT_MIB
    runs(platform, namespace, on(platform, two.b, "take-b", "sleep 3600", 1, NUMA1,
                                 memory=f"{big}Mi"))  # fmt: skip
    platform.eventually(lambda: two.ours(two.b).get(MEMORY1) == "6", 120, f"B: {MEMORY1}=6")
    create(platform, namespace, on(platform, None, "second", WHERE + "; sleep 3600", 1, NUMA1,
                                   memory=f"{4 * UNIT_MIB}Mi", more=wanted))  # fmt: skip
    refusal = platform.eventually(lambda: unschedulable(platform, "second", namespace), 120,
                                  "second to be refused")  # fmt: skip
    print(f"second: {refusal}")
    assert f"2 Insufficient {MEMORY1}" in refusal

    free_after(platform, namespace, "take-a")
    second = wait_phase(platform, "second", namespace, "Running")
    seen = where(platform, "second", namespace)
    print(f"second after A was freed: {second.spec.node_name}, "
          f"Mems_allowed_list {seen['Mems_allowed_list']}")  # fmt: skip
    assert second.spec.node_name == two.a
    assert seen["Mems_allowed_list"] == "1"
    assert on_node_1(seen)
    assert not admission_failures(platform, namespace)
    assert not failed_pods(platform, namespace)


def test_per_node_configuration_gives_each_worker_its_own(
    two: Workers, cluster: ClusterConfig
) -> None:
    """Through the chart: worker A labelled ``exact`` serves node 0's exclusive CPUs,
    worker B labelled ``slots`` 7 devices; B relabelled ``exact`` switches, A stays."""
    platform = two.platform
    if platform.mode != "helm":
        pytest.skip("per-node configuration is the chart's (PLUGIN=helm)")
    reserved = ",".join(map(str, sorted(cluster.reserved_cpus)))
    named = {"slots": {"capacity": 7}, "exact": {"capacity": "cpus", "reservedCpus": reserved}}
    e0 = str(cluster.exclusive_cpus(0))
    saved = platform.plugin_settings()
    label(platform.core, two.a, "exact")
    label(platform.core, two.b, "slots")
    try:
        platform.helm_upgrade(
            "--reuse-values", "--set-json", f"config.named={json.dumps(named)}",
            "--set", "config.default=slots", "--set-json", "config.nodeConfigInterval=1",
        )  # fmt: skip
        two.rolled_out()
        for node, wanted in ((two.a, e0), (two.b, "7")):
            platform.eventually(lambda n=node, w=wanted: two.ours(n).get(NUMA0) == w, 120,
                                f"{node}: {NUMA0}={wanted}")  # fmt: skip
        print(f"A exact: {two.ours(two.a)}; B slots: {two.ours(two.b)}")
        label(platform.core, two.b, "exact")
        platform.eventually(lambda: two.ours(two.b).get(NUMA0) == e0, 120, f"B: {NUMA0}={e0}")
        assert two.ours(two.a).get(NUMA0) == e0
        print(f"B relabelled exact: {two.ours(two.b)}")
    finally:
        label(platform.core, two.a, None)
        label(platform.core, two.b, None)
        two.restore(saved)


def test_a_rolling_update_goes_node_by_node_and_fails_no_pod(two: Workers, namespace: str) -> None:
    """A new image tag: the DaemonSet replaces one worker's plugin at a time (never both
    unready), workload pods on both keep their containers, and while one worker's plugin
    is being replaced, pods asking numa-0 on the other are admitted (none Failed).

    Not asked: a pod bound to the very worker whose plugin is between two pods. The
    kubelet marks a resource's devices unhealthy when its plugin disconnects
    (``PluginDisconnected``) and the scheduler sees it only with the next node status,
    so such a pod can fail admission with any device plugin; the DaemonSet's
    ``maxUnavailable: 1`` keeps that to one worker at a time."""
    platform = two.platform
    kept = {}
    for node in two.names:
        name = f"keep-{node[-1]}"
        found = runs(platform, namespace, on(platform, node, name, "sleep 3600", 1, NUMA1))
        (status,) = found.status.container_statuses
        kept[name] = status
    pids = container_processes(kept["keep-a"].container_id)
    old = two.plugin_pod(two.a)
    assert old is not None
    image = old.spec.containers[0].image
    repository, tag, digest = image_parts(image)
    new = f"{tag}-cluster"
    retag(platform.description["registry"], tag, new, 10 * platform.time_scale)
    unready: dict[str, list[float]] = {n: [] for n in two.names}
    probes: dict[str, list[str]] = {n: [] for n in two.names}
    try:
        set_tag(platform, repository, new)
        started = time.monotonic()
        deadline = started + 600 * platform.time_scale
        while time.monotonic() < deadline:
            now = time.monotonic() - started
            pods = {n: two.plugin_pod(n) for n in two.names}
            for node, pod in pods.items():
                if not pod_ready(pod):
                    unready[node].append(now)
            assert not all(unready[n] and unready[n][-1] == now for n in two.names), (
                f"both workers without a Ready plugin at {now:.1f} s"
            )
            # While one worker's plugin is replaced, a pod asking numa-0 on the other.
            for node, other in ((two.a, two.b), (two.b, two.a)):
                if not pod_ready(pods[node]) and pod_ready(pods[other]) and len(probes[other]) < 3:
                    name = f"probe-{other[-1]}-{len(probes[other])}"
                    create(platform, namespace, probe(other, name))
                    probes[other].append(name)
            if all(p is not None and p.spec.containers[0].image == f"{repository}:{new}"
                   and pod_ready(p) for p in pods.values()):  # fmt: skip
                break
            time.sleep(0.5)
        else:
            pytest.fail("the rollout did not finish")
        windows = {n: (round(t[0], 1), round(t[-1], 1)) for n, t in unready.items() if t}
        print(f"rollout: unready windows (s) {windows}; probe pods {probes}")
        assert set(windows) == set(two.names), "each worker's plugin was replaced"
        (a0, a1), (b0, b1) = windows[two.a], windows[two.b]
        assert a1 < b0 or b1 < a0, "one worker at a time"
        for node in two.names:
            pod = two.plugin_pod(node)
            assert pod is not None
            assert pod.status.container_statuses[0].restart_count == 0, (
                f"{node}: the new plugin pod restarted: {why_ended(platform, pod)}"
            )
        for name, status in kept.items():
            (now_status,) = platform.core.read_namespaced_pod(
                name, namespace).status.container_statuses  # fmt: skip
            assert now_status.container_id == status.container_id, f"{name} kept its container"
            assert now_status.restart_count == status.restart_count == 0
        assert container_processes(kept["keep-a"].container_id) >= pids

        def settled() -> bool:
            phases = [platform.core.read_namespaced_pod(p, namespace).status.phase
                      for n in two.names for p in probes[n]]  # fmt: skip
            return all(ph in ("Succeeded", "Failed") for ph in phases)

        assert all(probes.values()), (
            "each worker admitted pods while the other's plugin was replaced"
        )
        platform.eventually(settled, 300, "every probe pod to end")
        assert not failed_pods(platform, namespace)
        assert not admission_failures(platform, namespace)
    finally:
        set_tag(platform, repository, tag, digest)
        two.rolled_out()


def test_a_kubelet_sigkill_on_worker_a_leaves_worker_b_untouched(
    two: Workers, resources: tuple[str, ...], namespace: str
) -> None:
    """SIGKILL A's kubelet and start it again: A's plugin registers again; on B the plugin
    pod, its registrations and the workload pod's container are unchanged."""
    platform = two.platform
    workload = runs(platform, namespace, on(platform, two.b, "work-b", "sleep 3600", 1, NUMA1))
    (before,) = workload.status.container_statuses
    b_pod = two.plugin_pod(two.b)
    assert b_pod is not None
    b_before = platform.eventually(lambda: two.metrics(two.b), 60, "B's metrics")
    a_before = platform.eventually(lambda: two.metrics(two.a), 60, "A's metrics")
    platform.restart_kubelet()
    platform.eventually(
        lambda: two.metrics(two.a).get("numa_device_plugin_kubelet_restarts_total", 0)
        > a_before.get("numa_device_plugin_kubelet_restarts_total", 0),
        120, "A's plugin to see the kubelet restart",
    )  # fmt: skip
    platform.eventually(lambda: platform.registered(resources), 120, "A registered again")
    platform.eventually(lambda: set(two.ours(two.a)) >= set(resources), 120, "A's allocatable")
    b_after = platform.eventually(lambda: two.metrics(two.b), 60, "B's metrics")
    after_pod = two.plugin_pod(two.b)
    assert after_pod is not None
    assert after_pod.metadata.uid == b_pod.metadata.uid
    assert after_pod.status.container_statuses[0].restart_count == (
        b_pod.status.container_statuses[0].restart_count
    )
    for name in ("numa_device_plugin_kubelet_restarts_total",):
        assert b_after.get(name) == b_before.get(name), name
    registrations = [k for k in b_before if k.startswith("numa_device_plugin_registrations_total")]
    assert registrations
    for key in registrations:
        assert b_after[key] == b_before[key], key
    (after,) = platform.core.read_namespaced_pod("work-b", namespace).status.container_statuses
    assert after.container_id == before.container_id
    assert after.restart_count == 0
    print(f"A: kubelet restarts {a_before.get('numa_device_plugin_kubelet_restarts_total')} -> "
          f"{two.metrics(two.a).get('numa_device_plugin_kubelet_restarts_total')}; "
          f"B: plugin pod {b_pod.metadata.name} kept, registrations unchanged")  # fmt: skip


def test_a_deployment_of_numa_1_replicas_spreads_without_one_topology_affinity_error(
    cpus_everywhere: Workers, cluster: ClusterConfig, namespace: str
) -> None:
    """``capacity=cpus``, each worker's node 1 with room for 2 one-CPU pods (foreign pods
    take node 0 and the rest of node 1): a Deployment of 4 replicas asking numa-1 spreads
    2 and 2 over the workers, each replica on node 1's CPUs, with no
    TopologyAffinityError; a fifth replica waits Pending, Insufficient numa-1."""
    two, platform = cpus_everywhere, cpus_everywhere.platform
    e0, e1 = cluster.exclusive_cpus(0), cluster.exclusive_cpus(1)
    assert e1 >= 2, "node 1 needs 2 exclusive CPUs"
    replicas, room = 4, 2
    for node in two.names:
        platform.eventually(lambda n=node: two.ours(n).get(NUMA1) == str(e1), 120,
                            f"{node}: numa-1={e1}")  # fmt: skip
        runs(platform, namespace, on(platform, node, f"fill0-{node[-1]}", "sleep 3600", e0))
        if e1 > room:
            runs(platform, namespace, on(platform, node, f"fill1-{node[-1]}", "sleep 3600",
                                         e1 - room))  # fmt: skip
        platform.eventually(lambda n=node: two.ours(n).get(NUMA1) == str(room), 120,
                            f"{node}: numa-1={room}")  # fmt: skip
    template = on(platform, None, "replica", WHERE + "; sleep 3600", 1, NUMA1)
    apps = client.AppsV1Api(platform.core.api_client)
    labels = {"app": "numa-1-replicas"}
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="numa-1-replicas"),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=template.spec
            ),
        ),
    )
    deployment.spec.template.spec.restart_policy = "Always"
    apps.create_namespaced_deployment(namespace, deployment)
    try:

        def running() -> list[client.V1Pod]:
            return [p for p in platform.core.list_namespaced_pod(
                        namespace, label_selector="app=numa-1-replicas").items
                    if p.status.phase == "Running"]  # fmt: skip

        pods = platform.eventually(lambda: len(found := running()) == replicas and found, 300,
                                   f"{replicas} replicas Running")  # fmt: skip
        spread: dict[str, int] = {}
        for pod in pods:
            spread[pod.spec.node_name] = spread.get(pod.spec.node_name, 0) + 1
            seen = where(platform, pod.metadata.name, namespace)
            assert on_node_1(seen), f"{pod.metadata.name}: {seen}"
        print(f"{replicas} replicas: {spread}")
        assert spread == {two.a: room, two.b: room}
        more = {"spec": {"replicas": replicas + 1}}
        apps.patch_namespaced_deployment_scale("numa-1-replicas", namespace, more)

        def extra() -> str:
            for pod in platform.core.list_namespaced_pod(namespace).items:
                if pod.status.phase == "Pending":
                    return unschedulable(platform, pod.metadata.name, namespace)
            return ""

        refusal = platform.eventually(extra, 120, "the extra replica to be refused")
        print(f"replica {replicas + 1}: {refusal}")
        assert f"2 Insufficient {NUMA1}" in refusal
        assert len(running()) == replicas
        assert not admission_failures(platform, namespace)
        assert not failed_pods(platform, namespace)
    finally:
        # The namespace fixture deletes pods; a Deployment left behind would make new ones.
        apps.delete_namespaced_deployment("numa-1-replicas", namespace)


def one_per_node(name: str, template: client.V1Pod, replicas: int = 2) -> client.V1StatefulSet:
    """A StatefulSet ``name`` of ``replicas`` of ``template``'s spec (restarted always),
    labelled ``app: name``, started in parallel and spread one per node."""
    labels = {"app": name}
    template.spec.restart_policy = "Always"
    template.spec.topology_spread_constraints = [
        client.V1TopologySpreadConstraint(
            max_skew=1, topology_key="kubernetes.io/hostname",
            when_unsatisfiable="DoNotSchedule",
            label_selector=client.V1LabelSelector(match_labels=labels),
        )
    ]  # fmt: skip
    return client.V1StatefulSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1StatefulSetSpec(
            service_name=name, replicas=replicas, pod_management_policy="Parallel",
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=template.spec
            ),
        ),
    )  # fmt: skip


# What a pod prints about the guest's data disk, read from its own kernel: the serial and
# the numa_node of the PCI device above it (the disk's folder is <pci>/virtioN/block/vdX).
DISK = (
    f"d=$(grep -l {DATA_DISK_SERIAL} /sys/class/block/*/serial | head -1); "
    "echo disk_serial: $(cat $d); "
    "echo disk_numa_node: $(cat $(readlink -f ${d%/serial})/../../../numa_node); "
)


def test_a_statefulset_of_one_template_runs_each_replica_on_its_own_workers_disk_node(
    two: Workers, namespace: str
) -> None:
    """The harness gives worker A its data disk on NUMA node 1 and worker B on node 0,
    with their own serials; one file of named configurations maps the same name
    data-disk to each worker's disk by serial (its label picks it). A StatefulSet of 2
    replicas with ONE template asking numa-align/data-disk: 1, spread over the workers:
    each replica runs on the CPUs of its own worker's disk node, read inside the pods."""
    platform = two.platform
    if platform.mode != "helm":
        pytest.skip("per-node configuration is the chart's (PLUGIN=helm)")
    serials = {two.a: f"{DATA_DISK_SERIAL}A", two.b: f"{DATA_DISK_SERIAL}B"}
    named = {
        f"disk-{node[-1]}": {"near": {"data-disk": f"serial:{serial}"}}
        for node, serial in serials.items()
    }
    saved = platform.plugin_settings()
    for node in two.names:
        label(platform.core, node, f"disk-{node[-1]}")
    apps = client.AppsV1Api(platform.core.api_client)
    try:
        platform.helm_upgrade(
            "--reuse-values", "--set-json", f"config.named={json.dumps(named)}",
            "--set-json", "config.nodeConfigInterval=1",
        )  # fmt: skip
        two.rolled_out()
        for node in two.names:
            platform.eventually(lambda n=node: two.ours(n).get(DATA_DISK) == "100", 180,
                                f"{node}: {DATA_DISK}=100")  # fmt: skip
        template = on(platform, None, "near-disk", DISK + WHERE + "; sleep 3600", 1, DATA_DISK)
        apps.create_namespaced_stateful_set(namespace, one_per_node("near-disk", template))

        def running() -> list[client.V1Pod]:
            return [p for p in platform.core.list_namespaced_pod(
                        namespace, label_selector="app=near-disk").items
                    if p.status.phase == "Running"]  # fmt: skip

        pods = platform.eventually(lambda: len(found := running()) == 2 and found, 300,
                                   "2 replicas Running")  # fmt: skip
        assert sorted(p.spec.node_name for p in pods) == sorted(two.names)
        for pod in pods:
            node = pod.spec.node_name
            seen = where(platform, pod.metadata.name, namespace)
            print(
                f"{pod.metadata.name} on {node}: disk {seen['disk_serial']} numa_node "
                f"{seen['disk_numa_node']}; NUMA_NODE={seen['NUMA_NODE']} "
                f"Cpus_allowed_list={seen['Cpus_allowed_list']} "
                f"Mems_allowed_list={seen['Mems_allowed_list']}"
            )
            disk_node = seen["disk_numa_node"]
            assert seen["disk_serial"] == serials[node]
            assert seen["NUMA_NODE"] == disk_node
            assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(
                seen[f"node{disk_node}_cpulist"]
            )
            assert seen["Mems_allowed_list"] == disk_node
        nodes = {p.spec.node_name: where(platform, p.metadata.name, namespace) for p in pods}
        assert (nodes[two.a]["disk_numa_node"], nodes[two.b]["disk_numa_node"]) == ("1", "0")
        assert not admission_failures(platform, namespace)
    finally:
        apps.delete_namespaced_stateful_set("near-disk", namespace)
        for node in two.names:
            label(platform.core, node, None)
        two.restore(saved)
