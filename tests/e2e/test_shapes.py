"""Machine shapes on a real kubelet.

- The test cluster of two workers (``make test-e2e-local WORKERS=2 PLUGIN=helm``): worker
  A's memory-only NUMA node 2 carries a disk (``FAR-DISK-A``, on node 2's PCI expander
  bridge; the SLIT puts node 2 at 26 from node 0 and 31 from node 1), and a resource
  that follows it is advertised on node 0, the nearest NUMA node with CPUs.
- The guest of sockets of two NUMA nodes (``make test-e2e-local NUMA_VM=1
  NUMA_VM_SOCKETS=4``): ``numa-align/socket-S`` per socket, and a pod asking
  ``socket-1`` lands on a NUMA node of socket 1.

Where a pod runs is read from the kernel inside the pod (its CPUs, its memory, the NUMA
nodes' cpulists) and from the variables the plugin set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.e2e.platforms import ClusterConfig, Platform
from tests.e2e.test_any import in_cpus_mode
from tests.e2e.test_cluster import WHERE, create, placement, pod_manifest, wait_phase
from tests.e2e.test_workers import Workers, admission_failures, free_after, on, runs, where
from tests.e2e.test_workers import two as two

pytestmark = pytest.mark.e2e
FAR = "numa-align/far"
# Worker A's disk on its memory-only node (test/local/render.py FAR_DISK_SERIAL).
FAR_SELECTOR = "serial:FAR-DISK-*"


@pytest.fixture
def far_disk(two: Workers, cluster: ClusterConfig) -> Iterator[Workers]:
    """Every worker's plugin with ``--capacity cpus`` and ``numa-align/far`` following
    the disk on a memory-only node (only worker A has one); restored afterwards."""
    with in_cpus_mode(two, cluster, near=f"far={FAR_SELECTOR}") as configured:
        yield configured


def test_a_device_on_a_memory_only_node_follows_the_nearest_numa_node_with_cpus(
    far_disk: Workers, cluster: ClusterConfig, namespace: str
) -> None:
    """``numa-align/far`` on A counts node 0's free exclusive CPUs (the disk's node 2 has
    none; node 0 is nearest by the SLIT), B has none (no such disk); a pod asking for it
    runs on A's node 0: NUMA_NODE=0, its CPUs in node 0's cpulist, its memory node 0
    (Memory Manager Static), NUMA_NEAR_FAR the disk."""
    two, platform = far_disk, far_disk.platform
    e0 = cluster.exclusive_cpus(0)
    platform.eventually(lambda: two.ours(two.a).get(FAR) == str(e0), 180, f"A: {FAR}={e0}")
    assert FAR not in two.ours(two.b), "B has no disk on a memory-only node"
    pod = on(platform, two.a, "far", WHERE + "; env | grep NUMA_NEAR; sleep 3600", 1,
             more={FAR: "1"})  # fmt: skip
    runs(platform, namespace, pod)
    seen = where(platform, "far", namespace)
    log = platform.pod_log("far", namespace)
    print(f"far: NUMA_NODE={seen['NUMA_NODE']}, CPUs {seen['Cpus_allowed_list']}, "
          f"Mems {seen['Mems_allowed_list']}; {log.splitlines()[-1]}")  # fmt: skip
    assert seen["node2_cpulist"] == "", "A's node 2 is memory-only"
    assert seen["NUMA_NODE"] == "0"
    assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen["node0_cpulist"])
    if platform.memory_manager_static:
        assert seen["Mems_allowed_list"] == "0"
    assert "NUMA_NEAR_FAR=vd" in log
    assert not admission_failures(platform, namespace)
    free_after(platform, namespace, "far")


def sockets_here() -> dict[int, set[int]]:
    """This machine's sockets (``physical_package_id``) -> the NUMA nodes with CPUs in
    them, read from /sys (the guest's, where the tests run inside it)."""
    from pathlib import Path

    found: dict[int, set[int]] = {}
    for node in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        cpus = parse_cpulist((node / "cpulist").read_text().strip())
        packages = {
            int((Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"))
                .read_text())
            for cpu in cpus
        }  # fmt: skip
        if len(packages) == 1:
            found.setdefault(packages.pop(), set()).add(int(node.name[4:]))
    return found


def test_a_pod_asking_a_socket_lands_on_a_numa_node_of_that_socket(
    platform: Platform, namespace: str, plugin_mode: object
) -> None:
    """``numa-align/socket-1`` over socket 1's NUMA nodes: a pod asking for it (beside 1
    CPU) runs on one of them, NUMA_NODE and NUMA_SOCKET saying so, its CPUs in that
    node's cpulist."""
    sockets = {s: nodes for s, nodes in sockets_here().items() if len(nodes) > 1}
    if 1 not in sockets:
        pytest.skip("no socket 1 of several NUMA nodes here: the harness's guest has them "
                    "with NUMA_VM=1 NUMA_VM_SOCKETS=4")  # fmt: skip
    plugin_mode("cpus")  # type: ignore[operator]
    names = [f"numa-align/socket-{s}" for s in sorted(sockets)]
    # Every socket advertised; socket-1 offering a CPU (socket 0's node 0 has none free
    # when CPU 0 is reserved, and 1 CPU a node is the guest's shape).
    platform.eventually(lambda: set(names) <= set(platform.allocatable())
                        and platform.allocatable()["numa-align/socket-1"] != "0",
                        120, f"{names} advertised, socket-1 offering a CPU")  # fmt: skip
    command = WHERE + "; echo NUMA_SOCKET=$NUMA_SOCKET"
    create(platform, namespace, pod_manifest(platform, "socket", command, 1,
                                             "numa-align/socket-1"))  # fmt: skip
    wait_phase(platform, "socket", namespace, "Succeeded")
    seen = placement(platform, "socket", namespace)
    log = platform.pod_log("socket", namespace)
    print(f"socket-1 = NUMA nodes {sorted(sockets[1])}: NUMA_NODE={seen['NUMA_NODE']}, "
          f"CPUs {seen['Cpus_allowed_list']}; {log.strip().splitlines()[-1]}")  # fmt: skip
    node = int(seen["NUMA_NODE"])
    assert node in sockets[1]
    assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(seen[f"node{node}_cpulist"])
    assert "NUMA_SOCKET=1" in log.splitlines()
