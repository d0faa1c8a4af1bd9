"""Offline tests of the one-machine cluster harness (test/local/): what it renders, what it
refuses to start without, how it leaves the host, and the order it stops things in. The
live tier (``make test-e2e-local``) needs Kubernetes binaries no registry ships, so CI runs
only these."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import build_machine
from tests.conftest import REPO
from tests.e2e.localplatform import _with_capacity
from tests.e2e.platforms import ClusterConfig, read_sysfs_layout

sys.path.insert(0, str(REPO / "test" / "local"))
import cluster
import guests as guest_vms
import hoststate
import kubecluster
import plan as run_plan
import render
import results as run_results


def settings(**changes: object) -> render.KubeletSettings:
    values: dict[str, object] = {
        "node_name": "n",
        "port": 10250,
        "runtime_socket": Path("/w/containerd/containerd.sock"),
    }
    values.update(changes)
    return render.KubeletSettings(**values)  # type: ignore[arg-type]


def test_kubelet_config_aligns_cpus_and_touches_no_iptables() -> None:
    config = render.kubelet_config(settings(reserved_cpus="0,4"))
    assert config["cpuManagerPolicy"] == "static"
    assert config["reservedSystemCPUs"] == "0,4"
    assert config["topologyManagerPolicy"] == "single-numa-node"
    assert config["makeIPTablesUtilChains"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["containerRuntimeEndpoint"] == "unix:///w/containerd/containerd.sock"
    assert config["imageGCHighThresholdPercent"] == 100, "images cannot be pulled again"
    assert config["readOnlyPort"] == 0
    assert "reservedMemory" not in config


def test_kubelet_config_memory_manager_reserves_per_numa_node() -> None:
    config = render.kubelet_config(
        settings(memory_manager="Static", reserved_memory=((0, 64 * 2**20), (1, 36 * 2**20)))
    )
    assert config["memoryManagerPolicy"] == "Static"
    assert config["reservedMemory"] == [
        {"numaNode": 0, "limits": {"memory": "64Mi"}},
        {"numaNode": 1, "limits": {"memory": "36Mi"}},
    ]
    assert config["evictionHard"]["memory.available"] == "100Mi"


def test_containerd_config_keeps_every_path_in_the_work_folder(tmp_path: Path) -> None:
    config = tomllib.loads(render.containerd_config(tmp_path))
    for value in (config["root"], config["state"], config["grpc"]["address"]):
        assert value.startswith(str(tmp_path))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == render.PAUSE_IMAGE
    assert cri["cni"]["conf_dir"].startswith(str(tmp_path))
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    assert "io.containerd.internal.v1.opt" in config["disabled_plugins"], "no /opt/containerd"


def test_kubeconfig_names_the_server_and_token() -> None:
    config = render.kubeconfig("https://127.0.0.1:6443", "abc")
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert config["users"][0]["user"]["token"] == "abc"


def test_oci_archive_holds_both_images_on_one_busybox_layer() -> None:
    layer = render.busybox_layer(b"\x7fELF-busybox", ["sh", "sleep", "busybox", "grep"])
    archive = render.oci_archive(
        layer, [(render.BUSYBOX_IMAGE, ["sh"]), (render.PAUSE_IMAGE, ["sleep", "1"])]
    )
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    import hashlib

    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rpartition("/")[2]
    index = json.loads(files["index.json"])
    names = [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]
    assert names == [render.BUSYBOX_IMAGE, render.PAUSE_IMAGE]
    commands = []
    for entry in index["manifests"]:
        manifest = json.loads(files["blobs/sha256/" + entry["digest"][7:]])
        config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
        commands.append(config["config"]["Cmd"])
        assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    assert commands == [["sh"], ["sleep", "1"]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym()
    assert members["bin/sh"].linkname == "busybox"
    assert "bin/busybox" in members
    assert members["tmp"].mode == 0o1777


def parse_newc(data: bytes) -> list[tuple[str, int, bytes]]:
    entries: list[tuple[str, int, bytes]] = []
    offset = 0
    while True:
        assert data[offset : offset + 6] == b"070701"
        fields = [int(data[offset + 6 + 8 * i : offset + 14 + 8 * i], 16) for i in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        offset += 110
        name = data[offset : offset + name_size - 1].decode()
        offset += name_size + (-(110 + name_size) % 4)
        body = data[offset : offset + size]
        offset += size + (-size % 4)
        if name == "TRAILER!!!":
            return entries
        entries.append((name, mode, body))


def test_cpio_newc_reads_back_with_alignment() -> None:
    wanted = [
        ("bin", 0o040755, b""),
        ("bin/busybox", 0o100755, b"abc"),
        ("bin/sh", 0o120777, b"busybox"),
    ]
    data = render.cpio_newc(wanted)
    assert len(data) % 4 == 0
    assert parse_newc(data) == wanted


def options_of(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_qemu_argv_describes_two_cpu_nodes_a_memory_only_node_and_a_slit() -> None:
    shape = render.GuestShape(cpu_nodes=2, cpus_per_node=3)
    argv = render.qemu_argv(
        qemu="q", kvm=False, shape=shape, kernel=Path("k"), initrd=Path("i"),
        console_log=Path("c"), results=Path("/r"),
    )  # fmt: skip
    numa = options_of(argv, "-numa")
    assert numa[:3] == [
        "node,nodeid=0,memdev=m0,cpus=0-2",
        "node,nodeid=1,memdev=m1,cpus=3-5",
        "node,nodeid=2,memdev=m2",
    ]
    distances = {n for n in numa if n.startswith("dist")}
    assert "dist,src=0,dst=1,val=21" in distances
    assert "dist,src=1,dst=2,val=31" in distances
    assert "dist,src=2,dst=0,val=26" in distances  # far memory behind node 0
    assert len(distances) == 6
    assert options_of(argv, "-accel") == ["tcg,thread=multi"]
    assert options_of(argv, "-smp") == ["6,sockets=6,cores=1,threads=1"]
    assert options_of(argv, "-m") == [f"{shape.memory_mib}M"]
    shares = options_of(argv, "-virtfs")
    assert "readonly=on" in shares[0]
    assert "path=/," in shares[0]
    assert "path=/r," in shares[1]
    assert "readonly" not in shares[1]
    kvm = render.qemu_argv(
        qemu="q", kvm=True, shape=shape, kernel=Path("k"), initrd=Path("i"),
        console_log=Path("c"), results=Path("/r"),
    )  # fmt: skip
    assert options_of(kvm, "-accel") == ["kvm"]
    assert options_of(kvm, "-cpu") == ["host"]


def test_a_socket_guest_puts_two_numa_nodes_in_each_socket_one_per_die() -> None:
    """NUMA_VM_SOCKETS=4: 4 sockets of 4 cores, each NUMA node 2 cores of one socket
    (qemu's dies showed as packages in the guest), no memory-only node; 12 within a
    socket, 21 across."""
    shape = render.GuestShape(cpu_nodes=8, cpus_per_node=2, memory_mib_per_cpu_node=1024,
                              memory_only_mib=0, sockets=4)  # fmt: skip
    argv = render.qemu_argv(
        qemu="q", kvm=False, shape=shape, kernel=Path("k"), initrd=Path("i"),
        console_log=Path("c"), results=Path("/r"),
    )  # fmt: skip
    assert options_of(argv, "-smp") == ["16,sockets=4,cores=4,threads=1"]
    numa = options_of(argv, "-numa")
    assert [n for n in numa if n.startswith("node,")] == [
        f"node,nodeid={n},memdev=m{n}" for n in range(8)
    ]
    assert [n for n in numa if n.startswith("cpu,")] == [
        f"cpu,node-id={n},socket-id={n // 2},core-id={2 * (n % 2) + i},thread-id=0"
        for n in range(8) for i in range(2)
    ]  # fmt: skip
    assert "dist,src=2,dst=3,val=12" in numa
    assert "dist,src=1,dst=2,val=21" in numa
    assert shape.memory_mib == 8 * 1024


def test_guest_init_loads_modules_in_order_and_switches_root() -> None:
    script = render.guest_init_script("/bin/bash /x/guest-init.sh a b")
    loads = [line.split("/")[-1][:-3] for line in script.splitlines() if line.startswith("insmod")]
    assert loads == list(render.GUEST_MODULES)
    assert "exec switch_root /newroot /bin/bash /x/guest-init.sh a b" in script
    assert script.index("mount -t overlay") < script.index("switch_root")


def test_initramfs_refuses_a_kernel_without_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF static busybox")
    monkeypatch.setattr(run_plan, "BUSYBOX", busybox)  # a fresh machine has none
    (tmp_path / "kernel").mkdir()
    for name in render.GUEST_MODULES[:-1]:
        (tmp_path / "kernel" / f"{name}.ko").write_bytes(b"m")
    with pytest.raises(run_plan.Missing, match="overlay"):
        guest_vms.initramfs(tmp_path, "true")
    (tmp_path / "kernel" / "overlay.ko").write_bytes(b"o")
    entries = {name: data for name, _, data in parse_newc(guest_vms.initramfs(tmp_path, "true"))}
    assert entries["modules/overlay.ko"] == b"o"
    assert entries["bin/busybox"] == b"\x7fELF static busybox"


# --- what a run refuses to start without ------------------------------------------------


def fake_bins(folder: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_missing_binaries_tools_and_root_are_each_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bins = fake_bins(tmp_path / "bin", ("kubelet", "etcd"))
    monkeypatch.setenv("PATH", str(fake_bins(tmp_path / "path", ("containerd", "ctr"))))
    lines = run_plan.missing_requirements(bins, vm=True, is_root=False)
    text = "\n".join(lines)
    assert f"{bins}/kube-apiserver: no such executable" in text
    assert f"{bins}/kube-scheduler: no such executable" in text
    assert "kubelet:" not in text.replace("kubelet, ", "")
    assert "runc: not on PATH (Debian package runc)" in text
    assert "qemu-system-x86_64: not on PATH (Debian package qemu-system-x86)" in text
    assert "containerd: not on PATH" not in text
    assert any(line.startswith("root:") for line in lines)
    assert run_plan.missing_requirements(None, vm=False, is_root=True)[0].startswith(
        "KUBE_BIN_DIR is not set"
    )


def test_a_dynamic_busybox_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(b"\x7fELF" + b"\0" * 100 + b"/lib64/ld-linux-x86-64.so.2")
    monkeypatch.setattr(run_plan, "BUSYBOX", fake)
    lines = run_plan.missing_requirements(None, vm=False, is_root=True)
    assert any("busybox-static" in line for line in lines)


def test_run_exits_2_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NUMA_VM", raising=False)
    assert cluster.main(["run", "--bin-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot run; missing:" in err
    assert "kube-apiserver: no such executable" in err
    assert "containerd: not on PATH" in err
    assert not list(tmp_path.glob("ndp-e2e-*")), "nothing created before the checks pass"


@pytest.mark.parametrize(("value", "vm"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_numa_vm_values(value: str, vm: bool) -> None:
    assert run_plan.vm_wanted(value) is vm


def test_a_bad_numa_vm_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMA_VM", "maybe")
    with pytest.raises(SystemExit) as exited:
        cluster.main(["run"])
    assert exited.value.code == 2


def test_make_target_without_kube_bin_dir_exits_2() -> None:
    done = subprocess.run(
        ["make", "-s", "-o", "install", "test-e2e-local", "KUBE_BIN_DIR=", f"PY={sys.executable}"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "KUBE_BIN_DIR is not set" in done.stderr


# --- the host afterwards ------------------------------------------------------------------


def fake_host(root: Path) -> tuple[Path, Path]:
    proc, cgroups = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "22 1 0:21 / / rw - ext4 /dev/vda rw\n30 22 0:25 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
    )
    for name in render.KUBELET_SYSCTLS:
        (proc / "sys" / name).parent.mkdir(parents=True, exist_ok=True)
        (proc / "sys" / name).write_text("0\n")
    (proc / "100").mkdir()
    (proc / "100" / "cmdline").write_bytes(b"/usr/sbin/sshd\0-D\0")
    (cgroups / "cpu" / "user").mkdir(parents=True)
    return proc, cgroups


def test_differences_name_each_leftover(tmp_path: Path) -> None:
    proc, cgroups = fake_host(tmp_path)
    fixed = (tmp_path / "var-lib-kubelet",)
    before = hoststate.snapshot(proc, cgroups, fixed=fixed)
    assert hoststate.differences(before, hoststate.snapshot(proc, cgroups, fixed=fixed)) == []
    (cgroups / "cpu" / "kubepods" / "besteffort").mkdir(parents=True)
    (proc / "sys" / "vm/overcommit_memory").write_text("1\n")
    (proc / "200").mkdir()
    (proc / "200" / "cmdline").write_bytes(b"/opt/k/kubelet\0--config\0x\0")
    with (proc / "self" / "mountinfo").open("a") as mounts:
        mounts.write("40 22 0:30 / /var/lib/kubelet rw - ext4 /dev/vda rw\n")
    fixed[0].mkdir()
    lines = hoststate.differences(before, hoststate.snapshot(proc, cgroups, fixed=fixed))
    assert "cgroup left behind: cpu/kubepods" in lines
    assert "cgroup left behind: cpu/kubepods/besteffort" in lines
    assert "sysctl vm.overcommit_memory: 0 before, 1 after" in lines
    assert "process left behind: (200, 'kubelet')" in lines
    assert "mount left behind: ('/var/lib/kubelet', 'ext4', '/dev/vda')" in lines
    assert f"path left behind: {fixed[0]}" in lines


def test_restore_puts_tunables_back_and_removes_only_what_the_run_made(tmp_path: Path) -> None:
    proc, cgroups = fake_host(tmp_path)
    made, kept = tmp_path / "made", tmp_path / "kept"
    kept.mkdir()
    before = hoststate.snapshot(proc, cgroups, fixed=(made, kept))
    (cgroups / "cpu" / "kubepods" / "pod1" / "c1").mkdir(parents=True)
    (proc / "sys" / "kernel/panic").write_text("10\n")
    made.mkdir()
    hoststate.restore(before, proc, cgroups, fixed=(made, kept), attempts=3)
    assert (
        hoststate.differences(before, hoststate.snapshot(proc, cgroups, fixed=(made, kept))) == []
    )
    assert (proc / "sys" / "kernel/panic").read_text() == "0\n"
    assert kept.is_dir()
    assert (cgroups / "cpu" / "user").is_dir()


def test_restore_never_deletes_a_folder_with_content(tmp_path: Path) -> None:
    proc, cgroups = fake_host(tmp_path)
    made = tmp_path / "made"
    before = hoststate.snapshot(proc, cgroups, fixed=(made,))
    made.mkdir()
    (made / "somebody's file").write_text("x")
    hoststate.restore(before, proc, cgroups, fixed=(made,), attempts=1)
    assert (made / "somebody's file").is_file()


def test_down_stops_the_plugin_and_kubelet_first_and_etcd_last(tmp_path: Path) -> None:
    """Stand-ins for each process write their name when SIGTERM reaches them."""
    spec = run_plan.Spec(bin_dir=str(tmp_path), work=str(tmp_path), python=sys.executable,
                        pytest_args=[])  # fmt: skip
    harness = kubecluster.Cluster(spec)
    order = tmp_path / "order"
    names = ("etcd", "kube-apiserver", "kube-scheduler", "containerd", "kubelet", "plugin")
    for name in names:
        script = (
            f'trap "echo {name} >> {order}; exit 0" TERM; touch {tmp_path}/{name}.up; '
            "while :; do sleep 0.05; done"
        )
        harness.processes.start(name, ["bash", "-c", script])
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"{n}.up").exists() for n in names):
        assert time.monotonic() < deadline, "stand-ins did not start"
        time.sleep(0.05)
    harness.down()
    for child in harness.processes.started.values():
        child.wait(timeout=30)
    assert order.read_text().split() == [
        "plugin", "kubelet", "kube-scheduler", "containerd", "kube-apiserver", "etcd",
    ]  # fmt: skip


# --- the e2e fixtures' pure parts ---------------------------------------------------------


def test_sysfs_layout_lists_nodes_with_online_cpus_only(tmp_path: Path) -> None:
    tree = build_machine(tmp_path / "sys", nodes=3, cpus_per_node=2)
    tree.write("node/node2/cpulist", "\n")
    tree.write("cpu/online", "0-2\n")
    layout = read_sysfs_layout(tmp_path / "sys")
    assert layout == {0: frozenset({0, 1}), 1: frozenset({2})}
    assert ClusterConfig(layout, frozenset({0})).exclusive_cpus(0) == 1


def test_with_capacity_replaces_the_mode_and_reserved_cpus() -> None:
    argv = ["p", "serve", "--capacity", "100", "--metrics-address", "a"]
    cpus = _with_capacity(argv, "cpus", "0")
    assert cpus == [
        "p",
        "serve",
        "--metrics-address",
        "a",
        "--capacity",
        "cpus",
        "--reserved-cpus",
        "0",
    ]
    assert _with_capacity(cpus, "100", "0") == [
        "p",
        "serve",
        "--metrics-address",
        "a",
        "--capacity",
        "100",
    ]


def test_the_orphan_reaper_leaves_the_harness_children_their_exit_status() -> None:
    """A registered child keeps its status; an unregistered one (an orphan) is reaped."""
    import threading

    own = {"pytest": subprocess.Popen(["sh", "-c", "sleep 0.3; exit 3"])}
    orphan = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 4"])
    stop = threading.Event()
    reaper = threading.Thread(target=kubecluster.reap_orphans, args=(own, stop), daemon=True)
    reaper.start()
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{orphan.pid}").exists():
            assert time.monotonic() < deadline, "the orphan was never reaped"
            time.sleep(0.1)
        assert own["pytest"].wait(timeout=30) == 3
    finally:
        stop.set()
        reaper.join(timeout=10)
    assert orphan.wait(timeout=5) == 0, "reaped by the reaper: its status is gone"


# --- Kubernetes versions and the guest's /tmp ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("Kubernetes v1.28.7\n", (1, 28, 7)),
        ("Kubernetes v1.36.2-rc.0+abc\n", (1, 36, 2)),
    ],
)
def test_kubelet_versions_parse(text: str, version: tuple[int, int, int]) -> None:
    assert render.parse_kube_version(text) == version


@pytest.mark.parametrize("text", ["Kubernetes v0.0.0-master+$Format:%H$", "", "kubelet"])
def test_a_binary_without_its_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="no Kubernetes version"):
        render.parse_kube_version(text)


@pytest.mark.parametrize(
    ("version", "problem"),
    [((1, 27, 9), True), ((1, 28, 0), False), ((1, 32, 6), False), ((1, 36, 2), False),
     ((1, 37, 0), True)],
)  # fmt: skip
def test_supported_versions_are_1_28_to_1_36(version: tuple[int, int, int], problem: bool) -> None:
    found = render.version_problem(version)
    assert (found is not None) == problem
    if found:
        assert "outside what the harness supports (v1.28 to v1.36)" in found


@pytest.mark.parametrize(
    ("version", "cgroup_v1", "field"),
    [((1, 36, 2), True, False), ((1, 35, 0), True, False), ((1, 36, 2), False, None),
     ((1, 34, 2), True, None), ((1, 28, 7), True, None)],
)  # fmt: skip
def test_fail_cgroup_v1_is_rendered_only_where_the_kubelet_needs_it(
    version: tuple[int, int, int], cgroup_v1: bool, field: bool | None
) -> None:
    value = render.fail_cgroup_v1(version, cgroup_v1)
    assert value is field
    settings = render.KubeletSettings("n", 1, Path("/c.sock"), fail_cgroup_v1=value)
    config = render.kubelet_config(settings)
    if field is None:
        assert "failCgroupV1" not in config
    else:
        assert config["failCgroupV1"] is False


def test_the_host_cgroup_version_is_read_from_the_mounts() -> None:
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
    v1 = "tmpfs /sys/fs/cgroup tmpfs ro 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
    assert not run_plan.host_cgroup_v1(v2)
    assert run_plan.host_cgroup_v1(v1)


def test_an_unsupported_kubelet_is_named_before_anything_runs(tmp_path: Path) -> None:
    bins = fake_bins(tmp_path / "bin", run_plan.KUBE_BINARIES)
    (bins / "kubelet").write_text("#!/bin/sh\necho Kubernetes v1.27.16\n")
    lines = run_plan.missing_requirements(bins, vm=False, is_root=True)
    assert "Kubernetes v1.27.16 is outside what the harness supports (v1.28 to v1.36)" in lines
    (bins / "kubelet").write_text("#!/bin/sh\necho Kubernetes v1.36.2\n")
    assert not any("Kubernetes" in line for line in run_plan.missing_requirements(
        bins, vm=False, is_root=True))  # fmt: skip


def test_host_paths_under_tmp_are_bound_into_the_guests_tmp() -> None:
    """A KUBE_BIN_DIR (or checkout, or venv) under the host's /tmp was invisible in the
    guest, whose /tmp is a tmpfs of its own."""
    kept = render.kept_tmp_paths(
        [Path("/tmp/k8s/bin"), Path("/tmp/k8s"), Path("/work/main"), Path("/tmp/co/.venv"),
         Path("/tmpfoo/x"), Path("/tmp/co/.venv/../.venv")]
    )  # fmt: skip
    assert kept == ["/tmp/co/.venv", "/tmp/k8s"]
    script = (REPO / "test/local/guest-init.sh").read_text()
    tmpfs = script.index("mount -t tmpfs -o size=50% tmpfs /tmp")
    assert script.index("mount --bind /tmp /host-tmp") < tmpfs
    assert tmpfs < script.index('mount --bind "/host-tmp/${kept#/tmp/}" "$kept"')


def test_a_failed_command_shows_its_stderr_and_the_plugins_last_log_lines() -> None:
    """The e2e failure of ``status`` on a loaded machine once showed only
    CalledProcessError: not why it failed."""
    from tests.e2e.platforms import run_checked

    command = ["sh", "-c", "echo partial; echo 'no answer within 5 s' >&2; exit 3"]
    log = "\n".join(f"line {i}" for i in range(100))
    with pytest.raises(AssertionError) as caught:
        run_checked(command, timeout=30, plugin_log=lambda: log)
    text = str(caught.value)
    assert "exited 3" in text
    assert "no answer within 5 s" in text
    assert "partial" in text
    assert "line 99" in text
    assert "line 59\n" not in text, "only the last 40 lines"
    assert run_checked(["sh", "-c", "echo fine"], timeout=30) == "fine\n"


def run_with_progress(folder: Path, progress: Path) -> subprocess.CompletedProcess[str]:
    """pytest on ``folder``'s test_sample.py with the e2e conftest and its progress file."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.e2e.conftest",
         "--rootdir", str(folder), str(folder / "test_sample.py")],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO),
                         "NUMA_E2E_PROGRESS": str(progress)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_each_e2e_test_lands_in_the_progress_file_as_it_ends(tmp_path: Path) -> None:
    """A run cut by its time limit left only dots: the e2e conftest writes a line per
    test as it ends (outcome, why, what it printed), and the harness's summary reads it."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_passes():\n    print('pod on NUMA node 1: Cpus_allowed_list=3')\n"
        "def slow():\n    assert 1 == 2, 'too slow'\n"
        "def test_fails():\n    print('status took 41 s')\n    slow()\n"
        "def test_skips():\n    pytest.skip('needs two workers')\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('no cluster')\n"
        "def test_errors(broken):\n    pass\n"
    )
    progress = tmp_path / "progress.jsonl"
    run_with_progress(tmp_path, progress)
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    by_test = {r["test"].rpartition("::")[2]: r for r in records}
    assert sorted(by_test) == ["test_errors", "test_fails", "test_passes", "test_skips"]
    assert by_test["test_passes"]["outcome"] == "passed"
    assert by_test["test_passes"]["observed"] == ["pod on NUMA node 1: Cpus_allowed_list=3"]
    assert by_test["test_fails"]["outcome"] == "failed"
    assert "too slow" in by_test["test_fails"]["why"]
    assert by_test["test_fails"]["observed"] == ["status took 41 s"]
    assert by_test["test_fails"]["where"] == ["test_sample.py:8", "test_sample.py:5"]
    assert by_test["test_skips"]["where"] == []
    assert (by_test["test_skips"]["outcome"], by_test["test_skips"]["why"]) == (
        "skipped",
        "Skipped: needs two workers",
    )
    assert (by_test["test_errors"]["when"], by_test["test_errors"]["outcome"]) == (
        "setup",
        "failed",
    )
    summary = render.progress_summary(progress.read_text() + '{"test": "cut mid-wr')
    assert summary.splitlines()[0] == (
        "e2e progress: 2 failed, 1 passed, 1 skipped (1 unreadable line(s))"
    )
    assert "  FAILED  test_sample.py::test_fails" in summary
    assert "why: AssertionError: too slow" in summary
    assert "at: test_sample.py:8 > test_sample.py:5" in summary
    assert "saw: pod on NUMA node 1: Cpus_allowed_list=3" in summary


def test_a_failed_e2e_test_carries_the_plugins_last_log_lines(tmp_path: Path) -> None:
    """A /metrics read that timed out on a 1.28.7 guest left no trace of what the plugin
    was doing: a failure's report (and progress line) now has the plugin's log tail,
    from a platform fixture or one held by another fixture; a passing test has none."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest, types\n"
        "class Platform:\n"
        "    def plugin_log(self):\n"
        "        return '\\n'.join(f'plugin line {i}' for i in range(100))\n"
        "@pytest.fixture\ndef two():\n    return types.SimpleNamespace(platform=Platform())\n"
        "def test_fails(two):\n    assert False, 'metrics timed out'\n"
        "def test_passes(two):\n    pass\n"
    )
    progress = tmp_path / "progress.jsonl"
    done = run_with_progress(tmp_path, progress)
    assert "plugin log (last lines)" in done.stdout
    assert "plugin line 99" in done.stdout
    assert "plugin line 59\n" not in done.stdout
    by_test = {json.loads(line)["test"].rpartition("::")[2]: json.loads(line)
               for line in progress.read_text().splitlines()}  # fmt: skip
    assert by_test["test_fails"]["plugin_log"][-1] == "plugin line 99"
    assert len(by_test["test_fails"]["plugin_log"]) == 6
    assert by_test["test_passes"]["plugin_log"] == []
    summary = render.progress_summary(progress.read_text())
    assert "plugin: plugin line 99" in summary


