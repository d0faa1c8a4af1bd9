"""What a network namespace's counters show, for a run's diagnosis: each interface's
packets, errors and drops, the TCP counters that grow when connections fail or packets
are lost, the load average, and how long a TCP connect to the API server takes.

Read from the kernel (``/proc/net/dev``, ``/proc/net/snmp``,
``/proc/net/netstat``, ``/proc/loadavg``, ``/proc/net/tcp``) with the standard library
only: the host's sampler (:func:`cluster.NetworkSampler`) and the tests' failure reports
in a guest both use it. Every reader returns what it could read and an ``errors`` entry
for what it could not; none raises.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

STATISTICS = ("rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
# /proc/net/snmp "Tcp:" and /proc/net/netstat "TcpExt:" fields that grow on trouble.
TCP = ("ActiveOpens", "AttemptFails", "EstabResets", "RetransSegs", "InErrs", "OutRsts")
TCP_EXT = ("ListenOverflows", "ListenDrops", "TCPTimeouts", "TCPSynRetrans", "TCPBacklogDrop")
# /proc/net/tcp's state column for SYN_SENT: a connect still waiting for its answer.
SYN_SENT = "02"


def interfaces(path: Path = Path("/proc/net/dev")) -> dict[str, dict[str, int]]:
    """``{interface: {statistic: count}}`` of the reading process's network namespace
    (``/proc/net/dev``; ``/sys/class/net`` would show the namespace that mounted
    sysfs, the host's for the control plane), veth pairs summed as ``veth*`` (one per
    pod)."""
    found: dict[str, dict[str, int]] = {}
    try:
        rows = path.read_text().splitlines()[2:]
    except OSError:
        return found
    for row in rows:
        name, _, numbers = row.partition(":")
        values = numbers.split()
        if len(values) < 16 or not all(v.isdigit() for v in values):
            continue
        name = "veth*" if name.strip().startswith("veth") else name.strip()
        counts = found.setdefault(name, dict.fromkeys(STATISTICS, 0))
        # receive: bytes packets errs drop ...; transmit (from the 9th): the same.
        for statistic, index in zip(STATISTICS, (1, 9, 2, 10, 3, 11), strict=True):
            counts[statistic] += int(values[index])
    return found


def protocol_counters(text: str, prefix: str, wanted: tuple[str, ...]) -> dict[str, int]:
    """The ``wanted`` fields of the ``prefix`` (``Tcp:``) table of a ``/proc/net/snmp``
    style text: a header line of names, then a line of values."""
    lines = [line.split() for line in text.splitlines() if line.startswith(prefix)]
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        table = dict(zip(names[1:], values[1:], strict=False))
        return {name: int(table[name]) for name in wanted if table.get(name, "").isdigit()}
    return {}


def syn_sent(path: Path = Path("/proc/net/tcp")) -> int:
    """Connections in SYN_SENT (a dial waiting for its answer)."""
    try:
        rows = path.read_text().splitlines()[1:]
    except OSError:
        return -1
    return sum(1 for row in rows if row.split()[3:4] == [SYN_SENT])


def connect_seconds(host: str, port: int, timeout: float = 5.0) -> float | str:
    """How long a TCP connect to ``host:port`` took (seconds), or why it failed."""
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return round(time.monotonic() - started, 3)
    except OSError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.1f} s: {exc}"


def snapshot(target: tuple[str, int] | None = None) -> dict[str, Any]:
    """``{"time" (Unix seconds), "load", "interfaces", "tcp", "tcp_ext", "syn_sent",
    "connect" (to ``target``, when given), "errors"}``."""
    found: dict[str, Any] = {"time": round(time.time(), 1), "errors": []}
    try:
        found["load"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError as exc:
        found["errors"].append(str(exc))
    found["interfaces"] = interfaces()
    tables = (("tcp", "/proc/net/snmp", "Tcp:", TCP),
              ("tcp_ext", "/proc/net/netstat", "TcpExt:", TCP_EXT))  # fmt: skip
    for key, path, prefix, wanted in tables:
        try:
            found[key] = protocol_counters(Path(path).read_text(), prefix, wanted)
        except OSError as exc:
            found["errors"].append(str(exc))
    found["syn_sent"] = syn_sent()
    if target is not None:
        found["connect"] = {f"{target[0]}:{target[1]}": connect_seconds(*target)}
    return found
