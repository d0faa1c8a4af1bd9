"""A stand-in API server for the one request per-node configuration makes: GET
``/api/v1/nodes/<name>``. Tests set the node's labels or the status to answer, and
hand the plugin a kubeconfig pointing at it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class NodeApi:
    """One node, ``name``, with ``labels``; ``status`` other than 200 answers every GET
    with that status (an API server's Status object). ``reads`` counts the GETs."""

    def __init__(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.labels = dict(labels or {})
        self.status = 200
        self.reads = 0
        self._lock = threading.Lock()

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        with self._lock:
            self.reads += 1
            status, labels = self.status, dict(self.labels)
        if status != 200:
            return status, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Stubbed", "code": status}  # fmt: skip
        if path.split("?")[0] != f"/api/v1/nodes/{self.name}":
            return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "code": 404}  # fmt: skip
        node: dict[str, object] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": self.name, "labels": labels},
        }
        return 200, node


def _handler(api: NodeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = api.answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def node_api(
    name: str, folder: Path, labels: dict[str, str] | None = None
) -> Iterator[tuple[NodeApi, Path]]:
    """Serve a :class:`NodeApi` on 127.0.0.1 for the block: ``(api, kubeconfig)``, the
    kubeconfig written in ``folder``."""
    api = NodeApi(name, labels)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="node api", daemon=True)
    thread.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        yield api, kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def kubeconfig_text(server: str) -> str:
    """A kubeconfig (JSON is YAML) for ``server`` with a token."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stub", "cluster": {"server": server}}],
        "users": [{"name": "plugin", "user": {"token": "stub-token"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "plugin"}}],
        "current-context": "stub",
    })  # fmt: skip
