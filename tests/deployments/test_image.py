"""The image targets of the Makefile, offline (``make -n``): the builder chosen from
what is installed, both tags pushed (the one the README and the chart pull among
them), and the source label only from an https URL without credentials. Building
the image itself needs a builder and a base image: the end-to-end harness does it
(``make test-e2e-local PLUGIN=kustomize|helm``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from numa_device_plugin import __version__
from tests.conftest import require_tool

REPO = Path(__file__).resolve().parent.parent.parent
NAME = "registry.local:5000/numa-device-plugin"


@pytest.fixture(autouse=True)
def _git_and_make() -> None:
    """git and make run the Makefile here: a skip, or a failure under CI."""
    require_tool("git", "the Debian package git")
    require_tool("make", "the Debian package make")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A repository of its own with the Makefile and the version, committed."""
    (tmp_path / "numa_device_plugin").mkdir()
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copy(REPO / "numa_device_plugin" / "__init__.py", tmp_path / "numa_device_plugin")
    git(tmp_path, "init", "--quiet")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "--quiet", "-m", "one")
    return tmp_path


def git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


BUILDERS = ("docker", "podman", "buildah")


def tools(folder: Path, *names: str, docker_daemon: bool = False) -> str:
    """A PATH holding fake builders ``names`` (a ``docker`` whose ``info`` fails unless
    ``docker_daemon``) before a folder of links to every program in the folders of
    ``make``, ``git`` and ``sh`` but the real builders (a machine may have them there)."""
    bin_dir = folder / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        script = bin_dir / name
        fails = name == "docker" and not docker_daemon
        script.write_text(
            "#!/bin/sh\n" + ('[ "$1" = info ] && exit 1\n' if fails else "") + "exit 0\n"
        )
        script.chmod(0o755)
    # Outside the checkout: the Makefile hashes untracked files for its -dirty tag.
    system = folder.parent / f"{folder.name}-system-bin"
    system.mkdir(exist_ok=True)
    for tool in ("make", "git", "sh"):
        for program in Path(shutil.which(tool) or "/usr/bin/x").parent.iterdir():
            link = system / program.name
            if program.name not in BUILDERS and not link.exists():
                link.symlink_to(program)
    return os.pathsep.join([str(bin_dir), str(system)])


def dry_run(folder: Path, target: str, path: str | None = None, **variables: str) -> str:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    env.pop("CONTAINER_TOOL", None)
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize(
    ("installed", "daemon", "chosen"),
    [
        (("docker", "podman", "buildah"), True, "docker"),
        (("docker", "podman", "buildah"), False, "podman"),  # a client without a daemon
        (("docker", "buildah"), False, "buildah"),
        (("buildah",), False, "buildah"),
    ],
)
def test_the_builder_is_the_first_that_works(
    checkout: Path, installed: tuple[str, ...], daemon: bool, chosen: str
) -> None:
    out = dry_run(checkout, "image", tools(checkout, *installed, docker_daemon=daemon))
    assert re.search(rf"^{chosen} build ", out, re.M), out


def test_no_builder_is_named_and_exit_2(checkout: Path) -> None:
    env = dict(os.environ, PATH=tools(checkout))
    env.pop("CONTAINER_TOOL", None)
    result = subprocess.run(
        ["make", "--no-print-directory", "image"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "no image builder: install docker, podman or buildah" in result.stderr


def test_a_docker_whose_daemon_is_down_is_said_so_not_no_builder(checkout: Path) -> None:
    """Once "no image builder: install docker, ..." with docker installed (issue 38's
    trap 7)."""
    env = dict(os.environ, PATH=tools(checkout, "docker"))
    env.pop("CONTAINER_TOOL", None)
    result = subprocess.run(
        ["make", "--no-print-directory", "image"], cwd=checkout, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "docker is installed but its daemon does not answer" in result.stderr
    assert "no image builder" not in result.stderr


def test_container_tool_overrides_and_flags_pass_through(checkout: Path) -> None:
    out = dry_run(
        checkout,
        "image",
        CONTAINER_TOOL="buildah",
        BUILD_FLAGS="--pull=never",
        PYTHON_IMAGE="localhost/py:3.11",
    )
    assert re.search(r"^buildah build --pull=never ", out, re.M), out
    assert "--build-arg PYTHON_IMAGE=localhost/py:3.11" in out
    commit = git(checkout, "rev-parse", "--short=12", "HEAD")
    assert f"-t {NAME}:{__version__}-{commit} ." in out
    assert f"-t {NAME}:{__version__} " not in out, "a release's tag is make release's"


def test_push_pushes_the_commits_tag_only_and_the_readme_deploys_that_tag(
    checkout: Path,
) -> None:
    """A development push never moves a release's tag (a node that cached the release
    under it would keep the old one, others would get the new); the README's deploy
    commands name the pushed tag with make image-name / image-tag."""
    out = dry_run(checkout, "push", CONTAINER_TOOL="podman", PUSH_FLAGS="--tls-verify=false")
    commit = git(checkout, "rev-parse", "--short=12", "HEAD")
    pushed = re.findall(r"^podman push --tls-verify=false (\S+)$", out, re.M)
    assert pushed == [f"{NAME}:{__version__}-{commit}"]
    assert dry_run(checkout, "docker-push", CONTAINER_TOOL="podman").count("podman push") == 1
    tag = subprocess.run(["make", "-s", "--no-print-directory", "image-tag"], cwd=checkout,
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert tag == f"{__version__}-{commit}"
    readme = (REPO / "README.md").read_text()
    assert "$(make -s image-name REGISTRY=registry.example.com:5000)" in readme
    assert '--set image.tag="$(make -s image-tag)"' in readme


@pytest.mark.parametrize(
    ("origin", "label"),
    [
        ("https://github.com/acme/numa-device-plugin", "https://github.com/acme/numa-device-plugin"),
        ("https://github.com/acme/numa-device-plugin.git", "https://github.com/acme/numa-device-plugin.git"),
        ("https://user:ghp_secret@github.com/acme/numa-device-plugin", ""),
        ("https://ghp_secret@github.com/acme/numa-device-plugin", ""),
        ("https://github.com/acme/repo?token=abc", ""),
        ("git@github.com:acme/numa-device-plugin.git", ""),
        ("/home/dev/numa-device-plugin", ""),
        ("../numa-device-plugin", ""),
        ("http://example.com/acme/repo", ""),
    ],
)  # fmt: skip
def test_the_source_label_is_only_a_clean_https_url(
    checkout: Path, origin: str, label: str
) -> None:
    git(checkout, "remote", "add", "origin", origin)
    out = dry_run(checkout, "image", CONTAINER_TOOL="buildah")
    match = re.search(r"--build-arg SOURCE=(\S*)", out)
    assert match is not None, out
    assert match[1] == label
