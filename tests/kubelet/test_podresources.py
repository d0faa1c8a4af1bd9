"""The pod resources client: answers taken as bytes and parsed and converted in a
worker thread (a 2.2 MB answer once held the event loop, and the probes, for 2.4 s),
a malformed answer a :class:`PodResourcesError`, and the view built in time linear
in the device entries."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.kubelet import podresources, view
from numa_device_plugin.kubelet.podresources import (
    PodResourcesClient,
    PodResourcesError,
    parse_answers,
)
from numa_device_plugin.kubelet.view import view_from
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.standin_helpers import serve_process, wait_all_live

R0, R1 = "numa-align/numa-0", "numa-align/numa-1"


async def test_the_view_is_parsed_and_converted_off_the_event_loop(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = view.view_from

    def recording(*args: object) -> view.KubeletView:
        seen.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(podresources, "view_from", recording)
    standin = KubeletStandIn(sock_dir / "dp", pod_resources_dir=sock_dir / "pr",
                             allocatable_cpus=[1, 2])  # fmt: skip
    async with standin as kubelet:
        kubelet.add_pod("ns", "p", [("c", {"numa-align/numa-0": ["numa0-cpu0001"]}, [1])])
        async with PodResourcesClient(sock_dir / "pr" / "kubelet.sock") as client:
            got = await client.view(5)
            parsed = await client.responses(5, allocatable=False)
    assert got.allocatable_cpus == frozenset({1, 2})
    assert [h.devices for h in got.holders] == [{"numa-align/numa-0": ("numa0-cpu0001",)}]
    assert len(parsed[0].pod_resources) == 1
    assert seen
    assert threading.main_thread().name not in seen


def test_an_answer_that_does_not_parse_is_a_pod_resources_error(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="an answer that does not parse") as caught:
        parse_answers(tmp_path / "kubelet.sock", b"\xff\xff\xff", b"")
    assert caught.value.code == grpc.StatusCode.INTERNAL


def test_many_device_entries_of_one_resource_are_joined_in_linear_time() -> None:
    """One container listing 20,000 entries of one resource: once re-tupled at each
    entry (quadratic: 200 million copies)."""
    pods = pr_pb2.ListPodResourcesResponse()
    container = pods.pod_resources.add(name="p", namespace="ns").containers.add(name="c")
    for index in range(20_000):
        container.devices.add(resource_name="r", device_ids=[f"numa0-slot{index:04d}"])
    got = view.view_from(pods, pr_pb2.AllocatableResourcesResponse())
    assert len(got.holders[0].devices["r"]) == 20_000


async def test_the_device_lists_an_answer_calls_for_are_worked_out_off_the_event_loop(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_device_plugin.plugin.counts import capacity, planning
    from numa_device_plugin.topology.fake import build_machine
    from tests.standin_helpers import eventually, running, wait_all_live

    seen: list[str] = []
    real = capacity.live_resource_devices

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning, "live_resource_devices", recording)
    tree = build_machine(sock_dir / "sys", nodes=2, cpus_per_node=2)
    config = Config(sysfs_root=tree.root, socket_dir=sock_dir / "dp", capacity="cpus",
                    pod_resources_socket=sock_dir / "pr" / "kubelet.sock",
                    pod_resources_interval=0.2, shutdown_grace=0.5)  # fmt: skip
    standin = KubeletStandIn(sock_dir / "dp", pod_resources_dir=sock_dir / "pr",
                             allocatable_cpus=[1, 2, 3])  # fmt: skip
    async with standin as kubelet, running(config) as manager:
        names = ["numa-align/numa-0", "numa-align/numa-1"]
        await wait_all_live(kubelet, names, timeout=20)
        kubelet.add_pod("ns", "p", [("c", {names[1]: ["numa1-cpu0002"]}, [2])])
        await kubelet.wait_until(lambda: kubelet.allocatable(names[1]) == 2, timeout=10)
        # The stand-in sees a resource live when it opens ListAndWatch, a moment
        # before the plugin has the Register answer (asserted at once, it failed 1
        # round in 10 beside two busy loops).
        await eventually(lambda: manager.registered == {*names, "numa-align/any"})
    workers = [name for name in seen if name != threading.main_thread().name]
    assert workers, "each poll's answer is applied from a worker thread"


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


async def test_an_unchanged_answer_gives_the_last_view_itself_without_converting(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual read finds what the last one found: no conversion (the work of a
    read at 200 containers was mostly view_from), and the caller tells by ``is``. The
    kubelet lists its pods in no fixed order: the same pods in another order are the
    same answer; a pod added, removed or changed is not."""
    converted: list[int] = []
    real = view.view_from

    def counted(*args: object) -> view.KubeletView:
        converted.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(podresources, "view_from", counted)
    standin = KubeletStandIn(sock_dir / "dp", pod_resources_dir=sock_dir / "pr",
                             allocatable_cpus=[1, 2, 3])  # fmt: skip
    a = ("c", {R0: ["numa0-cpu0001"]}, [1])
    b = ("c", {R1: ["numa1-cpu0002"]}, [2])
    async with standin as kubelet, PodResourcesClient(sock_dir / "pr" / "kubelet.sock") as client:
        kubelet.add_pod("ns", "a", [a])
        kubelet.add_pod("ns", "b", [b])
        first = await client.view(5)
        assert await client.view(5) is first
        kubelet.remove_pod("ns", "a")
        kubelet.add_pod("ns", "a", [a])  # listed after b now
        assert await client.view(5) is first
        assert len(converted) == 1
        kubelet.remove_pod("ns", "a")
        kubelet.add_pod("ns", "a", [("c", {R0: ["numa0-cpu0001"]}, [3])])  # other CPUs
        changed = await client.view(5)
        assert changed is not first
        assert changed != first
        kubelet.remove_pod("ns", "b")
        fewer = await client.view(5)
        assert [h.pod for h in fewer.holders] == ["a"]
        kubelet.allocatable_cpus = [1, 2]
        assert (await client.view(5)).allocatable_cpus == {1, 2}
        assert len(converted) == 4
        await client.close()  # a new connection (a restarted kubelet) converts afresh
        await client.view(5)
        assert len(converted) == 5
