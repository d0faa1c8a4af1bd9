"""The command line: flags and env vars, exit 2 on bad values, discover output for every
snapshot, the demo, and a real `serve` process under SIGHUP and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import click
import pytest

from numa_device_plugin import __version__
from numa_device_plugin.cli import main, options, serve
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.conftest import REPO
from tests.standin_helpers import eventually, wait_all_live
from tests.topology.test_topology import SNAPSHOT_TABLE

NAMES = ["numa-align/numa-0", "numa-align/numa-1"]


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"numa-device-plugin {__version__}"


# The serve flags and their variables, written out: the contract with the DaemonSet and
# with operators' scripts (not read from OPTIONS, so a renamed variable fails here).
SERVE_FLAGS = [
    ("--sysfs-root", "NUMA_SYSFS_ROOT"),
    ("--socket-dir", "NUMA_SOCKET_DIR"),
    ("--resource-prefix", "NUMA_RESOURCE_PREFIX"),
    ("--capacity", "NUMA_CAPACITY"),
    ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
    ("--register-timeout", "NUMA_REGISTER_TIMEOUT"),
    ("--shutdown-grace", "NUMA_SHUTDOWN_GRACE"),
    ("--log-level", "NUMA_LOG_LEVEL"),
    ("--log-format", "NUMA_LOG_FORMAT"),
    ("--metrics-address", "NUMA_METRICS_ADDRESS"),
    ("--debug-endpoints", "NUMA_DEBUG_ENDPOINTS"),
    ("--health-address", "NUMA_HEALTH_ADDRESS"),
    ("--pod-resources-socket", "NUMA_POD_RESOURCES_SOCKET"),
    ("--pod-resources-interval", "NUMA_POD_RESOURCES_INTERVAL"),
    ("--cgroup-root", "NUMA_CGROUP_ROOT"),
    ("--device-interval", "NUMA_DEVICE_INTERVAL"),
    ("--reserved-cpus", "NUMA_RESERVED_CPUS"),
    ("--allow-unaligned", "NUMA_ALLOW_UNALIGNED"),
    ("--memory-unit", "NUMA_MEMORY_UNIT"),
    ("--reserved-memory", "NUMA_RESERVED_MEMORY"),
    ("--mount-table", "NUMA_MOUNT_TABLE"),
    ("--near", "NUMA_NEAR"),
    ("--config-file", "NUMA_CONFIG_FILE"),
    ("--node-name", "NUMA_NODE_NAME"),
    ("--kubeconfig", "NUMA_KUBECONFIG"),
    ("--node-config-interval", "NUMA_NODE_CONFIG_INTERVAL"),
]


# Every other command's flags and variables, written out likewise.
COMMAND_FLAGS = {
    "serve": SERVE_FLAGS,
    "discover": [
        ("--sysfs-root", "NUMA_SYSFS_ROOT"),
        ("--resource-prefix", "NUMA_RESOURCE_PREFIX"),
        ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
        ("--memory-unit", "NUMA_MEMORY_UNIT"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--output", "NUMA_OUTPUT"),
        ("--log-level", "NUMA_LOG_LEVEL"),
    ],
    "status": [
        ("--pod-resources-socket", "NUMA_POD_RESOURCES_SOCKET"),
        ("--socket-dir", "NUMA_SOCKET_DIR"),
        ("--reserved-cpus", "NUMA_RESERVED_CPUS"),
        ("--sysfs-root", "NUMA_SYSFS_ROOT"),
        ("--resource-prefix", "NUMA_RESOURCE_PREFIX"),
        ("--capacity", "NUMA_CAPACITY"),
        ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
        ("--memory-unit", "NUMA_MEMORY_UNIT"),
        ("--reserved-memory", "NUMA_RESERVED_MEMORY"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--output", "NUMA_OUTPUT"),
        ("--log-level", "NUMA_LOG_LEVEL"),
        ("--timeout", "NUMA_TIMEOUT"),
    ],
    "demo": [
        ("--sysfs-root", "NUMA_SYSFS_ROOT"),
        ("--resource-prefix", "NUMA_RESOURCE_PREFIX"),
        ("--capacity", "NUMA_CAPACITY"),
        ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
        ("--log-level", "NUMA_LOG_LEVEL"),
        ("--log-format", "NUMA_LOG_FORMAT"),
        ("--keep", "NUMA_KEEP"),
        ("--memory-unit", "NUMA_MEMORY_UNIT"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--metrics-address", "NUMA_METRICS_ADDRESS"),
        ("--config-file", "NUMA_CONFIG_FILE"),
        ("--node-label", "NUMA_NODE_LABEL"),
    ],
    "devices": [
        ("--kubeconfig", "NUMA_KUBECONFIG"),
        ("--namespace", "NUMA_NAMESPACE"),
        ("--selector", "NUMA_SELECTOR"),
        ("--port", "NUMA_PORT"),
        ("--pod-timeout", "NUMA_POD_TIMEOUT"),
        ("--timeout", "NUMA_TIMEOUT"),
        ("--output", "NUMA_OUTPUT"),
    ],
    "health": [
        ("--address", "NUMA_ADDRESS"),
        ("--check", "NUMA_CHECK"),
        ("--log-level", "NUMA_LOG_LEVEL"),
    ],
}


def test_every_commands_flags_and_variables_are_the_written_ones() -> None:
    from numa_device_plugin.cli import cli

    ctx = click.Context(cli)
    for name, expected in COMMAND_FLAGS.items():
        command = cli.get_command(ctx, name)
        assert command is not None, name
        found = [
            (max(p.opts, key=len).split("/")[0], p.envvar)
            for p in command.params
            if p.name != "help"
        ]
        assert sorted(found) == sorted(expected), name


def test_serve_help_lists_every_flag_and_env_var(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["serve", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    for flag, env in SERVE_FLAGS:
        assert flag in flat
        assert f"env var: {env}" in flat


def serve_params(argv: list[str]) -> dict[str, object]:
    """``serve``'s options resolved from ``argv``, the environment and the defaults, as
    click hands them to the command (bad values raise click.BadParameter)."""
    with serve.command.make_context("serve", list(argv)) as ctx:
        return dict(ctx.params)


def serve_config(argv: list[str]) -> Config:
    """The Config ``serve`` would run with for ``argv`` and the environment."""
    return options.config_from_params(serve_params(argv))


def test_every_option_of_every_command_has_its_variable() -> None:
    from numa_device_plugin.cli import cli

    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            if param.name == "help":
                continue
            flag = max(param.opts, key=len)
            expected = "NUMA_" + flag.removeprefix("--").replace("-", "_").upper()
            assert param.envvar == expected, f"{name} {flag}"


@pytest.mark.parametrize(
    ("value", "argv", "expected"),
    [
        (None, [], False),
        ("true", [], True),
        ("1", [], True),
        ("yes", [], True),
        ("off", [], False),
        ("true", ["--no-include-cpuless-nodes"], False),
        ("false", ["--include-cpuless-nodes"], True),
    ],
)
def test_switches_read_booleans_and_the_flag_wins(
    value: str | None, argv: list[str], expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is not None:
        monkeypatch.setenv("NUMA_INCLUDE_CPULESS_NODES", value)
    assert serve_params(argv)["include_cpuless_nodes"] is expected


def test_a_flag_beats_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMA_CAPACITY", "5")
    monkeypatch.setenv("NUMA_REGISTER_TIMEOUT", "not even a number")
    params = serve_params(["--capacity", "7", "--register-timeout", "2"])
    assert (params["capacity"], params["register_timeout"]) == (7, 2.0)
    assert serve_params(["--register-timeout", "2"])["capacity"] == 5


def test_serve_without_flags_runs_with_configs_own_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each setting's default is written once, in Config: a default typed into an option
    as well would drift (--register-timeout said 5 s in both, then 15 s in both)."""
    for name in list(os.environ):
        if name.startswith("NUMA_"):
            monkeypatch.delenv(name)
    config = serve_config([])
    defaults = Config(socket_dir=config.socket_dir)
    compared = [name for name in options_fields() if name != "socket_dir"]
    assert {"register_timeout", "shutdown_grace", "pod_resources_interval"} <= set(compared)
    assert {n: getattr(config, n) for n in compared} == {n: getattr(defaults, n) for n in compared}


