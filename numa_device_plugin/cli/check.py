"""``numa-device-plugin check`` (also ``kubectl numa check``): for every pod that holds a
``numa-align/*`` resource (in one namespace, or one pod), whether it sits on its
device's NUMA node: its exclusive CPUs and memory, the device its resource follows
(still there and Healthy?) and the disk under each of its local volumes. A verdict per
pod (:mod:`numa_device_plugin.cluster.alignment`), a table or ``--output json``, and
exit 1 when any pod is not shown to be aligned.

Reads only what the API server and the plugin already serve: pods (``list`` in the
namespace, or all), PersistentVolumeClaims (``list``, likewise) and PersistentVolumes
(``list``, cluster-wide) when a pod has a claim, and each plugin pod's ``/debug/state``
through the pod proxy (``list pods`` and ``get pods/proxy`` in the plugin's namespace),
concurrently and within one deadline (:mod:`numa_device_plugin.cluster.fleet`).
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import quote

import click

from numa_device_plugin.cli import apireads, options
from numa_device_plugin.cli.escaped import shown

PER_PAGE = 500


@click.command(
    "check",
    help="For every pod holding a numa-align/* resource (or those of -n, or POD): "
    "whether its exclusive CPUs, memory, device and local volumes are on one NUMA node. "
    "Prints a verdict per pod (aligned, misaligned, misconfigured, device lost, unknown) "
    "and why; exits 1 when any pod is not aligned. Reads pods, PersistentVolumeClaims, "
    "PersistentVolumes and each plugin pod's /debug/state through the API server's pod proxy.",
)
@click.argument("pod", required=False, envvar="NUMA_POD")
@apireads.api_kubeconfig
@click.option("--pod-namespace", "-n", "namespace", default=None, envvar="NUMA_POD_NAMESPACE",
              show_envvar=True, help="the pods' namespace (default: all namespaces)")  # fmt: skip
@click.option("--plugin-namespace", default="kube-system", show_default=True,
              envvar="NUMA_PLUGIN_NAMESPACE", show_envvar=True,
              help="the plugin's namespace")  # fmt: skip
@apireads.plugin_selector
@apireads.plugin_port
@apireads.plugin_pod_timeout
@click.option("--resource-prefix", default="numa-align", show_default=True,
              envvar="NUMA_RESOURCE_PREFIX", show_envvar=True,
              help="the plugin's resource prefix (config.resourcePrefix)")  # fmt: skip
@apireads.api_timeout
@options.apply(options.output)
def command(**params: Any) -> int:
    """0 when every pod checked is aligned (or none holds a resource); 1 when one is not,
    or the API server cannot be read; 2 for bad usage."""
    from numa_device_plugin.cluster.alignment import (
        ALIGNED,
        check_pod,
        claims,
        host_paths,
        not_running,
        pod_key,
        requests_prefix,
    )
    from numa_device_plugin.cluster.fleet import plugin_pods, read_fleet

    if params["pod"] and not params["namespace"]:
        raise click.UsageError("POD needs --pod-namespace (-n)")

    def reads(
        api: Any,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[Any, str | None], Any]:
        found = _pods(api, params)
        pods = [p for p in found if _running(p) and requests_prefix(p, params["resource_prefix"])]
        waiting = [p for p in found if not _running(p)]  # POD named, not running yet
        wanted = {(pod_key(p)[0], c) for p in pods for c in claims(p)}
        paths = _claim_paths(api, params["namespace"], wanted) if wanted else {}
        # only the plugins on the pods' nodes: one pod checked is one /debug/state read
        nodes = {(p.get("spec") or {}).get("nodeName") for p in pods}
        plugins = [(name, node) for name, node in
                   plugin_pods(api, params["plugin_namespace"], params["selector"])
                   if node in nodes]  # fmt: skip
        return pods, waiting, paths, read_fleet(
            api, params["plugin_namespace"], plugins, params["port"],
            pod_seconds=params["pod_timeout"],
        )  # fmt: skip

    found = apireads.read_within_deadline("check", params, reads)
    if found is None:
        return 1
    pods, waiting, paths, fleet = found
    for problem in fleet.problems:
        print(f"{apireads.speaker('check')}: {shown(problem)}", file=sys.stderr)
    checks = [not_running(pod) for pod in waiting]
    for pod in sorted(pods, key=pod_key):
        namespace = pod_key(pod)[0]
        node = (pod.get("spec") or {}).get("nodeName")
        state = fleet.states[node].state if node in fleet.states else None
        volumes = [(claim, paths.get((namespace, claim))) for claim in claims(pod)]
        checks.append(check_pod(pod, state, [*volumes, *host_paths(pod)],
                                params["resource_prefix"]))  # fmt: skip
    if params["output"] == "json":
        print(json.dumps({"pods": [c.document() for c in checks],
                          "problems": fleet.problems}, indent=2))  # fmt: skip
    else:
        print(render(checks), end="")
    return 0 if all(c.verdict == ALIGNED for c in checks) else 1


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _pods(api: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods to check: POD (whatever its phase: one not running is said so), the
    running pods of --namespace, or all running pods."""
    namespace = params["namespace"]
    if params["pod"]:
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(params['pod'], safe='')}"
        )
        return [api.get(path, "Pod")]
    scope = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    found = api.list(f"/api/v1{scope}/pods?limit={PER_PAGE}"
                     "&fieldSelector=status.phase%3DRunning", "Pod")  # fmt: skip
    return [p for p in found if _running(p)]