def test_a_long_failure_chain_keeps_the_tests_line_and_the_raising_frames() -> None:
    from types import SimpleNamespace

    from tests.e2e.progress import failure_chain

    def entry(line: int | None) -> SimpleNamespace:
        loc = None if line is None else SimpleNamespace(path=f"f{line}.py", lineno=line)
        return SimpleNamespace(reprfileloc=loc)

    longrepr = SimpleNamespace(reprtraceback=SimpleNamespace(
        reprentries=[entry(n) for n in (1, 2, None, 3, 4, 5, 6)]))  # fmt: skip
    assert failure_chain(longrepr) == ["f1.py:1", "...", "f4.py:4", "f5.py:5", "f6.py:6"]
    assert failure_chain(longrepr, keep=6) == [f"f{n}.py:{n}" for n in range(1, 7)]
    assert failure_chain(("file.py", 3, "Skipped: why")) == []


def test_the_harness_prints_the_progress_summary_on_any_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results-a"
    results.mkdir()
    (results / run_results.PROGRESS_FILE).write_text(
        json.dumps({"test": "t::a", "outcome": "passed", "seconds": 1.0, "observed": ["x"]}) + "\n"
    )
    run_results.print_progress(tmp_path)
    assert "e2e progress: 1 passed" in capsys.readouterr().out
    run_results.print_progress(tmp_path / "gone")  # a work folder already removed: nothing
    assert "    finally:\n        print_progress(work)\n" in Path(cluster.__file__).read_text()


