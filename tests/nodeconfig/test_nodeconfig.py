"""Per-node configuration: the file of named configurations, the node label that picks
one, the supervisor that follows it, and real ``serve`` processes reading the label
from a stand-in API server."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
import structlog

from numa_device_plugin.cli import main
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.nodeconfig.configs import (
    CONFIG_LABEL,
    MAX_FILE_BYTES,
    NodeConfigError,
    load_node_configs,
    parse_node_configs,
    resolve,
)
from numa_device_plugin.nodeconfig.labels import NodeLabelReader
from numa_device_plugin.nodeconfig.supervisor import ConfigSupervisor, Selection, label_selection
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.model.resources import CPUS
from numa_device_plugin.plugin.reports.snapshot import PluginState
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.apiserver_stub import node_api
from tests.standin_helpers import ServeProcess, bound_port, eventually, serve_process

R0 = "numa-align/numa-0"
R1 = "numa-align/numa-1"
FILE = Path("/etc/numa-device-plugin/configs.yaml")
BASE: dict[str, Any] = {"socket_dir": Path("/var/lib/kubelet/device-plugins")}

POOLS = """
default: slots
configs:
  slots:
    capacity: 5
  exact:
    capacity: cpus
    reserved-cpus: "0"
    pod-resources-interval: 0.5
  plain: {}
"""


# -- the file ---------------------------------------------------------------------------------


def test_each_pool_maps_the_same_near_name_to_its_own_device() -> None:
    """One name for every server, each pool's selector for its own disk."""
    text = """
configs:
  a: {near: {data-disk: "serial:S-A", nic: "net:ens1f0"}}
  b: {near: {data-disk: "wwid:eui.0b"}}
"""
    configs = parse_node_configs(FILE, text, BASE)
    assert [str(n) for n in configs.configs["a"]["near"]] == [
        "data-disk=serial:S-A",
        "nic=net:ens1f0",
    ]
    assert [str(n) for n in configs.configs["b"]["near"]] == ["data-disk=wwid:eui.0b"]


def test_a_near_name_with_a_list_takes_selectors_that_must_all_agree() -> None:
    """One name for a data path and a NIC (as Ceph's OSD wants): a list of selectors."""
    text = """
configs:
  osd: {near: {osd: ["path:/var/lib/ceph", "net:ens1f0"], data: "path:/mnt/disks/a"}}
"""
    configs = parse_node_configs(FILE, text, BASE)
    near = configs.configs["osd"]["near"]
    assert [str(n) for n in near] == [
        "osd=path:/var/lib/ceph & net:ens1f0",
        "data=path:/mnt/disks/a",
    ]
    for bad in ("{osd: [1]}", "{osd: []}", "{osd: [[a]]}"):
        with pytest.raises(NodeConfigError, match="is not NAME: SELECTOR text"):
            parse_node_configs(FILE, f"configs: {{a: {{near: {bad}}}}}", BASE)


