"""Every deploy command the docs give installs the image ``make push`` pushes: each
``kubectl kustomize deployments/ | …`` and ``helm install … deployments/helm/…`` line of
the README and docs/ (and ``make deploy``'s recipe) is run as written, in this checkout
(``kubectl apply`` left out, ``helm install`` as ``helm template``), and its DaemonSet
must pull ``make -s image-name``. docs/deployment.md once told ``make push`` to push a
``0.2.1`` tag it never pushed, and its commands pulled that: ImagePullBackOff."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from tests.conftest import REPO, venv_tool

REGISTRY = "registry.example.com:5000"
STARTS = ("kubectl kustomize deployments/", "helm install numa-device-plugin deployments/")


def documented() -> list[tuple[str, str]]:
    """(where, command) of every deploy command in the README and docs/, continuation
    lines joined and a trailing comment dropped."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            if not line.startswith(STARTS):
                continue
            command, at = line, index
            while command.rstrip().endswith("\\"):
                at += 1
                command = command.rstrip()[:-1].rstrip() + " " + lines[at].strip()
            command = re.sub(r"\s+#.*$", "", command).strip()
            found.append((f"{page.relative_to(REPO)}:{index + 1}", command))
    return found


def make(*args: str) -> str:
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def rendered_image(command: str) -> str:
    """Run ``command`` in the checkout, without applying: the image of the DaemonSet it
    renders."""
    command = re.sub(r"\s*\|\s*kubectl apply -f -$", "", command)
    command = command.replace("helm install ", "helm template ", 1)
    tools = {os.path.dirname(venv_tool("kubectl")), os.path.dirname(venv_tool("helm"))}
    env = dict(os.environ, PATH=os.pathsep.join([*tools, os.environ["PATH"]]))
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    (daemonset,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DaemonSet"]
    (image,) = {c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]}
    return str(image)


COMMANDS = documented()


def test_the_docs_give_both_ways_in_more_than_one_place() -> None:
    """The scan finds what it checks (a renamed command would otherwise check nothing)."""
    assert {where.split(":")[0] for where, _ in COMMANDS} >= {"README.md", "docs/deployment.md"}
    assert sum(c.startswith("helm") for _, c in COMMANDS) >= 2
    assert sum(c.startswith("kubectl") for _, c in COMMANDS) >= 2


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_deploy_pulls_what_make_push_pushes(where: str, command: str) -> None:
    assert REGISTRY in command, f"{where}: every page deploys from {REGISTRY}"
    assert rendered_image(command) == make("image-name", f"REGISTRY={REGISTRY}"), where


def test_make_deploy_pulls_what_make_push_pushes() -> None:
    recipe = make("-n", "deploy", f"REGISTRY={REGISTRY}")
    (line,) = [line for line in recipe.splitlines() if line.startswith("kubectl kustomize")]
    assert rendered_image(line) == make("image-name", f"REGISTRY={REGISTRY}")


def test_make_push_pushes_the_tag_the_docs_name() -> None:
    """What push pushes (its dry run) is make image-name: the name the checks above use."""
    out = make("-n", "push", f"REGISTRY={REGISTRY}", "CONTAINER_TOOL=podman")
    assert re.findall(r"^podman push\s+(\S+)$", out, re.M) == [
        make("image-name", f"REGISTRY={REGISTRY}")
    ]
