"""``make release`` (deployments/release.py), offline: the checks that refuse a release
(a dirty tree, an existing tag, a version the files do not all say, no CHANGELOG
entry), the chart pinned to the pushed digest, and a whole release against stand-in
image and chart pushes: what it runs per platform, the tag it makes, and that nothing is
tagged when a push fails. The real release (buildah, qemu, a registry) is in the note of
the session that ran it and in docs/development.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, load_script
from tests.deployments.test_helm import helm

DIGEST = "sha256:" + "cd" * 32
CHART_DIGEST = "sha256:" + "ef" * 32
ENTRY = "### Added\n- resources that follow a device"


def load_release() -> ModuleType:
    return load_script(REPO / "deployments" / "release.py", "release")


def git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, Path]:
    """release.py pointed at a small committed repository saying version 0.2.0 everywhere
    (the real chart, its version set)."""
    folder = tmp_path / "repo"
    (folder / "numa_device_plugin").mkdir(parents=True)
    (folder / "numa_device_plugin" / "__init__.py").write_text('__version__ = "0.2.0"\n')
    chart = folder / "deployments" / "helm" / "numa-device-plugin"
    shutil.copytree(REPO / "deployments" / "helm" / "numa-device-plugin", chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta.update(version="0.2.0", appVersion="0.2.0")
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    (folder / "CHANGELOG.md").write_text(
        f"# Changelog\n\n## [0.2.0] - 2026-11-27\n\n{ENTRY}\n\n## [0.1.0] - 2026-11-24\n\n- first\n"
    )
    (folder / ".gitignore").write_text("dist/\n")  # as the repository's own
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "0.2.0")
    release = load_release()
    monkeypatch.setattr(release, "REPO", folder)
    monkeypatch.setattr(release, "CHART", chart)

    def wheel(python: str, version: str, dist: Path) -> Path:  # the real one: its own test
        made = dist / f"numa_device_plugin-{version}-py3-none-any.whl"
        made.write_bytes(b"PK stand-in wheel")
        return made

    monkeypatch.setattr(release, "build_wheel", wheel)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@example.com")
    return release, folder


def test_the_checks_pass_for_a_clean_tree_saying_the_version_everywhere(
    project: tuple[ModuleType, Path],
) -> None:
    release, _ = project
    assert release.check("0.2.0") == ENTRY


@pytest.mark.parametrize(
    ("change", "version", "needle"),
    [
        (None, "0.2", "is not a version X.Y.Z"),
        (None, "0.2.0+build.1", "is not a version"),
        (None, "2.0.0-alpha-beta", "is not a version"),  # setuptools refused it later
        (None, "3.0.0-0a", "is not a version"),
        (None, "1.0.0-rc.1", "__version__ 0.2.0, not 1.0.0rc1 (PEP 440 for 1.0.0-rc.1)"),
        ("dirty", "0.2.0", "the work tree has changes (?? stray.txt"),
        ("tagged", "0.2.0", "the tag v0.2.0 exists"),
        (None, "0.3.0", "__version__ 0.2.0, not 0.3.0"),
        ("chart", "0.2.0", "Chart.yaml says appVersion 0.1.9, not 0.2.0"),
        ("no-entry", "0.2.0", "CHANGELOG.md has no entry ## [0.2.0]"),
        ("empty-entry", "0.2.0", "the entry ## [0.2.0] is empty"),
    ],
)
def test_a_release_is_refused_before_anything_is_built(
    project: tuple[ModuleType, Path], change: str | None, version: str, needle: str
) -> None:
    release, folder = project
    changelog = folder / "CHANGELOG.md"
    if change == "dirty":
        (folder / "stray.txt").write_text("x")
    elif change == "tagged":
        git(folder, "tag", "-a", "v0.2.0", "-m", "0.2.0")
    elif change == "chart":
        path = folder / "deployments" / "helm" / "numa-device-plugin" / "Chart.yaml"
        path.write_text(path.read_text().replace("appVersion: 0.2.0", "appVersion: 0.1.9"))
    elif change == "no-entry":
        changelog.write_text(changelog.read_text().replace("## [0.2.0]", "## [Unreleased]"))
    elif change == "empty-entry":
        changelog.write_text("## [0.2.0]\n\n## [0.1.0]\n- first\n")
    if change in ("chart", "no-entry", "empty-entry"):
        git(folder, "commit", "-qam", "edit")
    with pytest.raises(release.ReleaseError) as raised:
        release.check(version)
    assert needle in str(raised.value)


def test_the_released_chart_defaults_to_the_pushed_image_by_digest(tmp_path: Path) -> None:
    release = load_release()
    folder = tmp_path / "numa-device-plugin"
    shutil.copytree(REPO / "deployments" / "helm" / "numa-device-plugin", folder)
    release.chart_for(folder, "registry.example.com/numa-device-plugin", DIGEST)
    text = (folder / "values.yaml").read_text()
    assert "# -- the plugin's image" in text  # the comments (the values reference) kept
    rendered = subprocess.run(
        [helm(), "template", "x", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    (daemonset,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet"]
    (plugin,) = daemonset["spec"]["template"]["spec"]["containers"]
    version = yaml.safe_load((folder / "Chart.yaml").read_text())["appVersion"]
    assert plugin["image"] == f"registry.example.com/numa-device-plugin:{version}@{DIGEST}"


def stand_in(path: Path, body: str) -> str:
    """An executable shell script at ``path``; its path."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_tools(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    push_fails: bool = False,
    digest: str = DIGEST,
    helm_push: str = "",
    build_fails: bool = False,
) -> tuple[str, Path]:
    """A ``buildah`` (first on PATH) that logs its arguments and writes DIGEST to
    --digestfile, and a helm that is the real one except ``push`` (which prints what helm
    prints); the helm's path and the file their calls are logged in."""
    calls = folder / "calls.log"
    offline = 'if [ "$1" = build ]; then echo "Error: pulling python: no route" >&2; exit 125; fi'
    stand_in(folder / "buildah", f"""echo "buildah $*" >> {calls}
{offline if build_fails else ""}
if [ "$1 $2" = "manifest push" ]; then
  {"exit 1" if push_fails else ""}
  while [ $# -gt 0 ]; do
    if [ "$1" = --digestfile ]; then printf '{digest}' > "$2"; fi; shift
  done
fi
""")  # fmt: skip
    fake_helm = stand_in(folder / "helm", f"""echo "helm $*" >> {calls}
if [ "$1" = push ]; then
  {helm_push}
  echo "Pushed: registry.test:5000/charts/numa-device-plugin:0.2.0"
  echo "Digest: {CHART_DIGEST}"; exit 0
fi
exec {helm()} "$@"
""")  # fmt: skip
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return fake_helm, calls


