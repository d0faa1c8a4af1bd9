"""What the one-machine cluster is made of, as pure functions: the containerd and kubelet
configurations, the kubeconfig, the busybox image as an OCI archive, the qemu command line,
the guest's initramfs (``newc`` cpio) and its ``/init`` script.

Nothing here touches the machine; :mod:`cluster` writes what these return and runs it.
The facts behind each setting (containerd 1.6 quirks, kubelet flags for a cluster without a
controller manager, the qemu NUMA options) are in ``../shared/REAL-CLUSTER.md``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The kernel tunables the kubelet sets at start (kubelet's setupKernelTunables and the
# keyring limits); the harness puts them back when it is done.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"
# The pod sandbox ("pause") image: the same busybox layer, sleeping.
PAUSE_IMAGE = "registry.k8s.io/pause:3.9"
# Modules the guest's initramfs loads, in this order, to mount the host's / over 9p
# under an overlay (REAL-CLUSTER.md), and virtio_blk for the data disks (pci_argv).
GUEST_MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "overlay",
)


@dataclass(frozen=True)
class KubeletSettings:
    """The kubelet settings the end-to-end tests depend on.

    ``reserved_cpus`` is a cpulist (``reservedSystemCPUs``); ``cpu_manager`` is
    ``static`` or ``none``; ``memory_manager`` is ``None`` or ``Static`` (with
    ``reserved_memory`` as ``{numa_node: bytes}``, whose sum must equal the hard eviction
    threshold, since no kube or system memory is reserved)."""

    node_name: str
    port: int
    runtime_socket: Path
    address: str = "127.0.0.1"
    reserved_cpus: str = "0"
    cpu_manager: str = "static"
    topology_manager: str = "single-numa-node"
    memory_manager: str = "None"
    eviction_memory_bytes: int = 100 * 2**20
    reserved_memory: tuple[tuple[int, int], ...] = ()
    status_update_seconds: int = 5
    # Kubernetes 1.35+ on a cgroup v1 host: False lets the kubelet run (it refuses by
    # default); None leaves the field out (older kubelets do not know it).
    fail_cgroup_v1: bool | None = None


def kubelet_config(settings: KubeletSettings) -> dict[str, Any]:
    """The ``KubeletConfiguration`` (``kubelet.config.k8s.io/v1beta1``) as a dict, written
    as JSON (a YAML subset the kubelet reads). No iptables chains, no read-only port, no
    image garbage collection (the images cannot be pulled again), anonymous
    ``AlwaysAllow`` on 127.0.0.1 so the API server can fetch logs."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": settings.address,
        "port": settings.port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{settings.runtime_socket}",
        "cpuManagerPolicy": settings.cpu_manager,
        "reservedSystemCPUs": settings.reserved_cpus,
        "topologyManagerPolicy": settings.topology_manager,
        "memoryManagerPolicy": settings.memory_manager,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": f"{settings.status_update_seconds}s",
        "evictionHard": {
            "memory.available": f"{settings.eviction_memory_bytes // 2**20}Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
    }
    if settings.fail_cgroup_v1 is not None:
        config["failCgroupV1"] = settings.fail_cgroup_v1
    if settings.memory_manager == "Static":
        config["reservedMemory"] = [
            {"numaNode": node, "limits": {"memory": f"{size // 2**20}Mi"}}
            for node, size in settings.reserved_memory
        ]
    return config


# The Kubernetes minor versions the harness was run with (1.28 and 1.32-1.36 built here).
SUPPORTED_VERSIONS = ((1, 28), (1, 36))


def parse_kube_version(text: str) -> tuple[int, int, int]:
    """``Kubernetes v1.36.2`` (``kubelet --version``) -> (1, 36, 2). Raises ValueError
    for anything else (a binary built without its version reports v0.0.0)."""
    match = re.search(r"\bv(\d+)\.(\d+)\.(\d+)", text)
    if match is None or match.groups() == ("0", "0", "0"):
        raise ValueError(f"no Kubernetes version in {text.strip()[:80]!r}")
    return int(match[1]), int(match[2]), int(match[3])


