"""A kubeconfig's exec credential plugin, as ``top`` runs it: bounded in time and
output (killed with its children), refused when the spec or its output has the wrong
shape."""

from __future__ import annotations

import json
import os
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


def test_a_bare_command_name_is_found_on_path_not_in_the_kubeconfigs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: bare names resolved in the kubeconfig's folder (breaks ``aws``,
    ``gke-gcloud-auth-plugin``)."""
    on_path, beside = tmp_path / "bin", tmp_path / "kubeconfigs"
    for folder, token in ((on_path, "from-path"), (beside, "from-folder")):
        folder.mkdir()
        script = folder / "cred-plugin"
        credential = json.dumps({"status": {"token": token}})
        script.write_text(f"#!{sys.executable}\nprint({credential!r})\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{on_path}:{os.environ['PATH']}")
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": "cred-plugin"}
    assert exec_credential(spec, beside, "kubeconfig k") == ("from-path", None)


def test_an_empty_status_is_refused(tmp_path: Path) -> None:
    """Mutant: ``status: {}`` accepted as a credential."""
    spec = plugin(tmp_path, "print('{\"status\": {}}')\n")
    with pytest.raises(ExecCredentialError, match="gave neither a token nor a client certificate"):
        exec_credential(spec, tmp_path, "kubeconfig k")
