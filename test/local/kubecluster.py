"""The cluster itself: etcd, the API server, the scheduler, containerd, the kubelet and
the plugin started in order for this process's role (:class:`Cluster`), the e2e tests
run against it, and everything stopped again; the host run in a private mount and PID
namespace with the host checked afterwards (:func:`run_host`, :func:`in_namespace`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hoststate
import netstate
import plan
import render
import shipped
import workers
from plan import (
    EVICTION_MEMORY_BYTES,
    HARNESS,
    REPO,
    Spec,
    free_port,
    host_cgroup_v1,
    kube_version,
    log,
)
from processes import Processes, http_get, interrupt, untaint, wait_for
from results import PROGRESS_FILE, keep_logs, report


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
        applets = subprocess.run([str(plan.BUSYBOX), "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()  # fmt: skip
        archive = self.work / "images.tar"
        archive.write_bytes(render.oci_archive(
            render.busybox_layer(plan.BUSYBOX.read_bytes(), applets),
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


def namespace_argv(spec: Spec, *command: str, network: bool) -> list[str]:
    """``unshare`` running the harness's entry script (:data:`~plan.HARNESS`,
    ``cluster.py``) as ``COMMAND`` in new mount and PID namespaces (and a network
    namespace when ``network``), killed with its parent."""
    return [
        "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
        *(["--net"] if network else []),
        "--kill-child", spec.python, str(HARNESS), *command,
    ]  # fmt: skip


def in_namespace(spec: Spec, *command: str, network: bool) -> int:
    """``cluster.py COMMAND`` in a new mount and PID namespace (and network namespace
    when ``network``); its exit status."""
    child = subprocess.Popen(namespace_argv(spec, *command, network=network),
                             preexec_fn=kill_with_parent)  # fmt: skip
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
