"""The metrics recorder made after registration (:class:`DeferredRecorder`): registering
does not wait for prometheus-client, and nothing recorded before is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.figures import OURS, NodeCapacity
from numa_device_plugin.plugin.model.recorder import Recorder
from numa_device_plugin.plugin.model.resources import Device
from numa_device_plugin.plugin.reports import deferred as deferred_module
from numa_device_plugin.plugin.reports.deferred import DeferredRecorder
from numa_device_plugin.plugin.reports.prometheus import PrometheusRecorder
from numa_device_plugin.topology.fake import SysfsTree
from numa_device_plugin.topology.numa import NumaNode
from numa_device_plugin.topology.plan import NodePlan
from tests.plugin.test_manager import NAMES, make_config
from tests.standin_helpers import eventually, past, running, wait_all_live

NODES = tuple(NodePlan(NumaNode(n, frozenset({n}), 1 << 30, {0: 10, 1: 21}), True) for n in (0, 1))
DEVICES = {name: 5 for name in NAMES}


class Noted(DeferredRecorder[PrometheusRecorder]):
    """A deferred recorder that notes, on the loop and at once, each time a timer asks
    for the real recorder to be made (the making itself runs in a worker thread)."""

    def __init__(self) -> None:
        super().__init__(PrometheusRecorder)
        self.asked: list[float] = []

    def _load_soon(self) -> None:
        self.asked.append(time.monotonic())
        super()._load_soon()


def feed(recorder: Recorder) -> None:
    """One of each event, in the order a start and a few Allocates make them."""
    recorder.topology(NODES, DEVICES)
    recorder.near({"numa-align/disk": [1]})
    recorder.registration(NAMES[0], False)
    recorder.registration(NAMES[0], True)
    recorder.registered(NAMES[0], True)
    recorder.registration(NAMES[1], True)
    recorder.registered(NAMES[1], True)
    recorder.devices(NAMES[1], [Device("numa1-slot0000", 1, 0, "Unhealthy")])
    capacity = NodeCapacity(0, NAMES[0], frozenset({0, 1}), frozenset({0}), frozenset(),
                            frozenset({"numa0-slot0000"}), 2, 1, 0)  # fmt: skip
    recorder.capacity([capacity], {0: {"memory": 1 << 30}}, {(0, "memory", OURS): 1 << 20})
    recorder.pod_resources(True, 1_000_000.0)
    recorder.kubelet_restart()
    recorder.allocated(NAMES[0], 0.0004, True)
    recorder.allocated(NAMES[0], 0.002, False)
    recorder.registered(NAMES[1], False)


def ours(text: bytes) -> list[str]:
    """The plugin's own series (not the process's, the GC's or the age that moves)."""
    return [
        line
        for line in text.decode().splitlines()
        if line.startswith(("numa_node", "numa_device_plugin"))
        and not line.startswith("numa_device_plugin_pod_resources_last_read_age")
    ]


def test_calls_before_the_recorder_is_made_are_replayed_as_if_it_had_been_there() -> None:
    direct = PrometheusRecorder()
    feed(direct)
    deferred = DeferredRecorder(PrometheusRecorder)
    feed(deferred)
    assert not deferred.loaded
    assert ours(deferred.load().render()) == ours(direct.render())
    # Later calls go straight to it, and load() gives the same recorder again.
    for recorder in (direct, deferred):
        recorder.allocated(NAMES[1], 0.001, True)
        recorder.kubelet_restart()
    assert deferred.load() is deferred.load()
    assert ours(deferred.load().render()) == ours(direct.render())
    assert "numa_device_plugin_kubelet_restarts_total 2.0" in ours(direct.render())


def test_calls_made_while_the_recorder_is_being_made_are_not_lost() -> None:
    """A scrape makes it in a worker thread while the loop goes on recording."""
    making, release = threading.Event(), threading.Event()

    def slow() -> PrometheusRecorder:
        making.set()
        assert release.wait(10)
        return PrometheusRecorder()

    deferred = DeferredRecorder(slow)
    deferred.topology(NODES, DEVICES)
    loader = threading.Thread(target=deferred.load)
    loader.start()
    assert making.wait(10)
    for _ in range(3):
        deferred.allocated(NAMES[0], 0.001, True)
    release.set()
    loader.join(10)
    deferred.allocated(NAMES[0], 0.001, True)
    text = "\n".join(ours(deferred.load().render()))
    assert f'numa_device_plugin_allocations_total{{resource="{NAMES[0]}"}} 4.0' in text


