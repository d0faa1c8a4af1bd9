"""Tests that bite: each kills a one-line mutation a mutation run left alive (the
mutation is named in the test's docstring and was re-applied to see it fail)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from numa_device_plugin.kubelet.view import view_from
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.prometheus import PrometheusRecorder
from numa_device_plugin.topology.fake import SysfsTree
from tests.cli.test_cli import serve_params
from tests.standin_helpers import serve_process, wait_all_live

R0, R1 = "numa-align/numa-0", "numa-align/numa-1"


def memory_block(kind: str, size: int, *nodes: int) -> pr_pb2.ContainerMemory:
    return pr_pb2.ContainerMemory(
        memory_type=kind,
        size=size,
        topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n) for n in nodes]),
    )


def test_view_from_sums_the_memory_blocks_of_a_numa_node() -> None:
    """Mutation: a NUMA node's memory overwritten by its last block instead of summed."""
    allocatable = pr_pb2.AllocatableResourcesResponse(
        memory=[
            memory_block("memory", 3 * 2**30, 1),
            memory_block("memory", 1 * 2**30, 1),
            memory_block("hugepages-2Mi", 512 * 2**20, 1),
            memory_block("memory", 2 * 2**30, 0),
        ]
    )
    view = view_from(pr_pb2.ListPodResourcesResponse(), allocatable)
    assert view.memory == {
        1: {"memory": 4 * 2**30, "hugepages-2Mi": 512 * 2**20},
        0: {"memory": 2 * 2**30},
    }


def test_allocatable_memory_reaches_its_metric() -> None:
    """Mutation: ``numa_node_allocatable_memory_bytes`` set to 0."""
    recorder = PrometheusRecorder()
    recorder.capacity([], {1: {"memory": 4 * 2**30, "hugepages-1Gi": 2**30}}, {})
    text = recorder.render().decode()
    assert (
        'numa_node_allocatable_memory_bytes{memory_type="memory",numa_node="1"} 4.294967296e+09'
        in text
    )
    assert (
        'numa_node_allocatable_memory_bytes{memory_type="hugepages-1Gi",numa_node="1"} '
        "1.073741824e+09" in text
    )


@pytest.mark.parametrize("value", ["inf", "+inf", "1e400", "-inf", "nan"])
def test_an_infinite_interval_is_refused(value: str) -> None:
    """Mutation: ``--pod-resources-interval inf`` (``+inf``, ``1e400``) accepted."""
    import click

    with pytest.raises(click.BadParameter, match="must be a positive number of seconds"):
        serve_params(["--pod-resources-interval", value])


def test_the_interval_defaults_to_5_seconds() -> None:
    """Mutation: another default for the interval."""
    assert serve_params([])["pod_resources_interval"] == 5.0
    assert Config().pod_resources_interval == 5.0


async def test_the_client_dials_anew_after_an_error(sock_dir: Path) -> None:
    """Mutation: the pod resources client keeps its channel after an error. A kept
    channel to a restarted kubelet sits in its reconnect backoff and fails the read."""
    kubelet = KubeletStandIn(
        sock_dir / "dp", pod_resources_dir=sock_dir / "pr", allocatable_cpus=[1, 2]
    )
    async with kubelet, PodResourcesClient(sock_dir / "pr" / "kubelet.sock") as client:
        assert (await client.view(2.0)).allocatable_cpus == {1, 2}
        await kubelet.stop_pod_resources()
        with pytest.raises(PodResourcesError):
            await client.view(2.0)
        kubelet.allocatable_cpus = [1, 2, 3]
        await kubelet.start_pod_resources()
        for _ in range(3):  # every read right after the restart answers
            assert (await client.view(2.0)).allocatable_cpus == {1, 2, 3}


async def test_get_allocatable_resources_is_read_again(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Mutation: GetAllocatableResources read only once. The kubelet's allocatable CPUs
    changed (here without a restart): a later read sees it."""
    kubelet = KubeletStandIn(
        sock_dir / "dp", pod_resources_dir=sock_dir / "pr", allocatable_cpus=range(1, 8)
    )
    flags = (
        "--capacity", "cpus",
        "--pod-resources-socket", str(sock_dir / "pr" / "kubelet.sock"),
        "--pod-resources-interval", "0.1",
    )  # fmt: skip
    async with kubelet, serve_process(two_nodes, sock_dir / "dp", *flags):
        await wait_all_live(kubelet, [R0, R1], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        kubelet.allocatable_cpus = [1, 2, 3, 4, 5, 6]  # CPU 7 reserved now
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 3, timeout=10)


async def test_a_silent_pod_resources_api_does_not_hold_up_registration(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """Mutation: the first read at start-up waits max(interval, POLL_TIMEOUT) instead of
    min. A pod resources socket that accepts and never answers, a 3600 s interval:
    the resources still register within seconds (the read gives up after 2 s)."""
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(sock_dir / "silent.sock"))
    silent.listen()
    flags = (
        "--capacity", "cpus",
        "--pod-resources-socket", str(sock_dir / "silent.sock"),
        "--pod-resources-interval", "3600",
    )  # fmt: skip
    try:
        async with (
            KubeletStandIn(sock_dir / "dp") as kubelet,
            serve_process(two_nodes, sock_dir / "dp", *flags),
        ):
            await wait_all_live(kubelet, [R0, R1], timeout=20)
    finally:
        silent.close()
