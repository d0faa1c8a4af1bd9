"""The cluster view of ``top``: per node and NUMA node, each ``numa-align/…`` resource's
capacity, allocatable, requested and free, and why a Pending pod fits nowhere.

Pure functions over the API server's JSON (``v1.Node`` and ``v1.Pod`` objects as
dicts); :mod:`numa_device_plugin.cli.top` reads them. The arithmetic is the
scheduler's ``NodeResourcesFit``:

- a node's figures are ``status.capacity`` and ``status.allocatable``;
- requested: the sum over the pods bound to the node (``spec.nodeName``) that have
  not ended (phase not ``Succeeded`` or ``Failed``) of each pod's effective request;
- a pod's effective request per resource: the larger of its app containers' sum
  (restartable init containers, the sidecars, included) and each other init
  container's own request plus the sidecars started before it, plus
  ``spec.overhead``; a container's request defaults to its limit, as the API server
  defaults it; ``pods`` counts 1;
- free: allocatable minus requested.

Quantities are exact (:class:`fractions.Fraction`): ``500m`` CPU is 1/2. They are
read as the API server reads them (:func:`parse_quantity`): its syntax, binary and
decimal suffixes and exponents, magnitudes capped at 2^63-1 and fractions rounded up
to 10^-9, so that ``1e9999999`` costs no more than ``1``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
ENDED_PHASES = ("Succeeded", "Failed")


# The API server's bounds of a quantity (k8s.io/apimachinery resource.Quantity): no
# magnitude above 2^63-1, no precision below 10^-9 (a smaller non-zero value is
# rounded up to it).
MAX_QUANTITY = Decimal(2**63 - 1)
NANO = Decimal("1e-9")
# Characters of a quantity's text: the longest canonical one is under 30.
MAX_QUANTITY_CHARS = 64


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity (``4``, ``500m``, ``1.5Gi``, ``2e3``, ``1Ei``) as an exact
    number, bounded as the API server bounds it (:data:`MAX_QUANTITY`, rounded up to
    :data:`NANO`). The arithmetic is ``kubernetes.utils.parse_quantity``'s, on text
    that matches the API server's syntax. Raises ValueError naming the text for
    anything else."""
    from kubernetes.utils import parse_quantity as library_parse

    shown = text if len(text) <= MAX_QUANTITY_CHARS else text[:MAX_QUANTITY_CHARS] + "..."
    stripped = text.strip()
    match = _QUANTITY.match(stripped) if len(stripped) <= MAX_QUANTITY_CHARS else None
    if match is None:
        raise ValueError(f"{shown!r} is not a Kubernetes quantity")
    sign, number, suffix = match.groups()
    with localcontext() as context:
        context.prec = 60
        context.Emax, context.Emin = 999_999_999, -999_999_999
        try:
            value = abs(library_parse(number + (suffix or "")))  # type: ignore[no-untyped-call]
        except ValueError:
            raise ValueError(f"{shown!r} is not a Kubernetes quantity") from None
        if value > MAX_QUANTITY:
            value = MAX_QUANTITY
        elif value != 0:
            value = max(NANO, value.quantize(NANO, rounding=ROUND_CEILING))
    exact = Fraction(value)
    return -exact if sign == "-" else exact


def format_quantity(resource: str, value: Fraction) -> str:
    """``value`` of ``resource`` as people read it: CPUs in cores or millicores
    (``3500m``), memory and hugepages in binary units where exact (``4Gi``), anything
    else as a number."""
    if resource == "cpu" and value.denominator != 1:
        return f"{round(value * 1000)}m"
    if value.denominator != 1:
        return f"{float(value):g}"
    number = int(value)
    if (resource == "memory" or resource.startswith("hugepages-")) and number:
        for suffix, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
            if number % (1 << shift) == 0:
                return f"{number >> shift}{suffix}"
    return str(number)


