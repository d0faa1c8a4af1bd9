"""What ``devices`` proposes to paste into the chart's values, from every node's
inventory (each plugin pod's ``/debug/state``): pure.

1. **A pool configuration** first, the align page's recipe: a ``path:`` selector for
   each mount point that holds a local data disk on *every* node read (not the root
   filesystem's disk, not ``/boot``, the kubelet's or the runtime's folders), one
   ``config.near`` for the whole fleet.
2. **Per-node entries** then (``config.named``, a node's label picks one): a disk by
   ``serial:`` (else ``wwid:``), a NIC by ``net:``, an accelerator by ``pci:``, for each
   device on exactly one NUMA node.

Everything proposed is accepted by the plugin and the chart: each selector goes
through :func:`~numa_device_plugin.topology.selectors.parse_selector` (a serial's
``*``, ``?`` and ``[`` escaped as ``[*]``, ``[?]``, ``[[]``, so that it matches only
itself), each name through the plugin's name rules and
:func:`~numa_device_plugin.plugin.model.near.check_near` (names that would clash are
numbered), each configuration name is a label value (a node name over 63 characters is
shortened with a hash). What cannot be proposed is listed in ``left_out`` with why.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from numa_device_plugin.plugin.model.names import DEFAULT_RESOURCE_PREFIX
from numa_device_plugin.plugin.model.near import (
    MAX_NEAR,
    Near,
    check_near,
    near_env,
    parse_near,
    validate_near_name,
)
from numa_device_plugin.topology.mounts import escape

KINDS = ("disks", "nics", "accelerators")
# Mount points never proposed for a pool: the system's own folders.
_SYSTEM = re.compile(r"/(boot|efi|proc|sys|dev|run|var/lib/kubelet|var/lib/containerd|"
                     r"var/lib/docker|var/run|usr|etc|tmp|var/lib/k0s|var/lib/rancher|"
                     r"var/snap/microk8s|var/lib/k3s)(/.*)?")  # fmt: skip
# A label value, and so a configuration name the chart accepts.
_CONFIG_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _nodes(value: object) -> list[int]:
    """A device's NUMA nodes: a list of non-negative integers, else none."""
    if not isinstance(value, list) or not all(_count(n) is not None for n in value):
        return []
    return list(value)


def _count(value: object) -> int | None:
    """A non-negative integer (never a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _texts(value: object) -> list[str] | None:
    """A list's text items (one text: a list of it); None when it is neither."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str) and item]
    return None


def clean(inventory: object) -> dict[str, list[dict[str, Any]]]:
    """An inventory from an answer, each field of its type or None (a list of numbers
    for ``nodes``, text for names and ids, an integer for ``size_bytes``; ``pci`` a
    list): a hostile or odd answer shows ``-`` and proposes nothing for that field."""
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    if not isinstance(inventory, dict):
        return found
    for kind in KINDS:
        listed = inventory.get(kind)
        for item in listed if isinstance(listed, list) else []:
            if not isinstance(item, dict):
                continue
            found[kind].append({
                "name": _text(item.get("name")), "nodes": _nodes(item.get("nodes")),
                "node": _count(item.get("node")), "serial": _text(item.get("serial")),
                "wwid": _text(item.get("wwid")), "model": _text(item.get("model")),
                "driver": _text(item.get("driver")), "size_bytes": _count(item.get("size_bytes")),
                "pci": _texts(item.get("pci")) or [], "id": _text(item.get("id")),
                "class_name": _text(item.get("class_name")),
                "mountpoints": _texts(item.get("mountpoints")),
            })  # fmt: skip
    return found


def escape_pattern(value: str) -> str:
    """``value`` as a serial or wwid that matches only itself: ``*``, ``?`` and ``[``
    in brackets (``WD-[AB]?`` -> ``WD-[[]AB][?]``)."""
    return re.sub(r"[*?\[]", lambda match: f"[{match[0]}]", value)


def config_name(node: str) -> str:
    """A configuration name and label value for node ``node``: itself when it is one,
    else its first 54 characters (dots and dashes at the ends dropped) and a hash."""
    if _CONFIG_NAME.fullmatch(node):
        return node
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", node)[:54].strip("-_.") or "node"
    return f"{head}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"


def _name(kind: str, text: str) -> str:
    """``<kind>-`` and ``text`` in lower case, each run of other characters a dash."""
    return f"{kind}-" + re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


