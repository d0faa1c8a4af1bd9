"""Tests that bite, round three: one test per one-line mutant that a mutation run left
alive in code written since the last audit (each named in its docstring). Every test
here fails with its mutant applied; equivalent mutants were removed from the code."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.view import KubeletView
from numa_device_plugin.nodeconfig.configs import (
    MAX_FILE_BYTES,
    NodeConfigError,
    load_node_configs,
    parse_node_configs,
)
from numa_device_plugin.nodeconfig.supervisor import ConfigSupervisor
from numa_device_plugin.ops.probes import ProbeServer
from numa_device_plugin.ops.wakeups import Wakeups
from numa_device_plugin.plugin import endpoint as endpoint_module
from numa_device_plugin.plugin.catalog import Catalog
from numa_device_plugin.plugin.config import Config
from numa_device_plugin.plugin.devices import build_resource
from numa_device_plugin.plugin.discovery import discover
from numa_device_plugin.plugin.endpoint import Endpoint, Endpoints
from numa_device_plugin.plugin.poller import CapacityPoller
from numa_device_plugin.plugin.recorder import NullRecorder
from numa_device_plugin.plugin.servicer import NumaDevicePluginServicer
from numa_device_plugin.plugin.status import build_status, render_table
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.memory import format_quantity, parse_reserved_memory
from tests.topology.test_numamemory import GI, M1, block, machine

BASE: dict[str, Any] = {"socket_dir": Path("/var/lib/kubelet/device-plugins")}
MEMORY_WARNING = "the kubelet's Memory Manager is not Static"


# -- numamemory.py ----------------------------------------------------------------------------


def test_zero_bytes_format_as_zero() -> None:
    """Mutant: the zero guard in ``format_quantity`` removed (0 became ``0Ei``)."""
    assert format_quantity(0) == "0"
    assert format_quantity(1) == "1"


@pytest.mark.parametrize(
    "text",
    ["0:memory=1Gi;;1:memory=2Gi", ";0:memory=1Gi;1:memory=2Gi", "0:memory=1Gi; ;1:memory=2Gi"],
)
def test_an_empty_reserved_memory_entry_is_skipped_not_the_end(text: str) -> None:
    """Mutant: ``continue`` -> ``break`` on an empty ``;`` entry (node 1 was lost)."""
    assert parse_reserved_memory(text) == ((0, "memory", GI), (1, "memory", 2 * GI))


# -- capacity.py ------------------------------------------------------------------------------


def test_over_assigned_memory_leaves_only_the_held_devices_healthy(tmp_path: Path) -> None:
    """The clamp of free units (``max(0, ...)``) was an equivalent mutant: a negative
    free count already meant none free. It is gone; this pins the rule it stood for."""
    from numa_device_plugin.plugin.capacity import live_memory_devices
    from tests.topology.test_numamemory import healthy, memory_resource, view

    resource = memory_resource(tmp_path)
    held = {M1: ["numa1-mem0003"]}
    over = view({1: {"memory": 2 * GI}}, [(held, [block("memory", 5 * GI, [1])])])
    assert healthy(live_memory_devices(resource, over)) == ["numa1-mem0003"]


# -- poller.py --------------------------------------------------------------------------------


class ScriptedClient:
    """The pod resources client, answering the views given, one per read."""

    def __init__(self, views: list[KubeletView]) -> None:
        self.views = views

    async def view(self, timeout: float, *, allocatable: bool) -> KubeletView:
        return self.views.pop(0)

    async def close(self) -> None:
        pass


def memory_poller(tmp_path: Path, **overrides: Any) -> CapacityPoller:
    config = config_from_params(
        {"sysfs_root": machine(tmp_path).root, "memory_unit": GI, **overrides}
    )
    catalog = Catalog(lambda resource: NumaDevicePluginServicer(resource))
    catalog.update(discover(config))
    return CapacityPoller(config, catalog, NullRecorder())


def no_memory_view(pods: int) -> KubeletView:
    """A kubelet whose Memory Manager is not Static (no memory), with ``pods``
    containers each holding CPU ``pods`` (so successive views differ)."""
    from numa_device_plugin.kubelet.view import Holder

    holders = tuple(Holder("ns", f"p{i}", "c", frozenset({i})) for i in range(pods))
    return KubeletView(frozenset(range(8)), holders)


def test_allow_unaligned_also_keeps_memory_devices_from_being_withheld(tmp_path: Path) -> None:
    """Mutant: ``--allow-unaligned`` ignored in ``memory_unaligned()``."""
    strict = memory_poller(tmp_path / "strict")
    strict.view = no_memory_view(0)
    assert strict.memory_unaligned()
    assert strict.withheld(M1)
    allowed = memory_poller(tmp_path / "allowed", allow_unaligned=True)
    allowed.view = no_memory_view(0)
    assert not allowed.memory_unaligned()
    assert not allowed.withheld(M1)


async def test_the_memory_warning_is_said_once_per_change_not_per_read(tmp_path: Path) -> None:
    """Mutant: the memory warning no longer deduplicated (one line per changed read)."""
    poller = memory_poller(tmp_path)
    poller.client = ScriptedClient([no_memory_view(n) for n in range(4)])  # type: ignore[assignment]
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            await poller.poll_once()
    said = [entry for entry in logs if entry["event"].startswith(MEMORY_WARNING)]
    assert len(said) == 1
    assert M1 in said[0]["resources"]


# -- nodeconfig.py ----------------------------------------------------------------------------


def test_the_file_limit_is_exact(tmp_path: Path) -> None:
    """Mutant: an off-by-one at the 1 MiB file limit."""
    body = "configs: {a: {}}\n"
    path = tmp_path / "configs.yaml"
    path.write_text(body + "#" * (MAX_FILE_BYTES - len(body) - 1) + "\n")
    assert path.stat().st_size == MAX_FILE_BYTES
    assert set(load_node_configs(path, BASE).configs) == {"a"}
    path.write_text(body + "#" * (MAX_FILE_BYTES - len(body)) + "\n")
    with pytest.raises(NodeConfigError, match=f"is over {MAX_FILE_BYTES} bytes"):
        load_node_configs(path, BASE)


def test_a_configuration_name_of_63_characters_is_a_label_value() -> None:
    """Mutant: an off-by-one refusing 63-character label values."""
    name = "a" * 63
    assert set(parse_node_configs(Path("f"), f"configs: {{{name}: {{}}}}", BASE).configs) == {name}
    with pytest.raises(NodeConfigError, match="a name must be a valid label value"):
        parse_node_configs(Path("f"), f"configs: {{{name}a: {{}}}}", BASE)


def test_a_null_configuration_means_the_flags_alone() -> None:
    """Mutant: a null configuration (``name:`` with nothing after it) refused."""
    configs = parse_node_configs(Path("f"), "configs:\n  plain:\n", BASE)
    assert configs.configs == {"plain": {}}


# -- supervisor.py ----------------------------------------------------------------------------


class RecordingManager:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stopped = asyncio.Event()

    def readiness_problems(self) -> list[str]:
        return []

    def stop(self) -> None:
        self.stopped.set()

    def reload(self) -> None:
        pass

    async def serve(self) -> None:
        await self.stopped.wait()


async def test_a_transient_failure_is_warned_about_once_while_it_lasts() -> None:
    """Mutant: the transient warning logged at every look."""
    config = config_from_params({})
    outcomes: list[Any] = [
        ("a", config),
        *[NodeConfigError("cannot read node n1: 503", transient=True)] * 4,
    ]

    def select() -> Any:
        outcome = outcomes.pop(0) if outcomes else ("a", config)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    supervisor = ConfigSupervisor(select, RecordingManager, interval=0.01)  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(supervisor.serve())
        while supervisor.looks < 7:  # noqa: ASYNC110 - counting looks
            await asyncio.sleep(0.01)
        supervisor.stop()
        await asyncio.wait_for(task, 5)
    kept = [e for e in logs if e["event"].startswith("cannot read the node's label; keeping")]
    assert len(kept) == 1
    served = [e for e in logs if e["event"] == "serving the node's configuration"]
    assert len(served) == 1, "the outage kept the manager; the same choice changed nothing"


# -- probes.py --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/nope"])
async def test_head_is_answered_without_a_body(path: str) -> None:
    """Mutant: HEAD answered with a body."""
    probes = ProbeServer(("127.0.0.1", 0), list, lambda: b"x 1\n")
    await probes.start()
    try:

        def ask() -> bytes:
            with socket.create_connection(("127.0.0.1", probes.port), timeout=5) as client:
                client.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                data = b""
                while chunk := client.recv(4096):
                    data += chunk
                return data

        answer = await asyncio.to_thread(ask)
    finally:
        await probes.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert body == b""
    assert b"Content-Length: 0" not in head, "the length of the body a GET would get"


# -- endpoint.py ------------------------------------------------------------------------------


@pytest.fixture
def endpoints_config(two_nodes: SysfsTree, sock_dir: Path) -> Config:
    return Config(sysfs_root=two_nodes.root, socket_dir=sock_dir, register_timeout=1.0)


def an_endpoint(config: Config) -> Endpoint:
    resource = build_resource("numa-align", 0, 3)
    return Endpoint(config, resource, NumaDevicePluginServicer(resource), (1, 2, 3))


def recording_endpoints(config: Config, registered: list[str]) -> Endpoints:
    return Endpoints(
        config, NullRecorder(), on_registered=registered.append, on_change=lambda: None
    )


async def test_a_registration_finishing_after_its_endpoint_was_replaced_does_not_count(
    endpoints_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: a stale registration of a replaced endpoint counted."""

    async def accepted(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(endpoint_module, "register", accepted)
    seen: list[str] = []
    endpoints = recording_endpoints(endpoints_config, seen)
    old, new = an_endpoint(endpoints_config), an_endpoint(endpoints_config)
    endpoints._running[old.resource.name] = new
    await endpoints.keep_registering(old)
    assert endpoints.registered == set()
    assert seen == []
    endpoints._running[new.resource.name] = new
    await endpoints.keep_registering(new)
    assert endpoints.registered == {new.resource.name}
    assert seen == [new.resource.name]


async def test_stopping_ends_the_registration_and_the_registered_state(
    endpoints_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants: the ``await`` on the cancelled registration dropped (it ran on after
    stop returned); stopped endpoints left in ``registered``."""
    gate = asyncio.Event()

    async def slow(*args: object, **kwargs: object) -> None:
        try:
            await gate.wait()
        finally:  # as register's channel does: closing it takes a few loop turns
            await asyncio.sleep(0.2)

    monkeypatch.setattr(endpoint_module, "register", slow)
    endpoints = recording_endpoints(endpoints_config, [])
    resource = build_resource("numa-align", 0, 3)
    await endpoints.start(resource, NumaDevicePluginServicer(resource), (1, 2, 3))
    running = endpoints.running[resource.name]
    await endpoints.stop([resource.name], 0.1)
    assert running.registration is not None
    assert running.registration.done(), "stop returns once the registration has ended"

    gate.set()
    fast = build_resource("numa-align", 1, 3)
    await endpoints.start(fast, NumaDevicePluginServicer(fast), (1, 2, 3))
    registration = endpoints.running[fast.name].registration
    assert registration is not None
    await registration
    assert endpoints.registered == {fast.name}
    await endpoints.stop([fast.name], 0.1)
    assert endpoints.registered == set()


# -- status.py --------------------------------------------------------------------------------


def memory_status_of(tmp_path: Path, size: int, devices: list[str], total: int) -> Any:
    config = config_from_params({"sysfs_root": machine(tmp_path).root, "memory_unit": GI})
    pods = pr_pb2.ListPodResourcesResponse()
    container = pods.pod_resources.add(name="pg", namespace="db").containers.add(
        name="pg", memory=[block("memory", size, [1])]
    )
    container.devices.add(resource_name=M1, device_ids=devices)
    allocatable = pr_pb2.AllocatableResourcesResponse()
    allocatable.memory.append(block("memory", total, [1]))
    document = build_status(discover(config), config, pods, allocatable)
    (entry,) = [e for e in document["memory"] if e["resource"] == M1]
    return document, entry


def test_a_holder_asks_units_rounded_up(tmp_path: Path) -> None:
    """Mutant: ceil -> floor in the MISCOUNTED check (1.5 GiB asks 2 units)."""
    document, entry = memory_status_of(
        tmp_path, 3 * GI // 2, ["numa1-mem0000", "numa1-mem0001"], 7 * GI
    )
    assert [h["problem"] for h in entry["holders"]] == [None]
    assert document["miscounted"] == 0


def test_free_units_never_go_below_zero(tmp_path: Path) -> None:
    """Mutant: the clamp of free units removed (more assigned than allocatable)."""
    _, entry = memory_status_of(tmp_path, 9 * GI, ["numa1-mem0000"], 7 * GI)
    assert entry["free_units"] == 0


@pytest.mark.parametrize("static", [True, False])
def test_the_memory_manager_line_shows_only_when_it_is_not_static(
    tmp_path: Path, static: bool
) -> None:
    """Mutant: the Memory Manager warning shown when the policy *is* Static."""
    document, _ = memory_status_of(tmp_path, GI, ["numa1-mem0000"], 7 * GI if static else 0)
    if not static:
        document = {**document, "memory_manager_static": False}
    text = render_table(document)
    line = "the kubelet lists no allocatable memory: its Memory Manager policy is not Static"
    assert (line in text) is not static


def test_status_flags_a_cpus_mode_holder_with_other_devices_than_cpus(tmp_path: Path) -> None:
    """The cpus-mode MISCOUNTED check (a path no test ran)."""
    tree = machine(tmp_path)
    config = config_from_params({"sysfs_root": tree.root, "capacity": "cpus"})
    pods = pr_pb2.ListPodResourcesResponse()
    container = pods.pod_resources.add(name="pg", namespace="db").containers.add(
        name="pg", cpu_ids=[2, 3]
    )
    container.devices.add(resource_name="numa-align/numa-1", device_ids=["numa1-cpu0002"])
    allocatable = pr_pb2.AllocatableResourcesResponse(cpu_ids=list(range(4)))
    document = build_status(discover(config), config, pods, allocatable)
    assert document["miscounted"] == 1
    text = render_table(document)
    assert "aligned, MISCOUNTED: 1 device(s) for 2 exclusive CPUs" in text


# -- wakeups.py -------------------------------------------------------------------------------


async def test_a_reload_stays_pending_until_taken() -> None:
    """Mutant: ``pending`` ignoring a reload (after the reasons were drained)."""
    wakeups = Wakeups()
    wakeups.reload()
    wakeups.drain()
    assert wakeups.pending
    assert wakeups.take_reload()
    assert not wakeups.pending


async def test_no_debounce_once_stopping() -> None:
    """Mutant: the debounce applied while stopping (a SIGTERM waited it out)."""
    wakeups = Wakeups()
    wakeups.stop()
    started = time.monotonic()
    await asyncio.wait_for(wakeups.sleep(None, debounce=30.0), 5)
    assert time.monotonic() - started < 1
