"""The node's labels, read from the API server.

A pod cannot see its node's labels through the downward API (it offers the pod's own
labels and ``spec.nodeName``, not the node's), so the plugin asks the API server: a
GET of its own Node object, ``/api/v1/nodes/<name>``, with the pod's service account
token, once per ``--node-config-interval`` (60 s: less than the kubelet's own lease
renewals, one per 10 s). That needs RBAC ``get`` on ``nodes`` (the chart's
ClusterRole).

The request is :mod:`.apiclient`'s: the standard library, one try bounded by
:data:`READ_DEADLINE`. The answer is not trusted: it must be JSON (``application/json``)
of a ``Node`` named as asked, whose ``metadata.labels`` maps strings to strings; any
other answer is a transient failure naming what was wrong, so the configuration
already served stays.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from numa_device_plugin.nodeconfig.apiclient import (
    SERVICE_ACCOUNT,
    ApiConfigError,
    ApiRequestError,
    ApiTarget,
    from_kubeconfig,
    in_cluster,
)
from numa_device_plugin.nodeconfig.configs import NodeConfigError

# Seconds one whole read may take (connect, TLS, request and answer).
READ_DEADLINE = 5.0
# Labels a Node may carry here (the API server allows any number; thousands is hostile).
MAX_LABELS = 4096


class NodeLabelReader:
    """Reads node ``node``'s labels. ``kubeconfig``: a kubeconfig file; None: the pod's
    service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` from ``env``, the token
    and CA under ``account``). Blocking (at most ``deadline`` seconds a read): call
    it in a thread."""

    def __init__(
        self,
        node: str,
        kubeconfig: Path | None = None,
        *,
        account: Path = SERVICE_ACCOUNT,
        env: Mapping[str, str] | None = None,
        deadline: float = READ_DEADLINE,
    ) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self.deadline = deadline
        self._account = account
        self._env = env
        self._target: ApiTarget | None = None

    def _api(self) -> ApiTarget:
        if self._target is None:
            try:
                if self.kubeconfig is not None:
                    self._target = from_kubeconfig(self.kubeconfig)
                else:
                    self._target = in_cluster(self._account, self._env)
            except ApiConfigError as exc:
                raise NodeConfigError(f"cannot configure the API client: {exc}") from None
        return self._target

    def read(self) -> Mapping[str, str]:
        """The node's labels (``metadata.labels``, {} when it has none). Raises
        :class:`NodeConfigError`: ``transient`` for a failed read (API server down,
        no whole answer within the deadline, 5xx, an answer that is not this Node);
        not transient when the node does not exist, access is forbidden (RBAC) or
        the client cannot be configured, which a retry will not mend by itself."""
        api = self._api()
        try:
            answer = api.get(f"/api/v1/nodes/{quote(self.node, safe='')}", self.deadline)
        except ApiRequestError as exc:
            raise NodeConfigError(f"cannot read node {self.node}: {exc}", transient=True) from None
        except ApiConfigError as exc:
            raise NodeConfigError(f"cannot read node {self.node}: {exc}") from None
        if answer.status != 200:
            raise _api_error(self.node, answer.status, answer.reason)
        return labels_of(self.node, answer.content_type, answer.body)


def labels_of(node: str, content_type: str, body: bytes) -> dict[str, str]:
    """The labels of a 200 answer to the GET of Node ``node``. Raises a transient
    :class:`NodeConfigError` naming the fault for anything but JSON of that Node with
    string labels."""

    def bad(fault: str) -> NodeConfigError:
        return NodeConfigError(
            f"the API server's answer for node {node} is not usable: {fault}", transient=True
        )

    if content_type != "application/json":
        raise bad(f"content type {content_type!r}, not application/json")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(document, dict) or document.get("kind") != "Node":
        kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
        raise bad(f"not a Node object (kind {str(kind)[:40]!r})")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        raise bad("metadata is not an object")
    if metadata.get("name") != node:
        raise bad(f"it names node {str(metadata.get('name'))[:80]!r}")
    labels = metadata.get("labels")
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise bad("metadata.labels is not an object of at most 4096 labels")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise bad("metadata.labels holds a value that is not a string")
    return labels


def _api_error(node: str, status: int, reason: str) -> NodeConfigError:
    """The error for an API server answer ``status`` to the GET of node ``node``."""
    reason = " ".join(reason.split())[:80]
    if status == 404:
        return NodeConfigError(f"node {node} does not exist in the API server")
    if status in (401, 403):
        return NodeConfigError(
            f"cannot read node {node}: {status} {reason} (the service account needs get "
            "on nodes: the chart's ClusterRole)"
        )
    return NodeConfigError(f"cannot read node {node}: {status} {reason}", transient=True)