def test_a_file_parses_into_overrides_of_the_flags() -> None:
    configs = parse_node_configs(FILE, POOLS, BASE)
    assert configs.default == "slots"
    assert configs.configs == {
        "slots": {"capacity": 5},
        "exact": {
            "capacity": CPUS,
            "reserved_cpus": frozenset({0}),
            "pod_resources_interval": 0.5,
        },
        "plain": {},
    }


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("configs: [", "is not YAML"),
        ("- a\n- b\n", "expected a mapping with 'configs'"),
        ("", "expected a mapping with 'configs'"),
        ("configs: {a: {}}\nextra: 1\n", "unknown key 'extra'"),
        ("configs: {}\n", "'configs' must map at least one name"),
        ("default: a\n", "'configs' must map at least one name"),
        ("configs: {'-a': {}}\n", "configuration '-a': a name must be a valid label value"),
        ("configs: {'a b': {}}\n", "a name must be a valid label value"),
        ("configs: {a: 3}\n", "configuration 'a': expected a mapping of settings, got 3"),
        ("configs: {a: {capcity: 3}}\n", "configuration 'a': unknown setting 'capcity'"),
        ("configs: {a: {capacity: lots}}\n", "capacity: 'lots' is not a whole number or 'cpus'"),
        ("configs: {a: {capacity: 0}}\n", "configuration 'a': capacity:"),
        ("configs: {a: {capacity: true}}\n", "capacity: True is not a text or a number"),
        ("configs: {a: {reserved-cpus: 0-x}}\n", "reserved-cpus: '0-x' is not a cpulist"),
        ("configs: {a: {reserved-cpus: '0'}}\n", "only applies with --capacity cpus"),
        ("configs: {a: {pod-resources-interval: 0.01}}\n", "below the floor"),
        ("configs: {a: {allow-unaligned: 'yes'}}\n", "allow-unaligned: 'yes' is not true or false"),
        ("configs: {a: {resource-prefix: 'UPPER'}}\n", "configuration 'a': resource-prefix:"),
        (
            "configs: {a: {capacity: cpus, include-cpuless-nodes: true}}\n",
            "CPU-less node",
        ),
        # A fault in a configuration no node uses still stops every node: a rollout
        # halts at its first node instead of reaching the pool that uses it.
        ("configs: {a: {}, b: {capacity: -1}}\n", "configuration 'b'"),
        ("default: c\nconfigs: {a: {}}\n", "default 'c' names no configuration"),
        ("configs: {a: {near: serial:S1}}\n", "near: expected a mapping of NAME: SELECTOR"),
        ("configs: {a: {near: {disk: [1]}}}\n", "is not NAME: SELECTOR text"),
        ("configs: {a: {near: {disk: 'sn:S1'}}}\n", "near: 'sn:S1' is not a selector"),
        ("configs: {a: {near: {numa-1: 'serial:S1'}}}\n", "would collide with the NUMA-node"),
        ("configs: {a: {resource-prefix: x, near: {'d/e': 'serial:S'}}}\n", "without the prefix"),
    ],
)
def test_a_malformed_file_is_refused_naming_file_configuration_and_fault(
    text: str, fault: str
) -> None:
    with pytest.raises(NodeConfigError) as caught:
        parse_node_configs(FILE, text, BASE)
    assert str(FILE) in str(caught.value)
    assert fault in str(caught.value)
    assert not caught.value.transient


def test_an_unreadable_oversized_or_binary_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NodeConfigError, match=r"cannot read .*missing\.yaml"):
        load_node_configs(tmp_path / "missing.yaml", BASE)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_FILE_BYTES)
    with pytest.raises(NodeConfigError, match="is over 1048576 bytes"):
        load_node_configs(big, BASE)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"configs: {a: {}}\n\xff\xfe")
    with pytest.raises(NodeConfigError, match="is not UTF-8"):
        load_node_configs(binary, BASE)


@pytest.mark.parametrize(
    ("text", "labels", "name", "capacity"),
    [
        (POOLS, {CONFIG_LABEL: "exact"}, "exact", CPUS),
        (POOLS, {CONFIG_LABEL: "plain"}, "plain", 100),
        (POOLS, {}, "slots", 5),  # no label: the default
        (POOLS, {"other": "exact"}, "slots", 5),
        ("configs: {a: {capacity: 7}}\n", {}, None, 100),  # no label, no default: the flags
    ],
)
def test_the_label_chooses_the_configuration(
    text: str, labels: dict[str, str], name: str | None, capacity: object
) -> None:
    configs = parse_node_configs(FILE, text, BASE)
    chosen, config = resolve(configs, "n1", labels, BASE)
    assert (chosen, config.capacity) == (name, capacity)


@pytest.mark.parametrize("value", ["nope", "", "Slots"])
def test_a_label_naming_no_configuration_is_an_error_never_the_default(value: str) -> None:
    configs = parse_node_configs(FILE, POOLS, BASE)
    with pytest.raises(NodeConfigError) as caught:
        resolve(configs, "n1", {CONFIG_LABEL: value}, BASE)
    assert str(caught.value) == (
        f"node n1: label {CONFIG_LABEL}={value!r} names no configuration in {FILE} "
        "(it has: exact, plain, slots)"
    )


# -- reading the label --------------------------------------------------------------------------


