"""The DevicePlugin service over a real unix socket: options, ListAndWatch, Allocate,
GetPreferredAllocation, PreStartContainer, and bad requests that leave it serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.model.near import Near
from numa_device_plugin.plugin.model.resources import UNHEALTHY, Resource
from numa_device_plugin.plugin.serving import requests
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.selectors import parse_selector
from tests.ops.test_lockfile import accepted
from tests.standin_helpers import (
    NAMES,
    bound_port,
    eventually,
    logged,
    readyz,
    serve_process,
    wait_all_live,
)


@dataclass
class Served:
    servicer: NumaDevicePluginServicer
    server: UnixSocketServer
    stub: Any
    channel: grpc.aio.Channel
    lost: list[str]


@pytest.fixture
async def served(sock_dir: Path) -> AsyncIterator[Served]:
    lost: list[str] = []
    servicer = NumaDevicePluginServicer(
        build_resource("numa-align", 1, 4), on_stream_lost=lost.append
    )
    server = UnixSocketServer(
        sock_dir / "p.sock",
        lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s),
    )
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{server.path}")
    yield Served(servicer, server, api_pb2_grpc.DevicePluginStub(channel), channel, lost)
    await channel.close()
    servicer.close()
    await server.stop(0)


def allocate_request(*containers: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


def preferred(
    available: list[str], must: list[str], size: int
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


async def test_options(served: Served) -> None:
    options = await served.stub.GetDevicePluginOptions(api_pb2.Empty())
    assert options.pre_start_required is False
    assert options.get_preferred_allocation_available is True


async def test_list_and_watch_sends_full_list_with_topology(served: Served) -> None:
    call = served.stub.ListAndWatch(api_pb2.Empty())
    first = await call.read()
    assert [d.ID for d in first.devices] == [f"numa1-slot000{i}" for i in range(4)]
    assert {d.health for d in first.devices} == {"Healthy"}
    assert [[n.ID for n in d.topology.nodes] for d in first.devices] == [[1]] * 4
    call.cancel()


async def test_list_and_watch_sends_again_on_change(served: Served) -> None:
    call = served.stub.ListAndWatch(api_pb2.Empty())
    await call.read()
    devices = list(served.servicer.devices)
    devices[2] = type(devices[2])(devices[2].id, 1, 2, health=UNHEALTHY)
    served.servicer.set_devices(devices[:3])
    second = await asyncio.wait_for(call.read(), 5)
    assert [(d.ID, d.health) for d in second.devices] == [
        ("numa1-slot0000", "Healthy"),
        ("numa1-slot0001", "Healthy"),
        ("numa1-slot0002", "Unhealthy"),
    ]
    call.cancel()


async def test_list_and_watch_stays_open_until_close(served: Served) -> None:
    call = served.stub.ListAndWatch(api_pb2.Empty())
    await call.read()
    nothing = asyncio.ensure_future(call.read())
    # Round trips on the same connection: had the stream sent or ended meanwhile,
    # the read would have completed first.
    for _ in range(3):
        await served.stub.GetDevicePluginOptions(api_pb2.Empty())
    assert not nothing.done(), "the stream must stay open without sending"
    served.servicer.close()
    assert await asyncio.wait_for(nothing, 5) is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert served.lost == [], "a stream we closed ourselves is not a lost stream"


async def test_client_going_away_reports_stream_lost(served: Served) -> None:
    served.servicer.expect_kubelet()
    call = served.stub.ListAndWatch(api_pb2.Empty())
    await call.read()
    assert served.servicer.open_streams == 1
    assert served.servicer.kubelet_stream_open
    await served.channel.close()
    await eventually(lambda: bool(served.lost), timeout=5)
    assert served.lost == ["numa-align/numa-1"]
    assert served.servicer.open_streams == 0
    assert not served.servicer.kubelet_stream_open


async def test_only_the_kubelets_stream_counts(served: Served, sock_dir: Path) -> None:
    """A stream opened before Register (an operator's grpcurl) and one opened after the
    kubelet's may come and go; only the first stream after expect_kubelet() counts."""
    async with grpc.aio.insecure_channel(f"unix://{served.server.path}") as operator:
        early = api_pb2_grpc.DevicePluginStub(operator).ListAndWatch(api_pb2.Empty())
        await early.read()
        served.servicer.expect_kubelet()
        kubelet = served.stub.ListAndWatch(api_pb2.Empty())
        await kubelet.read()
        late = api_pb2_grpc.DevicePluginStub(operator).ListAndWatch(api_pb2.Empty())
        await late.read()
        assert served.servicer.open_streams == 3
    # The operator's channel is closed: both of its streams end, the kubelet's stays.
    await eventually(lambda: served.servicer.open_streams == 1, timeout=5)
    assert served.lost == []
    assert served.servicer.kubelet_stream_open
    await served.channel.close()
    await eventually(lambda: bool(served.lost), timeout=5)
    assert served.lost == ["numa-align/numa-1"]


async def test_allocate_injects_numa_node(served: Served) -> None:
    response = await served.stub.Allocate(allocate_request(["numa1-slot0000", "numa1-slot0003"]))
    assert len(response.container_responses) == 1
    assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}


