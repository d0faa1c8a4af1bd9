"""Discovery: one synthetic tree per sysfs rule, and the real snapshots of ../shared."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from numa_device_plugin.topology import sysfs
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.numa import (
    MAX_CPU_MEMBERSHIPS,
    MAX_NUMA_NODE_ID,
    NumaNode,
    Topology,
    read_topology,
)
from numa_device_plugin.topology.plan import MAX_OVERLAP_LINES, plan_nodes, topology_warnings
from tests.conftest import snapshot_names


def usable(tree: SysfsTree) -> dict[int, str]:
    return {n.id: sysfs.format_cpulist(n.cpus) for n in read_topology(tree.root).nodes}


def test_modern_sysfs_with_online_and_cpulist(two_nodes: SysfsTree) -> None:
    topology = read_topology(two_nodes.root)
    assert [n.id for n in topology.nodes] == [0, 1]
    node1 = topology.node(1)
    assert node1.cpus == {4, 5, 6, 7}
    assert node1.memory_bytes == 1048576 * 1024
    assert dict(node1.distances or {}) == {0: 21, 1: 10}
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
    assert dict(node.distances or {}) == {0: 22, 33: 10}


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


@pytest.mark.parametrize(
    ("relative", "content", "field", "needle"),
    [
        ("node/node0/distance", "10 20 30\n", "distances", "3 values for 2 online NUMA nodes"),
        ("node/node0/distance", "0\n", "distances", "distance values must be positive"),
        ("node/node0/distance", "ten twenty\n", "distances", "must be integers"),
        ("node/node0/meminfo", "garbage\n", "memory_bytes", "MemTotal"),
        ("node/node0/meminfo", "", "memory_bytes", "MemTotal"),
    ],
)
def test_malformed_informative_file_is_a_warning_and_an_unknown_field(
    two_nodes: SysfsTree, relative: str, content: str, field: str, needle: str
) -> None:
    """Distances and memory never decide what is advertised: a real machine whose
    distance or meminfo file is odd is served, with that field unknown."""
    two_nodes.write(relative, content)
    topology = read_topology(two_nodes.root)
    assert getattr(topology.node(0), field) is None
    assert getattr(topology.node(1), field) is not None
    assert [plan.advertised for plan in plan_nodes(topology)] == [True, True]
    (warning,) = topology.warnings
    assert str(two_nodes.system / relative) in warning
    assert needle in warning
    assert repr(content.strip().split(" ")[0])[1:-1] in warning


def test_distance_row_counting_possible_nodes(sysfs_tree: SysfsTree) -> None:
    """Some kernels and dumps give one distance per *possible* NUMA node."""
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("node/online", "0,2\n")
    sysfs_tree.write("node/possible", "0-3\n")
    sysfs_tree.node(0, "0-1", distance="10 20 21 22").node(2, "2-3", distance="21 20 10 22")
    topology = read_topology(sysfs_tree.root)
    assert dict(topology.node(0).distances or {}) == {0: 10, 2: 21}
    assert dict(topology.node(2).distances or {}) == {0: 21, 2: 10}
    assert topology.warnings == ()


def test_empty_per_cpu_online_file_reads_as_online_with_one_warning(
    sysfs_tree: SysfsTree,
) -> None:
    sysfs_tree.cpus(4)
    sysfs_tree.node(0, "0-3")
    for cpu in (1, 2, 3):
        sysfs_tree.write(f"cpu/cpu{cpu}/online", "")
    topology = read_topology(sysfs_tree.root)
    assert topology.node(0).cpus == {0, 1, 2, 3}
    (warning,) = topology.warnings
    assert "online is empty for CPUs 1-3" in warning


@pytest.mark.parametrize("kind", ["fifo", "folder", "char-device"])
def test_only_regular_files_are_read(sysfs_tree: SysfsTree, kind: str) -> None:
    """A FIFO where cpulist belongs once hung discovery for good."""
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.node(0)
    path = sysfs_tree.system / "node/node0/cpulist"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(sysfs.SysfsFormatError) as caught:
        read_topology(sysfs_tree.root)
    assert str(path) in str(caught.value)
    assert "not a regular file" in str(caught.value)


def test_a_fifo_as_an_informative_file_is_a_warning(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.node(0, "0-1", mem_kb=None)
    os.mkfifo(sysfs_tree.system / "node/node0/meminfo")
    topology = read_topology(sysfs_tree.root)
    assert topology.node(0).memory_bytes is None
    assert "a FIFO, not a regular file" in topology.warnings[0]


def test_overlap_warnings_are_bounded(sysfs_tree: SysfsTree) -> None:
    """256 nodes listing the same CPUs once gave 32,897 warning lines."""
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("node/online", "0-255\n")
    for node in range(256):
        sysfs_tree.node(node, "0-3", mem_kb=None)
    warnings = topology_warnings(plan_nodes(read_topology(sysfs_tree.root)))
    overlaps = [w for w in warnings if "list CPUs" in w]
    assert len(overlaps) == 1
    assert "NUMA nodes 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 and 240 more" in overlaps[0]
    assert len(warnings) <= 2 + MAX_OVERLAP_LINES


def test_many_distinct_overlaps_end_in_a_summary(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(20, online="0-19")
    sysfs_tree.write("node/online", "0-19\n")
    for node in range(20):
        sysfs_tree.node(node, f"{node},{(node + 1) % 20}", mem_kb=None)
    overlaps = [w for w in topology_warnings(plan_nodes(read_topology(sysfs_tree.root)))]
    assert len(overlaps) == MAX_OVERLAP_LINES + 2  # + the over-8-nodes warning
    assert overlaps[-1] == "... and 15 more groups of NUMA nodes sharing CPUs"


def test_node_ids_above_the_kernels_limit_are_refused_naming_node_online(
    sysfs_tree: SysfsTree,
) -> None:
    """``node/online`` = 0-65535 once made the node page quadratic (3 GB, no answer)."""
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.write("node/online", "0-65535\n")
    with pytest.raises(sysfs.SysfsFormatError, match="NUMA node id 65535 is above") as caught:
        read_topology(sysfs_tree.root)
    assert str(sysfs_tree.system / "node" / "online") in str(caught.value)


def test_the_highest_node_id_the_kernel_allows_is_read(sysfs_tree: SysfsTree) -> None:
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.write("node/online", f"0,{MAX_NUMA_NODE_ID}\n")
    sysfs_tree.node(0, "0").node(MAX_NUMA_NODE_ID, "1")
    assert usable(sysfs_tree) == {0: "0", MAX_NUMA_NODE_ID: "1"}


def test_a_node_folder_beyond_any_integer_is_refused_naming_it(sysfs_tree: SysfsTree) -> None:
    """``node9223372036854775808`` (no ``node/online``) once passed discovery and
    made ``serve`` exit in ``device_message`` (``ValueError: Value out of range``)."""
    sysfs_tree.cpus(2, online="0-1")
    sysfs_tree.node(0, "0-1").node(9223372036854775808, "")
    with pytest.raises(sysfs.SysfsFormatError, match="node9223372036854775808"):
        read_topology(sysfs_tree.root)


def test_a_node_folder_that_is_a_symlink_loop_is_an_error_not_no_numa(
    sysfs_tree: SysfsTree,
) -> None:
    sysfs_tree.cpus(2, online="0-1")
    (sysfs_tree.system / "node").symlink_to("node")
    with pytest.raises(sysfs.SysfsError, match="Too many levels of symbolic links"):
        read_topology(sysfs_tree.root)


def test_dense_overlapping_cpulists_are_refused_once_they_pass_the_bound(
    sysfs_tree: SysfsTree,
) -> None:
    """1,024 NUMA nodes each listing 0-65535 once cost 1.3 s and 9 MB per node."""
    sysfs_tree.cpus(4, online="0-3")
    sysfs_tree.write("node/online", "0-1023\n")
    for node in range(4):
        sysfs_tree.node(node, "0-65535", mem_kb=None)
    with pytest.raises(sysfs.SysfsFormatError, match=f"over {MAX_CPU_MEMBERSHIPS} CPUs") as caught:
        read_topology(sysfs_tree.root)
    assert "node2/cpulist" in str(caught.value), "the third node passes the bound"


def test_each_cpus_online_flag_is_read_once_however_many_nodes_list_it(
    sysfs_tree: SysfsTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs_tree.cpus(4)
    for cpu in range(4):
        sysfs_tree.write(f"cpu/cpu{cpu}/online", "1\n")
    sysfs_tree.write("node/online", "0-7\n")
    for node in range(8):
        sysfs_tree.node(node, "0-3", mem_kb=None)
    reads: list[str] = []
    real = sysfs.read_text

    def counted(path: Path) -> str | None:
        reads.append(path.name + str(path.parent.name))
        return real(path)

    monkeypatch.setattr(sysfs, "read_text", counted)
    read_topology(sysfs_tree.root)
    per_cpu = Counter(r for r in reads if r.startswith("onlinecpu") and r != "onlinecpu")
    assert set(per_cpu) == {f"onlinecpu{cpu}" for cpu in range(4)}
    # One look at each flag (read, then parsed), not one per NUMA node listing it (8).
    assert max(per_cpu.values()) <= 2, per_cpu


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
    assert "this machine has 9 NUMA nodes" in warnings[0]
    assert 'topologyManagerPolicyOptions: {max-allowable-numa-nodes: "9"}' in warnings[0]
    assert "#policy-option-max-allowable-numa-nodes" in warnings[0]


def test_memory_only_nodes_count_toward_the_kubelets_limit(sysfs_tree: SysfsTree) -> None:
    """8 NUMA nodes with CPUs and one of memory alone: the kubelet counts 9 (cadvisor's
    topology) and refuses to start; the warning counted the 8 advertised and said
    nothing."""
    sysfs_tree.cpus(8, online="0-7")
    for node in range(8):
        sysfs_tree.node(node, str(node))
    sysfs_tree.node(8, "")
    plans = plan_nodes(read_topology(sysfs_tree.root))
    assert sum(plan.advertised for plan in plans) == 8
    (warning,) = topology_warnings(plans)
    assert "this machine has 9 NUMA nodes" in warning


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
        "NUMA nodes 0,1 all list CPUs 2 (broken firmware tables?); "
        "alignment to any of them may not be exclusive"
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
    assert dict(topology.node(0).distances or {}) == {0: 10, 1: 21}
    assert topology.node(1).memory_bytes == 16777216 * 1024


def test_a_nodes_sockets_come_from_its_lowest_and_highest_cpus(sysfs_tree: SysfsTree) -> None:
    """Node 0 spans two packages (AMD NPS0: CPUs 0-1 in socket 0, 2-3 in socket 1); node
    1's highest CPU has no file (unknown: none), node 2's lowest a malformed one (a
    warning naming it, none); a middle CPU's package is not read."""
    sysfs_tree.cpus(12, online="0-11")
    for node in range(3):
        sysfs_tree.node(node, f"{4 * node}-{4 * node + 3}")
    packages = {0: "0", 1: "0", 2: "1", 3: "1", 4: "0", 5: "7", 8: "socket", 11: "-1"}
    for cpu, text in packages.items():
        sysfs_tree.write(f"cpu/cpu{cpu}/topology/physical_package_id", text + "\n")
    topology = read_topology(sysfs_tree.root)
    assert [sorted(node.sockets) for node in topology.nodes] == [[0, 1], [0], []]
    (warning,) = topology.warnings
    assert "cpu8/topology/physical_package_id" in warning
    assert "'socket'" in warning
