#!/usr/bin/env python3
"""A one-node Kubernetes cluster from real binaries, on this machine or in a qemu guest with
a real multi-NUMA kernel, running ``tests/e2e`` against the plugin run from this checkout.

``make test-e2e-local KUBE_BIN_DIR=DIR [NUMA_VM=1]`` calls ``cluster.py run``:

- **host** (default): etcd, kube-apiserver, kube-scheduler, containerd and the kubelet
  (static CPU manager, reserved CPU 0, ``single-numa-node``) and the plugin run in a
  private mount and PID namespace (``unshare``) with every file under one work folder.
  When the run ends, whatever way, the namespace's processes and mounts end with it, and
  :mod:`hoststate` puts back the cgroups, kernel tunables and folders, then compares the
  host with its state before the run.
- **guest** (``--vm``): the same, inside qemu booting Debian's stock kernel (downloaded
  with ``apt-get download``, extracted, never installed) with two NUMA nodes of CPUs,
  one memory-only node and SLIT distances; the host's ``/`` is the guest's root,
  read-only under a tmpfs overlay. The guest's output and pytest's report come back
  over a serial port and a writable 9p share.

Exit status: pytest's; 2 when something the run needs is missing (named); 1 when the
cluster did not come up or the host was not left as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import hoststate
import netstate
import render
import shipped
import workers
from workers import Worker

REPO = Path(__file__).resolve().parents[2]
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


# --- the processes -------------------------------------------------------------------------


@dataclass
class Process:
    """A cluster process as the fixtures see it: its command line, log and pid file."""

    name: str
    argv: list[str]
    log: str
    pidfile: str


class Processes:
    """Starts cluster processes in their own sessions, logs to files, pid files beside."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self.described: dict[str, Process] = {}

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        entry = Process(name, list(argv), str(logs / f"{name}.log"), str(logs / f"{name}.pid"))
        with open(entry.log, "ab") as out:
            child = subprocess.Popen(
                entry.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        Path(entry.pidfile).write_text(f"{child.pid}\n")
        self.started[name] = child
        self.described[name] = entry

    def alive(self, name: str) -> bool:
        return self.started[name].poll() is None

    def tail(self, name: str, lines: int = 30) -> str:
        text = Path(self.described[name].log).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def wait_for(what: str, check: object, timeout: float, processes: Processes, name: str) -> None:
    """Call ``check()`` until truthy; raise RuntimeError with the process's log tail when
    ``timeout`` seconds pass or the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes.alive(name):
            raise RuntimeError(f"{name} exited while waiting for {what}:\n{processes.tail(name)}")
        with contextlib.suppress(Exception):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"timed out after {timeout:.0f} s waiting for {what}:\n{processes.tail(name)}"
    )


def http_get(url: str, token: str = "", timeout: float = 3.0, accept: str = "") -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} | ({"Accept": accept} if accept else {})
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            return int(answer.status), answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def untaint(node_url: str, token: str) -> bool:
    """Remove every taint from the node (a JSON merge patch); True once none is left."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(
        node_url, method="PATCH", data=json.dumps({"spec": {"taints": None}}).encode(),
        headers={"Authorization": f"Bearer {token}",
                 "Content-Type": "application/merge-patch+json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5, context=context) as answer:
        return not json.loads(answer.read()).get("spec", {}).get("taints")


class Cluster:
    """The one-node cluster inside the namespace or guest: :meth:`up` starts it in
    dependency order and waits for each piece, :meth:`down` stops it."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.work = spec.path
        self.bins = Path(spec.bin_dir)
        self.processes = Processes(self.work)
        self.token = spec.token or secrets.token_hex(16)
        self.ports = {
            name: free_port()
            for name in ("etcd", "etcd_peer", "apiserver", "kubelet", "metrics", "health")
        }

    @functools.cached_property
    def version(self) -> tuple[int, int, int]:
        """The binaries' Kubernetes version (``kubelet --version``)."""
        return kube_version(self.bins)

    def bind_fixed_paths(self) -> None:
        """Bind a work-folder copy over each fixed path (the mount namespace is private)."""
        for target in hoststate.FIXED_PATHS:
            source = self.work / "fixed" / target.name
            source.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(source), str(target)], check=True)

    @property
    def api_base(self) -> str:
        """The API server's URL as this process reaches it (a worker: over the bridge)."""
        if self.spec.role == "worker":
            return self.spec.apiserver
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def up(self) -> None:
        if self.spec.role == "control-plane":
            self.control_plane_network()
        elif self.spec.role == "worker":
            self.worker_network()
            self.mount_data_disks()
            self.bind_fixed_paths()
        else:
            if self.spec.shipped:
                self.private_network()
            self.bind_fixed_paths()
        started = time.monotonic()
        for step in self.steps():
            step()
            log(f"{step.__name__[1:]} ready at {time.monotonic() - started:.0f} s")

    def steps(self) -> list[Callable[[], None]]:
        """What :meth:`up` starts, in order, for this process's role."""
        return {
            "control-plane": [self._etcd, self._apiserver, self._controller_manager,
                              self._scheduler, self._registry],
            "worker": [self._containerd, self._kubelet]
            + ([self._network_policy] if self.spec.kube_router else []),
        }.get(self.spec.role) or (
            [self._etcd, self._apiserver, self._controller_manager, self._scheduler,
             self._registry, self._containerd, self._kubelet, self._install]
            if self.spec.shipped
            else [self._etcd, self._apiserver, self._scheduler, self._containerd,
                  self._kubelet, self._plugin]
        )  # fmt: skip

    def _etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        self.processes.start("etcd", [
            str(self.bins / "etcd"), "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn",
        ])  # fmt: skip
        wait_for("etcd", lambda: http_get(f"{client}/health")[0] == 200, 60, self.processes, "etcd")

    def _apiserver(self) -> None:
        pki = self.work / "pki"
        pki.mkdir(exist_ok=True)
        key = pki / "service-account.key"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True,
                       capture_output=True)  # fmt: skip
        (pki / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        port = self.ports["apiserver"]
        self.processes.start("kube-apiserver", [
            str(self.bins / "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{self.ports['etcd']}",
            *self.apiserver_network(),
            "--secure-port", str(port),
            "--cert-dir", str(pki), "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(key),
            "--service-account-signing-key-file", str(key),
            "--service-cluster-ip-range", shipped.SERVICE_RANGE,
            # RBAC: every component holds the admin token (system:masters, above any
            # rule); the per-node configuration test proves the chart's ClusterRole.
            "--authorization-mode", "RBAC", "--allow-privileged=true",
            "--profiling=false",
        ])  # fmt: skip
        url = f"https://127.0.0.1:{port}/readyz"
        wait_for("the API server's /readyz", lambda: http_get(url, self.token)[0] == 200,
                 120 * self.spec.time_scale, self.processes, "kube-apiserver")  # fmt: skip
        (self.work / "kubeconfig").write_text(
            json.dumps(render.kubeconfig(f"https://127.0.0.1:{port}", self.token))
        )

    def apiserver_network(self) -> list[str]:
        """Process mode: loopback only, and no ServiceAccount admission (without a
        controller manager there is no ``default`` ServiceAccount; test pods set
        automountServiceAccountToken: false). Image modes: every address of the private
        namespace, advertised on the bridge (pods reach it through the ``kubernetes``
        Service), the kubelet reached by the node's address, ServiceAccount admission on
        (the chart's per-node mode mounts a token)."""
        if not self.spec.shipped:
            return ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                    "--disable-admission-plugins", "ServiceAccount"]  # fmt: skip
        advertised = (
            workers.CONTROL_PLANE_IP if self.spec.role == "control-plane" else shipped.NODE_IP
        )
        return ["--bind-address", "0.0.0.0", "--advertise-address", advertised,
                "--kubelet-preferred-address-types", "InternalIP"]  # fmt: skip

    def control_plane_network(self) -> None:
        """WORKERS=N, on the host in the namespace: overlays on /etc and /var/lib, the
        namespace's /etc/hosts, the bridge with the control plane's address and a tap
        device per worker (:func:`workers.host_network_commands`)."""
        found = workers.workers(self.spec.workers)
        shipped.private_overlays(self.work)
        Path("/etc/hosts").write_text(workers.etc_hosts(found))
        for command in workers.host_network_commands(found):
            subprocess.run(command, check=True, capture_output=True)

    def worker_network(self) -> None:
        """WORKERS=N, in a worker guest: the kernel's modules (the NIC's driver, bridge,
        veth, nat), /etc/hosts, the NIC found by its MAC, the pod bridge, routes and the
        Service's DNAT (:func:`workers.guest_network_commands`), and the kubeconfig that
        joins the control plane."""
        me = self.spec.me
        assert me is not None, f"no worker named {self.spec.worker!r}"
        found = workers.workers(self.spec.workers)
        self.load_guest_modules("virtio_net", "ext4")  # ext4: the data disks' filesystem
        Path("/etc/hosts").write_text(workers.etc_hosts(found))
        interface = workers.interface_by_mac(
            {p.name: (p / "address").read_text() for p in Path("/sys/class/net").iterdir()},
            me.mac,
        )
        port = int(self.spec.apiserver.rpartition(":")[2])
        for command in workers.guest_network_commands(me, found, interface, port):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
        (self.work / "kubeconfig").write_text(
            json.dumps(render.kubeconfig(self.spec.apiserver, self.token))
        )

    def mount_data_disks(self) -> None:
        """In a worker guest: an ext4 filesystem on each slot's data disk (found by its
        serial in ``/sys/class/block/*/serial``), mounted at ``/mnt/disks/<slot>`` in the
        guest's one mount table (the kubelet's and PID 1's), so ``path:`` selectors see
        it (ext4's module loaded by :meth:`worker_network`). Raises RuntimeError naming
        a disk that is missing or will not mount."""
        me = self.spec.me
        assert me is not None
        serials = {
            (block / "serial").read_text().strip(): block.name
            for block in Path("/sys/class/block").iterdir() if (block / "serial").is_file()
        }  # fmt: skip
        for slot, serial in (("a", render.DATA_DISK_SERIAL), ("b", render.SECOND_DISK_SERIAL)):
            serial = serial.format(me.letter.upper())
            if serial not in serials:
                raise RuntimeError(f"no disk with serial {serial} (found {sorted(serials)})")
            folder = Path(render.DISKS_FOLDER) / slot
            folder.mkdir(parents=True, exist_ok=True)
            for command in (["mkfs.ext4", "-F", "-q", "-L", f"slot-{slot}",
                             f"/dev/{serials[serial]}"],
                            ["mount", f"/dev/{serials[serial]}", str(folder)]):  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
            log(f"{serial} ({serials[serial]}) mounted at {folder}")

    def load_guest_modules(self, *more: str) -> None:
        """In a guest: bind its kernel's modules at /lib/modules/<release> and load the
        pod network's (and ``more``)."""
        modules = Path("/lib/modules") / os.uname().release
        modules.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", self.spec.guest_modules, str(modules)], check=True)
        for name in (*more, "bridge", "veth", "nf_tables", "nft_chain_nat", "nft_compat",
                     "xt_nat", "xt_tcpudp"):  # fmt: skip
            subprocess.run(["modprobe", name], check=False, capture_output=True)

    def private_network(self) -> None:
        """Image modes: overlays on /etc and /var/lib (on the host: the CNI plugins and
        the registry write there), the namespace's /etc/hosts, the bridge with the node's
        address, and in the guest the kernel's own modules (bridge, veth, nat)."""
        if self.spec.disposable_kernel:
            self.load_guest_modules()
        else:
            shipped.private_overlays(self.work)
        Path("/etc/hosts").write_text(shipped.etc_hosts(self.spec.node))
        for command in shipped.network_commands(self.ports["apiserver"]):
            subprocess.run(command, check=True, capture_output=True)

    def _controller_manager(self) -> None:
        pki = self.work / "pki"
        self.processes.start("kube-controller-manager", [
            str(self.bins / "kube-controller-manager"),
            "--kubeconfig", str(self.work / "kubeconfig"), "--leader-elect=false",
            "--secure-port=0", "--use-service-account-credentials=false",
            "--service-account-private-key-file", str(pki / "service-account.key"),
            "--root-ca-file", str(pki / "apiserver.crt"),
            # Else it creates /usr/libexec/kubernetes on the host.
            "--flex-volume-plugin-dir", str(self.work / "flexvolume"),
            # Scaled: a worker guest under TCG posts its status late when the host is busy.
            "--node-monitor-grace-period", f"{int(40 * max(1.0, self.spec.time_scale / 2))}s",
            "--v", "1",
        ])  # fmt: skip

    def _registry(self) -> None:
        # Recorded with the cluster's processes: down() stops it, the reaper spares it.
        self.processes.started["docker-registry"] = shipped.start_registry(
            self.work, Path(self.spec.registry_storage),
            f"0.0.0.0:{workers.REGISTRY_PORT}" if self.spec.role else "127.0.0.1:5000",
        )  # fmt: skip

    def _install(self) -> None:
        """The README's install command for the mode, then the plugin's pod Ready through
        its own probes."""
        readme = (REPO / "README.md").read_text()
        if self.spec.release_info is not None:
            command = shipped.release_install_command(readme, self.spec.release_info)
        else:
            command = shipped.readme_command(readme, self.spec.plugin)
        command = shipped.scaled_probes(command, self.spec.time_scale)
        # helm and kubectl validate against the API server's OpenAPI document, which they
        # download as protobuf: wait for it (a 503 there failed the install with "failed to
        # download openapi"; an API server that cannot make it, as one built with Go 1.27
        # ("Error in OpenAPI handler: $root has invalid property: Extensions"), times out
        # here with its log's tail instead).
        openapi = f"https://127.0.0.1:{self.ports['apiserver']}/openapi/v2"
        protobuf = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
        wait_for("the API server's /openapi/v2 (protobuf)", lambda: http_get(
                 openapi, self.token, timeout=30, accept=protobuf)[0] == 200,
                 60 * self.spec.time_scale, self.processes, "kube-apiserver")  # fmt: skip
        log(f"installing: {command}")
        env = dict(os.environ, KUBECONFIG=str(self.work / "kubeconfig"),
                   PATH=f"{Path(self.spec.helm).parent}:{os.environ['PATH']}")  # fmt: skip
        subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO, env=env, check=True,
                       timeout=120 * self.spec.time_scale)  # fmt: skip
        url = (f"https://127.0.0.1:{self.ports['apiserver']}/api/v1/namespaces/kube-system/"
               "pods?labelSelector=app.kubernetes.io%2Fname%3Dnuma-device-plugin")  # fmt: skip

        nodes = max(1, self.spec.workers)

        def ready() -> bool:
            pods = json.loads(http_get(url, self.token)[1])["items"]
            return len(ready_nodes(pods)) >= nodes

        wait_for(f"the plugin's pod to be Ready on {nodes} node(s)", ready,
                 180 * self.spec.time_scale, self.processes,
                 "kube-apiserver" if self.spec.role else "kubelet")  # fmt: skip

    def _scheduler(self) -> None:
        self.processes.start("kube-scheduler", [
            str(self.bins / "kube-scheduler"), "--kubeconfig", str(self.work / "kubeconfig"),
            "--leader-elect=false", "--secure-port=0", "--v", "2",
        ])  # fmt: skip

    def _containerd(self) -> None:
        config = self.work / "containerd" / "config.toml"
        config.parent.mkdir(exist_ok=True)
        if self.spec.shipped:
            certs = self.work / "containerd" / "certs.d" / shipped.REGISTRY
            certs.mkdir(parents=True, exist_ok=True)
            (certs / "hosts.toml").write_text(shipped.hosts_toml(shipped.REGISTRY))
            networks = self.work / "cni" / "net.d"
            networks.mkdir(parents=True, exist_ok=True)
            me = self.spec.me
            network = shipped.cni_network() if me is None else workers.cni_network(me)
            (networks / "10-numa-e2e.conflist").write_text(json.dumps(network))
            config.write_text(render.containerd_config(
                self.work, cni_bin_dir=shipped.CNI_BIN_DIR,
                registry_config=self.work / "containerd" / "certs.d",
            ))  # fmt: skip
        else:
            config.write_text(render.containerd_config(self.work))
        sock = self.work / "containerd" / "containerd.sock"
        self.processes.start("containerd", ["containerd", "--config", str(config)])
        ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
        wait_for("containerd", lambda: subprocess.run([*ctr, "version"], capture_output=True,
                 timeout=10).returncode == 0, 60 * self.spec.time_scale, self.processes,
                 "containerd")  # fmt: skip
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()  # fmt: skip
        archive = self.work / "images.tar"
        archive.write_bytes(render.oci_archive(
            render.busybox_layer(BUSYBOX.read_bytes(), applets),
            [(render.BUSYBOX_IMAGE, ["sh"]), (render.PAUSE_IMAGE, ["sleep", "2147483647"])],
        ))  # fmt: skip
        subprocess.run([*ctr, "images", "import", "--no-unpack", str(archive)], check=True,
                       capture_output=True, timeout=120 * self.spec.time_scale)  # fmt: skip

    @property
    def node_ip(self) -> str:
        """Process mode: loopback; image modes: the bridge's address in the namespace;
        a worker guest: its address on the control plane's bridge."""
        me = self.spec.me
        if me is not None:
            return me.ip
        return shipped.NODE_IP if self.spec.shipped else "127.0.0.1"

    def kubelet_settings(self, cpu_manager: str = "static") -> render.KubeletSettings:
        return render.KubeletSettings(
            address="0.0.0.0" if self.spec.shipped else "127.0.0.1",
            fail_cgroup_v1=render.fail_cgroup_v1(self.version, host_cgroup_v1()),
            node_name=self.spec.node,
            port=self.ports["kubelet"],
            runtime_socket=self.work / "containerd" / "containerd.sock",
            reserved_cpus=self.spec.reserved_cpus,
            cpu_manager=cpu_manager,
            memory_manager=self.spec.memory_manager,
            # Static: the reserved memory must add up to the eviction threshold (no kube or
            # system memory is reserved); all of it on NUMA node 0.
            reserved_memory=((0, EVICTION_MEMORY_BYTES),)
            if self.spec.memory_manager == "Static"
            else (),
        )

    def _kubelet(self) -> None:
        config = self.work / "kubelet.json"
        config.write_text(json.dumps(render.kubelet_config(self.kubelet_settings()), indent=1))
        self.processes.start("kubelet", [
            str(self.bins / "kubelet"), "--config", str(config),
            "--kubeconfig", str(self.work / "kubeconfig"),
            "--hostname-override", self.spec.node, "--node-ip", self.node_ip, "--v", "2",
        ])  # fmt: skip
        url = f"{self.api_base}/api/v1/nodes/{self.spec.node}"
        wait_for("the node to register", lambda: http_get(url, self.token)[0] == 200,
                 120 * self.spec.time_scale, self.processes, "kubelet")  # fmt: skip
        # The kubelet registers the node with the not-ready taint, which the node lifecycle
        # controller (in the controller manager, which does not run here) would remove.
        wait_for("the not-ready taint to go", lambda: untaint(url, self.token),
                 60 * self.spec.time_scale, self.processes, "kubelet")  # fmt: skip

    def _network_policy(self) -> None:
        """KUBE_ROUTER=: kube-router's firewall in this worker once its node joined (it
        reads its Node for the address), with its kernel modules loaded; ready when its
        /healthz answers 200."""
        me = self.spec.me
        assert me is not None
        for name in workers.NETWORK_POLICY_MODULES:
            subprocess.run(["modprobe", name], check=False, capture_output=True)
        self.processes.start("kube-router", workers.network_policy_argv(
            self.spec.kube_router, str(self.work / "kubeconfig"), me))  # fmt: skip
        url = f"http://127.0.0.1:{workers.NETWORK_POLICY_HEALTH_PORT}/healthz"
        wait_for("kube-router's /healthz", lambda: http_get(url)[0] == 200,
                 120 * self.spec.time_scale, self.processes, "kube-router")  # fmt: skip

    def plugin_argv(self, capacity: str = "100") -> list[str]:
        return [
            self.spec.python, "-m", "numa_device_plugin", "serve",
            "--socket-dir", "/var/lib/kubelet/device-plugins",
            "--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
            "--metrics-address", f"127.0.0.1:{self.ports['metrics']}",
            "--health-address", f"127.0.0.1:{self.ports['health']}",
            "--capacity", capacity,
            *(["--reserved-cpus", self.spec.reserved_cpus] if capacity == "cpus" else []),
        ]  # fmt: skip

    def _plugin(self) -> None:
        self.processes.start(
            "plugin", self.plugin_argv(), env=dict(os.environ, PYTHONPATH=str(REPO))
        )
        url = f"http://127.0.0.1:{self.ports['health']}/readyz"
        wait_for("the plugin's /readyz", lambda: http_get(url)[0] == 200,
                 60 * self.spec.time_scale, self.processes, "plugin")  # fmt: skip

    def released(self) -> dict[str, str] | None:
        """RELEASE=1: the release's version and digests; else None."""
        return self.spec.release_info if self.spec.release else None

    def description(self) -> dict[str, object]:
        """What the e2e fixtures read (``NUMA_E2E_LOCAL``)."""
        return {
            "node": self.spec.node,
            "kubeconfig": str(self.work / "kubeconfig"),
            "time_scale": self.spec.time_scale,
            "reserved_cpus": self.spec.reserved_cpus,
            "memory_manager": self.spec.memory_manager,
            # The kubelet's reservedMemory in its --reserved-memory syntax, for the plugin.
            "reserved_memory": f"0:memory={EVICTION_MEMORY_BYTES // 2**20}Mi"
            if self.spec.memory_manager == "Static"
            else "",
            "disposable_kernel": self.spec.disposable_kernel,
            "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
            "pod_logs": "/var/log/pods",
            "metrics": f"127.0.0.1:{self.ports['metrics']}",
            "health": f"127.0.0.1:{self.ports['health']}",
            "kubelet_config": str(self.work / "kubelet.json"),
            "kubelet_root": "/var/lib/kubelet",
            # The tests compare behaviour that differs by version (pod resources List).
            "kubernetes_version": ".".join(map(str, self.version)),
            # process, kustomize or helm (the image from the registry, installed as
            # the README says), with what the image modes' platform needs.
            "plugin": self.spec.plugin,
            "helm": self.spec.helm,
            # RELEASE=1: what the release made ({version, digest, chart_digest}).
            "release": self.released(),
            # The bridge CNI plugin enforces no NetworkPolicy; kube-router's firewall does.
            "network_policy": bool(self.spec.kube_router),
            "registry": shipped.REGISTRY,
            "node_ip": self.node_ip,
            "processes": {k: asdict(v) for k, v in self.processes.described.items()},
            # WORKERS=N: every worker of the cluster (this guest's is the one named "node").
            "workers": [w.public() for w in workers.workers(self.spec.workers)]
            if self.spec.workers
            else [],
        }

    def run_tests(self) -> int:
        described = self.work / "local.json"
        described.write_text(json.dumps(self.description(), indent=1))
        env = dict(
            os.environ,
            KUBECONFIG=str(self.work / "kubeconfig"),
            NUMA_E2E_LOCAL=str(described),
            PYTHONPATH=str(REPO),
            PYTHONUNBUFFERED="1",
        )
        if self.spec.helm:
            # The helm the run found on the host (on PATH there, maybe not in this
            # checkout's .venv): the chart tests use it too.
            env["PATH"] = f"{Path(self.spec.helm).parent}{os.pathsep}{env.get('PATH', '')}"
        report = Path(self.spec.results or self.work) / "junit.xml"
        # One line per test as it ends, in the share that comes back to the host.
        env["NUMA_E2E_PROGRESS"] = str(Path(self.spec.results or self.work) / PROGRESS_FILE)
        argv = [
            self.spec.python, "-m", "pytest", "-m", "e2e", "-p", "no:cacheprovider", "-rA", "-v",
            f"--junitxml={report}", "--timeout", str(int(900 * self.spec.time_scale)),
            "tests/e2e", *self.spec.pytest_args,
        ]  # fmt: skip
        log("running " + " ".join(argv[1:]))
        # Registered with the processes, so the orphan reaper never takes its exit status.
        tests = subprocess.Popen(argv, cwd=REPO, env=env)
        self.processes.started["pytest"] = tests
        return tests.wait()

    def down(self, grace: float = 10.0) -> None:
        """Stop the plugin and the kubelet, then the rest, each by its pid file (the tests
        may have restarted them): SIGTERM, up to ``grace`` seconds, then SIGKILL; one at a
        time, so the plugin never outlives the kubelet's socket folder nor the kubelet its
        runtime. The namespace's end takes whatever is left (containers, shims)."""
        for name in (
            "plugin", "kube-router", "kubelet", "kube-scheduler", "kube-controller-manager",
            "containerd", "kube-apiserver", "etcd",
        ):  # fmt: skip
            entry = self.processes.described.get(name)
            if entry is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                stop(int(Path(entry.pidfile).read_text()), self.processes.started[name], grace)
        registry = self.processes.started.get("docker-registry")
        if registry is not None:
            stop(registry.pid, registry, grace)