async def test_allocate_answers_every_container(served: Served) -> None:
    response = await served.stub.Allocate(allocate_request(["numa1-slot0000"], ["numa1-slot0001"]))
    assert [dict(c.envs) for c in response.container_responses] == [{"NUMA_NODE": "1"}] * 2


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (allocate_request(), "no container requests"),
        (allocate_request([]), "container request 0 names no device ids"),
        (allocate_request(["numa0-slot0000"]), "'numa0-slot0000' are not devices of this resource"),
        (allocate_request(["numa1-slot0000"], ["gpu-7", "x"]), "container request 1"),
        (allocate_request(["numa1-slot0004"]), "numa1-slot0004"),
        (allocate_request(["numa1-slot0001", "numa1-slot0001"]), "listed twice"),
    ],
)
async def test_bad_allocate_is_invalid_argument_and_server_keeps_serving(
    served: Served, request_: api_pb2.AllocateRequest, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.stub.Allocate(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (caught.value.details() or "")
    assert "numa-align/numa-1" in (caught.value.details() or "")
    good = await served.stub.Allocate(allocate_request(["numa1-slot0002"]))
    assert dict(good.container_responses[0].envs) == {"NUMA_NODE": "1"}


async def test_error_message_lists_at_most_five_ids(served: Served) -> None:
    ids = [f"bogus-{i}" for i in range(12)]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.stub.Allocate(allocate_request(ids))
    assert "and 7 more" in (caught.value.details() or "")
    assert "bogus-5" not in (caught.value.details() or "")


@pytest.mark.parametrize("length", [65, 100_000, 1_000_000])
async def test_huge_device_ids_get_a_bounded_invalid_argument(served: Served, length: int) -> None:
    """A 1 MB id once got RESOURCE_EXHAUSTED: the message outgrew gRPC's metadata limit."""
    ids = ["x" * length, "numa1-slot0000", "y" * length]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.stub.Allocate(allocate_request(ids))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert len(details.encode()) <= 1024
    assert f"({length} characters)" in details
    assert "'" + "x" * 64 + "'..." in details
    with pytest.raises(grpc.aio.AioRpcError) as many:
        await served.stub.Allocate(allocate_request([f"{i}" * 60_000 for i in range(10)]))
    assert many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len((many.value.details() or "").encode()) <= 1024


def test_bounded_cuts_at_a_byte_limit() -> None:
    from numa_device_plugin.plugin.serving.requests import bounded

    assert bounded("short") == "short"
    cut = bounded("é" * 2000)
    assert len(cut.encode()) <= 1024
    assert cut.endswith("...")


ALL = [f"numa1-slot000{i}" for i in range(4)]


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        (ALL, [], 2, ["numa1-slot0000", "numa1-slot0001"]),
        (list(reversed(ALL)), [], 3, ALL[:3]),
        (ALL, ["numa1-slot0003"], 2, ["numa1-slot0003", "numa1-slot0000"]),
        (ALL[1:], ["numa1-slot0002"], 3, ["numa1-slot0002", "numa1-slot0001", "numa1-slot0003"]),
        (ALL, ["numa1-slot0001", "numa1-slot0000"], 2, ["numa1-slot0000", "numa1-slot0001"]),
        (ALL, [], 4, ALL),
    ],
)
async def test_preferred_allocation(
    served: Served, available: list[str], must: list[str], size: int, expected: list[str]
) -> None:
    response = await served.stub.GetPreferredAllocation(preferred(available, must, size))
    assert list(response.container_responses[0].deviceIDs) == expected


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (api_pb2.PreferredAllocationRequest(), "no container requests"),
        (preferred(ALL, [], 5), "allocation_size 5 exceeds the 4"),
        (preferred(ALL, [], 0), "at least 1"),
        (preferred(ALL, [], -3), "at least 1"),
        (preferred(ALL, ALL[:3], 2), "3 must-include devices do not fit allocation_size 2"),
        (preferred(["numa0-slot0000"], [], 1), "available_deviceIDs"),
        (preferred(ALL, ["nope"], 1), "must_include_deviceIDs"),
        (
            preferred(ALL[2:], ["numa1-slot0000"], 2),
            "must_include_deviceIDs 'numa1-slot0000' are not in available_deviceIDs",
        ),
    ],
)
async def test_bad_preferred_allocation_is_invalid_argument(
    served: Served, request_: api_pb2.PreferredAllocationRequest, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.stub.GetPreferredAllocation(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (caught.value.details() or "")
    ok = await served.stub.GetPreferredAllocation(preferred(ALL, [], 1))
    assert list(ok.container_responses[0].deviceIDs) == ["numa1-slot0000"]


async def test_pre_start_container_is_empty(served: Served) -> None:
    response = await served.stub.PreStartContainer(
        api_pb2.PreStartContainerRequest(devices_ids=["numa1-slot0000"])
    )
    assert response == api_pb2.PreStartContainerResponse()


def test_servicer_keeps_resource_identity() -> None:
    resource: Resource = build_resource("numa-align", 7, 2)
    servicer = NumaDevicePluginServicer(resource)
    assert (servicer.resource_name, servicer.node_id) == ("numa-align/numa-7", 7)
    assert servicer.devices == resource.devices


async def allocated_over_grpc(
    servicer: NumaDevicePluginServicer, sock_dir: Path, request: api_pb2.AllocateRequest
) -> api_pb2.AllocateResponse:
    """``servicer``'s answer to ``request`` over a real unix-socket gRPC server; the
    servicer is closed after."""
    server = UnixSocketServer(
        sock_dir / "near.sock",
        lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, s),
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            response: api_pb2.AllocateResponse = await stub.Allocate(request)
            return response
    finally:
        servicer.close()
        await server.stop(0)


async def test_allocate_of_a_near_resource_names_the_node_of_the_devices_given(
    sock_dir: Path,
) -> None:
    """A resource that follows a device on NUMA nodes 0 and 1: each container's
    NUMA_NODE is the node of the devices it got (both, comma-separated, when a policy
    that does not align gave it devices of both)."""
    from numa_device_plugin.plugin.advertised.build import near_resource
    from numa_device_plugin.plugin.model.near import Near
    from numa_device_plugin.topology.numa import NumaNode
    from numa_device_plugin.topology.plan import NodePlan
    from numa_device_plugin.topology.selectors import parse_selector

    plans = [NodePlan(NumaNode(id=i, cpus=frozenset({i})), advertised=True) for i in (0, 1)]
    resource = near_resource("numa-align", Near("md", parse_selector("block:md0")), plans, 2)
    response = await allocated_over_grpc(
        NumaDevicePluginServicer(resource),
        sock_dir,
        allocate_request(
            ["numa1-slot0000"], ["numa0-slot0001"], ["numa1-slot0001", "numa0-slot0000"]
        ),
    )
    assert [dict(c.envs)["NUMA_NODE"] for c in response.container_responses] == ["1", "0", "0,1"]


async def test_an_operators_stream_ending_is_not_the_kubelet_leaving(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """grpcurl opening and closing ListAndWatch once cut the kubelet's live stream (the
    plugin took any stream's end for the kubelet leaving) and counted for /readyz."""
    flags = ("--log-level", "debug", "--health-address", "127.0.0.1:0")
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        serve_process(two_nodes, sock_dir, *flags) as plugin,
    ):
        port = await bound_port(plugin, "health")
        await wait_all_live(kubelet, NAMES, timeout=20)
        await eventually(lambda: readyz(port)[0] == 200)
        target = f"unix://{sock_dir / 'numa-align_numa-0.sock'}"
        async with grpc.aio.insecure_channel(target) as operator:
            stream = api_pb2_grpc.DevicePluginStub(operator).ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert len(first.devices) == 100
        closed = await logged(plugin, "ListAndWatch closed")
        assert closed["kubelet"] is False
        assert closed["resource"] == "numa-align/numa-0"
        events = [line["event"] for line in plugin.events()]
        assert "ListAndWatch stream lost: the kubelet went away" not in events
        assert "serving and registering again" not in events
        assert accepted(kubelet) == 2
        assert all(kubelet.live(name) for name in NAMES)
        assert (await asyncio.to_thread(readyz, port))[0] == 200
        # The kubelet's own stream still counts: dropping it brings a re-registration.
        await kubelet.clients["numa-align/numa-0"].channel.close()
        await logged(plugin, "ListAndWatch stream lost: the kubelet went away")
        await kubelet.wait_until(lambda: accepted(kubelet) == 3)
        await wait_all_live(kubelet, NAMES)


@pytest.mark.parametrize("length", [1_000_000])
async def test_a_huge_device_id_gets_a_bounded_refusal_and_log_line(
    two_nodes: SysfsTree, sock_dir: Path, length: int
) -> None:
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(two_nodes, sock_dir) as plugin:
        await wait_all_live(kubelet, NAMES, timeout=20)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate("numa-align/numa-1", ["z" * length, "numa1-slot0000"])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len((caught.value.details() or "").encode()) <= 1024
        await logged(plugin, "Allocate refused")
        refused = [line for line in plugin.log().splitlines() if "Allocate refused" in line]
        assert len(refused) == 1
        assert len(refused[0].encode()) <= 2048, "the log line carries the bounded message"
        response = await kubelet.allocate("numa-align/numa-1", ["numa1-slot0000"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "1"}


def four_node_near_resource() -> Resource:
    """A resource that follows a device on NUMA nodes 0-3, 100 slots on each."""
    devices = tuple(
        device for node in range(4) for device in build_resource("numa-align", node, 100).devices
    )
    return Resource(name="numa-align/data", node_id=0, devices=devices, near_nodes=(0, 1, 2, 3))


@pytest.mark.parametrize(
    ("available_per_node", "must", "size", "expected_node"),
    [
        ({0: 100, 1: 100, 2: 100, 3: 100}, [], 2, 0),  # a tie: the lowest id
        ({0: 10, 1: 50, 2: 50, 3: 100}, [], 2, 3),  # the most available
        ({0: 1, 1: 3, 2: 3, 3: 0}, [], 3, 1),
        ({0: 100, 1: 100, 2: 100, 3: 100}, ["numa2-slot0050"], 3, 2),  # the must-include's
    ],
)
def test_preferred_allocation_of_a_multi_node_resource_stays_on_one_numa_node(
    available_per_node: dict[int, int], must: list[str], size: int, expected_node: int
) -> None:
    """Asked for 2 of a 4-node selection's 400 devices it gave nodes 3 and 0 (ties in set
    order), and Allocate then said NUMA_NODE=0,3."""
    resource = four_node_near_resource()
    by_id = {device.id: device for device in resource.devices}
    servicer = NumaDevicePluginServicer(resource)
    try:
        available = [
            f"numa{node}-slot{index:04d}"
            for node, count in available_per_node.items()
            for index in range(count)
        ]
        available += [device for device in must if device not in available]
        for order in (available, list(reversed(available))):
            request = preferred(order, must, size).container_requests[0]
            chosen = requests.preferred(by_id, request, "container request 0")
            assert len(chosen) == size
            assert {device.split("-")[0] for device in chosen} == {f"numa{expected_node}"}
            assert set(must) <= set(chosen)
            assert servicer._numa_node(chosen) == str(expected_node)
    finally:
        servicer.close()


def test_preferred_allocation_spills_to_the_next_node_only_when_one_cannot_hold_it() -> None:
    resource = four_node_near_resource()
    by_id = {device.id: device for device in resource.devices}
    available = ["numa0-slot0000", "numa1-slot0000", "numa1-slot0001", "numa3-slot0007"]
    request = preferred(available, [], 3).container_requests[0]
    assert requests.preferred(by_id, request, "c") == [
        "numa1-slot0000",
        "numa1-slot0001",
        "numa0-slot0000",
    ]


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["numa1-slot0000"], "nvme1n1"),
        (["numa0-slot0003"], "nvme0n1,0000:01:00.0"),
        (["numa0-slot0000", "numa1-slot0001"], "nvme0n1,0000:01:00.0,nvme1n1"),
        (["numa3-slot0000"], ""),  # a node with none of its devices listed
    ],
)
def test_allocate_tells_the_container_the_devices_on_the_nodes_it_got(
    ids: list[str], expected: str
) -> None:
    """A DPDK or RDMA process needs the address or name, not only NUMA_NODE."""
    resource = four_node_near_resource()
    near = Near("data-disk", parse_selector("serial:S1"))
    served = replace(
        resource,
        near=near,
        near_devices=((0, ("nvme0n1", "0000:01:00.0")), (1, ("nvme1n1",))),
    )
    servicer = NumaDevicePluginServicer(served)
    try:
        envs = servicer._envs(ids)
        assert envs["NUMA_NEAR_DATA_DISK"] == expected
        assert envs["NUMA_NODE"] == ",".join(sorted({i[4] for i in ids}))
        assert "NUMA_NEAR_DATA_DISK" not in NumaDevicePluginServicer(resource)._envs(ids)
    finally:
        servicer.close()


