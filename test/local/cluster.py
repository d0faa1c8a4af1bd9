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
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import render
import shipped
import workers
from guests import control_plane, guest_main, run_vm, run_workers
from kubecluster import inside, run_host
from plan import (
    CACHE,
    REPO,
    Missing,
    Spec,
    log,
    missing_requirements,
    network_policy_missing,
    vm_wanted,
    workers_wanted,
)
from processes import interrupt
from registry import prepare_image
from results import print_progress

# Seconds between two samples of the control plane's network (logs/network.jsonl).


# --- command line --------------------------------------------------------------------------


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
    run.add_argument("--sockets", type=int, default=None,
                     help="with NUMA_VM=1: a guest of this many sockets of 2 NUMA nodes each, "
                     "no memory-only node (also NUMA_VM_SOCKETS=)")  # fmt: skip
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
    sockets_text = os.environ.get("NUMA_VM_SOCKETS", "").strip()
    if args.sockets is None and sockets_text:
        if not sockets_text.isdigit():
            parser.error(f"NUMA_VM_SOCKETS={sockets_text!r}: a number of sockets")
        args.sockets = int(sockets_text)
    if args.sockets is not None and (not args.vm or not 1 <= args.sockets <= 4):
        parser.error("--sockets (NUMA_VM_SOCKETS) takes 1 to 4, with NUMA_VM=1")
    if args.cpus_per_node is None:
        # 3: NUMA node 0 keeps 2 exclusive CPUs beside the reserved CPU 0, as the
        # deployments/examples pod asks. Sockets: 1 (8 NUMA nodes of 3 CPUs under TCG
        # were too slow for the API server's start: its RBAC bootstrap timed out).
        args.cpus_per_node = 1 if args.sockets else 3
    if args.time_scale <= 0 or args.cpus_per_node < (1 if args.sockets else 2):
        parser.error("--time-scale must be > 0 and --cpus-per-node at least 2 (1 with "
                     "--sockets)")  # fmt: skip
    shape = render.GuestShape(cpus_per_node=args.cpus_per_node)
    if args.sockets:
        # 2 NUMA nodes a socket, at most 8 (the Topology Manager's limit), 1 GiB each.
        shape = render.GuestShape(cpu_nodes=2 * args.sockets, cpus_per_node=args.cpus_per_node,
                                  memory_mib_per_cpu_node=1024, memory_only_mib=0,
                                  sockets=args.sockets)  # fmt: skip
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
            status = run_vm(spec, shape, args.vm_timeout)
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
