"""Whether each pod holding a ``numa-align/*`` resource sits where its device is: pure
functions over the API server's JSON (pods, PersistentVolumeClaims, PersistentVolumes)
and each node's plugin state (``/debug/state``, :mod:`.fleet`); ``check`` prints them.

For each container the plugin's view of the pod resources API lists (``pod_resources.
holders``: its exclusive CPUs, memory blocks and device ids), and each ``numa-align``
resource it holds:

- the NUMA node(s) of its devices (a device id names its node: ``numa1-slot0003``);
- for a resource that follows a device, that device on those nodes (``near[].by_node``)
  and whether it is still there (``resources[…].lost``: *device lost*);
- the NUMA nodes of its exclusive CPUs (``numa_nodes[].cpus``) and memory blocks: each
  must be among the devices' nodes (*CPUs off the device's node*, *memory off …*); a
  container without exclusive CPUs is not aligned by the Topology Manager at all;
- for ``<prefix>/any``, as many devices as exclusive CPUs (*misconfigured* otherwise:
  any's count is the free CPUs of one NUMA node, so a pod asking fewer takes CPUs the
  scheduler does not see taken).

For each volume of the pod that is a local PersistentVolume (``spec.local.path``, or
``hostPath``), or the pod's own ``hostPath`` volume, the disk under that path on the
pod's node (the inventory's mount points, the nearest one at or above the path) must be
a device the held resource follows, or, for a NUMA node's own resource, on its node
(*volume on another disk*). A pod whose node could not be read, or that the plugin
lists no container of, is *unknown*: it is not shown to be aligned; so is a pod named
on the command line that is not running.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ALIGNED = "aligned"
MISCONFIGURED = "misconfigured"
MISALIGNED = "misaligned"
LOST = "device lost"
UNKNOWN = "unknown"

_DEVICE_NODE = re.compile(r"numa(\d{1,4})-")
_RANGE = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")
# CPU ids read from a plugin's answer at most: the kernel's largest NR_CPUS (8192)
# many times over, and the bound of what one cpulist costs to parse.
MAX_CPUS = 65536


@dataclass
class PodCheck:
    """One pod's verdict (:data:`ALIGNED`, :data:`MISALIGNED`, :data:`LOST`,
    :data:`UNKNOWN`), ``why`` (one line per fault) and what was found: ``resources``
    (name -> {"numa_nodes", "devices", "lost"}), ``cpu_nodes``, ``memory_nodes``,
    ``volumes`` (each ``{"claim", "path", "disk", "numa_nodes", "followed"}``)."""

    pod: str
    node: str
    verdict: str = ALIGNED
    why: list[str] = field(default_factory=list)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu_nodes: list[int] = field(default_factory=list)
    memory_nodes: list[int] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def fault(self, verdict: str, why: str) -> None:
        """Record a fault; a lost device outranks misalignment, which outranks a
        misconfigured request, which outranks unknown."""
        self.why.append(why)
        rank = {ALIGNED: 0, UNKNOWN: 1, MISCONFIGURED: 2, MISALIGNED: 3, LOST: 4}
        if rank[verdict] > rank[self.verdict]:
            self.verdict = verdict

    def document(self) -> dict[str, Any]:
        return {"pod": self.pod, "node": self.node, "verdict": self.verdict, "why": self.why,
                "resources": self.resources, "cpu_numa_nodes": self.cpu_nodes,
                "memory_numa_nodes": self.memory_nodes, "volumes": self.volumes}  # fmt: skip


def parse_cpulist(text: object, limit: int = MAX_CPUS) -> set[int]:
    """A cpulist (``0-3,8``) from an answer; an odd one gives what parses of it. Bounded
    however the answer lies: at most ``limit`` comma-separated parts are read (a real
    cpulist of ``limit`` CPUs has no more) and no CPU id at or above ``limit`` is kept,
    each CPU added once (overlapping ranges merged first): the work is at most a few
    times ``limit``, never the product of a 2 MB list's ranges."""
    if not isinstance(text, str):
        return set()
    spans = []
    for part in text.split(",", limit)[:limit]:
        match = _RANGE.fullmatch(part.strip())
        if match:
            low = int(match[1])
            high = min(int(match[2]) if match[2] else low, limit - 1)
            if low <= high:
                spans.append((low, high))
    found: set[int] = set()
    reach = -1  # the highest CPU added so far, in span order
    for low, high in sorted(spans):
        if high > reach:
            found.update(range(max(low, reach + 1), high + 1))
            reach = high
    return found


