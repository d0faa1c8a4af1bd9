"""``numa-device-plugin devices`` (also ``kubectl numa devices``): every node's disks
(with their mount points), NICs and accelerators with their NUMA nodes, gathered from
the plugin's pods, then a pool configuration (``config.near`` by ``path:``, for the
mount points every node shares) and a ``config.named`` map of per-node ``near:``
selectors, ready to paste into the chart's values (:mod:`.proposal`).

It lists the plugin's pods (``GET /api/v1/namespaces/<namespace>/pods`` with a label
selector) and reads each running one's ``/debug/state`` through the API server's pod
proxy, concurrently and each within the one deadline (:mod:`.cluster.fleet`), with
the kubeconfig kubectl would use. The user needs ``list pods`` and ``get pods/proxy``
in that namespace, and the plugin its debug endpoints on (``config.debugEndpoints``,
the chart's default).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import yaml

from numa_device_plugin.cli import apireads, options
from numa_device_plugin.cli.escaped import shown
from numa_device_plugin.cli.proposal import clean, propose


@click.command(
    "devices",
    help="List every node's disks (with mount points), NICs and accelerators with their "
    "NUMA nodes, read from each plugin pod's /debug/state through the API server's pod "
    "proxy (needs list pods and get pods/proxy in --plugin-namespace), then a pool "
    "configuration "
    "(path: selectors for the mount points every node shares) and a config.named map of "
    "per-node near: selectors to paste into the chart's values. Runs the kubeconfig's "
    "exec credential plugin, as kubectl does.",
)
@apireads.api_kubeconfig
@click.option(
    "--plugin-namespace",
    "namespace",
    default="kube-system",
    show_default=True,
    envvar="NUMA_PLUGIN_NAMESPACE",
    show_envvar=True,
    help="the plugin's namespace (as in check)",
)
@click.option("--namespace", "-n", "workloads", hidden=True, default=None,
              help="refused: devices reads no workload namespace")  # fmt: skip
@apireads.plugin_selector
@apireads.plugin_port
@apireads.plugin_pod_timeout
@apireads.api_timeout
@options.apply(options.output)
def command(**params: Any) -> int:
    """0 after printing (a pod that could not be read is named on stderr); 1 when the
    pods cannot be listed or none could be read."""
    from numa_device_plugin.cluster.fleet import plugin_pods, read_fleet

    if params.pop("workloads") is not None:
        raise click.UsageError(
            "-n/--namespace is kubectl's namespace of workloads, which devices does not "
            "read; the plugin's namespace is --plugin-namespace (as in check)"
        )

    fleet = apireads.read_within_deadline("devices", params, lambda api: read_fleet(
        api, params["namespace"], plugin_pods(api, params["namespace"], params["selector"]),
        params["port"], pod_seconds=params["pod_timeout"]))  # fmt: skip
    if fleet is None:
        return 1
    for problem in fleet.problems:
        print(f"{apireads.speaker('devices')}: {shown(problem)}", file=sys.stderr)
    for node, names in sorted(fleet.doubled.items()):
        print(f"{apireads.speaker('devices')}: node {shown(node)} has {len(names)} plugin pods "
              f"({shown(', '.join(names))}); shown: "
              f"{shown(fleet.states[node].pod) if node in fleet.states else 'none'}",
              file=sys.stderr)  # fmt: skip
    if not fleet.states:
        print(f"{apireads.speaker('devices')}: no running plugin pod could be read "
              f"(namespace {params['namespace']}, selector {params['selector']})",
              file=sys.stderr)  # fmt: skip
        return 1
    states = {node: ps.state for node, ps in fleet.states.items()}
    fleet.states.clear()  # each answer freed once cleaned (devices_document empties states)
    document = devices_document(states)
    if params["output"] == "json":  # written as it is encoded: no whole text held
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print(render_devices(document), end="")
    return 0


def devices_document(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"nodes": [{"name", "disks", "nics", "accelerators"}], "pool": {"near": {NAME:
    "path:…"}}, "named": {config: {"near": {NAME: SELECTOR}}}, "config_names": {config:
    node}, "left_out": [why…]}`` from each node's ``/debug/state`` (its ``inventory``),
    every field of its type (:func:`~numa_device_plugin.cli.proposal.clean`). ``states``
    is emptied as each node is cleaned: a fleet's raw answers and their cleaned rows are
    never all held at once. The proposal is
    :func:`~numa_device_plugin.cli.proposal.propose`'s."""
    # A plugin serves a null inventory until it has read its devices (once registered):
    # not a node without disks. Named, and the proposal made from the others.
    unread = [node for node in sorted(states) if states[node].get("inventory") is None]
    nodes = {node: clean(states.pop(node).get("inventory")) for node in sorted(states)}
    proposal = propose({node: found for node, found in nodes.items() if node not in unread})
    proposal["left_out"] = [
        *(f"{node}: its plugin has not read its devices yet (it reads them once "
          "registered); run again in a moment" for node in unread),
        *proposal["left_out"],
    ]  # fmt: skip
    return {"nodes": [{"name": node, **found} for node, found in nodes.items()], **proposal}


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


