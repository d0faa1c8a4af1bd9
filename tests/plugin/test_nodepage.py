"""The node page (``/``) and ``/debug/state``: what each CPU is, the memory bars, the
resources, escaping of hostile names, and the page in a real browser against
``demo --keep``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

from numa_device_plugin.kubelet.view import Holder, KubeletView
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.resources import CPUS, UNHEALTHY, Device, Resource
from numa_device_plugin.plugin.reports.nodepage import (
    MAX_BOXES,
    OFFLINE,
    OTHER,
    OURS,
    RESERVED,
    SHARED,
    UNKNOWN,
    build_page,
    render_page,
)
from numa_device_plugin.plugin.reports.snapshot import PluginState, Served, debug_document
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import DeviceTree, SysfsTree
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan
from tests.conftest import missing, readme_command

GiB = 1 << 30
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars")
R0, R1 = "numa-align/numa-0", "numa-align/numa-1"
NODES = (
    NumaNode(0, frozenset({0, 1, 2, 3}), 4 * GiB, {0: 10, 1: 21}, frozenset({0, 1, 2, 3})),
    NumaNode(
        1,
        frozenset({4, 5, 6}),
        4 * GiB,
        {0: 21, 1: 10},
        frozenset({4, 5, 6, 7}),
        hugepages=((2 << 20, 512),),
    ),
)
PLANS = tuple(NodePlan(node, True) for node in NODES)


def served(name: str, node: int, cpus: list[int], unhealthy: int = 0) -> Served:
    devices = tuple(
        Device(f"numa{node}-cpu{c:04d}", node, c, UNHEALTHY if i < unhealthy else "Healthy")
        for i, c in enumerate(cpus)
    )
    return Served(Resource(name, node, devices), devices, True, 1, True)


def state(view: KubeletView | None, **changes: object) -> PluginState:
    values: dict[str, object] = {
        "taken_at": 1000.0,
        "config": Config(capacity=CPUS, reserved_cpus=frozenset({1})),
        "plans": PLANS,
        "served": {R0: served(R0, 0, [0, 2, 3], unhealthy=1), R1: served(R1, 1, [4, 5, 6])},
        "view": view,
        "pod_resources_up": view is not None,
        "pod_resources_read_at": 997.0 if view is not None else None,
        "lock": "held by this instance",
    }
    values.update(changes)
    return PluginState(**values)  # type: ignore[arg-type]


VIEW = KubeletView(
    allocatable_cpus=frozenset({0, 2, 3, 4, 5}),  # 1 is --reserved-cpus, 6 kubelet-reserved
    holders=(
        Holder(
            "shop", "db-0", "db", frozenset({0}), {R0: ("numa0-cpu0000",)}, {(0, "memory"): GiB}
        ),
        Holder("gpu", "train", "main", frozenset({4}), {"nvidia.com/gpu": ("GPU-1",)}),
    ),
    others=(Holder("ops", "cache", "redis", frozenset({3})),),
    foreign_cpus=frozenset({3}),
    memory={0: {"memory": 4 * GiB}, 1: {"memory": 4 * GiB, "hugepages-2Mi": GiB}},
    assigned_memory={0: {"memory": 3 * GiB}},
)


def cells(view: KubeletView | None) -> dict[int, tuple[str, str | None]]:
    page = build_page(state(view), node="n1")
    return {c.cpu: (c.state, c.holder) for box in page.boxes for c in box.cpus}


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        (0, (OURS, "shop/db-0/db")),  # holds numa-align/numa-0
        (1, (RESERVED, None)),  # --reserved-cpus
        (2, (SHARED, None)),  # allocatable, nobody's: the shared pool
        (3, (OTHER, "ops/cache/redis")),  # exclusive, no device at all
        (4, (OTHER, "gpu/train/main")),  # exclusive, another plugin's device
        (5, (SHARED, None)),
        (6, (RESERVED, None)),  # online, not allocatable: the kubelet keeps it
        (7, (OFFLINE, None)),  # listed for node 1, not online
    ],
)
def test_each_cpu_is_what_the_kubelet_and_sysfs_say(
    cpu: int, expected: tuple[str, str | None]
) -> None:
    assert cells(VIEW)[cpu] == expected


def test_without_a_pod_resources_read_nobodys_cpus_are_known() -> None:
    got = cells(None)
    assert got[1] == (RESERVED, None), "--reserved-cpus is known without the kubelet"
    assert got[7] == (OFFLINE, None)
    assert {got[c][0] for c in (0, 2, 3, 4, 5, 6)} == {UNKNOWN}
    page = build_page(state(None), node="n1")
    assert "cannot be read: nobody's CPUs are known" in page.pod_resources
    page = build_page(state(None, pod_resources_up=None), node="n1")
    assert "has not been read yet" in page.pod_resources


@pytest.mark.parametrize(
    ("on_change", "expected"),
    [
        (False, "the kubelet's pod resources API, read 3 s ago"),
        (True, "the kubelet's pod resources API, read 3 s ago (and again when a "
               "Guaranteed pod's cgroup comes or goes)"),
    ],
)  # fmt: skip
def test_the_page_says_when_the_pod_resources_api_is_read(on_change: bool, expected: str) -> None:
    """With the kubepods watch live a read is a minute old at most and still current."""
    page = build_page(state(VIEW, pod_resources_on_change=on_change), node="n1")
    assert page.pod_resources == expected


def test_memory_bars_split_ours_from_others_under_the_memory_manager() -> None:
    page = build_page(state(VIEW), node="n1")
    node0 = {bar.memory_type: bar for bar in page.boxes[0].memory}
    assert node0["memory"].allocatable == 4 * GiB
    assert (node0["memory"].ours, node0["memory"].others) == (GiB, 2 * GiB)
    assert node0["memory"].free == GiB
    node1 = [bar.memory_type for bar in page.boxes[1].memory]
    assert node1 == ["memory", "hugepages-2Mi"], "memory first, then hugepages by name"


def test_memory_bars_fall_back_to_sysfs_without_the_memory_manager() -> None:
    view = KubeletView(allocatable_cpus=VIEW.allocatable_cpus)
    page = build_page(state(view), node="n1")
    node1 = {bar.memory_type: bar for bar in page.boxes[1].memory}
    assert node1["memory"].source == "sysfs"
    assert node1["memory"].allocatable == 4 * GiB
    assert node1["hugepages-2Mi"].allocatable == 512 * (2 << 20)
    assert (node1["memory"].ours, node1["memory"].others) == (0, 0)


def test_resources_rows_count_healthy_and_held_devices() -> None:
    page = build_page(state(VIEW), node="n1")
    row = page.boxes[0].resources[0]
    assert (row.name, row.devices, row.healthy, row.held, row.registered) == (R0, 3, 2, 1, True)


def test_the_distances_come_from_sysfs_and_unknown_ones_show_as_such() -> None:
    plans = (*PLANS, NodePlan(NumaNode(2, frozenset(), GiB), False, "no CPUs"))
    page = build_page(state(VIEW, plans=plans), node="n1")
    assert page.distances == ((10, 21, None), (21, 10, None), (None, None, None))
    body = render_page(page).decode()
    assert ">not advertised: no CPUs<" in body


class _Collector(HTMLParser):
    """Every start tag with its attributes, and whether any script appeared."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parsed(body: bytes) -> _Collector:
    collector = _Collector()
    collector.feed(body.decode())
    return collector


