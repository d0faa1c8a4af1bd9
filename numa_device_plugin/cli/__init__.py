"""The ``numa-device-plugin`` command line: ``serve``, ``discover``, ``demo``, ``status``,
``health``, ``top``, ``devices``, ``check`` and ``fake-host``, one module each; the
options they share are in :mod:`.options`.

A command's module is imported only when that command runs (or ``--help`` lists it), so
``serve`` never loads the kubelet stand-in (``demo``), the status report or anything
else it does not use.

Every option can also be set by an environment variable (``--help`` lists them); a flag
on the command line wins. A bad value, from either, exits 2 with the command's usage.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

from numa_device_plugin import __version__
from numa_device_plugin.ops import signals
from numa_device_plugin.topology import sysfs

# Command name -> the module holding it (as ``command``), in ``--help`` order.
COMMANDS = {
    "serve": "numa_device_plugin.cli.serve",
    "discover": "numa_device_plugin.cli.discover",
    "demo": "numa_device_plugin.cli.demo",
    "status": "numa_device_plugin.cli.status",
    "health": "numa_device_plugin.cli.health",
    "top": "numa_device_plugin.cli.top",
    "devices": "numa_device_plugin.cli.devices",
    "check": "numa_device_plugin.cli.check",
    "fake-host": "numa_device_plugin.cli.fakehost",
}


class LazyGroup(click.Group):
    """A group whose commands are imported from :data:`COMMANDS` when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        if cmd_name != "serve":
            signals.release()  # only serve takes over the signals caught early
        command: click.Command = importlib.import_module(module).command
        return command


@click.group(
    "numa-device-plugin",
    cls=LazyGroup,
    help="Kubernetes device plugin advertising one extended resource per NUMA node.",
    context_settings={"max_content_width": 100},
)
@click.version_option(__version__, prog_name="numa-device-plugin", message="%(prog)s %(version)s")
def cli() -> None:
    """The command group; each command is a module of this package."""


# The program's name in usage lines and messages: ``kubectl numa`` when kubectl runs the
# kubectl plugin (:func:`main`'s ``prog``).
PROG = "numa-device-plugin"


def main(argv: Sequence[str] | None = None, prog: str = "numa-device-plugin") -> int:
    """Entry point of ``numa-device-plugin`` (``prog``: the name usage lines and
    messages give it, ``kubectl numa`` under kubectl): the command's exit status; 2 for
    bad usage (usage and the error on stderr); 1 when sysfs is malformed (the message
    names the file and its content) or a folder cannot be used (OSError)."""
    global PROG
    PROG = prog
    try:
        result = cli.main(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name=prog,
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
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0
