"""``numa-device-plugin health``: ask a running plugin's ``/readyz`` (or ``/healthz``),
for exec probes and operators."""

from __future__ import annotations

import sys
from typing import Any

import click

from numa_device_plugin.cli import options
from numa_device_plugin.ops.logs import configure_logging

# The whole probe (connect, request, answer) in seconds, and the bytes of its answer.
DEADLINE = 3.0
MAX_ANSWER = 64 << 10


@click.command(
    "health",
    help="Ask a running plugin's /readyz (or /healthz); exit 0 when it answers 200, else 1.",
)
@options.apply(options.probe_address, options.check, options.log_level)
def command(**params: Any) -> int:
    """GET the probe within :data:`DEADLINE` seconds in all, at most
    :data:`MAX_ANSWER` bytes: 0 on 200 (body on stdout), 1 otherwise (stderr)."""
    from numa_device_plugin.ops.bounded import BoundError
    from numa_device_plugin.ops.httpget import http_get
    from numa_device_plugin.ops.probes import parse_address

    configure_logging(params["log_level"], "text")
    host, port = parse_address(params["address"])
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"http://{host}:{port}/{params['check']}"
    try:
        answer = http_get(
            host, port, f"/{params['check']}", deadline=DEADLINE, limit=MAX_ANSWER,
            name="the plugin's probe listener",
        )  # fmt: skip
    except BoundError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    text = answer.body.decode(errors="replace").strip()
    if answer.status == 200:
        print(text)
        return 0
    print(text or f"{url}: HTTP {answer.status}", file=sys.stderr)
    return 1
