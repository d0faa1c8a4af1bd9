"""Reading the pod resources API when the kubelet's pods change (``--cgroup-root``):
a real ``serve`` process, the kubelet stand-in and a kubepods folder made by the test
as the kubelet makes a Guaranteed pod's cgroup."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.counts.schedule import SIGNALLED_INTERVAL, ReadSchedule
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.plugin.test_capacity import R1, cpus_mode
from tests.standin_helpers import ServeProcess, bound_port, eventually, wait_all_live

ABSENT = "no kubelet kubepods cgroup folder under --cgroup-root"
WATCHED = "when a Guaranteed pod's cgroup comes or goes"


async def debug_state(plugin: ServeProcess) -> Any:
    """The plugin's ``/debug/state`` document (its metrics listener)."""
    port = await bound_port(plugin, "metrics")

    def get() -> Any:
        url = f"http://127.0.0.1:{port}/debug/state"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)

    return await asyncio.to_thread(get)


async def reads_settled(kubelet: KubeletStandIn, quiet: float = 1.0) -> None:
    """Until no List call came for ``quiet`` seconds (the plugin's reads after its
    registrations are over)."""
    while True:
        seen = kubelet.pod_resources_calls
        await asyncio.sleep(quiet)
        if kubelet.pod_resources_calls == seen:
            return


async def quiet_for(plugin: ServeProcess, seconds: float, timeout: float = 30.0) -> None:
    """Until the plugin's /debug/state says its last pod resources read is ``seconds``
    old; TimeoutError after ``timeout`` (a plugin that keeps reading)."""
    async with asyncio.timeout(timeout):
        while (await debug_state(plugin))["pod_resources"]["age_seconds"] < seconds:  # noqa: ASYNC110 - another process: poll it
            await asyncio.sleep(0.1)


async def test_a_guaranteed_pods_cpus_count_when_its_cgroup_appears_not_an_interval_later(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """While the kubepods folder is watched, the 0.2 s interval is a 60 s backstop
    (no reads while nothing changes), and a foreign Guaranteed pod's CPUs are counted
    within seconds of its cgroup folder, and freed when it goes. Mutants: the poller
    not told the signal is live; the watcher not wired to the poller; a signal that
    reads once but not again after it settles."""
    kubepods = tmp_path / "cgroup" / "kubepods"
    (kubepods / "burstable").mkdir(parents=True)
    flags = ("--cgroup-root", str(tmp_path / "cgroup"), "--metrics-address", "127.0.0.1:0")
    async with cpus_mode(two_nodes, sock_dir, *flags) as (kubelet, plugin):
        await wait_all_live(kubelet, ["numa-align/numa-0", R1], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        # The watch starts at the plugin's first accepted registration, which the
        # stand-in can see live a moment before the plugin has the answer.
        await eventually(lambda: plugin.log().count(WATCHED) == 1)
        read = (await debug_state(plugin))["pod_resources"]
        assert (read["period_seconds"], read["on_change"]) == (60.0, True)

        await reads_settled(kubelet)  # the reads after the registrations are done

        # Admitted (CPUs assigned) before its cgroup exists: nothing reads yet.
        reads = kubelet.pod_resources_calls
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        # The plugin itself says it went 2 s (ten 0.2 s intervals) without a read while
        # it answered: an interval read would have come by then.
        await quiet_for(plugin, 2.0)
        assert kubelet.pod_resources_calls == reads, "read on the 0.2 s interval"
        assert kubelet.allocatable(R1) == 4
        (kubepods / "pod0001").mkdir()
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 2, timeout=5)

        # It terminates: its cgroup goes first, the kubelet drops it from its active
        # pods a moment later; the read after the signal settles sees that.
        reads = kubelet.pod_resources_calls
        (kubepods / "pod0001").rmdir()
        await eventually(lambda: kubelet.pod_resources_calls > reads, timeout=10)
        kubelet.remove_pod("web", "nginx")  # after the first read after the signal
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4, timeout=10)
        assert await plugin.terminate() == 0


