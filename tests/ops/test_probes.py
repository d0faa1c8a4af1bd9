"""The HTTP listeners under a hostile client: slow and oversized request heads, more
connections than the cap, a slowloris crowd against a real ``serve`` process (no
thread per connection), and the probe the shipped DaemonSet runs."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops import probes
from numa_device_plugin.ops.probes import MAX_REQUEST, ProbeServer
from numa_device_plugin.topology.fake import SysfsTree
from tests.conftest import REPO
from tests.standin_helpers import (
    eventually,
    held_port,
    live_plugin,
    serve_process,
    wait_all_live,
)

NAMES = ["numa-align/numa-0", "numa-align/numa-1"]


@asynccontextmanager
async def listening(**kwargs: float) -> AsyncIterator[ProbeServer]:
    server = ProbeServer(("127.0.0.1", 0), lambda: [], lambda: b"x 1\n", **kwargs)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def ask(port: int, request: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    """Send ``request`` on a new connection; everything the server answers before closing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


async def idle_connection(port: int) -> asyncio.StreamWriter:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    return writer


async def test_a_slow_request_head_gets_408_and_is_closed() -> None:
    async with listening(read_timeout=0.3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost:")  # and never the rest
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ")
        await eventually(lambda: server.connections == 0)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * MAX_REQUEST + b" HTTP/1.1\r\n\r\n", b"431"),
        (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n", b"431"),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"\x16\x03\x01 hello\r\n\r\n", b"400"),
        (b"GET /nothing HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /healthz?x=1 HTTP/1.0\r\n\r\n", b"200"),
        (b"GET /metrics HTTP/1.1\r\n\r\n", b"200"),
    ],
    ids=["long-path", "many-headers", "post", "tls", "unknown-path", "query", "metrics"],
)
async def test_every_request_gets_one_bounded_answer(request_bytes: bytes, status: bytes) -> None:
    async with listening() as server:
        answer = await ask(server.port, request_bytes)
        assert answer.split(b" ", 2)[1] == status
        assert b"Connection: close" in answer
        await eventually(lambda: server.connections == 0)


async def test_connections_beyond_the_cap_are_refused_or_evict_the_oldest() -> None:
    """Idle connections never pass the cap (a newcomer past it evicts an idle one, or is
    refused); once they are older than the eviction age, a prober gets in and is
    answered at once."""
    async with listening(max_connections=8) as server:
        crowd = [await idle_connection(server.port) for _ in range(40)]
        try:
            await eventually(
                lambda: server.connections == 8 and server.refused + server.evicted > 0
            )
            answers = []
            for _ in range(5):
                try:
                    answers.append(await ask(server.port))
                except ConnectionError:
                    await asyncio.sleep(0.3)  # all 8 younger than 50 ms: refused, try again
                    continue
                if answers[-1]:
                    break
                await asyncio.sleep(0.3)
            assert answers, "never answered"
            assert answers[-1].startswith(b"HTTP/1.1 200 ")
            assert server.evicted >= 1
            assert server.connections <= 8
        finally:
            for writer in crowd:
                writer.close()
        await eventually(lambda: server.connections == 0)


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


