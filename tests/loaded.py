"""``make test-loaded``: the load-sensitive test files, N rounds, under the load that
broke them.

A flaky test blocks CI, and CI blocks landing; the files here run real ``serve``
processes, wait on timers or measure latency and memory, so they are the ones a busy
machine breaks. Two busy loops once did not reproduce what a second suite running
beside the first did (9 failures in 36 runs), so each round runs the files in two
pytest sessions at once, each on ``-n 2`` workers (``--twins``), beside ``--busy``
busy loops (plain ``python -c 'while True: pass'`` processes, killed by their PIDs
at the end, whatever happens), and prints per file how many rounds it passed in
both sessions.

Usage: python -m tests.loaded [--runs N] [--twins N] [--busy N] [FILE ...]
Exit status: 0 when every file passed every round, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Files that run real serve processes, wait on timers or measure time and memory.
LOAD_SENSITIVE = (
    "tests/test_benchmarks.py",
    "tests/plugin/test_poller.py",
    "tests/plugin/test_endpoint.py",
    "tests/kubelet/test_podresources.py",
    "tests/kubelet/test_watcher.py",
    "tests/cluster/test_kubeapi.py",
    "tests/ops/test_bounded.py",
    "tests/cli/test_health.py",
    "tests/cluster/test_execcredential.py",
    "tests/plugin/test_capacity.py",
    "tests/cli/test_cli.py",
    "tests/cli/test_discover.py",
    "tests/cli/test_demo.py",
    "tests/cli/test_serve_process.py",
    "tests/cli/test_configuration.py",
    "tests/deployments/test_dashboard.py",
    "tests/kubelet/test_kubelet_standin.py",
    "tests/ops/test_limits.py",
    "tests/ops/test_lockfile.py",
    "tests/plugin/test_manager.py",
    "tests/plugin/test_kubelet_restarts.py",
    "tests/plugin/test_loop_errors.py",
    "tests/plugin/test_near_serving.py",
    "tests/plugin/test_memory_sizing.py",
    "tests/plugin/test_nodepage.py",
    "tests/nodeconfig/test_nodeconfig.py",
    "tests/nodeconfig/test_nodeconfig_hostile.py",
    "tests/topology/test_numamemory.py",
    "tests/plugin/test_observability.py",
    "tests/ops/test_probes.py",
    "tests/ops/test_scrape_flood.py",
    "tests/plugin/test_servicer.py",
    "tests/ops/test_signals.py",
    "tests/plugin/test_status.py",
    "tests/cli/test_top.py",
    "tests/cli/test_devices.py",
    "tests/cli/test_check.py",
    "tests/plugin/test_devicewatch.py",
    "tests/topology/test_mount_tree.py",
    "tests/kubelet/test_kubepods.py",
    "tests/plugin/test_podsignal.py",
    "tests/plugin/test_deferred_metrics.py",
    "tests/ops/test_wakeups.py",
    "tests/nodeconfig/test_apiclient.py",
    "tests/plugin/test_firstlook.py",
    "tests/plugin/test_folderwatch.py",
    "tests/cli/test_fakehost.py",
    "tests/cli/test_demo.py",
)


def failed_files(report: Path, files: list[str]) -> set[str]:
    """Those of ``files`` with a failure or error in a JUnit ``report`` (pytest's
    ``--junitxml``: a test's ``classname`` is its module, dotted, then its class), or
    with no test in it at all (a file that does not exist, or was not collected, ran
    nothing: it once counted as a round passed)."""
    modules = {file.removesuffix(".py").replace("/", "."): file for file in files}
    failed: set[str] = set()
    ran: set[str] = set()
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("classname", "")
        bad = case.find("failure") is not None or case.find("error") is not None
        for module, file in modules.items():
            if name == module or name.startswith(module + "."):
                ran.add(file)
                if bad:
                    failed.add(file)
    return failed | (set(files) - ran)


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.loaded", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="rounds (5)")
    parser.add_argument("--twins", type=int, default=2, help="pytest sessions at once (2)")
    parser.add_argument("--workers", type=int, default=2, help="-n of each session (2)")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside them (0)")
    parser.add_argument("files", nargs="*", default=list(LOAD_SENSITIVE))
    args = parser.parse_args(argv)
    passed: Counter[str] = Counter()
    loops = busy_loops(args.busy)
    print(f"busy loops: {' '.join(str(loop.pid) for loop in loops)}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="loaded-") as folder:
            for round_ in range(1, args.runs + 1):
                started = time.monotonic()
                sessions = []
                for twin in range(args.twins):
                    report = Path(folder) / f"round-{round_}-{twin}.xml"
                    process = subprocess.Popen(
                        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-n", str(args.workers), f"--junitxml={report}", *args.files],
                        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    )  # fmt: skip
                    sessions.append((process, report))
                failed: set[str] = set()
                summaries = []
                for process, report in sessions:
                    output, _ = process.communicate()
                    lost = failed_files(report, args.files) if report.exists() else set(args.files)
                    failed |= lost
                    summaries.append((output.strip().splitlines()[-1:] or ["(no output)"])[0])
                    if lost:
                        print(output[-4000:], flush=True)
                for file in args.files:
                    passed[file] += file not in failed
                print(
                    f"round {round_}/{args.runs}: {' | '.join(summaries)} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    finally:
        for loop in loops:
            os.kill(loop.pid, signal.SIGKILL)
            loop.wait()
    print()
    for file in args.files:
        print(f"{passed[file]:>3}/{args.runs}  {file}")
    return 0 if all(passed[file] == args.runs for file in args.files) else 1


if __name__ == "__main__":
    sys.exit(main())