def options_fields() -> list[str]:
    """Config's fields that ``serve`` has an option for."""
    return [name for name in serve_params([]) if name in Config.__dataclass_fields__]


def test_timeouts_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = serve_config(["--register-timeout", "7.5", "--shutdown-grace", "0"])
    assert (config.register_timeout, config.shutdown_grace) == (7.5, 0.0)
    monkeypatch.setenv("NUMA_REGISTER_TIMEOUT", "3")
    monkeypatch.setenv("NUMA_SHUTDOWN_GRACE", "2.5")
    monkeypatch.setenv("NUMA_SOCKET_DIR", "/run/dp")
    config = serve_config([])
    assert (config.register_timeout, config.shutdown_grace) == (3.0, 2.5)
    assert config.socket_dir == Path("/run/dp")


@pytest.fixture
def never_serve(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``serve`` returns 0 at once instead of serving: a bad value that is wrongly
    accepted fails the test at once instead of serving until the test times out."""
    served: list[object] = []

    async def fake_serve(*args: object, **kwargs: object) -> int:
        served.append((*args, kwargs))
        return 0

    monkeypatch.setattr(serve, "serve", fake_serve)
    return served


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "--capacity", "0"], "capacity must be between 1 and"),
        (["serve", "--capacity", "ten"], "'ten' is not a whole number"),
        (["serve", "--resource-prefix", "Bad_Domain"], "DNS subdomain"),
        (["serve", "--resource-prefix", "kubernetes.io"], "kubernetes.io"),
        (["serve", "--register-timeout", "-1"], "positive number of seconds"),
        (["serve", "--register-timeout", "nan"], "positive number of seconds"),
        (["serve", "--log-level", "loud"], "'loud' is not one of"),
        (["serve", "--include-cpuless-nodes", "perhaps"], "unexpected extra argument (perhaps)"),
        (["serve", "--no-such-flag"], "No such option '--no-such-flag'"),
        (["serve", "--shutdown-grace", "-1"], "zero or a positive number of seconds"),
        (["discover", "--output", "xml"], "'xml' is not one of"),
        (["launch"], "No such command 'launch'"),
        (["health", "--address", ""], "'' is not HOST:PORT or :PORT"),
        (["serve", "--metrics-address", "nine"], "'nine' is not HOST:PORT"),
        ([], "Commands:"),
    ],
)
def test_bad_flags_exit_2_with_usage(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], never_serve: list[object]
) -> None:
    code, _, err = run_main(args, capsys)
    assert code == 2
    assert "Usage:" in err
    assert needle in " ".join(err.split())


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("NUMA_CAPACITY", "-5", "between 1 and"),
        ("NUMA_RESOURCE_PREFIX", "UPPER", "DNS subdomain"),
        ("NUMA_LOG_FORMAT", "xml", "'xml' is not one of 'text', 'json'"),
        ("NUMA_INCLUDE_CPULESS_NODES", "sometimes", "'sometimes' is not a valid boolean"),
        ("NUMA_REGISTER_TIMEOUT", "0", "'0' must be a positive number of seconds"),
        ("NUMA_SHUTDOWN_GRACE", "soon", "'soon' is not a number of seconds"),
        ("NUMA_HEALTH_ADDRESS", "nine", "HOST:PORT"),
        ("NUMA_DEBUG_ENDPOINTS", "maybe", "'maybe' is not a valid boolean"),
    ],
)
def test_bad_env_values_exit_2_naming_the_variable(
    env: str,
    value: str,
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    never_serve: list[object],
) -> None:
    monkeypatch.setenv(env, value)
    code, _, err = run_main(["serve"], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert f"(env var: '{env}')" in err
    assert needle in " ".join(err.split())
    assert never_serve == []


def test_the_never_serve_fixture_sees_a_good_command_line(
    never_serve: list[object], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run_main(["serve", "--socket-dir", str(tmp_path)], capsys)[0] == 0
    assert len(never_serve) == 1


def test_env_vars_are_read_and_flags_win(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMA_SYSFS_ROOT", str(two_nodes.root))
    monkeypatch.setenv("NUMA_RESOURCE_PREFIX", "numa.example.com")
    code, out, _ = run_main(["discover", "--output", "json"], capsys)
    assert code == 0
    assert json.loads(out)["resources"] == ["numa.example.com/numa-0", "numa.example.com/numa-1"]
    code, out, _ = run_main(["discover", "--output", "json", "--resource-prefix", "x.io"], capsys)
    assert json.loads(out)["resources"] == ["x.io/numa-0", "x.io/numa-1"]


def test_discover_json_shape(two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        ["discover", "--sysfs-root", str(two_nodes.root), "--output", "json"], capsys
    )
    assert code == 0
    assert json.loads(out) == {
        "nodes": [
            {
                "id": 0,
                "cpus": "0-3",
                "memory_bytes": 1073741824,
                "distances": {"0": 10, "1": 21},
                "hugepages": {},
                "advertised": True,
                "reason": None,
                "devices": {"disks": [], "nics": [], "accelerators": [], "pci": 0},
            },
            {
                "id": 1,
                "cpus": "4-7",
                "memory_bytes": 1073741824,
                "distances": {"0": 21, "1": 10},
                "hugepages": {},
                "advertised": True,
                "reason": None,
                "devices": {"disks": [], "nics": [], "accelerators": [], "pci": 0},
            },
        ],
        "resources": NAMES,
        "devices": dict.fromkeys(NAMES, 100),
        "near": [],
        "unlocated_pci": 0,
        "inventory": {"disks": [], "nics": [], "accelerators": []},
    }


def test_discover_shows_memory_resources_with_memory_unit(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """1 GiB per NUMA node, 2 MiB pages on node 1: its memory resource counts what is
    left beside the hugepages, over the unit."""
    two_nodes.write("node/node1/hugepages/hugepages-2048kB/nr_hugepages", "128\n")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--memory-unit", "256Mi"]
    code, out, _ = run_main([*args, "--output", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["nodes"][1]["hugepages"] == {"2Mi": 128}
    assert document["devices"] == {
        "numa-align/numa-0": 100,
        "numa-align/numa-0-memory": 4,
        "numa-align/numa-1": 100,
        "numa-align/numa-1-memory": 3,
        "numa-align/numa-1-hugepages-2mi": 1,
    }
    code, out, _ = run_main(args, capsys)
    assert "numa-align/numa-1-memory (3)" in out.splitlines()[-1]


@pytest.mark.parametrize("command", ["discover", "status", "demo", "serve"])
def test_a_memory_unit_that_makes_too_many_devices_is_a_usage_error_in_every_command(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """1 MiB over 16 GiB per NUMA node is over 10,000 devices: ``discover``, ``status``
    and ``demo`` once ended in a MemoryUnitError traceback (``serve`` exited 2)."""
    for node in (0, 1):
        two_nodes.node(node, mem_kb=16 << 20)
    args = [command, "--sysfs-root", str(two_nodes.root), "--memory-unit", "1Mi"]
    if command == "serve":
        args += ["--socket-dir", str(tmp_path / "dp")]
    code, _, err = run_main(args, capsys)
    assert code == 2, err
    assert "Invalid value for '--memory-unit'" in err
    assert "more than 10000" in err
    assert "Traceback" not in err


def test_discover_table(two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["discover", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "CPUS", "MEMORY_BYTES", "DISTANCES", "ADVERTISED", "REASON"]
    assert lines[1].split() == ["0", "0-3", "1073741824", "0:10,1:21", "yes"]
    assert lines[-1] == "resources (devices): numa-align/numa-0 (100), numa-align/numa-1 (100)"


def test_discover_malformed_sysfs_exits_1_naming_the_file(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/node1/cpulist", "4-ten\n")
    code, _, err = run_main(["discover", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 1
    assert "node1/cpulist" in err
    assert "'4-ten'" in err


def test_discover_with_odd_informative_files_reports_null_and_warns(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/node1/distance", "0\n")
    two_nodes.write("node/node0/meminfo", "Node 0 MemTotal: lots\n")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--output", "json"]
    code, out, err = run_main(args, capsys)
    assert code == 0
    nodes = json.loads(out)["nodes"]
    assert (nodes[0]["memory_bytes"], nodes[1]["distances"]) == (None, None)
    assert nodes[0]["distances"] == {"0": 10, "1": 21}
    assert [node["advertised"] for node in nodes] == [True, True]
    assert "node1/distance" in err
    assert "(content: '0')" in err
    assert "node0/meminfo" in err
    code, out, _ = run_main(args[:-2], capsys)
    assert code == 0
    assert out.splitlines()[1].split()[:4] == ["0", "0-3", "-", "0:10,1:21"]


@pytest.mark.parametrize("name", sorted(SNAPSHOT_TABLE))
def test_discover_json_on_snapshots(
    snapshots_root: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = snapshots_root / name
    code, out, _ = run_main(["discover", "--sysfs-root", str(root), "--output", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    advertised = {n["id"]: n["cpus"] for n in document["nodes"] if n["advertised"]}
    assert advertised == SNAPSHOT_TABLE[name]
    assert [n["id"] for n in document["nodes"]] == sorted(n["id"] for n in document["nodes"])
    assert document["resources"] == [f"numa-align/numa-{i}" for i in sorted(advertised)]
    for node in document["nodes"]:
        assert node["reason"] is None if node["advertised"] else isinstance(node["reason"], str)


def test_demo_on_a_synthetic_tree(two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        ["demo", "--sysfs-root", str(two_nodes.root), "--capacity", "3"], capsys
    )
    assert code == 0
    assert "2 resource(s) registered" in out
    assert "numa-align/numa-1: 3 devices (3 Healthy), TopologyInfo NUMA node(s) [1]" in out
    assert 'Allocate(numa-align/numa-0, [numa0-slot0000]) -> envs {"NUMA_NODE": "0"}' in out


POOLS_FILE = "configs:\n  slots: {capacity: 3}\n  exact: {capacity: cpus}\ndefault: slots\n"


@pytest.mark.parametrize(
    ("labels", "chosen", "device"),
    [
        ([], "slots", "numa0-slot0000"),  # no label: the file's default
        (["--node-label", "numa-align/config=exact"], "exact", "numa0-cpu0000"),
        (["--node-label", "zone=a", "--node-label", "numa-align/config=exact"], "exact",
         "numa0-cpu0000"),
    ],
)  # fmt: skip
def test_demo_chooses_by_the_node_label_as_serve_does(
    two_nodes: SysfsTree,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    labels: list[str],
    chosen: str,
    device: str,
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--config-file", str(pools), *labels]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    if labels:
        assert out.startswith(f"configuration {chosen}, chosen by the node's labels")
    else:  # it printed "chosen by the node's labels (none)"
        assert out.startswith(f"configuration {chosen}, the file's default (no --node-label)")
    assert f"Allocate(numa-align/numa-0, [{device}])" in out


def test_demo_lists_a_resource_that_follows_no_device_in_its_summary(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary left out a near resource that was not advertised (stderr only)."""
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--near", "gpu=pci-class:0302"]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    assert (
        "  numa-align/gpu: not advertised: pci-class:0302: no PCI device of that class "
        "matches on this node\n"
    ) in out


