"""Every node's plugin, read at fleet scale: the plugin's pods listed by label, each
running one's ``/debug/state`` read through the API server's pod proxy
(``GET …/pods/<name>:<port>/proxy/debug/state``) by a bounded pool of threads, all
within the command's one deadline (:mod:`.kubeapi`).

- **Concurrent, bounded**: at most :data:`READERS` reads at once (1,000 nodes are not
  read one after another, nor 1,000 at once against the API server).
- **One slow pod holds up nobody**: each read has its own deadline, at most
  ``--pod-timeout`` (:data:`POD_SECONDS` by default) and never past the command's
  (minus a reserve for printing), so a pod that drips its answer or never answers is
  named on stderr and the others print.
- **Odd answers are that pod's problem**: an answer that is not a JSON object, or
  whose ``inventory``, ``near``, ``resources``, ``numa_nodes`` or ``pod_resources``
  are not of their types, is named with its pod; the others print.
- **Memory bounded by the byte caps**: each answer is at most
  :data:`~.kubeapi.MAX_ANSWER` bytes and all of them :data:`~.kubeapi.MAX_TOTAL`; of
  each state only the parts the commands use are kept (:data:`KEPT`).

Two plugin pods on one node (a second DaemonSet, an overlapping rollout) are both read
and named: :attr:`FleetRead.doubled`.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from numa_device_plugin.cluster.kubeapi import ApiError, Deadline, DeadlinePassed, KubeApi

# Reads of /debug/state under way at once.
READERS = 16
# Pods listed per page.
PODS_PER_PAGE = 100
# Seconds of the command's deadline kept for what comes after the reads (printing). Each
# read ends by its own deadline, its connect and a dripping answer included (KubeApi);
# a read that did not (a connect slowed 1 s by a full accept queue) overran it on CI.
RESERVE = 1.0
# Seconds one pod's read may take at most (a plugin answers in milliseconds; a pod that
# does not answer within this is named, and waits for it end here, not at --timeout).
POD_SECONDS = 5.0
# Entries of a list of a /debug/state taken at most (disks, NICs or accelerators of a
# server, its holders, NUMA nodes, near entries): more than a server has (the plugin's
# own read stops at 16,384 devices of a kind; pods per node are in the hundreds). The
# rows made of each entry are what a fleet's memory is made of: 64 answers (the byte
# caps) of 16,384 tiny entries each were 2.7 GB in `devices`; of 2,048, under 256 MB.
MAX_LISTED = 2_048
# The key of :func:`kept`'s document naming what was cut.
CUT = "cut"
# The parts of a /debug/state document the commands read, with their JSON types.
KEPT: dict[str, type] = {
    "inventory": dict,
    "near": list,
    "resources": dict,
    "numa_nodes": list,
    "pod_resources": dict,
    "config": dict,
}


@dataclass(frozen=True)
class PluginState:
    """One plugin pod's state: ``pod`` (its name), ``node`` (``spec.nodeName``) and
    ``state`` (the :data:`KEPT` parts of its ``/debug/state``, each of its type or
    absent)."""

    pod: str
    node: str
    state: dict[str, Any]


@dataclass
class FleetRead:
    """What a fleet read found: ``states`` (one per node, by node name, sorted),
    ``problems`` (one line per pod that could not be read, naming node and pod) and
    ``doubled`` (node -> the names of its plugin pods, where there are several)."""

    states: dict[str, PluginState] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    doubled: dict[str, list[str]] = field(default_factory=dict)


def kept(document: dict[str, Any]) -> dict[str, Any]:
    """The :data:`KEPT` parts of a ``/debug/state`` document, each list in them (the
    inventory's disks, NICs and accelerators, the near entries, the NUMA nodes, the
    holders) cut to its first :data:`MAX_LISTED` entries; ``CUT`` then names what was
    cut. Raises ValueError naming the first part that
    is present but not of its type (``inventory`` is a list)."""
    found: dict[str, Any] = {}
    cut: list[str] = []
    for key, kind in KEPT.items():
        value = document.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            raise ValueError(f"its /debug/state has {key} of type {type(value).__name__}, "
                             f"not {kind.__name__}")  # fmt: skip
        found[key] = _cut(value, key, cut)
    if cut:
        found[CUT] = cut
    return found


def _cut(value: Any, name: str, cut: list[str]) -> Any:
    """``value`` with each list at the top or one level down cut to :data:`MAX_LISTED`
    entries, noting ``name``'s cut lists in ``cut``."""
    if isinstance(value, list):
        if len(value) > MAX_LISTED:
            cut.append(f"{name} ({len(value)})")
            return value[:MAX_LISTED]
        return value
    if isinstance(value, dict) and name in ("inventory", "pod_resources"):
        return {key: _cut(inner, f"{name}.{key}", cut) if isinstance(inner, list) else inner
                for key, inner in value.items()}  # fmt: skip
    return value


