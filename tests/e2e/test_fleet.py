"""The fleet recipe on the test cluster (``make test-e2e-local WORKERS=2 PLUGIN=helm``):
ONE configuration for both workers, no per-node label.

Each worker guest has two data disks on opposite NUMA nodes, formatted and mounted at
``/mnt/disks/a`` and ``/mnt/disks/b`` (slot a on node 1 in worker A and node 0 in
worker B), its NIC and a disk the tests hot-plug on node 1, each behind a PCI expander
bridge of its node (``test/local/cluster.py`` ``data_disks``). The chart reads the
host's ``/sys`` and mount table (``host.sysfs``, ``host.mountTable``) and the devices
again every 5 s (``config.deviceInterval``). Where a pod runs and which disk is which
are read from the kernel inside the pod, not from the plugin's account.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from numa_device_plugin.topology.sysfs import parse_cpulist
from tests.e2e.platforms import NAMESPACE, run_checked
from tests.e2e.shipped import METRICS_PORT
from tests.e2e.test_cluster import WHERE, create, wait_phase
from tests.e2e.test_workers import Workers, on, one_per_node, two, where  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e
PREFIX = "numa-align"
SLOTS = "100"
# The serial of each slot's disk, by the worker's letter (test/local/render.py).
SLOT_SERIALS = {"a": "DATA-DISK-{}", "b": "SLOT-B-{}"}
HOTPLUG_SERIAL = "HOTPLUG-{}"
# What a pod prints besides WHERE (before it: WHERE's last line tells the log is whole):
# its NUMA_NEAR_* variables, and each disk's serial, kernel name and the numa_node of the
# PCI device above it (the disk's folder is <pci>/virtioN/block/vdX).
DISKS = (
    "echo near: $(env | grep ^NUMA_NEAR_ | sort | tr '\\n' ' '); "
    "for s in /sys/class/block/*/serial; do d=${s%/serial}; "
    "echo disk_$(cat $s): ${d##*/} $(cat $(readlink -f $d)/../../../numa_node); done; "
)


@dataclass(frozen=True)
class Fleet:
    """The two workers under the fleet configuration; ``nic``: the workers' NIC's name."""

    two: Workers
    nic: str

    def serial(self, slot: str, node: str) -> str:
        """The serial of ``node``'s disk in ``slot`` (``a``, ``b``, or ``hotplug``)."""
        pattern = HOTPLUG_SERIAL if slot == "hotplug" else SLOT_SERIALS[slot]
        return pattern.format(node[-1].upper())

    def debug_state(self, node: str) -> dict[str, Any]:
        """``/debug/state`` of ``node``'s plugin, from its pod IP."""
        pod = self.two.plugin_pod(node)
        assert pod is not None, f"no plugin pod on {node}"
        assert pod.status.pod_ip, f"the plugin pod on {node} has no IP yet"
        url = f"http://{pod.status.pod_ip}:{METRICS_PORT}/debug/state"
        with urllib.request.urlopen(url, timeout=10) as answer:
            found: dict[str, Any] = json.loads(answer.read())
        return found

    def near_plan(self, node: str, name: str) -> dict[str, Any]:
        (found,) = [e for e in self.debug_state(node)["near"] if e["resource"] == name]
        return dict(found)


def nic_name(platform: Any) -> str:
    """This worker's NIC (the one with its MAC), as its kernel names it."""
    (me,) = [w for w in platform.description["workers"] if w["name"] == platform.node]
    for interface in Path("/sys/class/net").iterdir():
        if (interface / "address").read_text().strip() == me["mac"]:
            return interface.name
    raise AssertionError(f"no interface with {me['mac']} in /sys/class/net")