def test_demo_help_says_what_chooses_its_named_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said --config-file needs --node-name, which demo does not have."""
    code, out, _ = run_main(["demo", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "--node-name" not in text.replace("serve reads the labels of --node-name", "")
    assert "demo takes --node-label" in text


def test_demo_with_a_label_naming_no_configuration_exits_1_saying_so(
    two_nodes: SysfsTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    args = ["demo", "--sysfs-root", str(two_nodes.root), "--config-file", str(pools),
            "--node-label", "numa-align/config=nope"]  # fmt: skip
    code, _, err = run_main(args, capsys)
    assert code == 1
    assert "label numa-align/config='nope' names no configuration" in err


@pytest.mark.parametrize("label", ["novalue", "=x"])
def test_demo_node_labels_are_key_value_and_need_a_config_file(
    label: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(["demo", "--node-label", "a=b"], capsys)
    assert code == 2
    assert "only applies with --config-file" in err
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS_FILE)
    code, _, err = run_main(["demo", "--config-file", str(pools), "--node-label", label], capsys)
    assert code == 2
    assert "is not KEY=VALUE" in err


def test_demo_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/sys/devices/system/cpu").is_dir():
        pytest.skip("this machine has no sysfs")
    code, out, _ = run_main(["demo"], capsys)
    assert code == 0
    assert '"NUMA_NODE"' in out


def test_demo_with_malformed_sysfs_exits_1(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes.write("node/online", "0-1,x\n")
    code, _, err = run_main(["demo", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 1
    assert "node/online" in err


async def _wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    for _ in range(int(timeout / 0.05)):
        if process.poll() is not None:
            return process.returncode
        await asyncio.sleep(0.05)
    process.kill()
    raise AssertionError("serve did not exit")


async def test_real_serve_process_sighup_and_sigterm(two_nodes: SysfsTree, sock_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_LOG_FORMAT="json")
    args = ["--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir), "--capacity", "4"]
    async with KubeletStandIn(sock_dir) as kubelet:
        process = subprocess.Popen(
            [sys.executable, "-m", "numa_device_plugin", "serve", *args],
            env=env,
            stderr=subprocess.PIPE,
        )
        try:
            await wait_all_live(kubelet, NAMES, timeout=20)
            assert len(kubelet.devices("numa-align/numa-0")) == 4
            process.send_signal(signal.SIGHUP)
            await kubelet.wait_until(lambda: len(kubelet.registrations) >= 4, timeout=10)
            await wait_all_live(kubelet, NAMES)
            process.send_signal(signal.SIGTERM)
            assert await _wait_exit(process, 10) == 0
        finally:
            if process.poll() is None:
                process.kill()
            stderr = process.communicate()[1].decode()
        assert sorted(p.name for p in sock_dir.iterdir()) == [".numa-device-plugin", "kubelet.sock"]
        await kubelet.wait_until(lambda: kubelet.clients == {})
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "device plugin stopped" in events
    assert events.count("registered with the kubelet") == 4


async def test_sigusr1_switches_serves_log_level_and_back(
    two_nodes: SysfsTree, sock_dir: Path, tmp_path: Path
) -> None:
    """At info, an Allocate logs nothing; after SIGUSR1 it logs its debug line; after a
    second SIGUSR1 nothing again. Each switch says so at warning level."""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_LOG_FORMAT="json")
    args = ["--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir), "--capacity", "4"]
    log = tmp_path / "serve.log"

    def events(name: str) -> list[dict[str, object]]:
        lines = log.read_text().splitlines()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in found if e["event"] == name]

    def last_change_is(level: str) -> bool:
        return [e["log_level"] for e in events("log level changed")][-1:] == [level]

    async def allocations_logged_after(device: str) -> int:
        await kubelet.allocate(NAMES[0], [device])
        await asyncio.sleep(0.3)  # a line is written before Allocate answers; margin for I/O
        return len(events("Allocate"))

    async with KubeletStandIn(sock_dir) as kubelet:
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "numa_device_plugin", "serve", *args], env=env, stderr=stderr
            )
        try:
            await wait_all_live(kubelet, NAMES, timeout=20)
            device = kubelet.devices(NAMES[0])[0].ID
            assert await allocations_logged_after(device) == 0, "info: no debug line"
            for level, logged in (("debug", 1), ("info", 1)):
                process.send_signal(signal.SIGUSR1)
                await eventually(partial(last_change_is, level), timeout=10)
                assert await allocations_logged_after(device) == logged, level
            process.send_signal(signal.SIGTERM)
            assert await _wait_exit(process, 10) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    changes = events("log level changed")
    assert [(e["level"], e["log_level"], e["configured"]) for e in changes] == [
        ("warning", "debug", "info"),
        ("warning", "info", "info"),
    ]


def test_unknown_serve_flag_prints_serves_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["serve", "--bogus"], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "No such option '--bogus'" in err


def _unusable(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if kind == "a file":
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        return blocker
    if kind == "under a file":
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        return blocker / "dp"
    if kind == "read-only":
        folder = tmp_path / "ro"
        folder.mkdir()
        real_access = os.access
        # As root, permission bits do not stop writes: stand in for a read-only mount.
        monkeypatch.setattr(
            os, "access", lambda path, mode: Path(path) != folder and real_access(path, mode)
        )
        return folder
    return tmp_path / ("d" * 100)  # kubelet.sock in it is over the unix socket limit


@pytest.mark.parametrize("kind", ["a file", "under a file", "read-only", "too long"])
def test_serve_with_unusable_socket_dir_exits_2_naming_option_and_path(
    kind: str,
    two_nodes: SysfsTree,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = _unusable(kind, tmp_path, monkeypatch)
    args = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(folder)]
    code, _, err = run_main(args, capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "--socket-dir" in err
    assert str(folder.parent if kind == "under a file" else folder) in err
    assert not folder.is_dir() or not any(folder.iterdir()), "nothing may be created"


def test_resource_socket_path_too_long_exits_2(
    two_nodes: SysfsTree, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid but long --resource-prefix makes the resources' socket paths too long for
    grpc: exit 2 at start naming the path, its length and the limit (once retried forever)."""
    prefix = "a" * 40 + "." + "b" * 40 + ".example.com"  # a valid 93-character domain
    args = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir)]
    code, _, err = run_main([*args, "--resource-prefix", prefix], capsys)
    assert code == 2
    path = sock_dir / f"{prefix}_numa-0.sock"
    assert str(path) in err
    assert f"is {len(str(path))} bytes" in err
    assert "at most 105" in err
    assert sorted(os.listdir(sock_dir)) == [], "no socket, no lock: nothing was touched"


