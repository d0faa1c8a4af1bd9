"""The names of extended resources: the plugin's ``<prefix>/numa-<id>``, and the
kubelet's rules for any extended resource name (the prefix, a resource that follows a
device). Pure string functions."""

from __future__ import annotations

import re

DEFAULT_RESOURCE_PREFIX = "numa-align"

# Kubernetes apimachinery validation, as the kubelet applies it to resource names.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_REQUESTS_PREFIX = "requests."


def validate_extended_resource_name(name: str) -> None:
    """Raise ValueError unless the kubelet accepts ``name`` as an extended resource name.

    The kubelet's Register handler checks ``IsExtendedResourceName``: the name
    contains ``/``, is not in the ``kubernetes.io/`` domain, does not start with
    ``requests.``, and ``requests.`` + name is a qualified name (a DNS-1123
    subdomain of at most 253 characters, ``/``, a name part of at most 63).
    """
    if "/" not in name:
        raise ValueError(
            f"{quoted(name)} has no domain: extended resource names look like domain/name"
        )
    if "kubernetes.io/" in name:
        raise ValueError(
            f"{quoted(name)} is in the kubernetes.io domain, reserved for native resources"
        )
    if name.startswith(_REQUESTS_PREFIX):
        raise ValueError(f"{quoted(name)} must not start with {_REQUESTS_PREFIX!r}")
    domain, _, part = (_REQUESTS_PREFIX + name).partition("/")
    if "/" in part:
        raise ValueError(f"{quoted(name)} has more than one '/'")
    if len(domain) > 253 or not _DNS1123_SUBDOMAIN.match(domain):
        raise ValueError(
            f"{quoted(name)}: domain {quoted(domain.removeprefix(_REQUESTS_PREFIX))} must be a "
            "lowercase DNS subdomain (a-z, 0-9, '-', '.'; at most 244 characters)"
        )
    if len(part) > 63 or not _QUALIFIED_NAME_PART.match(part):
        raise ValueError(
            f"{quoted(name)}: name part {quoted(part)} must be 1-63 characters of A-Z, a-z, "
            "0-9, '-', '_', '.', starting and ending with a letter or digit"
        )


def quoted(text: str) -> str:
    """``repr(text)`` for an error message, cut to 80 characters with the length said
    (a 120 KB name echoed whole made a 240 KB usage error)."""
    if len(text) <= 80:
        return repr(text)
    return f"{text[:60]!r}... ({len(text)} characters)"


# The resource over every NUMA node with CPUs, ``<prefix>/any`` (and its memory
# resources, ``any-memory``, ``any-hugepages-2mi``).
ANY_NAME = "any"


def any_name(prefix: str) -> str:
    """``<prefix>/any``, e.g. ``numa-align/any``."""
    return f"{prefix}/{ANY_NAME}"


def socket_resource_name(prefix: str, socket: int) -> str:
    """``<prefix>/socket-<socket>``, e.g. ``numa-align/socket-1``: the NUMA nodes with
    CPUs of one socket (physical package)."""
    return f"{prefix}/socket-{socket}"


def resource_name(prefix: str, node_id: int) -> str:
    """``<prefix>/numa-<node_id>``, e.g. ``numa-align/numa-1``."""
    return f"{prefix}/numa-{node_id}"


def validate_resource_prefix(prefix: str) -> str:
    """Return ``prefix`` when ``<prefix>/numa-N`` is a valid extended resource name.

    Raises ValueError with the kubelet's reason otherwise.
    """
    validate_extended_resource_name(resource_name(prefix, 0))
    return prefix
