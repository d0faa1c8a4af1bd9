"""``numa-device-plugin discover``: the NUMA nodes sysfs shows and the resources the
plugin would advertise, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from numa_device_plugin.cli import hostviews, options
from numa_device_plugin.cli.escaped import shown
from numa_device_plugin.ops.logs import configure_logging
from numa_device_plugin.plugin.advertised.discovery import Discovery, near_document
from numa_device_plugin.plugin.model.near import near_env
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.bynode import NO_DEVICES, devices_by_node, unlocated_pci
from numa_device_plugin.topology.details import details
from numa_device_plugin.topology.memory import format_quantity


@click.command("discover", help="Print the NUMA nodes and the resources that would be advertised.")
@options.apply(
    options.sysfs_root,
    options.resource_prefix,
    options.capacity_option,
    options.include_cpuless_nodes,
    options.memory_unit_option,
    options.any_resource,
    options.socket_resources,
    options.near_option,
    options.output,
    options.quiet_log_level,
)
@click.option(
    "--check",
    is_flag=True,
    envvar="NUMA_CHECK",
    show_envvar=True,
    help="exit 1 when a --near resource would not be advertised on this node, naming "
    "each on stderr with why (a pre-flight a rollout can be gated on)",
)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """0 after printing; with ``--check``, 1 when some ``--near`` resource would not be
    advertised (each named on stderr); a malformed sysfs file raises SysfsError (exit 1
    from main); a near name the prefix makes invalid exits 2 with usage."""
    configure_logging(params["log_level"], "text")
    hostviews.own_mount_table(ctx, params)
    try:
        config = Config(
            sysfs_root=params["sysfs_root"],
            resource_prefix=params["resource_prefix"],
            capacity=params["capacity"],
            include_cpuless_nodes=params["include_cpuless_nodes"],
            memory_unit=params["memory_unit"],
            near=params["near"],
            mount_table=params["mount_table"],
            any_resource=params["any_resource"],
            socket_resources=params["socket_resources"],
        )
    except ValueError as exc:
        raise click.UsageError(str(exc), ctx) from None
    document = discovery_json(options.discover_or_usage(ctx, config), config.sysfs_root)
    click.echo(json.dumps(document, indent=2) if params["output"] == "json" else table(document))
    if not params["check"]:
        return 0
    missing = [entry for entry in document["near"] if not entry["nodes"]]
    for entry in missing:
        click.echo(f"numa-device-plugin discover: {shown(entry['resource'])} would not be "
                   f"advertised: {shown(entry['reason'] or 'no NUMA node')}", err=True)  # fmt: skip
    return 1 if missing else 0


def discovery_json(discovery: Discovery, root: Path | None = None) -> dict[str, Any]:
    """The ``discover --output json`` document: nodes sorted by id, then resource names,
    then each resource's device count (``devices``: name -> count; with
    ``--memory-unit`` the memory and hugepage resources' counts are memory over the
    unit), then ``spanning``: per resource over several NUMA nodes its ``nodes`` (one of
    them is offered at a time: the one with the most room) and, for a memory resource,
    the resource whose exposed node it ``follows``, then ``near``: per ``--near`` entry
    its resource, selector, matched devices,
    NUMA nodes and why nothing is advertised (``reason``, null when advertised), then
    ``unlocated_pci``: PCI devices whose ``numa_node`` is -1. ``memory_bytes`` and
    ``distances`` are null where their sysfs file was malformed; ``hugepages``: page
    size (``2Mi``) -> pages, per sysfs; ``devices`` of a node: its disks, NICs and
    accelerators (``address class``) and its PCI device count; ``nearest`` of a node
    that is not advertised: where a device on it goes (:class:`~numa_device_plugin.
    topology.nearest.Nearest`'s document; null for an advertised node); ``sockets``:
    the physical packages of its CPUs. With ``root`` (the sysfs
    root read), ``inventory``: what a selector needs (:func:`~numa_device_plugin.
    topology.details.details`: each disk's serial, wwid, model, size and PCI address,
    each NIC's PCI address and driver, each accelerator's class and ids)."""
    nodes = []
    inventory = discovery.inventory
    found = devices_by_node(inventory)
    nearest = discovery.nearest
    for plan in sorted(discovery.plans, key=lambda plan: plan.node.id):
        node = plan.node
        here = found.get(node.id, NO_DEVICES)
        nodes.append(
            {
                "id": node.id,
                "cpus": sysfs.format_cpulist(node.cpus),
                "memory_bytes": node.memory_bytes,
                "distances": None
                if node.distances is None
                else {str(other): value for other, value in sorted(node.distances.items())},
                "hugepages": {format_quantity(size): pages for size, pages in node.hugepages},
                "advertised": plan.advertised,
                "reason": plan.reason,
                "devices": here.document(),
                "sockets": sorted(node.sockets),
                "nearest": nearest[node.id].document() if node.id in nearest else None,
            }
        )
    return {
        "nodes": nodes,
        "resources": list(discovery.resources),
        "devices": {name: len(r.devices) for name, r in discovery.resources.items()},
        "spanning": {
            name: {"nodes": list(r.node_ids), "follows": r.follows if r.memory else None}
            for name, r in discovery.resources.items()
            if r.spans
        },
        "near": [near_document(entry) for entry in discovery.near],
        "unlocated_pci": unlocated_pci(inventory),
        "inventory": discovery.details
        if discovery.details is not None or root is None
        else details(root, inventory),
    }


def table(document: dict[str, Any]) -> str:
    """:func:`discovery_json`'s document as aligned columns and a line of resources."""
    header = ("NODE", "CPUS", "MEMORY_BYTES", "DISTANCES", "ADVERTISED", "REASON")
    rows = [header]
    for node in document["nodes"]:
        distances = ",".join(f"{k}:{v}" for k, v in (node["distances"] or {}).items()) or "-"
        memory = "-" if node["memory_bytes"] is None else str(node["memory_bytes"])
        rows.append(
            (
                str(node["id"]),
                node["cpus"] or "-",
                memory,
                distances,
                "yes" if node["advertised"] else "no",
                node["reason"] or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    listed = [f"{name} ({document['devices'][name]})" for name in document["resources"]]
    lines.append("resources (devices): " + (", ".join(listed) or "(none)"))
    for name, spans in document.get("spanning", {}).items():
        nodes = ",".join(map(str, spans["nodes"]))
        lines.append(
            f"{name} lies on NUMA nodes {nodes}: "
            + (
                f"only the node {spans['follows']} exposes offers its free devices"
                if spans["follows"]
                else "only the node with the most room (free CPUs) offers its free devices, "
                "so the scheduler sees what fits on one node"
            )
        )
    found_any = document["unlocated_pci"] or any(
        node["devices"]["pci"] or node["devices"]["disks"] or node["devices"]["nics"]
        for node in document["nodes"]
    )
    if found_any:
        lines.append("devices by NUMA node:")
    for node in document["nodes"] if found_any else ():
        found = node["devices"]
        parts = [
            f"{label} {', '.join(found[key])}"
            for key, label in (("disks", "disks"), ("nics", "NICs"), ("accelerators", "accel"))
            if found[key]
        ]
        follows = node.get("nearest")
        goes = (f"; a resource near them follows NUMA node(s) {','.join(map(str, follows['to']))}"
                if follows and follows["to"] and (found["pci"] or parts) else "")  # fmt: skip
        lines.append(f"  {node['id']}: " + ("; ".join(parts) or "-") + f" ({found['pci']} PCI)"
                     + goes)  # fmt: skip
    if document["unlocated_pci"]:
        lines.append(
            f"  no NUMA locality (numa_node -1): {document['unlocated_pci']} PCI device(s)"
        )
    follows = {node["id"]: node["nearest"]["to"] for node in document["nodes"]
               if node.get("nearest") and node["nearest"]["to"]}  # fmt: skip
    lines.extend(inventory_lines(document.get("inventory"), follows))
    for entry in document["near"]:
        if entry["reason"] is None:
            nodes = ",".join(map(str, entry["nodes"]))
            more = entry["matched_count"] - len(entry["matched"])
            told = sorted({name for names in entry["by_node"].values() for name in names})
            variable = near_env(entry["resource"].rpartition("/")[2])
            # a partition or a path's mount is matched; the pod is told its disk
            tells = (f"; {variable}={shown(','.join(told))} in the pod"
                     if told and told != sorted(entry["matched"]) else "")  # fmt: skip
            lines.append(
                f"near {entry['resource']} ({shown(entry['selector'])}): NUMA node(s) {nodes}, "
                f"from {shown(', '.join(entry['matched']))}"
                + (f" and {more} more" if more else "")
                + tells
                + "".join(f"; {shown(line)}" for line in entry.get("followed", ()))
            )
        else:
            lines.append(f"near {entry['resource']}: not advertised: {shown(entry['reason'])}")
    return "\n".join(lines)


def inventory_lines(
    inventory: dict[str, list[dict[str, Any]]] | None,
    follows: dict[int, list[int]] | None = None,
) -> list[str]:
    """The inventory as lines, one per disk, NIC and accelerator: the ids to select it by;
    ``follows``: per NUMA node without CPUs, the nodes a device on it follows (said
    beside the node: ``2 (no CPUs: follows 0)``)."""
    if not inventory or not any(inventory.get(kind) for kind in ("disks", "nics", "accelerators")):
        return []
    near = follows or {}

    def nodes(listed: list[int]) -> str:
        return ",".join(
            f"{node} (no CPUs: follows {','.join(map(str, near[node]))})" if node in near
            else str(node) for node in listed
        ) or "none"  # fmt: skip

    lines = ["inventory (select by these):"]
    for disk in inventory["disks"]:
        size = "-" if disk["size_bytes"] is None else f"{disk['size_bytes']} bytes"
        points = disk.get("mountpoints")
        mounted = "" if not points else f", mounted at {shown(','.join(points))}"
        lines.append(
            f"  disk {shown(disk['name'])}: NUMA node(s) {nodes(disk['nodes'])}; serial "
            f"{shown(disk['serial'] or '-')}, wwid {shown(disk['wwid'] or '-')}, model "
            f"{shown(disk['model'] or '-')}, {size}, PCI {shown(','.join(disk['pci']) or '-')}"
            + mounted
        )
    for nic in inventory["nics"]:
        lines.append(
            f"  NIC {shown(nic['name'])}: NUMA node(s) {nodes(nic['nodes'])}; PCI "
            f"{shown(','.join(nic['pci']))}, driver {shown(nic['driver'] or '-')}"
        )
    for accelerator in inventory["accelerators"]:
        node = "none" if accelerator["node"] is None else nodes([accelerator["node"]])
        lines.append(
            f"  accelerator {accelerator['pci']}: NUMA node {node}; {accelerator['class_name']} "
            f"(class {accelerator['class']}), id {accelerator['id']}"
        )
    return lines