def test_the_page_has_a_group_per_numa_node_and_each_cpu_once() -> None:
    body = render_page(build_page(state(VIEW), node="n1"))
    tags = parsed(body).tags
    boxes = [a["data-numa-node"] for t, a in tags if a.get("class") == "numa-node"]
    assert boxes == ["0", "1"]
    cpus = [int(a["data-cpu"] or "") for t, a in tags if a.get("class") == "cpu-cell"]
    assert sorted(cpus) == list(range(8)), "each CPU exactly once"
    held = {a["data-cpu"]: a.get("data-holder") for t, a in tags if a.get("class") == "cpu-cell"}
    assert held["0"] == "shop/db-0/db"
    assert held["2"] is None
    assert not any(t == "script" for t, _ in tags), "no script: the page is drawn by the server"
    assert b'http-equiv="refresh"' in body


def test_each_numa_node_svg_is_well_formed_xml() -> None:
    body = render_page(build_page(state(VIEW), node="n1")).decode()
    svgs = [body[i : body.index("</svg>", i) + 6] for i in _starts(body, '<svg class="numa-node"')]
    assert len(svgs) == 2
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"


def _starts(text: str, needle: str) -> Iterator[int]:
    at = text.find(needle)
    while at != -1:
        yield at
        at = text.find(needle, at + 1)


