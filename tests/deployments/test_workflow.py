"""The public repository's CI workflow (.github/workflows/ci.yaml), offline: valid for
GitHub's workflow schema (check-jsonschema's vendored copy), no finding of zizmor's
audits (pinned actions, no credentials persisted, no template injection), every ``run``
script clean under shellcheck as the bash GitHub runs it with, and the jobs calling what
this repository runs: ``.ci/run``, and on a tag ``make release … --tagged``."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, venv_tool

WORKFLOW = REPO / ".github" / "workflows" / "ci.yaml"


def workflow() -> dict[Any, Any]:
    document: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return document


def test_the_workflow_is_valid_for_githubs_schema() -> None:
    result = subprocess.run(
        [venv_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
         str(WORKFLOW)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_finds_nothing() -> None:
    result = subprocess.run(
        [venv_tool("zizmor"), "--offline", "--no-progress", str(WORKFLOW)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("job", "step"),
    [(job, index) for job, spec in workflow()["jobs"].items()
     for index, step in enumerate(spec["steps"]) if "run" in step],
)  # fmt: skip
def test_every_run_script_passes_shellcheck(job: str, step: int, tmp_path: Path) -> None:
    script = tmp_path / "step.sh"
    # GitHub's default shell on Linux: bash -e; ${{ }} expressions are kept out of scripts.
    text = workflow()["jobs"][job]["steps"][step]["run"]
    assert "${{" not in text, "expressions go through env:, never into the script"
    script.write_text("#!/usr/bin/env bash\nset -e\n" + text)
    result = subprocess.run([venv_tool("shellcheck"), str(script)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_the_jobs_run_what_this_repository_runs() -> None:
    jobs = workflow()["jobs"]
    assert [s["run"] for s in jobs["test"]["steps"] if "run" in s] == ["bash .ci/run"]
    assert jobs["test"]["timeout-minutes"] <= 90
    release = "\n".join(s.get("run", "") for s in jobs["release"]["steps"])
    assert 'make release VERSION="${GITHUB_REF_NAME#v}"' in release
    assert "RELEASE_FLAGS=--tagged" in release
    assert jobs["release"]["needs"] == "test"
    assert jobs["release"]["if"] == "startsWith(github.ref, 'refs/tags/v')"
    on = workflow()[True]  # YAML 1.1 reads the key "on" as True
    assert on["push"]["tags"] == ["v*.*.*"]
