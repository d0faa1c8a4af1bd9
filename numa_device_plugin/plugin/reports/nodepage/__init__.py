"""The node page served at ``/`` by the metrics listener: this node's NUMA layout as SVG.

Two pure steps, so the page can be tested without a server and rendered in a worker
thread: :func:`build_page` (:mod:`.model`) turns a
:class:`~numa_device_plugin.plugin.reports.snapshot.PluginState` into a :class:`NodePage`, and
:func:`render_page` (:mod:`.render`) writes it as HTML.
"""

from numa_device_plugin.plugin.reports.nodepage.model import (
    CPU_STATES,
    MAX_BOXES,
    OFFLINE,
    OTHER,
    OURS,
    RESERVED,
    SHARED,
    UNKNOWN,
    CpuCell,
    MemoryBar,
    NodePage,
    NumaBox,
    ResourceRow,
    build_page,
)
from numa_device_plugin.plugin.reports.nodepage.render import REFRESH, render_page

__all__ = [
    "CPU_STATES",
    "MAX_BOXES",
    "OFFLINE",
    "OTHER",
    "OURS",
    "REFRESH",
    "RESERVED",
    "SHARED",
    "UNKNOWN",
    "CpuCell",
    "MemoryBar",
    "NodePage",
    "NumaBox",
    "ResourceRow",
    "build_page",
    "render_page",
]
