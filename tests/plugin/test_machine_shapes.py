"""Every machine shape: memory-only NUMA nodes (CXL, HBM) whose devices follow the nearest
NUMA node with CPUs, sockets of several NUMA nodes (AMD NPS4, Intel SNC-3) advertised as
``numa-align/socket-S``, and the real snapshots with such nodes: what discovery says, then
what ``serve`` registers with the kubelet stand-in over real gRPC (the TopologyInfo of
every device) and what Allocate tells the container."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.discovery import Discovery, discover
from numa_device_plugin.plugin.model.near import merge_near, parse_near
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.nearest import nearest_nodes
from tests.standin_helpers import running, wait_all_live
from tests.topology import shapes

P = "numa-align/"


def config(root: Path, folder: Path, *near: str, **overrides: object) -> Config:
    """``--capacity cpus`` on ``root`` with the ``--near`` entries given, an empty
    mount table (the tree's own), ``folder`` the device-plugin folder."""
    table = root.parent / "mountinfo"
    table.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    values: dict[str, object] = {
        "sysfs_root": root,
        "socket_dir": folder,
        "capacity": "cpus",
        "mount_table": table,
        "near": merge_near(parse_near(entry) for entry in near),
        "register_timeout": 2.0,
        "shutdown_grace": 0.5,
    }
    values.update(overrides)
    return Config(**values)  # type: ignore[arg-type]


def spans(found: Discovery) -> dict[str, tuple[int, ...]]:
    """Each resource's NUMA nodes (those of its devices' TopologyInfo)."""
    return {name.removeprefix(P): r.node_ids for name, r in found.resources.items()}


# -- discovery, per shape --------------------------------------------------------------------

SHAPES: dict[str, tuple[Callable[[Path], SysfsTree], tuple[str, ...], dict[str, object]]] = {
    # A CXL expander with no device: never a resource of its own, its nearest CPUs said.
    "cxl": (shapes.cxl_expander, (), {
        "advertised": [0, 1],
        "nearest": {2: ((0,), 24), 3: ((0, 1), 28)},
        "resources": {"numa-0": (0,), "numa-1": (1,), "any": (0, 1)},
        "near": {},
    }),
    # GPUs on memory-only HBM nodes follow their Grace node; all four: both, one exposed.
    "gb200": (shapes.gb200_like, ("gpu0=pci:0008:01:00.0", "gpu3=pci:0019:01:00.0",
                                  "gpus=pci-class:0302", "ib=net:ib0"), {
        "advertised": [0, 1],
        "nearest": {2: ((0,), 80), 3: ((0,), 80), 4: ((1,), 80), 5: ((1,), 80)},
        "resources": {"numa-0": (0,), "numa-1": (1,), "gpu0": (0,), "gpu3": (1,),
                      "gpus": (0, 1), "ib": (1,), "any": (0, 1)},
        "near": {"gpu0": ((0,), ["0008:01:00.0 is on memory-only node 2; nearest CPUs: node 0 "
                                 "at distance 80"]),
                 "gpu3": ((1,), ["0019:01:00.0 is on memory-only node 5; nearest CPUs: node 1 "
                                 "at distance 80"]),
                 "gpus": ((0, 1), 4), "ib": ((1,), [])},
    }),
    # NPS4: a socket resource per socket; the NIC's socket, or its node.
    "nps4": (shapes.nps4, ("nic=net:ens1f0", "nic-socket=net:ens1f0",
                           "nic-socket=scope:socket", "data=serial:NPS4-DATA"), {
        "advertised": list(range(8)),
        "nearest": {},
        "resources": {**{f"numa-{n}": (n,) for n in range(8)}, "nic": (5,),
                      "nic-socket": (4, 5, 6, 7), "data": (2,), "any": tuple(range(8)),
                      "socket-0": (0, 1, 2, 3), "socket-1": (4, 5, 6, 7)},
        "near": {"nic": ((5,), []), "nic-socket": ((4, 5, 6, 7), []), "data": ((2,), [])},
    }),
    "snc3": (shapes.snc3, ("data=serial:SNC-DATA",), {
        "advertised": list(range(6)),
        "nearest": {},
        "resources": {**{f"numa-{n}": (n,) for n in range(6)}, "data": (4,),
                      "any": tuple(range(6)), "socket-0": (0, 1, 2), "socket-1": (3, 4, 5)},
        "near": {"data": ((4,), [])},
    }),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_discovery_of_each_machine_shape(shape: str, tmp_path: Path) -> None:
    build, near, expected = SHAPES[shape]
    tree = build(tmp_path / "sys")
    found = discover(config(tree.root, tmp_path, *near))
    assert [p.node.id for p in found.plans if p.advertised] == expected["advertised"]
    follows = {n: (f.to, f.distance) for n, f in nearest_nodes(found.plans).items()}
    assert follows == expected["nearest"]
    assert spans(found) == expected["resources"]
    for entry in found.near:
        name = entry.resource.removeprefix(P)
        nodes, followed = expected["near"][name]  # type: ignore[index]
        assert (entry.nodes, entry.reason) == (nodes, None)
        if isinstance(followed, int):
            assert len(entry.followed) == followed
        else:
            assert list(entry.followed) == followed
    # Memory-only nodes never get a resource of their own.
    for plan in found.plans:
        assert (f"{P}numa-{plan.node.id}" in found.resources) is plan.advertised


def test_a_tie_follows_every_tied_node_and_the_resource_spans_them(tmp_path: Path) -> None:
    """Node 3 of the CXL shape is as far from node 0 as from node 1: a device on it
    gives a resource over both (one exposed at a time), told on both."""
    from numa_device_plugin.topology.fake import DeviceTree

    tree = shapes.cxl_expander(tmp_path / "sys")
    DeviceTree(tree.root).pci("0000:e1:00.0", 3, pci_class="0x050210")  # a CXL memory device
    found = discover(config(tree.root, tmp_path, "cxl=pci:0000:e1:00.0"))
    (entry,) = found.near
    assert entry.nodes == (0, 1)
    assert entry.followed == (
        "0000:e1:00.0 is on memory-only node 3; nearest CPUs: nodes 0, 1 at distance 28 "
        "(a tie: it follows each, one exposed at a time)",
    )
    assert dict(entry.selection.by_node) == {0: ("0000:e1:00.0",), 1: ("0000:e1:00.0",)}
    assert found.resources[f"{P}cxl"].spans


def test_a_memory_only_node_without_a_distance_row_follows_nothing_and_says_why(
    tmp_path: Path,
) -> None:
    from numa_device_plugin.topology.fake import DeviceTree

    tree = shapes.cxl_expander(tmp_path / "sys")
    (tree.system / "node" / "node2" / "distance").unlink()
    DeviceTree(tree.root).pci("0000:e1:00.0", 2, pci_class="0x050210")
    found = discover(config(tree.root, tmp_path, "cxl=pci:0000:e1:00.0"))
    (entry,) = found.near
    assert entry.nodes == ()
    assert entry.reason == (
        "pci:0000:e1:00.0: 0000:e1:00.0 is on memory-only node 2; its distance row "
        "(node2/distance) is unknown, so no NUMA node with CPUs is known to be near"
    )
    assert f"{P}cxl" not in found.resources


def test_a_socket_scope_where_the_socket_is_unknown_stays_on_the_devices_node(
    tmp_path: Path,
) -> None:
    tree = shapes.nps4(tmp_path / "sys")
    for cpu in range(16, 24):  # nodes 4 and 5: no physical_package_id
        (tree.system / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id").unlink()
    found = discover(config(tree.root, tmp_path, "nic=net:ens1f0", "nic=scope:socket"))
    (entry,) = found.near
    assert entry.nodes == (5,)
    assert entry.sockets == ()
    assert "NUMA node 5 has no single known socket" in entry.followed[0]
    # socket-1 keeps the nodes whose socket is known.
    assert spans(found)["socket-1"] == (6, 7)


def test_socket_resources_need_cpus_mode_and_can_be_turned_off(tmp_path: Path) -> None:
    tree = shapes.nps4(tmp_path / "sys")
    slots = discover(config(tree.root, tmp_path, capacity=4, any_resource="off"))
    assert not [name for name in slots.resources if "socket" in name]
    off = discover(config(tree.root, tmp_path, socket_resources="off"))
    assert not [name for name in off.resources if "socket" in name]
    with pytest.raises(ValueError, match="socket-<id> needs --capacity cpus"):
        config(tree.root, tmp_path, capacity=4, socket_resources="on")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["nic=scope:rack"], "scope must be one of node, socket"),
        (["nic=scope:"], "scope must be one of node, socket"),
        (["nic=scope:socket"], "scope:socket names no device"),
        (["socket-1=net:ens1f0"], "would collide with the socket resources"),
        (["socket-0-nic=net:ens1f0"], "would collide with the socket resources"),
    ],
)
def test_bad_scopes_and_socket_names_are_refused(entries: list[str], message: str) -> None:
    from numa_device_plugin.plugin.model.near import check_near

    with pytest.raises(ValueError, match=message):
        check_near("numa-align", merge_near(parse_near(entry) for entry in entries))


