"""The restart loop's verdicts, pure: why a resource must be served (again) and why
the plugin is not ready (``/readyz``), from the state the loop finds."""

from __future__ import annotations

from collections.abc import Mapping

from numa_device_plugin.plugin.serving.endpoint import Endpoint, KubeletIdentity
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer


def restart_reason(
    endpoint: Endpoint | None, kubelet: KubeletIdentity | None, stream_lost: bool
) -> str | None:
    """Why a resource must be served (again) now, or None. ``endpoint``: its running
    endpoint; ``kubelet``: the identity of the ``kubelet.sock`` there now (None: none).

    Not served while a kubelet is there; served for another kubelet than the one there
    now; its socket file gone or replaced; or its ListAndWatch stream lost.
    """
    if endpoint is None:
        return "not served" if kubelet is not None else None
    if kubelet is not None and endpoint.kubelet != kubelet:
        return "a new kubelet.sock: the kubelet restarted"
    if not endpoint.server.is_intact():
        return "its socket is gone"
    if stream_lost:
        return "the kubelet closed its ListAndWatch stream"
    return None


def serve_problem(failed: Mapping[str, str]) -> str | None:
    """Why serving is not done, for ``/readyz``: ``failed`` the resources whose servers
    failed to start, name -> error (``Endpoints.start_all``); None when none did."""
    if not failed:
        return None
    first = next(iter(failed.values()))
    return f"cannot serve {len(failed)} resource(s) (first error: {first}); retrying"


def resource_problem(registered: bool, servicer: NumaDevicePluginServicer) -> str | None:
    """Why a resource is not ready, or None: not registered with the kubelet, or
    registered without the kubelet's ListAndWatch stream open."""
    if not registered:
        return "not registered with the kubelet"
    if not servicer.kubelet_stream_open:
        return "the kubelet has no ListAndWatch stream open"
    return None


def readiness(
    lock_problem: str | None,
    serve_problem: str | None,
    servicers: Mapping[str, NumaDevicePluginServicer],
    registered: set[str],
    devices_read: bool = True,
    watching: bool = True,
) -> list[str]:
    """:meth:`PluginManager.readiness_problems` from its parts; ``watching`` False (the
    device-plugin folder's watch still to begin) and ``devices_read`` False (the
    devices the first look left out still to be read), each a moment after
    registering, are problems only when there is no other."""
    if lock_problem is not None:
        return [lock_problem]
    if not servicers:
        return ["no NUMA node is advertised"]
    problems = [] if serve_problem is None else [serve_problem]
    problems += [
        f"{name}: {problem}"
        for name, servicer in servicers.items()
        if (problem := resource_problem(name in registered, servicer)) is not None
    ]
    if problems:
        return problems
    if not watching:
        problems.append("the device-plugin folder is watched once registered")
    if not devices_read:
        problems.append("the devices (PCI, disks, NICs) are read once registered")
    return problems
