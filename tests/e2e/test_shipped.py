"""What only the shipped form has: the image from the registry, run by the DaemonSet (the
kustomize base or the chart) on the one-machine cluster (``make test-e2e-local
PLUGIN=kustomize|helm``). Each test skips, with the reason, where the plugin is a process.
"""

from __future__ import annotations

import datetime
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.platforms import NAMESPACE, PLUGIN, Platform
from tests.e2e.shipped import ShippedPlatform
from tests.e2e.test_cluster import (
    _survivor,
    _untouched,
    allocatable_is,
    container_processes,
    create,
    pod_manifest,
    unschedulable,
)

pytestmark = pytest.mark.e2e
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
# A release's tag names an image index (both architectures); the registry answers 404
# for an index the Accept header leaves out, as it did to RELEASE=1's rollout tests.
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))  # fmt: skip


@pytest.fixture
def shipped(platform: Platform) -> ShippedPlatform:
    """The platform when the plugin is the DaemonSet's pod on the one-machine cluster."""
    if not isinstance(platform, ShippedPlatform):
        pytest.skip("the plugin runs as a process here: run with PLUGIN=kustomize or helm")
    return platform


def our_sockets() -> set[str]:
    """The plugin's sockets in the kubelet's device-plugin folder (not the kubelet's)."""
    return {p.name for p in DEVICE_PLUGINS.glob("*.sock") if p.name != "kubelet.sock"}


def test_the_pod_runs_the_readme_tag_from_the_registry_and_is_ready_by_its_probes(
    shipped: ShippedPlatform, resources: tuple[str, ...]
) -> None:
    platform = shipped
    pod = platform.plugin_pod()
    assert pod is not None
    (container,) = pod.spec.containers
    registry = platform.description["registry"]
    assert container.image.startswith(f"{registry}/numa-device-plugin:")
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.liveness_probe.http_get.path == "/healthz"
    assert "cpu" not in (container.resources.requests or {}), "no CPU request (see README)"
    (status,) = pod.status.container_statuses
    assert status.ready
    assert status.restart_count == 0, platform.why_restarted(pod)
    assert status.image_id, "pulled: the runtime knows the image's digest"
    # Ready means what the probe says: /readyz answers 200, every resource registered.
    assert platform.readyz()[0] == 200
    assert platform.registered(resources)


def test_the_plugin_fits_its_memory_request(shipped: ShippedPlatform) -> None:
    """The DaemonSet asks 80Mi: the plugin's RSS serving slots stays under it."""
    pod = shipped.plugin_pod()
    assert pod is not None
    request = pod.spec.containers[0].resources.requests["memory"]
    assert request == "80Mi"
    rss = shipped.rss()
    print(f"plugin RSS: {rss / 2**20:.1f} MiB (request {request})")
    assert rss < 80 * 2**20


def test_kubectl_exec_status_and_kubectl_logs(
    shipped: ShippedPlatform, resources: tuple[str, ...]
) -> None:
    platform = shipped
    document = json.loads(platform.cli("status", "--output", "json"))
    assert {n["resource"] for n in document["nodes"]} == set(resources)
    log = platform.plugin_log()
    assert "registered with the kubelet" in log, log[-2000:]