async def test_without_a_kubepods_folder_the_interval_reads_as_before(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """A --cgroup-root without the kubelet's folder (not a node's) is said, /debug/state
    shows the interval, and the API is read on it (0.2 s here); a new kubelet looks
    again and says the absence at debug level. Mutants: the backstop used regardless;
    the absence said as a warning under every kubelet."""
    (tmp_path / "cgroup" / "system.slice").mkdir(parents=True)
    flags = ("--cgroup-root", str(tmp_path / "cgroup"), "--metrics-address", "127.0.0.1:0",
             "--log-format", "json", "--log-level", "debug")  # fmt: skip
    async with cpus_mode(two_nodes, sock_dir, *flags) as (kubelet, plugin):
        await wait_all_live(kubelet, ["numa-align/numa-0", R1], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        await eventually(lambda: ABSENT in plugin.log())
        read = (await debug_state(plugin))["pod_resources"]
        assert (read["period_seconds"], read["on_change"]) == (0.2, False)
        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 2, timeout=5)
        # A new kubelet looks again, and says the absence no more at warning level.
        await kubelet.restart()
        await wait_all_live(kubelet, ["numa-align/numa-0", R1], timeout=20)

        def said() -> list[str]:
            return [e["level"] for e in plugin.events() if e["event"].startswith(ABSENT)]

        await eventually(lambda: len(said()) == 2)
        assert said() == ["warning", "debug"]
        assert await plugin.terminate() == 0


async def test_a_kubepods_folder_replaced_is_watched_again_after_the_next_registration(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """The watch ends with its folder (the interval reads meanwhile); the kubelet's
    next registration (a kubelet restart, as after a change of cgroup driver) finds
    the new folder and watches it, and a pod's cgroup there is counted at once.
    Mutant: the watch made only at the first registration (the interval forever)."""
    kubepods = tmp_path / "cgroup" / "kubepods"
    kubepods.mkdir(parents=True)
    flags = ("--cgroup-root", str(tmp_path / "cgroup"), "--metrics-address", "127.0.0.1:0",
             "--pod-resources-interval", "3600")  # fmt: skip
    async with cpus_mode(two_nodes, sock_dir, *flags) as (kubelet, plugin):
        await wait_all_live(kubelet, ["numa-align/numa-0", R1], timeout=20)
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 4)
        await eventually(lambda: plugin.log().count(WATCHED) == 1)  # a moment after
        assert (await debug_state(plugin))["pod_resources"]["period_seconds"] == 3600.0

        kubepods.rmdir()  # the kubelet stops; its kubepods folder goes
        await reads_settled(kubelet, quiet=1.0)  # the read its removal asks for
        kubepods.with_name("kubepods.slice").mkdir()  # a kubelet with the systemd driver
        await kubelet.restart()
        await wait_all_live(kubelet, ["numa-align/numa-0", R1], timeout=20)
        # Said, then the new folder watched, at the plugin's registration (a moment
        # after the stand-in sees it live): a pod's cgroup made before is not seen.
        await eventually(lambda: plugin.log().count(WATCHED) == 2)
        assert "the kubepods cgroup folder's watch ended" in plugin.log()
        await reads_settled(kubelet, quiet=1.0)

        kubelet.add_pod("web", "nginx", [("nginx", {}, [5, 6])])
        (kubepods.with_name("kubepods.slice") / "pod0001").mkdir()
        await kubelet.wait_until(lambda: kubelet.allocatable(R1) == 2, timeout=5)
        assert await plugin.terminate() == 0


def test_the_interval_is_a_backstop_only_while_the_signal_is_live() -> None:
    schedule = ReadSchedule(5.0)
    live = False
    schedule.signalled = lambda: live
    assert schedule.period() == 5.0
    live = True
    assert schedule.period() == SIGNALLED_INTERVAL
    assert ReadSchedule(600.0).period() == 600.0, "a longer interval stays"


async def test_the_kubepods_watch_starts_at_a_registration_and_never_after_stop(
    two_nodes: SysfsTree, tmp_path: Path
) -> None:
    """Not before :meth:`Watches.ensure_kubepods` (the first registration), once for
    many registrations, and not at all once stopped (a registration that ends during
    shutdown). Mutant: ``stop`` leaving the watches able to start a new watch thread."""
    from numa_device_plugin.plugin.advertised.discovery import discover
    from numa_device_plugin.plugin.lifecycle.devicewatch import DeviceWatch
    from numa_device_plugin.plugin.lifecycle.watches import Watches
    from numa_device_plugin.plugin.serving.lock import LockKeeper

    (tmp_path / "cgroup" / "kubepods").mkdir(parents=True)
    (tmp_path / "dp").mkdir()
    config = Config(sysfs_root=two_nodes.root, socket_dir=tmp_path / "dp",
                    cgroup_root=tmp_path / "cgroup", device_interval=0)  # fmt: skip
    device_watch = DeviceWatch(config, discover, lambda: None, lambda: None)
    watches = Watches(config, lambda *_: None, LockKeeper(config.socket_dir, lambda: None),
                      device_watch, lambda: None)  # fmt: skip
    watches.start()
    try:
        assert not watches.pods_signalled, "nothing is watched before a registration"
        watches.ensure_kubepods((1, 1, 1))
        assert watches.pods_signalled
        first = watches._kubepods
        watches.ensure_kubepods((1, 1, 1))
        assert watches._kubepods is first, "a live watch is kept"
    finally:
        await watches.stop()
    watches.ensure_kubepods((1, 2, 2))
    assert not watches.pods_signalled
    assert watches._kubepods is None