def _claim_paths(
    api: Any, namespace: str | None, wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], str | None]:
    """(namespace, claim) -> the host path of its local PersistentVolume (None: not
    local, or not bound)."""
    from numa_device_plugin.cluster.alignment import local_path

    scope = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    bound: dict[tuple[str, str], str] = {}
    for claim in api.list(f"/api/v1{scope}/persistentvolumeclaims?limit={PER_PAGE}",
                          "PersistentVolumeClaim"):  # fmt: skip
        metadata, spec = claim.get("metadata") or {}, claim.get("spec") or {}
        key = (metadata.get("namespace"), metadata.get("name"))
        if key in wanted and isinstance(spec.get("volumeName"), str):
            bound[key] = spec["volumeName"]
    volumes = {(pv.get("metadata") or {}).get("name"): pv
               for pv in api.list(f"/api/v1/persistentvolumes?limit={PER_PAGE}",
                                  "PersistentVolume")}  # fmt: skip
    return {key: local_path(volumes[bound[key]]) if bound.get(key) in volumes else None
            for key in wanted}  # fmt: skip


def render(checks: list[Any]) -> str:
    """One row per pod (POD, NODE, RESOURCES, DEVICES, CPUS, MEMORY, VOLUMES, VERDICT),
    then the reasons, each line under its pod."""
    rows = [("POD", "NODE", "RESOURCE", "DEVICE", "NUMA", "CPUS", "MEMORY", "VOLUMES",
             "VERDICT")]  # fmt: skip
    for check in checks:
        resources = ",".join(r.split("/", 1)[-1] for r in check.resources) or "-"
        devices = ",".join(d for r in check.resources.values() for d in r["devices"]) or "-"
        nodes = sorted({n for r in check.resources.values() for n in r["numa_nodes"]})
        volumes = ",".join(f"{v['path']}:{v['disk'] or '?'}" for v in check.volumes if v["path"])
        rows.append((shown(check.pod), shown(check.node or "-"), shown(resources),
                     shown(devices), ",".join(map(str, nodes)) or "-",
                     ",".join(map(str, check.cpu_nodes)) or "-",
                     ",".join(map(str, check.memory_nodes)) or "-", shown(volumes or "-"),
                     check.verdict))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )
    faults = [(c.pod, why) for c in checks for why in c.why]
    if faults:
        text += "\n" + "".join(f"{shown(pod)}: {shown(why)}\n" for pod, why in faults)
    if len(rows) == 1:
        text += "no running pod holds a numa-align resource\n"
    return text
