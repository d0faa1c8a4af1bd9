"""The CI switch of tests/conftest.py: when a missing ../shared is an error."""

from __future__ import annotations

import shutil
import subprocess
import sys
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


def fake_python(folder: Path, name: str, version: tuple[int, int, int], venv: bool = True) -> None:
    """A program ``name`` that is this machine's Python pretending to be ``version``
    (its ``sys.version_info``), without the venv module when ``venv`` is false: the
    script's own check runs in it, as on a real interpreter."""
    blocked = folder / f"{name}-without-venv"
    if not venv:
        blocked.mkdir()
        (blocked / "venv.py").write_text("raise ImportError('no venv here')\n")
    prelude = f"import sys; sys.version_info = {version!r}\n"
    (folder / name).write_text(
        "#!/bin/sh\n"
        + (f"export PYTHONPATH='{blocked}'\n" if not venv else "")
        + f'[ "$1" = -c ] && exec {sys.executable} -c "{prelude}$2"\n'
        + f'exec {sys.executable} "$@"\n'
    )
    (folder / name).chmod(0o755)


def oldest(path: Path, system: Path) -> str:
    """What .ci/oldest-python prints with only ``path`` on PATH (bash run by its full
    path) and ``system`` as the system's folder: the machine's own Pythons unseen."""
    bash = shutil.which("bash")
    assert bash is not None
    found = subprocess.run([bash, str(REPO / ".ci" / "oldest-python")], capture_output=True,
                           text=True, env={"PATH": str(path), "SYSTEM_BIN": str(system)},
                           timeout=60, check=True)  # fmt: skip
    return found.stdout.strip()


def test_ci_runs_the_suite_on_the_oldest_python_it_allows(tmp_path: Path) -> None:
    """CI passed on a newer Python first on PATH while Debian 12's 3.11.2 failed: .ci/run
    takes the oldest 3.11+ the machine has, among those with venv."""
    on_path, system = tmp_path / "path", tmp_path / "usr-bin"
    on_path.mkdir()
    system.mkdir()
    fake_python(on_path, "python3", (3, 13, 1))
    fake_python(on_path, "python3.11", (3, 11, 9))
    fake_python(on_path, "python3.12", (3, 12, 0), venv=False)  # no venv: never taken
    fake_python(system, "python3", (3, 11, 2))
    assert oldest(on_path, system) == str(system / "python3")
    fake_python(system, "python3", (3, 10, 12))  # too old: never taken
    assert oldest(on_path, system) == str(on_path / "python3.11")
    fake_python(on_path, "python3.11", (3, 11, 1), venv=False)
    assert oldest(on_path, system) == str(on_path / "python3")
    assert "bash .ci/oldest-python" in (REPO / ".ci" / "run").read_text()


def test_with_no_python_that_qualifies_it_says_python3(tmp_path: Path) -> None:
    fake_python(tmp_path, "python3", (3, 9, 0))
    assert oldest(tmp_path, tmp_path / "nothing") == "python3"


def test_the_banner_names_a_missing_shared_folder_with_its_tests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fresh clone without ../shared skipped 31 tests while the banner named only
    Chromium: every data tier that will skip is named, with its tests."""
    from tests import conftest

    absent = tmp_path / "shared" / "fixtures" / "sysfs"
    monkeypatch.setattr(conftest, "DATA_TIERS", ((absent, "the snapshots' tests"),))
    lines = conftest.missing_tiers()
    assert f"{absent} is absent: the snapshots' tests will skip" in "\n".join(lines)
    monkeypatch.setattr(conftest, "DATA_TIERS", ((tmp_path, "present"),))
    assert not [line for line in conftest.missing_tiers() if str(tmp_path) in line]