def test_the_reader_reads_the_nodes_labels_and_names_each_failure(tmp_path: Path) -> None:
    with node_api("n1", tmp_path, {CONFIG_LABEL: "exact", "zone": "a"}) as (api, kubeconfig):
        reader = NodeLabelReader("n1", kubeconfig)
        assert reader.read() == {CONFIG_LABEL: "exact", "zone": "a"}
        assert api.reads == 1

        api.status = 403
        with pytest.raises(NodeConfigError, match=r"403 .*needs get on nodes") as caught:
            reader.read()
        assert not caught.value.transient, "RBAC does not mend itself"
        api.status = 503
        with pytest.raises(NodeConfigError, match="cannot read node n1: 503") as caught:
            reader.read()
        assert caught.value.transient
        api.status = 200
        with pytest.raises(NodeConfigError, match="node n2 does not exist") as caught:
            NodeLabelReader("n2", kubeconfig).read()
        assert not caught.value.transient
    with pytest.raises(NodeConfigError, match="cannot reach the API server") as caught:
        reader.read()  # the stub is gone
    assert caught.value.transient


def test_a_broken_kubeconfig_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: []\n")
    with pytest.raises(
        NodeConfigError,
        match=f"cannot configure the API client: kubeconfig {broken}: no context named None",
    ):
        NodeLabelReader("n1", broken).read()


def test_a_file_error_names_the_label_and_its_value(tmp_path: Path) -> None:
    path = tmp_path / "configs.yaml"
    path.write_text("configs: {a: {capacity: lots}}\n")
    with node_api("n1", tmp_path, {CONFIG_LABEL: "a"}) as (_, kubeconfig):
        select = label_selection(path, "n1", kubeconfig, BASE)
        with pytest.raises(NodeConfigError) as caught:
            select()
    assert str(caught.value).startswith(f"node n1 (label {CONFIG_LABEL} 'a'): {path}")


# -- the supervisor, with managers that only record -------------------------------------------


class RecordingManager:
    """Stands for a PluginManager: serves until stopped, counts reloads."""

    def __init__(self, config: Config, log: list[str], fail: Exception | None = None) -> None:
        self.config = config
        self.log = log
        self.fail = fail
        self.reloads = 0
        self._stopped = asyncio.Event()

    def readiness_problems(self) -> list[str]:
        return []

    def snapshot(self) -> PluginState:
        return PluginState(taken_at=0.0, config=self.config)

    def stop(self) -> None:
        self._stopped.set()

    def reload(self) -> None:
        self.reloads += 1

    async def serve(self) -> None:
        self.log.append(f"start {self.config.capacity}")
        if self.fail is not None:
            raise self.fail
        await self._stopped.wait()
        self.log.append(f"stop {self.config.capacity}")


class Choices:
    """A ``select`` returning, or raising, what the test set last."""

    def __init__(self) -> None:
        self.answer: Selection | NodeConfigError = NodeConfigError("nothing yet")

    def __call__(self) -> Selection:
        if isinstance(self.answer, NodeConfigError):
            raise self.answer
        return self.answer


def config(capacity: int | str) -> Config:
    return config_from_params({**BASE, "capacity": capacity})


@asynccontextmanager
async def supervising(choices: Choices, log: list[str]) -> AsyncIterator[ConfigSupervisor]:
    def make(chosen: Config) -> PluginManager:
        return cast(PluginManager, RecordingManager(chosen, log))

    supervisor = ConfigSupervisor(choices, make, interval=3600)
    task = asyncio.create_task(supervisor.serve())
    try:
        yield supervisor
    finally:
        supervisor.stop()
        await asyncio.wait_for(task, 10)


async def look(supervisor: ConfigSupervisor) -> None:
    """Ask for a look now and wait until it is done (the interval is an hour)."""
    done = supervisor.looks
    supervisor.reload()
    await eventually(lambda: supervisor.looks > done)


