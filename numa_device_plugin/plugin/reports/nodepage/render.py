"""The node page as one HTML document with inline SVG and CSS, and no script.

:func:`render_page` writes a :class:`~numa_device_plugin.plugin.reports.nodepage.model.NodePage`:
one SVG per NUMA node (a cell per CPU coloured by what it is, with its holder; a bar
per memory type; its disks, NICs and accelerators), a table of the resources, one of
the resources that follow a device, the distance matrix. The page reloads
itself every :data:`REFRESH` seconds (``<meta refresh>``). Every name from the
kubelet or sysfs is escaped.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable

from numa_device_plugin.plugin.reports.nodepage.model import (
    CPU_STATES,
    OFFLINE,
    OTHER,
    OURS,
    RESERVED,
    SHARED,
    UNKNOWN,
    NodePage,
    NumaBox,
)

# Seconds between the page's own reloads.
REFRESH = 10
_COLOURS = {
    OURS: "#2f6fdb",
    OTHER: "#e0892b",
    SHARED: "#d9e6d2",
    RESERVED: "#9a9a9a",
    OFFLINE: "#ffffff",
    UNKNOWN: "#eeeeee",
}

CELL = 30  # px per CPU cell, gap included
COLUMNS = 16  # CPU cells per row
BOX_WIDTH = COLUMNS * CELL + 20
BAR_HEIGHT = 16
LINE = 16
NOTE_CHARS = 72  # characters of a NUMA node's note that fit in its box (12 px)


def render_page(page: NodePage, refresh: int = REFRESH) -> bytes:
    """The HTML document of ``page`` (UTF-8). Every name from the kubelet or sysfs
    is escaped."""
    e = html.escape
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(page.taken_at))
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{int(refresh)}">',
        f"<title>NUMA nodes of {e(page.node)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>NUMA nodes of {e(page.node)}</h1>",
        f'<p class="meta">{e(taken)} &middot; {e(page.pod_resources)}',
    ]
    if page.configuration:
        parts.append(f" &middot; configuration {e(page.configuration)}")
    parts.append("</p>")
    if page.problems:
        parts.append('<ul class="problems">')
        parts.extend(f"<li>{e(problem)}</li>" for problem in page.problems)
        parts.append("</ul>")
    parts.append(_legend())
    parts.append('<div class="boxes">')
    parts.extend(_box_svg(box) for box in page.boxes)
    parts.append("</div>")
    if page.left_out:
        parts.append(
            f'<p class="meta">... and {page.left_out} more NUMA nodes, not drawn: the page '
            f"draws the first {len(page.boxes)} (<code>/debug/state</code> lists every one)</p>"
        )
    parts.append(_resource_table(page))
    parts.append(_near_table(page))
    parts.append(_distance_table(page))
    parts.append("</body></html>\n")
    return "".join(parts).encode()


def _legend() -> str:
    items = "".join(
        f'<span class="key"><svg width="14" height="14"><rect class="cpu cpu-{state}" '
        f'width="13" height="13" x="0.5" y="0.5"/></svg> {state}</span>'
        for state in CPU_STATES
    )
    return f'<p class="legend">{items}</p>'


def _box_svg(box: NumaBox) -> str:
    e = html.escape
    rows = -(-len(box.cpus) // COLUMNS)  # none for a CPU-less (memory-only) NUMA node
    note = None
    if not box.advertised:
        note = f"not advertised: {box.reason}" if box.reason else "not advertised"
    cpu_top = 34 + (LINE if note else 0)
    memory_top = cpu_top + rows * CELL + 10
    devices_top = memory_top + len(box.memory) * (BAR_HEIGHT + LINE + 6) + 6
    device_lines = _device_lines(box)
    holders_top = devices_top + len(device_lines) * LINE
    height = holders_top + len(box.holders) * LINE + 10
    out = [
        f'<svg class="numa-node" data-numa-node="{box.id}" width="{BOX_WIDTH}" '
        f'height="{height}" viewBox="0 0 {BOX_WIDTH} {height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">',
        f'<rect class="frame" x="1" y="1" width="{BOX_WIDTH - 2}" height="{height - 2}" rx="6"/>',
        f'<text class="title" x="10" y="22">NUMA node {box.id}</text>',
    ]
    if note:  # one line, cut to the box; the whole of it on hover
        shown = note if len(note) <= NOTE_CHARS else note[: NOTE_CHARS - 1] + "\u2026"
        out.append(
            f'<text class="note" x="10" y="{22 + LINE}"><title>{e(note)}</title>{e(shown)}</text>'
        )
    for i, cell in enumerate(box.cpus):
        x = 10 + (i % COLUMNS) * CELL
        y = cpu_top + (i // COLUMNS) * CELL
        holder = f' data-holder="{e(cell.holder)}"' if cell.holder else ""
        tip = f"CPU {cell.cpu}: {cell.state}" + (f", {cell.holder}" if cell.holder else "")
        out.append(
            f'<g class="cpu-cell" data-cpu="{cell.cpu}" data-state="{cell.state}"{holder}>'
            f"<title>{e(tip)}</title>"
            f'<rect class="cpu cpu-{cell.state}" x="{x}" y="{y}" width="{CELL - 4}" '
            f'height="{CELL - 4}" rx="3"/>'
            f'<text class="cpu-id" x="{x + (CELL - 4) / 2}" y="{y + 17}">{cell.cpu}</text></g>'
        )
    width = BOX_WIDTH - 20
    for i, bar in enumerate(box.memory):
        y = memory_top + i * (BAR_HEIGHT + LINE + 6)
        total = max(bar.allocatable, bar.ours + bar.others, 1)
        ours_w = width * bar.ours / total
        others_w = width * bar.others / total
        label = (
            f"{bar.memory_type}: {_size(bar.allocatable)} "
            f"{'allocatable' if bar.source == 'memory manager' else 'in sysfs'}"
            f", ours {_size(bar.ours)}, others {_size(bar.others)}, free {_size(bar.free)}"
        )
        out.append(
            f'<g class="memory" data-memory-type="{e(bar.memory_type)}" '
            f'data-allocatable="{bar.allocatable}" data-ours="{bar.ours}" '
            f'data-others="{bar.others}" data-source="{e(bar.source)}">'
            f'<text class="label" x="10" y="{y + 12}">{e(label)}</text>'
            f'<rect class="bar-free" x="10" y="{y + LINE}" width="{width}" height="{BAR_HEIGHT}"/>'
            f'<rect class="bar-ours" x="10" y="{y + LINE}" width="{ours_w:.1f}" '
            f'height="{BAR_HEIGHT}"/>'
            f'<rect class="bar-others" x="{10 + ours_w:.1f}" y="{y + LINE}" '
            f'width="{others_w:.1f}" height="{BAR_HEIGHT}"/></g>'
        )
    for i, (kind, line) in enumerate(device_lines):
        y = devices_top + (i + 1) * LINE - 4
        shown = line if len(line) <= NOTE_CHARS else line[: NOTE_CHARS - 1] + "\u2026"
        out.append(
            f'<text class="devices" data-kind="{kind}" x="10" y="{y}">'
            f"<title>{e(line)}</title>{e(shown)}</text>"
        )
    for i, (holder, cpus) in enumerate(box.holders.items()):
        y = holders_top + (i + 1) * LINE - 4
        out.append(
            f'<text class="holder" data-holder="{e(holder)}" x="10" y="{y}">'
            f"{e(holder)}: CPUs {e(cpus)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _device_lines(box: NumaBox) -> list[tuple[str, str]]:
    """The box's devices as lstopo lists them under a NUMA node: (kind, one line) for
    disks, NICs and accelerators, and how many PCI devices in all (when any)."""
    found = box.devices
    lines = [
        (kind, f"{label}: {', '.join(names)}")
        for kind, label, names in (
            ("disks", "disks", found.disks),
            ("nics", "NICs", found.nics),
            ("accelerators", "accelerators", found.accelerators),
        )
        if names
    ]
    if found.pci:
        lines.append(("pci", f"{found.pci} PCI device{'s' if found.pci != 1 else ''}"))
    return lines


def _resource_table(page: NodePage) -> str:
    e = html.escape
    seen: set[str] = set()
    rows = []
    for box in page.boxes:
        for r in box.resources:
            if r.name in seen:
                continue  # a resource on several NUMA nodes: one row
            seen.add(r.name)
            where = e(r.nodes or str(r.node_id))
            if r.exposed is not None:  # over several NUMA nodes: one offers its free ones
                where += f'; <span title="{e(r.why or "")}">offers {r.exposed}</span>'
            rows.append(
                f'<tr data-resource="{e(r.name)}"><td>{e(r.name)}</td>'
                f"<td>{where}</td>"
                f"<td>{r.devices}</td><td>{r.healthy}</td><td>{r.held}</td>"
                f"<td>{'yes' if r.registered else 'no'}</td></tr>"
            )
    return (
        '<h2>Resources</h2><table class="resources"><tr><th>resource</th><th>NUMA node</th>'
        "<th>devices</th><th>healthy</th><th>held</th><th>registered</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _near_table(page: NodePage) -> str:
    """The resources that follow a device: selector, NUMA nodes, or why none."""
    if not page.near:
        return ""
    e = html.escape
    rows = "".join(
        f'<tr data-near="{e(n.resource)}"><td>{e(n.resource)}</td><td>{e(n.selector)}</td>'
        f"<td>{e(n.nodes or '-')}</td>"
        f"<td>{e(n.matched if n.reason is None else 'not advertised: ' + n.reason)}</td></tr>"
        for n in page.near
    )
    return (
        '<h2>Resources near devices</h2><table class="near"><tr><th>resource</th>'
        "<th>selector</th><th>NUMA node(s)</th><th>device(s)</th></tr>" + rows + "</table>"
    )


def _distance_table(page: NodePage) -> str:
    if not page.ids:
        return (
            '<h2>Distances</h2><p class="meta">sysfs gives no distances '
            "(no <code>nodeN/distance</code> files).</p>"
        )
    head = "".join(f"<th>{i}</th>" for i in page.ids)
    rows = "".join(
        f"<tr><th>{i}</th>" + "".join(f"<td>{'?' if d is None else d}</td>" for d in row) + "</tr>"
        for i, row in zip(page.ids, page.distances, strict=True)
    )
    return (
        '<h2>Distances</h2><table class="distances"><tr><th></th>'
        f"{head}</tr>{rows}</table>"
        '<p class="meta">The kernel\'s relative distances (sysfs <code>nodeN/distance</code>; '
        "10 is local).</p>"
    )


def _size(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} B"


def _state_css(states: Iterable[str]) -> str:
    """CSS rules of the CPU states (their fill colours)."""
    return "".join(
        f".cpu-{state}{{fill:{_COLOURS[state]};stroke:#555;stroke-width:1}}" for state in states
    )


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:16px;color:#222}"
    ".meta{color:#555}.problems{color:#a00}"
    ".boxes{display:flex;flex-wrap:wrap;gap:12px}"
    ".frame{fill:#fafafa;stroke:#333;stroke-width:1.5}"
    ".title{font-weight:bold;font-size:15px}"
    ".cpu-id{font-size:10px;text-anchor:middle;fill:#111}"
    ".cpu-ours+.cpu-id,.cpu-ours~.cpu-id{fill:#fff}"
    ".label,.holder,.note,.devices{font-size:12px}.note{fill:#a00}.devices{fill:#2a5a2a}"
    ".bar-free{fill:#e8e8e8}.bar-ours{fill:#2f6fdb}.bar-others{fill:#e0892b}"
    ".cpu-offline{stroke-dasharray:3 2}"
    ".key{margin-right:12px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #bbb;padding:2px 8px}"
    + _state_css(CPU_STATES)
)