def ready_nodes(pods: list[dict[str, Any]]) -> set[str]:
    """The nodes where one of ``pods`` (the API server's JSON) is Ready."""
    found = set()
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            found.add(str((pod.get("spec") or {}).get("nodeName", "")))
    return found


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def stop(pid: int, child: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM ``pid``, wait up to ``grace`` seconds, then SIGKILL; ``child`` is reaped when
    it is that process."""
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if (child.pid == pid and child.poll() is not None) or not running(pid):
                return
            time.sleep(0.05)


def reap_orphans(own: dict[str, subprocess.Popen[bytes]], stop: threading.Event) -> None:
    """As PID 1 of the namespace, reap the orphans that re-parent to us (containerd's
    shims, processes the tests started), never a child in ``own``, whose exit status the
    harness reads (a stolen one would read as 0)."""
    me = os.getpid()
    while not stop.wait(0.5):
        keep = {p.pid for p in own.values()}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in keep:
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry.name), os.WNOHANG)


def inside(spec: Spec) -> int:
    """The cluster's side: up, tests, down. Returns pytest's status (1 if it never ran)."""
    cluster = Cluster(spec)
    stop = threading.Event()
    reaper = threading.Thread(
        target=reap_orphans, args=(cluster.processes.started, stop), daemon=True
    )
    if os.getpid() == 1 or spec.disposable_kernel:
        reaper.start()
    signal.signal(signal.SIGTERM, interrupt)
    try:
        started = time.monotonic()
        cluster.up()
        log(f"cluster up in {time.monotonic() - started:.0f} s; node {spec.node}")
        if spec.role == "worker":
            return worker_duty(cluster)
        return cluster.run_tests()
    except RuntimeError as error:
        log(f"the cluster did not come up: {error}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        cluster.down()
        if spec.role == "worker":
            keep_logs(cluster.work / "logs", Path(spec.results) / "logs")
        stop.set()
        if os.getpid() == 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)


def worker_duty(cluster: Cluster) -> int:
    """In a worker guest, once its node joined: say so (``up``), then run the tests when
    the control plane says ``go`` (the tests' worker), or wait for ``stop`` (the
    others). Returns pytest's status, 0 for a worker without tests, 1 when stopped
    before ``go``."""
    spec = cluster.spec
    results = Path(spec.results)
    (results / "up").write_text(f"{spec.node}\n")
    me = spec.me
    assert me is not None
    wanted = results / ("go" if me.tests else "stop")
    while not wanted.exists():
        if (results / "stop").exists():
            log("stopped before the tests could start")
            return 1
        time.sleep(1)
    return cluster.run_tests() if me.tests else 0


def keep_logs(logs: Path, results: Path) -> None:
    """Copy a guest's process logs into its results share (they come back to the host)."""
    with contextlib.suppress(OSError):
        shutil.copytree(logs, results, dirs_exist_ok=True)


class Guests:
    """The control plane's side of the worker guests (WORKERS=N): boots each (its qemu
    argv and spec made on the host, :func:`run_workers`), tells them ``go`` and
    ``stop`` through their results shares, and waits for them."""

    def __init__(self, spec: Spec, cluster: Cluster) -> None:
        self.spec = spec
        self.cluster = cluster
        plan = json.loads((spec.path / "guests.json").read_text())
        self.plan: list[dict[str, Any]] = plan["guests"]
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def results(self, entry: dict[str, Any]) -> Path:
        return Path(str(entry["results"]))

    def boot(self) -> None:
        """Fill in the API server and token, then start every guest's qemu (recorded with
        the cluster's processes, so the reaper spares them). The tests' worker writes to
        our stdout, the others to ``output.log`` in their results folder."""
        for entry in self.plan:
            guest_spec = dict(entry["spec"])
            port = self.cluster.ports["apiserver"]
            guest_spec.update(apiserver=f"https://{workers.CONTROL_PLANE_IP}:{port}",
                              token=self.cluster.token)  # fmt: skip
            results = self.results(entry)
            (results / "spec.json").write_text(json.dumps(guest_spec))
            out = None if entry["tests"] else open(results / "output.log", "ab")  # noqa: SIM115
            child = subprocess.Popen(
                [str(a) for a in entry["argv"]],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT if out else None,
            )  # fmt: skip
            name = f"guest {entry['name']}"
            self.running[name] = child
            self.cluster.processes.started[name] = child
            log(f"booted {name} (qemu pid {child.pid})")

    def check_alive(self) -> None:
        """Raise RuntimeError naming a guest that already powered off."""
        for name, child in self.running.items():
            if child.poll() is not None:
                raise RuntimeError(f"{name} powered off early (status {child.returncode}); "
                                   f"see its results folder")  # fmt: skip

    def wait_nodes(self, timeout: float) -> None:
        """Every worker's node registered with the API server."""
        deadline = time.monotonic() + timeout
        for entry in self.plan:
            url = f"{self.cluster.api_base}/api/v1/nodes/{entry['name']}"
            while http_get(url, self.cluster.token)[0] != 200:
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for node "
                                       f"{entry['name']} to register")  # fmt: skip
                time.sleep(2)
            log(f"node {entry['name']} joined")

    def go(self) -> None:
        for entry in self.plan:
            if entry["tests"]:
                (self.results(entry) / "go").write_text("go\n")

    def wait_tests(self, timeout: float) -> int:
        """Wait until the tests' worker powers off; pytest's status from its share (1
        when it wrote none or overran ``timeout`` seconds)."""
        (entry,) = [e for e in self.plan if e["tests"]]
        child = self.running[f"guest {entry['name']}"]
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"the tests' worker did not finish in {timeout:.0f} s")
            return 1
        exit_file = self.results(entry) / "exit-code"
        if not exit_file.is_file():
            log("the tests' worker wrote no exit status")
            return 1
        return int(exit_file.read_text().strip() or 1)

    def stop(self, grace: float) -> None:
        """``stop`` to every guest; each stops its kubelet and containerd, keeps its logs
        and powers off. One still running after ``grace`` seconds is killed."""
        for entry in self.plan:
            with contextlib.suppress(OSError):
                (self.results(entry) / "stop").write_text("stop\n")
        deadline = time.monotonic() + grace
        for name, child in self.running.items():
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{name} did not power off in {grace:.0f} s: killed")
                child.kill()
                child.wait()


