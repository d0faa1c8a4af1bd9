"""The HTTP listener for ``/metrics``, ``/healthz`` and ``/readyz``.

A threaded WSGI server (standard library) on its own thread, so a scrape never
waits for the event loop and a stuck event loop shows as a failing ``/healthz``:

- ``/healthz``: 200 while the event loop runs a no-op within 2 s, else 503.
- ``/readyz``: 200 while every advertised resource is registered with the
  kubelet and its ListAndWatch stream is open, else 503 with one line per
  failing resource (read on the event loop's thread).
- ``/metrics``: the Prometheus text format, where metrics are enabled.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

LOOP_DEADLINE = 2.0
# What prometheus-client's generate_latest() writes: the text format 0.0.4.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Environ = dict[str, Any]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (all interfaces) to ``(host, port)``.

    Raises ValueError for anything else.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT or :PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would flood the log


class ProbeServer:
    """Serves the endpoints above on ``address``; ``port`` is the bound port (for :0).

    ``readiness()`` runs on ``loop`` and returns the problems (empty when ready);
    ``metrics()`` returns the exposition text, or None to serve no ``/metrics``.
    ``health`` and ``metrics`` choose which endpoints this listener serves.
    """

    def __init__(
        self,
        address: tuple[str, int],
        loop: asyncio.AbstractEventLoop,
        readiness: Callable[[], list[str]],
        metrics: Callable[[], bytes] | None,
        *,
        health: bool = True,
    ) -> None:
        self._loop = loop
        self._readiness = readiness
        self._metrics = metrics
        self._health = health
        self._server = make_server(
            address[0], address[1], self._app, server_class=_Server, handler_class=_QuietHandler
        )
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="probes", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket. Idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def _app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics" and self._metrics is not None:
            body = self._metrics()
            return _reply(start_response, "200 OK", body, METRICS_CONTENT_TYPE)
        if path == "/healthz" and self._health:
            if self._on_loop(lambda: None) is _STUCK:
                return _reply(start_response, "503 Service Unavailable", b"event loop stuck\n")
            return _reply(start_response, "200 OK", b"ok\n")
        if path == "/readyz" and self._health:
            problems = self._on_loop(self._readiness)
            if problems is _STUCK:
                problems = ["event loop stuck"]
            if problems:
                text = "".join(f"{line}\n" for line in problems)
                return _reply(start_response, "503 Service Unavailable", text.encode())
            return _reply(start_response, "200 OK", b"ok\n")
        return _reply(start_response, "404 Not Found", b"not found\n")

    def _on_loop(self, function: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return function()

        try:
            return asyncio.run_coroutine_threadsafe(call(), self._loop).result(LOOP_DEADLINE)
        except (FutureTimeout, RuntimeError):
            return _STUCK


_STUCK = object()


def _reply(
    start_response: StartResponse,
    status: str,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]