def requests_prefix(pod: Mapping[str, Any], prefix: str) -> bool:
    """Whether any container of ``pod`` asks for a resource ``<prefix>/…``."""
    spec = _dict(pod.get("spec"))
    for container in _dicts(spec.get("containers")) + _dicts(spec.get("initContainers")):
        resources = container.get("resources")
        for kind in ("requests", "limits"):
            amounts = resources.get(kind) if isinstance(resources, dict) else None
            if isinstance(amounts, dict) and any(
                isinstance(name, str) and name.startswith(prefix + "/") for name in amounts
            ):
                return True
    return False


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a pod object."""
    metadata = _dict(pod.get("metadata"))
    return _text(metadata.get("namespace")), _text(metadata.get("name"))


def claims(pod: Mapping[str, Any]) -> list[str]:
    """The PersistentVolumeClaim names of the pod's volumes: each
    ``persistentVolumeClaim``'s ``claimName``, and for a generic ephemeral volume
    (``ephemeral.volumeClaimTemplate``) the claim Kubernetes makes for it,
    ``<pod name>-<volume name>``."""
    spec = _dict(pod.get("spec"))
    pod_name = pod_key(pod)[1]
    found = []
    for volume in _dicts(spec.get("volumes")):
        claim = volume.get("persistentVolumeClaim")
        name = claim.get("claimName") if isinstance(claim, dict) else None
        if isinstance(name, str) and name:
            found.append(name)
        elif isinstance(volume.get("ephemeral"), dict) and pod_name:
            volume_name = volume.get("name")
            if isinstance(volume_name, str) and volume_name:
                found.append(f"{pod_name}-{volume_name}")
    return found


def local_path(pv: Mapping[str, Any]) -> str | None:
    """A PersistentVolume's host path: ``spec.local.path``, else ``spec.hostPath.path``."""
    spec = _dict(pv.get("spec"))
    for kind in ("local", "hostPath"):
        found = _host_path(spec.get(kind))
        if found is not None:
            return found
    return None


def host_paths(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The pod's own ``hostPath`` volumes (not through a claim): (``<volume name>
    (hostPath)``, the host path normalised), in the pod's order."""
    found = []
    for volume in _dicts(_dict(pod.get("spec")).get("volumes")):
        path = _host_path(volume.get("hostPath"))
        name = volume.get("name")
        if path is not None and isinstance(name, str):
            found.append((f"{name} (hostPath)", path))
    return found


def _host_path(source: object) -> str | None:
    """``source``'s absolute ``path``, normalised as the kernel resolves it
    (``/mnt/disks/a/../b`` is ``/mnt/disks/b``), or None."""
    path = source.get("path") if isinstance(source, dict) else None
    if isinstance(path, str) and path.startswith("/"):
        return posixpath.normpath("/" + "/".join(part for part in path.split("/") if part))
    return None


def disk_under(state: Mapping[str, Any], path: str) -> tuple[str, list[int]] | None:
    """The disk whose mount point is the nearest at or above ``path`` in the node's
    inventory, with its NUMA nodes; None when no mount point is known."""
    found = _nearest_disk(state, path)
    return None if found is None else (found[1], found[2])


def _nearest_disk(state: Mapping[str, Any], path: str) -> tuple[int, str, list[int]] | None:
    """(length of the mount point, disk, its NUMA nodes) of :func:`disk_under`."""
    inventory = _dict(state.get("inventory"))
    best: tuple[int, str, list[int]] | None = None
    for disk in _dicts(inventory.get("disks")):
        points = disk.get("mountpoints")
        name = disk.get("name")
        if not isinstance(points, list) or not isinstance(name, str):
            continue
        nodes = [n for n in disk.get("nodes") or [] if isinstance(n, int)]
        for point in points:
            inside = isinstance(point, str) and _at_or_above(point, path)
            if inside and (best is None or len(point) > best[0]):
                best = (len(point), name, nodes)
    return best