def test_a_scope_given_first_or_twice_merges_into_one_entry() -> None:
    (entry,) = merge_near(
        parse_near(text) for text in ("n=scope:socket", "n=net:ens1f0", "n=scope:socket")
    )
    assert (str(entry), entry.scope, entry.flags()) == (
        "n=net:ens1f0 & scope:socket", "socket", ["n=net:ens1f0", "n=scope:socket"]
    )  # fmt: skip


# -- serving over real gRPC ----------------------------------------------------------------


def topology_of(kubelet: KubeletStandIn, name: str) -> set[int]:
    """The NUMA nodes the TopologyInfo of the resource's devices name."""
    devices = kubelet.devices(name)
    assert devices, name
    assert all(len(d.topology.nodes) == 1 for d in devices)
    return {d.topology.nodes[0].ID for d in devices}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_serve_registers_each_shapes_resources_with_their_topology(
    shape: str, tmp_path: Path, sock_dir: Path
) -> None:
    build, near, expected = SHAPES[shape]
    tree = build(tmp_path / "sys")
    resources: dict[str, tuple[int, ...]] = expected["resources"]  # type: ignore[assignment]
    names = [P + name for name in resources]
    async with KubeletStandIn(sock_dir) as kubelet, running(config(tree.root, sock_dir, *near)):
        await wait_all_live(kubelet, names)
        assert set(kubelet.clients) == set(names)
        for name, nodes in resources.items():
            assert topology_of(kubelet, P + name) == set(nodes), name