@pytest.fixture(scope="module")
def fleet(two: Workers) -> Iterator[Fleet]:  # noqa: F811 (the fixture two)
    """Both workers with one configuration: disk-a and disk-b by path, the NIC by name,
    disk-a-nic (disk a AND the NIC), hot (serial HOTPLUG-*: a pattern both workers
    share); the module's end restores the settings found."""
    platform = two.platform
    if platform.mode != "helm":
        pytest.skip("the fleet recipe is the chart's (PLUGIN=helm)")
    nic = nic_name(platform)
    near = {
        "disk-a": "path:/mnt/disks/a",
        "disk-b": "path:/mnt/disks/b",
        "nic": f"net:{nic}",
        "disk-a-nic": ["path:/mnt/disks/a", f"net:{nic}"],
        "hot": "serial:HOTPLUG-*",
    }
    saved = platform.plugin_settings()
    # host.sysfs and host.mountTable left unset: the chart mounts the host's /sys for the
    # net: selectors and its mount table for the path: ones by itself
    platform.helm_upgrade(
        "--reuse-values", "--set-json", f"config.near={json.dumps(near)}",
        "--set-json", "config.deviceInterval=5",
    )  # fmt: skip
    two.rolled_out()
    for node in two.names:
        platform.eventually(
            lambda n=node: all(two.ours(n).get(f"{PREFIX}/{r}") == SLOTS
                               for r in ("disk-a", "disk-b", "nic", "hot")),
            180, f"{node}: disk-a, disk-b, nic and hot advertised",
        )  # fmt: skip
    yield Fleet(two, nic)
    two.restore(saved)


def seen_in_pod(platform: Any, pod: str, namespace: str) -> dict[str, Any]:
    """``where`` and what ``DISKS`` printed: ``near`` as {variable: value}, ``disks`` as
    {serial: (kernel name, numa_node)}."""
    seen: dict[str, Any] = where(platform, pod, namespace)
    seen["near_env"] = dict(p.split("=", 1) for p in seen.get("near", "").split())
    seen["disks"] = {
        key[len("disk_"):]: tuple(value.split())
        for key, value in seen.items() if key.startswith("disk_")
    }  # fmt: skip
    return seen


def describe(pod: str, node: str, seen: dict[str, Any]) -> str:
    return (
        f"{pod} on {node}: NUMA_NODE={seen['NUMA_NODE']} "
        f"Cpus_allowed_list={seen['Cpus_allowed_list']} "
        f"Mems_allowed_list={seen['Mems_allowed_list']} {seen['near']}"
    )


def assert_on(seen: dict[str, Any], numa_node: str) -> None:
    """The pod's CPUs and memory are on ``numa_node``, and NUMA_NODE says so."""
    assert seen["NUMA_NODE"] == numa_node
    assert parse_cpulist(seen["Cpus_allowed_list"]) <= parse_cpulist(
        seen[f"node{numa_node}_cpulist"]
    )
    assert seen["Mems_allowed_list"] == numa_node


def test_one_configuration_puts_each_replica_on_the_numa_node_of_its_own_disk(
    fleet: Fleet, namespace: str
) -> None:
    """Two StatefulSets (disk-a, disk-b) of two replicas, one per worker, with ONE
    template each asking numa-align/disk-a (or disk-b): 1; the disks' nodes differ per
    worker and per slot. Every replica runs on its disk's node, and NUMA_NEAR_DISK_<S>
    names the disk that holds /mnt/disks/<s> on its worker."""
    pair = fleet.two
    platform = pair.platform
    apps = client.AppsV1Api(platform.core.api_client)
    try:
        for slot in ("a", "b"):
            template = on(platform, None, f"disk-{slot}", DISKS + WHERE + "; sleep 3600", 1,
                          f"{PREFIX}/disk-{slot}")  # fmt: skip
            apps.create_namespaced_stateful_set(namespace, one_per_node(f"disk-{slot}", template))

        def running() -> list[client.V1Pod]:
            return [p for p in platform.core.list_namespaced_pod(namespace).items
                    if p.status.phase == "Running"]  # fmt: skip

        pods = platform.eventually(lambda: len(found := running()) == 4 and found, 300,
                                   "4 replicas Running")  # fmt: skip
        nodes_of: dict[tuple[str, str], str] = {}
        for pod in pods:
            node, slot = pod.spec.node_name, pod.metadata.labels["app"][-1]
            seen = seen_in_pod(platform, pod.metadata.name, namespace)
            name, disk_node = seen["disks"][fleet.serial(slot, node)]
            print(f"{describe(pod.metadata.name, node, seen)}; disk {slot} "
                  f"{fleet.serial(slot, node)} is {name} on NUMA node {disk_node}")  # fmt: skip
            assert_on(seen, disk_node)
            assert seen["near_env"] == {f"NUMA_NEAR_DISK_{slot.upper()}": name}
            nodes_of[(node, slot)] = disk_node
        assert nodes_of == {(pair.a, "a"): "1", (pair.a, "b"): "0",
                            (pair.b, "a"): "0", (pair.b, "b"): "1"}  # fmt: skip
    finally:
        for slot in ("a", "b"):
            apps.delete_namespaced_stateful_set(f"disk-{slot}", namespace)