async def test_the_recorder_is_made_once_every_resource_registered_not_before(
    two_nodes: SysfsTree, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[set[str]] = []  # what was registered when it was made
    manager: PluginManager | None = None

    def make() -> PrometheusRecorder:
        assert manager is not None
        made.append(set(manager.registered))
        return PrometheusRecorder()

    monkeypatch.setattr(deferred_module, "SETTLE", 0.05)
    deferred = DeferredRecorder(make)
    deferred.start()
    config = make_config(two_nodes, sock_dir)
    try:
        async with running(config, recorder=deferred) as manager:
            await eventually(manager.acted)  # found no kubelet: nothing registers
            await past(deferred_module.SETTLE * 3)
            assert not deferred.loaded, "no kubelet: nothing registered, nothing made"
            async with KubeletStandIn(sock_dir) as kubelet:
                await wait_all_live(kubelet, NAMES)
                await eventually(lambda: deferred.loaded)
                assert made == [set(NAMES)]
                await kubelet.allocate(NAMES[1], ["numa1-slot0000"])
                text = "\n".join(ours(deferred.load().render()))
    finally:
        deferred.stop()
    for name in NAMES:
        assert f'numa_device_plugin_registrations_total{{resource="{name}"}} 1.0' in text
    assert f'numa_device_plugin_allocations_total{{resource="{NAMES[1]}"}} 1.0' in text


async def test_without_a_registration_the_recorder_is_made_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deferred_module, "DEADLINE", 0.2)
    deferred = DeferredRecorder(PrometheusRecorder)
    deferred.topology(NODES, DEVICES)
    deferred.registration(NAMES[0], False)
    started = time.monotonic()
    deferred.start()
    try:
        await eventually(lambda: deferred.loaded, timeout=5)
    finally:
        deferred.stop()
    assert time.monotonic() - started >= 0.2
    text = "\n".join(ours(deferred.load().render()))
    assert f'numa_device_plugin_registration_failures_total{{resource="{NAMES[0]}"}} 1.0' in text


async def test_a_stopped_recorder_is_made_by_nothing_but_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deferred_module, "DEADLINE", 0.05)
    monkeypatch.setattr(deferred_module, "SETTLE", 0.05)
    deferred = Noted()
    deferred.start()
    deferred.topology(NODES, DEVICES)
    deferred.stop()
    for name in NAMES:
        deferred.registered(name, True)
    await past(max(deferred_module.DEADLINE, deferred_module.SETTLE) * 3)
    assert (deferred.asked, deferred.loaded) == ([], False)
    assert deferred.load() is deferred.load()


async def test_one_resource_registered_of_two_makes_nothing_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deferred_module, "SETTLE", 0.05)
    deferred = Noted()
    deferred.start()
    try:
        deferred.topology(NODES, DEVICES)
        deferred.registered(NAMES[0], True)
        deferred.registered(NAMES[1], False)
        await past(deferred_module.SETTLE * 3)
        assert (deferred.asked, deferred.loaded) == ([], False)
        deferred.registered(NAMES[1], True)
        await eventually(lambda: deferred.loaded, timeout=5)
    finally:
        deferred.stop()


# Prints a line to stderr when the serve process imports prometheus-client (an audit
# hook, installed by sitecustomize before serve runs).
IMPORT_WATCH = """\
import sys

def _hook(event, args):
    if event == "import" and args[0] == "prometheus_client":
        sys.stderr.write("AUDIT prometheus_client imported\\n")
        sys.stderr.flush()

sys.addaudithook(_hook)
"""


async def test_serve_makes_its_metrics_after_registering_without_waiting_for_a_scrape(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """serve starts its deferred recorder: prometheus-client is imported once every
    resource has registered (no scrape comes), not before registering and not at the
    first scrape (registering must not wait for it, and neither should the first one)."""
    from tests.standin_helpers import serve_process

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(IMPORT_WATCH)
    marker = "AUDIT prometheus_client imported"
    async with KubeletStandIn(sock_dir) as kubelet, serve_process(
        two_nodes, sock_dir, "--metrics-address", "127.0.0.1:0", "--capacity", "5",
        env={"PYTHONPATH": f"{hooks}:{Path(__file__).resolve().parents[2]}"},
    ) as plugin:  # fmt: skip
        await wait_all_live(kubelet, NAMES, plugin=plugin)
        log = plugin.log()
        assert "registered with the kubelet" in log
        registered = log.index("registered with the kubelet")
        assert marker not in log[:registered], "prometheus-client before registering"
        # SETTLE after the last registration, DEADLINE at the latest: no scrape asked
        await eventually(lambda: marker in plugin.log(), timeout=deferred_module.DEADLINE + 10)