async def test_the_supervisor_follows_the_choice_and_serves_nothing_without_one() -> None:
    choices, log = Choices(), list[str]()
    choices.answer = ("slots", config(5))
    async with supervising(choices, log) as supervisor:
        await eventually(lambda: log == ["start 5"])
        assert supervisor.readiness_problems() == []
        state = supervisor.snapshot()  # /debug/state: what is served and why
        assert state.config == config(5)
        assert state.configuration is not None
        assert state.configuration["name"] == "slots"
        assert "numa-align/config" in state.configuration["why"]

        # The same choice again: the manager reloads (SIGHUP), nothing restarts.
        first = supervisor.manager
        await look(supervisor)
        assert supervisor.manager is first
        assert cast(RecordingManager, first).reloads == 1
        assert log == ["start 5"]

        # The label now names another configuration: the old manager stops first.
        choices.answer = ("exact", config(CPUS))
        await look(supervisor)
        await eventually(lambda: log == ["start 5", "stop 5", "start cpus"])

        # It names none: nothing is served, and the probe says why.
        choices.answer = NodeConfigError("label numa-align/config='nope' names no configuration")
        await look(supervisor)
        await eventually(lambda: log[-1] == "stop cpus" and supervisor.manager is None)
        assert supervisor.readiness_problems() == [
            "no configuration served: label numa-align/config='nope' names no configuration"
        ]
        state = supervisor.snapshot()
        assert state.config is None
        assert state.problems == tuple(supervisor.readiness_problems())
        assert state.configuration == {"name": "", "why": supervisor.problem}

        # An API outage now keeps nothing (there is nothing) and stays unready.
        choices.answer = NodeConfigError("cannot reach the API server", transient=True)
        await look(supervisor)
        assert supervisor.manager is None
        assert supervisor.readiness_problems() == [
            "no configuration served: cannot reach the API server"
        ]

        choices.answer = ("slots", config(5))
        await look(supervisor)
        await eventually(lambda: log[-1] == "start 5")
        assert supervisor.readiness_problems() == []
    assert log[-1] == "stop 5"


async def test_an_api_outage_keeps_the_configuration_served() -> None:
    choices, log = Choices(), list[str]()
    choices.answer = ("exact", config(CPUS))
    async with supervising(choices, log) as supervisor:
        await eventually(lambda: log == ["start cpus"])
        served = supervisor.manager
        choices.answer = NodeConfigError("cannot reach the API server", transient=True)
        for _ in range(3):
            await look(supervisor)
        assert supervisor.manager is served
        assert supervisor.readiness_problems() == []
        assert log == ["start cpus"]

        # Not transient (RBAC taken away, the node deleted): nothing is served.
        choices.answer = NodeConfigError("cannot read node n1: 403 Forbidden")
        await look(supervisor)
        assert supervisor.manager is None
        assert log == ["start cpus", "stop cpus"]


async def test_without_any_choice_at_start_nothing_is_served() -> None:
    choices, log = Choices(), list[str]()
    choices.answer = NodeConfigError("cannot reach the API server", transient=True)
    async with supervising(choices, log) as supervisor:
        await eventually(lambda: supervisor.looks >= 1)
        assert supervisor.manager is None
        assert log == []
        assert supervisor.readiness_problems() == [
            "no configuration served: cannot reach the API server"
        ]


async def test_a_failing_manager_ends_the_supervisor_with_its_error() -> None:
    choices, log = Choices(), list[str]()
    choices.answer = ("slots", config(5))

    def make(chosen: Config) -> PluginManager:
        return cast(PluginManager, RecordingManager(chosen, log, OSError("cannot lock")))

    supervisor = ConfigSupervisor(choices, make, interval=3600)
    with pytest.raises(OSError, match="cannot lock"):
        await asyncio.wait_for(supervisor.serve(), 10)
    assert log == ["start 5"]


# -- real serve processes against the stand-ins -------------------------------------------------


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError as error:  # not listening yet
        return 0, str(error)


def counts(kubelet: KubeletStandIn) -> tuple[int, int] | None:
    """Healthy devices of numa-0 and numa-1 while both are live, else None."""
    if not (kubelet.live(R0) and kubelet.live(R1)):
        return None
    return kubelet.allocatable(R0), kubelet.allocatable(R1)


