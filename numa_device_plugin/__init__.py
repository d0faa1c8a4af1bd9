"""numa-device-plugin: a kubelet device plugin advertising one extended resource per NUMA node."""

import os

# grpc core logs routine connection events (GOAWAY on every kubelet restart) at
# INFO; keep the plugin's stderr to its own structured logs unless asked.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.2.1"
