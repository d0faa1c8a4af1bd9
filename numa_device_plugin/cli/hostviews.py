"""The host views a command reads beside sysfs: which mount table goes with which sysfs
tree (``--sysfs-root`` and ``--mount-table`` of ``discover``, ``demo``, ``status`` and
``serve``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def own_mount_table(ctx: click.Context, params: dict[str, Any]) -> None:
    """Match the mount table to the sysfs tree: with ``--sysfs-root`` naming another
    tree than ``/sys`` and no ``--mount-table`` given, the tree's own table
    (``<root>/../proc/1/mountinfo``, as ``demo --machine`` and a fake host lay it out)
    when there is one; otherwise, when a ``path:`` selector would read it, a UsageError:
    this machine's mounts looked up among another tree's disks name a wrong disk or
    none. ``params`` (a command's ``ctx.params``) is changed in place."""
    from click.core import ParameterSource

    from numa_device_plugin.topology.selectors import PATH_KINDS

    root = params.get("sysfs_root")
    if "mount_table" not in params or root is None or Path(root).resolve() == Path("/sys"):
        return
    if ctx.get_parameter_source("mount_table") not in (None, ParameterSource.DEFAULT):
        return
    own = Path(root).parent / "proc" / "1" / "mountinfo"
    if own.is_file():
        params["mount_table"] = own
        return
    paths = [n.name for n in params.get("near") or () if any(
        s.kind in PATH_KINDS for s in n.selectors)]  # fmt: skip
    if paths:
        raise click.UsageError(
            f"--sysfs-root {root} is not this machine's /sys, but the mount table is "
            f"({params['mount_table']}): {', '.join(paths)} would look a path up among "
            f"this machine's mounts. Give that tree's table with --mount-table (or put it "
            f"at {own})",
            ctx,
        )
