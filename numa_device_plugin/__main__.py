"""``python -m numa_device_plugin`` and the ``numa-device-plugin`` command: stop signals
are caught first (:mod:`numa_device_plugin.ops.signals`), then the command line runs."""

from __future__ import annotations

import sys


def main() -> int:
    """Catch SIGTERM and SIGINT, then run the command line; its exit status."""
    from numa_device_plugin.ops import signals

    signals.catch_early()
    from numa_device_plugin.cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