def test_hostile_names_from_the_kubelet_are_escaped() -> None:
    evil = '"><script>alert(1)</script>'
    view = KubeletView(
        allocatable_cpus=frozenset({0, 2, 3}),
        holders=(Holder(evil, evil, evil, frozenset({0}), {R0: (evil,)}),),
    )
    body = render_page(build_page(state(view), node=evil))
    assert b"<script>" not in body
    assert not any(t == "script" for t, _ in parsed(body).tags)
    assert body.count(b"&lt;script&gt;") >= 3


def test_debug_state_says_what_is_served_and_what_the_kubelet_said() -> None:
    document = debug_document(state(VIEW, problems=("numa-align/numa-1: not registered",)))
    json.dumps(document)  # JSON-ready
    assert document["ready"] is False
    assert document["config"]["capacity"] == "cpus"
    assert document["config"]["reserved_cpus"] == "1"
    assert document["resources"][R0] == {
        "numa_node": 0,
        "numa_nodes": [0],
        "near": None,
        "lost": None,
        "memory_type": None,
        "devices": 3,
        "healthy": 2,
        "registered": True,
        "streams": 1,
        "kubelet_stream": True,
        "exposed": None,
    }
    pod_resources = document["pod_resources"]
    assert pod_resources["age_seconds"] == 3.0
    assert pod_resources["holders"][0]["pod"] == "shop/db-0"
    assert pod_resources["others"] == [{"pod": "ops/cache", "container": "redis", "cpus": "3"}]
    assert [n["id"] for n in document["numa_nodes"]] == [0, 1]


def test_debug_state_lists_a_holders_ids_cut_with_their_count() -> None:
    """Under a flood /debug/state echoed every held id (4.9 MB)."""
    from numa_device_plugin.plugin.reports.snapshot import MAX_LISTED_IDS

    ids = tuple(f"numa0-slot{index:06d}" for index in range(50_000))
    flood = KubeletView(
        allocatable_cpus=frozenset({0}),
        holders=(Holder("x", "flood", "c", frozenset(), {R0: ids, "other/r": ids[:2]}),),
    )
    document = debug_document(state(flood))
    (holder,) = document["pod_resources"]["holders"]
    assert holder["devices"] == {R0: list(ids[:MAX_LISTED_IDS]), "other/r": list(ids[:2])}
    assert holder["device_counts"] == {R0: 50_000, "other/r": 2}
    assert holder["devices_cut"] == [R0]
    assert len(json.dumps(document)) < 10_000


def test_debug_state_without_a_configuration_served() -> None:
    document = debug_document(
        PluginState(
            taken_at=1.0,
            config=None,
            problems=("no configuration served: bad label",),
            configuration={"name": "", "why": "bad label"},
        )
    )
    assert document["config"] is None
    assert document["configuration"] == {"name": "", "why": "bad label"}
    assert document["pod_resources"]["holders"] is None


# -- the page in a browser, against demo --keep -----------------------------------------------


def chromium() -> str:
    """Debian's chromium; skipped without it, a failure under CI (`make chromium`)."""
    found = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None
    )
    if found is None:
        missing("chromium is not installed: `make chromium` installs Debian's package")
    return found