def plugin_pods(api: KubeApi, namespace: str, selector: str) -> list[tuple[str, str]]:
    """(pod name, node name) of each running pod of ``selector`` in ``namespace``."""
    pods = api.list(
        f"/api/v1/namespaces/{quote(namespace, safe='')}/pods?limit={PODS_PER_PAGE}"
        f"&labelSelector={quote(selector, safe='')}",
        "Pod",
    )
    found = []
    for pod in pods:
        metadata, spec, status = (pod.get(key) for key in ("metadata", "spec", "status"))
        name = metadata.get("name") if isinstance(metadata, dict) else None
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        phase = status.get("phase") if isinstance(status, dict) else None
        if isinstance(name, str) and isinstance(node, str) and node and phase == "Running":
            found.append((name, node))
    return found


def read_fleet(
    api: KubeApi, namespace: str, pods: Iterable[tuple[str, str]], port: int,
    readers: int = READERS, pod_seconds: float = POD_SECONDS,
) -> FleetRead:  # fmt: skip
    """Each pod's ``/debug/state`` (:func:`plugin_pods`' pairs), at most ``readers`` at
    once, each within ``pod_seconds`` (``--pod-timeout``) and what is left of
    ``api.deadline`` minus :data:`RESERVE`. Never
    raises for one pod; :class:`~.kubeapi.DeadlinePassed` when the command's deadline
    passes before the reads were started."""
    read = FleetRead()
    listed = sorted(pods, key=lambda pair: (pair[1], pair[0]))
    by_node: dict[str, list[str]] = {}
    for name, node in listed:
        by_node.setdefault(node, []).append(name)
    read.doubled = {node: names for node, names in by_node.items() if len(names) > 1}
    if not listed:
        return read
    reads = Deadline(max(0.05, api.deadline.left() - RESERVE))

    def one(name: str) -> dict[str, Any]:
        path = (f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
                f":{port}/proxy/debug/state")  # fmt: skip
        # DeadlinePassed when its deadline passes, however the pod answers (KubeApi).
        return api.get(path, None, Deadline(min(reads.left(), pod_seconds)), keep=kept)

    pool = concurrent.futures.ThreadPoolExecutor(max(1, min(readers, len(listed))))
    try:
        futures = {pool.submit(one, name): (name, node) for name, node in listed}
        done, pending = concurrent.futures.wait(futures, timeout=reads.end - time.monotonic())
        answers: dict[tuple[str, str], dict[str, Any]] = {}
        for future in done:
            name, node = futures[future]
            try:
                answers[(name, node)] = future.result()
                cut = answers[(name, node)].pop(CUT, None)
                if cut:
                    read.problems.append(f"{node} ({name}): its /debug/state lists over "
                                         f"{MAX_LISTED} of {', '.join(cut)}: the first "
                                         f"{MAX_LISTED} of each read")  # fmt: skip
            except (ApiError, ValueError) as exc:
                read.problems.append(f"{node} ({name}): {exc}")
            except DeadlinePassed:
                read.problems.append(f"{node} ({name}): not read within the deadline "
                                     f"({pod_seconds:g} s a pod, --timeout in all)")  # fmt: skip
        for future in pending:
            name, node = futures[future]
            read.problems.append(f"{node} ({name}): not read within the deadline "
                                 f"({pod_seconds:g} s a pod, --timeout in all)")  # fmt: skip
    finally:
        # Each read ends by its own deadline (its socket timeouts are what was left of
        # it): waiting for the stragglers costs at most a moment past it, and leaves no
        # thread behind to use the client after it is closed.
        pool.shutdown(wait=True, cancel_futures=True)
    for name, node in listed:  # the first readable pod of each node, in name order
        if (name, node) in answers and node not in read.states:
            read.states[node] = PluginState(name, node, answers[(name, node)])
    read.problems.sort()
    return read
