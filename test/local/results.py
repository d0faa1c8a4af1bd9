"""What a run leaves and says: the guests' logs kept in their results shares, the e2e
progress files summarised on any exit (:func:`print_progress`), and the verdict on the
host being left as it was (:func:`report`).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import render
from plan import log


def keep_logs(logs: Path, results: Path) -> None:
    """Copy a guest's process logs into its results share (they come back to the host)."""
    with contextlib.suppress(OSError):
        shutil.copytree(logs, results, dirs_exist_ok=True)


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