def no_disk_under(
    state: Mapping[str, Any], path: str, nearest: tuple[int, str, list[int]] | None
) -> str | None:
    """``TYPE at POINT`` when the nearest mount point at or above ``path`` in the node's
    inventory is a filesystem on no local disk (the inventory's ``mounts``: NFS, tmpfs,
    FUSE), nearer than ``nearest`` (:func:`_nearest_disk`'s answer); None otherwise."""
    best = -1 if nearest is None else nearest[0]
    found = None
    for mount in _dicts(_dict(state.get("inventory")).get("mounts")):
        point, kind = mount.get("point"), mount.get("type")
        if isinstance(point, str) and _at_or_above(point, path) and len(point) > best:
            best, found = len(point), f"{_text(kind) or 'a filesystem'} at {point}"
    return found


def _at_or_above(point: str, path: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def _node_cpus(state: Mapping[str, Any]) -> dict[int, set[int]]:
    """NUMA node id -> its CPUs, from the state's ``numa_nodes`` (parsed once a pod)."""
    found: dict[int, set[int]] = {}
    for node in _dicts(state.get("numa_nodes")):
        if isinstance(node.get("id"), int):
            found[node["id"]] = found.get(node["id"], set()) | parse_cpulist(node.get("cpus"))
    return found


def _cpu_nodes(node_cpus: Mapping[int, set[int]], cpus: set[int]) -> set[int]:
    return {node for node, on_node in node_cpus.items() if on_node & cpus}


def not_running(pod: Mapping[str, Any]) -> PodCheck:
    """The verdict of a pod named on the command line that is not running: unknown (it
    has no CPUs or devices yet to check; a Pending pod may be waiting for the scheduler
    or refused at admission, and ``kubectl describe`` says which)."""
    namespace, name = pod_key(pod)
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    check = PodCheck(f"{namespace}/{name}", _text(spec.get("nodeName")))
    phase = _text(status.get("phase")) or "unknown"
    check.fault(UNKNOWN, f"phase {phase}: not running, nothing placed to check yet")
    return check


def check_pod(
    pod: Mapping[str, Any], state: Mapping[str, Any] | None,
    volumes: Iterable[tuple[str, str | None]], prefix: str,
) -> PodCheck:  # fmt: skip
    """The verdict of one pod on its node's plugin ``state`` (None: not read), with its
    ``volumes``: (claim, host path of its local PersistentVolume or None)."""
    namespace, name = pod_key(pod)
    spec = _dict(pod.get("spec"))
    node = _text(spec.get("nodeName"))
    check = PodCheck(f"{namespace}/{name}", node)
    if state is None:
        check.fault(UNKNOWN, f"the plugin on {node or 'no node'} could not be read")
        return check
    holders = _dict(state.get("pod_resources")).get("holders")
    mine = [h for h in _dicts(holders) if h.get("pod") == check.pod]
    held = [
        (h, r, ids)
        for h in mine
        for r, ids in _dict(h.get("devices")).items()
        if isinstance(r, str) and r.startswith(prefix + "/") and isinstance(ids, list)
    ]
    if not held:
        check.fault(UNKNOWN, "the plugin lists no container of it holding a resource")
        return check
    resources = _dict(state.get("resources"))
    near = {e.get("resource"): e for e in _dicts(state.get("near"))}
    followed: dict[str, set[str]] = {}
    all_nodes: set[int] = set()
    node_cpus = _node_cpus(state)
    for holder, resource, ids in held:
        nodes = {int(m[1]) for i in ids if isinstance(i, str) and (m := _DEVICE_NODE.match(i))}
        all_nodes |= nodes
        by_node = _dict(_dict(near.get(resource)).get("by_node"))
        devices = sorted({d for n in nodes for d in by_node.get(str(n), []) if isinstance(d, str)})
        lost = _dict(resources.get(resource)).get("lost")
        check.resources[resource] = {"numa_nodes": sorted(nodes), "devices": devices,
                                     "lost": lost}  # fmt: skip
        if resource in near:
            followed[resource] = set(devices)
        if isinstance(lost, str):
            check.fault(LOST, f"{resource}: device lost: {lost}")
        cpus = parse_cpulist(holder.get("cpus"))
        container = _text(holder.get("container"))
        if not cpus:
            why = "no exclusive CPUs (Guaranteed QoS with integer CPUs, the static CPU manager)"
            check.fault(MISALIGNED, f"container {container}: {why}")
        elif resource == f"{prefix}/any" and len(ids) != len(cpus):
            why = (f"asks {resource}: {len(ids)} for {len(cpus)} exclusive CPUs (ask as "
                   "many as its CPUs: any's count is the free CPUs of one NUMA node)")  # fmt: skip
            check.fault(MISCONFIGURED, f"container {container}: {why}")
        cpu_nodes = _cpu_nodes(node_cpus, cpus)
        check.cpu_nodes = sorted(set(check.cpu_nodes) | cpu_nodes)
        devices_at = f"{resource}'s device(s) on {_list(nodes)}"
        if cpus and nodes and not cpu_nodes <= nodes:
            where = f"CPUs on NUMA node(s) {_list(cpu_nodes)}"
            check.fault(MISALIGNED, f"container {container}: {where}, {devices_at}")
        memory = {m.get("numa_node") for m in _dicts(holder.get("memory"))}
        memory_nodes = {n for n in memory if isinstance(n, int)}
        check.memory_nodes = sorted(set(check.memory_nodes) | memory_nodes)
        if nodes and not memory_nodes <= nodes:
            where = f"memory on NUMA node(s) {_list(memory_nodes)}"
            check.fault(MISALIGNED, f"container {container}: {where}, {devices_at}")
    for claim, path in volumes:
        _check_volume(check, state, claim, path, followed, all_nodes)
    return check


def _check_volume(
    check: PodCheck, state: Mapping[str, Any], claim: str, path: str | None,
    followed: Mapping[str, set[str]], nodes: set[int],
) -> None:  # fmt: skip
    entry: dict[str, Any] = {"claim": claim, "path": path, "disk": None, "numa_nodes": [],
                             "followed": None}  # fmt: skip
    check.volumes.append(entry)
    if path is None:
        return  # not a local volume: no disk of this node
    nearest = _nearest_disk(state, path)
    other = no_disk_under(state, path, nearest)
    if other is not None:
        check.fault(UNKNOWN, f"volume {claim} ({path}) is on {other}, a filesystem on no "
                             "local disk: no NUMA node to check")  # fmt: skip
        return
    if nearest is None:
        why = (
            "the plugin has not read its devices yet (it reads them once registered)"
            if state.get("inventory") is None
            else "the plugin reads no host mount table"
        )
        check.fault(UNKNOWN, f"volume {claim} ({path}): the node's mount points are unknown "
                             f"({why})")  # fmt: skip
        return
    _, disk, disk_nodes = nearest
    entry.update(disk=disk, numa_nodes=disk_nodes)
    if followed:
        entry["followed"] = any(disk in devices for devices in followed.values())
        if not entry["followed"]:
            follows = "; ".join(f"{r} follows {','.join(sorted(d)) or 'nothing here'}"
                                for r, d in sorted(followed.items()))  # fmt: skip
            check.fault(MISALIGNED, f"volume {claim} ({path}) is on {disk}, NUMA node(s) "
                        f"{_list(disk_nodes)}; {follows}")  # fmt: skip
    elif nodes and not set(disk_nodes) & nodes:
        check.fault(MISALIGNED, f"volume {claim} ({path}) is on {disk}, NUMA node(s) "
                    f"{_list(disk_nodes)}; the pod's devices are on {_list(nodes)}")  # fmt: skip


def _list(nodes: Iterable[int]) -> str:
    return ",".join(map(str, sorted(nodes))) or "none"