@asynccontextmanager
async def per_node(
    tree: SysfsTree, folder: Path, labels: dict[str, str], configs: str
) -> AsyncIterator[tuple[KubeletStandIn, ServeProcess, Any, Path, int]]:
    """The kubelet stand-in (CPU 0 reserved), the API stand-in with node n1 and its
    ``labels``, the file ``configs``, and ``serve`` choosing by the label every 0.2 s:
    ``(kubelet, plugin, api, file, metrics port)``."""
    path = folder / "configs.yaml"
    path.write_text(configs)
    standin = KubeletStandIn(
        folder / "dp", pod_resources_dir=folder / "pr", allocatable_cpus=range(1, 8)
    )
    with node_api("n1", folder, labels) as (api, kubeconfig):
        args = (
            "--pod-resources-socket", str(folder / "pr" / "kubelet.sock"),
            "--pod-resources-interval", "0.2",
            "--config-file", str(path),
            "--node-name", "n1",
            "--kubeconfig", str(kubeconfig),
            "--node-config-interval", "0.2",
            "--metrics-address", "127.0.0.1:0",  # the probes and /debug/state
        )  # fmt: skip
        async with standin as kubelet, serve_process(tree, folder / "dp", *args) as plugin:
            yield kubelet, plugin, api, path, await bound_port(plugin, "metrics")


