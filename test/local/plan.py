"""What a run of the local cluster needs and how it is set up: the binaries and host tools it
checks for (:func:`missing_requirements`, naming each thing absent and where to get it),
the run's :class:`Spec` as the command line and the environment made it, and the
small facts it reads from the host (the Kubernetes version, cgroup v1, a free port).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import render
import workers
from workers import Worker

REPO = Path(__file__).resolve().parents[2]
# The harness's entry script: the namespaces and the guests run it again (``cluster.py
# COMMAND``), never the module that starts them.
HARNESS = Path(__file__).resolve().parent / "cluster.py"
KUBE_BINARIES = ("kubelet", "kube-apiserver", "kube-scheduler", "etcd")
HOST_TOOLS = {  # program: the Debian package that has it
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "openssl": "openssl",
}
VM_TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "apt-get": "apt",
    "dpkg-deb": "dpkg",
    "depmod": "kmod",
    "modprobe": "kmod",
    "mkfs.ext4": "e2fsprogs",
}
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: a complete, static image
NODE_NAME = "numa-e2e"
# The kubelet's hard eviction threshold (memory.available), the default of KubeletSettings.
EVICTION_MEMORY_BYTES = render.KubeletSettings.eviction_memory_bytes
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "numa-device-plugin"


class Missing(Exception):
    """Something the run needs is absent; ``str()`` names each thing and where to get it."""


@dataclass(frozen=True)
class Spec:
    """Everything the cluster's inside needs, written as JSON for the namespace (or the
    guest) and, with the processes' pid files filled in, for the e2e fixtures
    (``NUMA_E2E_LOCAL``). Times in seconds; ``time_scale`` multiplies every timeout of
    the tests (5 under TCG)."""

    bin_dir: str
    work: str
    python: str
    pytest_args: list[str]
    node: str = NODE_NAME
    reserved_cpus: str = "0"
    time_scale: float = 1.0
    disposable_kernel: bool = False
    results: str = ""
    memory_manager: str = "None"
    # process: the checkout's plugin as a process; kustomize, helm: the image from the
    # registry, installed with the README's command (:mod:`shipped`).
    plugin: str = "process"
    # The registry's storage, filled by ``make push`` before the cluster starts.
    registry_storage: str = ""
    helm: str = ""
    # RELEASE=1 (with PLUGIN=helm): the image index and chart made by ``make release``'s
    # program instead of ``make image``/``make push``, installed from the registry by
    # digest with the README's install-from-a-release command.
    release: bool = False
    # What the release made ({version, digest, chart_digest}); filled in once it ran, so
    # that the worker guests' specs carry it too.
    release_info: dict[str, str] | None = None
    # The guest kernel's modules (depmod run), bound at /lib/modules/<version> in the guest.
    guest_modules: str = ""
    # WORKERS=N (:mod:`workers`): the cluster has N worker guests. ``role`` says which
    # part this process is: "control-plane" (on the host, in the namespace) or "worker"
    # (in a guest; ``worker`` is its node name). The workers join ``apiserver`` with
    # ``token``; both are filled in by the control plane before it boots them.
    workers: int = 0
    role: str = ""
    worker: str = ""
    apiserver: str = ""
    token: str = ""
    # KUBE_ROUTER=<binary> (with WORKERS=N): each worker runs kube-router's firewall, so
    # NetworkPolicy is enforced; empty: the bridge CNI plugin alone, which enforces none.
    kube_router: str = ""

    @property
    def me(self) -> Worker | None:
        """This guest's worker (None outside a worker guest)."""
        if self.role != "worker" or not self.workers:
            return None
        found = [w for w in workers.workers(self.workers) if w.name == self.worker]
        return found[0] if found else None

    @property
    def shipped(self) -> bool:
        """True when the plugin is the image (kustomize or helm)."""
        return self.plugin != "process"

    @property
    def path(self) -> Path:
        return Path(self.work)