def _quantities(mapping: Any, where: str) -> dict[str, Fraction]:
    if not isinstance(mapping, Mapping):
        return {}
    try:
        return {str(name): parse_quantity(str(value)) for name, value in mapping.items()}
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> dict[str, Fraction]:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value
    return total


def container_requests(
    container: Mapping[str, Any], where: str = "container"
) -> dict[str, Fraction]:
    """``resources.requests`` of one container, each defaulting to its limit."""
    resources = container.get("resources") or {}
    limits = _quantities(resources.get("limits"), where)
    return {**limits, **_quantities(resources.get("requests"), where)}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """The effective request of ``pod`` per resource (module docstring), ``pods`` 1.
    Raises ValueError naming the pod for a malformed quantity."""
    spec = pod.get("spec") or {}
    where = f"pod {pod_key(pod)}"
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        _add(total, container_requests(container, where))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or []:
        own = container_requests(container, where)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs on beside the app
            _add(sidecars, own)
            _add(total, own)
            continue
        during = _add(dict(sidecars), own)
        for name, value in during.items():
            init_peak[name] = max(init_peak.get(name, Fraction(0)), value)
    effective = {
        name: max(total.get(name, Fraction(0)), init_peak.get(name, Fraction(0)))
        for name in total.keys() | init_peak.keys()
    }
    _add(effective, _quantities(spec.get("overhead"), where))
    effective["pods"] = Fraction(1)
    return effective


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


@dataclass(frozen=True)
class Amounts:
    """One resource of one node: ``capacity``, ``allocatable`` (``status``) and
    ``requested`` by the pods bound there."""

    capacity: Fraction
    allocatable: Fraction
    requested: Fraction

    @property
    def free(self) -> Fraction:
        return self.allocatable - self.requested


@dataclass(frozen=True)
class NodeUse:
    """One node: ``ready`` (condition ``Ready`` is ``True``), ``unschedulable``
    (``spec.unschedulable``), ``taints`` (``key=value:effect``) and its
    :class:`Amounts` per resource name."""

    name: str
    ready: bool
    unschedulable: bool
    taints: tuple[str, ...]
    resources: Mapping[str, Amounts] = field(default_factory=dict)


