"""``python -m numa_device_plugin`` runs the command line."""

import sys

from numa_device_plugin.cli import main

sys.exit(main())
