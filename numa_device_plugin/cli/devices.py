"""``numa-device-plugin devices`` (also ``kubectl numa devices``): every node's disks,
NICs and accelerators with their NUMA nodes, gathered from the plugin's pods, and a
``config.named`` map of ``near:`` selectors ready to paste into the chart's values.

It lists the plugin's pods (``GET /api/v1/namespaces/<namespace>/pods`` with a label
selector) and reads each running one's ``/debug/state`` through the API server's pod
proxy (``GET …/pods/<name>:<port>/proxy/debug/state``), with the kubeconfig kubectl
would use, all within one deadline (:mod:`numa_device_plugin.cluster.kubeapi`). The
user needs ``list pods`` and ``get pods/proxy`` in that namespace, and the plugin its
debug endpoints on (``config.debugEndpoints``, the chart's default).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import quote

import click
import yaml

from numa_device_plugin.cli import options
from numa_device_plugin.cli.escaped import shown

DEFAULT_SELECTOR = "app.kubernetes.io/name=numa-device-plugin"
PODS_PER_PAGE = 100
KINDS = ("disks", "nics", "accelerators")


@click.command(
    "devices",
    help="List every node's disks, NICs and accelerators with their NUMA nodes, read from "
    "each plugin pod's /debug/state through the API server's pod proxy (needs list pods "
    "and get pods/proxy in --namespace), then a config.named map of near: selectors to "
    "paste into the chart's values. Runs the kubeconfig's exec credential plugin, as "
    "kubectl does.",
)
@options.api_kubeconfig
@click.option(
    "--namespace",
    default="kube-system",
    show_default=True,
    envvar="NUMA_NAMESPACE",
    show_envvar=True,
    help="the plugin's namespace",
)
@click.option(
    "--selector",
    default=DEFAULT_SELECTOR,
    show_default=True,
    envvar="NUMA_SELECTOR",
    show_envvar=True,
    help="the label selector of the plugin's pods",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=9201,
    show_default=True,
    envvar="NUMA_PORT",
    show_envvar=True,
    help="the plugin's metrics port (config.metricsPort), where /debug/state is",
)
@options.api_timeout
@options.apply(options.output)
def command(**params: Any) -> int:
    """0 after printing (a pod that could not be read is named on stderr); 1 when the
    pods cannot be listed or none could be read."""
    from numa_device_plugin.cluster.kubeapi import (
        ApiError,
        DeadlinePassed,
        KubeApi,
        load_client,
        total_deadline,
    )

    namespace = quote(params["namespace"], safe="")
    states: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    try:
        load_client()
        with total_deadline(params["timeout"]) as deadline:
            api = KubeApi(params["kubeconfig"], deadline)
            try:
                pods = api.list(
                    f"/api/v1/namespaces/{namespace}/pods?limit={PODS_PER_PAGE}"
                    f"&labelSelector={quote(params['selector'], safe='')}",
                    "Pod",
                )
                for pod in pods:
                    name = str(pod.get("metadata", {}).get("name", ""))
                    node = str(pod.get("spec", {}).get("nodeName") or "")
                    if pod.get("status", {}).get("phase") != "Running" or not node:
                        continue
                    path = (f"/api/v1/namespaces/{namespace}/pods/{quote(name, safe='')}:"
                            f"{params['port']}/proxy/debug/state")  # fmt: skip
                    try:
                        states[node] = api.get(path, None)
                    except ApiError as exc:
                        problems.append(f"{node} ({name}): {exc}")
            finally:
                api.close()
    except DeadlinePassed:
        print(f"numa-device-plugin devices: not done within {params['timeout']:g} s "
              "(--timeout)", file=sys.stderr)  # fmt: skip
        return 1
    except (ApiError, ValueError) as exc:
        print(f"numa-device-plugin devices: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"numa-device-plugin devices: {problem}", file=sys.stderr)
    if not states:
        print(f"numa-device-plugin devices: no running plugin pod could be read "
              f"(namespace {params['namespace']}, selector {params['selector']})",
              file=sys.stderr)  # fmt: skip
        return 1
    document = devices_document(states)
    if params["output"] == "json":
        print(json.dumps(document, indent=2))
    else:
        print(render_devices(document), end="")
    return 0


def devices_document(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"nodes": [{"name", "disks", "nics", "accelerators"}], "named": {node: {"near":
    {NAME: SELECTOR}}}}`` from each node's ``/debug/state`` document (its ``inventory``);
    pure. A node's ``named`` entry has a selector for each device on exactly one NUMA
    node: ``serial:`` (else ``wwid:``) for a disk, ``net:`` for a NIC, ``pci:`` for an
    accelerator, named by kind and kernel name or address."""
    nodes = []
    named: dict[str, dict[str, Any]] = {}
    for node in sorted(states):
        inventory = states[node].get("inventory") or {}
        found = {kind: [d for d in inventory.get(kind) or [] if isinstance(d, dict)]
                 for kind in KINDS}  # fmt: skip
        nodes.append({"name": node, **found})
        near: dict[str, str] = {}
        for name, selector in near_entries(found):
            near.setdefault(name, selector)
        if near:
            named[node] = {"near": near}
    return {"nodes": nodes, "named": named}


