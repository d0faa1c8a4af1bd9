"""Configuration checks of ``serve`` found by the second adversarial run: empty
variables, which source an error names, relative paths, the polling floor, a missing
sysfs root, and HTTP listeners that cannot be bound or resolved. Each exits 2 with
the command's usage and names the flag (and the variable, when the value came from
there) before anything is served."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_device_plugin.cli import serve
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from numa_device_plugin.plugin.lifecycle.manager import PluginManager
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree
from tests.cli.test_cli import run_main, serve_config, serve_params
from tests.standin_helpers import held_port

# Every variable of serve but the listener addresses: set but empty is an error.
NOT_EMPTY = [
    "NUMA_SYSFS_ROOT",
    "NUMA_SOCKET_DIR",
    "NUMA_RESOURCE_PREFIX",
    "NUMA_CAPACITY",
    "NUMA_INCLUDE_CPULESS_NODES",
    "NUMA_REGISTER_TIMEOUT",
    "NUMA_SHUTDOWN_GRACE",
    "NUMA_LOG_LEVEL",
    "NUMA_LOG_FORMAT",
    "NUMA_DEBUG_ENDPOINTS",
    "NUMA_POD_RESOURCES_SOCKET",
    "NUMA_POD_RESOURCES_INTERVAL",
    "NUMA_CGROUP_ROOT",
    "NUMA_DEVICE_INTERVAL",
    "NUMA_RESERVED_CPUS",
    "NUMA_ALLOW_UNALIGNED",
    "NUMA_MEMORY_UNIT",
    "NUMA_ANY_RESOURCE",
    "NUMA_SOCKET_RESOURCES",
    "NUMA_RESERVED_MEMORY",
    "NUMA_MOUNT_TABLE",
    "NUMA_NEAR",
    "NUMA_CONFIG_FILE",
    "NUMA_NODE_NAME",
    "NUMA_KUBECONFIG",
    "NUMA_NODE_CONFIG_INTERVAL",
]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The manager returns at once instead of serving (the listeners are real)."""
    calls: list[object] = []

    async def fake_serve(self: PluginManager) -> None:
        calls.append(self)

    monkeypatch.setattr(PluginManager, "serve", fake_serve)
    return calls


def test_every_variable_of_serve_is_checked_here() -> None:
    expected = {p.envvar for p in serve.command.params if p.name != "help"}
    assert set(NOT_EMPTY) | {"NUMA_METRICS_ADDRESS", "NUMA_HEALTH_ADDRESS"} == expected


@pytest.mark.parametrize("variable", NOT_EMPTY)
def test_an_empty_variable_exits_2_naming_it(
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[object],
) -> None:
    """Empty once meant the default: with NUMA_SOCKET_DIR= the plugin took the lock in
    the host's real /var/lib/kubelet/device-plugins."""
    monkeypatch.setenv(variable, "")
    code, _, err = run_main(["serve"], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert f"the variable {variable} is set but empty" in err
    assert served == []


def test_an_empty_variable_is_no_error_when_the_flag_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NUMA_CAPACITY", "")
    assert serve_params(["--capacity", "7"])["capacity"] == 7


@pytest.mark.parametrize("variable", ["NUMA_METRICS_ADDRESS", "NUMA_HEALTH_ADDRESS"])
def test_an_empty_listener_variable_means_off(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "")
    assert serve_params([])[variable.removeprefix("NUMA_").lower()] == ""


def test_an_error_names_the_variable_only_when_the_value_came_from_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], served: list[object]
) -> None:
    code, _, err = run_main(["serve", "--capacity", "-5"], capsys)
    assert code == 2
    assert "Invalid value for '--capacity': " in err
    assert "NUMA_CAPACITY" not in err
    monkeypatch.setenv("NUMA_CAPACITY", "-5")
    code, _, err = run_main(["serve"], capsys)
    assert code == 2
    assert "Invalid value for '--capacity' (env var: 'NUMA_CAPACITY'): " in err


