"""The CI switch of tests/conftest.py: when a missing ../shared is an error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, under_ci


@pytest.mark.parametrize(
    ("value", "ci"),
    [(None, False), ("", False), ("0", False), ("false", False), ("False", False),
     ("true", True), ("1", True), ("yes", True), ("github", True)],
)  # fmt: skip
def test_any_ci_value_but_empty_0_or_false_means_ci(value: str | None, ci: bool) -> None:
    assert under_ci(value) is ci


def fake_python(folder: Path, name: str, version: str | None) -> None:
    """A program ``name`` that answers .ci/oldest-python's question as a Python of
    ``version`` would (None: older than 3.11, or without venv)."""
    (folder / name).write_text(f"#!/bin/sh\necho {version or 'None'}\n")
    (folder / name).chmod(0o755)


def test_ci_runs_the_suite_on_the_oldest_python_it_allows(tmp_path: Path) -> None:
    """CI passed on a newer Python first on PATH while Debian 12's 3.11.2 failed: .ci/run
    takes the oldest 3.11+ the machine has."""
    fake_python(tmp_path, "python3", "3.013.001")
    fake_python(tmp_path, "python3.11", "3.011.001")
    fake_python(tmp_path, "python3.12", None)
    path = f"{tmp_path}:/bin"  # bash and env; /usr/bin/python3 is looked at too
    found = subprocess.run(["bash", str(REPO / ".ci" / "oldest-python")], capture_output=True,
                           text=True, env={"PATH": path}, timeout=30, check=True)  # fmt: skip
    assert found.stdout.strip() == str(tmp_path / "python3.11")
    assert "bash .ci/oldest-python" in (REPO / ".ci" / "run").read_text()