def near_entries(found: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str]]:
    """(name, selector) of each device of one NUMA node in ``found`` (see
    :func:`devices_document`)."""
    entries = []
    for disk in found["disks"]:
        ids = [f"serial:{disk['serial']}" if disk.get("serial") else None,
               f"wwid:{disk['wwid']}" if disk.get("wwid") else None]  # fmt: skip
        selector = next((i for i in ids if i and " " not in i), None)
        if len(disk.get("nodes") or []) == 1 and selector:
            entries.append((_name("disk", disk.get("name")), selector))
    for nic in found["nics"]:
        if len(nic.get("nodes") or []) == 1 and nic.get("name"):
            entries.append((_name("nic", nic["name"]), f"net:{nic['name']}"))
    for device in found["accelerators"]:
        if isinstance(device.get("node"), int) and device["node"] >= 0 and device.get("pci"):
            entries.append((_name("pci", device["pci"]), f"pci:{device['pci']}"))
    return entries


def _name(kind: str, text: object) -> str:
    """A near name: ``<kind>-`` and the device's name in lower case, each run of
    characters other than letters and digits one dash (``nic-ens1f0``, ``pci-0000-41-00-0``)."""
    return f"{kind}-" + re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:40]


def _cell(value: object) -> str:
    """A table cell: ``-`` for nothing, a list comma-separated, every character a
    terminal would act on escaped (:func:`~numa_device_plugin.cli.escaped.shown`)."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, list):
        return ",".join(map(shown, value))
    return shown(value)


def disk_size(size: object) -> str:
    """A disk's size (bytes, from 512-byte sectors of ``/sys/class/block/<disk>/size``) as ``lsblk``
    shows it, in binary units with at most one decimal: 16777216 -> ``16M``,
    1000204886016 -> ``931.5G``, 512 -> ``512B``; anything but a non-negative integer
    (a hostile or missing field) -> ``-``."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return "-"
    value, unit = float(size), "B"
    for bigger in "KMGTPE":
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f}".removesuffix(".0") + unit


def render_devices(document: dict[str, Any]) -> str:
    """The table (NODE, NUMA, KIND, NAME, ID, MODEL, SIZE, PCI, DRIVER) and, below it,
    the ``config.named`` map as YAML."""
    rows = [("NODE", "NUMA", "KIND", "NAME", "ID", "MODEL", "SIZE", "PCI", "DRIVER")]
    for node in document["nodes"]:
        host = _cell(node["name"])
        for disk in node["disks"]:
            rows.append((host, _cell(disk.get("nodes")), "disk", _cell(disk.get("name")),
                         _cell(disk.get("serial") or disk.get("wwid")), _cell(disk.get("model")),
                         disk_size(disk.get("size_bytes")),
                         _cell(disk.get("pci")), "-"))  # fmt: skip
        for nic in node["nics"]:
            rows.append((host, _cell(nic.get("nodes")), "nic", _cell(nic.get("name")), "-",
                         "-", "-", _cell(nic.get("pci")), _cell(nic.get("driver"))))  # fmt: skip
        for device in node["accelerators"]:
            rows.append((host, _cell(device.get("node")), "pci", _cell(device.get("pci")),
                         _cell(device.get("id")), _cell(device.get("class_name")), "-",
                         _cell(device.get("pci")), "-"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )
    if document["named"]:
        text += (
            "\n# Per node, a configuration of its devices (label each node "
            "numa-align/config=<its name>);\n# keep the entries you need, or give a pool "
            "one name with path: or a serial pattern.\n"
        )
        text += yaml.safe_dump({"config": {"named": document["named"]}}, sort_keys=False)
    return text
