"""Offline tests of how the end-to-end tests wait and what they record: waits that follow
progress (``tests/e2e/waits.py``), kubectl run again when it never reached the API server
(``run_checked``), the progress file's ``waits`` and the run summary's wait lines, and the
network counters a failure records (``test/local/netstate.py``). A fake clock drives the
waits, so nothing here depends on the machine's speed."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e import platforms, progress, waits

sys.path.insert(0, str(REPO / "test" / "local"))
import netstate
import render


class FakeClock:
    """``time.monotonic`` and ``time.sleep`` for :mod:`waits`: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(waits, "time", fake)
    waits.reset()
    yield fake
    waits.reset()


def test_a_wait_without_progress_ends_at_its_timeout_and_says_nothing_changed(
    clock: FakeClock,
) -> None:
    found, failed = waits.wait(lambda: False, 60, "pod to run", interval=2, progress=lambda: "x")
    assert found is False
    assert failed is not None
    assert failed.startswith("timed out after 60 s waiting for pod to run")
    assert "nothing it watches changed" in failed
    (note,) = waits.NOTES
    assert note["outcome"] == "timed out"
    assert note["seconds"] == 60
    assert note["tries"] == 31  # at 0, 2, ... 60
    assert note["progress"] == 0


def test_a_wait_that_sees_progress_goes_on_past_its_timeout_up_to_the_limit(
    clock: FakeClock,
) -> None:
    steps = iter(range(10_000))
    _, failed = waits.wait(lambda: False, 60, "pod to run", interval=2,
                               progress=lambda: next(steps))  # fmt: skip
    assert failed is not None
    assert clock.now - 1000.0 == pytest.approx(60 * waits.PROGRESS_LIMIT)
    assert "it changed" in failed
    assert waits.NOTES[-1]["progress"] > 0


def test_progress_that_stops_gives_a_full_timeout_after_the_last_change(clock: FakeClock) -> None:
    # The view changes at 0..20 s (pulling, creating), then stays.
    def view() -> str:
        return "creating" if clock.now - 1000.0 < 20 else "stuck"

    _, failed = waits.wait(lambda: False, 60, "pod", interval=2, progress=view)
    assert failed is not None
    assert clock.now - 1000.0 == pytest.approx(20 + 60)
    assert waits.NOTES[-1]["progress"] == 1


def test_a_met_wait_returns_the_value_and_notes_its_tries(clock: FakeClock) -> None:
    answers = iter([None, ValueError("not yet"), "ready"])
    found, failed = waits.wait(lambda: _answer(next(answers)), 10, "ready", interval=1)
    assert (found, failed) == ("ready", None)
    assert waits.NOTES == [{"what": "ready", "seconds": 2.0, "outcome": "met", "tries": 3,
                            "progress": 0}]  # fmt: skip


