"""Device locality: discovery of PCI devices, disks and mounts on a synthetic machine, time
and peak RSS.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.figures import Figure

# -- device locality --------------------------------------------------------------------------


def device_machine(root: Path, pci: int, block: int) -> None:
    """Two NUMA nodes of 16 CPUs with ``pci`` PCI devices (alternating nodes 0 and 1,
    every tenth at -1), the first ``block`` of them NVMe controllers with a disk (serial
    ``S<n>``) and two partitions each, the rest Ethernet controllers with a NIC."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    build_machine(root, nodes=2, cpus_per_node=16)
    tree = DeviceTree(root)
    for index in range(pci):
        address = f"0000:{index // 32:02x}:{index % 32:02x}.0"
        node = -1 if index % 10 == 9 else index % 2
        if index < block:
            tree.pci(address, node, "0x010802")
            tree.disk(f"nvme{index}n1", address, serial=f"S{index}", partitions=2)
        else:
            tree.pci(address, node, "0x020000")
            tree.nic(f"eth{index}", address)


def _discover_rss(root: Path, *flags: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB, the process's own: :mod:`benchmarks.peak`) of one
    ``discover`` process on ``root``."""
    import subprocess
    import tempfile

    from benchmarks.peak import peak_mb, wrapped

    with tempfile.TemporaryDirectory(prefix="ndp-peak-") as folder:
        peak_file = Path(folder) / "peak-kb"
        started = time.perf_counter()
        done = subprocess.run(
            wrapped([sys.executable], peak_file, "numa_device_plugin", "discover",
                    "--sysfs-root", str(root), "--output", "json", *flags),
            capture_output=True, check=True,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        peak = peak_mb(peak_file)
    assert json.loads(done.stdout)["nodes"], "discover found no NUMA node"
    return seconds, peak


# One look of 512 path: selectors (64 resources x 8) at a table of the most mounts read
# (MAX_MOUNTS): the target, in ms, of the hardening round that found 10-17 s.
PATH_LOOK_TARGET_MS = 200.0


def mount_table(root: Path, table: Path, block: int, mounts: int) -> None:
    """A mountinfo of ``mounts`` lines: ``/`` and the first partition of each disk
    (``/mnt/disks/d<n>``, its ``dev/block`` link made) up to ``mounts``, then tmpfs
    mounts."""
    lines = ["1 0 8:1 / / rw - ext4 /dev/sda1 rw"]
    for index in range(mounts - 1):
        if index < block:
            device = f"259:{index}"
            link = root / "dev" / "block" / device
            link.parent.mkdir(parents=True, exist_ok=True)
            part = (root / "class" / "block" / f"nvme{index}n1p1").resolve()
            link.symlink_to(os.path.relpath(part, link.parent))
            lines.append(f"{index + 2} 1 {device} / /mnt/disks/d{index} rw - xfs /dev/x rw")
        else:
            lines.append(f"{index + 2} 1 0:{index} / /run/t{index} rw - tmpfs tmpfs rw")
    table.write_text("\n".join(lines) + "\n")


async def locality(pci: int, block: int, runs: int, mounts: int = 200) -> list[Figure]:
    """Device locality (``bus/pci``, ``class/block``, ``class/net``) on a synthetic tree
    of ``pci`` PCI devices and ``block`` disks (3 block devices each) and a mount table
    of ``mounts`` mounts: read_inventory's median and slowest of ``runs`` (ms), one
    selector of each kind resolved (ms), the mount table read (ms), one full quiet look
    of the device watch and one look at unchanged devices (its look key, what it reads
    every interval but each tenth; ms), and a ``discover`` process's wall
    time and peak RSS with and without the devices."""
    import shutil
    import tempfile

    from numa_device_plugin.plugin.advertised.discovery import discover, look_key
    from numa_device_plugin.plugin.model.near import MAX_ALL_OF, MAX_NEAR, parse_near
    from numa_device_plugin.plugin.settings.config import Config
    from numa_device_plugin.topology.locality import read_inventory
    from numa_device_plugin.topology.mounts import MAX_MOUNTS, read_mount_table
    from numa_device_plugin.topology.selectors import parse_selector, select

    figures = []
    with tempfile.TemporaryDirectory(prefix="ndp-locality-") as folder:
        root = Path(folder) / "sys"
        device_machine(root, pci, block)
        samples = []
        inventory = read_inventory(root)
        for _ in range(runs):
            started = time.perf_counter()
            inventory = read_inventory(root)
            samples.append((time.perf_counter() - started) * 1000)
        shape = f"{pci} PCI devices, {block} disks ({len(inventory.block)} block devices)"
        selectors = [parse_selector(text) for text in (
            f"serial:S{block - 1}", "block:nvme0n1p2", f"net:eth{pci - 1}", "pci:0000:00:01.0",
            "pci-id:144d:a808", "pci-class:0200",
        )]  # fmt: skip
        started = time.perf_counter()
        for selector in selectors:
            select(inventory, selector)
        select_ms = (time.perf_counter() - started) * 1000 / len(selectors)
        table = Path(folder) / "mountinfo"
        mount_table(root, table, block, mounts)
        started = time.perf_counter()
        mount_read = read_mount_table(table, root)
        table_ms = (time.perf_counter() - started) * 1000
        path = parse_selector("path-below:/mnt/disks/d0/data")
        assert select(inventory, path, mount_read).nodes, "the path selector found no node"
        # A look at the limits: the table read once, then MAX_NEAR x MAX_ALL_OF path:
        # selectors resolved against it (the tree indexed once per read).
        paths = [parse_selector(f"path-below:/mnt/disks/d{i % max(1, min(block, mounts - 1))}"
                                f"/x{i}") for i in range(MAX_NEAR * MAX_ALL_OF)]  # fmt: skip
        started = time.perf_counter()
        limits_read = read_mount_table(table, root)
        for one in paths:
            select(inventory, one, limits_read)
        limits_ms = (time.perf_counter() - started) * 1000
        near = (parse_near(f"disk=serial:S{block - 1}"), parse_near("data=path:/mnt/disks/d0"))
        config = Config(sysfs_root=root, near=near, mount_table=table)
        rereads, keys = [], []
        for _ in range(max(1, runs // 7)):
            started = time.perf_counter()
            discover(config, quiet=True)  # the device watch's full look
            rereads.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            look_key(config)  # what it reads every interval while the key is unchanged
            keys.append((time.perf_counter() - started) * 1000)
        flags = ["--near", f"disk=serial:S{block - 1}", "--near", "data=path:/mnt/disks/d0"]
        with_devices = _discover_rss(root, *flags, "--mount-table", str(table))
        for kind in ("bus", "class"):
            shutil.rmtree(root / kind)
        without = _discover_rss(root)
    figures += [
        Figure("locality", shape, "read_inventory median", statistics.median(samples), "ms"),
        Figure("locality", shape, "read_inventory slowest", max(samples), "ms"),
        Figure("locality", shape, "one selector resolved", select_ms, "ms"),
        Figure("locality", f"{mounts} mounts", "read_mount_table", table_ms, "ms"),
        Figure(
            "locality",
            f"{mounts} mounts",
            f"one look, {len(paths)} path: selectors",
            limits_ms,
            "ms",
            target=PATH_LOOK_TARGET_MS if mounts >= MAX_MOUNTS else None,
        ),
        Figure(
            "locality",
            shape,
            "one look of the device watch (quiet)",
            statistics.median(rereads),
            "ms",
        ),
        Figure(
            "locality",
            shape,
            "one look at unchanged devices (the look key)",
            statistics.median(keys),
            "ms",
        ),
        Figure("locality", shape, "discover process, with devices", with_devices[0], "s"),
        Figure("locality", "no PCI, block or net", "discover process", without[0], "s"),
        Figure("locality", shape, "discover peak RSS, with devices", with_devices[1], "MB"),
    ]
    return figures
