"""Offline tests of the test cluster of ``make test-e2e-local WORKERS=2`` (test/local/
workers.py and its part of cluster.py): the workers' addresses, the bridge and taps on
the host, each guest's network and configuration, the join through the results shares,
and the order things stop in. The live run needs Kubernetes binaries and qemu; CI runs
these."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, missing, require_tool

sys.path.insert(0, str(REPO / "test" / "local"))
import cluster
import guests as guest_vms
import kubecluster
import plan as run_plan
import processes
import render
import workers


def spec(tmp_path: Path, **changes: Any) -> run_plan.Spec:
    values: dict[str, Any] = {
        "bin_dir": "/k8s/bin",
        "work": str(tmp_path),
        "python": "/venv/bin/python",
        "pytest_args": [],
        "plugin": "helm",
        "workers": 2,
    }
    values.update(changes)
    return run_plan.Spec(**values)


def test_two_workers_have_their_own_names_addresses_nics_and_pod_subnets() -> None:
    a, b = workers.workers(2)
    assert (a.name, b.name) == ("numa-e2e-a", "numa-e2e-b")
    assert len({a.ip, b.ip, workers.CONTROL_PLANE_IP}) == 3
    assert len({a.mac, b.mac}) == len({a.tap, b.tap}) == len({a.pod_subnet, b.pod_subnet}) == 2
    assert a.pod_gateway.startswith(a.pod_subnet.rpartition(".")[0])
    assert (a.memory_only_node, b.memory_only_node) == (True, False)
    assert (a.tests, b.tests) == (True, False)
    for worker in (a, b):
        assert len(worker.tap) < 16, "IFNAMSIZ"


@pytest.mark.parametrize("count", [0, -1, workers.MAX_WORKERS + 1])
def test_a_worker_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match=f"WORKERS={count}"):
        workers.workers(count)


def in_network_namespace(commands: list[list[str]], *then: str) -> list[str]:
    """``commands`` run in a new network namespace (root, ``unshare --net``), then each
    shell command of ``then`` there; their outputs. The kernel's state, not the text."""
    if os.geteuid() != 0:
        missing("a network namespace needs root (the test cluster runs as root)")
    require_tool("unshare", "util-linux")
    require_tool("iptables", "iptables")
    marker = "--- next ---"
    script = "set -e\n" + "".join(shlex.join(c) + " >/dev/null\n" for c in commands)
    script += "".join(f"echo {marker}\n{command}\n" for command in then)
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [part.strip() for part in done.stdout.split(marker)[1:]]


def test_the_host_bridge_holds_each_workers_tap_and_routes_each_pod_subnet_to_it() -> None:
    found = workers.workers(2)
    links, routes = in_network_namespace(
        workers.host_network_commands(found), "ip -j link show", "ip -j route show"
    )
    by_name = {link["ifname"]: link for link in json.loads(links)}
    assert "UP" in by_name[workers.BRIDGE]["flags"]
    for worker in found:
        tap = by_name[worker.tap]
        assert tap["master"] == workers.BRIDGE
        assert "UP" in tap["flags"]
    via = {r["dst"]: r.get("gateway") for r in json.loads(routes)}
    assert via == {
        "10.99.0.0/24": None,
        **{worker.pod_subnet: worker.ip for worker in found},
    }