async def test_allocate_never_writes_nor_fails_on_a_hostile_device_name(sock_dir: Path) -> None:
    """Names from a hostile sysfs (a newline and a variable, an escape, a comma, a
    non-UTF-8 byte as Python holds it) never reach the container's environment, and
    Allocate answers; a device listed on two nodes (a dual-port drive) is named once."""
    from numa_device_plugin.plugin.advertised.build import near_resource
    from numa_device_plugin.plugin.model.near import Near
    from numa_device_plugin.topology.numa import NumaNode
    from numa_device_plugin.topology.plan import NodePlan
    from numa_device_plugin.topology.selectors import parse_selector

    plans = [NodePlan(NumaNode(id=i, cpus=frozenset({i})), advertised=True) for i in (0, 1)]
    resource = near_resource("numa-align", Near("nl", parse_selector("block:md0")), plans, 2)
    hostile = ("evil\nINJECTED=1", "x\x1b]0;t\x07", "d,sda", "d\udcff", "")
    served = replace(resource, near_devices=((0, ("nvme0n1", *hostile)), (1, ("nvme0n1", "sdb"))))
    response = await allocated_over_grpc(
        NumaDevicePluginServicer(served),
        sock_dir,
        allocate_request(["numa0-slot0000"], ["numa0-slot0001", "numa1-slot0000"]),
    )
    values = [dict(c.envs)["NUMA_NEAR_NL"] for c in response.container_responses]
    assert values == ["nvme0n1", "nvme0n1,sdb"]
