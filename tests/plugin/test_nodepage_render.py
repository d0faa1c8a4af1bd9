"""The node page as drawn (``nodepage/render.py``) and ``/debug/state``: each figure
where it belongs, text from the kubelet, sysfs and configuration files escaped, and
every box's parts kept inside it. Each test kills a one-line mutant a mutation run
left alive (named in its docstring)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.plugin.reports.nodepage import (
    RESERVED,
    SHARED,
    CpuCell,
    MemoryBar,
    NodePage,
    NumaBox,
    ResourceRow,
    build_page,
    render_page,
)
from numa_device_plugin.plugin.reports.nodepage.render import CELL, NOTE_CHARS
from numa_device_plugin.plugin.reports.snapshot import debug_document
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan
from tests.plugin.test_nodepage import R0, R1, VIEW, GiB, state

SVG = "{http://www.w3.org/2000/svg}"


def page_of(*boxes: NumaBox, **changes: object) -> NodePage:
    values: dict[str, object] = {
        "node": "n1", "taken_at": 0.0, "boxes": boxes, "ids": (), "distances": (),
        "pod_resources": "read", "problems": (), "configuration": "",
    }  # fmt: skip
    values.update(changes)
    return NodePage(**values)  # type: ignore[arg-type]


def box_of(node_id: int = 0, cpus: int = 4, **changes: object) -> NumaBox:
    values: dict[str, object] = {
        "id": node_id, "advertised": True, "reason": None,
        "cpus": tuple(CpuCell(c, SHARED) for c in range(cpus)), "memory": (),
        "resources": (), "holders": {},
    }  # fmt: skip
    values.update(changes)
    return NumaBox(**values)  # type: ignore[arg-type]


def svgs(page: NodePage) -> list[ET.Element]:
    body = render_page(page).decode()
    return [ET.fromstring(s) for s in re.findall(r"<svg class=\"numa-node\".*?</svg>", body)]


def test_problems_and_the_configuration_line_are_escaped() -> None:
    """Mutant: problems and the configuration line unescaped (they echo config-file
    values and the lock holder's text)."""
    page = page_of(
        box_of(),
        problems=("<script>alert(1)</script>",),
        configuration="big: label <b>x</b> & more",
    )
    body = render_page(page).decode()
    assert "<script>" not in body
    assert "<li>&lt;script&gt;alert(1)&lt;/script&gt;</li>" in body
    assert "configuration big: label &lt;b&gt;x&lt;/b&gt; &amp; more" in body


def test_the_memory_bars_start_below_the_last_row_of_cpus() -> None:
    """Mutant: CPU rows rounded down (17 CPUs in one row of 16): the memory bars drew
    over the 17th CPU."""
    bar = MemoryBar("memory", GiB, 0, 0, "sysfs")
    (svg,) = svgs(page_of(box_of(cpus=17, memory=(bar,))))
    cpu_bottom = max(float(r.get("y") or 0) for r in svg.iter(f"{SVG}rect")
                     if "cpu " in (r.get("class") or "")) + CELL - 4  # fmt: skip
    bar_top = min(float(r.get("y") or 0) for r in svg.iter(f"{SVG}rect")
                  if r.get("class") == "bar-free")  # fmt: skip
    assert bar_top > cpu_bottom


def test_a_long_note_is_cut_to_the_box_and_whole_on_hover() -> None:
    """Mutant: notes over 72 characters not cut."""
    reason = "all its CPUs are offline " + "and more " * 20
    (svg,) = svgs(page_of(box_of(advertised=False, reason=reason)))
    (note,) = [t for t in svg.iter(f"{SVG}text") if t.get("class") == "note"]
    shown = "".join(note.itertext()).removeprefix(f"not advertised: {reason}")
    assert len(shown) == NOTE_CHARS
    assert shown.endswith("\u2026")
    assert note.find(f"{SVG}title") is not None


def test_an_over_assigned_memory_bar_stays_inside_its_box() -> None:
    """Mutant: the bars scaled by the allocatable only, overflowing when ours + others
    is larger."""
    bar = MemoryBar("memory", GiB, GiB, GiB, "memory manager")
    (svg,) = svgs(page_of(box_of(memory=(bar,))))
    width = float(svg.get("width") or 0)
    for rect in svg.iter(f"{SVG}rect"):
        if rect.get("class") in ("bar-ours", "bar-others"):
            assert float(rect.get("x") or 0) + float(rect.get("width") or 0) <= width - 10


def test_a_resource_not_registered_says_no() -> None:
    """Mutant: "registered" always yes."""
    rows = (ResourceRow(R0, 0, 4, 4, 0, False), ResourceRow(R1, 1, 4, 4, 0, True))
    body = render_page(page_of(box_of(0, resources=rows[:1]), box_of(1, resources=rows[1:])))
    text = body.decode()
    assert re.search(rf'data-resource="{R0}">.*?<td>no</td></tr>', text)
    assert re.search(rf'data-resource="{R1}">.*?<td>yes</td></tr>', text)


def test_an_unknown_distance_shows_as_a_question_mark() -> None:
    """Mutant: "None" instead of "?"."""
    body = render_page(page_of(box_of(0), box_of(1), ids=(0, 1),
                               distances=((10, None), (21, 10)))).decode()  # fmt: skip
    assert "<td>?</td>" in body
    assert "None" not in body


@pytest.mark.parametrize(
    ("size", "shown"), [(GiB, "1.0 GiB"), (512 << 20, "512.0 MiB"), (3 << 10, "3.0 KiB"),
                        (100, "100 B")],
)  # fmt: skip
def test_sizes_are_shown_in_the_largest_unit(size: int, shown: str) -> None:
    """Mutant: 1 GiB shown as 1024.0 MiB."""
    bar = MemoryBar("memory", size, 0, 0, "sysfs")
    body = render_page(page_of(box_of(memory=(bar,)))).decode()
    assert f"memory: {shown} in sysfs" in body


def test_with_the_cpu_manager_none_no_cpu_is_drawn_reserved() -> None:
    """Mutant: a kubelet whose CPU manager is ``none`` (no allocatable CPUs) showed
    every CPU reserved; they are the shared pool (only --reserved-cpus is reserved)."""
    none = KubeletView(allocatable_cpus=frozenset())
    page = build_page(state(none), node="n1")
    states = {c.cpu: c.state for box in page.boxes for c in box.cpus}
    assert states[1] == RESERVED  # --reserved-cpus
    assert {states[c] for c in (0, 2, 3, 4, 5, 6)} == {SHARED}


def test_no_bar_for_a_hugepage_pool_of_zero_pages() -> None:
    """Mutant: bars drawn for hugepage pools of 0 pages."""
    node = NumaNode(0, frozenset({0}), GiB, None, frozenset({0}),
                    hugepages=((2 << 20, 0), (1 << 30, 2)))  # fmt: skip
    page = build_page(state(None, plans=(NodePlan(node, True),), served={}), node="n1")
    assert [bar.memory_type for bar in page.boxes[0].memory] == ["memory", "hugepages-1Gi"]


def test_each_box_lists_only_the_resources_of_its_numa_node() -> None:
    """Mutant: every resource in every NUMA node's box."""
    page = build_page(state(VIEW), node="n1")
    assert [[r.name for r in box.resources] for box in page.boxes] == [[R0], [R1]]


def test_the_refresh_interval_is_the_one_asked_for() -> None:
    """Only the browser test checked it."""
    body = render_page(page_of(box_of()), refresh=7).decode()
    assert '<meta http-equiv="refresh" content="7">' in body


def test_debug_state_says_registered_as_it_is_and_the_locks_problem() -> None:
    """Mutants: "registered" always true; the lock's problem hidden."""
    from dataclasses import replace

    base = state(VIEW, lock="another instance (pid=7 host=b) holds the lock; waiting")
    served = {name: replace(s, registered=name == R1) for name, s in base.served.items()}
    document = debug_document(replace(base, served=served))
    assert document["lock"] == "another instance (pid=7 host=b) holds the lock; waiting"
    assert {n: r["registered"] for n, r in document["resources"].items()} == {R0: False, R1: True}