def retag(registry: str, tag: str, new: str, timeout: float) -> None:
    """Give the image ``tag`` a second tag ``new`` in the registry (its HTTP API); each
    request may take ``timeout`` seconds."""
    # By name: the namespace's (or guest's) /etc/hosts has it on loopback or the bridge.
    base = f"http://{registry}/v2/numa-device-plugin/manifests"
    request = urllib.request.Request(f"{base}/{tag}", headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        manifest, kind = answer.read(), answer.headers["Content-Type"]
    put = urllib.request.Request(
        f"{base}/{new}", data=manifest, method="PUT", headers={"Content-Type": kind}
    )
    with urllib.request.urlopen(put, timeout=timeout) as answer:
        assert answer.status == 201


def test_a_rolling_update_to_a_new_tag_leaves_workload_pods_untouched(
    shipped: ShippedPlatform, resources: tuple[str, ...], namespace: str
) -> None:
    platform = shipped
    before = _survivor(platform, namespace, resources[0])
    pids = container_processes(before.container_id)
    old = platform.plugin_pod()
    image = old.spec.containers[0].image
    repository, tag, digest = image_parts(image)
    new = f"{tag}-rollout"
    retag(platform.description["registry"], tag, new, 10 * platform.time_scale)
    try:
        set_tag(platform, repository, new)
        platform.eventually(
            lambda: (
                (pod := platform.plugin_pod()) is not None
                and pod.spec.containers[0].image == f"{repository}:{new}"
                and platform.plugin_ready()
            ),
            120, "the DaemonSet's pod on the new tag, Ready", 0.5,
        )  # fmt: skip
        # Every node's pod (the test cluster's rollout goes one worker at a time).
        wait = int(300 * platform.time_scale)
        platform.kubectl("-n", NAMESPACE, "rollout", "status", f"ds/{PLUGIN}",
                         f"--timeout={wait}s", timeout=wait / platform.time_scale + 60)  # fmt: skip
        platform.eventually(lambda: platform.registered(resources), 60, "registered")
        _untouched(platform, namespace, before, pids)
    finally:
        set_tag(platform, repository, tag, digest)
        platform.eventually(
            lambda: (
                (pod := platform.plugin_pod()) is not None
                and pod.spec.containers[0].image == image
                and platform.plugin_ready()
            ),
            120, "the plugin back on its tag", 0.5,
        )  # fmt: skip


def image_parts(image: str) -> tuple[str, str, str]:
    """``repository[:tag][@digest]`` -> ``(repository, tag, digest)``; a release's
    chart pins the digest (``…:0.2.0@sha256:…``), whose own colon is not the tag's."""
    name, _, digest = image.partition("@")
    repository, _, tag = name.rpartition(":")
    return repository, tag, digest


def set_tag(platform: ShippedPlatform, repository: str, tag: str, digest: str = "") -> None:
    """As a user rolls a new version: ``helm upgrade --set image.tag`` (and the digest:
    none, or the one to go back to) or ``kubectl set image`` on the kustomize DaemonSet."""
    if platform.mode == "helm":
        platform.helm_upgrade("--reuse-values", "--set-string", f"image.tag={tag}",
                              "--set-string", f"image.digest={digest}")  # fmt: skip
    else:
        pinned = f"@{digest}" if digest else ""
        platform.kubectl("-n", NAMESPACE, "set", "image", f"ds/{PLUGIN}",
                         f"{PLUGIN}={repository}:{tag}{pinned}")  # fmt: skip


def kill_time(kubelet_log: str, container_id: str) -> float | None:
    """When the kubelet logged ``"Killing container with a grace period"`` for
    ``container_id`` (klog ``I1124 01:26:04.123456``, UTC, this year), as a POSIX time."""
    for line in kubelet_log.splitlines():
        if "Killing container with a grace period" in line and container_id in line:
            month, day = int(line[1:3]), int(line[3:5])
            clock = line.split()[1]
            stamp = datetime.datetime.strptime(clock, "%H:%M:%S.%f")
            now = datetime.datetime.now(datetime.UTC)
            return stamp.replace(year=now.year, month=month, day=day,
                                 tzinfo=datetime.UTC).timestamp()  # fmt: skip
    return None


def test_a_plugin_pod_deleted_right_after_it_starts_is_gone_within_2_s(
    shipped: ShippedPlatform, resources: tuple[str, ...]
) -> None:
    """The kubelet sends SIGTERM as soon as the container runs: dumb-init forwards it, the
    plugin ends within 2 s and removes its sockets (before: ignored for 30 s as PID 1,
    then SIGKILL, a stale socket left)."""
    platform = shipped
    old = platform.plugin_pod()
    assert old is not None
    platform.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)

    def started() -> client.V1Pod | None:
        pods = platform.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={PLUGIN}",
            field_selector=f"spec.nodeName={platform.node}",  # the test cluster has two
        ).items  # fmt: skip
        for pod in pods:
            if pod.metadata.uid == old.metadata.uid or pod.metadata.deletion_timestamp:
                continue
            for status in pod.status.container_statuses or []:
                if status.state.running is not None:
                    return pod
        return None

    young = platform.eventually(started, 120, "the new pod's container running", 0.05)
    (status,) = young.status.container_statuses
    pids = container_processes(status.container_id)
    assert pids, "the container's processes are visible here"
    deleted = time.time()
    platform.core.delete_namespaced_pod(young.metadata.name, NAMESPACE)
    while container_processes(status.container_id) and time.time() - deleted < 30:
        time.sleep(0.05)
    gone = time.time()
    left = our_sockets()
    # From the kubelet's SIGTERM (its "Killing container" line), not from the API call:
    # the kubelet's own reaction to a deletion is not the plugin's to keep short.
    killed = kill_time(Path(platform.processes["kubelet"]["log"]).read_text(),
                       status.container_id)  # fmt: skip
    assert killed is not None, "the kubelet logged no kill of the container"
    # 2 s on a machine at full speed; scaled like every timeout (5x under qemu's TCG).
    bound = 2.0 * platform.time_scale
    assert gone - killed < bound, (
        f"the container ran {gone - killed:.2f} s after the kubelet's SIGTERM "
        f"({gone - deleted:.2f} s after the deletion; bound {bound:.0f} s)"
    )
    print(f"gone {gone - killed:.2f} s after the kubelet's SIGTERM, "
          f"{gone - deleted:.2f} s after the deletion")  # fmt: skip
    assert not left, f"stale sockets: {sorted(left)}"
    platform.eventually(
        lambda: platform.plugin_ready() and platform.registered(resources), 120,
        "the DaemonSet's next pod Ready and registered",
    )  # fmt: skip