def test_a_guest_routes_the_other_pods_its_default_and_the_api_servers_service() -> None:
    a, b = workers.workers(2)
    # The guest's NIC: one end of a veth pair (its peer up, so eth0 has a carrier).
    setup = [["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "wire"],
             ["ip", "link", "set", "wire", "up"]]  # fmt: skip
    other, default, forwarding, nat = in_network_namespace(
        setup + workers.guest_network_commands(b, [a, b], "eth0", 6443),
        f"ip -j route get {a.pod_subnet.rsplit('.', 1)[0]}.7",
        "ip -j route get 192.0.2.1",
        "cat /proc/sys/net/ipv4/ip_forward",
        "iptables -t nat -S",
    )  # fmt: skip
    (to_a,) = json.loads(other)
    assert (to_a["gateway"], to_a["dev"]) == (a.ip, "eth0")
    (out,) = json.loads(default)
    assert (out["gateway"], out["dev"]) == (workers.CONTROL_PLANE_IP, "eth0")
    assert forwarding == "1"
    service = f"-d {workers.SERVICE_IP}/32 -p tcp -m tcp --dport 443 -j DNAT --to-destination"
    rules = [line for line in nat.splitlines() if service in line]
    assert {line.split()[1] for line in rules} == {"PREROUTING", "OUTPUT"}
    assert all(line.endswith(f"{workers.CONTROL_PLANE_IP}:6443") for line in rules)


def test_every_guest_resolves_the_registry_and_each_worker_alike() -> None:
    found = workers.workers(2)
    lines = dict(
        (name, line.split()[0])
        for line in workers.etc_hosts(found).splitlines()
        for name in line.split()[1:]
    )
    assert lines[workers.REGISTRY_HOST] == workers.CONTROL_PLANE_IP
    assert lines["numa-e2e-a"] == found[0].ip
    assert lines["numa-e2e-b"] == found[1].ip
    assert lines["localhost"] == "127.0.0.1"


def test_each_worker_hands_out_pod_addresses_of_its_own_subnet() -> None:
    a, b = workers.workers(2)
    ranges = [workers.cni_network(w)["plugins"][0]["ipam"]["ranges"][0][0] for w in (a, b)]
    assert ranges == [
        {"subnet": a.pod_subnet, "gateway": a.pod_gateway},
        {"subnet": b.pod_subnet, "gateway": b.pod_gateway},
    ]
    assert workers.cni_network(a)["plugins"][0]["bridge"] == "cni0"


def test_the_nic_is_found_by_its_mac_and_a_missing_one_is_named() -> None:
    a, _ = workers.workers(2)
    found = {"lo": "00:00:00:00:00:00\n", "eth0": a.mac.upper() + "\n"}
    assert workers.interface_by_mac(found, a.mac) == "eth0"
    with pytest.raises(LookupError, match=r"no network interface has MAC .*'lo'"):
        workers.interface_by_mac({"lo": "00:00:00:00:00:00"}, a.mac)


def options_of(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_guest_plan_gives_worker_a_the_memory_only_node_and_each_its_nic(
    tmp_path: Path,
) -> None:
    boot = guest_vms.GuestBoot(Path("/k/vmlinuz"), tmp_path / "initrd", Path("/k/modules"), False)
    plans = [guest_vms.guest_plan(spec(tmp_path), w, boot, 7.5, 2) for w in workers.workers(2)]
    for plan, worker in zip(plans, workers.workers(2), strict=True):
        argv = " ".join(plan["argv"])
        assert f"ifname={worker.tap}," in argv
        assert f"mac={worker.mac}" in argv
        assert "-smp 4," in argv
        assert plan["results"] == str(tmp_path / f"results-{worker.letter}")
        guest = run_plan.Spec(**plan["spec"])
        assert (guest.role, guest.worker, guest.node) == ("worker", worker.name, worker.name)
        assert guest.me == worker
        assert guest.time_scale == 7.5
        assert guest.memory_manager == "Static"
        assert guest.disposable_kernel
        assert not guest.apiserver, "the control plane fills it in"
    a, b = (" ".join(p["argv"]) for p in plans)
    assert "nodeid=2" in a
    assert "dst=2" in a
    assert "nodeid=2" not in b
    assert "dst=2" not in b
    assert [p["tests"] for p in plans] == [True, False]


def test_each_worker_guest_knows_the_release_the_cluster_installed(tmp_path: Path) -> None:
    """RELEASE=1: the worker running the tests describes the release (its version and
    digests) to them; a guest once looked for release.json in a work folder it does not
    have and the run ended before its first test."""
    info = {"version": "0.2.0", "digest": "sha256:" + "ab" * 32, "chart_digest": "sha256:0"}
    boot = guest_vms.GuestBoot(Path("/k/vmlinuz"), tmp_path / "initrd", Path("/k/modules"), False)
    released = spec(tmp_path, release=True, release_info=info)
    for worker in workers.workers(2):
        guest = run_plan.Spec(**guest_vms.guest_plan(released, worker, boot, 7.5, 2)["spec"])
        assert guest.release_info == info
        assert kubecluster.Cluster(guest).released() == info
    assert kubecluster.Cluster(spec(tmp_path)).released() is None


def test_with_kube_router_each_worker_starts_its_firewall_after_its_node_joined(
    tmp_path: Path,
) -> None:
    """KUBE_ROUTER=: each worker guest's spec carries the binary; a worker starts it
    after its kubelet (kube-router reads its Node), with the firewall alone on and the
    worker's own node name; without it the worker starts no enforcer."""
    boot = guest_vms.GuestBoot(Path("/k/vmlinuz"), tmp_path / "initrd", Path("/k/modules"), False)
    enforced = spec(tmp_path, kube_router="/opt/kube-router")
    for worker in workers.workers(2):
        guest = run_plan.Spec(**guest_vms.guest_plan(enforced, worker, boot, 7.5, 2)["spec"])
        steps = [step.__name__ for step in kubecluster.Cluster(guest).steps()]
        assert steps == ["_containerd", "_kubelet", "_network_policy"]
        argv = workers.network_policy_argv(guest.kube_router, "/w/kubeconfig", worker)
        assert argv[0] == "/opt/kube-router"
        assert {"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
                f"--hostname-override={worker.name}"} <= set(argv)  # fmt: skip
        plain = run_plan.Spec(**guest_vms.guest_plan(spec(tmp_path), worker, boot, 7.5, 2)["spec"])
        assert "_network_policy" not in [s.__name__ for s in kubecluster.Cluster(plain).steps()]


def test_kube_router_without_workers_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKERS", raising=False)
    monkeypatch.delenv("NUMA_VM", raising=False)
    monkeypatch.setenv("KUBE_ROUTER", "/opt/kube-router")
    with pytest.raises(SystemExit) as exited:
        cluster.main(["run", "--plugin", "helm"])
    assert exited.value.code == 2


def test_kube_router_and_the_programs_it_runs_are_named_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    lines = run_plan.network_policy_missing(tmp_path / "kube-router")
    assert lines[0] == f"{tmp_path / 'kube-router'}: no such executable (KUBE_ROUTER=)"
    assert any(line.startswith("ipset: not on PATH (Debian package ipset") for line in lines)
    assert any(line.startswith("iptables-save: not on PATH (Debian package iptables")
               for line in lines)  # fmt: skip
    assert run_plan.network_policy_missing(tmp_path)[0].endswith(
        "no such executable (KUBE_ROUTER=)"
    )


def numa_node_of_port(argv: list[str]) -> dict[str, str]:
    """{root port id: the NUMA node of the expander bridge it sits on} from ``argv``."""
    devices = options_of(argv, "-device")
    bridges = {
        d.split("id=")[1].split(",")[0]: d.split("numa_node=")[1].split(",")[0]
        for d in devices if d.startswith("pxb-pcie,")
    }  # fmt: skip
    return {
        d.split("id=")[1].split(",")[0]: bridges[d.split("bus=")[1].split(",")[0]]
        for d in devices if d.startswith("pcie-root-port,")
    }  # fmt: skip


def field(device: str, name: str) -> str:
    return device.split(f"{name}=")[1].split(",")[0]


def test_each_worker_gets_two_data_disks_on_opposite_nodes_and_its_nic_on_node_1(
    tmp_path: Path,
) -> None:
    """Slot a's disk on NUMA node 1 for A and node 0 for B (one template must land on
    different nodes), slot b's on the other node, the hot-plugged disk and the NIC on
    node 1, A's far disk on its memory-only node 2; each disk on its own root port of an
    expander bridge, with its own serial and a sparse image made in the work folder; the
    monitor on the control plane's bridge."""
    boot = guest_vms.GuestBoot(Path("/k/vmlinuz"), tmp_path / "initrd", Path("/k/modules"), False)
    plans = [guest_vms.guest_plan(spec(tmp_path), w, boot, 7.5, 2) for w in workers.workers(2)]
    found = []
    for plan, worker in zip(plans, workers.workers(2), strict=True):
        argv = plan["argv"]
        ports = numa_node_of_port(argv)
        devices = options_of(argv, "-device")
        disks = [d for d in devices if d.startswith("virtio-blk-pci,")]
        (nic,) = [d for d in devices if d.startswith("virtio-net-pci,")]
        files = [field(b, "filename") for b in options_of(argv, "-blockdev") if "filename=" in b]
        assert [Path(f).stat().st_size for f in files] == [render.DATA_DISK_BYTES] * len(disks)
        assert len({field(d, "bus") for d in [*disks, nic]}) == len(disks) + 1  # a port each
        found.append(sorted((field(d, "serial"), ports[field(d, "bus")]) for d in disks))
        assert ports[field(nic, "bus")] == "1"
        assert options_of(argv, "-qmp") == [f"tcp:10.99.0.1:{worker.qmp_port},server=on,wait=off"]
    assert found == [
        [("DATA-DISK-A", "1"), ("FAR-DISK-A", "2"), ("HOTPLUG-A", "1"), ("SLOT-B-A", "0")],
        [("DATA-DISK-B", "0"), ("HOTPLUG-B", "1"), ("SLOT-B-B", "1")],
    ]
    assert [w["qmp"] for w in (x.public() for x in workers.workers(2))] == [
        "10.99.0.1:4440", "10.99.0.1:4441"]  # fmt: skip


def test_a_bridge_without_a_free_root_port_is_refused(tmp_path: Path) -> None:
    disks = [render.DataDisk(tmp_path / f"{i}.img", 0, f"S{i}", f"d{i}")
             for i in range(render.PORTS_PER_BRIDGE + 1)]  # fmt: skip
    with pytest.raises(ValueError, match="NUMA node 0's bridge has no free root port"):
        render.pci_argv(disks)
    with pytest.raises(ValueError, match="NUMA node 2: the guest's bridges are on nodes 0, 1"):
        render.pci_argv([render.DataDisk(tmp_path / "x.img", 2, "S")])


def test_a_shape_without_a_memory_only_node_has_only_its_cpu_nodes() -> None:
    shape = render.GuestShape(cpus_per_node=2, memory_only_mib=0)
    assert shape.nodes == 2
    assert shape.memory_mib == 2 * shape.memory_mib_per_cpu_node


def test_tcg_timeouts_grow_with_the_guests_sharing_the_cores() -> None:
    assert guest_vms.tcg_scale(1) == 5.0
    assert guest_vms.tcg_scale(2) == 7.5


def fake_plan(tmp_path: Path, argv: list[str]) -> run_plan.Spec:
    """A work folder whose guests.json names two 'guests' running ``argv``."""
    plan = []
    for worker in workers.workers(2):
        results = tmp_path / f"results-{worker.letter}"
        results.mkdir()
        plan.append({"name": worker.name, "tests": worker.tests, "results": str(results),
                     "argv": argv, "spec": {"node": worker.name}})  # fmt: skip
    (tmp_path / "guests.json").write_text(json.dumps({"guests": plan}))
    return spec(tmp_path, role="control-plane")


class FakeCluster:
    """What :class:`guest_vms.Guests` uses of the cluster, recording calls."""

    def __init__(self, tmp_path: Path, calls: list[str]) -> None:
        self.ports = {"apiserver": 6443}
        self.token = "t0ken"
        self.processes = processes.Processes(tmp_path)
        self.calls = calls


def test_boot_gives_each_guest_the_api_server_and_token(tmp_path: Path) -> None:
    the_spec = fake_plan(tmp_path, ["sleep", "30"])
    guests = guest_vms.Guests(the_spec, FakeCluster(tmp_path, []))  # type: ignore[arg-type]
    guests.boot()
    try:
        for letter in "ab":
            written = json.loads((tmp_path / f"results-{letter}" / "spec.json").read_text())
            assert written["apiserver"] == f"https://{workers.CONTROL_PLANE_IP}:6443"
            assert written["token"] == "t0ken"
        assert set(guests.cluster.processes.started) == {"guest numa-e2e-a", "guest numa-e2e-b"}
    finally:
        guests.stop(0.1)


def test_stop_tells_every_guest_then_kills_one_that_does_not_power_off(tmp_path: Path) -> None:
    the_spec = fake_plan(tmp_path, ["sleep", "30"])
    guests = guest_vms.Guests(the_spec, FakeCluster(tmp_path, []))  # type: ignore[arg-type]
    guests.boot()
    started = time.monotonic()
    guests.stop(0.5)
    assert time.monotonic() - started < 10
    for letter in "ab":
        assert (tmp_path / f"results-{letter}" / "stop").read_text() == "stop\n"
    assert all(child.poll() is not None for child in guests.running.values())


def test_a_guest_that_powers_off_early_is_named(tmp_path: Path) -> None:
    the_spec = fake_plan(tmp_path, ["true"])
    guests = guest_vms.Guests(the_spec, FakeCluster(tmp_path, []))  # type: ignore[arg-type]
    guests.boot()
    for child in guests.running.values():
        child.wait()
    with pytest.raises(RuntimeError, match="guest numa-e2e-a powered off early"):
        guests.check_alive()


def test_the_tests_status_is_read_from_the_tests_workers_share(tmp_path: Path) -> None:
    the_spec = fake_plan(tmp_path, ["true"])
    guests = guest_vms.Guests(the_spec, FakeCluster(tmp_path, []))  # type: ignore[arg-type]
    guests.boot()
    assert guests.wait_tests(30) == 1, "no exit-code written: a failure"
    (tmp_path / "results-a" / "exit-code").write_text("0\n")
    assert guests.wait_tests(30) == 0
    guests.go()
    assert (tmp_path / "results-a" / "go").exists()
    assert not (tmp_path / "results-b" / "go").exists(), "only the tests' worker runs pytest"


def test_the_control_plane_stops_the_guests_before_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever way the run ends (here: the cluster fails to come up), the guests are told
    to stop and waited for before the control plane goes down."""
    the_spec = fake_plan(tmp_path, ["true"])
    calls: list[str] = []

    def up(self: kubecluster.Cluster) -> None:
        calls.append("up")
        raise RuntimeError("etcd exited")

    monkeypatch.setattr(kubecluster.Cluster, "up", up)
    monkeypatch.setattr(kubecluster.Cluster, "down", lambda self, grace=10.0: calls.append("down"))
    monkeypatch.setattr(guest_vms.Guests, "stop", lambda self, grace: calls.append("stop guests"))
    monkeypatch.setattr("os.getpid", lambda: 4242)  # not PID 1: kill nothing
    monkeypatch.setattr("signal.signal", lambda *args: None)
    assert guest_vms.control_plane(the_spec) == 1
    assert calls == ["up", "stop guests", "down"]
    assert workers.STOP_ORDER[0] == "guests"
    assert workers.STOP_ORDER[-2:] == ("etcd", "docker-registry")


def test_down_stops_the_control_plane_in_the_documented_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    the_spec = spec(tmp_path, role="control-plane")
    control = kubecluster.Cluster(the_spec)
    stopped: list[str] = []
    for name in reversed(workers.STOP_ORDER[1:]):
        pidfile = tmp_path / f"{name}.pid"
        child = subprocess.Popen(["sleep", "30"])
        pidfile.write_text(f"{child.pid}\n")
        control.processes.started[name] = child
        if name != "docker-registry":
            control.processes.described[name] = processes.Process(name, [], "", str(pidfile))

    def record(pid: int, child: subprocess.Popen[bytes], grace: float) -> None:
        stopped.append(next(n for n, c in control.processes.started.items() if c is child))
        child.kill()
        child.wait()

    monkeypatch.setattr(kubecluster, "stop", record)
    control.down()
    assert tuple(stopped) == workers.STOP_ORDER[1:]


@pytest.mark.parametrize(
    ("worker", "files", "expected", "ran"),
    [
        ("numa-e2e-a", ["go"], 7, True),  # the tests' worker: pytest's status
        ("numa-e2e-a", ["stop"], 1, False),  # stopped before go: nothing ran
        ("numa-e2e-b", ["go", "stop"], 0, False),  # another worker waits for stop only
    ],
)
def test_a_worker_joins_then_runs_the_tests_only_when_told(
    worker: str, files: list[str], expected: int, ran: bool, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    results = tmp_path / "results"
    results.mkdir()
    the_spec = spec(tmp_path, role="worker", worker=worker, node=worker, results=str(results))
    runs: list[bool] = []

    def run_tests(self: kubecluster.Cluster) -> int:
        runs.append(True)
        return 7

    monkeypatch.setattr(kubecluster.Cluster, "run_tests", run_tests)
    for name in files:
        (results / name).write_text(f"{name}\n")
    assert kubecluster.worker_duty(kubecluster.Cluster(the_spec)) == expected
    assert bool(runs) == ran
    assert (results / "up").read_text() == f"{worker}\n"


def test_ready_nodes_counts_only_ready_pods() -> None:
    pods: list[dict[str, Any]] = [
        {"spec": {"nodeName": "a"}, "status": {"conditions": [{"type": "Ready",
                                                                "status": "True"}]}},
        {"spec": {"nodeName": "b"}, "status": {"conditions": [{"type": "Ready",
                                                                "status": "False"}]}},
        {"spec": {"nodeName": "c"}, "status": {}},
    ]  # fmt: skip
    assert kubecluster.ready_nodes(pods) == {"a"}


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"WORKERS": "2", "PLUGIN": "process"}, "WORKERS=2 runs the image"),
        ({"WORKERS": "two", "PLUGIN": "helm"}, "WORKERS='two'"),
        ({"WORKERS": "9", "PLUGIN": "helm"}, "WORKERS=9: use 1 to 8"),
        ({"WORKERS": "2", "PLUGIN": "helm", "NUMA_VM": "1"}, "leave NUMA_VM unset"),
    ],
)
def test_bad_worker_settings_exit_2_with_usage(
    environment: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for name in ("WORKERS", "PLUGIN", "NUMA_VM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        cluster.main(["run", "--bin-dir", "/nowhere"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert message in err


def test_workers_need_qemu_and_name_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKERS", "2")
    monkeypatch.setenv("PLUGIN", "helm")
    monkeypatch.delenv("NUMA_VM", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert cluster.main(["run", "--bin-dir", "/nowhere"]) == 2
    err = capsys.readouterr().err
    assert "qemu-system-x86_64: not on PATH (Debian package qemu-system-x86)" in err


def test_an_interrupted_step_in_a_namespace_is_130_whatever_its_child_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during ``make image`` once let the push and the cluster go on: the build
    (PID 1 of its namespace, SIGTERM dropped) finished and said 0."""

    class Child:
        pid = 999_999_999
        waits = 0

        def wait(self) -> int:
            Child.waits += 1
            if Child.waits == 1:
                raise KeyboardInterrupt
            return 0

    monkeypatch.setattr("subprocess.Popen", lambda *args, **kwargs: Child())
    assert kubecluster.in_namespace(spec(tmp_path), "build", str(tmp_path), network=False) == 130
    assert Child.waits == 2, "the namespace's end is waited for"


def test_the_namespace_commands_handle_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    seen = []
    monkeypatch.setattr("shipped.python_standin", lambda cache: tmp_path)
    monkeypatch.setattr(
        "shipped.build_image",
        lambda *args: seen.append(signal.getsignal(signal.SIGTERM)),
    )  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert cluster.main(["build", str(tmp_path)]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [processes.interrupt]


def test_outside_a_worker_guest_there_is_no_worker(tmp_path: Path) -> None:
    """The one-node modes (workers 0) and the control plane have none: the one-node
    harness asks for it to pick the node's address."""
    assert spec(tmp_path, workers=0).me is None
    assert spec(tmp_path, role="control-plane").me is None
    assert kubecluster.Cluster(spec(tmp_path, workers=0, plugin="process")).node_ip == "127.0.0.1"


def test_the_namespaces_and_the_guests_run_the_harness_entry_script(tmp_path: Path) -> None:
    """Split into modules, the harness still re-runs ``cluster.py`` (its command line),
    never the module that starts the namespace or builds the guest's init command."""
    the_spec = spec(tmp_path)
    entry = REPO / "test/local/cluster.py"
    assert entry.resolve() == run_plan.HARNESS
    argv = kubecluster.namespace_argv(the_spec, "inside", "spec.json", network=True)
    assert argv[argv.index("--kill-child") + 1 :] == [
        the_spec.python, str(entry.resolve()), "inside", "spec.json",
    ]  # fmt: skip
    assert "--net" in argv
    assert "--net" not in kubecluster.namespace_argv(the_spec, "build", network=False)
    command = guest_vms.guest_command(the_spec, ["/tmp/kept"]).split()
    assert command[command.index(the_spec.python) + 1] == str(entry.resolve())
    assert command[-2:] == ["/ndp-results", "/tmp/kept"]
    assert "def main(" in entry.read_text()
