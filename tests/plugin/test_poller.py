"""The capacity poller: what it reads from the pod resources API, what it advertises
and what it warns about, once per change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.catalog import Catalog
from numa_device_plugin.plugin.discovery import discover
from numa_device_plugin.plugin.poller import CapacityPoller
from numa_device_plugin.plugin.recorder import NullRecorder
from numa_device_plugin.plugin.servicer import NumaDevicePluginServicer
from tests.topology.test_numamemory import GI, M1, machine

MEMORY_WARNING = "the kubelet's Memory Manager is not Static"


class ScriptedClient:
    """The pod resources client, answering the views given, one per read."""

    def __init__(self, views: list[KubeletView]) -> None:
        self.views = views

    async def view(self, timeout: float, *, allocatable: bool) -> KubeletView:
        return self.views.pop(0)

    async def close(self) -> None:
        pass


def memory_poller(tmp_path: Path, **overrides: Any) -> CapacityPoller:
    config = config_from_params(
        {"sysfs_root": machine(tmp_path).root, "memory_unit": GI, **overrides}
    )
    catalog = Catalog(lambda resource: NumaDevicePluginServicer(resource))
    catalog.update(discover(config))
    return CapacityPoller(config, catalog, NullRecorder())


def no_memory_view(pods: int) -> KubeletView:
    """A kubelet whose Memory Manager is not Static (no memory), with ``pods``
    containers each holding CPU ``pods`` (so successive views differ)."""
    from numa_device_plugin.kubelet.view import Holder

    holders = tuple(Holder("ns", f"p{i}", "c", frozenset({i})) for i in range(pods))
    return KubeletView(frozenset(range(8)), holders)


def test_allow_unaligned_also_keeps_memory_devices_from_being_withheld(tmp_path: Path) -> None:
    """Mutant: ``--allow-unaligned`` ignored in ``memory_unaligned()``."""
    strict = memory_poller(tmp_path / "strict")
    strict.view = no_memory_view(0)
    assert strict.memory_unaligned()
    assert strict.withheld(M1)
    allowed = memory_poller(tmp_path / "allowed", allow_unaligned=True)
    allowed.view = no_memory_view(0)
    assert not allowed.memory_unaligned()
    assert not allowed.withheld(M1)


async def test_the_memory_warning_is_said_once_per_change_not_per_read(tmp_path: Path) -> None:
    """Mutant: the memory warning no longer deduplicated (one line per changed read)."""
    poller = memory_poller(tmp_path)
    poller.client = ScriptedClient([no_memory_view(n) for n in range(4)])  # type: ignore[assignment]
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            await poller.poll_once()
    said = [entry for entry in logs if entry["event"].startswith(MEMORY_WARNING)]
    assert len(said) == 1
    assert M1 in said[0]["resources"]