def version_problem(version: tuple[int, int, int]) -> str | None:
    """Why the harness does not run binaries of ``version``, or None."""
    low, high = SUPPORTED_VERSIONS
    if not low <= version[:2] <= high:
        shown = ".".join(map(str, version))
        return (f"Kubernetes v{shown} is outside what the harness supports "
                f"(v{low[0]}.{low[1]} to v{high[0]}.{high[1]})")  # fmt: skip
    return None


def fail_cgroup_v1(version: tuple[int, int, int], cgroup_v1: bool) -> bool | None:
    """The kubelet's ``failCgroupV1`` for ``version`` on a host that is (``cgroup_v1``)
    or is not on cgroup v1: from 1.35 the kubelet refuses cgroup v1 unless it is
    False; before 1.31 the field does not exist (None: left out)."""
    if version[:2] >= (1, 35) and cgroup_v1:
        return False
    return None


def containerd_config(
    work: Path,
    pause_image: str = PAUSE_IMAGE,
    cni_bin_dir: Path | None = None,
    registry_config: Path | None = None,
) -> str:
    """containerd 1.6's ``config.toml`` keeping every path under ``work`` (the shims'
    ``/run/containerd`` is bind-mounted by the harness). ``restrict_oom_score_adj`` is
    needed on these machines or runc fails ("can't get final child's PID from pipe").
    ``cni_bin_dir``: the CNI plugins (default: an empty folder under ``work``);
    ``registry_config``: the ``certs.d`` folder of per-registry ``hosts.toml`` files."""
    base = work / "containerd"
    cni_bin = cni_bin_dir or work / "cni" / "bin"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    registries = (
        f'  [{cri}.registry]\n    config_path = "{registry_config}"\n'
        if registry_config is not None
        else ""
    )
    return (
        f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{base}/containerd.sock"

[ttrpc]
  address = "{base}/containerd.sock.ttrpc"

[{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{work}/cni/net.d"
"""
        + registries
    )


def kubeconfig(server: str, token: str) -> dict[str, Any]:
    """A kubeconfig for ``server`` (``https://127.0.0.1:PORT``) with a static bearer token;
    the API server's certificate is self-signed, so it is not verified."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }


# --- the busybox image -------------------------------------------------------------------


def _tar_bytes(members: Iterable[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname, info.mtime = kind, mode, size, link, 0
    return info


def busybox_layer(busybox: bytes, applets: Sequence[str]) -> bytes:
    """An image layer (uncompressed tar): ``bin/busybox``, one symlink per applet, and the
    folders a container runtime mounts over (``proc``, ``sys``, ``dev``, ``etc``, ``tmp``)."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_entry(folder, tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755), None)
        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp")
    ]
    members.append((_entry("bin/busybox", tarfile.REGTYPE, 0o755, len(busybox)), busybox))
    for applet in sorted(set(applets) - {"busybox"}):
        members.append((_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"), None))
    return _tar_bytes(members)


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def oci_archive(layer: bytes, images: Sequence[tuple[str, Sequence[str]]]) -> bytes:
    """An OCI image layout as a tar, for ``ctr images import``: one manifest per
    ``(reference, command)`` in ``images``, all on the one ``layer``. Each manifest names
    its image in ``io.containerd.image.name`` (the full reference ctr imports it as)."""
    blobs: dict[str, bytes] = {}
    layer_digest, _ = _blob(layer)
    blobs[layer_digest] = layer
    manifests = []
    for reference, command in images:
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": list(command), "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
        blobs[config_digest] = config_bytes
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        }
        manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
        blobs[manifest_digest] = manifest_bytes
        manifests.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": reference,
                    "org.opencontainers.image.ref.name": reference.rpartition(":")[2],
                },
            }
        )
    index = {"schemaVersion": 2, "manifests": manifests}
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    files.update({f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()})
    for folder in ("blobs", "blobs/sha256"):
        members.append((_entry(folder, tarfile.DIRTYPE, 0o755), None))
    for name, data in files.items():
        members.append((_entry(name, tarfile.REGTYPE, 0o644, len(data)), data))
    return _tar_bytes(members)


# --- the qemu guest ----------------------------------------------------------------------


@dataclass(frozen=True)
class GuestShape:
    """The guest's NUMA layout: ``cpu_nodes`` NUMA nodes of ``cpus_per_node`` CPUs and
    ``memory_mib_per_cpu_node`` MiB each, then one memory-only node of
    ``memory_only_mib`` (none when 0). Distances: 10 local, 21 between CPU nodes; the
    memory-only node 26 from node 0 and 31 from the others (a SLIT as on a two-socket
    machine with far memory behind socket 0: a device there is nearest node 0's CPUs)."""

    cpu_nodes: int = 2
    cpus_per_node: int = 3
    memory_mib_per_cpu_node: int = 4096
    memory_only_mib: int = 1024
    # 0: one socket per CPU (as below); N: N sockets of cpu_nodes / N NUMA nodes each
    # (AMD NPS, Intel SNC), each node its own cores, 12 within a socket and 21 across.
    sockets: int = 0

    @property
    def dies(self) -> int:
        """NUMA nodes per socket; 1 without :attr:`sockets`."""
        return self.cpu_nodes // self.sockets if self.sockets else 1

    @property
    def cpus(self) -> int:
        return self.cpu_nodes * self.cpus_per_node

    @property
    def nodes(self) -> int:
        return self.cpu_nodes + (1 if self.memory_only_mib else 0)

    @property
    def memory_mib(self) -> int:
        return self.cpu_nodes * self.memory_mib_per_cpu_node + self.memory_only_mib

    def distance(self, a: int, b: int) -> int:
        if a == b:
            return 10
        if self.sockets and max(a, b) < self.cpu_nodes:
            return 12 if a // self.dies == b // self.dies else 21
        if self.cpu_nodes in (a, b):
            return 26 if 0 in (a, b) else 31
        return 21


def qemu_argv(
    *,
    qemu: str,
    kvm: bool,
    shape: GuestShape,
    kernel: Path,
    initrd: Path,
    console_log: Path,
    results: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """The qemu command line: ``kvm`` picks ``-accel kvm -cpu host``, else TCG on every
    host core. ttyS0 (the kernel's console) goes to ``console_log``; ttyS1, where the
    guest writes the run's output, to qemu's stdout. The host's ``/`` is shared read-only
    (tag ``hostroot``), ``results`` writable (tag ``results``). ``extra`` ends the line
    (a worker's NIC, :func:`workers.qemu_nic`)."""
    accel = (
        ["-accel", "kvm", "-cpu", "host"] if kvm else ["-accel", "tcg,thread=multi", "-cpu", "max"]
    )
    argv = [
        qemu,
        *accel,
        "-machine", "q35",
        # One socket per CPU: with cores=3 the stock kernel hung in stop_machine under TCG.
        "-smp", f"{shape.cpus},sockets={shape.cpus},cores=1,threads=1" if not shape.sockets
        else f"{shape.cpus},sockets={shape.sockets},cores={shape.dies * shape.cpus_per_node},"
             "threads=1",
        "-m", f"{shape.memory_mib}M",
        "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
        "-no-reboot",
        "-kernel", str(kernel),
        "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 loglevel=4 rdinit=/init",
        "-serial", f"file:{console_log}",
        "-serial", "stdio",
        "-virtfs",
        "local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap",
        "-virtfs", f"local,path={results},mount_tag=results,security_model=none",
    ]  # fmt: skip
    for node in range(shape.nodes):
        size = shape.memory_only_mib if node == shape.cpu_nodes else shape.memory_mib_per_cpu_node
        argv += ["-object", f"memory-backend-ram,id=m{node},size={size}M"]
        spec = f"node,nodeid={node},memdev=m{node}"
        if node < shape.cpu_nodes and not shape.sockets:
            first = node * shape.cpus_per_node
            spec += f",cpus={first}-{first + shape.cpus_per_node - 1}"
        argv += ["-numa", spec]
    # Sockets: each NUMA node its own cores of its socket (qemu's dies read as packages
    # in the guest under TCG: CPUID leaf 0x1F is not there, so the kernel saw 8 sockets).
    for node in range(shape.cpu_nodes if shape.sockets else 0):
        for index in range(shape.cpus_per_node):
            core = (node % shape.dies) * shape.cpus_per_node + index
            argv += ["-numa", f"cpu,node-id={node},socket-id={node // shape.dies},"
                     f"core-id={core},thread-id=0"]  # fmt: skip
    for a in range(shape.nodes):
        for b in range(shape.nodes):
            if a != b:
                argv += ["-numa", f"dist,src={a},dst={b},val={shape.distance(a, b)}"]
    return [*argv, *extra]


@dataclass(frozen=True)
class DataDisk:
    """A disk the guest sees on NUMA node ``node``: a virtio-blk device with ``serial``
    and qemu id ``qemu_id`` on a root port of the PCI Express expander bridge that
    carries that node (ACPI ``_PXM``), backed by the raw file ``image`` (a ``-blockdev``
    that outlives the device, so the device can be removed and added again on the
    monitor). The guest's ``/sys/bus/pci/devices/*/numa_node`` of the bridge, its root
    port and the disk read ``node`` (REAL-CLUSTER.md). ``slot``: the worker formats it and
    mounts it at ``/mnt/disks/<slot>`` (:data:`DISKS_FOLDER`); empty, left alone."""

    image: Path
    node: int
    serial: str
    qemu_id: str = "data"
    slot: str = ""


# A disk on the memory-only NUMA node's expander bridge (worker A): FAR-DISK-<letter>.
FAR_DISK_SERIAL = "FAR-DISK-{}"
# The serial of the data disk's guests: DATA-DISK-<letter> (``a`` for the one guest).
DATA_DISK_SERIAL = "DATA-DISK-{}"
# A worker's second data disk (slot b), on the other NUMA node than DATA-DISK-<letter>.
SECOND_DISK_SERIAL = "SLOT-B-{}"
# A worker's disk that the tests remove and add back on the qemu monitor (never mounted).
HOTPLUG_SERIAL = "HOTPLUG-{}"
# Where a worker mounts its data disks: <DISKS_FOLDER>/a and <DISKS_FOLDER>/b.
DISKS_FOLDER = "/mnt/disks"
# Bytes of a data disk's image (sparse; the worker makes an ext4 filesystem on a slot's).
DATA_DISK_BYTES = 16 << 20
# Root ports on each expander bridge: for the disks, the NIC and a hot-plugged disk.
PORTS_PER_BRIDGE = 4


def port_id(node: int, index: int) -> str:
    """The qemu id of root port ``index`` of NUMA node ``node``'s expander bridge."""
    return f"rp{node}{index}"


def pci_argv(
    disks: Sequence[DataDisk], nic: Sequence[str] = (), bridges: Sequence[int] = (0, 1)
) -> list[str]:
    """qemu arguments (machine q35) for an expander bridge (``pxb-pcie``) per NUMA node of
    ``bridges`` (0 and 1; a memory-only node too, where a guest has one) on the root
    complex, :data:`PORTS_PER_BRIDGE` hot-pluggable root ports on each
    (no I/O window, which a dozen ports would exhaust), each of ``disks`` on the next free
    port of its node's bridge, and ``nic`` (a ``-device`` value without ``bus``, with its
    ``-netdev`` before it elsewhere) on the next free port of node 1's. Every id and bus
    explicit, so no other device lands on a bridge. Raises ValueError when a node's ports
    run out or a disk's node has no bridge."""
    argv: list[str] = []
    for node in bridges:
        argv += ["-device", f"pxb-pcie,id=pxb{node},bus_nr={64 * (node + 1)},numa_node={node},"
                 "bus=pcie.0"]  # fmt: skip
        for index in range(PORTS_PER_BRIDGE):
            argv += ["-device", f"pcie-root-port,id={port_id(node, index)},bus=pxb{node},"
                     f"chassis={10 * (node + 1) + index},slot={index},io-reserve=0"]  # fmt: skip
    used = dict.fromkeys(bridges, 0)

    def next_port(node: int) -> str:
        if node not in used:
            shown = ", ".join(map(str, bridges))
            raise ValueError(f"NUMA node {node}: the guest's bridges are on nodes {shown}")
        if used[node] == PORTS_PER_BRIDGE:
            raise ValueError(f"NUMA node {node}'s bridge has no free root port")
        used[node] += 1
        return port_id(node, used[node] - 1)

    for disk in disks:
        argv += [
            "-blockdev", f"driver=file,filename={disk.image},node-name={disk.qemu_id}-file",
            "-blockdev", f"driver=raw,file={disk.qemu_id}-file,node-name={disk.qemu_id}",
            "-device", f"virtio-blk-pci,id={disk.qemu_id},bus={next_port(disk.node)},"
                       f"drive={disk.qemu_id},serial={disk.serial}",
        ]  # fmt: skip
    if nic:
        *before, device = nic
        argv += [*before, f"{device},bus={next_port(1)}"]
    return argv


def kept_tmp_paths(paths: Iterable[Path]) -> list[str]:
    """Those of ``paths`` under ``/tmp`` that the guest must see at the same place
    (its ``/tmp`` is a tmpfs of its own: guest-init.sh binds these back from the host's
    ``/tmp``), without one inside another, sorted."""
    tmp = Path("/tmp")
    under = sorted({Path(os.path.normpath(p)) for p in paths if tmp in Path(p).parents})
    kept: list[Path] = []
    for path in under:
        if not any(parent in path.parents for parent in kept):
            kept.append(path)
    return [str(path) for path in kept]


def guest_init_script(command: str) -> str:
    """The initramfs's ``/init`` (busybox sh): load the 9p and overlay modules, mount the
    host's ``/`` read-only under an overlay with a tmpfs upper layer, mount the results
    share at ``/ndp-results`` in it, and ``switch_root`` into it running ``command``."""
    modules = "\n".join(f"insmod /modules/{name}.ko" for name in GUEST_MODULES)
    return f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
{modules}
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /lower
mount -t tmpfs -o size=75% tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot
mkdir -p /newroot/ndp-results
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /newroot/ndp-results
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot {command}
echo "switch_root failed" >/dev/ttyS0
echo o >/proc/sysrq-trigger
"""


def cpio_newc(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """A ``newc`` cpio archive (the initramfs format) of ``(path, mode, data)`` entries;
    ``mode`` includes the file type bits (``0o100755`` for a program, ``0o040755`` for a
    folder, ``0o120777`` for a symlink whose data is its target)."""
    out = bytearray()

    def pad() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    for inode, (path, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        name = path.encode() + b"\0"
        fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name), 0)
        out += b"070701" + b"".join(b"%08X" % value for value in fields)
        out += name
        pad()
        out += data
        pad()
    return bytes(out)


def progress_summary(text: str, limit: int = 60) -> str:
    """The summary of an e2e run's progress file (tests/e2e/conftest.py writes one JSON
    line per test as it ends): the count per outcome, then each test with why it did not
    pass, its last observed line and its two longest waits (what for, seconds in all,
    how often and how each ended); at most ``limit`` tests listed. A line
    that is not JSON (a run cut mid-write) is counted as such, never fatal."""
    records, broken = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            broken += 1
            continue
        if isinstance(record, dict):
            records.append(record)
    counts: dict[str, int] = {}
    for record in records:
        outcome = str(record.get("outcome", "?"))
        counts[outcome] = counts.get(outcome, 0) + 1
    head = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
    lines = [f"e2e progress: {head or 'no test ended'}"
             + (f" ({broken} unreadable line(s))" if broken else "")]  # fmt: skip
    for record in records[:limit]:
        outcome = str(record.get("outcome", "?")).upper()
        lines.append(f"  {outcome:7} {record.get('test')} ({record.get('seconds')} s)")
        if record.get("why"):
            lines.append("          why: " + " ".join(str(record["why"]).split())[:400])
        if record.get("where") and isinstance(record["where"], list):
            lines.append("          at: " + " > ".join(map(str, record["where"]))[:400])
        if record.get("plugin_log") and isinstance(record["plugin_log"], list):
            lines += ["          plugin: " + str(line)[:300] for line in record["plugin_log"][-3:]]
        observed = record.get("observed") or []
        if observed:
            lines.append("          saw: " + str(observed[-1])[:300])
        longest = sorted((w for w in record.get("waits") or [] if isinstance(w, dict)),
                         key=lambda w: -float(w.get("seconds") or 0))[:2]  # fmt: skip
        for wait in longest:
            outcomes = ", ".join(f"{n} {k}" for k, n in (wait.get("outcomes") or {}).items())
            lines.append(f"          waited {wait.get('seconds')} s for {wait.get('what')}"
                         f" ({wait.get('times')}x: {outcomes})"[:300])  # fmt: skip
    if len(records) > limit:
        lines.append(f"  ... and {len(records) - limit} more")
    return "\n".join(lines)