# Seconds between two samples of the control plane's network (logs/network.jsonl).
NETWORK_SAMPLE_SECONDS = 20.0


def sample_network(cluster: Cluster, stop: threading.Event, every: float) -> None:
    """Until ``stop``: every ``every`` s, one JSON line in ``logs/network.jsonl`` of what
    the control plane's network namespace shows (:func:`netstate.snapshot`: the bridge's
    and each worker's tap device's counters, TCP failures, load, a TCP connect to the API
    server over the bridge) and how long the API server took to answer ``/readyz``. A
    guest's failed test records its side (the progress file's ``network``); the two
    together say whether packets were lost on the way or the API server did not
    answer."""
    path = cluster.work / "logs" / "network.jsonl"
    port = int(cluster.ports["apiserver"])
    while not stop.wait(every):
        sample = netstate.snapshot((workers.CONTROL_PLANE_IP, port))
        started = time.monotonic()
        status: int | str
        try:
            status = http_get(f"{cluster.api_base}/readyz", cluster.token, timeout=10)[0]
        except OSError as exc:
            status = f"{type(exc).__name__}: {exc}"
        sample["readyz"] = {"status": status, "seconds": round(time.monotonic() - started, 3)}
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(sample) + "\n")


def control_plane(spec: Spec) -> int:
    """WORKERS=N, PID 1 of the namespace on the host: the control plane and the registry
    up, the worker guests booted and joined, the plugin installed with the README's
    command and Ready on every worker, the tests run in the tests' worker; then, in
    :data:`workers.STOP_ORDER`, the guests off and the control plane down. Returns
    pytest's status (1 if it never ran)."""
    cluster = Cluster(spec)
    guests = Guests(spec, cluster)
    stop_reaper = threading.Event()
    reaper = threading.Thread(
        target=reap_orphans, args=(cluster.processes.started, stop_reaper), daemon=True
    )
    reaper.start()
    signal.signal(signal.SIGTERM, interrupt)
    scale = spec.time_scale
    grace = 120 * scale
    stop_sampler = threading.Event()
    try:
        started = time.monotonic()
        cluster.up()
        threading.Thread(target=sample_network, args=(cluster, stop_sampler,
                         NETWORK_SAMPLE_SECONDS), daemon=True).start()  # fmt: skip
        guests.boot()
        guests.wait_nodes(300 * scale)
        log(f"{len(guests.plan)} workers joined at {time.monotonic() - started:.0f} s")
        cluster._install()
        log(f"the plugin is Ready on every worker at {time.monotonic() - started:.0f} s")
        guests.go()
        return guests.wait_tests(1800 * scale)
    except RuntimeError as error:
        log(f"the cluster did not come up: {error}")
        return 1
    except KeyboardInterrupt:
        log("interrupted: the guests get 30 s to power off")
        grace = 30.0
        return 130
    finally:
        stop_sampler.set()
        guests.stop(grace)
        cluster.down()
        stop_reaper.set()
        if os.getpid() == 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)


