"""``top``'s reads of the API server against hostile servers and inputs: one total
deadline (``--timeout``) for the whole command, the exec plugin included and killed
with its children; bounded pages, answers and totals; escaped error text."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cluster import kubeapi
from tests.apiserver_stub import kubeconfig_text
from tests.conftest import REPO
from tests.ops.test_bounded import assert_gone, drip_after_close_head, raw_server


def answer_json(document: object, status: str = "200 OK") -> bytes:
    body = json.dumps(document).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


Top = Callable[..., tuple[int, str, float]]


@pytest.fixture
def top(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Top:
    """``top(answer, *args)``: run ``top`` against a raw server answering each request
    with ``answer(conn)``: (exit code, stderr, seconds)."""

    def go(answer: Callable[[socket.socket], None], *args: str) -> tuple[int, str, float]:
        with raw_server(answer) as port:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(kubeconfig_text(f"http://127.0.0.1:{port}"))
            started = time.monotonic()
            code = main(["top", "--kubeconfig", str(kubeconfig), *args])
            took = time.monotonic() - started
        return code, capsys.readouterr().err, took

    return go


def test_endless_empty_continue_pages_end_at_the_page_cap_or_the_deadline(top: Top) -> None:
    """Once 100,000 requests and 124 s even with --timeout 3."""
    asked: list[int] = []

    def endless(conn: socket.socket) -> None:
        asked.append(1)
        conn.sendall(answer_json({"kind": "NodeList", "items": [], "metadata": {"continue": "x"}}))

    code, err, took = top(endless, "--timeout", "5")
    assert code == 1
    assert "did not end within 2000 pages" in err or "not done within 5 s" in err, err
    assert len(asked) <= kubeapi.MAX_PAGES
    assert took < 15


def test_endless_large_pages_stop_at_the_total_cap(
    top: Top, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Endless 4 MiB pages once took 3 GB in 18 s."""
    monkeypatch.setattr(kubeapi, "MAX_TOTAL", 8 << 20)
    page = answer_json(
        {"kind": "NodeList", "items": [], "metadata": {"continue": "x", "pad": "p" * (1 << 20)}}
    )
    code, err, _ = top(lambda conn: conn.sendall(page), "--timeout", "60")
    assert code == 1
    assert f"the answers are over {8 << 20} bytes in all" in err


def test_an_answer_over_the_cap_is_refused(top: Top, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeapi, "MAX_ANSWER", 1000)
    page = answer_json({"kind": "NodeList", "items": [], "pad": "p" * 2000})
    code, err, _ = top(lambda conn: conn.sendall(page))
    assert code == 1
    assert "the answer is over 1000 bytes" in err


def test_a_server_dripping_its_answer_is_cut_off_at_the_total_deadline(top: Top) -> None:
    code, err, took = top(drip_after_close_head, "--timeout", "1")
    assert code == 1
    assert "not done within 1 s (--timeout)" in err
    assert took < 6


@pytest.mark.parametrize(
    ("document", "fault"),
    [
        ({"kind": "Status", "status": "Success"}, "not a NodeList object (kind 'Status')"),
        ({"kind": "PodList", "items": []}, "not a NodeList object (kind 'PodList')"),
        ([1, 2], "not a NodeList object"),
    ],
)
def test_a_200_answer_of_the_wrong_kind_is_refused(top: Top, document: object, fault: str) -> None:
    code, err, _ = top(lambda conn: conn.sendall(answer_json(document)))
    assert code == 1
    assert fault in err


def test_an_api_error_is_printed_with_its_control_characters_escaped(top: Top) -> None:
    refusal = {"kind": "Status", "message": "no \x1b[31mred\x1b[0m\r\nhere"}
    code, err, _ = top(lambda conn: conn.sendall(answer_json(refusal, "403 Forbidden")))
    assert code == 1
    assert "403 Forbidden: no \\x1b[31mred\\x1b[0m here" in err
    assert "\x1b" not in err


def test_an_exec_plugin_that_hangs_is_killed_with_its_children_at_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "child.pid"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    plugin.chmod(0o755)
    document = json.loads(kubeconfig_text("http://127.0.0.1:9"))
    document["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./plugin"}
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(document))
    started = time.monotonic()
    code = main(["top", "--kubeconfig", str(tmp_path / "kubeconfig"), "--timeout", "2"])
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1
    assert "did not end within" in err or "not done within 2 s" in err, err
    assert took < 10
    assert_gone(int(pid_file.read_text()))


def test_a_kubeconfig_that_is_a_fifo_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "kubeconfig")
    code = main(["top", "--kubeconfig", str(tmp_path / "kubeconfig"), "--timeout", "30"])
    assert code == 1
    assert "not a regular file" in capsys.readouterr().err


def test_the_total_deadline_restores_the_previous_alarm() -> None:
    import signal

    previous = signal.getsignal(signal.SIGALRM)
    with kubeapi.total_deadline(30) as deadline:
        assert 0 < deadline.left() <= 30
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    assert signal.getsignal(signal.SIGALRM) == previous
    with pytest.raises(kubeapi.DeadlinePassed), kubeapi.total_deadline(0.2):
        time.sleep(5)