async def test_allocate_tells_the_socket_and_node_and_the_device_near_a_memory_only_node(
    tmp_path: Path, sock_dir: Path
) -> None:
    """NPS4 socket-1 and the NIC's socket; GB200's GPU on HBM node 2 (from node 0)."""
    tree = shapes.nps4(tmp_path / "nps4")
    near: tuple[str, ...] = ("nic=net:ens1f0", "nic=scope:socket")
    async with KubeletStandIn(sock_dir) as kubelet, running(config(tree.root, sock_dir, *near)):
        await wait_all_live(kubelet, [f"{P}socket-1", f"{P}nic"])
        answer = await kubelet.allocate(f"{P}socket-1", ["numa6-cpu0024", "numa6-cpu0025"])
        assert dict(answer.container_responses[0].envs) == {"NUMA_NODE": "6", "NUMA_SOCKET": "1"}
        answer = await kubelet.allocate(f"{P}nic", ["numa7-cpu0028"])
        assert dict(answer.container_responses[0].envs) == {
            "NUMA_NODE": "7", "NUMA_SOCKET": "1", "NUMA_NEAR_NIC": "ens1f0"
        }  # fmt: skip
        answer = await kubelet.allocate(f"{P}numa-6", ["numa6-cpu0026"])
        assert dict(answer.container_responses[0].envs) == {"NUMA_NODE": "6"}
    gb200 = shapes.gb200_like(tmp_path / "gb200")
    near = ("gpus=pci-class:0302",)
    async with KubeletStandIn(sock_dir) as kubelet, running(config(gb200.root, sock_dir, *near)):
        await wait_all_live(kubelet, [f"{P}gpus"])
        answer = await kubelet.allocate(f"{P}gpus", ["numa0-cpu0001"])
        assert dict(answer.container_responses[0].envs) == {
            "NUMA_NODE": "0", "NUMA_NEAR_GPUS": "0008:01:00.0,0009:01:00.0"
        }  # fmt: skip