async def test_a_slowloris_crowd_makes_no_threads_and_the_probes_still_answer(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """2,000 half-open connections once made 2,015 threads (one per connection)."""
    async with live_plugin(two_nodes, sock_dir, NAMES) as (_, plugin, port):
        before = threads_of(plugin.pid)
        crowd = []
        try:
            for _ in range(600):
                writer = await idle_connection(port)
                writer.write(b"GET /healthz HTTP/1.1\r\n")  # a head that never ends
                crowd.append(writer)
            await asyncio.sleep(0.1)  # the crowd is older than the eviction age
            answer = b""
            for _ in range(5):
                try:
                    answer = await ask(port, b"GET /readyz HTTP/1.1\r\n\r\n")
                    break
                except ConnectionError:
                    await asyncio.sleep(0.3)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert threads_of(plugin.pid) <= before + 1, "a thread per connection"
        finally:
            for writer in crowd:
                writer.close()
        assert await plugin.terminate() == 0


async def test_the_shipped_daemonsets_probes_pass(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DaemonSet as rendered (args, ConfigMap, env), its host folders and ports
    moved under the test's: its httpGet probes pass on port `health`, and the exec
    probe the README documents (`numa-device-plugin health`, default: the metrics
    port) passes on port `metrics`."""
    from tests.deployments.test_deployments import by_kind, container

    spec = container()
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    local = {number: held_port() for number in ports.values()}

    def moved(text: str) -> str:
        for number, port in local.items():
            text = text.replace(f":{number}", f"127.0.0.1:{port}")
        text = text.replace("/var/lib/kubelet/device-plugins", str(sock_dir))
        if text == "/sys":
            return str(two_nodes.root)
        return text.replace("=/sys", f"={two_nodes.root}")

    env = {key: moved(value) for key, value in by_kind("ConfigMap")["data"].items()}
    # the container's own variables (its fixed settings: socket folder, sysfs, probes)
    env.update({item["name"]: moved(item["value"]) for item in spec.get("env", [])})
    env["NUMA_LOG_FORMAT"] = "json"  # the test reads the log
    args = [moved(arg) for arg in spec.get("args", [])]
    for variable in [v for v in os.environ if v.startswith("NUMA_")]:
        monkeypatch.delenv(variable)
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(two_nodes, sock_dir, *args, env=env) as plugin,
    ):
        await wait_all_live(kubelet, NAMES, timeout=20)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = spec[probe]["httpGet"]
            port = local[ports[get["port"]]]

            async def passes(path: str = get["path"], port: int = port) -> bool:
                answer = await ask(port, f"GET {path} HTTP/1.1\r\n\r\n".encode())
                return answer.startswith(b"HTTP/1.1 200 ")

            async with asyncio.timeout(10):
                while not await passes():  # noqa: ASYNC110 - a probe is polled, as the kubelet does
                    await asyncio.sleep(0.1)
        metrics = f"127.0.0.1:{local[ports['metrics']]}"
        for check in ("readyz", "healthz"):
            result = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "numa_device_plugin", "health", "--address", metrics,
                 "--check", check],
                capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
            )  # fmt: skip
            assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
        assert await plugin.terminate() == 0


async def test_a_client_that_reads_nothing_is_cut_off_after_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probes, "WRITE_TIMEOUT", 0.5)
    body = b"x" * (32 << 20)  # far more than the socket buffers hold
    server = probes.ProbeServer(("127.0.0.1", 0), list, lambda: body)
    await server.start()
    client = socket.create_connection(("127.0.0.1", server.port))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        while server.connections == 0 and time.monotonic() - started < 5:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        while server.connections and time.monotonic() - started < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
        assert server.connections == 0, "the connection was dropped"
        assert took < 3, took
    finally:
        client.close()
        await server.stop()


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/nope"])
async def test_head_is_answered_without_a_body(path: str) -> None:
    """Mutant: HEAD answered with a body."""
    probes = ProbeServer(("127.0.0.1", 0), list, lambda: b"x 1\n")
    await probes.start()
    try:

        def ask() -> bytes:
            with socket.create_connection(("127.0.0.1", probes.port), timeout=5) as client:
                client.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                data = b""
                while chunk := client.recv(4096):
                    data += chunk
                return data

        answer = await asyncio.to_thread(ask)
    finally:
        await probes.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert body == b""
    assert b"Content-Length: 0" not in head, "the length of the body a GET would get"


async def test_at_most_max_scrapes_are_served_at_once_the_next_is_refused() -> None:
    """Mutant: 9 concurrent scrapes served where the cap is 8 (``>`` for ``>=``)."""
    import threading

    release = threading.Event()

    def slow_render() -> bytes:
        release.wait(10)
        return b"x 1\n"

    server = ProbeServer(("127.0.0.1", 0), list, slow_render)
    await server.start()
    try:
        port = server.port
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        first = [asyncio.create_task(ask(port, request)) for _ in range(probes.MAX_SCRAPES)]
        async with asyncio.timeout(10):
            while server._scrapes < probes.MAX_SCRAPES:  # noqa: ASYNC110 - in-flight count
                await asyncio.sleep(0.01)
        refused = await ask(port, request)
        release.set()
        answers = await asyncio.gather(*first)
    finally:
        release.set()
        await server.stop()
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert b"too many scrapes at once" in refused
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    assert server.scrapes_refused == 1


async def test_a_prober_inside_a_burst_of_young_connections_is_answered_not_refused() -> None:
    """The kernel hands connections over in batches (a full accept queue's SYNs come
    back 1 s, then 3 s later): a crowd accepted within a millisecond filled every slot
    and a kubelet probe right behind it was reset, all being younger than EVICT_AGE.
    Here the loop is held while the crowd and then the probe connect, so they arrive as
    one batch: the probe is answered, an idle member of the crowd evicted."""
    import threading

    async with listening(max_connections=16) as server:
        made: dict[str, object] = {}

        def arrive() -> None:  # blocking sockets, while the loop is held
            made["crowd"] = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
                             for _ in range(16)]  # fmt: skip
            probe = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            made["probe"] = probe

        arrival = threading.Thread(target=arrive)
        arrival.start()
        arrival.join(10)  # on the loop's thread: nothing is accepted meanwhile
        probe = made["probe"]
        assert isinstance(probe, socket.socket)

        def answer() -> bytes:
            probe.settimeout(5)
            return probe.recv(64)

        try:
            assert (await asyncio.to_thread(answer)).startswith(b"HTTP/1.1 200 ")
            assert server.refused == 0
            assert server.evicted >= 1
        finally:
            probe.close()
            for sock in made.get("crowd", []):  # type: ignore[attr-defined]
                sock.close()
