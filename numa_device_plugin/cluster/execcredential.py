"""A kubeconfig's ``exec`` credential plugin, run as kubectl runs it.

The ``client.authentication.k8s.io`` ExecCredential protocol: the command named in the
kubeconfig's ``users[].user.exec`` prints a JSON ExecCredential whose ``status`` holds a
bearer ``token`` or a client certificate and key. Only ``top`` runs it
(:mod:`.kubeapi`, which hands the credential to the ``kubernetes`` client in place of
the ``exec`` entry): the plugin never does. It is run here, not by the client, so
that ``--timeout`` bounds it, its output is capped and, past either bound, it is
killed with its children (:func:`numa_device_plugin.ops.bounded.run_command`).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from numa_device_plugin.ops.bounded import BoundError, one_line, run_command

# Bytes an exec credential plugin may print: an ExecCredential with a client
# certificate chain is a few KB.
MAX_OUTPUT = 1 << 20


class ExecCredentialError(Exception):
    """The exec credential plugin cannot run, failed, timed out or printed no usable
    ExecCredential; the message names the kubeconfig and the command."""


def exec_credential(
    spec: dict[str, Any], base: Path, where: str, timeout: float = 60.0
) -> tuple[str | None, tuple[str, str] | None]:
    """Run a kubeconfig's ``exec`` credential plugin as kubectl does: ``command`` (a
    name with a ``/`` is taken from the kubeconfig's folder) with ``args``, ``env``
    added to the environment and ``KUBERNETES_EXEC_INFO`` describing the request,
    non-interactive, in a process group of its own that is killed when it runs past
    ``timeout`` seconds or prints more than :data:`MAX_OUTPUT` bytes. Returns the
    ExecCredential's ``status.token`` and its client certificate and key as base64
    PEM (``clientCertificateData``, ``clientKeyData``), each None when absent.
    Raises :class:`ExecCredentialError` when it cannot run, fails (its stderr's end
    quoted) or prints no usable ExecCredential."""
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ExecCredentialError(f"{where}: exec has no command")
    if "/" in command and not command.startswith("/"):
        command = str(base / command)
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ExecCredentialError(f"{where}: exec args is not a list of strings")
    env = dict(os.environ)
    for entry in spec.get("env") or []:
        if isinstance(entry, dict) and "name" in entry:
            name, value = entry["name"], entry.get("value", "")
            if not isinstance(name, str) or not isinstance(value, str | int | float):
                raise ExecCredentialError(f"{where}: exec env entries need a string name and value")
            env[name] = str(value)
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    try:
        done = run_command([command, *args], env, deadline=timeout, limit=MAX_OUTPUT)
    except BoundError as exc:
        hint = spec.get("installHint")
        raise ExecCredentialError(
            f"{where}: the exec credential plugin: {exc}"
            + (f" ({one_line(str(hint))})" if hint and not exc.timed_out else "")
        ) from None
    if done.returncode != 0:
        raise ExecCredentialError(
            f"{where}: the exec credential plugin {command!r} exited {done.returncode}: "
            f"{one_line(done.stderr.decode(errors='replace')[-300:])}"
        )
    try:
        status = json.loads(done.stdout)["status"]
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ExecCredentialError(
            f"{where}: the exec credential plugin {command!r} printed no ExecCredential "
            "with a status"
        ) from None
    client = None
    if cert and key:
        client = (
            base64.b64encode(str(cert).encode()).decode(),
            base64.b64encode(str(key).encode()).decode(),
        )
    if token is None and client is None:
        raise ExecCredentialError(
            f"{where}: the exec credential plugin {command!r} gave neither a token nor a "
            "client certificate"
        )
    return (None if token is None else str(token)), client
