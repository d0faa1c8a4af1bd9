"""What a run of the one-machine cluster may change on the host, before and after.

The cluster runs in a private mount and PID namespace, so its mounts and processes end with
it. Three things outlive the namespace and are put back here: the ``kubepods`` cgroups the
kubelet and runc create (shared ``/sys/fs/cgroup``), the kernel tunables the kubelet sets
(``vm.overcommit_memory``, ``kernel.panic``, …), and the mount-point folders the harness had
to create (``/var/lib/kubelet``, ``/run/containerd``, …). :func:`snapshot` records all of it
and the processes and mounts besides, :func:`restore` undoes what it can, and
:func:`differences` says what still differs.

Only what a run could have made or changed is judged (and only that is ever removed):
cgroups with a ``kubepods`` component, mounts at or below the fixed paths, the work
folder or the network namespaces' folder, cluster programs and processes naming the
work folder, the kubelet's tunables, the fixed paths. Other work on the machine (a
program's own cgroup that comes or goes, a mount of its own) never turns a run red.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from render import KUBELET_SYSCTLS

# Programs of the cluster: none may outlive a run.
CLUSTER_PROGRAMS = frozenset(
    {
        "kubelet",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "docker-registry",
        "buildah",
        "etcd",
        "containerd",
        "containerd-shim",
        "containerd-shim-runc-v2",
        "runc",
        "qemu-system-x86_64",
    }
)
# Folders the kubelet and containerd use at fixed paths: bind-mounted from the work folder
# inside the namespace, so the host must have them as mount points.
FIXED_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/run/containerd"),
)


# Mount points below which a run's mounts can be (besides the fixed paths and the work
# folder): the network namespaces ``ip netns`` binds.
NETNS_FOLDERS = (Path("/run/netns"), Path("/var/run/netns"))


def our_cgroup(relative: str) -> bool:
    """Whether a cgroup (a path below the cgroup root, ``cpu/kubepods/besteffort``) is
    one the kubelet or runc of a run makes: a ``kubepods`` component (cgroupfs driver)."""
    return any(part.startswith("kubepods") for part in Path(relative).parts)


def our_mount(point: str, work: Path | None, fixed: tuple[Path, ...] = FIXED_PATHS) -> bool:
    """Whether a mount point is one a run can leave: at or below a fixed path, the work
    folder or a network namespaces' folder."""
    roots = [*fixed, *NETNS_FOLDERS, *([work] if work is not None else [])]
    return any(point == str(root) or point.startswith(str(root).rstrip("/") + "/")
               for root in roots)  # fmt: skip


@dataclass(frozen=True)
class HostState:
    """One reading of the host: ``mounts`` as ``(mount point, fs type, source)``,
    ``cgroups`` as folder paths under the cgroup root, ``processes`` as
    ``(pid, program)`` of cluster programs, ``sysctls`` as ``{name: value}``, and
    ``paths`` as the fixed paths that exist."""

    mounts: frozenset[tuple[str, str, str]]
    cgroups: frozenset[str]
    processes: frozenset[tuple[int, str]]
    sysctls: dict[str, str] = field(default_factory=dict)
    paths: frozenset[str] = frozenset()


def read_mounts(proc: Path) -> frozenset[tuple[str, str, str]]:
    """``(mount point, fs type, source)`` from ``proc/self/mountinfo``."""
    found = set()
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, rest = before.split(), after.split()
        if len(fields) >= 5 and len(rest) >= 2:
            found.add((fields[4], rest[0], rest[1]))
    return frozenset(found)


def read_cgroups(root: Path) -> frozenset[str]:
    """Every cgroup folder below ``root`` (``/sys/fs/cgroup``), as paths relative to it."""
    found = set()
    for top, folders, _ in os.walk(root):
        for name in folders:
            found.add(str((Path(top) / name).relative_to(root)))
    return frozenset(found)


def read_processes(proc: Path, work: Path | None = None) -> frozenset[tuple[int, str]]:
    """Processes running a cluster program, or whose command line names ``work``."""
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        program = os.path.basename(argv[0].decode(errors="replace")) if argv[0] else ""
        mentions_work = work is not None and str(work).encode() in b" ".join(argv)
        if program in CLUSTER_PROGRAMS or mentions_work:
            found.add((int(entry.name), program))
    return frozenset(found)


def snapshot(
    proc: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    work: Path | None = None,
    fixed: tuple[Path, ...] = FIXED_PATHS,
) -> HostState:
    """Read the host as :class:`HostState`."""
    sysctls = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[name] = (proc / "sys" / name).read_text().strip()
    return HostState(
        mounts=read_mounts(proc),
        cgroups=read_cgroups(cgroup_root),
        processes=read_processes(proc, work),
        sysctls=sysctls,
        paths=frozenset(str(p) for p in fixed if p.exists()),
    )


def differences(
    before: HostState, after: HostState, work: Path | None = None,
    fixed: tuple[Path, ...] = FIXED_PATHS,
) -> list[str]:  # fmt: skip
    """Human-readable lines, one per thing of the run's that differs (:func:`our_cgroup`,
    :func:`our_mount`); empty when the host is as it was."""
    lines = []

    def mounts(state: HostState) -> frozenset[tuple[str, str, str]]:
        return frozenset(m for m in state.mounts if our_mount(m[0], work, fixed))

    def cgroups(state: HostState) -> frozenset[str]:
        return frozenset(c for c in state.cgroups if our_cgroup(c))

    for what, old, new in (
        ("mount", mounts(before), mounts(after)),
        ("cgroup", cgroups(before), cgroups(after)),
        ("process", before.processes, after.processes),
        ("path", before.paths, after.paths),
    ):
        lines += [f"{what} left behind: {item}" for item in sorted(new - old, key=str)]
        lines += [f"{what} gone: {item}" for item in sorted(old - new, key=str)]
    for name, value in sorted(before.sysctls.items()):
        now = after.sysctls.get(name)
        if now != value:
            lines.append(f"sysctl {name.replace('/', '.')}: {value} before, {now} after")
    return lines


def restore(
    before: HostState,
    proc: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    fixed: tuple[Path, ...] = FIXED_PATHS,
    attempts: int = 50,
) -> None:
    """Undo what a run changed: put each tunable back, kill what is left in the new
    cgroups of the run (:func:`our_cgroup`; another program's are never touched) and
    remove them (deepest first, retried while their last processes die), and remove
    the fixed paths the run created (only when empty: nothing of the host is deleted)."""
    for name, value in before.sysctls.items():
        path = proc / "sys" / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
    for _ in range(attempts):
        made = {c for c in read_cgroups(cgroup_root) - before.cgroups if our_cgroup(c)}
        new = sorted(made, key=lambda p: -p.count("/"))
        if not new:
            break
        for relative in new:
            folder = cgroup_root / relative
            with contextlib.suppress(OSError):
                for pid in (folder / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                folder.rmdir()
        time.sleep(0.1)
    for path in sorted(fixed, key=lambda p: -len(p.parts)):
        if str(path) not in before.paths:
            with contextlib.suppress(OSError):
                path.rmdir()