def test_an_unusable_socket_dir_from_the_variable_names_it(
    two_nodes: SysfsTree,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[object],
) -> None:
    monkeypatch.setenv("NUMA_SOCKET_DIR", "/proc/1/garbage")
    code, _, err = run_main(["serve", "--sysfs-root", str(two_nodes.root)], capsys)
    assert code == 2
    assert "'--socket-dir' (env var: 'NUMA_SOCKET_DIR')" in " ".join(err.split())
    assert served == []


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC's unix: targets take absolute paths: a relative one was accepted and then
    retried forever, with C-core traces on every attempt."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sys").mkdir()
    config = serve_config(
        [
            *("--sysfs-root", "sys", "--socket-dir", "dp"),
            *("--pod-resources-socket", "pr/kubelet.sock"),
        ]
    )
    assert config.socket_dir == tmp_path / "dp"
    assert config.pod_resources_path == tmp_path / "pr" / "kubelet.sock"
    assert config.sysfs_root == tmp_path / "sys"
    assert config.kubelet_socket.is_absolute()


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1e-9", "below the floor of 0.1 seconds"),
        ("0.09", "below the floor of 0.1 seconds"),
        ("inf", "must be a positive number of seconds"),
    ],
)
def test_the_polling_interval_has_a_floor(
    value: str, needle: str, capsys: pytest.CaptureFixture[str], served: list[object]
) -> None:
    code, _, err = run_main(["serve", "--pod-resources-interval", value], capsys)
    assert code == 2
    assert "'--pod-resources-interval'" in err
    assert needle in err
    assert serve_params(["--pod-resources-interval", "0.1"])["pod_resources_interval"] == 0.1


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--any-resource", "yes"], {}, "Invalid value for '--any-resource': 'yes' is not one of"),
        (["--any-resource", ""], {}, "Invalid value for '--any-resource'"),
        ([], {"NUMA_ANY_RESOURCE": "ON"}, "'ON' is not one of 'auto', 'on', 'off'"),
        (["--any-resource", "on"], {}, "numa-align/any needs --capacity cpus"),
        (["--any-resource", "on", "--capacity", "4"], {}, "a slot count cannot tell"),
        ([], {"NUMA_ANY_RESOURCE": "on"}, "numa-align/any needs --capacity cpus"),
        (["--socket-resources", "yes"], {},
         "Invalid value for '--socket-resources': 'yes' is not one of"),
        ([], {"NUMA_SOCKET_RESOURCES": "1"}, "'1' is not one of 'auto', 'on', 'off'"),
        (["--socket-resources", "on"], {}, "numa-align/socket-<id> needs --capacity cpus"),
        ([], {"NUMA_SOCKET_RESOURCES": "on", "NUMA_CAPACITY": "8"},
         "or --socket-resources off"),
        (["--near", "nic=scope:rack"], {}, "'nic=scope:rack': scope must be one of node, socket"),
        ([], {"NUMA_NEAR": "nic=scope:socket"}, "'nic': scope:socket names no device"),
        (["--near", "socket-1=net:ens1f0"], {}, "would collide with the socket resources"),
    ],
)  # fmt: skip
def test_a_bad_any_socket_or_scope_setting_exits_2_saying_why(
    argv: list[str],
    env: dict[str, str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[object],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = run_main(["serve", *argv], capsys)
    assert code == 2
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert needle in " ".join(err.split())
    assert served == []


@pytest.mark.parametrize(
    ("argv", "any_resource", "serves_any"),
    [
        ([], "auto", False),
        (["--capacity", "cpus"], "auto", True),
        (["--capacity", "cpus", "--any-resource", "off"], "off", False),
        (["--capacity", "cpus", "--any-resource", "on"], "on", True),
    ],
)
def test_any_is_served_in_cpus_mode_unless_turned_off(
    argv: list[str], any_resource: str, serves_any: bool
) -> None:
    config = config_from_params(serve_params(argv))
    assert (config.any_resource, config.serves_any) == (any_resource, serves_any)


@pytest.mark.parametrize(
    ("argv", "serves_sockets"),
    [
        ([], False),
        (["--capacity", "cpus"], True),
        (["--capacity", "cpus", "--socket-resources", "off"], False),
        (["--capacity", "cpus", "--any-resource", "off"], True),  # each its own switch
    ],
)
def test_socket_resources_are_served_in_cpus_mode_unless_turned_off(
    argv: list[str], serves_sockets: bool
) -> None:
    assert config_from_params(serve_params(argv)).serves_sockets is serves_sockets


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_bad_sysfs_root_exits_2_naming_the_flag(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[object]
) -> None:
    root = tmp_path / "sys"
    if kind == "a file":
        root.write_text("")
    code, _, err = run_main(["serve", "--sysfs-root", str(root)], capsys)
    assert code == 2
    assert "Invalid value for '--sysfs-root': " in err
    assert str(root) in err
    assert served == []


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize(
    ("flags", "flag", "needle"),
    [
        (["--metrics-address", "256.1.1.1:9"], "--metrics-address", "'256.1.1.1:9'"),
        (["--health-address", "nohost.invalid:9201"], "--health-address", "nohost.invalid"),
        (
            ["--metrics-address", "192.0.2.1:9201"],
            "--metrics-address",
            "Cannot assign requested address",
        ),
        (["--health-address", "127.0.0.1:TAKEN"], "--health-address", "in use"),
        (
            ["--metrics-address", "127.0.0.1:SAME", "--health-address", "127.0.0.1:SAME"],
            "--health-address",
            "in use",
        ),
    ],
    ids=["no-such-ip", "unresolvable", "not-on-this-host", "port-in-use", "same-port"],
)
def test_a_listener_that_cannot_listen_exits_2_naming_flag_and_address(
    flags: list[str],
    flag: str,
    needle: str,
    taken_port: int,
    two_nodes: SysfsTree,
    sock_dir: Path,
    capsys: pytest.CaptureFixture[str],
    served: list[object],
) -> None:
    same = held_port()
    argv = [f.replace("TAKEN", str(taken_port)).replace("SAME", str(same)) for f in flags]
    base = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir)]
    code, _, err = run_main([*base, *argv], capsys)
    flat = " ".join(err.split())
    assert code == 2, err
    assert err.startswith("Usage: numa-device-plugin serve ")
    assert f"Invalid value for '{flag}': cannot listen on " in flat
    assert needle in flat
    assert served == [], "nothing is served when a listener fails"


