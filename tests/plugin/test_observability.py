"""Metrics, /healthz, /readyz and the health command, against the kubelet stand-in."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_device_plugin.cli import main
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.ops.probes import MAX_SCRAPES, ProbeServer, parse_address
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import (
    ServeProcess,
    bound_port,
    eventually,
    serve_process,
    wait_all_live,
)


@asynccontextmanager
async def observed(config: object) -> AsyncIterator[tuple[PluginManager, int]]:
    """A manager with Prometheus metrics and a probe listener on an ephemeral port."""
    recorder = PrometheusRecorder()
    manager = PluginManager(config, recorder=recorder)  # type: ignore[arg-type]
    probes = ProbeServer(("127.0.0.1", 0), manager.readiness_problems, recorder.render)
    await probes.start()
    task = asyncio.create_task(manager.serve())
    try:
        yield manager, probes.port
    finally:
        manager.stop()
        await asyncio.wait_for(task, 10)
        await probes.stop()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return values[(name, tuple(sorted(labels.items())))]


async def test_metrics_after_registration_and_allocations(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        observed(make_config(two_nodes, sock_dir)) as (
            manager,
            port,
        ),
    ):
        await wait_all_live(kubelet, NAMES)
        for _ in range(3):
            await kubelet.allocate("numa-align/numa-1", ["numa1-slot0000"])
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.allocate("numa-align/numa-1", ["bogus"])
        await eventually(lambda: manager.registered == set(NAMES))
        status, text = await asyncio.to_thread(get, port, "/metrics")
    assert status == 200
    v = samples(text)
    assert value(v, "numa_node_cpus_count", numa_node="0") == 4
    assert value(v, "numa_node_memory_bytes", numa_node="1") == 1024**3
    assert value(v, "numa_node_distance", numa_node="0", to_numa_node="1") == 21
    assert value(v, "numa_node_advertised", numa_node="1") == 1
    assert not [key for key in v if key[0].endswith("_created")], "no *_created series"
    assert value(v, "process_resident_memory_bytes") > 0
    assert any(key[0] == "python_info" for key in v)
    assert any(key[0] == "python_gc_collections_total" for key in v)
    assert value(v, "numa_device_plugin_kubelet_restarts_total") == 0
    for family in ("numa_node_cpus_count", "numa_node_memory_bytes", "numa_node_advertised"):
        labels = {label for key in v if key[0] == family for label, _ in key[1]}
        assert labels == {"numa_node"}, family
    r1 = {"resource": "numa-align/numa-1"}
    assert value(v, "numa_device_plugin_devices", health="Healthy", **r1) == 5
    assert value(v, "numa_device_plugin_devices", health="Unhealthy", **r1) == 0
    assert value(v, "numa_device_plugin_allocations_total", **r1) == 3
    assert value(v, "numa_device_plugin_allocate_errors_total", **r1) == 1
    assert value(v, "numa_device_plugin_allocate_duration_seconds_count", **r1) == 4
    assert value(v, "numa_device_plugin_registrations_total", **r1) == 1
    assert value(v, "numa_device_plugin_registration_failures_total", **r1) == 0
    assert value(v, "numa_device_plugin_registered", **r1) == 1
    build = [key for key in v if key[0] == "numa_device_plugin_build_info"]
    assert len(build) == 1
    assert dict(build[0][1])["version"]


async def test_readyz_goes_503_while_the_kubelet_is_down(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    kubelet = KubeletStandIn(sock_dir)
    await kubelet.start()
    try:
        async with observed(make_config(two_nodes, sock_dir)) as (manager, port):
            await wait_all_live(kubelet, NAMES)
            await manager.wait_settled()  # registered, and the devices read after
            await eventually(lambda: manager.registered == set(NAMES))
            assert await asyncio.to_thread(get, port, "/readyz") == (200, "ok\n")
            assert await asyncio.to_thread(get, port, "/healthz") == (200, "ok\n")
            await kubelet.stop()
            await eventually(lambda: not manager.registered)
            status, body = await asyncio.to_thread(get, port, "/readyz")
            assert status == 503
            assert sorted(body.splitlines()) == [
                "numa-align/numa-0: not registered with the kubelet",
                "numa-align/numa-1: not registered with the kubelet",
            ]
            assert (await asyncio.to_thread(get, port, "/healthz"))[0] == 200
            await kubelet.restart()
            await wait_all_live(kubelet, NAMES)
            await eventually(lambda: manager.registered == set(NAMES))
            assert await asyncio.to_thread(get, port, "/readyz") == (200, "ok\n")
            v = samples((await asyncio.to_thread(get, port, "/metrics"))[1])
            # One kubelet restart counts once, whatever the number of resources.
            assert value(v, "numa_device_plugin_kubelet_restarts_total") == 1
            for name in NAMES:
                assert value(v, "numa_device_plugin_registrations_total", resource=name) == 2
    finally:
        await kubelet.stop()


async def test_healthz_gets_no_answer_while_the_event_loop_is_stuck(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """The listener is the event loop's: a stuck loop answers nothing, and the kubelet's
    probe fails by its timeout; once the loop runs again, so do the answers."""
    import threading
    import time

    async with observed(make_config(two_nodes, sock_dir)) as (_, port):
        answers: list[object] = []

        def probe_while_blocked() -> None:
            time.sleep(0.1)  # the event loop is blocked by then
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.3):
                    answers.append("answered")
            except TimeoutError as exc:
                answers.append(type(exc))

        prober = threading.Thread(target=probe_while_blocked)
        prober.start()
        time.sleep(0.8)  # noqa: ASYNC251 - block the event loop, as a stuck plugin would
        await asyncio.to_thread(prober.join)
        assert answers == [TimeoutError]
        assert await asyncio.to_thread(get, port, "/healthz") == (200, "ok\n")


async def test_unknown_path_is_404(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with observed(make_config(two_nodes, sock_dir)) as (_, port):
        assert (await asyncio.to_thread(get, port, "/nope"))[0] == 404


async def test_health_command_exit_codes(
    two_nodes: SysfsTree, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        KubeletStandIn(sock_dir) as kubelet,
        observed(make_config(two_nodes, sock_dir)) as (
            manager,
            port,
        ),
    ):
        address = f"127.0.0.1:{port}"
        await wait_all_live(kubelet, NAMES)
        await manager.wait_settled()  # registered, and the devices read after
        await eventually(lambda: manager.registered == set(NAMES))
        assert await asyncio.to_thread(main, ["health", "--address", address]) == 0
        assert (
            await asyncio.to_thread(main, ["health", "--address", address, "--check", "healthz"])
            == 0
        )
        await kubelet.stop()
        await eventually(lambda: not manager.registered)
        assert await asyncio.to_thread(main, ["health", "--address", address]) == 1
        assert "not registered" in capsys.readouterr().err
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free_port = closed.getsockname()[1]
    closed.close()
    assert await asyncio.to_thread(main, ["health", "--address", f"127.0.0.1:{free_port}"]) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [(":9201", ("0.0.0.0", 9201)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["9201", "host:", ":99999", "a:b"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(text)


def test_bad_metrics_address_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--metrics-address", "nine-two"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


@asynccontextmanager
async def serving(tree: SysfsTree, folder: Path, *flags: str) -> AsyncIterator[ServeProcess]:
    """A real `serve` process on ``tree`` and ``folder`` with ``flags`` (listeners on
    ``127.0.0.1:0``, their ports read with ``bound_port``), registered with a stand-in;
    Allocate still answers at the end, and SIGTERM must exit 0."""
    async with KubeletStandIn(folder) as kubelet, serve_process(tree, folder, *flags) as plugin:
        await wait_all_live(kubelet, NAMES, timeout=20)
        yield plugin
        response = await kubelet.allocate("numa-align/numa-0", ["numa0-slot0001"])
        assert dict(response.container_responses[0].envs) == {"NUMA_NODE": "0"}
        assert await plugin.terminate() == 0, plugin.log()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_thousand_scrapes_leave_a_real_plugin_serving_and_its_memory_flat(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with serving(two_nodes, sock_dir, "--metrics-address", "127.0.0.1:0") as plugin:
        port, pid = await bound_port(plugin, "metrics"), plugin.pid

        def scrape(times: int) -> None:
            for _ in range(times):
                status, text = get(port, "/metrics")
                assert status == 200
                assert "numa_device_plugin_registered" in text

        await asyncio.to_thread(scrape, 100)  # warm up
        before = _rss(pid)
        await asyncio.to_thread(scrape, 1000)
        after = _rss(pid)
        assert after <= before * 1.05, f"RSS grew from {before} to {after} bytes"
        assert await asyncio.to_thread(get, port, "/readyz") == (200, "ok\n")


async def test_both_listeners_serve_the_probes_and_only_one_the_metrics(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    flags = [*("--metrics-address", "127.0.0.1:0"), *("--health-address", "127.0.0.1:0")]
    async with serving(two_nodes, sock_dir, *flags) as plugin:
        metrics_port = await bound_port(plugin, "metrics")
        health_port = await bound_port(plugin, "health")

        def ready() -> bool:
            try:
                return get(health_port, "/readyz")[0] == 200
            except OSError:
                return False

        await eventually(ready, timeout=10)
        assert (await asyncio.to_thread(get, health_port, "/healthz"))[0] == 200
        for path in ("/metrics", "/", "/debug/state"):
            assert (await asyncio.to_thread(get, health_port, path))[0] == 404, path
        assert (await asyncio.to_thread(get, metrics_port, "/metrics"))[0] == 200
        status, page = await asyncio.to_thread(get, metrics_port, "/")
        assert status == 200
        assert page.count('class="numa-node"') == 2
        status, text = await asyncio.to_thread(get, metrics_port, "/debug/state")
        assert status == 200
        state = json.loads(text)
        assert state["ready"] is True
        assert sorted(state["resources"]) == ["numa-align/numa-0", "numa-align/numa-1"]
        assert all(r["registered"] and r["kubelet_stream"] for r in state["resources"].values())
        assert await asyncio.to_thread(get, metrics_port, "/readyz") == (200, "ok\n")
        assert await asyncio.to_thread(get, metrics_port, "/healthz") == (200, "ok\n")


async def test_content_types_carry_a_charset() -> None:
    pages = (dict, lambda _: b"<html></html>", lambda _: b"{}")
    probes = ProbeServer(("127.0.0.1", 0), list, lambda: b"x 1\n", pages=pages)

    def content_type(path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{probes.port}{path}", timeout=5) as r:
            return str(r.headers["Content-Type"])

    await probes.start()
    try:
        assert await asyncio.to_thread(content_type, "/metrics") == (
            "text/plain; version=0.0.4; charset=utf-8"
        )
        assert await asyncio.to_thread(content_type, "/readyz") == "text/plain; charset=utf-8"
        assert await asyncio.to_thread(content_type, "/") == "text/html; charset=utf-8"
        assert await asyncio.to_thread(content_type, "/debug/state") == "application/json"
    finally:
        await probes.stop()


def test_a_resource_no_longer_advertised_loses_its_registered_series() -> None:
    """Left at 0, a vanished resource's series would read as a registration missing
    forever (the chart's NumaDevicePluginNotRegistered alert); its stopping endpoint's
    last word must not bring it back."""
    recorder = PrometheusRecorder()
    r0, r1 = "numa-align/numa-0", "numa-align/numa-1"
    recorder.topology((), {r0: 4, r1: 4})
    recorder.registered(r0, True)
    recorder.registered(r1, True)
    recorder.topology((), {r0: 4})  # NUMA node 1 lost its CPUs
    recorder.registered(r1, False)  # its endpoint stops afterwards
    assert registered(recorder) == {r0: 1.0}
    recorder.topology((), {r0: 4, r1: 2})  # back
    assert registered(recorder) == {r0: 1.0, r1: 0.0}, "a new resource starts at 0"


async def test_a_device_change_that_changes_no_resource_leaves_them_registered(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    """A NIC hot-plugged changes no resource: nothing registers again, and the
    registered series stay at 1 (they fell to 0 once, firing the chart's
    NumaDevicePluginNotRegistered alert on every such node)."""
    from numa_device_plugin.topology.fake import DeviceTree

    async with (
        KubeletStandIn(sock_dir) as kubelet,
        observed(make_config(two_nodes, sock_dir)) as (manager, port),
    ):
        await wait_all_live(kubelet, NAMES)
        await manager.wait_settled()
        devices = DeviceTree(two_nodes.root)
        devices.pci("0000:42:00.0", 1, "0x020000")
        devices.nic("ens1", "0000:42:00.0")
        await manager.device_watch.look()
        await eventually(lambda: manager.catalog.discovery is not None
                         and len(manager.catalog.discovery.inventory.pci) == 1)  # fmt: skip
        await manager.wait_settled()
        status, text = await asyncio.to_thread(get, port, "/metrics")
    assert status == 200
    v = samples(text)
    for name in NAMES:
        assert value(v, "numa_device_plugin_registered", resource=name) == 1
        assert value(v, "numa_device_plugin_registrations_total", resource=name) == 1


def registered(recorder: PrometheusRecorder) -> dict[str, float]:
    """Resource -> value of the recorder's numa_device_plugin_registered series."""
    v = samples(recorder.render().decode())
    return {dict(k[1])["resource"]: x for k, x in v.items() if k[0].endswith("_registered")}


def test_the_documented_families_are_every_family_each_with_a_series() -> None:
    """The docs' metrics reference lists these: none may be missing its labels."""
    from numa_device_plugin.plugin.reports.prometheus import documented_families

    families = documented_families()
    assert all(family.samples for family in families), [f.name for f in families if not f.samples]
    names = {family.name for family in families}
    served = {
        line.split(" ")[2]
        for line in PrometheusRecorder().render().decode().splitlines()
        if line.startswith("# TYPE ")
    }
    assert served <= names | {f"{n}_total" for n in names}


async def test_debug_state_is_rendered_off_the_loop_and_shared_like_a_scrape() -> None:
    """Ten clients at once get one rendering of /debug/state, made in a worker thread
    (it lists every holder: on the loop it would hold up the probes); beyond
    MAX_SCRAPES answers under way, the rest are refused at once, as scrapes are."""
    import threading

    threads: list[str] = []

    def debug_state(state: object) -> bytes:
        threads.append(threading.current_thread().name)
        time.sleep(0.2)  # a slow rendering: the other requests arrive meanwhile
        return b'{"ok": true}'

    pages = (dict, lambda _: b"<html></html>", debug_state)
    probes = ProbeServer(("127.0.0.1", 0), list, lambda: b"x 1\n", pages=pages)
    await probes.start()
    loop = asyncio.get_running_loop()
    # Clients on their own threads: the server renders on the default executor's.
    with ThreadPoolExecutor(10) as clients:
        try:
            answers = await asyncio.gather(
                *(
                    loop.run_in_executor(clients, get, probes.port, "/debug/state")
                    for _ in range(10)
                )
            )
        finally:
            await probes.stop()
    served = answers.count((200, '{"ok": true}'))
    assert served >= MAX_SCRAPES
    assert answers.count((503, "too many scrapes at once\n")) == 10 - served, "bounded"
    assert len(threads) == 1, "one rendering shared"
    assert threads[0] != threading.main_thread().name


def test_near_resources_are_metrics_with_their_numa_nodes_and_whether_advertised() -> None:
    recorder = PrometheusRecorder()
    recorder.near({"numa-align/md": [0, 1], "numa-align/gone": []})
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(recorder.render().decode())
        for s in family.samples
        if s.name.startswith("numa_device_plugin_near")
    }
    assert samples == {
        ("numa_device_plugin_near_advertised", (("resource", "numa-align/md"),)): 1,
        ("numa_device_plugin_near_advertised", (("resource", "numa-align/gone"),)): 0,
        (
            "numa_device_plugin_near_numa_node",
            (("numa_node", "0"), ("resource", "numa-align/md")),
        ): 1,
        (
            "numa_device_plugin_near_numa_node",
            (("numa_node", "1"), ("resource", "numa-align/md")),
        ): 1,
    }
    recorder.near({"numa-align/md": [1]})  # the device moved: node 0's series goes
    text = recorder.render()
    assert b'numa_device_plugin_near_numa_node{numa_node="0"' not in text
    assert b'numa_device_plugin_near_numa_node{numa_node="1",resource="numa-align/md"} 1' in text
    assert b'resource="numa-align/gone"' not in text
    recorder.near({})  # a reload without --near: the series go
    assert b"numa_device_plugin_near_advertised{" not in recorder.render()
    assert b"numa_device_plugin_near_numa_node{" not in recorder.render()


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


@pytest.mark.parametrize("how", ["flag", "variable"])
async def test_debug_endpoints_false_closes_the_node_page_and_debug_state_not_the_metrics(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """`--debug-endpoints=false` (or NUMA_DEBUG_ENDPOINTS=false): the metrics listener
    answers 404 for the pages that name pods and devices, and still serves /metrics
    and the probes."""
    flags = ["--metrics-address", "127.0.0.1:0"]
    if how == "flag":
        flags.append("--debug-endpoints=false")
    else:
        monkeypatch.setenv("NUMA_DEBUG_ENDPOINTS", "False")
    async with serving(two_nodes, sock_dir, *flags) as plugin:
        port = await bound_port(plugin, "metrics")
        for path in ("/", "/debug/state"):
            assert (await asyncio.to_thread(get, port, path))[0] == 404, path
        status, text = await asyncio.to_thread(get, port, "/metrics")
        assert status == 200
        assert "numa_device_plugin_registered" in text
        # Ready once the devices are read too, a moment after registering.
        await eventually(lambda: get(port, "/readyz") == (200, "ok\n"))


def test_a_debug_endpoints_value_that_is_not_a_boolean_exits_2_with_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--debug-endpoints", "maybe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "'maybe' is not a valid boolean" in err
