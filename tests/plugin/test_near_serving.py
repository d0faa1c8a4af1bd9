"""Resources that follow a device, served by the manager: their NUMA nodes reported to the
metrics, and a disk that moves followed without a restart or other registrations."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.model.recorder import NullRecorder
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import (
    all_live,
    eventually,
    running,
    wait_all_live,
)


class _NearRecorder(NullRecorder):
    """Keeps each report of the near resources' NUMA nodes."""

    def __init__(self) -> None:
        self.reports: list[dict[str, tuple[int, ...]]] = []

    def near(self, nodes: Mapping[str, Sequence[int]]) -> None:
        self.reports.append({name: tuple(ids) for name, ids in nodes.items()})


async def test_the_manager_reports_each_near_resources_numa_nodes_to_the_metrics(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Mutant: ``recorder.near({})``: numa_device_plugin_near_* never reported."""
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    near = (parse_near("data-disk=serial:S1"), parse_near("gone=serial:NONE"))
    recorder = _NearRecorder()
    async with running(make_config(two_nodes, sock_dir, near=near), recorder=recorder) as manager:
        await asyncio.wait_for(manager.started.wait(), 10)
        assert recorder.reports[-1] == {"numa-align/data-disk": (1,), "numa-align/gone": ()}


async def test_a_disk_that_moves_is_followed_without_a_restart_or_other_registrations(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Hotplug: the disk under a near resource is replaced by one on the other node
    (then taken away): with --device-interval the resource follows it, and only it
    registers again; nothing registers while nothing changes."""
    from numa_device_plugin.plugin.model.near import parse_near
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
    config = make_config(two_nodes, sock_dir, near=(parse_near("data=serial:DATA"),),
                         device_interval=0.2)  # fmt: skip
    disk = "numa-align/data"
    async with KubeletStandIn(sock_dir) as kubelet, running(config) as manager:
        await wait_all_live(kubelet, [*NAMES, disk])
        assert {n.ID for d in kubelet.devices(disk) for n in d.topology.nodes} == {1}
        looks: list[int] = []
        five = asyncio.Event()
        look = manager.device_watch.look

        async def counted() -> None:
            await look()
            looks.append(1)
            if len(looks) >= 5:
                five.set()

        manager.device_watch.look = counted  # type: ignore[method-assign]
        await asyncio.wait_for(five.wait(), 60)  # five looks at unchanged devices, however slow
        registered = [r.resource_name for r in kubelet.registrations]
        assert sorted(registered) == sorted([*NAMES, disk])
        # The disk is replaced by one on NUMA node 0 (same serial: the same data).
        shutil.rmtree(devices.pci_folder("0000:41:00.0") / "nvme")
        (two_nodes.root / "class" / "block" / "nvme1n1").unlink()
        devices.disk("nvme0n1", "0000:01:00.0", serial="DATA")
        await kubelet.wait_until(
            lambda: {n.ID for d in kubelet.devices(disk) for n in d.topology.nodes} == {0},
            timeout=20,
        )
        # Only it registers again (twice when a look falls between the removal and the
        # new disk: lost, then moved).
        assert {r.resource_name for r in kubelet.registrations[len(registered) :]} == {disk}
        assert manager.resources[disk].near_devices == ((0, ("nvme0n1",)),)
        # Taken away: the resource stays, every device Unhealthy (the kubelet then tells
        # the pods that hold one), with why.
        (two_nodes.root / "class" / "block" / "nvme0n1").unlink()
        await eventually(lambda: manager.resources[disk].lost is not None, 20)
        assert manager.resources[disk].lost == (
            "serial:DATA: no disk with that serial matches on this node"
        )
        await kubelet.wait_until(
            lambda: {d.health for d in kubelet.devices(disk)} == {"Unhealthy"}, timeout=20
        )
        assert all_live(kubelet, NAMES)
        # Back on node 1: served again, Healthy, on its new node.
        devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
        await kubelet.wait_until(
            lambda: (
                {(n.ID, d.health) for d in kubelet.devices(disk) for n in d.topology.nodes}
                == {(1, "Healthy")}
            ),
            timeout=20,
        )
        assert manager.resources[disk].lost is None