def test_serve_loads_only_what_it_uses() -> None:
    """The stand-in (demo's), the status report, prometheus-client (made after
    registration), the node page and the state it shows (at their first request),
    http.client (the API server's reads, with a configuration file), PyYAML and watchdog
    (the folders are watched once registered) stay out of serve's imports and its
    listeners' making; once, cli/__init__ imported every
    command, the bounded readers PyYAML and http.client, and the listeners the node
    page."""
    import subprocess
    import sys

    code = (
        "import sys; from numa_device_plugin.cli import cli; import click; "
        "cli.get_command(click.Context(cli), 'serve'); "
        "from numa_device_plugin.cli.serve import node_pages; node_pages(lambda: None); "
        "print(' '.join(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    loaded = set(result.stdout.split())
    assert "numa_device_plugin.cli.serve" in loaded
    for module in (
        "numa_device_plugin.kubelet_standin",
        "numa_device_plugin.cli.demo",
        "numa_device_plugin.cli.status",
        "numa_device_plugin.plugin.reports.status",
        "numa_device_plugin.plugin.reports.prometheus",
        "prometheus_client",
        "numa_device_plugin.plugin.reports.nodepage",
        "numa_device_plugin.plugin.reports.snapshot",
        "http.client",
        "yaml",
        "numa_device_plugin.nodeconfig.configs",
        "watchdog",
        "numa_device_plugin.kubelet.watcher",
        "numa_device_plugin.kubelet.kubepods",
    ):
        assert module not in loaded, module


def test_discover_lists_each_nodes_devices_and_the_near_resources(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    for index in range(20):
        devices.pci(f"0000:{0x41 + index:02x}:00.0", 1, "0x010802")
        devices.disk(f"nvme{index}n1", f"0000:{0x41 + index:02x}:00.0", serial=f"S{index}")
    devices.pci("0000:00:03.0", -1, "0x020000")
    devices.nic("eno1", "0000:00:03.0")
    near = ["--near", "nvme=pci-class:0108", "--near", "nic=net:eno1", "--near", "d=serial:S3"]
    args = ["discover", "--sysfs-root", str(two_nodes.root), *near]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    assert "  1: disks nvme0n1, nvme1n1," in out
    assert "  no NUMA locality (numa_node -1): 1 PCI device(s)" in out
    assert "near numa-align/nvme (pci-class:0108): NUMA node(s) 1, from 0000:41:00.0" in out
    assert "and 4 more" in out
    assert "near numa-align/d (serial:S3): NUMA node(s) 1, from nvme3n1" in out
    assert (
        "near numa-align/nic: not advertised: net:eno1: no matched device has NUMA locality" in out
    )
    code, out, _ = run_main([*args, "--output", "json"], capsys)
    document = json.loads(out)
    assert [n["devices"]["pci"] for n in document["nodes"]] == [0, 20]
    assert [(e["resource"], e["nodes"], e["matched_count"]) for e in document["near"]] == [
        ("numa-align/nvme", [1], 20),
        ("numa-align/nic", [], 1),
        ("numa-align/d", [1], 1),
    ]
    assert document["devices"]["numa-align/d"] == 100
    assert "numa-align/nic" not in document["devices"]


@pytest.mark.parametrize(
    ("near", "why"),
    [
        ("numa-1=serial:S1", "would collide with the NUMA-node resources"),
        ("d=sn:S1", "is not a selector"),
        ("d", "is not NAME=SELECTOR"),
    ],
)
def test_discover_refuses_a_bad_near_with_usage(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], near: str, why: str
) -> None:
    code, _, err = run_main(
        ["discover", "--sysfs-root", str(two_nodes.root), "--near", near], capsys
    )
    assert code == 2
    assert "Usage: numa-device-plugin discover" in err
    assert why in err


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--near", "a" * 120_000 + "=block:sda"], "(120000 characters)"),
        (["--near", "d=serial:" + "s" * 120_000], "needs a value of 1 to 256"),
        (["--near", "d=sn:" + "s" * 120_000], "is not a selector"),
        (["--near", "a" * 120_000], "is not NAME=SELECTOR"),
        ([arg for i in range(65) for arg in ("--near", f"n{i}=block:sda")], "(--near, NUMA_NEAR"),
    ],
    ids=["long-name", "long-serial", "long-bad-selector", "no-equals", "65"],
)
def test_a_hostile_near_gets_a_short_usage_error_naming_near(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str], args: list[str], why: str
) -> None:
    """A 120 KB NAME gave 240 KB of stderr, and "at most 64" did not name --near."""
    code, out, err = run_main(["discover", "--sysfs-root", str(two_nodes.root), *args], capsys)
    assert code == 2
    assert why in err
    assert "--near" in err
    assert len(out) + len(err) < 1_500


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--debug-endpoints="], None), (["--debug-endpoints", " "], None), ([], "")],
    ids=["flag-empty", "flag-blank", "variable-empty"],
)
def test_an_empty_debug_endpoints_is_a_usage_error_from_the_flag_or_the_variable(
    args: list[str],
    env: str | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    never_serve: list[object],
) -> None:
    """The flag's empty value meant false, the variable's was a usage error: one rule."""
    if env is not None:
        monkeypatch.setenv("NUMA_DEBUG_ENDPOINTS", env)
    code, _, err = run_main(["serve", *args], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert "'--debug-endpoints'" in err
    assert never_serve == []


def test_a_conversion_error_of_any_length_is_cut_in_the_usage_error() -> None:
    """The backstop for an error message that echoes a hostile value: whatever a
    converter says, the usage error stays under MAX_ERROR characters."""
    import click

    from numa_device_plugin.cli.options import MAX_ERROR, Converted

    def refuse(text: str) -> object:
        raise ValueError(f"{text * 5000} is bad")

    with pytest.raises(click.BadParameter) as refused:
        Converted("X", refuse).convert("ab", None, None)
    assert len(refused.value.message) <= MAX_ERROR
    assert refused.value.message.endswith("... (message cut)")


def test_discover_takes_a_name_twice_as_selectors_that_must_agree(
    two_nodes: SysfsTree, capsys: pytest.CaptureFixture[str]
) -> None:
    from numa_device_plugin.topology.fake import DeviceTree

    devices = DeviceTree(two_nodes.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    devices.pci("0000:42:00.0", 1, "0x020000")
    devices.nic("ens1", "0000:42:00.0")
    devices.pci("0000:01:00.0", 0, "0x020000")
    devices.nic("ens0", "0000:01:00.0")
    args = ["discover", "--sysfs-root", str(two_nodes.root), "--output", "json",
            "--near", "osd=serial:S1", "--near", "osd=net:ens1",
            "--near", "split=serial:S1", "--near", "split=net:ens0"]  # fmt: skip
    code, out, _ = run_main(args, capsys)
    assert code == 0
    near = {entry["resource"]: entry for entry in json.loads(out)["near"]}
    assert near["numa-align/osd"]["selector"] == "serial:S1 & net:ens1"
    assert near["numa-align/osd"]["nodes"] == [1]
    assert near["numa-align/split"]["nodes"] == []
    assert near["numa-align/split"]["reason"] == (
        "its devices are on no common NUMA node: serial:S1 on 1; net:ens0 on 0"
    )


@pytest.mark.parametrize("text", ["\x1b]0;owned\x07", "\x1b[2J", "S1\nforged line", "S\u2028x"])
def test_discovers_inventory_lines_show_every_terminal_control_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """A serial, wwid, model or driver from a hostile sysfs printed raw would clear the
    screen or forge a line; JSON keeps it exact."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    tree = build_machine(tmp_path / "sys", nodes=2)
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", 1, "0x010802")
    devices.pci("0000:17:00.0", 0, "0x020000")
    disk = devices.disk("nvme0n1", "0000:41:00.0", serial=text, wwid=text)
    (disk / "model").write_text(text)
    nic = devices.nic("ens1f0", "0000:17:00.0")
    drivers = tree.root / "bus/pci/drivers" / "d"
    drivers.mkdir(parents=True)
    (nic / "device").symlink_to(".")
    (nic / "driver").symlink_to(os.path.relpath(drivers, nic))
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root)], capsys)
    assert code == 0
    inventory = out[out.index("inventory (select by these):") :]
    assert all(line.isprintable() for line in inventory.splitlines()), inventory
    assert repr(text.strip())[1:-1] in inventory
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root), "--output", "json"],
                            capsys)  # fmt: skip
    (shown,) = json.loads(out)["inventory"]["disks"]
    assert shown["serial"] == text.strip()


def test_discovers_inventory_says_none_for_a_device_without_locality(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk and a NIC whose PCI device has numa_node -1: listed, on NUMA node(s)
    "none", never an empty field."""
    from numa_device_plugin.topology.fake import DeviceTree, build_machine

    tree = build_machine(tmp_path / "sys", nodes=2)
    devices = DeviceTree(tree.root)
    devices.pci("0000:41:00.0", -1, "0x010802")
    devices.pci("0000:17:00.0", -1, "0x020000")
    devices.disk("nvme0n1", "0000:41:00.0", serial="S1")
    devices.nic("ens1f0", "0000:17:00.0")
    code, out, _ = run_main(["discover", "--sysfs-root", str(tree.root)], capsys)
    assert code == 0
    assert "  disk nvme0n1: NUMA node(s) none; serial S1" in out
    assert "  NIC ens1f0: NUMA node(s) none; PCI 0000:17:00.0" in out
