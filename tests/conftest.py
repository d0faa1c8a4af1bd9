"""Shared fixtures: synthetic sysfs trees, real snapshots from ../shared, short socket
folders, and a guard that fails any test leaving asyncio tasks running."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from numa_device_plugin.ops.logs import configure_logging
from numa_device_plugin.topology.fake import SysfsTree, build_machine

REPO = Path(__file__).resolve().parent.parent
SNAPSHOTS = REPO.parent / "shared" / "fixtures" / "sysfs"
PCI_SNAPSHOTS = REPO.parent / "shared" / "fixtures" / "sysfs-pci"

configure_logging("debug")


def under_ci(value: str | None) -> bool:
    """``CI`` set to anything but empty, ``0`` or ``false`` (any case) means a CI run."""
    return (value or "").strip().lower() not in ("", "0", "false")


def missing(message: str) -> NoReturn:
    """A tool or file the test needs is absent: skip, or fail under CI
    (:func:`under_ci`: a missing tool must not pass in silence)."""
    if under_ci(os.environ.get("CI")):
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str, provider: str, path: str | None = None) -> str:
    """The path of program ``name`` (on PATH, or on ``path``), else :func:`missing`
    saying what provides it (``provider``: a Debian package, an extra)."""
    found = shutil.which(name, path=path)
    if found is None:
        missing(f"{name} is not installed ({provider})")
    return found


def run_in_group(
    args: list[str], timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, check=True, text=True, **kwargs)`` in a process group of
    its own that is killed whole however the call ends: its ``timeout`` (seconds),
    pytest-timeout's exception, Ctrl-C. A plain ``subprocess.run`` left a ``pip`` that
    its test's timeout interrupted burning a core after the suite."""
    with subprocess.Popen(args, text=True, start_new_session=True, **kwargs) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, args, out, err)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def readme_command(start: str, readme: str | None = None) -> list[str]:
    """The README's command line that starts with ``start`` (its ``\\`` continuations
    joined, a leading ``$ `` dropped), split as the shell would; ``"$tour"`` stays a
    word of its own for the caller to replace. Fails when there is none."""
    text = readme if readme is not None else (REPO / "README.md").read_text()
    lines = text.splitlines()
    for index, line in enumerate(lines):
        line = line.removeprefix("$ ")
        if line.startswith(start):
            command = line
            while command.endswith("\\"):
                index += 1
                command = command[:-1] + " " + lines[index].strip()
            return shlex.split(command.split("  #")[0])
    pytest.fail(f"README.md has no command starting {start!r}")


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the repository that is not in a package (docs/hooks.py,
    protos/generate.py, deployments/release.py) imported as module ``name`` (registered
    in sys.modules, as dataclasses in it need)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def venv_tool(name: str) -> str:
    """The path of program ``name`` from PATH or ``.venv/bin`` (where ``make NAME`` puts
    it), else :func:`missing`."""
    found = shutil.which(name) or next(
        (str(p) for p in [REPO / ".venv" / "bin" / name] if os.access(p, os.X_OK)), None
    )
    if found is None:
        missing(f"{name} is not installed: `make {name}` puts it into .venv/bin")
    return found


# The tiers that need a tool from outside PyPI: (tool, the tests, how to get it).
TIERS = (
    ("kubectl", "the kustomize renderings (tests/deployments/test_deployments.py)",
     "make kubectl"),
    ("helm", "the chart tests (tests/deployments/test_helm.py, test_alerts.py, test_dashboard.py)",
     "make helm"),
    ("promtool", "the alert tests (tests/deployments/test_alerts.py)", "make prometheus"),
    ("prometheus", "the dashboard tests (tests/deployments/test_dashboard.py)", "make prometheus"),
    ("chromium", "the node page's browser tests (tests/plugin/test_nodepage.py)", "make chromium"),
    ("kubectl-numa", "kubectl running top as its plugin (tests/cli/test_top.py)",
     "pip install -e . puts it beside python"),
    ("iptables", "the test cluster's network rules in a namespace (tests/deployments/"
     "test_local_workers.py)", "make iptables: Debian's iptables"),
    ("unshare", "PID 1 and network namespaces (tests/ops/test_signals.py, "
     "tests/deployments/test_local_workers.py)", "Debian's util-linux"),
    ("openssl", "the TLS tests' certificates (tests/cluster/test_kubeapi.py, "
     "tests/nodeconfig/test_apiclient.py)", "Debian's openssl"),
)  # fmt: skip


# The tiers that need the real machines' snapshots beside the checkout: (folder, the
# tests). A clone of the repository alone has no ../shared; its tests skip, and say so.
DATA_TIERS = (
    (SNAPSHOTS, "the real machines' sysfs snapshots (tests/topology/test_topology.py, "
     "tests/cli/test_discover.py, tests/plugin/test_nodepage.py)"),
    (PCI_SNAPSHOTS, "the sysfs roots with PCI devices, disks and NICs "
     "(tests/topology/test_locality.py, test_details.py)"),
)  # fmt: skip