def test_a_net_selector_in_the_daemonset_finds_the_hosts_nic_on_numa_node_1(
    fleet: Fleet, namespace: str
) -> None:
    """With host.sysfs the plugin (not hostNetwork) reads the host's /sys: net:<nic> is
    the guest's NIC, behind the node-1 bridge, on both workers. The container's own /sys
    shows the pod's network namespace: an interface of that name there is the pod's
    veth (virtual: no locality), which is why the chart's value exists."""
    pair, platform = fleet.two, fleet.two.platform
    pod = pair.plugin_pod(pair.a)
    assert pod is not None
    views = platform.kubectl(
        "-n", NAMESPACE, "exec", pod.metadata.name, "-c", "numa-device-plugin", "--",
        "python3", "-c",
        "import os, sys; print(*(os.path.realpath(f'{r}/class/net/{sys.argv[1]}') "
        "for r in ('/sys', '/host/sys')))", fleet.nic,
    ).split()  # fmt: skip
    print(f"{fleet.nic} in the plugin's container: /sys -> {views[0]}; /host/sys -> {views[1]}")
    assert views[0].startswith("/sys/devices/virtual/net/")
    assert "/pci" in views[1]
    for node in pair.names:
        plan = fleet.near_plan(node, f"{PREFIX}/nic")
        print(f"{node}: {PREFIX}/nic on NUMA nodes {plan['nodes']} ({plan['matched']})")
        assert plan["nodes"] == [1]
    create(platform, namespace, on(platform, pair.a, "nic", DISKS + WHERE, 1, f"{PREFIX}/nic"))
    wait_phase(platform, "nic", namespace, "Succeeded")
    seen = seen_in_pod(platform, "nic", namespace)
    print(describe("nic", pair.a, seen))
    assert_on(seen, "1")
    assert seen["near_env"] == {"NUMA_NEAR_NIC": fleet.nic}


def test_discover_in_the_plugins_pod_sees_what_serve_advertises(fleet: Fleet) -> None:
    """kubectl exec ... -- numa-device-plugin discover reads the settings serve reads
    (the container's variables): the same NUMA nodes for every near resource, path:
    and net: included, as /debug/state. With the settings as serve's flags, discover
    read the container's own /sys and mount table and found none of them."""
    pair, platform = fleet.two, fleet.two.platform
    for node in pair.names:
        pod = pair.plugin_pod(node)
        assert pod is not None
        found = json.loads(platform.kubectl(
            "-n", NAMESPACE, "exec", pod.metadata.name, "-c", "numa-device-plugin", "--",
            "numa-device-plugin", "discover", "--output", "json",
        ))  # fmt: skip
        discovered = {e["resource"]: e["nodes"] for e in found["near"]}
        served = {e["resource"]: e["nodes"] for e in fleet.debug_state(node)["near"]}
        print(f"{node}: discover {discovered}; /debug/state {served}")
        assert discovered == served
        for name in ("disk-a", "disk-b", "nic"):
            assert discovered[f"{PREFIX}/{name}"], f"{node}: {name} found by discover"


def test_an_all_of_resource_is_advertised_only_where_its_disk_and_nic_agree(
    fleet: Fleet, namespace: str
) -> None:
    """disk-a-nic = disk a AND the NIC: on worker A both are on node 1 (advertised
    there; the pod's variable names both); on worker B disk a is on node 0, the NIC on
    node 1: not advertised, and the plugin says why."""
    pair, platform = fleet.two, fleet.two.platform
    name = f"{PREFIX}/disk-a-nic"
    assert pair.ours(pair.a).get(name) == SLOTS
    platform.eventually(lambda: pair.ours(pair.b).get(name, "0") == "0", 60,
                        f"{pair.b}: no {name}")  # fmt: skip
    plan_b = fleet.near_plan(pair.b, name)
    print(f"{pair.b}: {name}: {plan_b['reason']}")
    assert plan_b["nodes"] == []
    assert plan_b["reason"].startswith("its devices are on no common NUMA node: ")
    assert "path:/mnt/disks/a on 0" in plan_b["reason"]
    assert f"net:{fleet.nic} on 1" in plan_b["reason"]
    assert fleet.near_plan(pair.a, name)["nodes"] == [1]
    create(platform, namespace, on(platform, pair.a, "both", DISKS + WHERE, 1, name))
    wait_phase(platform, "both", namespace, "Succeeded")
    seen = seen_in_pod(platform, "both", namespace)
    print(describe("both", pair.a, seen))
    assert_on(seen, "1")
    disk_a = seen["disks"][fleet.serial("a", pair.a)][0]
    assert set(seen["near_env"]["NUMA_NEAR_DISK_A_NIC"].split(",")) == {disk_a, fleet.nic}


