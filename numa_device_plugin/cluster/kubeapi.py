"""``top``'s reads of the API server, through the ``kubernetes`` client, bounded.

The client does what kubectl users expect of a kubeconfig: the current context,
``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``tls-server-name``,
tokens, ``tokenFile``, client certificates, ``auth-provider`` (``oidc``), proxies,
and, in a pod without a kubeconfig, the service account. Around it:

- **one total deadline** for the whole command (:func:`total_deadline`, ``--timeout``):
  an interval timer raises :class:`DeadlinePassed` in the main thread wherever it
  waits (a kubeconfig that is a FIFO, DNS, TLS, a server dripping its answer, an
  endless run of ``continue`` pages); each request also ends within its own deadline
  (the time left, or a plugin pod's ``--pod-timeout``), in any thread: the connect
  counts against it, and a timer shuts its socket down at the deadline however slowly
  the answer drips (:class:`~numa_device_plugin.ops.httpget.Cutoff`, raising
  :class:`DeadlinePassed`); the client never retries;
- a kubeconfig's ``exec`` plugin run by :mod:`.execcredential`, bounded and killed with
  its children at the deadline, its credential handed to the client in its place (the
  client itself runs no command);
- **byte caps**: the kubeconfig (:data:`MAX_KUBECONFIG`), each answer
  (:data:`MAX_ANSWER`), all answers of one run (:data:`MAX_TOTAL`), and at most
  :data:`MAX_PAGES` pages per list; **object caps**: at most :data:`MAX_CONTAINERS`
  objects and arrays an answer, one answer parsed at a time.

Costs: importing the client takes ~0.4 s and ~36 MB of RSS, paid by ``top`` only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote

from numa_device_plugin.ops.bounded import BoundError, one_line
from numa_device_plugin.ops.httpget import Cutoff
from numa_device_plugin.ops.yamlfile import read_yaml

# Bytes of the kubeconfig.
MAX_KUBECONFIG = 4 << 20
# Bytes of one answer (a page of 25 Nodes with long image lists is ~2.5 MB).
MAX_ANSWER = 4 << 20
# Bytes of all answers of one run, and pages of one list.
MAX_TOTAL = 256 << 20
MAX_PAGES = 2_000
# JSON objects and arrays in one answer (its '{' and '[' bytes, counted before parsing):
# 4 MiB of "[{},{}...]" parsed is a million dicts (~100 MB); sixteen readers at once
# once held 1.7 GB. A page of 500 pods or a plugin's whole /debug/state has far fewer.
MAX_CONTAINERS = 1 << 18
# One answer parsed (and pruned by its reader's ``keep``) at a time, whatever the
# number of readers: the parsing peak is one answer's.
_PARSING = threading.Lock()


class ApiError(Exception):
    """The API server could not be read or answered something unusable; the message
    says which request and why, in one line."""


class DeadlinePassed(BaseException):
    """The command's total deadline passed (raised by the SIGALRM handler of
    :func:`total_deadline`, so that no library's ``except Exception`` swallows it)."""