def missing_tiers() -> list[str]:
    """One line per tier whose tool is on neither PATH nor ``.venv/bin``, or whose data
    folder (``../shared``) is absent: what skips."""
    lines = []
    for tool, tests, how in TIERS:
        if shutil.which(tool) or os.access(REPO / ".venv" / "bin" / tool, os.X_OK):
            continue
        lines.append(f"{tool} is absent: {tests} will skip ({how})")
    for folder, tests in DATA_TIERS:
        if not folder.is_dir():
            lines.append(f"{folder} is absent: {tests} will skip (the project's shared "
                         "data beside the checkout; never copied into it)")  # fmt: skip
    return lines


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say at the start which tiers will skip and why, with ``-q`` too (skip reasons are
    otherwise shown only with ``-rs``, at the end)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):  # an xdist worker
        return
    for line in missing_tiers():
        reporter.write_line(line, yellow=True)


def pytest_configure(config: pytest.Config) -> None:
    """Under CI (``CI`` set, see :func:`under_ci`) the real snapshots must be there: a
    missing ../shared is an error, not a row of silent skips."""
    value = os.environ.get("CI")
    if under_ci(value) and not SNAPSHOTS.is_dir():
        raise pytest.UsageError(
            f"CI={value} but {SNAPSHOTS} is absent: clone the project with ../shared beside it"
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave no temporary files: pytest removes passing tests' ``tmp_path`` folders
    (``tmp_path_retention_policy``); drop its per-user root too once it is empty."""
    import getpass

    root = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty: failed tests' folders stay


@pytest.fixture
def sysfs_tree(tmp_path: Path) -> SysfsTree:
    return SysfsTree(tmp_path / "sys")


@pytest.fixture
def two_nodes(tmp_path: Path) -> SysfsTree:
    """A plain 2-socket machine: CPUs 0-3 on node 0, 4-7 on node 1, distances 10/21."""
    tree = build_machine(tmp_path / "sys", nodes=2, cpus_per_node=4)
    tree.write("node/node0/distance", "10 21\n")
    tree.write("node/node1/distance", "21 10\n")
    return tree


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short folder for unix sockets (AF_UNIX paths are limited to 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="ndp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def snapshot_names() -> list[str]:
    if not SNAPSHOTS.is_dir():
        return []
    return sorted(path.name.removesuffix(".tar.gz") for path in SNAPSHOTS.glob("*.tar.gz"))


def unpacked(source: Path, root: Path) -> Path:
    """Every ``NAME.tar.gz`` of ``source`` unpacked into ``root/NAME``; returns ``root``."""
    for archive in source.glob("*.tar.gz"):
        target = root / archive.name.removesuffix(".tar.gz")
        target.mkdir()
        with tarfile.open(archive) as tar:
            extract_all(tar, target)
    return root


def extract_all(tar: tarfile.TarFile, target: Path) -> None:
    """Unpack ``tar`` into ``target`` with the ``tar`` extraction filter (no member
    outside ``target``, through a symlink unpacked before it included; no set-id bits,
    no group or other write). ``extractall(filter=...)`` exists from Python 3.11.4 (and
    3.12); on older 3.11 releases (Debian 12's 3.11.2) each member is checked as the
    filter checks it, just before it is unpacked (so a symlink member is on disk when a
    later member names a path through it), and is refused also when it is a device
    file, a FIFO or a hard link to an absolute path. Raises tarfile.TarError naming the
    first refused member (members before it are unpacked, as with the filter)."""
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(target, filter="tar")
        return
    base = os.path.realpath(target)
    for member in tar.getmembers():
        where = os.path.realpath(os.path.join(base, member.name))
        if os.path.isabs(member.name) or os.path.commonpath([base, where]) != base:
            raise tarfile.TarError(f"{member.name!r} would be unpacked outside {target}")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise tarfile.TarError(f"{member.name!r} is a device file or a FIFO")
        if member.islnk() and os.path.isabs(member.linkname):
            raise tarfile.TarError(f"{member.name!r} is a hard link to {member.linkname!r}")
        member.mode &= 0o755
        tar.extract(member, target)  # checked just above, links unpacked before included


@pytest.fixture(scope="session")
def snapshots_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All snapshots of ../shared/fixtures/sysfs unpacked, one folder each."""
    if not SNAPSHOTS.is_dir():
        pytest.skip(f"{SNAPSHOTS} is absent: real sysfs snapshots come from ../shared")
    return unpacked(SNAPSHOTS, tmp_path_factory.mktemp("snapshots"))


@pytest.fixture(scope="session")
def pci_snapshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole sysfs roots of ../shared/fixtures/sysfs-pci (PCI devices, disks, NICs)
    unpacked, one folder each; skipped without them, a failure under CI."""
    if not PCI_SNAPSHOTS.is_dir():
        message = f"{PCI_SNAPSHOTS} is absent: sysfs roots with PCI devices come from ../shared"
        if under_ci(os.environ.get("CI")):
            pytest.fail(message)
        pytest.skip(message)
    return unpacked(PCI_SNAPSHOTS, tmp_path_factory.mktemp("sysfs-pci"))


@pytest.fixture(autouse=True)
def suite_logging() -> None:
    """Every test starts with the suite's logging (debug, text lines): the level is
    process-wide, and an in-process CLI test (``discover`` configures ``warning``)
    would otherwise leave the next test's log lines unwritten."""
    configure_logging("debug")


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail the test if it leaves asyncio tasks running on its loop."""
    yield
    current = asyncio.current_task()
    for _ in range(50):
        leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not leftover:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"test left {len(leftover)} asyncio task(s) running: {leftover!r}")
