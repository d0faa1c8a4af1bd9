"""The qemu guests: the control plane's side of the worker guests (:class:`Guests`), a
guest's kernel and initramfs, its qemu command line and data disks, and the run of
the tests inside one (NUMA_VM=1) or on two workers (WORKERS=2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import plan
import render
import workers
from kubecluster import (
    NETWORK_SAMPLE_SECONDS,
    Cluster,
    host_kept,
    in_namespace,
    inside,
    kill_with_parent,
    reap_orphans,
    sample_network,
)
from plan import CACHE, HARNESS, REPO, Missing, Spec, log
from processes import http_get, interrupt
from results import report
from workers import Worker


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


# --- the guest run -------------------------------------------------------------------------


def guest_command(spec: Spec, kept: Sequence[str]) -> str:
    """The guest's init command: ``guest-init.sh`` switches to the host's root, then runs
    the harness's entry script (:data:`~plan.HARNESS`, ``cluster.py``) with this run's
    Python, its results share and the host's ``/tmp`` paths ``kept`` to bind back."""
    script = Path(__file__).resolve().parent / "guest-init.sh"
    return " ".join(["/bin/bash", str(script), spec.python, str(HARNESS), "/ndp-results", *kept])


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
    entries.append(("bin/busybox", 0o100755, plan.BUSYBOX.read_bytes()))
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
    # The guest's /tmp is its own tmpfs: what the run needs from the host's /tmp (the
    # binaries, the checkout, the venv) is bound back at the same paths.
    kept = render.kept_tmp_paths([
        Path(spec.bin_dir), REPO, Path(spec.python).parents[1],
        *([Path(spec.registry_storage)] if spec.shipped else []),
    ])  # fmt: skip
    command = guest_command(spec, kept)
    initrd = spec.path / "initrd.cpio"
    initrd.write_bytes(initramfs(modules, command))
    argv = render.qemu_argv(
        qemu="qemu-system-x86_64", kvm=kvm, shape=shape, kernel=kernel, initrd=initrd,
        console_log=spec.path / "console.log", results=results,
        extra=render.pci_argv(data_disks(spec.path, 0, one_guest=True)),
    )  # fmt: skip
    log(
        f"booting Debian's kernel {version} under {'KVM' if kvm else 'TCG'}: "
        f"{shape.cpu_nodes} NUMA nodes of {shape.cpus_per_node} CPUs"
        + (f" in {shape.sockets} sockets" if shape.sockets else " and a memory-only node")
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


def data_disks(
    work: Path, index: int, one_guest: bool = False, memory_only: bool = False
) -> list[render.DataDisk]:
    """The data disks of guest ``index`` (0 = a), their images sparse files in ``work``
    made here. Slot ``a`` (serial ``DATA-DISK-<LETTER>``) is on NUMA node 1 for a, node 0
    for b and then alternating, so that one template asking for the disk's node lands on
    different NUMA nodes on different workers; slot ``b`` (``SLOT-B-<LETTER>``) on the
    other node; the disk the tests hot-plug (``HOTPLUG-<LETTER>``, unmounted) on node 1;
    with ``memory_only`` (the guest's memory-only node 2), ``FAR-DISK-<LETTER>``
    (unmounted) on node 2's bridge. ``one_guest`` (NUMA_VM=1): slot a's disk only."""
    letter = chr(ord("a") + index)
    node = 1 - index % 2
    wanted = [("data", render.DATA_DISK_SERIAL, node, "a")]
    if not one_guest:
        wanted += [("second", render.SECOND_DISK_SERIAL, 1 - node, "b"),
                   ("hotplug", render.HOTPLUG_SERIAL, 1, "")]  # fmt: skip
    if memory_only and not one_guest:
        wanted.append(("far", render.FAR_DISK_SERIAL, 2, ""))
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
    ``cpus_per_node`` CPUs and 3 GiB, the memory-only node where the worker has one, with
    a disk on its bridge, its NIC) and the spec its guest runs (role ``worker``, the
    Memory Manager Static, every timeout times ``scale``); the control plane adds the API
    server and token."""
    results = spec.path / f"results-{worker.letter}"
    far = worker.memory_only_node  # a disk on the memory-only node's bridge too
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
        extra=[*render.pci_argv(data_disks(spec.path, worker.index, memory_only=far),
                                workers.qemu_nic(worker), bridges=(0, 1, 2) if far else (0, 1)),
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
    command = guest_command(spec, kept)
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
