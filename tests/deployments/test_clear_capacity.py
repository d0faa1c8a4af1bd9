"""deployments/clear-capacity.sh (the Uninstall page's command) against a stand-in
kubectl: it removes exactly the prefix's entries at 0 from each node's capacity and
allocatable, leaves entries the kubelet still counts (naming them, exit 1), and refuses
a bad prefix (exit 2). tests/e2e/test_workers.py runs it on the test cluster."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, venv_tool

SCRIPT = REPO / "deployments" / "clear-capacity.sh"


def run(tmp_path: Path, entries: list[str], *args: str) -> tuple[int, str, list[list[str]]]:
    """The script with a kubectl that lists ``entries`` (``node name value``) and logs
    each patch as JSON (the allocatable patch of ``node-b`` fails, as for a key absent)."""
    calls = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    listing = tmp_path / "listing"
    listing.write_text("".join(f"{line}\n" for line in entries))
    kubectl.write_text(f"""#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
if args[:2] == ["get", "nodes"]:
    sys.stdout.write(open({str(listing)!r}).read()); sys.exit(0)
with open({str(calls)!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[2] == "node-b" and "allocatable" in args[-1]:
    sys.exit(1)
""")
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IXUSR)
    result = subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}"),
    )  # fmt: skip
    patches = (
        [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    )
    return result.returncode, result.stdout + result.stderr, patches


def removed(patches: list[list[str]]) -> list[tuple[str, str]]:
    return [(p[2], json.loads(p[-1])[0]["path"]) for p in patches]


def test_it_removes_the_prefixs_entries_at_0_and_names_the_ones_still_counted(
    tmp_path: Path,
) -> None:
    code, out, patches = run(tmp_path, [
        "node-a cpu 4", "node-a numa-align/numa-0 0", "node-a numa-align/numa-1-memory 0",
        "node-a example.com/numa-0 0", "node-b numa-align/numa-0 100",
        "node-b numa-align/data-disk 0",
    ])  # fmt: skip
    assert code == 1, out
    assert removed(patches) == [
        ("node-a", "/status/capacity/numa-align~1numa-0"),
        ("node-a", "/status/allocatable/numa-align~1numa-0"),
        ("node-a", "/status/capacity/numa-align~1numa-1-memory"),
        ("node-a", "/status/allocatable/numa-align~1numa-1-memory"),
        ("node-b", "/status/capacity/numa-align~1data-disk"),
        ("node-b", "/status/allocatable/numa-align~1data-disk"),
    ]
    assert all(p[:4] == ["patch", "node", p[2], "--subresource=status"] for p in patches)
    assert "node-b: numa-align/numa-0 is still 100" in out
    assert "run this again later" in out
    assert "node-b: numa-align/data-disk removed" in out  # its allocatable patch failed: fine


def test_nothing_left_exits_0_and_another_prefix_is_its_own(tmp_path: Path) -> None:
    code, out, patches = run(tmp_path, ["n1 numa-align/numa-0 0", "n1 numa.example.com/numa-0 0"],
                             "numa.example.com")  # fmt: skip
    assert code == 0, out
    assert removed(patches) == [
        ("n1", "/status/capacity/numa.example.com~1numa-0"),
        ("n1", "/status/allocatable/numa.example.com~1numa-0"),
    ]


@pytest.mark.parametrize("args", [["Numa"], ["a/b"], ["numa-align", "extra"]])
def test_a_bad_prefix_exits_2_with_usage(tmp_path: Path, args: list[str]) -> None:
    code, out, patches = run(tmp_path, ["n1 numa-align/numa-0 0"], *args)
    assert code == 2
    assert "usage:" in out
    assert patches == []


def test_the_script_passes_shellcheck() -> None:
    result = subprocess.run([venv_tool("shellcheck"), str(SCRIPT)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout
