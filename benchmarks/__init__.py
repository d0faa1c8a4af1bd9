"""The benchmarks (``make bench``, ``bench-peer``, ``bench-fleet``, ``soak``, ``attack``).

grpc core logs routine connection events (a GOAWAY at every plugin stopped) at INFO;
as the plugin does, keep them out of the figures' output unless asked.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
