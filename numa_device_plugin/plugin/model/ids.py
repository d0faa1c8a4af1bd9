"""The names the plugin makes: a resource's socket file, its device ids
(``numa1-slot0042``, ``numa1-cpu0012``), and the index at the end of an id. Pure
string functions, no state."""

from __future__ import annotations

import re


def socket_name(name: str) -> str:
    """Socket file name for a resource: stable, unique per resource, no ``/``.

    ``numa-align/numa-0`` -> ``numa-align_numa-0.sock``.
    """
    return name.replace("/", "_") + ".sock"


def device_id(node_id: int, index: int) -> str:
    """Deterministic device id, e.g. ``numa1-slot0042`` (at most 63 characters)."""
    return f"numa{node_id}-slot{index:04d}"


def cpu_device_id(node_id: int, cpu: int) -> str:
    """Device id of a CPU in ``cpus`` mode, e.g. ``numa1-cpu0012``."""
    return f"numa{node_id}-cpu{cpu:04d}"


# The ids the plugin makes: numa<node>-<tag><index> (devices.py, numamemory.py), ASCII.
_DEVICE_ID = re.compile(r"numa([0-9]{1,6})-[a-z](?:[a-z0-9]*[a-z])?([0-9]{1,9})", re.ASCII)


def device_index(device_id: str, node_id: int) -> int | None:
    """The index at the end of one of NUMA node ``node_id``'s device ids
    (``numa1-cpu0012`` -> 12, ``numa0-hp2m0003`` -> 3); None for any id this plugin
    never makes for that node."""
    match = _DEVICE_ID.fullmatch(device_id)
    if match is None or int(match[1]) != node_id:
        return None
    return int(match[2])


def device_node(device_id: str) -> tuple[int, int] | None:
    """(NUMA node, index) of an id this plugin makes (``numa1-slot0042`` -> (1, 42));
    None for any other id."""
    match = _DEVICE_ID.fullmatch(device_id)
    return None if match is None else (int(match[1]), int(match[2]))
