"""The node's labels, read from the API server.

A pod cannot see its node's labels through the downward API (it offers the pod's own
labels and ``spec.nodeName``, not the node's), so the plugin asks the API server: a
GET of its own Node object, ``/api/v1/nodes/<name>``, with the pod's service account
token, once per ``--node-config-interval`` (60 s: less than the kubelet's own lease
renewals, one per 10 s). That needs RBAC
``get`` on ``nodes`` (the chart's ClusterRole).

The ``kubernetes`` client is imported only here and only when per-node configuration
is on: it costs ~0.4 s and ~36 MB RSS.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from numa_device_plugin.nodeconfig import NodeConfigError

# Seconds one read may take (connect plus answer).
READ_TIMEOUT = 10.0


class NodeLabelReader:
    """Reads node ``node``'s labels. ``kubeconfig``: a kubeconfig file; None: the pod's
    in-cluster configuration (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the token under
    ``/var/run/secrets/kubernetes.io/serviceaccount``). Blocking: call it in a thread."""

    def __init__(self, node: str, kubeconfig: Path | None = None) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self._api: Any = None

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                if self.kubeconfig is not None:
                    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                        str(self.kubeconfig)
                    )
                else:
                    configuration = client.Configuration()
                    config.load_incluster_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration
                    )
                    api_client = client.ApiClient(configuration)
            except (config.ConfigException, OSError, ValueError) as exc:
                where = self.kubeconfig or "the in-cluster service account"
                raise NodeConfigError(
                    f"cannot configure the API client from {where}: {exc}"
                ) from None
            self._api = client.CoreV1Api(api_client)
        return self._api

    def read(self) -> Mapping[str, str]:
        """The node's labels (``metadata.labels``, {} when it has none). Raises
        :class:`NodeConfigError`: ``transient`` for a failed read (API server down,
        timeout, 5xx); not transient when the node does not exist or access is
        forbidden (RBAC), which a retry will not mend by itself."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api = self._client()
        try:
            found = api.read_node(self.node, _request_timeout=READ_TIMEOUT)
        except ApiException as exc:
            raise _api_error(self.node, exc.status, exc.reason) from None
        except (HTTPError, OSError) as exc:
            raise NodeConfigError(
                f"cannot reach the API server to read node {self.node}: {type(exc).__name__}",
                transient=True,
            ) from None
        return dict(found.metadata.labels or {})


def _api_error(node: str, status: int | None, reason: str | None) -> NodeConfigError:
    """The error for an API server answer ``status`` to the GET of node ``node``."""
    if status == 404:
        return NodeConfigError(f"node {node} does not exist in the API server")
    if status in (401, 403):
        return NodeConfigError(
            f"cannot read node {node}: {status} {reason} (the service account needs get "
            "on nodes: the chart's ClusterRole)"
        )
    return NodeConfigError(f"cannot read node {node}: {status} {reason}", transient=True)
