"""The command line: every command's flags and variables, the flag over its variable,
exit 2 with usage on bad values. ``discover``: test_discover.py; ``demo``: test_demo.py;
a real ``serve`` process: test_serve_process.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest

from numa_device_plugin import __version__
from numa_device_plugin.cli import main, options, serve
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree

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
    ("--any-resource", "NUMA_ANY_RESOURCE"),
    ("--socket-resources", "NUMA_SOCKET_RESOURCES"),
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
        ("--capacity", "NUMA_CAPACITY"),
        ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
        ("--memory-unit", "NUMA_MEMORY_UNIT"),
        ("--any-resource", "NUMA_ANY_RESOURCE"),
        ("--socket-resources", "NUMA_SOCKET_RESOURCES"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--output", "NUMA_OUTPUT"),
        ("--log-level", "NUMA_LOG_LEVEL"),
        ("--check", "NUMA_CHECK"),
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
        ("--any-resource", "NUMA_ANY_RESOURCE"),
        ("--socket-resources", "NUMA_SOCKET_RESOURCES"),
        ("--reserved-memory", "NUMA_RESERVED_MEMORY"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--output", "NUMA_OUTPUT"),
        ("--log-level", "NUMA_LOG_LEVEL"),
        ("--timeout", "NUMA_TIMEOUT"),
    ],
    "demo": [
        ("--sysfs-root", "NUMA_SYSFS_ROOT"),
        ("--device-interval", "NUMA_DEVICE_INTERVAL"),
        ("--resource-prefix", "NUMA_RESOURCE_PREFIX"),
        ("--capacity", "NUMA_CAPACITY"),
        ("--include-cpuless-nodes", "NUMA_INCLUDE_CPULESS_NODES"),
        ("--log-level", "NUMA_LOG_LEVEL"),
        ("--log-format", "NUMA_LOG_FORMAT"),
        ("--keep", "NUMA_KEEP"),
        ("--memory-unit", "NUMA_MEMORY_UNIT"),
        ("--any-resource", "NUMA_ANY_RESOURCE"),
        ("--socket-resources", "NUMA_SOCKET_RESOURCES"),
        ("--mount-table", "NUMA_MOUNT_TABLE"),
        ("--near", "NUMA_NEAR"),
        ("--metrics-address", "NUMA_METRICS_ADDRESS"),
        ("--config-file", "NUMA_CONFIG_FILE"),
        ("--node-label", "NUMA_NODE_LABEL"),
    ],
    "devices": [
        ("--kubeconfig", "NUMA_KUBECONFIG"),
        ("--plugin-namespace", "NUMA_PLUGIN_NAMESPACE"),
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
            if p.name != "help" and not getattr(p, "hidden", False)  # hidden: refusals
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
            if param.name == "help" or getattr(param, "hidden", False):
                continue  # a hidden option only refuses, naming the right one
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