def _answer(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


def test_an_exception_outside_the_tolerated_kinds_ends_the_wait(clock: FakeClock) -> None:
    def broken() -> bool:
        raise KeyError("bug in the check")

    with pytest.raises(KeyError):
        waits.wait(broken, 10, "x")


def test_a_failing_progress_view_is_no_progress(clock: FakeClock) -> None:
    def view() -> str:
        raise OSError("API server slow")

    _, failed = waits.wait(lambda: False, 10, "x", interval=1, progress=view)
    assert failed is not None
    assert clock.now - 1000.0 == pytest.approx(10)


def test_the_summary_groups_waits_by_what_and_keeps_the_last_detail() -> None:
    notes = [
        {"what": "a", "seconds": 2.0, "outcome": "met", "progress": 1},
        {"what": "b", "seconds": 1.0, "outcome": "slow"},
        {"what": "a", "seconds": 5.5, "outcome": "timed out", "progress": 2, "detail": "d"},
    ]
    assert waits.summary(notes) == [
        {"what": "a", "times": 2, "seconds": 7.5, "longest": 5.5,
         "outcomes": {"met": 1, "timed out": 1}, "progress": 3, "detail": "d"},
        {"what": "b", "times": 1, "seconds": 1.0, "longest": 1.0, "outcomes": {"slow": 1},
         "progress": 0},
    ]  # fmt: skip


def fake_kubectl(tmp_path: Path, failures: int, stderr: str) -> list[str]:
    """A command that fails ``failures`` times with ``stderr``, then prints ``done``."""
    counter = tmp_path / "count"
    counter.write_text("0")
    script = tmp_path / "kubectl"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{counter}"); echo $((n + 1)) > "{counter}"\n'
        f'if [ "$n" -lt {failures} ]; then echo "{stderr}" >&2; exit 1; fi\n'
        "echo done\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return [str(script), "exec", "plugin", "--", "numa-device-plugin", "status"]


@pytest.fixture
def no_pause(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(waits, "RETRY_PAUSE", 0.0)
    monkeypatch.delenv("NUMA_E2E_LOCAL", raising=False)
    waits.reset()
    yield
    waits.reset()


UNREACHED = "Unable to connect to the server: dial tcp 10.99.0.1:6443: i/o timeout"


@pytest.mark.usefixtures("no_pause")
def test_kubectl_that_never_reached_the_api_server_runs_again_and_is_noted(
    tmp_path: Path,
) -> None:
    command = fake_kubectl(tmp_path, 2, UNREACHED)
    assert platforms.run_checked(command, timeout=30) == "done\n"
    retried = [n for n in waits.NOTES if n["outcome"] == "retried"]
    assert len(retried) == 2
    assert retried[0]["what"].endswith("to reach the API server")
    assert retried[0]["detail"] == UNREACHED


@pytest.mark.usefixtures("no_pause")
def test_kubectl_that_failed_otherwise_is_not_run_again(tmp_path: Path) -> None:
    command = fake_kubectl(tmp_path, 1, "error: unknown flag --bogus")
    with pytest.raises(AssertionError, match="unknown flag --bogus"):
        platforms.run_checked(command, timeout=30)
    assert (tmp_path / "count").read_text().strip() == "1"
    assert not [n for n in waits.NOTES if n["outcome"] == "retried"]


@pytest.mark.usefixtures("no_pause")
def test_kubectl_that_never_reaches_the_api_server_fails_after_its_retries(
    tmp_path: Path,
) -> None:
    command = fake_kubectl(tmp_path, 99, UNREACHED)
    with pytest.raises(AssertionError, match="i/o timeout"):
        platforms.run_checked(command, timeout=30, retries=3)
    assert (tmp_path / "count").read_text().strip() == "4"


def test_the_progress_record_carries_the_waits() -> None:
    report = pytest.TestReport(
        "tests/e2e/test_x.py::test_y", ("f", 1, "t"), {}, "passed", None, "call", [],
        duration=3.0, user_properties=[("waits", [{"what": "pod", "seconds": 2.0}])],
    )  # fmt: skip
    record = progress.progress_record(report)
    assert record is not None
    assert record["waits"] == [{"what": "pod", "seconds": 2.0}]
    assert record["network"] is None


def test_the_run_summary_names_each_tests_longest_waits() -> None:
    line = {"test": "t::a", "outcome": "passed", "seconds": 99.0, "waits": [
        {"what": "hold-0 to reach Running", "times": 1, "seconds": 80.2,
         "outcomes": {"met": 1}},
        {"what": "`kubectl exec p -- status` to reach the API server", "times": 2,
         "seconds": 61.0, "outcomes": {"retried": 2}},
        {"what": "short", "times": 1, "seconds": 0.1, "outcomes": {"met": 1}},
    ]}  # fmt: skip
    shown = render.progress_summary(json.dumps(line))
    assert "waited 80.2 s for hold-0 to reach Running (1x: 1 met)" in shown
    assert "to reach the API server (2x: 2 retried)" in shown
    assert "for short" not in shown


def test_tcp_counters_are_read_by_name_from_the_header_line() -> None:
    text = (
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm ActiveOpens AttemptFails RetransSegs\nTcp: 1 10 3 7\n"
    )
    assert netstate.protocol_counters(text, "Tcp:", ("AttemptFails", "RetransSegs", "X")) == {
        "AttemptFails": 3, "RetransSegs": 7,
    }  # fmt: skip
    assert netstate.protocol_counters("", "Tcp:", ("ActiveOpens",)) == {}


def test_connects_waiting_for_an_answer_are_counted(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    header = "  sl  local_address rem_address   st tx_queue rx_queue\n"
    rows = [
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n",
        "   1: 0100007F:D2F0 0100630A:1A0B 02 00000001:00000000\n",
        "   2: 0100007F:D2F2 0100630A:1A0B 02 00000001:00000000\n",
        "   3: 0100007F:D2F4 0100630A:1A0B 01 00000000:00000000\n",
    ]
    table.write_text(header + "".join(rows))
    assert netstate.syn_sent(table) == 2
    assert netstate.syn_sent(tmp_path / "missing") == -1


def test_interface_counters_sum_the_pods_veth_pairs(tmp_path: Path) -> None:
    table = tmp_path / "dev"
    table.write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets"
        " errs drop fifo colls carrier compressed\n"
        "  eth0: 100 5 1 2 0 0 0 0 200 7 3 4 0 0 0 0\n"
        "veth1a: 10 2 0 0 0 0 0 0 20 2 0 1 0 0 0 0\n"
        "veth2b: 10 3 0 0 0 0 0 0 20 3 0 1 0 0 0 0\n"
    )
    found = netstate.interfaces(table)
    assert found["eth0"] == {"rx_packets": 5, "tx_packets": 7, "rx_errors": 1, "tx_errors": 3,
                             "rx_dropped": 2, "tx_dropped": 4}  # fmt: skip
    assert found["veth*"]["rx_packets"] == 5
    assert found["veth*"]["tx_dropped"] == 2
    assert sorted(found) == ["eth0", "veth*"]
    assert netstate.interfaces(tmp_path / "missing") == {}


def test_a_connect_that_fails_says_why() -> None:
    found = netstate.connect_seconds("127.0.0.1", 1, timeout=2)
    assert isinstance(found, str)
    assert "ConnectionRefusedError" in found


def test_a_timed_out_wait_of_the_shipped_plugin_says_why_its_container_restarted(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted container's metrics count from zero: a kubelet restart's test once
    waited 450 s for a counter of the run before, and its report did not say the
    liveness probe had restarted the plugin."""
    from types import SimpleNamespace

    from tests.e2e.shipped import ShippedPlatform

    platform = ShippedPlatform.__new__(ShippedPlatform)
    platform.time_scale = 1.0
    status = SimpleNamespace(restart_count=1)
    pod = SimpleNamespace(status=SimpleNamespace(container_statuses=[status]))
    monkeypatch.setattr(platform, "plugin_log", lambda: "line 1\nline 2\n")
    monkeypatch.setattr(platform, "plugin_pod", lambda: pod)
    monkeypatch.setattr(platform, "why_restarted", lambda p: "event: failed liveness probe")
    with pytest.raises(pytest.fail.Exception) as failed:
        platform.eventually(lambda: False, 10, "re-registration")
    message = str(failed.value)
    assert "timed out after 10 s waiting for re-registration" in message
    assert "the plugin's log ends:\nline 1\nline 2" in message
    assert "the plugin's container restarted:\nevent: failed liveness probe" in message

    status.restart_count = 0
    with pytest.raises(pytest.fail.Exception) as failed:
        platform.eventually(lambda: False, 10, "re-registration")
    assert "restarted" not in str(failed.value)