def missing_requirements(bin_dir: Path | None, vm: bool, is_root: bool) -> list[str]:
    """What this machine lacks for a run, one line each; empty when nothing is missing."""
    lines = []
    if bin_dir is None:
        lines.append(
            "KUBE_BIN_DIR is not set: a folder with " + ", ".join(KUBE_BINARIES) + " (the "
            "kubernetes-server release tarball's server/bin and an etcd release)"
        )
    else:
        for name in KUBE_BINARIES:
            if not os.access(bin_dir / name, os.X_OK):
                lines.append(f"{bin_dir / name}: no such executable (KUBE_BIN_DIR={bin_dir})")
        if os.access(bin_dir / "kubelet", os.X_OK):
            try:
                problem = render.version_problem(kube_version(bin_dir))
            except (ValueError, OSError, subprocess.SubprocessError) as exc:
                problem = f"{bin_dir / 'kubelet'} --version: {exc}"
            if problem is not None:
                lines.append(problem)
    tools = dict(HOST_TOOLS, **(VM_TOOLS if vm else {}))
    for program, package in tools.items():
        if shutil.which(program) is None:
            lines.append(f"{program}: not on PATH (Debian package {package})")
    if not BUSYBOX.is_file() or b"statically linked" not in _file_kind(BUSYBOX):
        lines.append(f"{BUSYBOX}: not a static busybox (Debian package busybox-static)")
    if not is_root:
        lines.append("root: the cluster needs root (namespaces, cgroups, containerd)")
    return lines


def network_policy_missing(kube_router: Path) -> list[str]:
    """What KUBE_ROUTER= needs and this machine lacks, one line each: the binary, and
    the programs it runs in the guests (which run this machine's root)."""
    lines = []
    if not os.access(kube_router, os.X_OK) or kube_router.is_dir():
        lines.append(f"{kube_router}: no such executable (KUBE_ROUTER=)")
    for program, package in workers.NETWORK_POLICY_TOOLS.items():
        if shutil.which(program) is None:
            lines.append(f"{program}: not on PATH (Debian package {package}; KUBE_ROUTER= "
                         "runs it in the workers)")  # fmt: skip
    return lines


def kube_version(bin_dir: Path) -> tuple[int, int, int]:
    """The version ``kubelet --version`` reports. Raises ValueError, OSError."""
    text = subprocess.run(
        [str(bin_dir / "kubelet"), "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    return render.parse_kube_version(text)


def host_cgroup_v1(mounts: str | None = None) -> bool:
    """True when ``/sys/fs/cgroup`` is not the unified cgroup v2 hierarchy (``mounts``:
    the text of /proc/mounts)."""
    text = Path("/proc/mounts").read_text() if mounts is None else mounts
    return not any(
        fields[1:3] == ["/sys/fs/cgroup", "cgroup2"]
        for fields in (line.split() for line in text.splitlines())
    )


def _file_kind(path: Path) -> bytes:
    """``b'statically linked'`` for an ELF without a program interpreter (PT_INTERP)."""
    data = path.read_bytes()[:4096]
    if data[:4] != b"\x7fELF":
        return b"not ELF"
    return (
        b"dynamically linked"
        if b"/lib64/ld-linux" in data or b"/lib/ld-" in data
        else (b"statically linked")
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def log(message: str) -> None:
    print(f"[test-e2e-local] {message}", file=sys.stderr, flush=True)


def vm_wanted(value: str) -> bool:
    """``NUMA_VM``: empty, 0, false or no → on this machine; 1, true or yes → in the guest.
    Raises ValueError for anything else."""
    lowered = value.strip().lower()
    if lowered in ("", "0", "false", "no"):
        return False
    if lowered in ("1", "true", "yes"):
        return True
    raise ValueError(f"NUMA_VM={value!r}: use 1 (in a qemu guest) or 0 (on this machine)")


def workers_wanted(value: str) -> int:
    """``WORKERS``: empty or 0 → the one-node harness; N → a control plane here and N
    worker guests. Raises ValueError for anything but a whole number."""
    text = value.strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"WORKERS={value!r}: use a number of worker guests (2), or 0")
    return int(text)