def test_other_work_on_the_machine_never_turns_a_run_red_nor_is_touched(tmp_path: Path) -> None:
    """A program's own cgroup gone or made during the run, a mount of its own: not the
    run's, so no difference, and restore never kills or removes them."""
    proc, cgroups = fake_host(tmp_path)
    (cgroups / "memory" / "someone-else" / "job-1").mkdir(parents=True)
    fixed = (tmp_path / "var-lib-kubelet",)
    before = hoststate.snapshot(proc, cgroups, fixed=fixed)
    (cgroups / "memory" / "someone-else" / "job-1").rmdir()
    (cgroups / "memory" / "someone-else" / "job-2").mkdir()
    with (proc / "self" / "mountinfo").open("a") as mounts:
        mounts.write("41 22 0:31 / /mnt/usb rw - vfat /dev/sdz1 rw\n")
    hoststate.restore(before, proc, cgroups, fixed=fixed, attempts=2)
    assert (cgroups / "memory" / "someone-else" / "job-2").is_dir()
    work = tmp_path / "work"
    assert hoststate.differences(before, hoststate.snapshot(proc, cgroups, fixed=fixed), work,
                                 fixed) == []  # fmt: skip
    (cgroups / "memory" / "kubepods" / "pod9").mkdir(parents=True)
    with (proc / "self" / "mountinfo").open("a") as mounts:
        mounts.write(f"42 22 0:32 / {work}/rootfs rw - overlay overlay rw\n")
    lines = hoststate.differences(before, hoststate.snapshot(proc, cgroups, fixed=fixed), work,
                                  fixed)  # fmt: skip
    assert "cgroup left behind: memory/kubepods/pod9" in lines
    assert f"mount left behind: ('{work}/rootfs', 'overlay', 'overlay')" in lines
