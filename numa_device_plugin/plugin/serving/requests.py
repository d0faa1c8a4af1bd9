"""The kubelet's requests to a servicer, checked and answered purely: the device ids an
``Allocate`` or ``GetPreferredAllocation`` names, checked against the resource's devices
(:func:`check_ids`), and the devices ``GetPreferredAllocation`` prefers
(:func:`preferred`). A bad request raises :class:`RequestError`, whose text (cut by
:func:`bounded`) becomes the ``INVALID_ARGUMENT`` status message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from numa_device_plugin.plugin.model.resources import Device

# Device ids quoted in an error message at most; the rest are counted.
_MAX_IDS_IN_MESSAGE = 5
# A quoted id is cut to this many characters (real ids have at most 63).
_MAX_ID_CHARS = 64
# The whole status message (and its log line) at most, in bytes: a status message
# travels in gRPC metadata, and a huge one turns INVALID_ARGUMENT into RESOURCE_EXHAUSTED.
MAX_MESSAGE_BYTES = 1024


def _quote_id(device_id: str) -> str:
    if len(device_id) <= _MAX_ID_CHARS:
        return repr(device_id)
    return f"{device_id[:_MAX_ID_CHARS]!r}... ({len(device_id)} characters)"


def _quote_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(_quote_id(device_id) for device_id in ids[:_MAX_IDS_IN_MESSAGE])
    more = len(ids) - _MAX_IDS_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


def bounded(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``message`` cut to at most ``limit`` bytes of UTF-8, ending in ``...`` when cut."""
    encoded = message.encode()
    if len(encoded) <= limit:
        return message
    return encoded[: limit - 3].decode(errors="ignore") + "..."


class RequestError(ValueError):
    """A request the servicer refuses; the text becomes the INVALID_ARGUMENT message."""


def check_ids(
    by_id: Mapping[str, Device], ids: Sequence[str], where: str, *, allow_empty: bool = False
) -> None:
    """Raise :class:`RequestError` unless ``ids`` is a list of distinct device ids of
    ``by_id`` (the resource's devices by id), non-empty unless ``allow_empty``;
    ``where`` names the part of the request in the message."""
    if not ids and not allow_empty:
        raise RequestError(f"{where} names no device ids")
    unknown = [device_id for device_id in ids if device_id not in by_id]
    if unknown:
        raise RequestError(
            f"{where}: device ids {_quote_ids(unknown)} are not devices of this resource"
        )
    repeated = [device_id for device_id, count in Counter(ids).items() if count > 1]
    if repeated:
        raise RequestError(f"{where}: device ids {_quote_ids(repeated)} are listed twice")


def preferred(
    by_id: Mapping[str, Device], container: api_pb2.ContainerPreferredAllocationRequest, where: str
) -> list[str]:
    """GetPreferredAllocation's answer for one container request: its must-include
    device ids, then the available ones by :func:`by_preferred_node`, ``allocation_size``
    in all. Raises :class:`RequestError` for ids not of ``by_id`` (the resource's devices
    by id) or listed twice, must-include ids not available, or a size that cannot be
    met; ``where`` names the container request in the message."""
    available = list(container.available_deviceIDs)
    must = list(container.must_include_deviceIDs)
    size = container.allocation_size
    check_ids(by_id, available, f"{where} available_deviceIDs", allow_empty=True)
    check_ids(by_id, must, f"{where} must_include_deviceIDs", allow_empty=True)
    offered = set(available)
    missing = [device_id for device_id in must if device_id not in offered]
    if missing:
        raise RequestError(
            f"{where}: must_include_deviceIDs {_quote_ids(missing)} are not in available_deviceIDs"
        )
    if size < 1:
        raise RequestError(f"{where}: allocation_size must be at least 1, got {size}")
    if len(must) > size:
        raise RequestError(
            f"{where}: {len(must)} must-include devices do not fit allocation_size {size}"
        )
    chosen = sorted(must, key=partial(order, by_id))
    must_nodes = {by_id[d].node_id for d in must}
    rest = by_preferred_node(by_id, offered - set(must), must_nodes)
    if len(chosen) + len(rest) < size:
        raise RequestError(
            f"{where}: allocation_size {size} exceeds the {len(chosen) + len(rest)} "
            "available and must-include devices"
        )
    return chosen + rest[: size - len(chosen)]


def order(by_id: Mapping[str, Device], device_id: str) -> tuple[int, int, str]:
    """A total order of the devices of ``by_id``: NUMA node, index, id."""
    device = by_id[device_id]
    return device.node_id, device.index, device_id


def by_preferred_node(
    by_id: Mapping[str, Device], ids: set[str], must_nodes: set[int]
) -> list[str]:
    """``ids`` in the order to offer them, so that an allocation stays on one NUMA
    node where it can (a resource that follows a device on several NUMA nodes has
    devices of each): first the devices of the must-include devices' node when they
    are all on one, else of the node with the most devices available (then the
    lowest id); then the other nodes' in the same order. Deterministic: within a
    node, by index."""
    by_node: dict[int, list[str]] = {}
    for device_id in ids:
        by_node.setdefault(by_id[device_id].node_id, []).append(device_id)
    first = next(iter(must_nodes)) if len(must_nodes) == 1 else None
    nodes = sorted(by_node, key=lambda node: (node != first, -len(by_node[node]), node))
    return [
        device_id
        for node in nodes
        for device_id in sorted(by_node[node], key=partial(order, by_id))
    ]
