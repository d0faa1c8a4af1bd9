"""The HTTP listeners for the probes, ``/metrics`` and the node page, on the event loop.

Every listener serves the probes; the one with metrics serves ``/metrics``, the
node page and ``/debug/state`` too:

- ``/healthz``: 200 ``ok``. The answer comes from the event loop itself, so a stuck
  loop answers nothing and the kubelet's probe times out (``timeoutSeconds``).
- ``/readyz``: 200 while every advertised resource is registered with the kubelet
  and its ListAndWatch stream is open, else 503 with one line per problem.
- ``/metrics``: the Prometheus text format, where metrics are enabled.
- ``/``: the node page (:mod:`numa_device_plugin.plugin.reports.nodepage`), HTML with SVG, rendered
  in a worker thread and shared and bounded like ``/metrics``.
- ``/debug/state``: the plugin's state as JSON (:func:`~numa_device_plugin.plugin.reports.snapshot.
  debug_document`): registrations, streams, the last pod resources read, the lock,
  the configuration served and why.

The listeners face the pod network (the DaemonSet binds every interface), so a
connection costs a few kilobytes and no thread, and none may hold on:

- a request head must arrive within :data:`READ_TIMEOUT` seconds and fit in
  :data:`MAX_REQUEST` bytes (else 408 or 431, then close);
- at most :data:`MAX_CONNECTIONS` connections are open at once. A new one beyond
  that evicts the oldest open connection, if it is older than :data:`EVICT_AGE`
  seconds. A prober, which sends its request as it connects, is answered within a
  loop turn or two: it becomes the oldest only after every connection before it was
  evicted, so a slowloris crowd neither holds it up nor evicts it unless it opens
  more than :data:`MAX_CONNECTIONS` connections within that time. The age guard
  keeps a burst from evicting its own members before they are read; when every open
  connection is younger (the kernel hands a burst over in batches, stamped within a
  millisecond), the newcomer gives the loop :data:`BURST_TURNS` turns, which read what
  came with the connections, then evicts the oldest still without a whole request
  head, and is refused only when there is none (a prober inside the batch is answered);
- one request per connection (``Connection: close``), so a client cannot keep a
  connection open by asking again.

``/metrics`` never holds up a probe: the exposition text is rendered in a worker
thread (the loop answers probes meanwhile), at most once per :data:`METRICS_MAX_AGE`
seconds (scrapes within that time share one rendering, so 32 scrapers cost what one
does), and at most :data:`MAX_SCRAPES` scrapes are answered at once per listener (a
further one gets 503 at once), which bounds what slow readers hold in send buffers
to ``MAX_SCRAPES`` renderings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

# Seconds a client has to send its request head.
READ_TIMEOUT = 5.0
# Seconds an answer may take to leave (a client that reads nothing).
WRITE_TIMEOUT = 5.0
# Bytes of a request head: a probe or a scrape sends about 200.
MAX_REQUEST = 8192
# Open connections per listener (each costs ~3 KB of buffers and objects).
MAX_CONNECTIONS = 128
# Seconds an open connection must have had before a newcomer may evict it: long
# enough to read a request that came with the connection, short enough that an
# attacker must open 128 / 0.05 = 2,560 connections a second to get newcomers refused.
EVICT_AGE = 0.05
# Loop turns a newcomer gives a burst of young connections before it evicts the oldest
# still without a request head: a request sent with the connection is read in one.
BURST_TURNS = 3
# Seconds a rendering of /metrics is served again (Prometheus scrapes every 15-60 s).
METRICS_MAX_AGE = 1.0
# /metrics answers under way at once per listener (rendering or being sent).
MAX_SCRAPES = 8
# What prometheus-client's generate_latest() writes: the text format 0.0.4.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
JSON = "application/json"
# The metrics listener's pages: (snapshot on the loop, the page of a snapshot in a
# worker thread, the /debug/state JSON of a snapshot).
Pages = tuple[Callable[[], Any], Callable[[Any], bytes], Callable[[Any], bytes]]


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (all interfaces) to ``(host, port)``.

    Raises ValueError for anything else.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT or :PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class MetricsCache:
    """``render()`` (blocking, returns the exposition text or the page) called in a
    worker thread, its result reused for ``max_age`` seconds; concurrent callers of
    :meth:`get` share one rendering under way. With ``prepare``, ``render`` gets what
    ``prepare()`` returned, called on the event loop first (a snapshot of state that
    only the loop may read)."""

    def __init__(
        self,
        render: Callable[..., bytes],
        max_age: float = METRICS_MAX_AGE,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        self._render = render
        self._prepare = prepare
        self._max_age = max_age
        self._body: bytes | None = None
        self._at = 0.0
        self._pending: asyncio.Future[bytes] | None = None
        self.renderings = 0

    async def get(self) -> bytes:
        """The text, rendered at most ``max_age`` seconds ago. Raises what ``render``
        raises."""
        if self._body is not None and time.monotonic() - self._at < self._max_age:
            return self._body
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fresh())
        return await asyncio.shield(self._pending)

    async def _fresh(self) -> bytes:
        try:
            if self._prepare is None:
                body = await asyncio.to_thread(self._render)
            else:
                body = await asyncio.to_thread(self._render, self._prepare())
            self.renderings += 1
            self._body, self._at = body, time.monotonic()
            return body
        finally:
            self._pending = None


class ProbeServer:
    """Serves the endpoints above on ``address`` (``(host, port)``; port 0: any free
    one, then :attr:`port` is the bound one).

    ``readiness()`` returns the problems (empty when ready); ``metrics()`` returns
    the exposition text, or is None to serve no ``/metrics``. Both run on the
    event loop. ``pages``, given to the metrics listener only: ``(snapshot,
    render_page, debug_state)``: ``snapshot()`` takes the state on the loop,
    ``render_page(state)`` (in a worker thread, shared and bounded like a scrape)
    gives the HTML of ``/``, ``debug_state(state)`` the JSON of ``/debug/state`` (both
    in worker threads, shared and bounded like a scrape).
    :meth:`start` raises OSError when the address cannot be bound or resolved
    (``socket.gaierror``).
    """

    def __init__(
        self,
        address: tuple[str, int],
        readiness: Callable[[], list[str]],
        metrics: Callable[[], bytes] | None,
        *,
        pages: Pages | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.address = address
        self._readiness = readiness
        self._metrics = None if metrics is None else MetricsCache(metrics)
        self._page: MetricsCache | None = None
        self._debug: MetricsCache | None = None
        if pages is not None:
            snapshot, render_page, debug_state = pages
            self._page = MetricsCache(render_page, prepare=snapshot)
            # /debug/state lists every holder: rendered off the loop and bounded like /.
            self._debug = MetricsCache(debug_state, prepare=snapshot)
        self._scrapes = 0
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._server: asyncio.Server | None = None
        # Open connections, oldest first: their handler task and accept time; those
        # still waiting for their request head.
        self._open: dict[asyncio.Task[None], float] = {}
        self._waiting: set[asyncio.Task[None]] = set()
        self.port = 0
        self.evicted = 0
        self.refused = 0
        self.scrapes_refused = 0

    async def start(self) -> None:
        """Bind and listen; raises OSError (bind) or socket.gaierror (resolve)."""
        host, port = self.address
        self._server = await asyncio.start_server(
            self._connected,
            host,
            port,
            limit=MAX_REQUEST,
            backlog=self._max_connections,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop open connections. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        await server.wait_closed()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._open)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        now = time.monotonic()
        if len(self._open) >= self._max_connections and not self._evict_oldest(now):
            # A burst: every open connection is younger than EVICT_AGE (the kernel hands
            # connections over in batches, stamped within a millisecond). Give them the
            # loop turns that read what came with them (a prober's request is answered
            # and its connection closed), then evict the oldest still without a whole
            # request head: a prober inside the batch is answered, not refused.
            before = set(self._open)
            for _ in range(BURST_TURNS):
                await asyncio.sleep(0)
            if len(self._open) >= self._max_connections and not self._evict_waiting(before):
                self.refused += 1
                writer.transport.abort()
                return
        self._open[task] = now
        self._waiting.add(task)
        try:
            await self._serve(reader, writer)
        except (asyncio.CancelledError, OSError):  # ConnectionError, TimeoutError too
            pass
        finally:
            self._open.pop(task, None)
            self._waiting.discard(task)
            writer.close()

    def _evict_waiting(self, before: set[asyncio.Task[None]]) -> bool:
        """Evict the oldest connection of ``before`` (open before the newcomer gave the
        loop its turns) still waiting for its request head; False when there is none."""
        for task in self._open:
            if task in before and task in self._waiting:
                del self._open[task]
                self._waiting.discard(task)
                task.cancel()
                self.evicted += 1
                return True
        return False

    def _evict_oldest(self, now: float) -> bool:
        oldest, since = next(iter(self._open.items()))
        if now - since < EVICT_AGE:
            return False
        del self._open[oldest]
        oldest.cancel()
        self.evicted += 1
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            task = asyncio.current_task()
            if task is not None:
                self._waiting.discard(task)  # being answered: never evicted by a burst
        except TimeoutError:
            await self._reply(writer, 408, "Request Timeout", b"request head too slow\n")
            return
        except asyncio.LimitOverrunError:
            await self._reply(writer, 431, "Request Header Fields Too Large", b"too large\n")
            return
        except asyncio.IncompleteReadError:
            return  # closed before a whole head: nobody to answer
        method, path = _request_line(head)
        if method is None:
            await self._reply(writer, 400, "Bad Request", b"bad request\n")
            return
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, "Method Not Allowed", b"GET only\n")
            return
        path = path.split("?", 1)[0]
        head_only = method == "HEAD"
        if path == "/metrics" and self._metrics is not None:
            await self._scrape(writer, self._metrics, head_only)
            return
        if path == "/" and self._page is not None:
            await self._scrape(writer, self._page, head_only, HTML)
            return
        if path == "/debug/state" and self._debug is not None:
            await self._scrape(writer, self._debug, head_only, JSON)
            return
        status, reason, body, content_type = self._answer(path)
        await self._reply(writer, status, reason, body, content_type, head_only=head_only)

    async def _scrape(
        self,
        writer: asyncio.StreamWriter,
        metrics: MetricsCache,
        head_only: bool,
        content_type: str = METRICS_CONTENT_TYPE,
    ) -> None:
        if self._scrapes >= MAX_SCRAPES:
            self.scrapes_refused += 1
            await self._reply(writer, 503, "Service Unavailable", b"too many scrapes at once\n")
            return
        self._scrapes += 1
        try:
            body = await metrics.get()
            await self._reply(writer, 200, "OK", body, content_type, head_only=head_only)
        finally:
            self._scrapes -= 1

    def _answer(self, path: str) -> tuple[int, str, bytes, str]:
        if path == "/healthz":
            return 200, "OK", b"ok\n", TEXT
        if path == "/readyz":
            problems = self._readiness()
            if problems:
                text = "".join(f"{line}\n" for line in problems)
                return 503, "Service Unavailable", text.encode(), TEXT
            return 200, "OK", b"ok\n", TEXT
        return 404, "Not Found", b"not found\n", TEXT

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter,
        status: int,
        reason: str,
        body: bytes,
        content_type: str = TEXT,
        *,
        head_only: bool = False,
    ) -> None:
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer.write(head if head_only else head + body)
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await writer.drain()
        except (ConnectionError, TimeoutError):
            writer.transport.abort()  # a client that reads nothing keeps no buffer here


def _request_line(head: bytes) -> tuple[str | None, str]:
    """``(method, path)`` of a request head, ``(None, "")`` when it is not HTTP/1.x."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        return None, ""
    try:
        return parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None, ""