class Deadline:
    """The end of a total deadline: :meth:`left` seconds remain."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; raises :class:`DeadlinePassed` when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise DeadlinePassed
        return left


@contextlib.contextmanager
def total_deadline(seconds: float) -> Iterator[Deadline]:
    """Raise :class:`DeadlinePassed` in the main thread ``seconds`` from now, whatever
    it is waiting on (``ITIMER_REAL``; the previous SIGALRM handler and timer are put
    back after). Outside the main thread only :meth:`Deadline.left` checks it."""
    deadline = Deadline(seconds)

    def expire(signum: int, frame: FrameType | None) -> None:
        raise DeadlinePassed

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread
        yield deadline
        return
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield deadline
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_delay:
            waited = time.monotonic() - started
            signal.setitimer(signal.ITIMER_REAL, max(0.001, old_delay - waited), old_interval)


def default_kubeconfig(env: Mapping[str, str]) -> Path | None:
    """kubectl's choice: the first existing file of ``$KUBECONFIG`` (``:``-separated),
    else ``~/.kube/config`` when it exists; None (in-cluster) otherwise."""
    for entry in env.get("KUBECONFIG", "").split(os.pathsep):
        if entry and Path(entry).is_file():
            return Path(entry)
    home = Path(env.get("HOME") or Path.home())
    default = home / ".kube" / "config"
    return default if default.is_file() else None


def load_client() -> None:
    """Import the ``kubernetes`` client (~0.4 s, more on a loaded machine): done before
    the deadline starts, so that ``--timeout`` bounds the waiting, not the import.
    Raises :class:`ApiError` saying how to install it when it is missing."""
    try:
        import kubernetes.client
        import kubernetes.config
        import kubernetes.config.kube_config  # noqa: F401
    except ImportError:
        raise ApiError(
            "top, devices and check need the kubernetes client: pip install the release's "
            "wheel with the top extra ('numa_device_plugin-X.Y.Z-py3-none-any.whl[top]'), or "
            "'.[top]' in a clone"
        ) from None


class KubeApi:
    """GETs against the API server of the kubeconfig at ``kubeconfig`` (None: kubectl's
    default, :func:`default_kubeconfig`, else the pod's service account), each within
    what is left of ``deadline``. Raises :class:`ApiError`."""

    def __init__(self, kubeconfig: Path | None, deadline: Deadline) -> None:
        load_client()
        import kubernetes.client
        import kubernetes.config
        from kubernetes.config.kube_config import KubeConfigLoader

        self.deadline = deadline
        self.total = 0
        self._lock = threading.Lock()
        configuration = kubernetes.client.Configuration()
        path = kubeconfig or default_kubeconfig(os.environ)
        if path is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ApiError(
                "no kubeconfig: $KUBECONFIG names no file, ~/.kube/config does not exist, "
                "and this is not a pod with a service account (give --kubeconfig)"
            )
        try:
            if path is None:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                document = with_exec_credential(read_kubeconfig(path), path, deadline)
                loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
                    config_dict=document, config_base_path=str(path.parent)
                )
                loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException as exc:
            where = "the service account" if path is None else f"kubeconfig {path}"
            raise ApiError(f"{where}: {one_line(str(exc))}") from None
        configuration.retries = False
        # Connections kept for reads at once (devices and check read 16 pods at a time).
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 16)
        if not configuration.verify_ssl:
            # The kubeconfig asked for insecure-skip-tls-verify: kubectl says nothing
            # more, and urllib3's warning at every request would bury the table.
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.host = configuration.host.rstrip("/")
        self._client = kubernetes.client.ApiClient(configuration)

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()  # type: ignore[no-untyped-call]

    def _answer(self, path: str, deadline: Deadline | None = None) -> tuple[int, str, bytearray]:
        """Status, reason and body (at most :data:`MAX_ANSWER` bytes) of GET ``path``
        within ``deadline`` (default: the command's), connect included. Raises
        :class:`DeadlinePassed` when the deadline ends it, :class:`ApiError` for no
        answer otherwise or one over the caps. Thread-safe: several threads may read at
        once (the byte count of all answers is kept under a lock)."""
        import urllib3

        deadline = deadline or self.deadline

        headers: dict[str, str] = {
            "Accept": "application/json",
            "User-Agent": "numa-device-plugin top",
        }
        self._client.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        left = deadline.left()
        with Cutoff(left) as cutoff:
            try:
                response = self._client.rest_client.pool_manager.request(
                    "GET", self.host + path, headers=headers, preload_content=False,
                    # total: the connect counts (a SYN dropped by a full accept queue
                    # is sent again 1 s later; the read then had all of ``left`` again).
                    timeout=urllib3.Timeout(total=left), retries=False, redirect=False,
                )  # fmt: skip
                cutoff.watch(response.fileno())  # the body within it, however it drips
                try:
                    # one buffer grown in place: chunks and their join held each answer
                    # twice, sixteen readers at once
                    body = bytearray()
                    while chunk := response.read(65536):
                        deadline.left()
                        self.deadline.left()
                        if len(body) + len(chunk) > MAX_ANSWER:
                            raise ApiError(f"GET {path}: the answer is over {MAX_ANSWER} bytes")
                        body += chunk
                    size = len(body)
                finally:
                    response.release_conn()
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if cutoff.expired or time.monotonic() >= cutoff.end:
                    raise DeadlinePassed from None
                raise ApiError(
                    f"GET {path}: cannot reach the API server at {self.host}: "
                    f"{type(exc).__name__}: {one_line(str(exc))}"
                ) from None
            if cutoff.expired:  # a close-delimited body ended by the cut-off
                raise DeadlinePassed
        with self._lock:
            self.total += size
            total = self.total
        if total > MAX_TOTAL:
            raise ApiError(f"GET {path}: the answers are over {MAX_TOTAL} bytes in all")
        return response.status, one_line(response.reason or "", 80), body

    def get(
        self, path: str, kind: str | None, deadline: Deadline | None = None,
        keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The object at ``path``, which must be of ``kind`` (``Pod``, ``NodeList``); a
        JSON object of any kind when ``kind`` is None (a pod's page through
        ``pods/proxy``); within ``deadline`` when given (it ends no later than the
        command's). ``keep`` (a successful answer's parts the caller uses, bounded) runs
        under the same lock as the parsing: one whole answer is alive at a time. Raises
        ApiError for an answer of more than :data:`MAX_CONTAINERS` objects and arrays,
        before parsing it; what ``keep`` raises."""
        status, reason, document = self._parsed(path, deadline, keep)
        problem = None
        if status != 200:
            message = document.get("message") if isinstance(document, dict) else None
            text = one_line(str(message), 200) if message else ""
            problem = f"GET {path}: {status} {reason}: {text}".strip().rstrip(":")
        elif kind is None and not isinstance(document, dict):
            problem = f"GET {path}: the answer is not a JSON object"
        elif kind is not None:
            found = document.get("kind") if isinstance(document, dict) else None
            if found != kind:
                shown = f" (kind {one_line(found, 40)!r})" if isinstance(found, str) else ""
                problem = f"GET {path}: the answer is not a {kind} object{shown}"
        if problem is not None:
            # Not kept alive by the error's traceback (a reader's future holds it).
            del document
            raise ApiError(problem)
        assert isinstance(document, dict)
        return document

    def _parsed(
        self, path: str, deadline: Deadline | None,
        keep: Callable[[dict[str, Any]], dict[str, Any]] | None,
    ) -> tuple[int, str, Any]:  # fmt: skip
        """Status, reason and the parsed answer (None: not JSON; ``keep`` of it when
        200), one answer parsed at a time. Raises what :meth:`_answer` raises, ApiError
        for over :data:`MAX_CONTAINERS` objects and arrays (the answer not kept by the
        error)."""
        status, reason, body = self._answer(path, deadline)
        containers = body.count(b"{") + body.count(b"[")
        if containers > MAX_CONTAINERS:
            del body
            raise ApiError(f"GET {path}: the answer holds over {MAX_CONTAINERS} JSON objects "
                           "and arrays")  # fmt: skip
        with _PARSING:
            try:
                document = json.loads(body)
            except (ValueError, RecursionError):
                document = None
            del body
            refused = None
            if status == 200 and keep is not None and isinstance(document, dict):
                try:
                    document = keep(document)
                except ValueError as exc:  # raised below: no traceback keeps the answer
                    refused = str(exc)
        if refused is not None:
            del document
            raise ValueError(refused)
        return status, reason, document

    def list(self, path: str, kind: str) -> list[dict[str, Any]]:
        """Every item of the list of ``kind`` objects at ``path`` (which has
        ``?limit=``), page by page (``continue``), at most :data:`MAX_PAGES` pages."""
        items: list[dict[str, Any]] = []
        token = ""
        for _ in range(MAX_PAGES):
            page = self.get(path + (f"&continue={quote(token)}" if token else ""), kind + "List")
            listed = page.get("items") or []
            if not isinstance(listed, list):
                raise ApiError(f"GET {path}: items is not a list")
            items += [item for item in listed if isinstance(item, dict)]
            metadata = page.get("metadata")
            token = str((metadata if isinstance(metadata, dict) else {}).get("continue") or "")
            if not token:
                return items
        raise ApiError(f"GET {path}: the list did not end within {MAX_PAGES} pages")


def read_kubeconfig(path: Path) -> dict[str, Any]:
    """The kubeconfig at ``path`` as a mapping: a regular file of at most
    :data:`MAX_KUBECONFIG` bytes, YAML. Raises :class:`ApiError` naming the file."""
    try:
        document = read_yaml(path, MAX_KUBECONFIG)
    except BoundError as exc:
        raise ApiError(f"kubeconfig: {exc}") from None
    if not isinstance(document, dict):
        raise ApiError(f"kubeconfig {path}: not a mapping")
    return document


def with_exec_credential(
    document: dict[str, Any], path: Path, deadline: Deadline
) -> dict[str, Any]:
    """``document`` with the current user's ``exec`` plugin run (bounded by what is
    left of ``deadline``) and replaced by the credential it printed (``token``, or
    ``client-certificate-data`` and ``client-key-data``), and every other user's
    ``exec`` entry removed: the ``kubernetes`` client then runs no command. Raises
    :class:`ApiError` when the plugin fails."""
    from numa_device_plugin.cluster.execcredential import ExecCredentialError, exec_credential

    users = document.get("users")
    if not isinstance(users, list):
        return document
    name = _current_user(document)
    replaced: list[Any] = []
    done = False
    for entry in users:
        user = entry.get("user") if isinstance(entry, dict) else None
        if not isinstance(user, dict) or "exec" not in user:
            replaced.append(entry)
            continue
        user = {key: value for key, value in user.items() if key != "exec"}
        if not done and entry.get("name") == name and isinstance(entry["user"]["exec"], dict):
            done = True
            try:
                token, client = exec_credential(
                    entry["user"]["exec"], path.parent, f"kubeconfig {path}",
                    timeout=deadline.left(),
                )  # fmt: skip
            except ExecCredentialError as exc:
                raise ApiError(str(exc)) from None
            if token is not None:
                user["token"] = token
            if client is not None:
                user["client-certificate-data"], user["client-key-data"] = client
        replaced.append({**entry, "user": user})
    return {**document, "users": replaced}


def _current_user(document: Mapping[str, Any]) -> Any:
    """The user name of the current context (the first context of that name), as the
    client resolves it; None when there is none."""
    current = document.get("current-context")
    contexts = document.get("contexts")
    for entry in contexts if isinstance(contexts, list) else []:
        if isinstance(entry, dict) and entry.get("name") == current:
            context = entry.get("context")
            return context.get("user") if isinstance(context, dict) else None
    return None