def test_kubectl_numa_devices_lists_both_workers_disks_with_their_numa_nodes(
    fleet: Fleet,
) -> None:
    """``kubectl numa devices`` (the kubectl plugin on PATH) from this worker: each
    worker's plugin read through the API server's pod proxy; both workers' data disks
    with the NUMA nodes the harness put them on, and a config.named map naming them."""
    pair, platform = fleet.two, fleet.two.platform
    env = dict(platform.kubectl_env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")

    def devices(*args: str) -> str:
        return run_checked(["kubectl", "numa", "devices", *args, *loaded_limits(platform)],
                           timeout=180 * platform.time_scale, env=env)  # fmt: skip

    document = json.loads(devices("--output", "json"))
    print(devices())
    disks = {
        node["name"]: {d["serial"]: d["nodes"] for d in node["disks"]}
        for node in document["nodes"]
    }  # fmt: skip
    for node, (a_node, b_node) in ((pair.a, (1, 0)), (pair.b, (0, 1))):
        assert disks[node][fleet.serial("a", node)] == [a_node]
        assert disks[node][fleet.serial("b", node)] == [b_node]
        selectors = set(document["named"][node]["near"].values())
        assert f"serial:{fleet.serial('a', node)}" in selectors
        assert f"net:{fleet.nic}" in selectors
    # Both workers mount their data disks at /mnt/disks/a and /mnt/disks/b: the pool
    # configuration the align page recommends is proposed first.
    assert set(document["pool"]["near"].values()) >= {"path:/mnt/disks/a", "path:/mnt/disks/b"}


def test_memory_follows_a_disk_as_its_own_resource_on_the_disks_numa_node(
    fleet: Fleet, namespace: str
) -> None:
    """With ``--memory-unit 256Mi`` (the Memory Manager Static on both kubelets):
    numa-align/disk-a-memory is the memory of disk a's NUMA node, the same count as
    numa-N-memory there (worker A: node 1, B: node 0); a pod on each worker asking
    disk-a and 2 units of disk-a-memory gets its CPUs and memory on that node."""
    pair, platform = fleet.two, fleet.two.platform
    if not platform.memory_manager_static:
        pytest.skip("needs the kubelets' Memory Manager policy Static")
    unit_mib, units = 256, 2
    saved = platform.plugin_settings()
    pair.configure({"memory-unit": f"{unit_mib}Mi",
                    "reserved-memory": platform.description["reserved_memory"]})  # fmt: skip
    try:
        memory = f"{PREFIX}/disk-a-memory"
        for node, disk_node in ((pair.a, "1"), (pair.b, "0")):
            base = f"{PREFIX}/numa-{disk_node}-memory"
            found = platform.eventually(
                lambda n=node: int(pair.ours(n).get(memory, "0")) > 0 and pair.ours(n), 120,
                f"{node}: {memory} > 0",
            )  # fmt: skip
            print(f"{node}: {memory}={found[memory]}, {base}={found.get(base)} "
                  f"(units of {unit_mib}Mi)")  # fmt: skip
            assert found[memory] == found.get(base)
            assert f"{PREFIX}/numa-{1 - int(disk_node)}-memory" in found
            name = f"mem-{node[-1].lower()}"
            create(platform, namespace, on(platform, node, name, DISKS + WHERE, 1,
                                           f"{PREFIX}/disk-a", memory=f"{units * unit_mib}Mi",
                                           more={memory: str(units)}))  # fmt: skip
            wait_phase(platform, name, namespace, "Succeeded")
            seen = seen_in_pod(platform, name, namespace)
            print(describe(name, node, seen))
            assert_on(seen, disk_node)
            assert seen["disks"][fleet.serial("a", node)][1] == disk_node
    finally:
        pair.restore(saved)


class Monitor:
    """A qemu monitor (QMP) over TCP: one JSON command per line, events collected."""

    def __init__(self, address: str, timeout: float) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.file = self.sock.makefile("rw", encoding="utf-8")
        self.events: list[dict[str, Any]] = []
        json.loads(self.file.readline())  # the greeting
        self.run("qmp_capabilities")

    def run(self, command: str, **arguments: Any) -> Any:
        """The command's ``return``; raises AssertionError with qemu's error."""
        self.file.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
        self.file.flush()
        while True:
            answer = json.loads(self.file.readline())
            if "event" in answer:
                self.events.append(answer)
            elif "error" in answer:
                raise AssertionError(f"qemu {command} {arguments}: {answer['error']}")
            else:
                return answer.get("return")

    def wait_event(self, name: str) -> dict[str, Any]:
        while not any(e["event"] == name for e in self.events):
            self.events.append(json.loads(self.file.readline()))
        return next(e for e in self.events if e["event"] == name)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def resources_status(platform: Any, pod: str, namespace: str) -> dict[str, str]:
    """{device id: health} of the pod's allocatedResourcesStatus (v1.36's
    ResourceHealthStatus), read raw (the client may not know the field)."""
    found = json.loads(platform.kubectl("-n", namespace, "get", "pod", pod, "-o", "json"))
    return {
        entry["resourceID"]: entry.get("health", "")
        for status in found["status"].get("containerStatuses", [])
        for resource in status.get("allocatedResourcesStatus") or []
        for entry in resource.get("resources") or []
    }  # fmt: skip


def reports_health(platform: Any, node: str) -> bool:
    """Whether ``node``'s kubelet reports allocatedResourcesStatus (from 1.36 on); said
    in the report when it does not, never skipped in silence."""
    version = platform.core.read_node(node).status.node_info.kubelet_version
    reports = tuple(int(p) for p in version.lstrip("v").split(".")[:2]) >= (1, 36)
    if not reports:
        print(f"kubelet {version}: the pod's allocatedResourcesStatus exists from 1.36 only "
              "(ResourceHealthStatus): its Unhealthy checks are not made here")  # fmt: skip
    return reports


def wait_unhealthy(platform: Any, pod: str, namespace: str) -> dict[str, str]:
    """The pod's allocatedResourcesStatus once every device in it is Unhealthy."""
    found: dict[str, str] = platform.eventually(
        lambda: set((seen := resources_status(platform, pod, namespace)).values())
        == {"Unhealthy"} and seen,
        120, f"{pod}'s allocatedResourcesStatus Unhealthy",
    )  # fmt: skip
    print(f"{pod}'s allocatedResourcesStatus: {found}")
    return found


def test_a_disk_removed_and_added_back_on_the_other_node_is_followed_without_a_restart(
    fleet: Fleet, namespace: str
) -> None:
    """Worker A's HOTPLUG disk (node 1) is held by a pod; device_del on the qemu
    monitor: the kubelet's allocatable of numa-align/hot falls to 0 and, on v1.36, the
    pod's allocatedResourcesStatus turns Unhealthy. device_add on a port of the node-0
    bridge: hot is advertised again, on node 0 (a new pod lands there and its variable
    names the disk), the first pod's device stays Unhealthy (it is on the node the disk
    left), and the plugin's pod never restarted."""
    pair, platform = fleet.two, fleet.two.platform
    name = f"{PREFIX}/hot"
    (me,) = [w for w in platform.description["workers"] if w["name"] == pair.a]
    plugin = pair.plugin_pod(pair.a)
    assert plugin is not None
    restarts = sum(s.restart_count for s in plugin.status.container_statuses)
    create(platform, namespace,
           on(platform, pair.a, "holder", DISKS + WHERE + "; sleep 3600", 1, name))  # fmt: skip
    wait_phase(platform, "holder", namespace, "Running")
    seen = seen_in_pod(platform, "holder", namespace)
    print(describe("holder", pair.a, seen))
    assert_on(seen, "1")
    reports = reports_health(platform, pair.a)
    monitor = Monitor(me["qmp"], 30 * platform.time_scale)
    try:
        monitor.run("device_del", id="hotplug")
        monitor.wait_event("DEVICE_DELETED")
        platform.eventually(lambda: pair.ours(pair.a).get(name) == "0", 120,
                            f"{name} allocatable 0 once its disk is gone")  # fmt: skip
        print(f"device_del: {name} allocatable {pair.ours(pair.a).get(name)}; the plan: "
              f"{fleet.near_plan(pair.a, name)['reason']}")  # fmt: skip
        if reports:
            wait_unhealthy(platform, "holder", namespace)
        monitor.run("device_add", driver="virtio-blk-pci", id="hotplug", bus="rp01",
                    drive="hotplug", serial=fleet.serial("hotplug", pair.a))  # fmt: skip
        platform.eventually(lambda: pair.ours(pair.a).get(name) == SLOTS, 120,
                            f"{name} advertised again")  # fmt: skip
    finally:
        monitor.close()
    plan = fleet.near_plan(pair.a, name)
    print(f"device_add on the node-0 bridge: {name} on NUMA nodes {plan['nodes']}")
    assert plan["nodes"] == [0]
    create(platform, namespace, on(platform, pair.a, "after", DISKS + WHERE, 1, name))
    wait_phase(platform, "after", namespace, "Succeeded")
    after = seen_in_pod(platform, "after", namespace)
    print(describe("after", pair.a, after))
    assert_on(after, "0")
    hot_name, hot_node = after["disks"][fleet.serial("hotplug", pair.a)]
    assert hot_node == "0"
    assert after["near_env"] == {"NUMA_NEAR_HOT": hot_name}
    if reports:
        left = resources_status(platform, "holder", namespace)
        print(f"holder's allocatedResourcesStatus after the move: {left}")
        assert set(left.values()) == {"Unhealthy"}
    plugin_now = pair.plugin_pod(pair.a)
    assert plugin_now is not None
    assert plugin_now.metadata.uid == plugin.metadata.uid
    assert sum(s.restart_count for s in plugin_now.status.container_statuses) == restarts


def loaded_limits(platform: Any) -> list[str]:
    """``devices``' and ``check``'s limits scaled as every wait of the run is: a plugin
    in a TCG guest on a busy machine once took more than the 5 s a pod (the check of a
    loaded run said "not read within the deadline")."""
    scale = float(platform.time_scale)
    return ["--timeout", f"{30 * scale:g}", "--pod-timeout", f"{5 * scale:g}"]


def kubectl_numa(platform: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl numa ARGS`` (the kubectl plugin on PATH) from this worker, any exit;
    ``devices`` and ``check`` with :func:`loaded_limits`."""
    env = dict(platform.kubectl_env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    limits = loaded_limits(platform) if args[0] in ("devices", "check") else []
    return subprocess.run(["kubectl", "numa", *args, *limits], capture_output=True, text=True,
                          timeout=180 * platform.time_scale, env=env, check=False)  # fmt: skip


def test_an_unmounted_data_disk_leaves_its_pods_device_lost_and_check_says_so(
    fleet: Fleet, namespace: str
) -> None:
    """/mnt/disks/a unmounted on this worker while a pod holds disk-a: within the device
    interval the resource's devices are Unhealthy (allocatable 0; the pod's
    allocatedResourcesStatus on 1.36), never moved to the root disk; the metric says
    0 and kubectl numa check says "device lost"; mounted again, all return."""
    pair, platform = fleet.two, fleet.two.platform
    name = f"{PREFIX}/disk-a"
    create(platform, namespace,
           on(platform, pair.a, "data-a", DISKS + WHERE + "; sleep 3600", 1, name))  # fmt: skip
    wait_phase(platform, "data-a", namespace, "Running")
    assert_on(seen_in_pod(platform, "data-a", namespace), "1")
    before = kubectl_numa(platform, "check", "-n", namespace, "data-a", "--output", "json")
    print(before.stdout)
    assert before.returncode == 0, before.stderr
    (checked,) = json.loads(before.stdout)["pods"]
    assert checked["verdict"] == "aligned"
    source = run_checked(["findmnt", "-n", "-o", "SOURCE", "/mnt/disks/a"], timeout=30).strip()
    reports = reports_health(platform, pair.a)
    run_checked(["umount", "/mnt/disks/a"], timeout=60)
    try:
        platform.eventually(lambda: pair.ours(pair.a).get(name) == "0", 60,
                            f"{name} allocatable 0 once /mnt/disks/a is unmounted")  # fmt: skip
        state = fleet.debug_state(pair.a)
        lost = state["resources"][name]["lost"]
        print(f"umount /mnt/disks/a: {name}: {lost}")
        assert "path:/mnt/disks/a: nothing is mounted there: it is on the root filesystem" in lost
        assert fleet.near_plan(pair.a, name)["nodes"] == []
        assert pair.metrics(pair.a)[f'numa_device_plugin_near_advertised{{resource="{name}"}}'] == 0
        if reports:
            wait_unhealthy(platform, "data-a", namespace)
        after = kubectl_numa(platform, "check", "-n", namespace, "data-a", "--output", "json")
        print(after.stdout)
        assert after.returncode == 1
        (checked,) = json.loads(after.stdout)["pods"]
        assert checked["verdict"] == "device lost"
    finally:
        run_checked(["mount", source, "/mnt/disks/a"], timeout=60)
    platform.eventually(lambda: pair.ours(pair.a).get(name) == SLOTS, 60,
                        f"{name} advertised again once /mnt/disks/a is mounted")  # fmt: skip
    assert fleet.debug_state(pair.a)["resources"][name]["lost"] is None
    again = kubectl_numa(platform, "check", "-n", namespace, "data-a")
    print(again.stdout)
    assert again.returncode == 0, again.stdout + again.stderr


def local_volume(platform: Any, namespace: str, name: str, node: str, path: str) -> None:
    """A local PersistentVolume at ``path`` on ``node`` and a claim bound to it by name
    (no StorageClass, no provisioner); both removed with the namespace or by hand."""
    os.makedirs(path, exist_ok=True)
    affinity = client.V1VolumeNodeAffinity(required=client.V1NodeSelector(node_selector_terms=[
        client.V1NodeSelectorTerm(match_expressions=[client.V1NodeSelectorRequirement(
            key="kubernetes.io/hostname", operator="In", values=[node])])]))  # fmt: skip
    platform.core.create_persistent_volume(client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=f"{namespace}-{name}"),
        spec=client.V1PersistentVolumeSpec(
            capacity={"storage": "1Mi"}, access_modes=["ReadWriteOnce"],
            persistent_volume_reclaim_policy="Retain", storage_class_name="",
            local=client.V1LocalVolumeSource(path=path), node_affinity=affinity,
        ),
    ))  # fmt: skip
    claim = client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"], storage_class_name="",
            volume_name=f"{namespace}-{name}",
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Mi"}),
        ),
    )  # fmt: skip
    platform.core.create_namespaced_persistent_volume_claim(namespace, claim)


def test_check_finds_a_pod_whose_volume_is_on_the_other_disk_and_passes_the_recipes(
    fleet: Fleet, namespace: str
) -> None:
    """A pod asking disk-a with its local PV under /mnt/disks/a is aligned; one asking
    disk-a with its PV under /mnt/disks/b (the mix-up nobody noticed) is misaligned,
    and kubectl numa check says which disk each is on."""
    pair, platform = fleet.two, fleet.two.platform
    name = f"{PREFIX}/disk-a"
    for pod, slot in (("right", "a"), ("mixup", "b")):
        local_volume(platform, namespace, f"data-{pod}", pair.a, f"/mnt/disks/{slot}/{pod}")
        manifest = on(platform, pair.a, pod, "sleep 3600", 1, name)
        manifest.spec.volumes = [client.V1Volume(
            name="data", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                claim_name=f"data-{pod}"))]  # fmt: skip
        manifest.spec.containers[0].volume_mounts = [
            client.V1VolumeMount(name="data", mount_path="/data")
        ]
        create(platform, namespace, manifest)
    try:
        for pod in ("right", "mixup"):
            wait_phase(platform, pod, namespace, "Running")
        found = kubectl_numa(platform, "check", "-n", namespace)
        print(found.stdout, found.stderr)
        assert found.returncode == 1
        verdicts = {
            p["pod"]: p
            for p in json.loads(
                kubectl_numa(platform, "check", "-n", namespace, "--output", "json").stdout
            )["pods"]
        }
        right, mixup = verdicts[f"{namespace}/right"], verdicts[f"{namespace}/mixup"]
        disk_a = right["volumes"][0]["disk"]
        assert right["verdict"] == "aligned", right
        assert right["resources"][name]["devices"] == [disk_a]
        assert mixup["verdict"] == "misaligned", mixup
        assert mixup["volumes"][0]["disk"] not in (None, disk_a)
        assert any("follows" in why for why in mixup["why"])
    finally:
        for pod in ("right", "mixup"):
            platform.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
            platform.core.delete_persistent_volume(f"{namespace}-data-{pod}")