def test_a_listener_from_a_variable_names_the_variable(
    taken_port: int,
    two_nodes: SysfsTree,
    sock_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[object],
) -> None:
    monkeypatch.setenv("NUMA_METRICS_ADDRESS", f"127.0.0.1:{taken_port}")
    base = ["serve", "--sysfs-root", str(two_nodes.root), "--socket-dir", str(sock_dir)]
    code, _, err = run_main(base, capsys)
    assert code == 2
    flat = " ".join(err.split())
    assert "'--metrics-address' (env var: 'NUMA_METRICS_ADDRESS'): cannot listen on" in flat
    assert f"127.0.0.1:{taken_port}" in flat


async def test_a_relative_socket_path_dials_without_c_core_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Library users too: a relative path is dialled as the absolute one, so a missing
    socket is a plain UNAVAILABLE, with no multi-line gRPC trace on stderr per attempt."""
    import grpc

    monkeypatch.chdir(tmp_path)
    async with PodResourcesClient(Path("pr/kubelet.sock")) as client:
        for _ in range(3):
            with pytest.raises(PodResourcesError) as caught:
                await client.view(1.0)
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert "authority-based URIs" not in capfd.readouterr().err


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


def test_numa_near_joined_by_commas_exits_2_naming_the_separator(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], served: list[object]
) -> None:
    """NUMA_NEAR is space-separated: "ch=path:/data/ch,kafka=net:ens1f0" made the path
    /data/ch,kafka=net:ens1f0 (nothing mounted there: never advertised, no word why)."""
    monkeypatch.setenv("NUMA_NEAR", "clickhouse=path:/data/ch,kafka=net:ens1f0")
    code, _, err = run_main(["serve"], capsys)
    assert code == 2
    assert "a second entry follows a comma ('kafka=net:')" in err
    assert "NUMA_NEAR separates entries with spaces" in err
    assert served == []
    monkeypatch.setenv("NUMA_NEAR", "clickhouse=path:/data/ch kafka=net:ens1f0")
    assert run_main(["serve"], capsys)[0] == 0
