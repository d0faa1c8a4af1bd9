"""``numa-device-plugin top`` (also ``kubectl numa``): the cluster's NUMA resources from
the API server, and why a Pending pod fits nowhere (``--explain``).

It lists Nodes and Pods (``GET /api/v1/nodes`` and ``/api/v1/pods``, paged with
``limit`` and ``continue``) with the kubeconfig kubectl would use (``--kubeconfig``,
else the first file of ``$KUBECONFIG``, else ``~/.kube/config``; in a pod without
any, the service account), running its ``exec`` credential plugin as kubectl does,
all within one total deadline (``--timeout``): :mod:`numa_device_plugin.cluster.kubeapi`.
The figures are :mod:`numa_device_plugin.cluster.fit`'s.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from typing import Any
from urllib.parse import quote

import click

from numa_device_plugin.cli import apireads, options
from numa_device_plugin.cluster.fit import (
    Amounts,
    NodeUse,
    explain,
    exposed_nodes,
    format_quantity,
    near_resources,
    node_usage,
    numa_free,
    numa_resources,
    pod_key,
    pod_requests,
    scheduler_message,
)

# Objects per list request: a Node with a long image list is ~100 KB, a Pod up to
# ~30 KB; the answers stay under kubeapi.MAX_ANSWER (4 MiB).
NODES_PER_PAGE = 25
PODS_PER_PAGE = 100
NOT_ENDED = "status.phase!=Succeeded,status.phase!=Failed"


@click.command(
    "top",
    help="Show, per node and NUMA node, capacity, allocatable, requested and free of every "
    "numa-align resource, from the API server; with --explain NAMESPACE/POD, which node "
    "lacks which resource for that Pending pod, and by how much. Runs the kubeconfig's "
    "exec credential plugin, as kubectl does.",
)
@apireads.api_kubeconfig
@click.option(
    "--explain",
    "explain_pod",
    metavar="NAMESPACE/POD",
    default=None,
    envvar="NUMA_EXPLAIN",
    show_envvar=True,
    help="explain why this pod is Pending",
)
@apireads.api_timeout
@options.apply(options.resource_prefix, options.output)
@click.pass_context
def command(ctx: click.Context, /, **params: Any) -> int:
    """0 after printing; 1 when the API server cannot be read (said on stderr)."""
    pod_ref = params["explain_pod"]
    if pod_ref is not None and (pod_ref.count("/") != 1 or "" in pod_ref.split("/")):
        raise click.BadParameter("give NAMESPACE/POD", ctx, param=options.param(ctx, "explain_pod"))

    def reads(api: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
        nodes = api.list(f"/api/v1/nodes?limit={NODES_PER_PAGE}", "Node")
        pods = api.list(f"/api/v1/pods?limit={PODS_PER_PAGE}&fieldSelector={quote(NOT_ENDED)}",
                        "Pod")  # fmt: skip
        pod = None
        if pod_ref is not None:
            namespace, name = pod_ref.split("/")
            pod = api.get(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", "Pod")
        return nodes, pods, pod

    found = apireads.read_within_deadline(
        "top", params, reads,
        slow="the API server, or the kubeconfig's exec credential plugin, is too slow",
    )  # fmt: skip
    if found is None:
        return 1
    nodes, pods, pod = found
    try:
        usage = node_usage(nodes, pods)
        if pod is None:
            document = top_document(usage, params["resource_prefix"])
            text = render_top(document)
        else:
            document = explain_document(pod, usage)
            text = render_explain(document)
    except (AttributeError, TypeError) as exc:  # a field of the wrong JSON type
        print(f"{apireads.speaker('top')}: the API server's objects are not usable: {exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    if params["output"] == "json":
        print(json.dumps(document, indent=2))
    else:
        print(text, end="")
    return 0


def kubectl_main() -> int:
    """Entry point of ``kubectl-numa``: kubectl runs it for ``kubectl numa ARGS``
    (``top``), ``kubectl numa devices ARGS`` (``devices``) and ``kubectl numa check
    ARGS`` (``check``); its ``--help`` names all three, then shows ``top``'s options."""
    from numa_device_plugin.cli import main

    args = sys.argv[1:]
    if args[:1] in (["devices"], ["check"], ["top"]):
        return main(args, prog=KUBECTL)
    if args[:1] in (["--help"], ["-h"], ["help"]):
        print(KUBECTL_HELP)
    return main(["top", *args], prog=KUBECTL)


