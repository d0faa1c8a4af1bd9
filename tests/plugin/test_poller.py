"""The capacity poller: what it reads from the pod resources API, what it advertises
and what it warns about, once per change."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.counts.poller import CapacityPoller
from numa_device_plugin.plugin.model.recorder import NullRecorder
from numa_device_plugin.plugin.serving.catalog import Catalog
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
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

    async def disconnect(self) -> None:
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


async def test_an_equal_answer_in_a_new_object_is_kept_so_the_next_read_is_told_by_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer equal to the last but another object (the kubelet's
    GetAllocatableResources in another order) is compared once, in a worker thread;
    the client then returns that same object while nothing changes, and the reads
    after it need no comparison. Mutant: the poller keeps its old view, and every
    read after such an answer hops to a thread for a deep comparison (seen at 200
    containers: 2.7 thread wakes per read)."""
    poller = memory_poller(tmp_path)
    first, equal = no_memory_view(3), no_memory_view(3)
    assert first == equal
    assert first is not equal
    poller.client = ScriptedClient([first, equal, equal, equal])  # type: ignore[assignment]
    compared: list[object] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(func: Any, /, *args: Any) -> Any:
        compared.append(func)
        return await real_to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting_to_thread)
    await poller.poll_once()  # the first answer: planned (in a thread) and applied
    applied = len(compared)
    await poller.poll_once()
    assert compared[applied:] == [operator.eq]
    assert poller.view is equal
    await poller.poll_once()
    await poller.poll_once()
    assert compared[applied:] == [operator.eq], "unchanged reads compare by identity"


@asynccontextmanager
async def reading(tmp_path: Path, sock_dir: Path, interval: float) -> AsyncIterator[CapacityPoller]:
    """A poller reading the pod resources API of a stand-in every ``interval`` seconds,
    for the block; its connection closed after."""
    socket = sock_dir / "pr" / "kubelet.sock"
    poller = memory_poller(tmp_path, pod_resources_socket=socket, pod_resources_interval=interval)
    standin = KubeletStandIn(sock_dir / "dp", pod_resources_dir=sock_dir / "pr",
                             allocatable_cpus=range(8))  # fmt: skip
    async with standin:
        try:
            yield poller
        finally:
            await poller.close()


@pytest.mark.parametrize(("signalled", "interval", "kept"), [
    (True, 5.0, False),  # the kubepods watch live: reads 60 s apart
    (False, 30.0, False),
    (False, 5.0, True),
    (False, 0.1, True),
])  # fmt: skip
async def test_reads_far_apart_each_dial_anew_and_close_ones_share_a_connection(
    tmp_path: Path, sock_dir: Path, signalled: bool, interval: float, kept: bool
) -> None:
    """An idle grpc connection kept for a minute costs grpc's workers ~20 wakes a second
    (sometimes); a dial ~2 ms. Reads of the same answer stay told by identity across a
    dial. Mutants: the connection always kept; closed with the answers (``close``)."""
    async with reading(tmp_path, sock_dir, interval) as poller:
        poller.schedule.signalled = lambda: signalled
        await poller.poll_once()
        first = poller.view
        assert first is not None
        assert poller.client.connected is kept
        await poller.poll_once()
        assert poller.view is first
        assert poller.client.connected is kept


async def test_the_read_before_registering_keeps_no_connection(
    tmp_path: Path, sock_dir: Path
) -> None:
    """Even with reads close together: one kept from before the registrations to after
    them left grpc's workers waking ~20 times a second in 13 starts of 19. Mutant: the
    read before registering is an ordinary read."""
    async with reading(tmp_path, sock_dir, 0.1) as poller:
        await poller.read_before_registering()
        first = poller.view
        assert first is not None
        assert not poller.client.connected
        await poller.poll_once()
        assert poller.view is first
        assert poller.client.connected