def node_usage(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[NodeUse]:
    """Every node's figures, sorted by name. Raises ValueError naming the object for a
    malformed quantity."""
    requested: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ENDED_PHASES:
            continue
        _add(requested.setdefault(node, {}), pod_requests(pod))
    found = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        status = node.get("status") or {}
        where = f"node {name}"
        capacity = _quantities(status.get("capacity"), where)
        allocatable = _quantities(status.get("allocatable"), where)
        used = requested.get(name, {})
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        spec = node.get("spec") or {}
        taints = tuple(
            f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
            for t in spec.get("taints") or []
        )
        resources = {
            resource: Amounts(
                capacity.get(resource, Fraction(0)),
                allocatable.get(resource, Fraction(0)),
                used.get(resource, Fraction(0)),
            )
            for resource in sorted(capacity.keys() | allocatable.keys() | used.keys())
        }
        found.append(NodeUse(name, ready, bool(spec.get("unschedulable")), taints, resources))
    return sorted(found, key=lambda n: n.name)


def numa_resources(use: NodeUse, prefix: str) -> list[tuple[int, str, Amounts]]:
    """``(NUMA node id, resource name, amounts)`` of the node's ``<prefix>/numa-N…``
    resources, by NUMA node then name."""
    pattern = re.compile(rf"^{re.escape(prefix)}/numa-(\d+)(?:-.+)?$")
    rows = []
    for name, amounts in use.resources.items():
        match = pattern.match(name)
        if match:
            rows.append((int(match.group(1)), name, amounts))
    return sorted(rows, key=lambda row: (row[0], row[1]))


def near_resources(use: NodeUse, prefix: str) -> list[tuple[str, Amounts]]:
    """``(resource name, amounts)`` of the node's other ``<prefix>/…`` resources (those
    that follow a device, e.g. ``numa-align/data-disk``), by name. The API server does
    not know their NUMA node: the plugin's node page and ``/debug/state`` say it."""
    numa = re.compile(rf"^{re.escape(prefix)}/numa-(\d+)(?:-.+)?$")
    return sorted(
        (name, amounts)
        for name, amounts in use.resources.items()
        if name.startswith(f"{prefix}/") and not numa.match(name)
    )


def numa_free(use: NodeUse, any_resource: str) -> list[tuple[int, Fraction]] | None:
    """For ``<prefix>/any``: the free of each of the node's ``<prefix>/numa-N`` CPU
    resources (in ``--capacity cpus`` mode the free exclusive CPUs of NUMA node N), by
    N; None for another resource name."""
    prefix, sep, last = any_resource.rpartition("/")
    if not sep or last != "any":
        return None
    pattern = re.compile(rf"^{re.escape(prefix)}/numa-(\d+)$")
    return sorted(
        (int(match.group(1)), amounts.free)
        for name, amounts in use.resources.items()
        if (match := pattern.match(name))
    )


def exposed_nodes(use: NodeUse, any_resource: str) -> list[int]:
    """The NUMA nodes ``<prefix>/any`` can be offering on this node, as the API server's
    figures tell: those whose ``numa-N`` free equals any's free (the plugin offers the
    free CPUs of one NUMA node; several here on a tie, none while the figures disagree,
    e.g. within a node status period of a change)."""
    amounts = use.resources.get(any_resource)
    frees = numa_free(use, any_resource)
    if amounts is None or not frees:
        return []
    return [numa for numa, free in frees if free == amounts.free]


@dataclass(frozen=True)
class Shortfall:
    """A resource a node lacks for a pod: the pod ``needs`` it, the node has ``free``."""

    resource: str
    needs: Fraction
    free: Fraction

    @property
    def short(self) -> Fraction:
        return self.needs - self.free


@dataclass(frozen=True)
class NodeVerdict:
    """Whether ``node`` has room for every resource the pod asks (``shortfalls``
    empty), and what else keeps the pod off it that this view can see (``notes``:
    not Ready, unschedulable, NoSchedule/NoExecute taints)."""

    node: str
    shortfalls: tuple[Shortfall, ...]
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.shortfalls and not self.notes


def explain(pod: Mapping[str, Any], usage: Iterable[NodeUse]) -> list[NodeVerdict]:
    """For each node, what it lacks for ``pod``: every resource the pod asks (a zero
    request asks nothing) that the node has less of free than asked. A node that does
    not have the resource at all has 0 free. Taints are noted, not matched against the
    pod's tolerations."""
    asks = {name: value for name, value in pod_requests(pod).items() if value > 0}
    verdicts = []
    for use in usage:
        shortfalls = tuple(
            Shortfall(name, needs, free)
            for name, needs in sorted(asks.items())
            if needs > (free := _free(use, name))
        )
        notes = []
        if not use.ready:
            notes.append("not Ready")
        if use.unschedulable:
            notes.append("unschedulable (cordoned)")
        blocking = [t for t in use.taints if t.endswith((":NoSchedule", ":NoExecute"))]
        if blocking:
            notes.append("tainted " + ", ".join(blocking) + " (tolerations not checked)")
        verdicts.append(NodeVerdict(use.name, shortfalls, tuple(notes)))
    return verdicts


def _free(use: NodeUse, resource: str) -> Fraction:
    amounts = use.resources.get(resource)
    return amounts.free if amounts is not None else Fraction(0)


def scheduler_message(pod: Mapping[str, Any]) -> str | None:
    """The message of the pod's ``PodScheduled`` condition when it is ``False`` (the
    scheduler's own summary, ``0/2 nodes are available: …``), else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message")
            return str(message) if message else None
    return None