def two_numa_machine(root: Path, devices: bool = False) -> Path:
    """Two NUMA nodes of 4 CPUs (CPU 7 offline), 4 GiB each, 512 2 MiB pages on node 0;
    with ``devices``, an Ethernet NIC on node 0, an NVMe disk (serial S1) and a 3D
    controller on node 1."""
    tree = SysfsTree(root).cpus(8, online="0-6")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-3", distance="10 21", mem_kb=4 << 20, hugepages={2048: 512})
    tree.node(1, "4-7", distance="21 10", mem_kb=4 << 20)
    if devices:
        found = DeviceTree(root)
        found.pci("0000:17:00.0", 0, "0x020000", "0x15b3", "0x1017")
        found.nic("ens1f0", "0000:17:00.0")
        found.pci("0000:b1:00.0", 1, "0x010802")
        found.disk("nvme0n1", "0000:b1:00.0", serial="S1")
        found.pci("0000:ca:00.0", 1, "0x030200", "0x10de", "0x20b5")
    return root


@contextmanager
def demo_keep(root: Path, *flags: str, shows: str) -> Iterator[str]:
    """``demo --keep`` on sysfs ``root`` with ``flags``; its node page's URL once the page
    shows ``shows`` (the stand-in's pods are read every few seconds)."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "numa_device_plugin", "demo", "--keep", "--sysfs-root",
            str(root), "--metrics-address", "127.0.0.1:0", "--log-level", "warning", *flags,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = None
        for line in process.stdout:
            if "the node page: " in line:
                url = line.split("the node page: ", 1)[1].split()[0]
                break
        assert url is not None, "demo --keep printed no node page"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if shows.encode() in answer.read():
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the node page never showed {shows!r}")
        yield url
    finally:
        process.terminate()
        status = process.wait(timeout=30)
    # Outside the finally: an assert there would hide the error that brought it.
    assert status == 0, f"demo --keep exited {status}"


@pytest.fixture
def demo_page(tmp_path: Path) -> Iterator[str]:
    """``demo --keep`` with ``--capacity cpus --memory-unit 256Mi`` on two NUMA nodes;
    yields its node page's URL once the page shows the demo pods. Chromium is looked
    for first: no demo is started for a test that skips."""
    chromium()
    root = two_numa_machine(tmp_path / "sys", devices=True)
    flags = ("--capacity", "cpus", "--memory-unit", "256Mi", "--near", "data-disk=serial:S1")
    with demo_keep(root, *flags, shows="demo/data-disk/app") as url:
        yield url


def screenshot(browser: str, url: str, path: Path, size: str = "1100,800") -> None:
    """A PNG of the page at ``url`` as chromium draws it (no sandbox: tests run as root)."""
    subprocess.run(
        [browser, *BROWSER_FLAGS, f"--window-size={size}", f"--screenshot={path}", url],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000, "a blank page is a few kB"


def test_the_page_in_chromium_shows_each_numa_node_cpu_and_holder(
    demo_page: str, tmp_path: Path
) -> None:
    browser = chromium()
    dom = subprocess.run(
        [browser, *BROWSER_FLAGS, "--dump-dom", demo_page],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    tags = parsed(dom.encode()).tags
    assert [a["data-numa-node"] for _, a in tags if a.get("class") == "numa-node"] == ["0", "1"]
    listed = [a for _, a in tags if a.get("class") == "cpu-cell"]
    assert sorted(int(a["data-cpu"] or "") for a in listed) == list(range(8)), "each CPU once"
    cpus = {a["data-cpu"] or "": a for a in listed}
    assert (cpus["0"]["data-state"], cpus["0"]["data-holder"]) == (OURS, "demo/app-0/app")
    assert (cpus["4"]["data-state"], cpus["4"]["data-holder"]) == (OURS, "demo/app-1/app")
    assert (cpus["3"]["data-state"], cpus["3"]["data-holder"]) == (OTHER, "other/db/db")
    assert (cpus["5"]["data-state"], cpus["5"]["data-holder"]) == (OURS, "demo/data-disk/app")
    assert cpus["7"]["data-state"] == OFFLINE
    assert {cpus[c]["data-state"] for c in ("1", "2", "6")} == {SHARED}
    lines: dict[str | None, list[str | None]] = {}
    box = None
    for _, attrs in tags:
        box = attrs.get("data-numa-node", box)
        if attrs.get("class") == "devices":
            lines.setdefault(box, []).append(attrs["data-kind"])
    assert lines == {"0": ["nics", "pci"], "1": ["disks", "accelerators", "pci"]}
    assert '<tr data-near="numa-align/data-disk">' in dom
    memory = [a for _, a in tags if a.get("class") == "memory"]
    ours = {(m["data-memory-type"], m["data-ours"]) for m in memory}
    assert ("memory", str(256 << 20)) in ours, "each demo pod holds one 256Mi memory device"
    screenshot(browser, demo_page, tmp_path / "node-page.png")


def dom_and_screenshot(browser: str, url: str, name: str, tmp_path: Path) -> str:
    """The page's DOM as chromium builds it, and its picture as ``name`` in SCREENSHOTS
    (``make screenshots`` keeps it for the docs), else in ``tmp_path``."""
    dom = subprocess.run(
        [browser, *BROWSER_FLAGS, "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    folder = Path(os.environ.get("SCREENSHOTS") or tmp_path)
    screenshot(browser, url, folder / name, "1100,1000")
    return dom


def test_the_readme_picture_is_the_readme_commands_page_in_chromium(
    pci_snapshots: Path, tmp_path: Path
) -> None:
    """The README's picture is what its own `demo --keep` command draws on the tour's
    machine: the command is read from the README, so the two stay in step. Each of the
    four NUMA nodes has its box, and both resources that follow a device their row.
    `make screenshots` keeps the picture for the README (SCREENSHOTS: the folder)."""
    browser = chromium()
    command = readme_command(".venv/bin/numa-device-plugin demo --keep --sysfs-root")
    root = pci_snapshots / "fakepcilocalities"
    flags = [str(root) if word == "$tour" else word for word in command[3:]]
    assert flags[0] == "--sysfs-root"
    with demo_keep(root, *flags[2:], shows="demo/data-disk/app") as url:
        dom = dom_and_screenshot(browser, url, "node-page.png", tmp_path)
    tags = parsed(dom.encode()).tags
    assert [a["data-numa-node"] for _, a in tags if a.get("class") == "numa-node"] == [
        "0", "1", "2", "3"
    ]  # fmt: skip
    assert '<tr data-near="numa-align/data-disk">' in dom
    assert '<tr data-near="numa-align/ib">' in dom


def test_the_page_of_a_machine_with_memory_tiers_in_chromium(
    snapshots_root: Path, tmp_path: Path
) -> None:
    """A real snapshot (../shared): sparse NUMA node ids, CPU-less memory nodes (HBM,
    NVM). Each gets its box, the memory-only ones unadvertised with their memory."""
    browser = chromium()
    root = snapshots_root / "fakeheteromemtiers"
    with demo_keep(root, "--memory-unit", "1Gi", shows="demo/app-2/app") as url:
        dom = dom_and_screenshot(browser, url, "node-page-memory-tiers.png", tmp_path)
    tags = parsed(dom.encode()).tags
    boxes = [a["data-numa-node"] for _, a in tags if a.get("class") == "numa-node"]
    assert boxes == ["0", "1", "2", "4", "6", "8", "9"]
    memory_only = [a for _, a in tags if a.get("class") == "memory"]
    assert len(memory_only) >= len(boxes), "every NUMA node, CPU-less ones too, has memory"
    assert "not advertised: no CPU" in dom


def near_state() -> PluginState:
    """Node 1 holds an NVMe disk and a GPU, node 0 a NIC; data-disk follows the disk
    (node 1), md follows a RAID over both nodes, gone matches nothing."""
    from numa_device_plugin.plugin.advertised.discovery import NearPlan
    from numa_device_plugin.plugin.model.near import Near
    from numa_device_plugin.topology.locality import Inventory, Located
    from numa_device_plugin.topology.pci import PciDevice
    from numa_device_plugin.topology.selectors import Selection, parse_selector

    inventory = Inventory(
        pci=(
            PciDevice("0000:00:03.0", 0, 0x020000, 0x8086, 0x1533),
            PciDevice("0000:41:00.0", 1, 0x010802, 0x144D, 0xA808),
            PciDevice("0000:42:00.0", 1, 0x030200, 0x10DE, 0x20B0),
        ),
        block=(Located("nvme0n1", frozenset({1}), ("0000:41:00.0",), disk="nvme0n1"),),
        net=(Located("eno1", frozenset({0}), ("0000:00:03.0",)),),
    )
    disk = Near("data-disk", parse_selector("serial:S1"))
    raid = Near("md", parse_selector("block:md0"))
    gone = Near("gone", parse_selector("serial:<b>x</b>"))
    on_disk = Selection(frozenset({1}), ("nvme0n1",), 1)
    plans = (
        NearPlan(disk, "numa-align/data-disk", on_disk, (1,), None),
        NearPlan(raid, "numa-align/md", Selection(frozenset({0, 1}), ("md0",), 1), (0, 1), None),
        NearPlan(gone, "numa-align/gone", Selection(frozenset()), (), "serial:<b>x</b>: none"),
    )
    devices = tuple(Device(f"numa{n}-cpu{c:04d}", n, c) for n, c in ((0, 2), (1, 5)))
    md = Resource("numa-align/md", 0, devices, near=raid, near_nodes=(0, 1))
    base = state(VIEW)
    served_near = {**base.served, "numa-align/md": Served(md, devices, True, 1, True)}
    return state(VIEW, inventory=inventory, near=plans, served=served_near)


def test_the_page_draws_each_numa_nodes_devices_in_its_box() -> None:
    tags = parsed(render_page(build_page(near_state(), node="n1"))).tags
    lines: dict[str, list[str]] = {}
    box = None
    for _tag, attrs in tags:
        if attrs.get("class") == "numa-node":
            box = attrs["data-numa-node"] or ""
        if attrs.get("class") == "devices" and box is not None:
            lines.setdefault(box, []).append(attrs["data-kind"] or "")
    assert lines == {"0": ["nics", "pci"], "1": ["disks", "accelerators", "pci"]}
    body = render_page(build_page(near_state(), node="n1")).decode()
    assert "disks: nvme0n1" in body
    assert "accelerators: 0000:42:00.0 3D controller" in body


def test_the_page_lists_near_resources_once_with_their_nodes_or_why_not() -> None:
    page = build_page(near_state(), node="n1")
    assert [r.name for r in page.boxes[0].resources] == ["numa-align/md", R0]
    assert [(r.name, r.nodes) for r in page.boxes[1].resources] == [
        ("numa-align/md", "0,1"),
        (R1, "1"),
    ]
    body = render_page(page).decode()
    assert body.count('<tr data-resource="numa-align/md">') == 1
    row = "<td>numa-align/data-disk</td><td>serial:S1</td><td>1</td><td>nvme0n1</td>"
    assert f'<tr data-near="numa-align/data-disk">{row}' in body
    assert "not advertised: serial:&lt;b&gt;x&lt;/b&gt;: none" in body
    assert "<b>x</b>" not in body


def test_debug_state_lists_near_resources_and_each_nodes_devices() -> None:
    document = debug_document(near_state())
    json.dumps(document)
    assert [n["nodes"] for n in document["near"]] == [[1], [0, 1], []]
    assert document["near"][2]["reason"] == "serial:<b>x</b>: none"
    assert document["resources"]["numa-align/md"]["numa_nodes"] == [0, 1]
    assert document["resources"]["numa-align/md"]["near"] == "md=block:md0"
    assert document["numa_nodes"][1]["devices"] == {
        "disks": ["nvme0n1"], "nics": [], "accelerators": ["0000:42:00.0 3D controller"], "pci": 2,
    }  # fmt: skip


def many_nodes_state(count: int, distances: bool) -> PluginState:
    nodes = tuple(
        NumaNode(i, frozenset({i}), GiB, {i: 10} if distances else None, frozenset({i}))
        for i in range(count)
    )
    resources = {
        f"numa-align/numa-{i}": served(f"numa-align/numa-{i}", i, [i]) for i in range(count)
    }
    return state(None, plans=tuple(NodePlan(n, True) for n in nodes), served=resources)


def test_a_page_of_1024_numa_nodes_draws_the_first_64_and_says_what_is_left_out() -> None:
    """``node/online`` 0-65535 once grew one GET / to 3 GB without an answer."""
    page = build_page(many_nodes_state(1024, distances=True), node="n1")
    assert [box.id for box in page.boxes] == list(range(MAX_BOXES))
    assert page.left_out == 1024 - MAX_BOXES
    assert len(page.distances) == MAX_BOXES
    assert all(len(row) == MAX_BOXES for row in page.distances)
    assert [r.name for r in page.boxes[5].resources] == ["numa-align/numa-5"]
    body = render_page(page).decode()
    assert f"... and {1024 - MAX_BOXES} more NUMA nodes, not drawn" in body


def test_without_distances_in_sysfs_the_page_has_no_matrix_of_unknowns() -> None:
    page = build_page(many_nodes_state(4, distances=False), node="n1")
    assert (page.ids, page.distances) == ((), ())
    assert "sysfs gives no distances" in render_page(page).decode()


def test_the_near_table_shows_the_advertised_nodes_and_a_dash_for_none() -> None:
    """Mutants: the selection's NUMA nodes shown instead of the advertised ones; an empty
    cell instead of ``-`` for a resource advertised nowhere."""
    from dataclasses import replace

    base = near_state()
    disk = base.near[0]
    # The disk's selection spans nodes 0 and 1, but only node 1 is advertised.
    partial = replace(disk, selection=replace(disk.selection, nodes=frozenset({0, 1})))
    body = render_page(build_page(replace(base, near=(partial, *base.near[1:])), node="n1"))
    text = body.decode()
    assert "<td>numa-align/data-disk</td><td>serial:S1</td><td>1</td>" in text
    assert "<td>numa-align/gone</td><td>serial:&lt;b&gt;x&lt;/b&gt;</td><td>-</td>" in text


def test_debug_state_shows_the_near_flags_in_its_configuration() -> None:
    """Mutant: /debug/state dropped --near from its configuration."""
    from numa_device_plugin.plugin.model.near import parse_near

    near = (parse_near("data-disk=serial:S1"), parse_near("nic=net:ib0"))
    document = debug_document(state(VIEW, config=Config(capacity=CPUS, near=near)))
    assert document["config"]["near"] == ["data-disk=serial:S1", "nic=net:ib0"]


def discovered_manager(tmp_path: Path, *, disk: bool = False) -> tuple[Config, PluginManager]:
    """A PluginManager (not serving) that has discovered two NUMA nodes of 2 CPUs
    (with ``disk``, an NVMe disk S1/eui.1 on node 1 at 0000:41:00.0), and its Config."""
    tree = SysfsTree(tmp_path / "sys").cpus(4, online="0-3")
    tree.write("node/online", "0-1\n")
    tree.node(0, "0-1")
    tree.node(1, "2-3")
    if disk:
        devices = DeviceTree(tree.root)
        devices.pci("0000:41:00.0", 1, "0x010802")
        devices.disk("nvme0n1", "0000:41:00.0", serial="S1", wwid="eui.1")
    config = Config(sysfs_root=tree.root, socket_dir=tmp_path / "dp", capacity=2)
    manager = PluginManager(config)
    manager.catalog.update(discover(config))
    return config, manager


def test_a_snapshot_says_registered_only_of_the_resources_registered(tmp_path: Path) -> None:
    """Mutant: snapshot.take() reported every resource registered."""
    from numa_device_plugin.plugin.reports.snapshot import take

    config, manager = discovered_manager(tmp_path)
    taken = take(config, manager.catalog, [R1], manager.poller, manager.lock_keeper, ())
    assert {name: served.registered for name, served in taken.served.items()} == {
        R0: False, R1: True,
    }  # fmt: skip
    for servicer in manager.catalog.servicers.values():
        servicer.close()


def test_debug_state_lists_each_disks_ids_from_the_last_discovery(tmp_path: Path) -> None:
    """What `discover` lists per disk (serial, wwid, PCI address...), in /debug/state too,
    so an inventory can be gathered from every plugin pod."""
    from numa_device_plugin.plugin.reports.snapshot import take

    config, manager = discovered_manager(tmp_path, disk=True)
    document = debug_document(
        take(config, manager.catalog, [], manager.poller, manager.lock_keeper, ())
    )
    (disk,) = document["inventory"]["disks"]
    assert (disk["name"], disk["nodes"], disk["serial"], disk["wwid"], disk["pci"]) == (
        "nvme0n1", [1], "S1", "eui.1", ["0000:41:00.0"]
    )  # fmt: skip
    json.dumps(document)
    for servicer in manager.catalog.servicers.values():
        servicer.close()


def test_debug_state_says_which_numa_node_a_resource_over_several_exposes_and_why() -> None:
    from numa_device_plugin.plugin.counts.exposure import Room, choose
    from numa_device_plugin.topology.memory import MemoryPool

    any_devices = served(R0, 0, [0, 2, 3]).devices + served(R1, 1, [4, 5, 6]).devices
    anywhere = Resource("numa-align/any", 0, any_devices, near_nodes=(0, 1), anywhere=True)
    pool = MemoryPool("memory", GiB, 4 * GiB, 4 * GiB)
    memory = Resource("numa-align/any-memory", 0, (), memory=pool, near_nodes=(0, 1),
                      follows="numa-align/any")  # fmt: skip
    exposure = choose("numa-align/any", [Room(0, 1), Room(1, 3)], None)
    document = debug_document(state(VIEW, served={
        "numa-align/any": Served(anywhere, any_devices, True, 1, True),
        "numa-align/any-memory": Served(memory, (), True, 1, True),
    }, exposures={"numa-align/any": exposure}, switches={"numa-align/any": 2}))  # fmt: skip
    json.dumps(document)
    shown = document["resources"]["numa-align/any"]["exposed"]
    assert shown == {
        "node": 1,
        "why": "most room: node 1 has 3 free CPUs (node 0: 1 free CPU)",
        "rooms": {"0": {"cpus": 1, "memory": 0}, "1": {"cpus": 3, "memory": 0}},
        "switches": 2,
        "follows": None,
    }
    followed = document["resources"]["numa-align/any-memory"]["exposed"]
    assert (followed["node"], followed["follows"]) == (1, "numa-align/any")


def test_the_node_page_says_which_numa_node_a_resource_over_several_offers() -> None:
    from numa_device_plugin.plugin.counts.exposure import Room, choose
    from numa_device_plugin.plugin.reports.nodepage import build_page, render_page

    any_devices = served(R0, 0, [0, 2, 3]).devices + served(R1, 1, [4, 5, 6]).devices
    anywhere = Resource("numa-align/any", 0, any_devices, near_nodes=(0, 1), anywhere=True)
    exposure = choose("numa-align/any", [Room(0, 1), Room(1, 3)], None)
    both = {R0: served(R0, 0, [0, 2, 3]),
            "numa-align/any": Served(anywhere, any_devices, True, 1, True)}  # fmt: skip
    page = build_page(state(VIEW, served=both, exposures={"numa-align/any": exposure}), node="n1")
    body = render_page(page).decode()
    row = body[body.index('<tr data-resource="numa-align/any">') :].split("</tr>")[0]
    assert (
        '<td>0,1; <span title="most room: node 1 has 3 free CPUs (node 0: 1 free CPU)">'
        "offers 1</span></td>" in row
    )
    own = body[body.index(f'<tr data-resource="{R0}">') :].split("</tr>")[0]
    assert "offers" not in own