# -- the real snapshots ----------------------------------------------------------------------


async def test_the_snapshot_with_memory_tiers_discovers_and_serves_its_cpu_nodes_only(
    snapshots_root: Path, sock_dir: Path, tmp_path: Path
) -> None:
    """fakeheteromemtiers: CPU nodes 0-2 (one socket), memory-only nodes 4, 6, 8, 9 at
    distance 20 from each: none advertised, each following all three (a tie)."""
    root = snapshots_root / "fakeheteromemtiers"
    found = discover(config(root, sock_dir))
    assert [p.node.id for p in found.plans if p.advertised] == [0, 1, 2]
    follows = {n: (f.to, f.distance) for n, f in nearest_nodes(found.plans).items()}
    assert follows == dict.fromkeys((4, 6, 8, 9), ((0, 1, 2), 20))
    expected = {"numa-0": {0}, "numa-1": {1}, "numa-2": {2}, "any": {0, 1, 2},
                "socket-0": {0, 1, 2}}  # fmt: skip
    async with KubeletStandIn(sock_dir) as kubelet, running(config(root, sock_dir)):
        await wait_all_live(kubelet, [P + name for name in expected])
        assert set(kubelet.clients) == {P + name for name in expected}
        for name, nodes in expected.items():
            assert topology_of(kubelet, P + name) == nodes


async def test_the_snapshot_of_four_sockets_of_two_numa_nodes_serves_a_resource_per_socket(
    snapshots_root: Path, sock_dir: Path
) -> None:
    """48amd64-4pa2n6c-sparse: 4 packages of 2 NUMA nodes with sparse ids."""
    root = snapshots_root / "48amd64-4pa2n6c-sparse"
    sockets = {"socket-0": {0, 1}, "socket-1": {2, 33}, "socket-2": {34, 45},
               "socket-3": {72, 73}}  # fmt: skip
    async with KubeletStandIn(sock_dir) as kubelet, running(config(root, sock_dir)):
        await wait_all_live(kubelet, [P + name for name in sockets])
        for name, nodes in sockets.items():
            assert topology_of(kubelet, P + name) == nodes
            assert kubelet.allocatable(P + name) == 6  # the free CPUs of one node


async def test_debug_state_and_the_node_page_say_where_a_memory_only_nodes_devices_go(
    tmp_path: Path, sock_dir: Path
) -> None:
    from numa_device_plugin.plugin.reports.nodepage.model import build_page
    from numa_device_plugin.plugin.reports.nodepage.render import render_page
    from numa_device_plugin.plugin.reports.snapshot import debug_document

    tree = shapes.gb200_like(tmp_path / "sys")
    near = ("gpu0=pci:0008:01:00.0",)
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        running(config(tree.root, sock_dir, *near)) as manager,
    ):
        await wait_all_live(kubelet, [f"{P}gpu0"])
        state = manager.snapshot()
    document = debug_document(state)
    node2 = next(node for node in document["numa_nodes"] if node["id"] == 2)
    assert node2["nearest"] == {
        "node": 2, "to": [0], "distance": 80,
        "why": "memory-only node 2; nearest CPUs: node 0 at distance 80",
    }  # fmt: skip
    assert next(n for n in document["numa_nodes"] if n["id"] == 0)["nearest"] is None
    (entry,) = document["near"]
    assert entry["followed"] == [
        "0008:01:00.0 is on memory-only node 2; nearest CPUs: node 0 at distance 80"
    ]
    assert entry["by_node"] == {"0": ["0008:01:00.0"]}
    body = render_page(build_page(state, node="n1")).decode()
    assert "its devices follow node 0 (distance 80)" in body


