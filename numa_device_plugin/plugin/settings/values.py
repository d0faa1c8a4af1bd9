"""The command line's value conversions: text (from a flag or its variable) -> value,
or ValueError with the reason, which :class:`~numa_device_plugin.cli.options.Converted`
turns into a usage error naming the flag. Also used for the per-node configuration
file's values (:mod:`numa_device_plugin.nodeconfig.configs`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from numa_device_plugin.plugin.model.resources import CPUS, Capacity, validate_capacity
from numa_device_plugin.topology import sysfs


def capacity(text: str) -> Capacity:
    """``cpus`` or a slot count within :func:`validate_capacity`'s range."""
    if text.strip().lower() == CPUS:
        return CPUS
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number or {CPUS!r}") from None
    return validate_capacity(value)


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} must be a positive number of seconds")
    return value


def grace(text: str) -> float:
    """Zero or a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} must be zero or a positive number of seconds")
    return value


def address(text: str) -> str:
    """``HOST:PORT`` or ``:PORT`` (kept as text; :func:`probes.parse_address` checks it)."""
    from numa_device_plugin.ops.probes import parse_address

    parse_address(text)
    return text


def listener(text: str) -> str:
    """An :func:`address` to listen on, or empty: no listener."""
    return address(text) if text else text


def cpulist(text: str) -> frozenset[int]:
    """A kernel cpulist such as ``0-1,8``."""
    try:
        return sysfs.parse_cpulist(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a cpulist like 0-1,8: {exc}") from None


# The floor of --memory-unit: smaller units only multiply devices.
MIN_MEMORY_UNIT = 1 << 20


def memory_unit(text: str) -> int:
    """A memory quantity of at least 1Mi, as bytes (``1Gi`` -> 1073741824)."""
    from numa_device_plugin.topology.memory import parse_quantity

    value = parse_quantity(text)
    if value < MIN_MEMORY_UNIT:
        raise ValueError(f"{text!r} is below the floor of 1Mi")
    return value


def reserved_memory(text: str) -> tuple[tuple[int, str, int], ...]:
    """The kubelet's ``--reserved-memory`` syntax: ``0:memory=1Gi;1:memory=2Gi``."""
    from numa_device_plugin.topology.memory import parse_reserved_memory

    value = parse_reserved_memory(text)
    if not value:
        raise ValueError(f"{text!r} reserves nothing; expected 0:memory=1Gi;1:memory=2Gi")
    return value


# The floor of --pod-resources-interval: below it the poller spins for nothing.
MIN_INTERVAL = 0.1


def interval(text: str) -> float:
    """A finite number of seconds, at least :data:`MIN_INTERVAL`."""
    value = seconds(text)
    if value < MIN_INTERVAL:
        raise ValueError(f"{text!r} is below the floor of {MIN_INTERVAL} seconds")
    return value


# The shortest --device-interval (a look at 1,000 PCI devices costs ~0.3 s of CPU; one
# every microsecond burned half a core idle).
MIN_DEVICE_INTERVAL = 1.0


def device_interval(text: str) -> float:
    """0 (never) or a finite number of seconds, at least :data:`MIN_DEVICE_INTERVAL`."""
    value = grace(text)
    if 0 < value < MIN_DEVICE_INTERVAL:
        raise ValueError(
            f"{text!r} is below the floor of {MIN_DEVICE_INTERVAL:g} second (0: never)"
        )
    return value


def folder(text: str) -> Path:
    """A non-empty path, made absolute against the working folder (gRPC's ``unix:``
    targets take absolute paths only; a relative one never connects)."""
    if not text:
        raise ValueError("an empty path")
    return Path(os.path.abspath(text))


def file_path(text: str) -> Path:
    """A non-empty path, made absolute (it is read later, and again on every look)."""
    return folder(text)


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name(text: str) -> str:
    """A Kubernetes node name: a DNS subdomain (at most 253 of ``[a-z0-9.-]``)."""
    if len(text) > 253 or not _DNS_SUBDOMAIN.fullmatch(text):
        raise ValueError(f"{text!r} is not a node name (lower-case DNS subdomain)")
    return text


def existing_folder(text: str) -> Path:
    """A :func:`folder` that exists now."""
    path = folder(text)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise ValueError(f"{path} {what}")
    return path


# --any-resource: numa-align/any in cpus mode (auto), always (on: refused with slots), never.
ANY_RESOURCE_VALUES = ("auto", "on", "off")


def any_resource(text: str) -> str:
    """``--any-resource``: ``auto``, ``on`` or ``off``. Raises ValueError naming the
    values."""
    if text not in ANY_RESOURCE_VALUES:
        raise ValueError(f"{text!r} is not one of {', '.join(ANY_RESOURCE_VALUES)}")
    return text