def listed(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with its ``near`` map's selectors each in a list (``{ch: [path:/data]}``):
    the values form that takes a second selector without a second key (YAML keeps only
    the last of two, and helm says nothing)."""
    near = settings.get("near")
    if not isinstance(near, dict):
        return settings
    return {**settings, "near": {name: [s] if isinstance(s, str) else s
                                 for name, s in near.items()}}  # fmt: skip


def render_devices(document: dict[str, Any]) -> str:
    """The table (NODE, NUMA, KIND, NAME, ID, MODEL, SIZE, PCI, DRIVER, MOUNTPOINTS),
    then the pool configuration (``config.near``) and the per-node one
    (``config.named``) as YAML, with what was left out as comments."""
    rows = [("NODE", "NUMA", "KIND", "NAME", "ID", "MODEL", "SIZE", "PCI", "DRIVER",
             "MOUNTPOINTS")]  # fmt: skip
    for node in document["nodes"]:
        host = _cell(node["name"])
        for disk in node["disks"]:
            rows.append((host, _cell(disk["nodes"]), "disk", _cell(disk["name"]),
                         _cell(disk["serial"] or disk["wwid"]), _cell(disk["model"]),
                         disk_size(disk["size_bytes"]), _cell(disk["pci"]), "-",
                         _cell(disk["mountpoints"])))  # fmt: skip
        for nic in node["nics"]:
            rows.append((host, _cell(nic["nodes"]), "nic", _cell(nic["name"]), "-", "-", "-",
                         _cell(nic["pci"]), _cell(nic["driver"]), "-"))  # fmt: skip
        for device in node["accelerators"]:
            rows.append((host, _cell(device["node"]), "pci", _cell(device["pci"]),
                         _cell(device["id"]), _cell(device["class_name"]), "-",
                         _cell(device["pci"]), "-", "-"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )
    if document["pool"] or document["named"]:
        text += (
            "\n# Each name's selectors are a list: a name written twice in YAML keeps only "
            "the last\n# (helm says nothing); add a selector to the list instead (all must "
            "agree).\n"
        )
    if document["pool"]:
        text += (
            "\n# One configuration for every node: the disk mounted at each of these paths "
            "on all of them\n# (the align page's recipe; the chart mounts the host's mount "
            "table for path:).\n"
        )
        text += yaml.safe_dump({"config": listed(document["pool"])}, sort_keys=False)
    if document["named"]:
        text += (
            "\n# Per node, a configuration of its devices (label each node "
            "numa-align/config=<its name>);\n# keep the entries you need, or give a pool "
            "one name with path: or a serial pattern.\n"
        )
        for config, node in document["config_names"].items():
            text += f"# {shown(config)} is node {shown(node)} (its name is no label value)\n"
        named = {config: listed(settings) for config, settings in document["named"].items()}
        text += yaml.safe_dump({"config": {"named": named}}, sort_keys=False)
    for why in document["left_out"]:
        text += f"# left out: {shown(why)}\n"
    return text