# The program's name in usage and messages when kubectl runs it (kubectl numa check ...).
KUBECTL = "kubectl numa"


KUBECTL_HELP = """kubectl numa: the numa-align resources of a cluster.

  kubectl numa [--explain POD] [OPTIONS]  each node's NUMA resources: capacity, free,
                                          and why a Pending pod fits nowhere (top)
  kubectl numa devices [OPTIONS]          every node's disks, NICs and accelerators
                                          with their NUMA nodes, and a configuration
  kubectl numa check [POD] [OPTIONS]      whether each pod holding a resource sits on
                                          its device's NUMA node (exit 1 if one does not)

kubectl numa devices --help and kubectl numa check --help list their options; those of
the first follow.
"""


def _number(resource: str, value: Fraction) -> int | str:
    """An integer as a JSON number; anything else as its quantity text."""
    return int(value) if value.denominator == 1 else format_quantity(resource, value)


def _figures(name: str, amounts: Amounts) -> dict[str, Any]:
    return {
        "capacity": _number(name, amounts.capacity),
        "allocatable": _number(name, amounts.allocatable),
        "requested": _number(name, amounts.requested),
        "free": _number(name, amounts.free),
    }


def top_document(usage: list[NodeUse], prefix: str) -> dict[str, Any]:
    """``{"nodes": [{"name", "ready", "unschedulable", "numa_nodes": [{"id",
    "resources": {name: {"capacity", "allocatable", "requested", "free"}}}], "near":
    {name: {...}}}]}``; the nodes with no ``<prefix>/numa-N`` resource are listed with
    no NUMA nodes; ``near``: the resources that follow a device (NUMA node not known
    to the API server); ``exposed``: with ``<prefix>/any``, the NUMA node(s) whose free
    CPUs it offers (:func:`~numa_device_plugin.cluster.fit.exposed_nodes`), else null."""
    nodes = []
    for use in usage:
        by_numa: dict[int, dict[str, Any]] = {}
        for numa, name, amounts in numa_resources(use, prefix):
            by_numa.setdefault(numa, {})[name] = _figures(name, amounts)
        nodes.append(
            {
                "name": use.name,
                "ready": use.ready,
                "unschedulable": use.unschedulable,
                "numa_nodes": [{"id": i, "resources": r} for i, r in sorted(by_numa.items())],
                "near": {name: _figures(name, a) for name, a in near_resources(use, prefix)},
                "exposed": exposed_nodes(use, f"{prefix}/any")
                if f"{prefix}/any" in use.resources
                else None,
            }
        )
    return {"nodes": nodes}


def render_top(document: dict[str, Any]) -> str:
    """The table of :func:`top_document`."""
    rows = [("NODE", "NUMA", "RESOURCE", "CAPACITY", "ALLOCATABLE", "REQUESTED", "FREE")]
    bare, not_ready = [], []
    for node in document["nodes"]:
        name = node["name"]
        if not node["ready"]:
            not_ready.append(name)
        if not node["numa_nodes"]:
            bare.append(name)
        listed = [
            (str(numa["id"]), resource, figures)
            for numa in node["numa_nodes"]
            for resource, figures in numa["resources"].items()
        ]
        listed += [("any" if resource.endswith("/any") or "/any-" in resource else "near",
                    resource, figures) for resource, figures in node["near"].items()]  # fmt: skip
        for numa_id, resource, figures in listed:
            rows.append(
                (name, numa_id, resource,
                 *(str(figures[k]) for k in ("capacity", "allocatable", "requested", "free")))
            )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    if len(rows) == 1:
        lines = ["no node advertises a NUMA resource (is the plugin's DaemonSet running?)"]
    if any(row[1] == "near" for row in rows):
        lines.append("NUMA near: a resource that follows a device, on that device's NUMA node")
    for node in document["nodes"]:
        if node.get("exposed") is not None:
            shown = " or ".join(map(str, node["exposed"])) or "? (figures changing)"
            lines.append(f"{node['name']}: any offers the free CPUs of NUMA node {shown}")
    if bare:
        lines.append(f"without NUMA resources: {', '.join(bare)}")
    if not_ready:
        lines.append(f"not Ready: {', '.join(not_ready)}")
    return "\n".join(lines) + "\n"


