"""One GET against the Kubernetes API server, with the standard library only.

Per-node configuration reads one object, the plugin's own Node, once a minute. The
``kubernetes`` client package would cost ~126 MB of image and ~40 MB of RSS for that,
and its retries (4 tries, 10 s apart) outlast a pod's grace period. This module does
the one request with :mod:`http.client` and :mod:`ssl`:

- where to connect and how to authenticate: a kubeconfig (:func:`from_kubeconfig`:
  the current context's ``server``, ``certificate-authority(-data)``,
  ``insecure-skip-tls-verify``, ``tls-server-name``, ``token``/``tokenFile``,
  ``client-certificate(-data)``/``client-key(-data)``) or the pod's service account
  (:func:`in_cluster`: ``KUBERNETES_SERVICE_HOST``/``_PORT``, ``ca.crt`` and the
  ``token`` file, read again at each request because the kubelet rotates it);
- credential plugins (``exec``, ``auth-provider``) are refused, never run: a
  kubeconfig is a path given on the command line, and running a command named in it
  would make that file a way to run code in the plugin's container. (``top``, which
  people run with their own kubeconfig as they run kubectl, reads the API server
  through the ``kubernetes`` client instead: :mod:`numa_device_plugin.cluster`.)
- one whole request (connect, TLS, request, answer) ends within its ``deadline``:
  a timer shuts the socket down then, so neither a silent server nor one dripping a
  byte a second holds a look for longer. There are no retries: the caller looks
  again at its next interval;
- the answer is read up to :data:`MAX_ANSWER` bytes.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from numa_device_plugin.ops.bounded import BoundError, one_line, read_file
from numa_device_plugin.ops.httpget import Answer, http_get
from numa_device_plugin.ops.yamlfile import read_yaml

# Bytes of an answer: a Node object with a long image list is ~100 KB.
MAX_ANSWER = 4 << 20
# Bytes of a kubeconfig, and of a file it names (a CA bundle, a client certificate).
MAX_KUBECONFIG = 4 << 20
# Bytes of a token file.
MAX_TOKEN = 64 << 10
# Where a pod's service account is mounted (token, ca.crt).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiConfigError(Exception):
    """The kubeconfig or the service account cannot be used; the message names the
    file and the field."""


class ApiRequestError(Exception):
    """No whole answer: the server could not be reached, broke off, or did not answer
    within the deadline. The message says which, in one line."""


@dataclass(frozen=True)
class ApiTarget:
    """Where the API server is and how to authenticate: ``scheme`` (``https`` or
    ``http``), ``host``, ``port``, ``context`` (TLS, None for http), ``server_name``
    (the TLS name to check, None: ``host``), ``token`` (a function returning the
    bearer token or None) and ``origin`` (what it came from, for messages)."""

    scheme: str
    host: str
    port: int
    context: ssl.SSLContext | None
    server_name: str | None
    token: Callable[[], str | None]
    origin: str

    def get(self, path: str, deadline: float) -> Answer:
        """GET ``path`` (``/api/v1/nodes/n1``), the whole of it within ``deadline``
        seconds (:func:`numa_device_plugin.ops.httpget.http_get`: a total deadline
        that a dripping server cannot extend, at most :data:`MAX_ANSWER` bytes).
        Raises :class:`ApiRequestError` (no whole answer) or :class:`ApiConfigError`
        (the token file cannot be read, or the token cannot go in a header)."""
        headers = {"Accept": "application/json", "User-Agent": "numa-device-plugin"}
        token = self.token()
        if token:
            if not token.isprintable() or not token.isascii():
                raise ApiConfigError(
                    f"{self.origin}: the token has control or non-ASCII characters "
                    "(a line break?); it cannot be sent"
                )
            headers["Authorization"] = f"Bearer {token}"
        try:
            return http_get(
                self.host, self.port, path, deadline=deadline, limit=MAX_ANSWER,
                headers=headers, context=self.context, server_name=self.server_name,
                name="the API server",
            )  # fmt: skip
        except BoundError as exc:
            raise ApiRequestError(str(exc)) from None


def in_cluster(account: Path = SERVICE_ACCOUNT, env: Mapping[str, str] | None = None) -> ApiTarget:
    """The API server as a pod sees it: ``KUBERNETES_SERVICE_HOST`` and
    ``KUBERNETES_SERVICE_PORT`` from ``env`` (the process's environment), the CA
    ``account/ca.crt`` and the token ``account/token`` (read at each request). Raises
    :class:`ApiConfigError` naming what is missing."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not port.isdigit():
        raise ApiConfigError(
            "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
            "(give --kubeconfig)"
        )
    context = _tls_context(account / "ca.crt", None, False, "the service account")
    token_file = account / "token"
    return ApiTarget(
        "https",
        host.strip("[]"),
        int(port),
        context,
        None,
        lambda: _read_token(token_file),
        f"the service account in {account}",
    )


def from_kubeconfig(path: Path) -> ApiTarget:
    """The current context of the kubeconfig at ``path``. Relative file names in it
    are taken from its folder, as kubectl does. The file and those it names are read
    up to :data:`MAX_KUBECONFIG` bytes, regular files only. Raises :class:`ApiConfigError`
    naming the file and the field for anything missing, malformed or unsupported
    (``exec`` and ``auth-provider`` credential plugins)."""
    try:
        document = read_yaml(path, MAX_KUBECONFIG)
    except BoundError as exc:
        raise ApiConfigError(f"kubeconfig: {exc}") from None
    where = f"kubeconfig {path}"
    if not isinstance(document, dict):
        raise ApiConfigError(f"{where}: not a mapping")
    context_name = document.get("current-context")
    context = _named(document, "contexts", "context", context_name, where)
    cluster = _named(document, "clusters", "cluster", context.get("cluster"), where)
    user = (
        _named(document, "users", "user", context.get("user"), where) if context.get("user") else {}
    )
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise ApiConfigError(
                f"{where}: user {_shown(context.get('user'))} uses an {plugin} credential plugin, "
                "which the plugin never runs; give a token, a tokenFile or a client certificate"
            )
    server = cluster.get("server")
    parts = urlsplit(server) if isinstance(server, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ApiConfigError(f"{where}: cluster server {_shown(server)} is not an http(s) URL")
    base = path.parent
    context_tls = None
    if parts.scheme == "https":
        client = _client_files(user, base, where)
        context_tls = _tls_context(
            _source(cluster, "certificate-authority", base, where),
            client,
            bool(cluster.get("insecure-skip-tls-verify")),
            where,
        )
    token = user.get("token")
    token_file = user.get("tokenFile")
    if token is not None and not isinstance(token, str):
        raise ApiConfigError(f"{where}: token is not a string")
    if isinstance(token_file, str) and not token:
        file = base / token_file
        read: Callable[[], str | None] = lambda: _read_token(file)  # noqa: E731
    else:
        read = lambda: token  # noqa: E731
    port = parts.port or (443 if parts.scheme == "https" else 80)
    name = cluster.get("tls-server-name")
    return ApiTarget(
        parts.scheme,
        parts.hostname,
        port,
        context_tls,
        name if isinstance(name, str) else None,
        read,
        where,
    )


def _named(
    document: dict[str, Any], section: str, key: str, name: Any, where: str
) -> dict[str, Any]:
    entries = document.get(section)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(key)
            if isinstance(found, dict):
                return found
            break
    raise ApiConfigError(f"{where}: no {key} named {_shown(name)} in {section}")


# A PEM source: a file path or the PEM bytes themselves.
Source = Path | bytes | None


def _source(entry: dict[str, Any], field: str, base: Path, where: str) -> Source:
    """``field`` (a file name) or ``field-data`` (base64 PEM) of a kubeconfig entry."""
    import base64
    import binascii

    data = entry.get(f"{field}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise ApiConfigError(f"{where}: {field}-data is not base64") from None
    name = entry.get(field)
    if name:
        return base / str(name)
    return None


def _client_files(user: dict[str, Any], base: Path, where: str) -> tuple[Source, Source] | None:
    cert = _source(user, "client-certificate", base, where)
    key = _source(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise ApiConfigError(f"{where}: a client certificate needs both its certificate and key")
    return None if cert is None else (cert, key)


def _tls_context(
    ca: Source, client: tuple[Source, Source] | None, insecure: bool, where: str
) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif isinstance(ca, bytes):
            context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
        elif ca is not None:
            context.load_verify_locations(cadata=read_file(ca, MAX_KUBECONFIG).decode())
        if client is not None:
            with tempfile.TemporaryDirectory(prefix="ndp-tls-") as folder:
                cert, key = (_as_file(part, Path(folder) / name) for part, name in
                             zip(client, ("cert.pem", "key.pem"), strict=True))  # fmt: skip
                context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError, BoundError) as exc:
        raise ApiConfigError(f"{where}: cannot load TLS files: {one_line(str(exc))}") from None
    return context


def _as_file(source: Source, path: Path) -> str:
    """A PEM source as a private file (ssl loads a certificate chain from files only);
    a named file is read bounded first, so a FIFO or a device never blocks."""
    data = source if isinstance(source, bytes) else read_file(Path(str(source)), MAX_KUBECONFIG)
    path.touch(mode=0o600)
    path.write_bytes(data)
    return str(path)


def _read_token(path: Path) -> str | None:
    try:
        data = read_file(path, MAX_TOKEN)
    except BoundError as exc:
        raise ApiConfigError(f"token: {exc}") from None
    return data.decode(errors="replace").strip() or None


def _shown(value: Any) -> str:
    """A kubeconfig value for a message: a string quoted and cut, anything else by its
    type only (the repr of an alias bomb is exponential in the file's size)."""
    if value is None or isinstance(value, str | int | float | bool):
        return repr(one_line(str(value), 120)) if isinstance(value, str) else repr(value)
    return f"<a {type(value).__name__}>"
