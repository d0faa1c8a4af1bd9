"""``numa-align/any`` on the test cluster of two workers (``make test-e2e-local WORKERS=2
PLUGIN=helm``): the counterfactual in one test. Both workers fragmented so that no NUMA
node has room for the pod while each worker's total has: without the resource the
scheduler binds and the kubelet refuses (TopologyAffinityError), with it the pods wait
Pending until one NUMA node has room, then run there.

Where a pod runs is read from the kernel inside the pod (``Cpus_allowed_list``,
``Mems_allowed_list``, the NUMA nodes' cpulists), not from the plugin's account.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kubernetes import client

from benchmarks.anyreplay import replay
from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.e2e.any_trace import fragmented, trace_checkpoints
from tests.e2e.platforms import ClusterConfig
from tests.e2e.test_cluster import WHERE, unschedulable
from tests.e2e.test_workers import (
    NUMA0,
    NUMA1,
    UNIT_MIB,
    Workers,
    admission_failures,
    free_after,
    on,
    runs,
    where,
)
from tests.e2e.test_workers import two as two

pytestmark = pytest.mark.e2e
ANY = "numa-align/any"
DISKS = "numa-align/disks"
# virtio-blk's PCI class (mass storage, SCSI): the workers' data disks, on NUMA nodes 0 and 1.
DISKS_SELECTOR = "pci-class:0100"


@contextmanager
def in_cpus_mode(two: Workers, cluster: ClusterConfig, **more: str) -> Iterator[Workers]:
    """Every worker's plugin with ``--capacity cpus`` (the kubelets' reserved CPUs) and
    the flags ``more`` (``near="far=serial:X"``; a flag's dashes as underscores), the
    settings it had restored at the end."""
    saved = two.platform.plugin_settings()
    reserved = ",".join(map(str, sorted(cluster.reserved_cpus)))
    flags = {name.replace("_", "-"): value for name, value in more.items()}
    two.configure({"capacity": "cpus", "reserved-cpus": reserved, **flags})
    try:
        yield two
    finally:
        two.restore(saved)


@pytest.fixture
def any_everywhere(two: Workers, cluster: ClusterConfig) -> Iterator[Workers]:
    """Every worker's plugin with ``--capacity cpus`` (numa-align/any on by default);
    restored afterwards."""
    with in_cpus_mode(two, cluster) as configured:
        yield configured


def deployment(name: str, template: client.V1Pod, replicas: int) -> client.V1Deployment:
    labels = {"app": name}
    spec = template.spec
    spec.restart_policy = "Always"
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels),
                                              spec=spec),
        ),
    )  # fmt: skip


def pods_of(two: Workers, namespace: str, app: str) -> list[client.V1Pod]:
    found: list[client.V1Pod] = two.platform.core.list_namespaced_pod(
        namespace, label_selector=f"app={app}"
    ).items
    return found


def refusals(two: Workers, namespace: str, prefix: str) -> list[str]:
    """TopologyAffinityErrors of the namespace's pods named ``prefix``…: events and
    pods Failed with that reason."""
    found = [e for e in admission_failures(two.platform, namespace) if e.startswith(prefix)]
    for pod in two.platform.core.list_namespaced_pod(namespace).items:
        if pod.metadata.name.startswith(prefix) and pod.status.reason == "TopologyAffinityError":
            found.append(f"{pod.metadata.name}: {pod.status.reason}")
    return sorted(set(found))


def agrees(model: dict[str, str], observed: dict[str, str], checkpoint: int) -> None:
    """The model's outcomes (:mod:`benchmarks.anyreplay`) for the pods ``observed``
    names are the cluster's (replicas compared as a set: their names are the
    Deployment's)."""
    mine = sorted(model[pod] for pod in observed)
    print(f"checkpoint {checkpoint}: the kubelet {sorted(observed.values())}, the model {mine}")
    assert mine == sorted(observed.values()), checkpoint


def test_any_sends_no_pod_where_no_numa_node_fits_it_where_plain_cpu_requests_are_refused(
    any_everywhere: Workers, cluster: ClusterConfig, namespace: str
) -> None:
    """Each worker's NUMA nodes keep 1 exclusive CPU free each (pods holding numa-0 and
    numa-1 take the rest), its total 2: a Deployment of 2-CPU pods asking plain ``cpu`` is
    bound and refused by the kubelet (TopologyAffinityError, at least once); the same
    pods asking ``numa-align/any: 2`` wait Pending, Insufficient numa-align/any on both
    workers, never refused. Worker A's node 1 freed: one of them runs there, its CPUs
    and NUMA_NODE on node 1; the other still waits."""
    two, platform = any_everywhere, any_everywhere.platform
    apps = client.AppsV1Api(platform.core.api_client)
    e0, e1 = cluster.exclusive_cpus(0), cluster.exclusive_cpus(1)
    size = 2
    assert e1 >= size, f"needs room on node 1 for {size} CPUs: {e0}, {e1}"
    # The same trace in the model of where pods land, compared at each checkpoint.
    workers = {name: [e0, e1] for name in (two.a, two.b)}
    events, checkpoints = trace_checkpoints([two.a, two.b], e0, e1, size)
    started = time.monotonic()
    for node in two.names:
        platform.eventually(lambda n=node: two.ours(n).get(ANY) == str(max(e0, e1)), 120,
                            f"{node}: {ANY}={max(e0, e1)}")  # fmt: skip
        for numa, resource, free in ((0, NUMA0, e0), (1, NUMA1, e1)):
            if free > 1:
                hold = on(platform, node, f"hold{numa}-{node[-1]}", "sleep 3600", free - 1,
                          resource, free - 1)  # fmt: skip
                runs(platform, namespace, hold)
        # Held: no device of any; free: 1 CPU on each node, so any offers 1.
        platform.eventually(lambda n=node: two.ours(n).get(ANY) == "1", 120, f"{node}: {ANY}=1")
    print(f"fragmented in {time.monotonic() - started:.0f} s: each NUMA node keeps 1 free CPU")

    # Without the resource: bound by the scheduler (2 CPUs free in each worker's total)
    # and refused by the kubelet, again and again (the Deployment makes new pods).
    plain = on(platform, None, "plain", WHERE + "; sleep 3600", size)
    apps.create_namespaced_deployment(namespace, deployment("plain", plain, 1))
    try:
        found = platform.eventually(lambda: refusals(two, namespace, "plain"), 180,
                                    "a TopologyAffinityError for plain cpu requests")  # fmt: skip
        time.sleep(10 * platform.time_scale)  # the loop goes on: count a while longer
        found = refusals(two, namespace, "plain")
        print(f"plain cpu: {len(found)} TopologyAffinityError(s), e.g. {found[0]}")
        assert found
        assert not [p for p in pods_of(two, namespace, "plain") if p.status.phase == "Running"]
        held = {name: f"admitted {hold.worker}/{hold.asks.removeprefix('numa-')}"
                for name, hold in fragmented([two.a, two.b], e0, e1).items()}  # fmt: skip
        agrees(replay(workers, events[: checkpoints[0][0]]), {"plain": "refused", **held}, 1)
    finally:
        apps.delete_namespaced_deployment("plain", namespace)
    platform.eventually(lambda: not pods_of(two, namespace, "plain"), 180, "plain pods gone", 1)

    # With numa-align/any: Pending, never bound where it cannot run.
    wanted = {ANY: str(size)}
    aligned = on(platform, None, "aligned", WHERE + "; sleep 3600", size, more=wanted)
    apps.create_namespaced_deployment(namespace, deployment("aligned", aligned, 2))
    try:

        def refused_both() -> list[str]:
            pods = pods_of(two, namespace, "aligned")
            said = [unschedulable(platform, p.metadata.name, namespace) for p in pods]
            return (
                said if len(said) == 2 and all(f"2 Insufficient {ANY}" in s for s in said) else []
            )

        said = platform.eventually(refused_both, 120, f"both replicas Pending on {ANY}")
        print(f"aligned: {said[0]}")
        time.sleep(20 * platform.time_scale)  # two node status periods: still none bound
        assert not refusals(two, namespace, "aligned")
        assert all(p.status.phase == "Pending" for p in pods_of(two, namespace, "aligned"))
        agrees(replay(workers, events[: checkpoints[1][0]]),
               {"aligned-0": "pending", "aligned-1": "pending"}, 2)  # fmt: skip

        # Worker A's node 1 freed: any offers its 3 (exposed: the most room).
        freed = time.monotonic()
        free_after(platform, namespace, f"hold1-{two.a[-1]}")

        def running() -> list[client.V1Pod]:
            return [p for p in pods_of(two, namespace, "aligned") if p.status.phase == "Running"]

        (first,) = platform.eventually(running, 180, "one replica Running")
        print(f"a replica ran {time.monotonic() - freed:.0f} s after A's node 1 was freed")
        seen = where(platform, first.metadata.name, namespace)
        print(f"{first.metadata.name}: {first.spec.node_name}, NUMA_NODE={seen['NUMA_NODE']}, "
              f"CPUs {seen['Cpus_allowed_list']}, Mems {seen['Mems_allowed_list']}")  # fmt: skip
        assert first.spec.node_name == two.a
        assert seen["NUMA_NODE"] == "1"
        assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen["node1_cpulist"])
        if platform.memory_manager_static:
            assert seen["Mems_allowed_list"] == "1"
        # The other: A's node 1 keeps e1 - 2 free, node 0 one: still nowhere.
        time.sleep(20 * platform.time_scale)
        assert len(running()) == 1
        assert not refusals(two, namespace, "aligned")
        observed = {"aligned-0": f"admitted {first.spec.node_name}/{seen['NUMA_NODE']}",
                    "aligned-1": "pending"}  # fmt: skip
        agrees(replay(workers, events), observed, 3)
    finally:
        apps.delete_namespaced_deployment("aligned", namespace)