def test_a_guaranteed_pods_cpus_are_counted_on_its_cgroup_not_on_the_interval(
    shipped: ShippedPlatform, namespace: str
) -> None:
    """The shipped DaemonSet watches the host's kubepods cgroup folder (chart
    ``host.cgroups``, the kustomize base alike): with the pod resources API read only
    every hour, a Guaranteed pod without our resource still takes its exclusive CPUs off
    NUMA node 1's count, and gives them back when deleted; only its cgroup says so (no
    Allocate, no registration)."""
    platform = shipped
    cluster = platform.cluster_config()
    full = cluster.exclusive_cpus(1)
    saved = platform.plugin_settings()
    settings = {"capacity": "cpus", "reserved-cpus": platform.description["reserved_cpus"],
                "pod-resources-interval": "3600"}  # fmt: skip
    try:
        platform.configure(settings)
        log = platform.plugin_log()
        assert "when a Guaranteed pod's cgroup comes or goes" in log, log[-2000:]
        assert "/host/cgroup/kubepods" in log
        platform.eventually(
            lambda: allocatable_is(platform, {"numa-align/numa-1": full}), 60, "numa-1 full"
        )
        create(platform, namespace, pod_manifest(platform, "hog", "sleep 3600", full))
        platform.eventually(
            lambda: allocatable_is(platform, {"numa-align/numa-1": 0}), 120,
            "numa-1 at 0 with the hog's cgroup",
        )  # fmt: skip
        platform.core.delete_namespaced_pod("hog", namespace, grace_period_seconds=1)
        platform.eventually(
            lambda: allocatable_is(platform, {"numa-align/numa-1": full}), 120,
            "numa-1 back once the hog's cgroup is gone",
        )  # fmt: skip
    finally:
        platform.restore_plugin(saved)


def test_allocatable_with_capacity_cpus_is_what_a_cpu_pod_can_be_scheduled_on(
    shipped: ShippedPlatform,
    plugin_mode: Callable[[str], None],
    namespace: str,
    resources: tuple[str, ...],
) -> None:
    """The plugin's pod requests no CPU: every exclusive CPU it advertises with
    ``capacity=cpus`` stays within the scheduler's reach (a ``cpu: "N"`` pod fits for
    N = the advertised total, not for N + 1)."""
    platform = shipped
    plugin_mode("cpus")
    cluster = platform.cluster_config()
    total = sum(cluster.exclusive_cpus(n) for n in cluster.numa_cpus)
    platform.eventually(
        lambda: sum(int(platform.allocatable().get(r, "0")) for r in resources) == total,
        60, f"numa-align allocatable to add up to the {total} exclusive CPUs",
    )  # fmt: skip

    def scheduled(name: str) -> bool:
        pod = platform.core.read_namespaced_pod(name, namespace)
        return bool(pod.spec.node_name)

    # Sleeps, so it holds nothing long; whether the kubelet can align it is not the point.
    create(platform, namespace, pod_manifest(platform, "fits", "sleep 1", total))
    platform.eventually(lambda: scheduled("fits"), 60, "a pod of every exclusive CPU scheduled")
    create(platform, namespace, pod_manifest(platform, "one-more", "sleep 1", total + 1))
    message = platform.eventually(
        lambda: unschedulable(platform, "one-more", namespace), 60, "one CPU more: refused"
    )
    assert "Insufficient cpu" in message
