"""``numa-device-plugin fake-host DIR``: write a fake server (its sysfs and mount table)
into a new folder, to try ``discover``, ``demo`` and ``status`` on before a cluster
(:mod:`numa_device_plugin.topology.fakehost`)."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from numa_device_plugin.topology.fakehost import MACHINES, build_host


@click.command(
    "fake-host",
    help="Write a fake server into the new folder DIR: DIR/sys (NUMA nodes, CPUs, PCI "
    "devices, disks and NICs, and the dev/block links path: follows) and "
    "DIR/proc/1/mountinfo (its mounts), which discover, demo and status read with "
    "--sysfs-root DIR/sys. two-socket-storage: NVMe data disks at /data/ch (NUMA node 0) "
    "and /data/kafka (node 1), a 100G NIC ens1f0 on node 1; --swapped: the disks cabled "
    "the other way round.",
)
@click.argument("folder", type=click.Path(path_type=Path), envvar="NUMA_FOLDER")
@click.option("--machine", type=click.Choice(MACHINES), default=MACHINES[0], show_default=True,
              envvar="NUMA_MACHINE", show_envvar=True, help="the server to write")  # fmt: skip
@click.option("--swapped", is_flag=True, envvar="NUMA_SWAPPED", show_envvar=True,
              help="the data disks on each other's NUMA node (a server cabled the other "
                   "way round)")  # fmt: skip
def command(folder: Path, machine: str, swapped: bool) -> int:
    """0 after writing; 2 (usage) for a folder that holds something."""
    try:
        root = build_host(folder, machine, swapped)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    near = ["--near", "ch=path:/data/ch", "--near", "kafka=path:/data/kafka",
            "--near", "nic=net:ens1f0"]  # fmt: skip
    print(f"a fake {machine}{' (swapped)' if swapped else ''} in {folder}: {root} and "
          f"{folder / 'proc' / '1' / 'mountinfo'}")  # fmt: skip
    print("try:")
    print("  numa-device-plugin discover " + shlex.join(["--sysfs-root", str(root), *near]))
    print("  numa-device-plugin demo " + shlex.join(["--sysfs-root", str(root), *near]))
    return 0
