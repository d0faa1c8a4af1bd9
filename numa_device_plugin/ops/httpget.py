"""One HTTP(S) GET whose whole exchange (connect, TLS, request, answer) ends within a
total deadline that nothing extends, with an answer cap (:func:`http_get`; the API
server's Node read, the ``health`` command). A timer shuts the connection's socket down
through a duplicate of its descriptor, so the cut-off holds however :mod:`http.client`
passes the socket around (it drops its own reference in ``getresponse()`` when the
server says ``Connection: close``); that timer, :class:`Cutoff`, also bounds the
``kubectl numa`` commands' reads through the ``kubernetes`` client
(:mod:`numa_device_plugin.cluster.kubeapi`). The other bounded reads are in
:mod:`numa_device_plugin.ops.bounded`.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from numa_device_plugin.ops.bounded import BoundError, one_line


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: ``status`` (200), ``reason``, ``content_type`` (the media type
    alone, lower case: ``application/json``) and ``body`` (at most the cap)."""

    status: int
    reason: str
    content_type: str
    body: bytes


class Cutoff:
    """A context manager that shuts down every socket it watches once ``deadline``
    seconds have passed (a timer thread), through duplicates of their descriptors
    (``http.client`` may have dropped or closed its own reference by then; a TLS
    socket is shut through its TCP descriptor). A read blocked on a watched socket then
    ends (an error or end of file) however its library loops over ``recv``: how a
    dripping server is cut off. :attr:`expired` says the deadline did it."""

    def __init__(self, deadline: float) -> None:
        self.end = time.monotonic() + deadline
        self.expired = False
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._timer = threading.Timer(deadline, self.expire)
        self._timer.daemon = True

    def remaining(self) -> float:
        """Seconds left; raises :class:`BoundError` when none are."""
        left = self.end - time.monotonic()
        if left <= 0 or self.expired:
            raise BoundError("deadline passed", timed_out=True)
        return left

    def watch(self, descriptor: int) -> None:
        """Shut the socket of ``descriptor`` down at the deadline (at once when it has
        passed); a duplicate of the descriptor is kept until the block ends."""
        with self._lock:
            self._watched.append(socket.socket(fileno=os.dup(descriptor)))
            if self.expired:
                self._shut()

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        for sock in self._watched:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Cutoff:
        self._timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._watched:
                sock.close()
            self._watched.clear()


class _Connection(http.client.HTTPConnection):
    """HTTP, or HTTPS when given a TLS context (checking ``server_name``, default the
    host), whose sockets a :class:`Cutoff` watches."""

    def __init__(
        self,
        host: str,
        port: int,
        cutoff: Cutoff,
        context: ssl.SSLContext | None,
        server_name: str | None,
    ) -> None:
        super().__init__(host, port, timeout=cutoff.remaining())
        self._cutoff = cutoff
        self._tls = context
        self._server_name = server_name or host

    def connect(self) -> None:
        self.timeout = self._cutoff.remaining()
        super().connect()
        assert self.sock is not None
        self._cutoff.watch(self.sock.fileno())
        if self._tls is not None:
            self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def http_get(
    host: str,
    port: int,
    path: str,
    *,
    deadline: float,
    limit: int,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    server_name: str | None = None,
    name: str = "the server",
) -> Answer:
    """GET ``path`` from ``host:port`` (HTTPS with ``context``), the whole exchange
    within ``deadline`` seconds, the body at most ``limit`` bytes; ``name`` says whom
    the messages are about (``the API server``). Raises
    :class:`BoundError` (``timed_out`` when the deadline passed) for no whole answer:
    refused, broken off, too large, malformed."""
    where = f"{name} at {'https' if context else 'http'}://{host}:{port}"
    with Cutoff(deadline) as cutoff:
        conn = _Connection(host, port, cutoff, context, server_name)
        try:
            conn.request("GET", path, headers=dict(headers or {}))
            response = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                cutoff.remaining()
                chunk = response.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise BoundError(f"the answer from {where} is over {limit} bytes")
                chunks.append(chunk)
            cutoff.remaining()
            return Answer(
                response.status,
                one_line(response.reason, 80),
                response.headers.get_content_type(),
                b"".join(chunks),
            )
        except BoundError as exc:
            if exc.timed_out:
                raise BoundError(f"no whole answer from {where} within {deadline:g} s",
                                 timed_out=True) from None  # fmt: skip
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cutoff.expired or time.monotonic() >= cutoff.end:
                raise BoundError(f"no whole answer from {where} within {deadline:g} s",
                                 timed_out=True) from None  # fmt: skip
            raise BoundError(
                f"cannot reach {where}: {type(exc).__name__}: {one_line(str(exc))}"
            ) from None
        finally:
            conn.close()
