"""The ``numa-device-plugin`` command line: ``serve``, ``discover``, ``demo``, ``status``
and ``health``, one module each; the options they share are in :mod:`.options`.

Every option can also be set by an environment variable (``--help`` lists them); a flag
on the command line wins. A bad value, from either, exits 2 with the command's usage.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from numa_device_plugin import __version__, sysfs
from numa_device_plugin.cli import demo, discover, health, serve, status


@click.group(
    "numa-device-plugin",
    help="Kubernetes device plugin advertising one extended resource per NUMA node.",
    context_settings={"max_content_width": 100},
)
@click.version_option(__version__, prog_name="numa-device-plugin", message="%(prog)s %(version)s")
def cli() -> None:
    """The command group; each command is a module of this package."""


for _module in (serve, discover, demo, status, health):
    cli.add_command(_module.command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``numa-device-plugin``: the command's exit status; 2 for bad usage
    (usage and the error on stderr); 1 when sysfs is malformed (the message names the
    file and its content) or a folder cannot be used (OSError)."""
    try:
        result = cli.main(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name="numa-device-plugin",
            standalone_mode=False,
        )
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        return 1
    except (sysfs.SysfsError, OSError) as exc:
        # SysfsError: discovery failed (the message names the file and content);
        # OSError: e.g. the device-plugin folder cannot be created or watched.
        print(f"numa-device-plugin: {exc}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0