# --- the host run --------------------------------------------------------------------------


def kill_with_parent() -> None:
    """In a child: die with SIGKILL when the harness dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@contextlib.contextmanager
def host_kept(work: Path) -> Iterator[list[str]]:
    """Snapshot the host, create the fixed paths' mount points, and on the way out put
    everything back and fill the yielded list with what still differs."""
    before = hoststate.snapshot(work=work)
    differs: list[str] = []
    try:
        yield differs
    finally:
        hoststate.restore(before)
        differs += hoststate.differences(before, hoststate.snapshot(work=work), work)


def run_host(spec: Spec) -> int:
    """Run :func:`inside` in a new mount and PID namespace; put the host back."""
    spec_file = spec.path / "spec.json"
    spec_file.write_text(json.dumps(asdict(spec)))
    with host_kept(spec.path) as differs:
        status = in_namespace(spec, "inside", str(spec_file), network=spec.shipped)
    return report(status, differs)


def in_namespace(spec: Spec, *command: str, network: bool) -> int:
    """``cluster.py COMMAND`` in a new mount and PID namespace (and network namespace
    when ``network``); its exit status."""
    argv = [
        "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
        *(["--net"] if network else []),
        "--kill-child", spec.python, str(Path(__file__).resolve()), *command,
    ]  # fmt: skip
    child = subprocess.Popen(argv, preexec_fn=kill_with_parent)
    try:
        return child.wait()
    except KeyboardInterrupt:
        # unshare --fork ignores SIGTERM itself: the namespace's first process gets it
        # (PID 1 there: every command of ours handles SIGTERM, the kernel would drop it
        # otherwise). 130 whatever it returns: no step after this one may run.
        children = Path(f"/proc/{child.pid}/task/{child.pid}/children")
        with contextlib.suppress(OSError, ValueError):
            for pid in children.read_text().split():
                os.kill(int(pid), signal.SIGTERM)
        child.wait()
        return 130


def prepare_image(spec: Spec) -> int:
    """Image modes, on the host before the cluster: ``make image`` (buildah, over the
    Python stand-in) in a private mount namespace, then ``make push`` into the registry's
    storage in a private network namespace too; the host is checked afterwards. Returns
    0, or the failing step's status."""
    shipped.python_standin(CACHE)
    with host_kept(spec.path) as differs:
        if spec.release:
            shipped.python_standin(CACHE, "arm64")
            status = in_namespace(spec, "release", spec.work, spec.helm, network=False)
        else:
            status = in_namespace(spec, "build", spec.work, network=False)
            if status == 0:
                status = in_namespace(spec, "push", spec.work, network=True)
    if status:
        log(f"the image was not built and pushed (status {status})")
    return report(status, differs)