class _Entries:
    """One configuration's near entries, as the plugin would take them."""

    def __init__(self, where: str, left_out: list[str]) -> None:
        self.where = where
        self.left_out = left_out
        self.near: dict[str, str] = {}
        self._parsed: list[Near] = []

    def add(self, name: str, selector: str, what: str) -> None:
        """Propose ``name`` (numbered ``-2``, ``-3``… where its variable is taken) for
        ``selector``, or say in ``left_out`` why the plugin would refuse it."""
        taken = {near_env(entry.name) for entry in self._parsed}
        base = name.strip("-")
        names = [base, *(f"{base}-{n}" for n in range(2, 100))]
        candidate = next((n for n in names if near_env(n) not in taken), None)
        if candidate is None:
            self.left_out.append(f"{self.where}: {what}: no free name")
            return
        if len(self._parsed) >= MAX_NEAR:
            self.left_out.append(f"{self.where}: {what}: over {MAX_NEAR} entries")
            return
        try:
            validate_near_name(DEFAULT_RESOURCE_PREFIX, candidate)
            entry = parse_near(f"{candidate}={selector}")
            check_near(DEFAULT_RESOURCE_PREFIX, [*self._parsed, entry])
        except ValueError as exc:
            self.left_out.append(f"{self.where}: {what}: {exc}")
            return
        self._parsed.append(entry)
        self.near[candidate] = selector


def data_mounts(found: Mapping[str, list[dict[str, Any]]]) -> dict[str, str] | None:
    """Mount point -> disk for each local data disk's mount point of one node (a disk on
    one NUMA node, not the disk of ``/``, not a system folder); None when the node's
    mount points are unknown."""
    disks = found["disks"]
    if any(d["mountpoints"] is None for d in disks) or not disks:
        return None if any(d["mountpoints"] is None for d in disks) else {}
    root = {d["name"] for d in disks if "/" in d["mountpoints"]}
    points: dict[str, str] = {}
    for disk in disks:
        if disk["name"] in root or len(disk["nodes"]) != 1 or not disk["name"]:
            continue
        for point in disk["mountpoints"]:
            if point != "/" and not _SYSTEM.fullmatch(point):
                points[point] = disk["name"]
    return points


def propose(nodes: Mapping[str, Mapping[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """``{"pool": {"near": {NAME: "path:…"}}, "named": {config: {"near": {…}}},
    "config_names": {config: node} (only where they differ), "left_out": [why…]}`` for
    the nodes' clean inventories (:func:`clean`)."""
    left_out: list[str] = []
    per_node = {node: data_mounts(found) for node, found in nodes.items()}
    unknown = sorted(node for node, points in per_node.items() if points is None)
    pool = _Entries("pool", left_out)
    if unknown:
        left_out.append(f"pool: the mount points of {len(unknown)} node(s) are unknown (their "
                        f"plugin reads a container's mount table: host.mountTable), e.g. "
                        f"{unknown[0]}")  # fmt: skip
    elif per_node:
        common = set.intersection(*(set(points or {}) for points in per_node.values()))
        for point in sorted(common):
            name = re.sub(r"[^a-z0-9]+", "-", point.lower()).strip("-")[-40:].strip("-")
            pool.add(name or "root", f"path:{escape(point)}", f"mount point {point!r}")
    named: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for node in sorted(nodes):
        found = nodes[node]
        config = config_name(node)
        if config in named:  # two long names with one head and hash: never seen
            left_out.append(f"{node}: its configuration name {config} is taken")
            continue
        entries = _Entries(node, left_out)
        for disk in found["disks"]:
            ids = [("serial", disk["serial"]), ("wwid", disk["wwid"])]
            usable = [(k, v) for k, v in ids if v is not None and " " not in v]
            if len(disk["nodes"]) == 1 and usable and disk["name"]:
                kind, value = usable[0]
                entries.add(_name("disk", disk["name"]), f"{kind}:{escape_pattern(value)}",
                            f"disk {disk['name']!r}")  # fmt: skip
        for nic in found["nics"]:
            if len(nic["nodes"]) == 1 and nic["name"]:
                entries.add(_name("nic", nic["name"]), f"net:{nic['name']}",
                            f"NIC {nic['name']!r}")  # fmt: skip
        for device in found["accelerators"]:
            if device["node"] is not None and device["pci"]:
                entries.add(_name("pci", device["pci"][0]), f"pci:{device['pci'][0]}",
                            f"PCI device {device['pci'][0]!r}")  # fmt: skip
        if entries.near:
            named[config] = {"near": entries.near}
            if config != node:
                names[config] = node
    return {"pool": {"near": pool.near} if pool.near else {}, "named": named,
            "config_names": names, "left_out": left_out}  # fmt: skip
