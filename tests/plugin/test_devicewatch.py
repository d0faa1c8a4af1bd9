"""The device watch: sysfs read again, and the manager woken only for a discovery that
would serve something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.devices import parse_near
from numa_device_plugin.plugin.devicewatch import DeviceWatch, changed, differs
from numa_device_plugin.plugin.discovery import Discovery, discover
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from numa_device_plugin.topology.sysfs import SysfsFormatError


def machine(root: Path) -> tuple[SysfsTree, DeviceTree]:
    tree = SysfsTree(root).cpus(4, online="0-3")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-1")
    tree.node(1, "2-3")
    devices = DeviceTree(root)
    devices.pci("0000:01:00.0", 0, "0x010802")
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme1n1", "0000:41:00.0", serial="DATA")
    return tree, devices


async def test_the_manager_is_woken_only_when_what_would_be_served_differs(
    tmp_path: Path,
) -> None:
    tree, devices = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    served: list[Discovery] = [discover(config)]
    woken: list[int] = []
    watch = DeviceWatch(config, discover, lambda: served[-1], lambda: woken.append(1))
    await watch.look()
    await watch.look()
    assert woken == []
    assert watch.take() is None
    devices.pci("0000:02:00.0", 0, "0x020000")  # a device nobody selects: shown, not served
    await watch.look()
    assert woken == [1]
    shown = watch.take()
    assert shown is not None
    assert changed(served[-1].resources, shown.resources) == set()
    served.append(shown)
    (tree.root / "class/block/nvme1n1").unlink()  # the selected disk goes
    await watch.look()
    assert woken == [1, 1]
    found = watch.take()
    assert found is not None
    assert changed(served[-1].resources, found.resources) == {"numa-align/d"}
    assert watch.take() is None


async def test_a_failed_read_keeps_what_is_served_and_wakes_nobody(tmp_path: Path) -> None:
    tree, _ = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root)
    woken: list[int] = []

    def broken(_: Config) -> Discovery:
        raise SysfsFormatError(tree.root / "node/node0/cpulist", "x", "malformed")

    watch = DeviceWatch(config, broken, lambda: discover(config), lambda: woken.append(1))
    await watch.look()
    await watch.look()
    assert (woken, watch.take()) == ([], None)


def test_nothing_is_served_before_the_first_discovery_so_any_differs(tmp_path: Path) -> None:
    tree, _ = machine(tmp_path / "sys")
    first = discover(Config(sysfs_root=tree.root))
    assert differs(None, first)
    assert not differs(first, discover(Config(sysfs_root=tree.root)))


async def test_a_look_at_unchanged_devices_logs_nothing_and_reads_no_details(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every --device-interval (60 s) a quiet look: no plan logged again, no details
    (models, sizes) read; only a change reads again, loud, with the details."""
    from functools import partial

    tree, devices = machine(tmp_path / "sys")
    config = Config(sysfs_root=tree.root, near=(parse_near("d=serial:DATA"),))
    served = [discover(config)]
    capsys.readouterr()
    loud: list[int] = []

    def counted(given: Config) -> Discovery:
        loud.append(1)
        return discover(given)

    watch = DeviceWatch(config, counted, lambda: served[-1], lambda: None,
                        partial(discover, quiet=True))  # fmt: skip
    for _ in range(3):
        await watch.look()
    assert loud == []
    assert capsys.readouterr().err == ""
    devices.disk("nvme0n1", "0000:01:00.0", serial="OTHER")
    await watch.look()
    assert loud == [1]
    found = watch.take()
    assert found is not None
    assert found.details is not None
    assert "advertising NUMA node" in capsys.readouterr().err
    assert discover(config, quiet=True).details is None
