"""``numa-device-plugin health``: ask a running plugin's ``/readyz`` (or ``/healthz``),
for exec probes and operators."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from typing import Any

import click

from numa_device_plugin.cli import options
from numa_device_plugin.ops.logs import configure_logging


@click.command(
    "health",
    help="Ask a running plugin's /readyz (or /healthz); exit 0 when it answers 200, else 1.",
)
@options.apply(options.probe_address, options.check, options.log_level)
def command(**params: Any) -> int:
    """GET the probe with a 3 s timeout: 0 on 200 (body on stdout), 1 otherwise (stderr)."""
    from numa_device_plugin.ops.probes import parse_address

    configure_logging(params["log_level"], "text")
    host, port = parse_address(params["address"])
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"http://{host}:{port}/{params['check']}"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            print(response.read().decode().strip())
            return 0
    except urllib.error.HTTPError as exc:
        print(exc.read().decode().strip() or f"{url}: HTTP {exc.code}", file=sys.stderr)
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
    return 1