# The tests' progress file (tests/e2e/conftest.py): in the results share of the guest
# that runs them, or the work folder without a guest.
PROGRESS_FILE = "progress.jsonl"


def print_progress(work: Path) -> None:
    """Print the summary of every progress file under ``work`` (render.progress_summary),
    on any exit of the run: a run cut short still says what passed and what failed."""
    for found in sorted(work.rglob(PROGRESS_FILE)) if work.is_dir() else []:
        try:
            text = found.read_text(errors="replace")
        except OSError as exc:
            log(f"cannot read {found}: {exc}")
            continue
        print(render.progress_summary(text), flush=True)


def report(status: int, differs: list[str]) -> int:
    if differs:
        log("the host is NOT as it was before the run:")
        for line in differs:
            log("  " + line)
        return status or 1
    log("the host is as it was: mounts, cgroups, cluster processes, sysctls and paths")
    return status


# --- the guest run -------------------------------------------------------------------------


def has_kvm() -> bool:
    """KVM only with hardware virtualisation: this workplace's /dev/kvm (PVM) boots only
    PVM-enabled kernels, so a stock kernel needs TCG there (REAL-CLUSTER.md)."""
    flags = Path("/proc/cpuinfo").read_text()
    return Path("/dev/kvm").exists() and re.search(r"\b(vmx|svm)\b", flags) is not None


