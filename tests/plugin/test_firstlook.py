"""Serve's first look leaves the devices out when no resource follows one: the
resources register first, the devices (inventory, details) are read after, and the
plugin is ready (and settled) only once they are. A reload meanwhile wins; with
``--near`` the first look reads them (the near resources need them)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import structlog

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover, read_devices
from numa_device_plugin.plugin.lifecycle import devicewatch
from numa_device_plugin.plugin.model.near import parse_near
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import eventually, running, wait_all_live

DEVICES_LINE = "the devices (PCI, disks, NICs) are read once registered"


def with_devices(tree: SysfsTree) -> DeviceTree:
    """An NVMe disk and a NIC on NUMA node 1, and a PCI device that warns (its
    ``numa_node`` is not a number)."""
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="DATA")
    devices.pci("0000:42:00.0", 1, "0x020000")
    devices.nic("ens1", "0000:42:00.0")
    devices.pci("0000:43:00.0", "x", "0x020000")
    return devices


class HeldRead:
    """Stands in for ``read_devices`` in the device watch: notes the Register calls the
    stand-in had answered when it was called, then waits for :attr:`go`."""

    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet
        self.registered_at_call: list[str] = []
        self.called = threading.Event()
        self.go = threading.Event()
        self.returned = threading.Event()

    def __call__(self, config: Config, discovery: Discovery) -> Discovery:
        self.registered_at_call = sorted(r.resource_name for r in self.kubelet.registrations)
        self.called.set()
        assert self.go.wait(20), "the test never let the read go on"
        try:
            return read_devices(config, discovery)
        finally:
            self.returned.set()


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[KubeletStandIn], HeldRead]]:
    """Puts a :class:`HeldRead` in the device watch; lets it go on at the end however
    the test ends (a read left waiting would hold the event loop's close)."""
    made: list[HeldRead] = []

    def make(kubelet: KubeletStandIn) -> HeldRead:
        made.append(held := HeldRead(kubelet))
        monkeypatch.setattr(devicewatch, "read_devices", held)
        return held

    yield make
    for held in made:
        held.go.set()


def test_a_first_look_without_the_devices_reads_none_and_read_devices_adds_them(
    two_nodes: SysfsTree,
) -> None:
    with_devices(two_nodes)
    config = Config(sysfs_root=two_nodes.root)
    with structlog.testing.capture_logs() as logs:
        first = discover(config, devices=False)
    assert not first.devices_read
    assert first.inventory.pci == ()
    assert first.details is None
    assert set(first.resources) == set(NAMES)
    events = [entry["event"] for entry in logs]
    assert events.count("advertising NUMA node") == 2
    assert not [e for e in events if "numa_node" in e], "no device read, no device warned"
    with structlog.testing.capture_logs() as logs:
        read = read_devices(config, first)
    full = discover(config)
    assert read.devices_read
    assert read == full, "the same discovery as one whole look"
    assert read.details is not None
    assert read.details == full.details
    assert [a.address for a in read.inventory.pci] == ["0000:41:00.0", "0000:42:00.0"]
    assert [entry["event"] for entry in logs if "0000:43:00.0" in entry["event"]], logs


def test_a_first_look_with_a_resource_near_a_device_reads_the_devices(
    two_nodes: SysfsTree,
) -> None:
    with_devices(two_nodes)
    config = Config(sysfs_root=two_nodes.root, near=(parse_near("data=serial:DATA"),))
    first = discover(config, devices=False)
    assert first.devices_read
    assert first.details is not None
    assert first.resources["numa-align/data"].near_nodes == (1,)


async def test_serve_registers_before_reading_the_devices_then_reads_them_and_is_ready(
    two_nodes: SysfsTree, sock_dir: Path, hold: Callable[[KubeletStandIn], HeldRead]
) -> None:
    with_devices(two_nodes)
    async with KubeletStandIn(sock_dir) as kubelet:
        held = hold(kubelet)
        with structlog.testing.capture_logs() as logs:
            async with running(make_config(two_nodes, sock_dir)) as manager:
                await asyncio.to_thread(held.called.wait, 20)
                assert held.registered_at_call == NAMES, "each registered before the read"
                await wait_all_live(kubelet, NAMES)
                await eventually(lambda: manager.watches.watching)  # a moment after
                assert manager.readiness_problems() == [DEVICES_LINE]
                assert not manager.settled()
                held.go.set()
                await manager.wait_settled()
                assert manager.readiness_problems() == []
                discovery = manager.catalog.discovery
                assert discovery is not None
                assert discovery.devices_read
                assert len(discovery.inventory.pci) == 2
                assert discovery.details
                registered = sorted(r.resource_name for r in kubelet.registrations)
                assert registered == NAMES, "nothing registers again for the devices read"
    events = [entry["event"] for entry in logs]
    assert "devices changed; serving again what changed" not in events
    assert events.count("advertising NUMA node") == 2, "the plan is logged once"


async def test_without_a_kubelet_the_devices_are_read_all_the_same(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    with_devices(two_nodes)
    async with running(make_config(two_nodes, sock_dir)) as manager:
        await manager.wait_settled()
        discovery = manager.catalog.discovery
        assert discovery is not None
        assert discovery.devices_read
        assert len(discovery.inventory.pci) == 2


@pytest.mark.parametrize("handed_over", [False, True], ids=["before", "after"])
async def test_a_reload_while_the_devices_are_read_is_what_stays_served(
    two_nodes: SysfsTree,
    sock_dir: Path,
    hold: Callable[[KubeletStandIn], HeldRead],
    handed_over: bool,
) -> None:
    """The read's result belongs to the look before the reload: it must not bring back
    NUMA node 1 after the reload found it gone, whether the reload is served before the
    read ends, or after the read was handed over (the loop still gathering the reload's
    burst: a debounce of 2 s)."""
    with_devices(two_nodes)
    debounce = 2.0 if handed_over else 0.002
    async with KubeletStandIn(sock_dir) as kubelet:
        held = hold(kubelet)
        async with running(make_config(two_nodes, sock_dir, debounce=debounce)) as manager:
            await asyncio.to_thread(held.called.wait, 20)
            two_nodes.write("cpu/online", "0-3\n")  # node 1's CPUs 4-7 go offline
            manager.reload()
            if not handed_over:
                await eventually(lambda: set(manager.resources) == {NAMES[0]})
            held.go.set()
            await asyncio.to_thread(held.returned.wait, 20)
            await manager.wait_settled()
            assert set(manager.resources) == {NAMES[0]}
            discovery = manager.catalog.discovery
            assert discovery is not None
            assert discovery.devices_read
            await wait_all_live(kubelet, NAMES[:1])


async def test_a_failed_read_of_the_devices_is_logged_and_leaves_the_plugin_ready(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node page's devices are no reason to stay unready: the next look (every
    ``--device-interval``) reads them again."""

    def failing(config: Config, discovery: Discovery) -> Discovery:
        raise PermissionError(13, "Permission denied", str(config.sysfs_root / "bus"))

    monkeypatch.setattr(devicewatch, "read_devices", failing)
    async with KubeletStandIn(sock_dir) as kubelet:
        with structlog.testing.capture_logs() as logs:
            async with running(make_config(two_nodes, sock_dir)) as manager:
                await wait_all_live(kubelet, NAMES)
                await manager.wait_settled()
                assert manager.readiness_problems() == []
    (failed,) = [e for e in logs if e["event"].startswith("reading the devices failed")]
    assert "Permission denied" in failed["error"]


def test_the_devices_still_to_read_make_a_readiness_problem_only_when_alone() -> None:
    """Another problem (not registered, cannot serve) says what is wrong; the devices
    line and the folder's watch line say the plugin is a moment from ready."""
    from functools import partial

    from numa_device_plugin.plugin.lifecycle.verdicts import readiness
    from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer

    class Servicer:
        kubelet_stream_open = True

    servicers = cast(dict[str, NumaDevicePluginServicer], {name: Servicer() for name in NAMES})
    ask = partial(readiness, None, servicers=servicers)
    assert ask(None, registered=set(NAMES), devices_read=False) == [DEVICES_LINE]
    assert ask(None, registered=set(NAMES), devices_read=True) == []
    assert ask(None, registered=set(NAMES), devices_read=False, watching=False) == [
        "the device-plugin folder is watched once registered",
        DEVICES_LINE,
    ]
    assert ask(None, registered={NAMES[0]}, watching=False) == [
        f"{NAMES[1]}: not registered with the kubelet"
    ]
    assert ask("cannot serve", registered=set(NAMES), devices_read=False) == ["cannot serve"]
    assert ask(None, registered={NAMES[0]}, devices_read=False) == [
        f"{NAMES[1]}: not registered with the kubelet"
    ]