@pytest.fixture
def disks_everywhere(two: Workers, cluster: ClusterConfig) -> Iterator[Workers]:
    """Every worker's plugin with ``--capacity cpus``, ``--memory-unit`` and a resource
    following the data disks of both NUMA nodes (``numa-align/disks``); restored
    afterwards."""
    if not two.platform.memory_manager_static:
        pytest.skip("needs the kubelets' Memory Manager policy Static")
    with in_cpus_mode(two, cluster, memory_unit=f"{UNIT_MIB}Mi",
                      reserved_memory=two.platform.description["reserved_memory"],
                      near=f"disks={DISKS_SELECTOR}") as configured:  # fmt: skip
        yield configured


def test_a_device_on_both_numa_nodes_gives_the_exposed_nodes_cpus_and_memory(
    disks_everywhere: Workers, cluster: ClusterConfig, namespace: str
) -> None:
    """``numa-align/disks`` (data disks on both NUMA nodes) and ``disks-memory``: worker
    A's node 0 left with 1 free CPU, node 1 with more: a pod asking disks and its memory
    on A runs on node 1, CPUs and memory both, NUMA_NODE=1."""
    two, platform = disks_everywhere, disks_everywhere.platform
    e0, e1 = cluster.exclusive_cpus(0), cluster.exclusive_cpus(1)
    memory = f"{DISKS}-memory"
    platform.eventually(lambda: two.ours(two.a).get(DISKS, "0") != "0"
                        and two.ours(two.a).get(memory, "0") != "0", 180,
                        f"A: {DISKS} and {memory}")  # fmt: skip
    if e0 > 1:
        runs(platform, namespace, on(platform, two.a, "hold0", "sleep 3600", e0 - 1, NUMA0,
                                     e0 - 1))  # fmt: skip
    platform.eventually(lambda: two.ours(two.a).get(DISKS) == str(e1), 120, f"A: {DISKS}={e1}")
    wanted = {DISKS: "2", memory: "2"}
    pod = on(platform, two.a, "near", WHERE + "; env | grep NUMA_NEAR; sleep 3600", 2,
             memory=f"{2 * UNIT_MIB}Mi", more=wanted)  # fmt: skip
    runs(platform, namespace, pod)
    seen = where(platform, "near", namespace)
    print(f"near: NUMA_NODE={seen['NUMA_NODE']}, CPUs {seen['Cpus_allowed_list']}, "
          f"Mems {seen['Mems_allowed_list']}")  # fmt: skip
    assert seen["NUMA_NODE"] == "1"
    assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen["node1_cpulist"])
    assert seen["Mems_allowed_list"] == "1"
    assert not admission_failures(platform, namespace)
    free_after(platform, namespace, "near")
