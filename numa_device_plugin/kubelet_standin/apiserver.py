"""A stand-in for the one API server request per-node configuration makes: GET
``/api/v1/nodes/<name>``, answered with a Node that has the labels given, over plain
HTTP on 127.0.0.1 (``demo --config-file``). Anything else is a 404 Status."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class NodeApiStandIn:
    """Node ``name`` with ``labels`` (change them at any time: the next GET sees them)."""

    def __init__(self, name: str, labels: Mapping[str, str]) -> None:
        self.name = name
        self.labels = dict(labels)
        self.reads = 0

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        """The status and JSON body for a GET of ``path``."""
        self.reads += 1
        if path.split("?", 1)[0] != f"/api/v1/nodes/{self.name}":
            status: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "code": 404,
                                         "status": "Failure", "reason": "NotFound"}  # fmt: skip
            return 404, status
        metadata = {"name": self.name, "labels": dict(self.labels)}
        node: dict[str, object] = {"kind": "Node", "apiVersion": "v1", "metadata": metadata}
        return 200, node


def kubeconfig_for(server: str) -> str:
    """A kubeconfig (JSON is YAML) for ``server`` with a token, as the plugin reads one."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "plugin", "user": {"token": "stand-in"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "plugin"}}],
        "current-context": "standin",
    })  # fmt: skip


# What a stand-in answers: (path, bearer token) -> (status, JSON body).
Answer = Callable[[str, str], tuple[int, dict[str, object]]]


def bearer_token(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, as the API server reads
    it; "" (no credential) for anything else, a bare token without the ``Bearer ``
    prefix included."""
    return header[len("Bearer ") :] if header.startswith("Bearer ") else ""


@contextmanager
def json_api(answer: Answer, folder: Path) -> Iterator[Path]:
    """Serve ``answer`` over HTTP on 127.0.0.1 (a free port) for the block: every GET
    gets its status and JSON body. Yields the kubeconfig written to
    ``folder/kubeconfig`` (token ``stand-in``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            token = bearer_token(self.headers.get("Authorization", ""))
            status, body = answer(self.path, token)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # Connections waiting to be accepted: socketserver's 5 overflowed when 16 reads
        # start at once on a loaded machine, and each SYN dropped cost its read 1 s (the
        # API server's Go listener takes the kernel's somaxconn).
        request_queue_size = 128

        def handle_error(self, request: object, client_address: object) -> None:
            """A client that hung up before its answer was written (a request given up
            at its deadline on a loaded machine) is no error of the API server's: only
            other exceptions are printed (socketserver's default, to stderr)."""
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)  # type: ignore[arg-type]

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="API server stand-in", daemon=True)
    thread.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(kubeconfig_for(f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def node_api_standin(
    name: str, labels: Mapping[str, str], folder: Path
) -> Iterator[tuple[NodeApiStandIn, Path]]:
    """Serve a :class:`NodeApiStandIn` (:func:`json_api`) for the block; yields it and
    the kubeconfig written to ``folder/kubeconfig``."""
    api = NodeApiStandIn(name, labels)
    with json_api(lambda path, _: api.answer(path), folder) as kubeconfig:
        yield api, kubeconfig
