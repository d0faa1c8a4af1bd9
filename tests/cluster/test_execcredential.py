"""A kubeconfig's exec credential plugin, as ``top`` runs it: bounded in time and
output (killed with its children), refused when the spec or its output has the wrong
shape."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cluster.execcredential import ExecCredentialError, exec_credential


def plugin(tmp_path: Path, script: str) -> dict[str, Any]:
    path = tmp_path / "plugin"
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(0o755)
    return {"apiVersion": "client.authentication.k8s.io/v1", "command": "./plugin"}


def test_a_plugin_that_hangs_is_killed_at_the_deadline(tmp_path: Path) -> None:
    spec = plugin(tmp_path, "import time\ntime.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(ExecCredentialError, match=r"did not end within 0\.5 s"):
        exec_credential(spec, tmp_path, "kubeconfig k", timeout=0.5)
    assert time.monotonic() - started < 5


def test_a_plugin_with_endless_output_is_stopped_at_the_cap(tmp_path: Path) -> None:
    spec = plugin(tmp_path, "import sys\nwhile True: sys.stdout.write('x' * 65536)\n")
    with pytest.raises(ExecCredentialError, match="printed more than 1048576 bytes"):
        exec_credential(spec, tmp_path, "kubeconfig k")


def test_deeply_nested_output_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    spec = plugin(tmp_path, "print('[' * 200000 + ']' * 200000)\n")
    with pytest.raises(ExecCredentialError, match="printed no ExecCredential"):
        exec_credential(spec, tmp_path, "kubeconfig k")


def test_a_relative_command_is_taken_from_the_kubeconfigs_folder(tmp_path: Path) -> None:
    spec = plugin(tmp_path, 'print(\'{"status": {"token": "t"}}\')\n')
    assert exec_credential(spec, tmp_path, "kubeconfig k") == ("t", None)


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ({"command": "x", "args": [["nested"]]}, "exec args is not a list of strings"),
        ({"command": "x", "env": [{"name": ["n"], "value": "v"}]}, "exec env entries"),
        ({"command": ""}, "exec has no command"),
    ],
)
def test_a_spec_of_the_wrong_shape_is_refused(
    tmp_path: Path, spec: dict[str, Any], fault: str
) -> None:
    with pytest.raises(ExecCredentialError, match=fault):
        exec_credential(spec, tmp_path, "kubeconfig k")