async def test_a_socket_resource_offers_its_node_with_the_most_room_and_switches_at_allocate(
    tmp_path: Path,
) -> None:
    """NPS4, socket 1 = nodes 4-7 (4 CPUs each): a tie offers node 4; a pod of no device
    of ours takes 3 CPUs of node 4 and 2 of node 5: node 6 is offered, allocatable 4; an
    Allocate of 2 of node 6 (held, Healthy) moves the offer to node 7 at once."""
    from tests.plugin.test_exposure import healthy_by_node, serving

    tree = shapes.nps4(tmp_path / "sys")
    socket = f"{P}socket-1"
    async with serving(tree.root, tmp_path, list(range(32))) as (kubelet, manager):
        await wait_all_live(kubelet, [socket], timeout=20)
        await kubelet.wait_until(lambda: set(healthy_by_node(kubelet, socket)) == {4})
        assert kubelet.allocatable(socket) == 4
        kubelet.add_pod("other", "db", [("db", {}, [16, 17, 18, 20, 21])])
        await kubelet.wait_until(lambda: set(healthy_by_node(kubelet, socket)) == {6})
        assert manager.poller.spanning.exposures[socket].node_id == 6
        held = ["numa6-cpu0024", "numa6-cpu0025"]
        await kubelet.allocate(socket, held)
        await kubelet.wait_until(
            lambda: (
                healthy_by_node(kubelet, socket).get(6) == held
                and set(healthy_by_node(kubelet, socket)) == {6, 7}
            )
        )
        # any spans every node: node 0-3 have 4 free each, as does 7: node 0 (kept).
        assert manager.poller.spanning.exposures[f"{P}any"].node_id == 0


def test_a_socket_keeps_a_node_whose_cpus_are_all_reserved(tmp_path: Path) -> None:
    """NPS4 with node 0's CPUs 0-3 reserved: socket-0 is still over nodes 0-3 (node 0
    with no device), as it is without them: what is advertised does not hang on them."""
    tree = shapes.nps4(tmp_path / "sys")
    found = discover(config(tree.root, tmp_path, reserved_cpus=frozenset(range(4))))
    socket = found.resources[f"{P}socket-0"]
    assert socket.node_ids == (0, 1, 2, 3)
    assert {device.node_id for device in socket.devices} == {1, 2, 3}


def test_the_kubelet_setting_for_more_than_8_numa_nodes_is_logged_once_a_process(
    tmp_path: Path,
) -> None:
    """A GB200-like board of 2 Grace nodes and 8 HBM nodes (10 in all): the setting is
    said at the first look, not again at a reload; other warnings are not affected."""
    from structlog.testing import capture_logs

    from numa_device_plugin.plugin.advertised import discovery

    tree = shapes.machine(tmp_path / "sys", [(2, 0), (2, 1), *[(0, None)] * 8],
                          lambda a, b: 10 if a == b else 40)  # fmt: skip
    discovery.LOGGED_ONCE.clear()
    with capture_logs() as logs:
        discover(config(tree.root, tmp_path))
        discover(config(tree.root, tmp_path))
    said = [e["event"] for e in logs if "max-allowable-numa-nodes" in e["event"]]
    assert len(said) == 1
    assert "this machine has 10 NUMA nodes" in said[0]
    assert 'max-allowable-numa-nodes: "10"' in said[0]
    # Each look still says which NUMA nodes are not advertised.
    assert sum(e["event"] == "not advertising NUMA node" for e in logs) == 16
