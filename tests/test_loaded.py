"""``make test-loaded``'s reading of pytest's JUnit report: which files failed."""

from __future__ import annotations

from pathlib import Path

from tests.loaded import LOAD_SENSITIVE, REPO, failed_files

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.plugin.test_capacity" name="test_a"/>
<testcase classname="tests.plugin.test_capacity" name="test_b"><failure message="x"/></testcase>
<testcase classname="tests.plugin.test_status" name="test_c"><error message="y"/></testcase>
<testcase classname="tests.test_status_more.TestThing" name="test_d"/>
<testcase classname="tests.ops.test_probes" name="test_e"><skipped message="z"/></testcase>
</testsuite></testsuites>"""


def test_failed_files_are_read_per_module(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(REPORT)
    files = [
        "tests/plugin/test_capacity.py",
        "tests/plugin/test_status.py",
        "tests/ops/test_probes.py",
    ]
    assert failed_files(report, files) == {
        "tests/plugin/test_capacity.py",
        "tests/plugin/test_status.py",
    }


def test_a_file_that_ran_no_test_failed_its_round(tmp_path: Path) -> None:
    """A misspelt file ("no tests ran", a collection error) counted as a round passed:
    3/3 for a file that does not exist."""
    report = tmp_path / "r.xml"
    report.write_text(REPORT)
    files = ["tests/ops/test_probes.py", "tests/cluster/test_nothing_here.py"]
    assert failed_files(report, files) == {"tests/cluster/test_nothing_here.py"}


def test_every_load_sensitive_file_exists() -> None:
    for file in LOAD_SENSITIVE:
        assert (REPO / file).is_file(), file
