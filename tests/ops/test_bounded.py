"""The bounded readers every untrusted input goes through: a file (regular files only,
a byte cap), an HTTP GET (a total deadline that a dripping server cannot extend, a
byte cap) and a command (a total deadline and an output cap, killed with its
children)."""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from numa_device_plugin.ops.bounded import BoundError, one_line, read_file, run_command
from numa_device_plugin.ops.httpget import http_get
from numa_device_plugin.ops.yamlfile import read_yaml


def test_read_file_reads_a_regular_file_up_to_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"x" * 10)
    assert read_file(path, 10) == b"x" * 10
    with pytest.raises(BoundError, match=rf"{path} is over 9 bytes"):
        read_file(path, 9)


@pytest.mark.parametrize(
    ("make", "fault"),
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
        (lambda p: p.symlink_to(p), "Too many levels of symbolic links"),
        (lambda p: None, "No such file or directory"),
    ],
    ids=["fifo", "folder", "dev-zero", "symlink-loop", "missing"],
)
def test_read_file_refuses_what_is_not_a_regular_file_without_blocking(
    tmp_path: Path, make: Callable[[Path], None], fault: str
) -> None:
    path = tmp_path / "kubeconfig"
    make(path)
    with pytest.raises(BoundError, match=fault):
        read_file(path, 1 << 20)


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that reads a request's head and hands the connection
    to ``answer``; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                    data += chunk
                with suppress(OSError):
                    answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def drip_after_close_head(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\n")
    for _ in range(400):
        conn.sendall(b"x")
        time.sleep(0.05)


def endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    block = b"y" * 65536
    while True:
        conn.sendall(block)


def test_http_get_cuts_off_a_server_dripping_a_close_delimited_body() -> None:
    with raw_server(drip_after_close_head) as port:
        started = time.monotonic()
        with pytest.raises(BoundError, match="no whole answer from the server at") as caught:
            http_get("127.0.0.1", port, "/", deadline=0.5, limit=1 << 20)
        took = time.monotonic() - started
    assert caught.value.timed_out
    assert took < 3, took


def test_http_get_stops_reading_an_endless_body_at_its_cap() -> None:
    with (
        raw_server(endless) as port,
        pytest.raises(BoundError, match="is over 100000 bytes") as caught,
    ):
        http_get("127.0.0.1", port, "/", deadline=10, limit=100_000)
    assert not caught.value.timed_out


def test_http_get_names_a_refused_connection() -> None:
    with raw_server(lambda conn: None) as port:
        pass
    with pytest.raises(BoundError, match=r"cannot reach the probe at http://127\.0\.0\.1:\d+"):
        http_get("127.0.0.1", port, "/", deadline=5, limit=10, name="the probe")


def assert_gone(pid: int) -> None:
    """Fail unless process ``pid`` ends (or is a zombie) within 5 s: a kill is
    delivered at once, reaping by init may take a moment."""
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} still runs")


def test_run_command_returns_output_and_status() -> None:
    done = run_command(
        [sys.executable, "-c",
         "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        os.environ, deadline=30, limit=100,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


def test_run_command_kills_a_hung_command_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    with pytest.raises(BoundError, match="did not end within 1 s") as caught:
        run_command([sys.executable, "-c", script], os.environ, deadline=1, limit=100)
    assert caught.value.timed_out
    assert time.monotonic() - started < 10
    assert_gone(int(pid_file.read_text()))


def test_run_command_stops_an_endless_output_at_its_cap() -> None:
    with pytest.raises(BoundError, match="printed more than 1000000 bytes"):
        run_command(["cat", "/dev/zero"], os.environ, deadline=30, limit=1_000_000)


def test_run_command_keeps_only_the_end_of_a_long_stderr() -> None:
    done = run_command(
        [sys.executable, "-c", "import sys; sys.stderr.write('a' * 5000 + 'END')"],
        os.environ, deadline=30, limit=100,
    )  # fmt: skip
    assert done.stderr.endswith(b"END")
    assert len(done.stderr) == 100


def test_one_line_escapes_control_characters_and_cuts() -> None:
    assert one_line("a\x1b[31mb\x00c\r\nd") == "a\\x1b[31mb\\x00c d"
    assert one_line("x" * 50, 10) == "x" * 10 + "..."


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("users: [{name: a}]\nusers: []\n", "found the key 'users' twice"),
        ("a: {b: 1, b: 2}\n", "found the key 'b' twice"),
        ("a: !!python/object/apply:os.getpid []\n", "could not determine a constructor"),
        ("a: !!python/name:os.system\n", "could not determine a constructor"),
    ],
)
def test_read_yaml_refuses_duplicate_keys_and_python_tags(
    tmp_path: Path, text: str, fault: str
) -> None:
    """Every YAML the plugin reads (kubeconfigs): a key twice is refused, not the last
    kept, and nothing but plain data is ever built (an unsafe loader would run code)."""
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(BoundError, match=re.escape(fault)) as caught:
        read_yaml(path, 1 << 16)
    assert str(path) in str(caught.value)


def test_read_yaml_reads_plain_data(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("a: {b: 1, c: [x, y]}\n<<: {}\n")
    assert read_yaml(path, 1 << 16) == {"a": {"b": 1, "c": ["x", "y"]}}


def test_http_get_cuts_off_a_server_dripping_its_head_at_the_deadline() -> None:
    """A header line dripped a byte every 50 ms keeps every recv short, and http.client
    reads the whole head in one call: only the cut-off's shutdown of the socket ends it
    (mutant: ``sock.shutdown`` removed; the end-to-end test alone did not notice)."""
    stop = threading.Event()

    def drip_head(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        while not stop.is_set():
            conn.sendall(b"x")
            time.sleep(0.05)

    outcome: list[BaseException | None] = []

    def get(port: int) -> None:
        try:
            http_get("127.0.0.1", port, "/", deadline=0.5, limit=1 << 20)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    with raw_server(drip_head) as port:
        started = time.monotonic()
        caller = threading.Thread(target=get, args=(port,), daemon=True)
        caller.start()
        caller.join(15)
        took = time.monotonic() - started
        stop.set()
    assert not caller.is_alive(), f"http_get still reading the dripped head after {took:.0f} s"
    (error,) = outcome
    assert isinstance(error, BoundError)
    assert error.timed_out
    assert "within 0.5 s" in str(error)


@pytest.mark.parametrize(("printed", "fails"), [(1000, False), (1001, True)])
def test_run_command_takes_exactly_its_cap_of_stdout(printed: int, fails: bool) -> None:
    """Mutant: the cap off by one (``>=``): a command printing exactly ``limit`` bytes
    was refused."""
    argv = [sys.executable, "-c", f"import sys; sys.stdout.write('o' * {printed})"]
    if fails:
        with pytest.raises(BoundError, match="printed more than 1000 bytes"):
            run_command(argv, os.environ, deadline=30, limit=1000)
    else:
        assert run_command(argv, os.environ, deadline=30, limit=1000).stdout == b"o" * 1000