def explain_document(pod: dict[str, Any], usage: list[NodeUse]) -> dict[str, Any]:
    """``{"pod", "phase", "node", "asks": {resource: amount}, "scheduler",
    "nodes": [{"name", "fits", "lacks": [{"resource", "needs", "free", "short"}],
    "notes", "numa"}]}``; ``node``: where it is bound (None while Pending); ``numa``: for
    a pod short of ``<prefix>/any``, what the node's NUMA nodes have free (else null)."""
    asks = {k: v for k, v in sorted(pod_requests(pod).items()) if v > 0}
    verdicts = explain(pod, usage)
    return {
        "pod": pod_key(pod),
        "phase": (pod.get("status") or {}).get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName") or None,
        "asks": {k: format_quantity(k, v) for k, v in asks.items()},
        "scheduler": scheduler_message(pod),
        "nodes": [
            {
                "name": v.node,
                "fits": v.fits,
                "lacks": [
                    {
                        "resource": s.resource,
                        "needs": format_quantity(s.resource, s.needs),
                        "free": format_quantity(s.resource, s.free),
                        "short": format_quantity(s.resource, s.short),
                    }
                    for s in v.shortfalls
                ],
                "notes": list(v.notes),
                "numa": _numa_note(usage, v.node, v.shortfalls),
            }
            for v in verdicts
        ],
    }


def _numa_note(usage: list[NodeUse], node: str, shortfalls: Any) -> str | None:
    """For a pod short of ``<prefix>/any`` on ``node``: no NUMA node has the CPUs it
    needs, and the most one has; else None."""
    for lack in shortfalls:
        use = next((u for u in usage if u.name == node), None)
        frees = None if use is None else numa_free(use, lack.resource)
        if frees:
            most = max(free for _, free in frees)
            where = ",".join(str(numa) for numa, free in frees if free == most)
            return (f"no NUMA node of {len(frees)} has {_number('cpu', lack.needs)} free CPUs; "
                    f"the most is {_number('cpu', most)} (NUMA node {where})")  # fmt: skip
    return None


def render_explain(document: dict[str, Any]) -> str:
    """The text of :func:`explain_document`."""
    asks = ", ".join(f"{k}: {v}" for k, v in document["asks"].items())
    lines = [f"pod {document['pod']} is {document['phase']}; it asks {asks}"]
    if document["node"]:
        lines.append(f"it is bound to node {document['node']}: nothing to explain")
    if document["scheduler"]:
        lines.append(f"the scheduler said: {document['scheduler']}")
    for node in document["nodes"]:
        if node["fits"]:
            lines.append(
                f"{node['name']}: has room for all it asks (node selectors, affinity and "
                "ports are not checked here)"
            )
            continue
        reasons = [
            f"{lack['resource']}: needs {lack['needs']}, free {lack['free']} "
            f"({lack['short']} short)"
            for lack in node["lacks"]
        ]
        numa = [node["numa"]] if node.get("numa") else []
        lines.append(f"{node['name']}: " + "; ".join(reasons + numa + node["notes"]))
    if not document["nodes"]:
        lines.append("the cluster has no nodes")
    return "\n".join(lines) + "\n"