def test_a_release_builds_each_platform_pushes_image_and_chart_and_tags(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    release, folder = project
    fake_helm, calls = fake_tools(tmp_path, monkeypatch)
    # An earlier attempt's files: neither published nor listed in SHA256SUMS
    stale = folder / "dist" / "v0.2.0"
    stale.mkdir(parents=True)
    (stale / "numa_device_plugin-0.1.9-py3-none-any.whl").write_text("an earlier attempt")
    code = release.main([
        "0.2.0", "--registry", "registry.test:5000", "--tool", "buildah", "--helm", fake_helm,
        "--base", "linux/arm64=localhost/base:arm64", "--push-flags=--tls-verify=false",
        "--plain-http",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    image = "registry.test:5000/numa-device-plugin:0.2.0"
    log = calls.read_text().splitlines()
    builds = [line for line in log if line.startswith("buildah build ")]
    assert len(builds) == 2
    assert "--platform linux/amd64 --manifest " + image in builds[0]
    assert "PYTHON_IMAGE" not in builds[0]
    assert "--platform linux/arm64 --manifest " + image in builds[1]
    assert "--build-arg PYTHON_IMAGE=localhost/base:arm64" in builds[1]
    assert "--build-arg VERSION=0.2.0" in builds[1]
    (push,) = [line for line in log if line.startswith("buildah manifest push")]
    assert "--all --tls-verify=false" in push
    assert push.endswith(f"{image} docker://{image}")
    (chart_push,) = [line for line in log if line.startswith("helm push")]
    assert "numa-device-plugin-0.2.0.tgz oci://registry.test:5000/charts --plain-http" in chart_push
    message = git(folder, "tag", "-l", "--format=%(contents)", "v0.2.0")
    assert ENTRY in message
    assert f"image: {image}@{DIGEST} (linux/amd64, linux/arm64)" in message
    assert f"{image}@{DIGEST}" in out
    assert (
        "helm install numa-device-plugin oci://registry.test:5000/charts/numa-device-plugin" in out
    )
    assert f"--set image.digest={DIGEST}" in out
    dist = folder / "dist" / "v0.2.0"
    files = sorted(path.name for path in dist.iterdir())
    assert files == ["SHA256SUMS", "numa-device-plugin-0.2.0.tgz",
                     "numa_device_plugin-0.2.0-py3-none-any.whl"]  # fmt: skip
    sums = (dist / "SHA256SUMS").read_text()
    assert "0.1.9" not in sums
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert sums in message
    assert "pip install 'numa_device_plugin-0.2.0-py3-none-any.whl[top]'" in out


def test_the_release_wheel_installs_kubectl_numa(tmp_path: Path) -> None:
    """The wheel make release ships is this package, with the kubectl-numa command."""
    import zipfile

    from numa_device_plugin import __version__

    wheel = load_release().build_wheel(sys.executable, __version__, tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        text = archive.read(entry_points).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "kubectl-numa = numa_device_plugin.cli.top:kubectl_main" in text
    assert "numa_device_plugin/cli/check.py" in names
    # the SPDX expression (PEP 639): the table form setuptools warns of until 2027-02-18
    assert b"\nLicense-Expression: Apache-2.0\n" in metadata
    assert b"\nLicense-File: LICENSE\n" in metadata


def test_the_tag_names_the_commit_that_was_built_not_a_later_head(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit made while the images build (seen: make release on a checkout someone
    committed to meanwhile) must not get the release's tag."""
    release, folder = project
    built = git(folder, "rev-parse", "HEAD").strip()
    fake_helm, _ = fake_tools(tmp_path, monkeypatch)
    real_package = release.package_and_push_chart

    def package_then_commit(*args: Any) -> str:
        git(folder, "commit", "-q", "--allow-empty", "-m", "meanwhile")
        digest: str = real_package(*args)
        return digest

    monkeypatch.setattr(release, "package_and_push_chart", package_then_commit)
    assert release.main(["0.2.0", "--registry", "r.test", "--tool", "buildah",
                         "--helm", fake_helm]) == 0  # fmt: skip
    assert git(folder, "rev-parse", "v0.2.0^{commit}").strip() == built
    assert git(folder, "rev-parse", "HEAD").strip() != built


def test_tagged_releases_the_pushed_tag_and_makes_no_other(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI on a pushed tag: build and push, exit 0, the tag as it was."""
    release, folder = project
    git(folder, "tag", "-a", "v0.2.0", "-m", "as pushed")
    fake_helm, calls = fake_tools(tmp_path, monkeypatch)
    assert release.main(["0.2.0", "--registry", "r.test", "--tool", "buildah",
                         "--helm", fake_helm, "--tagged"]) == 0  # fmt: skip
    assert git(folder, "tag", "-l", "--format=%(contents)", "v0.2.0").strip() == "as pushed"
    assert any(line.startswith("helm push") for line in calls.read_text().splitlines())


def test_a_failed_push_tags_nothing_and_exits_1(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    release, folder = project
    fake_helm, calls = fake_tools(tmp_path, monkeypatch, push_fails=True)
    code = release.main(["0.2.0", "--registry", "r.test", "--tool", "buildah", "--helm", fake_helm])
    assert code == 1
    assert "nothing was tagged" in capsys.readouterr().err
    assert git(folder, "tag", "-l") == ""
    assert not [line for line in calls.read_text().splitlines() if line.startswith("helm push")]


def test_tagged_builds_the_pushed_tags_commit_and_refuses_another(
    project: tuple[ModuleType, Path],
) -> None:
    """CI on a pushed tag (``--tagged``): the tag must name HEAD; nothing is refused for
    its existing."""
    release, folder = project
    with pytest.raises(release.ReleaseError, match="does not name this commit"):
        release.check("0.2.0", tagged=True)
    git(folder, "tag", "-a", "v0.2.0", "-m", "0.2.0")
    assert release.check("0.2.0", tagged=True) == ENTRY
    git(folder, "commit", "-q", "--allow-empty", "-m", "later")
    with pytest.raises(release.ReleaseError, match="does not name this commit"):
        release.check("0.2.0", tagged=True)


def test_an_image_build_that_fails_offline_names_the_base_flags_and_leaves_no_files(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without network buildah cannot pull the base: it was a raw "Command [...] returned
    non-zero exit status 125" and a wheel left in dist/vX.Y.Z without SHA256SUMS."""
    release, folder = project
    fake_helm, _ = fake_tools(tmp_path, monkeypatch, build_fails=True)
    code = release.main(["0.2.0", "--registry", "r.test", "--tool", "buildah", "--helm", fake_helm])
    err = capsys.readouterr().err
    assert code == 1
    assert "buildah build for linux/amd64 exited 125" in err
    assert "RELEASE_FLAGS='--base linux/amd64=IMAGE --base linux/arm64=IMAGE'" in err
    assert "Command '[" not in err
    assert "nothing was tagged, dist/v0.2.0/ removed" in err
    assert not (folder / "dist" / "v0.2.0").exists()
    assert git(folder, "tag", "-l") == ""


def test_make_release_needs_an_explicit_registry() -> None:
    """The development default (registry.local:5000) is never a release's silently."""
    env = {k: v for k, v in os.environ.items() if k != "REGISTRY"}
    result = subprocess.run(
        ["make", "-s", "-C", str(REPO), "release", "VERSION=9.9.9", "CONTAINER_TOOL=buildah"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode != 0
    assert "make release needs REGISTRY=HOST[:PORT]" in result.stderr
    assert "registry.local:5000 is only the development default" in result.stderr


def test_make_release_needs_an_explicit_version() -> None:
    result = subprocess.run(
        ["make", "-s", "-C", str(REPO), "release", "CONTAINER_TOOL=buildah"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "make release needs VERSION=X.Y.Z" in result.stderr


def test_a_bad_flag_exits_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    release = load_release()
    with pytest.raises(SystemExit) as exited:
        release.main(["0.2.0", "--registry", "r", "--tool", "buildah", "--base", "arm64"])
    assert exited.value.code == 2
    err: Any = capsys.readouterr().err
    assert err.startswith("usage: make release")
    assert "PLATFORM=IMAGE" in err


def test_this_checkout_says_one_version_everywhere_with_a_changelog_entry() -> None:
    """What make release checks, on this checkout: __init__.py, Chart.yaml (version and
    appVersion) and CHANGELOG.md say the same version (the version bump is one commit)."""
    from numa_device_plugin import __version__

    release = load_release()
    chart = yaml.safe_load((REPO / "deployments/helm/numa-device-plugin/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert release.changelog_entry((REPO / "CHANGELOG.md").read_text(), __version__)


@pytest.mark.parametrize(
    "version",
    [
        '9.9.8"; touch {marker}; "',
        "9.9.8`touch {marker}`",
        "9.9.8$(touch {marker})",
        "$(shell touch {marker})",
        "-9.9.8; touch {marker}",
        "9" * 10_000 + ";touch {marker}",
    ],
    ids=["quote", "backtick", "subshell", "make-function", "dash", "10KB"],
)
def test_make_release_never_lets_a_shell_or_make_read_version(tmp_path: Path, version: str) -> None:
    """The recipe put $(VERSION) inside double quotes: a VERSION from a tag name ran
    commands. release.py gets it byte for byte, and the echoed recipe stays short."""
    marker = tmp_path / "ran"
    version = version.replace("{marker}", str(marker))
    seen = tmp_path / "argv.json"
    stub = tmp_path / "python"
    stub.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    stub.chmod(0o755)
    result = subprocess.run(
        ["make", "-C", str(REPO), "-o", "install", "-o", "helm", "release",
         f"VERSION={version}", f"PY={stub}", "CONTAINER_TOOL=buildah", "REGISTRY=r:5000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    argv = json.loads(seen.read_text())
    assert argv[-2:] == ["--", version]
    assert argv[argv.index("--registry") + 1] == "r:5000"
    assert len(result.stdout) + len(result.stderr) < 2_000


def test_a_long_version_is_refused_with_a_bounded_echo() -> None:
    release = load_release()
    with pytest.raises(release.ReleaseError) as refused:
        release.check("9" * 10_000 + "x")
    assert len(str(refused.value)) < 300
    assert "(10001 characters)" in str(refused.value)


@pytest.mark.parametrize(
    ("tools", "said"),
    [
        ({"digest": "not-a-digest"}, "the push reported 'not-a-digest', not a sha256 digest"),
        ({"helm_push": "echo 'Error: denied' >&2; exit 1"}, "returned non-zero exit status 1"),
        (
            {"helm_push": "echo 'Pushed: somewhere'; exit 0"},
            "helm push did not report a digest: Pushed: somewhere",
        ),
    ],
    ids=["manifest-push-digest", "chart-push-fails", "chart-push-no-digest"],
)
def test_a_failed_manifest_or_chart_push_tags_nothing_and_exits_1(
    project: tuple[ModuleType, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tools: dict[str, str],
    said: str,
) -> None:
    """The image index pushed but its digest unreadable, or the chart's push failing or
    saying no digest: exit 1, the reason said, no tag."""
    release, folder = project
    fake_helm, _ = fake_tools(tmp_path, monkeypatch, **tools)  # type: ignore[arg-type]
    code = release.main(["0.2.0", "--registry", "r.test", "--tool", "buildah", "--helm", fake_helm])
    err = capsys.readouterr().err
    assert code == 1
    assert said in err
    assert "nothing was tagged" in err
    assert git(folder, "tag", "-l") == ""


@pytest.mark.parametrize(
    ("version", "python"),
    [("1.2.3", "1.2.3"), ("1.0.0-rc.1", "1.0.0rc1"), ("1.0.0-alpha.0", "1.0.0a0"),
     ("10.20.30-beta.12", "10.20.30b12")],
)  # fmt: skip
def test_a_semver_pre_release_maps_to_its_pep_440_twin(version: str, python: str) -> None:
    assert load_release().python_version(version) == python


@pytest.mark.parametrize("version", ["1.0.0-rc", "1.0.0-rc.01", "1.0.0-dev.1", "1.0.0-RC.1"])
def test_a_pre_release_without_a_pep_440_twin_is_refused(version: str) -> None:
    release = load_release()
    with pytest.raises(release.ReleaseError, match="is not a releasable version"):
        release.python_version(version)


def test_an_rc_wheel_is_built_from_the_commit_named_by_pep_440(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.0.0-rc.1 end to end for the wheel: the commit's own files (a module left in a
    git-ignored build/lib by an earlier build stays out), named 1.0.0rc1 as pip names
    it (the release once stopped: "pip wheel made no ...whl")."""
    import zipfile

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    init = clone / "numa_device_plugin" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', '__version__ = "1.0.0rc1"',
                           init.read_text()))  # fmt: skip
    git(clone, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "rc")
    stale = clone / "build" / "lib" / "numa_device_plugin" / "stale_leftover.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("LEFT = True\n")
    release = load_release()
    monkeypatch.setattr(release, "REPO", clone)
    wheel = release.build_wheel(sys.executable, "1.0.0-rc.1", tmp_path / "dist")
    assert wheel.name == "numa_device_plugin-1.0.0rc1-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "numa_device_plugin/cli/check.py" in names
    assert not [name for name in names if "stale_leftover" in name]
