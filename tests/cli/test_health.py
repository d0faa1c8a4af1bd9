"""``numa-device-plugin health`` against listeners that misbehave: one total deadline
(a drip cannot extend it), a cap on the answer, any bytes in the body."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from numa_device_plugin.cli import health, main
from tests.ops.test_bounded import drip_after_close_head, endless, raw_server


def answer_with(status: str, body: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    return answer


def test_health_prints_a_200_body_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(answer_with("200 OK", b"ok\n")) as port:
        assert main(["health", "--address", f"127.0.0.1:{port}"]) == 0
    assert capsys.readouterr().out == "ok\n"


def test_health_shows_a_non_utf8_failure_body_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with raw_server(answer_with("503 Service Unavailable", b"not ready \xff\xfe")) as port:
        assert main(["health", "--address", f"127.0.0.1:{port}"]) == 1
    assert capsys.readouterr().err == "not ready \ufffd\ufffd\n"


def test_health_gives_up_on_a_drip_at_its_total_deadline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(health, "DEADLINE", 0.5)
    with raw_server(drip_after_close_head) as port:
        started = time.monotonic()
        assert main(["health", "--address", f"127.0.0.1:{port}"]) == 1
        assert time.monotonic() - started < 5
    assert "no whole answer from the plugin's probe listener" in capsys.readouterr().err


def test_health_stops_reading_an_endless_body(capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(endless) as port:
        assert main(["health", "--address", f"127.0.0.1:{port}"]) == 1
    assert f"is over {health.MAX_ANSWER} bytes" in capsys.readouterr().err