def test_insecure_skip_tls_verify_reads_without_a_warning_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As kubectl does: the kubeconfig asked for it; urllib3's InsecureRequestWarning
    once preceded every answer (two lines each on stderr)."""
    from tests.apiserver_stub import make_tls, node_api
    from tests.conftest import require_tool

    require_tool("openssl", "the Debian package openssl makes the test certificates")
    tls = make_tls(tmp_path / "tls")
    with node_api("n1", tmp_path, tls=tls) as (_, kubeconfig):
        document = json.loads(kubeconfig.read_text())
        cluster = document["clusters"][0]["cluster"]
        del cluster["certificate-authority"]
        cluster["insecure-skip-tls-verify"] = True
        kubeconfig.write_text(json.dumps(document))
        # A process of its own: pytest would catch the warning before stderr.
        done = subprocess.run(
            [sys.executable, "-m", "numa_device_plugin", "top", "--kubeconfig", str(kubeconfig)],
            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )  # fmt: skip
    code, err = done.returncode, done.stderr
    assert code == 1  # the node stand-in serves no lists: a 404, said in one line
    assert "404" in err
    assert "InsecureRequestWarning" not in err
    assert err.count("\n") == 1, err


def test_the_total_deadline_puts_back_a_timer_set_before_it() -> None:
    """Mutant: the previous ITIMER_REAL not restored: an outer alarm (a caller's own
    deadline) was silently cancelled by an inner total deadline."""
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 20, 5)
        with kubeapi.total_deadline(30):
            time.sleep(0.05)
        delay, interval = signal.getitimer(signal.ITIMER_REAL)
        assert 19 < delay <= 20, "the outer timer is back, less the time spent inside"
        assert interval == 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert fired == []


def test_a_read_slow_to_connect_still_ends_at_its_own_deadline(tmp_path: Path) -> None:
    """A read's deadline counts its connect. An API server whose accept queue is full
    (a loaded machine) drops the SYN and the kernel sends it again 1 s later; the read
    then once waited its whole deadline again after connecting, so a slow plugin pod's
    read ran past ``devices``' --timeout (CI: ``not done within 12 s``)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    filler = socket.create_connection(listener.getsockname())  # the accept queue is full
    accepted: list[float] = []
    held: list[socket.socket] = []

    def accept_late() -> None:
        time.sleep(0.3)
        held.append(listener.accept()[0])  # room for one: the read's next SYN gets in
        held.append(listener.accept()[0])  # the read's connection, never answered
        accepted.append(time.monotonic())

    port = listener.getsockname()[1]
    (tmp_path / "kubeconfig").write_text(kubeconfig_text(f"http://127.0.0.1:{port}"))
    thread = threading.Thread(target=accept_late, daemon=True)
    try:
        with kubeapi.total_deadline(30) as total:
            api = kubeapi.KubeApi(tmp_path / "kubeconfig", total)
            thread.start()
            started = time.monotonic()
            with pytest.raises(kubeapi.DeadlinePassed):
                api.get("/api/v1/namespaces/kube-system/pods/p:8080/proxy/debug/state",
                        None, kubeapi.Deadline(2.0))  # fmt: skip
            took = time.monotonic() - started
            api.close()
    finally:
        for conn in [listener, filler, *held]:
            conn.close()
    assert accepted, "the read never connected"
    assert accepted[0] - started > 0.8, "the premise: a connect slowed by 1 s"
    assert took < 2.5, f"{took:.2f} s for a 2 s deadline"


@pytest.mark.parametrize("thread", ["main", "reader"])
def test_a_read_dripping_its_answer_ends_at_its_own_deadline(tmp_path: Path, thread: str) -> None:
    """A plugin pod's read (``devices``, ``check``: in a reader thread, no SIGALRM)
    ends at its own deadline however slowly its answer drips: the body was once read in
    64 KiB blocks, the deadline checked between them, so a drip held the reader (and
    the command, waiting for it) until the command's --timeout."""
    caught: list[BaseException] = []

    def read(api: kubeapi.KubeApi) -> None:
        try:
            api.get("/api/v1/namespaces/kube-system/pods/p:8080/proxy/debug/state",
                    None, kubeapi.Deadline(1.0))  # fmt: skip
        except BaseException as exc:  # DeadlinePassed is no Exception
            caught.append(exc)

    with raw_server(drip_after_close_head) as port:
        (tmp_path / "kubeconfig").write_text(kubeconfig_text(f"http://127.0.0.1:{port}"))
        with kubeapi.total_deadline(30) as total:
            api = kubeapi.KubeApi(tmp_path / "kubeconfig", total)
            started = time.monotonic()
            if thread == "main":
                read(api)
            else:
                reader = threading.Thread(target=read, args=(api,))
                reader.start()
                reader.join(20)
            took = time.monotonic() - started
            api.close()
    assert [type(exc) for exc in caught] == [kubeapi.DeadlinePassed]
    assert took < 2.5, f"{took:.2f} s for a 1 s deadline (the drip lasts 20 s)"