def guest_kernel(cache: Path) -> tuple[Path, Path, str]:
    """Debian's stock kernel (the package ``linux-image-amd64`` depends on): downloaded
    once into ``cache`` with ``apt-get download`` and extracted with ``dpkg-deb -x``,
    never installed. Returns (vmlinuz, modules folder, version)."""
    depends = subprocess.run(
        ["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"Depends: (linux-image-(\d[^\s]*-amd64))", depends)
    if match is None:
        raise Missing("apt-cache depends linux-image-amd64 names no kernel (run apt-get update)")
    package, version = match[1], match[2]
    root = cache / package
    if not (root / "boot" / f"vmlinuz-{version}").is_file():
        download = cache / "download"
        download.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", package], cwd=download, check=True)
        (deb,) = download.glob(f"{package}_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        deb.unlink()
    modules = root / "lib" / "modules" / version
    if not (modules / "modules.dep").is_file():
        # The guest loads modules (bridge, veth, nat) with modprobe, which needs the index
        # that installing the package would have made.
        subprocess.run(["depmod", "-b", str(root), version], check=True)
    return root / "boot" / f"vmlinuz-{version}", modules, version


def initramfs(modules: Path, command: str) -> bytes:
    """The guest's initramfs: static busybox, the modules of :data:`render.GUEST_MODULES`
    and ``/init`` (:func:`render.guest_init_script`)."""
    found = {p.name.split(".ko")[0]: p for p in modules.rglob("*.ko*")}
    entries: list[tuple[str, int, bytes]] = [
        (folder, 0o040755, b"") for folder in ("bin", "dev", "proc", "sys", "modules")
    ]
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    for name in render.GUEST_MODULES:
        if name not in found:
            raise Missing(f"kernel module {name} is not in {modules}")
        data = found[name].read_bytes()
        if found[name].suffix == ".xz":
            import lzma

            data = lzma.decompress(data)
        entries.append((f"modules/{name}.ko", 0o100644, data))
    entries.append(("init", 0o100755, render.guest_init_script(command).encode()))
    return render.cpio_newc(entries)


def run_vm(spec: Spec, shape: render.GuestShape, timeout: float) -> int:
    """Boot the guest, stream its run's output, collect pytest's status from the results
    share. Returns it, or 1 if the guest gave none."""
    kernel, modules, version = guest_kernel(CACHE)
    results = spec.path / "results"
    results.mkdir()
    kvm = has_kvm()
    scale = 1.0 if kvm else 5.0
    guest_spec = Spec(
        **dict(
            asdict(spec),
            work="/tmp/ndp-e2e",
            results="/ndp-results",
            time_scale=scale * spec.time_scale,
            disposable_kernel=True,
            # The guest's kubelet runs the Memory Manager (exact NUMA memory is tested there).
            memory_manager="Static",
            guest_modules=str(modules),
        )
    )
    (results / "spec.json").write_text(json.dumps(asdict(guest_spec)))
    script = Path(__file__).resolve().parent / "guest-init.sh"
    # The guest's /tmp is its own tmpfs: what the run needs from the host's /tmp (the
    # binaries, the checkout, the venv) is bound back at the same paths.
    kept = render.kept_tmp_paths([
        Path(spec.bin_dir), REPO, Path(spec.python).parents[1],
        *([Path(spec.registry_storage)] if spec.shipped else []),
    ])  # fmt: skip
    command = " ".join(
        ["/bin/bash", str(script), spec.python, str(Path(__file__).resolve()), "/ndp-results",
         *kept]
    )  # fmt: skip
    initrd = spec.path / "initrd.cpio"
    initrd.write_bytes(initramfs(modules, command))
    argv = render.qemu_argv(
        qemu="qemu-system-x86_64", kvm=kvm, shape=shape, kernel=kernel, initrd=initrd,
        console_log=spec.path / "console.log", results=results,
        extra=render.pci_argv(data_disks(spec.path, 0, one_guest=True)),
    )  # fmt: skip
    log(
        f"booting Debian's kernel {version} under {'KVM' if kvm else 'TCG'}: "
        f"{shape.cpu_nodes} NUMA nodes of {shape.cpus_per_node} CPUs and a memory-only node"
    )
    with host_kept(spec.path) as differs:
        guest = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=kill_with_parent)
        try:
            guest.wait(timeout=timeout * scale)
        except subprocess.TimeoutExpired:
            log(f"the guest did not finish in {timeout * scale:.0f} s; console: "
                f"{spec.path / 'console.log'}")  # fmt: skip
            guest.kill()
            guest.wait()
        except KeyboardInterrupt:
            guest.kill()
            guest.wait()
    exit_file = results / "exit-code"
    if not exit_file.is_file():
        log(f"the guest wrote no exit status; its console: {spec.path / 'console.log'}")
        status = 1
    else:
        status = int(exit_file.read_text().strip() or 1)
    return report(status, differs)


def data_disks(work: Path, index: int, one_guest: bool = False) -> list[render.DataDisk]:
    """The data disks of guest ``index`` (0 = a), their images sparse files in ``work``
    made here. Slot ``a`` (serial ``DATA-DISK-<LETTER>``) is on NUMA node 1 for a, node 0
    for b and then alternating, so that one template asking for the disk's node lands on
    different NUMA nodes on different workers; slot ``b`` (``SLOT-B-<LETTER>``) on the
    other node; the disk the tests hot-plug (``HOTPLUG-<LETTER>``, unmounted) on node 1.
    ``one_guest`` (NUMA_VM=1): slot a's disk only."""
    letter = chr(ord("a") + index)
    node = 1 - index % 2
    wanted = [("data", render.DATA_DISK_SERIAL, node, "a")]
    if not one_guest:
        wanted += [("second", render.SECOND_DISK_SERIAL, 1 - node, "b"),
                   ("hotplug", render.HOTPLUG_SERIAL, 1, "")]  # fmt: skip
    disks = []
    for qemu_id, serial, on, slot in wanted:
        image = work / f"{qemu_id}-disk-{letter}.img"
        with image.open("wb") as file:
            file.truncate(render.DATA_DISK_BYTES)
        disks.append(render.DataDisk(image, on, serial.format(letter.upper()), qemu_id, slot))
    return disks


def tcg_scale(workers_count: int) -> float:
    """How much slower than KVM the guests run under TCG: 5 for one guest, half as much
    again for each further guest sharing the host's cores."""
    return 5.0 * (1 + 0.5 * max(0, workers_count - 1))


@dataclass(frozen=True)
class GuestBoot:
    """What every worker guest boots: the kernel, the initramfs, the kernel's modules
    folder, and whether KVM runs it (else TCG)."""

    kernel: Path
    initrd: Path
    modules: Path
    kvm: bool


def guest_plan(
    spec: Spec, worker: Worker, boot: GuestBoot, scale: float, cpus_per_node: int
) -> dict[str, Any]:
    """One worker's entry of ``guests.json``: its name, whether it runs the tests, its
    results folder (``<work>/results-<letter>``), its qemu command line (two NUMA nodes of
    ``cpus_per_node`` CPUs and 3 GiB, the memory-only node where the worker has one, its
    NIC) and the spec its guest runs (role ``worker``, the Memory Manager Static, every
    timeout times ``scale``); the control plane adds the API server and token."""
    results = spec.path / f"results-{worker.letter}"
    shape = render.GuestShape(
        cpus_per_node=cpus_per_node, memory_mib_per_cpu_node=3072,
        memory_only_mib=1024 if worker.memory_only_node else 0,
    )  # fmt: skip
    guest_spec = Spec(**dict(
        asdict(spec), work="/tmp/ndp-e2e", results="/ndp-results", time_scale=scale,
        disposable_kernel=True, memory_manager="Static", guest_modules=str(boot.modules),
        role="worker", worker=worker.name, node=worker.name, registry_storage="",
    ))  # fmt: skip
    argv = render.qemu_argv(
        qemu="qemu-system-x86_64", kvm=boot.kvm, shape=shape, kernel=boot.kernel,
        initrd=boot.initrd, console_log=results / "console.log", results=results,
        extra=[*render.pci_argv(data_disks(spec.path, worker.index), workers.qemu_nic(worker)),
               "-qmp", f"tcp:{workers.CONTROL_PLANE_IP}:{worker.qmp_port},server=on,wait=off"],
    )  # fmt: skip
    return {"name": worker.name, "tests": worker.tests, "results": str(results),
            "argv": argv, "spec": asdict(guest_spec)}  # fmt: skip


def run_workers(spec: Spec, cpus_per_node: int) -> int:
    """WORKERS=N on the host: the guests' kernel and initramfs, one results folder, spec
    and qemu command line per worker (``guests.json``), then the control plane
    (:func:`control_plane`) in a new mount, PID and network namespace; the host is
    checked afterwards. Returns pytest's status."""
    kernel, modules, version = guest_kernel(CACHE)
    kvm = has_kvm()
    scale = (1.0 if kvm else tcg_scale(spec.workers)) * spec.time_scale
    kept = render.kept_tmp_paths(
        [Path(spec.bin_dir), REPO, Path(spec.python).parents[1]]
        + ([Path(spec.kube_router).parent] if spec.kube_router else [])
    )
    script = Path(__file__).resolve().parent / "guest-init.sh"
    command = " ".join(
        ["/bin/bash", str(script), spec.python, str(Path(__file__).resolve()), "/ndp-results",
         *kept]
    )  # fmt: skip
    initrd = spec.path / "initrd.cpio"
    initrd.write_bytes(initramfs(modules, command))
    plan = []
    for worker in workers.workers(spec.workers):
        entry = guest_plan(spec, worker, GuestBoot(kernel, initrd, modules, kvm), scale,
                           cpus_per_node)  # fmt: skip
        Path(entry["results"]).mkdir()
        plan.append(entry)
        log(f"worker {worker.name}: 2 NUMA nodes of {cpus_per_node} CPUs"
            + (" and a memory-only node" if worker.memory_only_node else "")
            + f", {worker.ip}, pods {worker.pod_subnet}")  # fmt: skip
    (spec.path / "guests.json").write_text(json.dumps({"guests": plan}, indent=1))
    control = Spec(**dict(asdict(spec), role="control-plane", time_scale=scale))
    spec_file = spec.path / "spec.json"
    spec_file.write_text(json.dumps(asdict(control)))
    log(f"Debian's kernel {version} under {'KVM' if kvm else 'TCG'} (timeouts x{scale:g}); "
        "the control plane and the registry on this machine")  # fmt: skip
    with host_kept(spec.path) as differs:
        status = in_namespace(spec, "control-plane", str(spec_file), network=True)
    for entry in plan:
        results = Path(str(entry["results"]))
        log(f"{entry['name']}: console {results / 'console.log'}, logs {results / 'logs'}")
    return report(status, differs)


def guest_main(results: Path) -> int:
    """In the guest, after guest-init.sh mounted the basics: run the cluster."""
    spec = Spec(**json.loads((results / "spec.json").read_text()))
    spec.path.mkdir(parents=True, exist_ok=True)
    return inside(spec)


# --- command line --------------------------------------------------------------------------


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


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="test/local/cluster.py", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="bring the cluster up, run tests/e2e, tear down")
    run.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help="folder with kubelet, kube-apiserver, kube-scheduler and etcd",
    )
    run.add_argument("--vm", action="store_true",
                     help="inside a multi-NUMA qemu guest (also NUMA_VM=1)")  # fmt: skip
    run.add_argument("--work", type=Path, default=None, help="work folder (default: a new one)")
    run.add_argument("--keep", action="store_true", help="keep the work folder afterwards")
    run.add_argument("--plugin", choices=shipped.MODES, default=None,
                     help="process (the checkout), kustomize or helm (the image from a local "
                     "registry, installed with the README's command); also PLUGIN=")  # fmt: skip
    run.add_argument("--release", action="store_true",
                     help="with PLUGIN=helm: the image and chart of make release, installed "
                     "from the registry by digest (also RELEASE=1)")  # fmt: skip
    run.add_argument("--time-scale", type=float, default=1.0, help="multiply every timeout")
    run.add_argument("--workers", type=int, default=None,
                     help="a control plane here and this many worker guests with two NUMA "
                     "nodes each (also WORKERS=; needs PLUGIN=helm or kustomize)")  # fmt: skip
    run.add_argument(
        "--kube-router",
        type=Path,
        default=None,
        help="with WORKERS=: a kube-router binary (1.x) run in each worker with "
        "only its firewall on, so NetworkPolicy is enforced (also KUBE_ROUTER=)",
    )
    run.add_argument("--cpus-per-node", type=int, default=None,
                     help="guest CPUs per NUMA node (3)")  # fmt: skip
    run.add_argument("--vm-timeout", type=float, default=1800.0,
                     help="seconds the guest may run, before the TCG scale")  # fmt: skip
    run.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    for hidden in ("build", "push"):
        commands.add_parser(hidden, help=argparse.SUPPRESS).add_argument("work", type=Path)
    release_cmd = commands.add_parser("release", help=argparse.SUPPRESS)
    release_cmd.add_argument("work", type=Path)
    release_cmd.add_argument("helm")
    inside_cmd = commands.add_parser("inside", help=argparse.SUPPRESS)
    inside_cmd.add_argument("spec", type=Path)
    control_cmd = commands.add_parser("control-plane", help=argparse.SUPPRESS)
    control_cmd.add_argument("spec", type=Path)
    guest = commands.add_parser("guest", help=argparse.SUPPRESS)
    guest.add_argument("results", type=Path)
    args = parser.parse_args(argv)

    if args.command != "run":
        # PID 1 of a namespace: without a handler the kernel drops SIGTERM.
        signal.signal(signal.SIGTERM, interrupt)
    if args.command == "inside":
        return inside(Spec(**json.loads(args.spec.read_text())))
    if args.command == "control-plane":
        return control_plane(Spec(**json.loads(args.spec.read_text())))
    if args.command == "guest":
        return guest_main(args.results)
    if args.command == "build":
        shipped.build_image(REPO, args.work, shipped.python_standin(CACHE))
        return 0
    if args.command == "push":
        shipped.push_image(REPO, args.work)
        return 0
    if args.command == "release":
        standins = {arch: shipped.python_standin(CACHE, arch) for arch in ("amd64", "arm64")}
        shipped.make_release(REPO, args.work, standins, args.helm)
        return 0
    try:
        args.vm = args.vm or vm_wanted(os.environ.get("NUMA_VM", ""))
        mode = shipped.mode_wanted(args.plugin or os.environ.get("PLUGIN", ""))
        count = (
            args.workers
            if args.workers is not None
            else workers_wanted(os.environ.get("WORKERS", ""))
        )
        if count:
            workers.workers(count)
    except ValueError as error:
        parser.error(str(error))
    if count and mode == "process":
        parser.error(f"WORKERS={count} runs the image on every worker: use PLUGIN=helm or "
                     "PLUGIN=kustomize")  # fmt: skip
    if count and args.vm:
        parser.error("WORKERS= already runs every worker in a qemu guest: leave NUMA_VM unset")
    release = args.release or os.environ.get("RELEASE", "").strip() not in ("", "0")
    if release and mode != "helm":
        parser.error("RELEASE=1 installs the released chart: it needs PLUGIN=helm")
    kube_router = args.kube_router or (
        Path(os.environ["KUBE_ROUTER"]) if os.environ.get("KUBE_ROUTER", "").strip() else None
    )
    if kube_router is not None and not count:
        parser.error("KUBE_ROUTER runs in the worker guests: it needs WORKERS=N")
    if args.cpus_per_node is None:
        # 3: NUMA node 0 keeps 2 exclusive CPUs beside the reserved CPU 0, as the
        # deployments/examples pod asks.
        args.cpus_per_node = 3
    if args.time_scale <= 0 or args.cpus_per_node < 2:
        parser.error("--time-scale must be > 0 and --cpus-per-node at least 2")
    venv_helm = REPO / ".venv" / "bin" / "helm"
    helm = shutil.which("helm") or (str(venv_helm) if os.access(venv_helm, os.X_OK) else None)
    missing = missing_requirements(args.bin_dir, args.vm or bool(count), os.geteuid() == 0)
    if count and not Path("/dev/net/tun").exists():
        missing.append("/dev/net/tun: the workers' NICs are tap devices (modprobe tun)")
    if mode != "process":
        missing += shipped.missing_tools(Path(helm) if helm else None)
        if args.bin_dir is not None and not os.access(args.bin_dir / "kube-controller-manager",
                                                      os.X_OK):  # fmt: skip
            missing.append(f"{args.bin_dir / 'kube-controller-manager'}: no such executable "
                           f"(PLUGIN={mode} runs DaemonSets)")  # fmt: skip
    if kube_router is not None:
        missing += network_policy_missing(kube_router)
    if release and not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        missing.append(
            "qemu-aarch64 in binfmt_misc: RELEASE=1 builds linux/arm64 under qemu user "
            "emulation (qemu-user-static; docs/deployment.md#releases)"
        )
    if missing:
        print("test-e2e-local cannot run; missing:", file=sys.stderr)
        for line in missing:
            print(f"  - {line}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="ndp-e2e-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    spec = Spec(
        bin_dir=str(args.bin_dir.resolve()),
        work=str(work.resolve()),
        python=sys.executable,
        pytest_args=list(args.pytest_args),
        time_scale=args.time_scale,
        plugin=mode,
        registry_storage=str(work.resolve() / "registry") if mode != "process" else "",
        helm=helm or "",
        workers=count,
        release=release,
        kube_router=str(kube_router.resolve()) if kube_router is not None else "",
    )
    started = time.monotonic()
    # SIGTERM (and SIGHUP) end the run as Ctrl-C does: through the clean-up.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)
    try:
        status = prepare_image(spec) if spec.shipped else 0
        if status == 0 and spec.release:
            released = json.loads((work / "release.json").read_text())
            spec = replace(spec, release_info=released)
        if status:
            status = 1
        elif count:
            status = run_workers(spec, args.cpus_per_node)
        elif args.vm:
            status = run_vm(spec, render.GuestShape(cpus_per_node=args.cpus_per_node),
                            args.vm_timeout)  # fmt: skip
        else:
            status = run_host(spec)
    except Missing as missing_thing:
        print(f"test-e2e-local cannot run; missing: {missing_thing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        status = 130
    finally:
        print_progress(work)
        log(f"finished in {time.monotonic() - started:.0f} s; work folder {work}"
            + (" (kept)" if args.keep else " (removed)"))  # fmt: skip
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