def debug_state(port: int) -> Any:
    """The plugin's ``/debug/state``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/state", timeout=5) as answer:
        return json.load(answer)


async def test_serve_follows_the_nodes_label(two_nodes: SysfsTree, sock_dir: Path) -> None:
    async with per_node(two_nodes, sock_dir, {CONFIG_LABEL: "exact"}, POOLS) as (
        kubelet, plugin, api, _, port,
    ):  # fmt: skip
        # "exact": one device per exclusive CPU, CPU 0 reserved.
        await kubelet.wait_until(lambda: counts(kubelet) == (3, 4), timeout=20)
        await eventually(lambda: readyz(port)[0] == 200)
        state = debug_state(port)
        assert state["configuration"]["name"] == "exact"
        assert state["config"]["capacity"] == "cpus"

        api.labels[CONFIG_LABEL] = "slots"
        await kubelet.wait_until(lambda: counts(kubelet) == (5, 5), timeout=20)

        # A name the file does not have: nothing is served, never the default.
        api.labels[CONFIG_LABEL] = "nope"
        await kubelet.wait_until(lambda: not kubelet.live(R0) and not kubelet.live(R1), 20)
        await eventually(lambda: readyz(port)[0] == 503)
        text = readyz(port)[1]
        assert f"label {CONFIG_LABEL}='nope' names no configuration" in text
        # /debug/state is rendered at most once a second, like /metrics.
        await eventually(lambda: debug_state(port)["config"] is None)
        state = debug_state(port)
        assert (state["config"], state["configuration"]["name"]) == (None, "")
        assert "'nope' names no configuration" in state["configuration"]["why"]
        assert not list((sock_dir / "dp").glob("numa-*.sock")), "sockets removed"

        # The label removed: the default ("slots").
        del api.labels[CONFIG_LABEL]
        await kubelet.wait_until(lambda: counts(kubelet) == (5, 5), timeout=20)
        await eventually(lambda: readyz(port)[0] == 200)
        assert await plugin.terminate() == 0
    nothing = [e for e in plugin.events() if e["event"] == "serving nothing"]
    assert len(nothing) == 1, "one line per reason, not one per look"
    assert nothing[0]["label"] == CONFIG_LABEL
    assert "'nope' names no configuration" in nothing[0]["reason"]
    served = [e["configuration"] for e in plugin.events() if e["event"].startswith("serving the")]
    assert served == ["exact", "slots", "slots"]


async def test_serve_with_a_malformed_file_serves_nothing_until_it_is_mended(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    broken = POOLS.replace("capacity: cpus", "capacity: all")
    async with per_node(two_nodes, sock_dir, {CONFIG_LABEL: "exact"}, broken) as (
        kubelet, plugin, _, path, port,
    ):  # fmt: skip
        await eventually(lambda: "no configuration served" in readyz(port)[1], timeout=20)
        status, text = readyz(port)
        assert status == 503
        assert f"label {CONFIG_LABEL} 'exact'" in text
        assert "capacity: 'all' is not a whole number or 'cpus'" in text
        assert kubelet.registrations == []
        assert plugin.process.poll() is None, "unready, not crashing"

        # A ConfigMap update rewrites the file: it is read again.
        path.write_text(POOLS)
        await kubelet.wait_until(lambda: counts(kubelet) == (3, 4), timeout=20)
        assert await plugin.terminate() == 0
    nothing = [e for e in plugin.events() if e["event"] == "serving nothing"]
    assert [e["label"] for e in nothing] == [CONFIG_LABEL]


async def test_serve_without_access_to_the_node_stays_unready(
    two_nodes: SysfsTree, sock_dir: Path
) -> None:
    async with per_node(two_nodes, sock_dir, {}, POOLS) as (kubelet, plugin, api, _, port):
        api.status = 403
        # It may have served the default before the 403 took effect; it stops then.
        await eventually(lambda: "needs get on nodes" in readyz(port)[1], timeout=20)
        await kubelet.wait_until(lambda: not kubelet.live(R0), timeout=20)
        api.status = 200
        await kubelet.wait_until(lambda: counts(kubelet) == (5, 5), timeout=20)
        assert await plugin.terminate() == 0


@pytest.mark.parametrize(
    ("flags", "fault"),
    [
        (["--config-file", "c.yaml"], "--config-file needs this node's name"),
        (["--node-name", "n1"], "only applies with --config-file"),
        (["--kubeconfig", "k"], "only applies with --config-file"),
        (["--config-file", "c.yaml", "--node-name", "Node_1"], "is not a node name"),
        (
            ["--config-file", "c.yaml", "--node-name", "n1", "--node-config-interval", "0"],
            "Invalid value for '--node-config-interval': '0' must be a positive number",
        ),
    ],
)
def test_bad_per_node_flags_exit_2(
    flags: list[str],
    fault: str,
    two_nodes: SysfsTree,
    sock_dir: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from numa_device_plugin.cli import serve

    async def never_serve(*args: object, **kwargs: object) -> int:
        return 0  # a flag wrongly accepted exits 0 here instead of serving for ever

    monkeypatch.setattr(serve, "serve", never_serve)
    argv = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Usage:" in err
    assert fault in err


class SlowManager:
    """A manager whose teardown takes ``teardown`` seconds; ``made`` lists them all."""

    made: ClassVar[list[SlowManager]] = []

    def __init__(self, config: Config, teardown: float = 0.3) -> None:
        self.config = config
        self.teardown = teardown
        self.stopping = asyncio.Event()
        self.finished = False
        SlowManager.made.append(self)

    def readiness_problems(self) -> list[str]:
        return []

    def stop(self) -> None:
        self.stopping.set()

    def reload(self) -> None:
        pass

    async def serve(self) -> None:
        await self.stopping.wait()
        await asyncio.sleep(self.teardown)
        self.finished = True


async def test_a_stop_during_a_configuration_switch_starts_nothing_new() -> None:
    SlowManager.made = []
    first, second = config_from_params({"capacity": 3}), config_from_params({"capacity": 4})
    choices: list[Any] = [("a", first), ("b", second)]

    def select() -> Any:
        return choices[0] if len(choices) == 1 else choices.pop(0)

    supervisor = ConfigSupervisor(select, SlowManager, interval=0.05)  # type: ignore[arg-type]
    task = asyncio.create_task(supervisor.serve())
    while not SlowManager.made or not SlowManager.made[0].stopping.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # the switch to "b" is retiring "a" now
    supervisor.stop()
    await asyncio.wait_for(task, 5)
    assert [manager.config for manager in SlowManager.made] == [first], "b never started"
    assert SlowManager.made[0].finished, "a was torn down in full"
    assert supervisor.manager is None


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

    def make(config: Config) -> Any:
        return RecordingManager(config, [])

    supervisor = ConfigSupervisor(select, make, interval=0.01)
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
