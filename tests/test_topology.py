"""Discovery: one synthetic tree per sysfs rule, and the real snapshots of ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin import sysfs
from numa_device_plugin.fake_sysfs import SysfsTree
from numa_device_plugin.topology import (
    NumaNode,
    Topology,
    plan_nodes,
    read_topology,
    topology_warnings,
)
from tests.conftest import snapshot_names


def usable(tree: SysfsTree) -> dict[int, str]:
    return {n.id: sysfs.format_cpulist(n.cpus) for n in read_topology(tree.root).nodes}


def test_modern_sysfs_with_online_and_cpulist(two_nodes: SysfsTree) -> None:
    topology = read_topology(two_nodes.root)
    assert [n.id for n in topology.nodes] == [0, 1]
    node1 = topology.node(1)
    assert node1.cpus == {4, 5, 6, 7}
    assert node1.memory_bytes == 1048576 * 1024
    assert dict(node1.distances) == {0: 21, 1: 10}
    assert topology.numa_in_sysfs


def test_node_ids_from_folders_when_online_is_missing(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.node(0, "0-1").node(3, "2-3")
    (sysfs_tree.system / "node" / "possible").write_text("0-3\n")  # not a node folder
    assert usable(sysfs_tree) == {0: "0-1", 3: "2-3"}


def test_online_file_wins_over_folders(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("node/online", "0\n")
    sysfs_tree.node(0, "0-3").node(1, "")  # node1 folder exists but is not online
    assert usable(sysfs_tree) == {0: "0-3"}


def test_cpumap_when_cpulist_is_missing(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(40, online="0-39")
    sysfs_tree.node(0)
    sysfs_tree.write("node/node0/cpumap", "000000f0,0000000f\n")
    assert usable(sysfs_tree) == {0: "0-3,36-39"}


def test_cpu_links_when_cpulist_and_cpumap_are_missing(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4)
    sysfs_tree.node(0).node(1)
    for node, cpus in ((0, (0, 2)), (1, (1, 3))):
        for cpu in cpus:
            link = sysfs_tree.system / "node" / f"node{node}" / f"cpu{cpu}"
            link.symlink_to(f"../../cpu/cpu{cpu}")
    assert usable(sysfs_tree) == {0: "0,2", 1: "1,3"}


def test_cpulist_wins_over_cpumap(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.node(0, "0-1")
    sysfs_tree.write("node/node0/cpumap", "0000000f\n")
    assert usable(sysfs_tree) == {0: "0-1"}


def test_cpu_online_file_filters(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(8, online="0-2,4-7")
    sysfs_tree.node(0, "0-3").node(1, "4-7")
    assert usable(sysfs_tree) == {0: "0-2", 1: "4-7"}


def test_per_cpu_online_zero_without_global_file(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4)
    sysfs_tree.write("cpu/cpu1/online", "0\n")
    sysfs_tree.write("cpu/cpu2/online", "1\n")
    sysfs_tree.node(0, "0-3")
    assert usable(sysfs_tree) == {0: "0,2-3"}


def test_per_cpu_online_zero_overrides_global_file(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("cpu/cpu3/online", "0")
    sysfs_tree.node(0, "0-3")
    assert usable(sysfs_tree) == {0: "0-2"}


def test_empty_cpu_online_file_means_no_restriction(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="")
    sysfs_tree.node(0, "0-3")
    assert usable(sysfs_tree) == {0: "0-3"}


def test_no_node_folder_means_one_node_zero(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-1")
    topology = read_topology(sysfs_tree.root)
    assert topology == Topology(
        nodes=(NumaNode(id=0, cpus=frozenset({0, 1}), all_cpus=frozenset({0, 1})),),
        numa_in_sysfs=False,
    )


def test_no_node_folder_and_no_online_file_uses_cpu_folders(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(3)
    sysfs_tree.write("cpu/cpu2/online", "0")
    assert usable(sysfs_tree) == {0: "0-1"}


def test_trailing_nul_bytes_are_ignored(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2)
    sysfs_tree.write("cpu/online", b"0-1\n\x00")
    sysfs_tree.write("node/online", b"0\n\x00\x00")
    sysfs_tree.node(0)
    sysfs_tree.write("node/node0/cpulist", b"0-1\n\x00")
    sysfs_tree.write("node/node0/distance", b"10\n\x00")
    assert usable(sysfs_tree) == {0: "0-1"}


def test_sparse_ids_and_distances_follow_online_order(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("node/online", "0,33\n")
    sysfs_tree.node(0, "0-1", distance="10 22").node(33, "2-3", distance="22 10")
    node = read_topology(sysfs_tree.root).node(33)
    assert dict(node.distances) == {0: 22, 33: 10}


def test_memory_unknown_without_meminfo(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.node(0, "0-1", mem_kb=None)
    assert read_topology(sysfs_tree.root).node(0).memory_bytes is None


def test_online_node_without_folder_is_kept_but_not_advertised(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.write("node/online", "0-1\n")
    sysfs_tree.node(0, "0-1")
    plans = plan_nodes(read_topology(sysfs_tree.root))
    assert [(p.node.id, p.advertised) for p in plans] == [(0, True), (1, False)]
    assert "no node1 folder" in (plans[1].reason or "")


@pytest.mark.parametrize(
    ("relative", "content", "needle"),
    [
        ("node/online", "0-x\n", "node/online"),
        ("node/online", "\n", "no NUMA node is online"),
        ("node/node0/cpulist", "0-3,zz\n", "node0/cpulist"),
        ("node/node0/distance", "10 20 30\n", "3 values but 2 NUMA nodes"),
        ("node/node0/meminfo", "garbage\n", "MemTotal"),
        ("cpu/online", "0-\n", "cpu/online"),
        ("cpu/cpu1/online", "maybe\n", "cpu1/online"),
    ],
)
def test_malformed_file_names_file_and_content(
    two_nodes: SysfsTree, relative: str, content: str, needle: str
) -> None:
    two_nodes.write(relative, content)
    with pytest.raises(sysfs.SysfsFormatError) as caught:
        read_topology(two_nodes.root)
    message = str(caught.value)
    assert needle in message
    assert repr(content.strip()) in message


def test_not_a_sysfs_root(tmp_path: Path) -> None:
    with pytest.raises(sysfs.SysfsError, match=r"is .* a sysfs root"):
        read_topology(tmp_path)


def test_memory_only_nodes_are_not_advertised_by_default(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.write("node/online", "0,4\n")
    sysfs_tree.node(0, "0-1").node(4, "")
    plans = plan_nodes(read_topology(sysfs_tree.root))
    assert [(p.node.id, p.advertised) for p in plans] == [(0, True), (4, False)]
    assert "memory-only" in (plans[1].reason or "")
    included = plan_nodes(read_topology(sysfs_tree.root), include_cpuless=True)
    assert [(p.node.id, p.advertised) for p in included] == [(0, True), (4, True)]
    assert included[0].reason is None
    assert "included on request" in (included[1].reason or "")


def test_node_with_all_cpus_offline_says_so(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-1")
    sysfs_tree.node(0, "0-1").node(1, "2-3")
    plans = plan_nodes(read_topology(sysfs_tree.root))
    assert not plans[1].advertised
    assert "all of its CPUs (2-3) are offline" in (plans[1].reason or "")


def test_warning_over_eight_numa_nodes(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(9, online="0-8")
    for node in range(9):
        sysfs_tree.node(node, str(node))
    warnings = topology_warnings(plan_nodes(read_topology(sysfs_tree.root)))
    assert len(warnings) == 1
    assert "max-allowable-numa-nodes" in warnings[0]


def test_no_warning_at_eight_numa_nodes(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(8, online="0-7")
    for node in range(8):
        sysfs_tree.node(node, str(node))
    assert topology_warnings(plan_nodes(read_topology(sysfs_tree.root))) == []


def test_warning_on_overlapping_cpu_sets(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.node(0, "0-2").node(1, "2-3")
    warnings = topology_warnings(plan_nodes(read_topology(sysfs_tree.root)))
    assert warnings == [
        "NUMA nodes 0 and 1 both list CPUs 2 (broken firmware tables?); "
        "alignment to either node may not be exclusive"
    ]


# The README table of ../shared/fixtures/sysfs: advertised NUMA node -> usable CPUs.
SNAPSHOT_TABLE: dict[str, dict[int, str]] = {
    "16amd64-8n2c": {n: f"{2 * n}-{2 * n + 1}" for n in range(8)},
    "8ia64-2n2s2c": {0: "0-3", 1: "4-7"},
    "fakeheteromemtiers": {0: "0-1", 1: "2-3", 2: "4-5"},
    "48amd64-4pa2n6c-sparse": {
        node: f"{6 * i}-{6 * i + 5}" for i, node in enumerate((0, 1, 2, 33, 34, 45, 72, 73))
    },
    "2i386-2t-hugepagesizecount": {0: "0-1"},
    "16em64t-4s2c2t-offlines": {0: "0-1,3-4,6-12,15"},
    "32em64t-2n8c+dax+nvme+mic+dimms": {0: "0-7", 1: "8-15"},
}


def test_every_snapshot_has_an_expectation() -> None:
    names = snapshot_names()
    if not names:
        pytest.skip("../shared/fixtures/sysfs is absent")
    assert sorted(names) == sorted(SNAPSHOT_TABLE)


@pytest.mark.parametrize("name", sorted(SNAPSHOT_TABLE))
def test_snapshot_matches_readme_table(snapshots_root: Path, name: str) -> None:
    plans = plan_nodes(read_topology(snapshots_root / name))
    advertised = {p.node.id: sysfs.format_cpulist(p.node.cpus) for p in plans if p.advertised}
    assert advertised == SNAPSHOT_TABLE[name]


def test_snapshot_memory_tiers_are_cpuless(snapshots_root: Path) -> None:
    plans = plan_nodes(read_topology(snapshots_root / "fakeheteromemtiers"))
    left_out = {p.node.id: p.reason for p in plans if not p.advertised}
    assert sorted(left_out) == [4, 6, 8, 9]
    assert all("memory-only" in (reason or "") for reason in left_out.values())


def test_snapshot_distances_and_memory(snapshots_root: Path) -> None:
    topology = read_topology(snapshots_root / "32em64t-2n8c+dax+nvme+mic+dimms")
    assert dict(topology.node(0).distances) == {0: 10, 1: 21}
    assert topology.node(1).memory_bytes == 16777216 * 1024
