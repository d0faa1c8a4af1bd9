"""Stand-in API servers: :class:`NodeApi` for the one request per-node configuration
makes, GET ``/api/v1/nodes/<name>``; :class:`ClusterApi` for ``top``'s lists. Tests set
the node's labels or the status to answer, or a hostile answer (any status, content
type and body; silence; a drip of one byte at a time), and hand the plugin a kubeconfig
pointing at it. It can serve HTTPS with a
certificate made by ``openssl`` (:func:`make_tls`)."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from numa_device_plugin.kubelet_standin.apiserver import bearer_token, json_api


@dataclass(frozen=True)
class Raw:
    """A hostile answer: ``status``, ``content_type`` and ``body`` as given; ``silent``:
    accept the request and never answer; ``drip``: seconds between single bytes;
    ``close``: ``Connection: close`` and no ``Content-Length`` (the body ends when the
    connection does), the head sent whole and only the body dripped."""

    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    silent: bool = False
    drip: float = 0.0
    close: bool = False


class NodeApi:
    """One node, ``name``, with ``labels``; ``status`` other than 200 answers every GET
    with that status (an API server's Status object). ``reads`` counts the GETs."""

    def __init__(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.labels = dict(labels or {})
        self.status = 200
        self.reads = 0
        self.raw: Raw | None = None
        self.tokens: list[str] = []  # the bearer tokens the requests carried
        self.stop = threading.Event()
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
            api.tokens.append(bearer_token(self.headers.get("Authorization", "")))
            raw = api.raw
            if raw is not None:
                self._hostile(raw)
                return
            status, body = api.answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _hostile(self, raw: Raw) -> None:
            with api._lock:
                api.reads += 1
            if raw.silent:
                api.stop.wait(30)
                return
            length = "Connection: close" if raw.close else f"Content-Length: {len(raw.body)}"
            head = (
                f"HTTP/1.1 {raw.status} X\r\nContent-Type: {raw.content_type}\r\n{length}\r\n\r\n"
            ).encode()
            data = head + raw.body
            step = 1 if raw.drip else len(data)
            # With close, the head arrives whole and only the body drips.
            starts = range(len(head) if raw.close else 0, len(data), step)
            if raw.close:
                self.wfile.write(head)
            for at in starts:
                if api.stop.is_set():
                    return
                try:
                    self.wfile.write(data[at : at + step])
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(raw.drip)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def node_api(
    name: str,
    folder: Path,
    labels: dict[str, str] | None = None,
    tls: Path | None = None,
    client_certificates: bool = False,
) -> Iterator[tuple[NodeApi, Path]]:
    """Serve a :class:`NodeApi` on 127.0.0.1 for the block: ``(api, kubeconfig)``, the
    kubeconfig written in ``folder``. ``tls``: a folder from :func:`make_tls`, to serve
    HTTPS with its ``server.pem``/``server.key`` (the kubeconfig then names its CA);
    with ``client_certificates``, a client certificate signed by that CA is required
    (:func:`make_client_certificate`)."""
    api = NodeApi(name, labels)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls / "server.pem", tls / "server.key")
        if client_certificates:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(tls / "ca.pem")
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, name="node api", daemon=True)
    thread.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(
        kubeconfig_text(
            f"{scheme}://127.0.0.1:{server.server_address[1]}",
            None if tls is None else tls / "ca.pem",
        )
    )
    try:
        yield api, kubeconfig
    finally:
        api.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def make_tls(folder: Path) -> Path:
    """A CA (``ca.pem``) and a server certificate for 127.0.0.1 signed by it
    (``server.pem``, ``server.key``) in ``folder``, made with the ``openssl`` command."""
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=stub-ca")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return folder


