"""The API server stand-in (``kubelet_standin/apiserver.py``) that ``top``, ``devices``,
``check`` and per-node configuration are tested against: a client that hangs up before
its answer is written is no error (under load ``top`` gives a request up at its
deadline, and the stand-in's traceback once landed in the stderr a test checks), while
any other failure of the stand-in is still printed."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import urllib.request
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin.apiserver import json_api


def hang_up_after_asking(kubeconfig: Path, asked: threading.Event) -> None:
    """GET something, then close with a reset (SO_LINGER 0) before any answer."""
    server = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\n\r\n")
        asked.wait(10)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_that_hangs_up_before_its_answer_prints_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    asked, closed, answered = threading.Event(), threading.Event(), threading.Event()

    def answer(path: str, token: str) -> tuple[int, dict[str, object]]:
        asked.set()
        closed.wait(10)  # the client is gone before a byte of the answer is written
        answered.set()
        return 200, {"kind": "NodeList", "items": ["x" * 100_000] * 10}

    with json_api(answer, tmp_path) as kubeconfig:
        hang_up_after_asking(kubeconfig, asked)
        closed.set()
        assert answered.wait(10)
    assert capfd.readouterr().err == ""


def test_any_other_failure_of_the_stand_in_is_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def answer(path: str, token: str) -> tuple[int, dict[str, object]]:
        raise ValueError("a bug in the stand-in")

    with json_api(answer, tmp_path) as kubeconfig:
        server = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        # The stand-in closes the connection unanswered once it has printed the error.
        with pytest.raises(http.client.RemoteDisconnected):
            urllib.request.urlopen(f"{server}/api/v1/nodes", timeout=10)
    assert "ValueError: a bug in the stand-in" in capfd.readouterr().err