def make_client_certificate(folder: Path) -> tuple[Path, Path]:
    """A client certificate (``client.pem``, ``client.key``) signed by the CA of
    :func:`make_tls` in ``folder``, as kubeadm and kind kubeconfigs carry one."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
        "-subj", "/CN=kubernetes-admin/O=system:masters")  # fmt: skip
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "client.pem", "-days", "2")  # fmt: skip
    return folder / "client.pem", folder / "client.key"


def kubeconfig_text(server: str, ca: Path | None = None) -> str:
    """A kubeconfig (JSON is YAML) for ``server`` with a token (and the CA file ``ca``)."""
    cluster: dict[str, object] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stub", "cluster": cluster}],
        "users": [{"name": "plugin", "user": {"token": "stub-token"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "plugin"}}],
        "current-context": "stub",
    })  # fmt: skip


class ClusterApi:
    """Nodes and pods for ``top``: lists paged by ``limit`` and ``continue`` as the API
    server pages them, one pod by its path; ``status`` other than 200 answers every
    GET with that status and a Status ``message``. ``paths`` records each request."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.pods = pods
        self.status = 200
        self.paths: list[str] = []
        self.tokens: list[str] = []
        # Pod name -> what GET .../pods/<name>:<port>/proxy/debug/state answers: a JSON
        # object (200), or a status code (a Status); and seconds to wait before it.
        self.proxied: dict[str, dict[str, Any] | int] = {}
        self.delays: dict[str, float] = {}
        self.list_delay = 0.0  # seconds before answering a list of pods
        self.volumes: list[dict[str, Any]] = []  # PersistentVolumes
        self.claims: list[dict[str, Any]] = []  # PersistentVolumeClaims
        self._paths_lock = threading.Lock()

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        with self._paths_lock:
            self.paths.append(path)
        if self.status != 200:
            return self.status, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "message": "stubbed refusal", "code": self.status}  # fmt: skip
        route, _, query = path.partition("?")
        params = {k: v[0] for k, v in parse_qs(query).items()}
        if route == "/api/v1/nodes":
            return 200, self._page("NodeList", self.nodes, params)
        if route == "/api/v1/pods":
            phases = ("Succeeded", "Failed") if "fieldSelector" in params else ()
            listed = [p for p in self.pods if p.get("status", {}).get("phase") not in phases]
            return 200, self._page("PodList", listed, params)
        if route == "/api/v1/persistentvolumes":
            return 200, self._page("PersistentVolumeList", self.volumes, params)
        if route == "/api/v1/persistentvolumeclaims":
            return 200, self._page("PersistentVolumeClaimList", self.claims, params)
        parts = route.split("/")
        if parts[:4] == ["", "api", "v1", "namespaces"] and parts[5:] == ["persistentvolumeclaims"]:
            listed = [c for c in self.claims if c["metadata"].get("namespace") == parts[4]]
            return 200, self._page("PersistentVolumeClaimList", listed, params)
        if len(parts) == 6 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "pods":
            time.sleep(self.list_delay)
            key, _, value = params.get("labelSelector", "").partition("=")
            listed = [
                p for p in self.pods if p["metadata"].get("namespace") == parts[4]
                and (not key or p["metadata"].get("labels", {}).get(key) == value)
            ]  # fmt: skip
            return 200, self._page("PodList", listed, params)
        if len(parts) == 10 and parts[7:] == ["proxy", "debug", "state"]:
            name = parts[6].rpartition(":")[0]
            time.sleep(self.delays.get(name, 0.0))
            found = self.proxied.get(name, 404)
            if isinstance(found, dict):
                return 200, found
            return found, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": f"proxy: {found}", "code": found}  # fmt: skip
        if len(parts) == 7 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "pods":
            for pod in self.pods:
                if (pod["metadata"]["namespace"], pod["metadata"]["name"]) == (parts[4], parts[6]):
                    return 200, dict(pod, kind="Pod")
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                     "message": f"{route} not found", "code": 404}  # fmt: skip

    @staticmethod
    def _page(kind: str, items: list[dict[str, Any]], params: dict[str, str]) -> dict[str, object]:
        start = int(params.get("continue", "0"))
        limit = int(params.get("limit", "0")) or len(items)
        rest = start + limit
        metadata = {"continue": str(rest)} if rest < len(items) else {}
        return {"kind": kind, "apiVersion": "v1", "metadata": metadata,
                "items": [dict(i, kind=kind[:-4]) for i in items[start:rest]]}  # fmt: skip


@contextmanager
def cluster_api(
    folder: Path, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> Iterator[tuple[ClusterApi, Path]]:
    """Serve a :class:`ClusterApi` over HTTP on 127.0.0.1 (the kubelet stand-in's
    :func:`json_api`) for the block: ``(api, kubeconfig)``, the kubeconfig (token
    ``stand-in``) written in ``folder``."""
    api = ClusterApi(nodes, pods)

    def answer(path: str, token: str) -> tuple[int, dict[str, object]]:
        api.tokens.append(token)
        return api.answer(path)

    with json_api(answer, folder) as kubeconfig:
        yield api, kubeconfig
