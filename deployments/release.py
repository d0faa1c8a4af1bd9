"""``make release VERSION=X.Y.Z``: the image for every platform as one image index, the
chart packaged for that image's digest, both pushed to a registry, and an annotated git
tag ``vX.Y.Z`` carrying the CHANGELOG entry.

Nothing is built before the checks pass: a clean work tree, no tag ``vX.Y.Z`` yet, the
version written in ``numa_device_plugin/__init__.py`` and ``Chart.yaml`` (``version``
and ``appVersion``), and a ``## [X.Y.Z]`` entry in ``CHANGELOG.md``. A failed check
exits 2 naming what to fix; a failed build or push exits 1 and tags nothing.

The image: one build per platform (``--platforms``, default linux/amd64 and
linux/arm64) into one manifest list, pushed with ``--all`` (buildah, podman) or by
``docker buildx build --push``; a platform foreign to this machine runs its ``RUN``
steps under qemu user emulation (binfmt_misc; Debian's ``qemu-user-static``).
``--base PLATFORM=IMAGE`` replaces the Dockerfile's base image for one platform (a
machine without a registry that has ``python:3.11-slim-bookworm``).

The chart: the chart folder copied, its ``image.repository`` and ``image.digest``
defaults set to what was pushed, packaged with ``version`` = ``appVersion`` = X.Y.Z
and pushed as an OCI artifact (``helm push … oci://REGISTRY/charts``).

The kubectl plugin: the package's wheel (``numa_device_plugin-X.Y.Z-py3-none-any.whl``,
which installs ``kubectl-numa``; ``pip install '<wheel>[top]'`` or ``pipx install``),
built from the checked commit, and the packaged chart, both in ``dist/vX.Y.Z/`` with
``SHA256SUMS``, to publish beside the image and chart (the tag's message lists the
checksums). A single-file zipapp is not made: the ``kubernetes`` client it needs
brings compiled packages (pydantic-core, aiohttp) no zip can load."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deployments" / "helm" / "numa-device-plugin"
NAME = "numa-device-plugin"
# Semantic versioning 2.0.0's version core and pre-release (no build metadata: an OCI tag
# cannot hold "+").
# The versions that can be released: X.Y.Z, or a pre-release X.Y.Z-alpha.N, -beta.N or
# -rc.N, the SemVer pre-releases with a PEP 440 twin (python_version): any other (0a,
# alpha-beta) setuptools would refuse or rename after the checks passed.
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-(alpha|beta|rc)\.(0|[1-9]\d*))?")
PRE_RELEASE = {"alpha": "a", "beta": "b", "rc": "rc"}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def python_version(version: str) -> str:
    """The package's version (PEP 440) for a release's ``version`` (SemVer, the image's
    tag and the chart's): ``1.0.0`` -> ``1.0.0``, ``1.0.0-rc.1`` -> ``1.0.0rc1``,
    ``-alpha.N`` -> ``aN``, ``-beta.N`` -> ``bN``: what ``__version__`` says and the
    wheel is named by. Raises ReleaseError for a version :data:`SEMVER` refuses."""
    match = SEMVER.fullmatch(version)
    if match is None:
        raise ReleaseError(f"{version[:80]!r} is not a releasable version")
    base = ".".join(match.group(1, 2, 3))
    return base if match[4] is None else f"{base}{PRE_RELEASE[match[4]]}{match[5]}"


class ReleaseError(Exception):
    """A check before the release failed; the message says what to fix."""


def run(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``argv`` echoed, run from the repository, its output captured as text; raises
    CalledProcessError on a non-zero exit."""
    shown = [arg if len(arg) <= 120 else arg[:117] + "..." for arg in argv]
    print("+ " + " ".join(shown), file=sys.stderr, flush=True)
    return subprocess.run(list(argv), cwd=REPO, check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def git(*args: str) -> str:
    """A git command's standard output (no echo: checks only read)."""
    result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def changelog_entry(text: str, version: str) -> str:
    """The body of ``## [version]`` (a date may follow) in a CHANGELOG's ``text``, up to
    the next ``## ``; ReleaseError when absent or empty."""
    lines = text.splitlines()
    heading = re.compile(rf"^## \[{re.escape(version)}\](\s|$)")
    for index, line in enumerate(lines):
        if heading.match(line):
            body = []
            for following in lines[index + 1 :]:
                if following.startswith("## "):
                    break
                body.append(following)
            entry = "\n".join(body).strip()
            if not entry:
                raise ReleaseError(f"CHANGELOG.md: the entry ## [{version}] is empty")
            return entry
    raise ReleaseError(f"CHANGELOG.md has no entry ## [{version}]: write what changed first")


def check(version: str, tagged: bool = False) -> str:
    """The checks before anything is built (module docstring); the CHANGELOG entry.
    ``tagged`` (CI building a pushed tag): the tag ``vX.Y.Z`` must exist and name this
    commit, instead of being absent. Raises ReleaseError."""
    if not SEMVER.fullmatch(version):
        shown = version if len(version) <= 80 else f"{version[:80]}... ({len(version)} characters)"
        raise ReleaseError(f"VERSION={shown!r} is not a version X.Y.Z or X.Y.Z-alpha.N, "
                           "-beta.N, -rc.N (semver, no +build)")  # fmt: skip
    changes = git("status", "--porcelain")
    if changes.strip():
        first = changes.splitlines()[0]
        raise ReleaseError(f"the work tree has changes ({first.strip()}, ...): commit them first")
    exists = bool(git("tag", "--list", f"v{version}").strip())
    if tagged:
        if not exists or git("rev-parse", f"v{version}^{{commit}}") != git("rev-parse", "HEAD"):
            raise ReleaseError(f"--tagged: the tag v{version} does not name this commit")
    elif exists:
        raise ReleaseError(f"the tag v{version} exists: a released version is never rebuilt")
    init = (REPO / "numa_device_plugin" / "__init__.py").read_text()
    written = re.search(r'__version__ = "([^"]+)"', init)
    python = python_version(version)
    if written is None or written[1] != python:
        found = written[1] if written else "none"
        raise ReleaseError(
            f"numa_device_plugin/__init__.py says __version__ {found}, not {python}"
            + (f" (PEP 440 for {version})" if python != version else "")
        )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for key in ("version", "appVersion"):
        if str(chart.get(key)) != version:
            raise ReleaseError(f"Chart.yaml says {key} {chart.get(key)}, not {version}")
    return changelog_entry((REPO / "CHANGELOG.md").read_text(), version)


def build_and_push_image(
    tool: str,
    image: str,
    platforms: list[str],
    bases: dict[str, str],
    build_flags: list[str],
    push_flags: list[str],
    labels: dict[str, str],
) -> str:
    """Build ``image`` for each of ``platforms`` into one manifest list and push it with
    every platform; the pushed index's digest (``sha256:…``)."""
    args = [arg for key, value in labels.items() for arg in ("--build-arg", f"{key}={value}")]
    with tempfile.TemporaryDirectory() as scratch:
        digest_file = Path(scratch) / "digest"
        if tool == "docker":
            base = sorted(set(bases.values()))
            if len(base) > 1:
                raise ReleaseError("docker buildx takes one base image for all platforms")
            try:
                run(["docker", "buildx", "build", "--platform", ",".join(platforms), *args,
                     *(["--build-arg", f"PYTHON_IMAGE={base[0]}"] if base else []),
                     *build_flags, "--metadata-file", str(digest_file), "--push", "-t",
                     image, "."])  # fmt: skip
            except subprocess.CalledProcessError as exc:
                raise ReleaseError(
                    _build_failed("docker buildx", ",".join(platforms), exc.returncode)
                ) from None
            digest = str(json.loads(digest_file.read_text())["containerd.image.digest"])
        else:  # buildah, podman: a manifest list built platform by platform
            for stale in (["manifest", "rm", image], ["rmi", "--force", image]):
                subprocess.run([tool, *stale], cwd=REPO, capture_output=True)
            run([tool, "manifest", "create", image], stdout=subprocess.DEVNULL)
            for platform in platforms:
                own = bases.get(platform)
                try:
                    run([tool, "build", "--platform", platform, "--manifest", image, *args,
                         *(["--build-arg", f"PYTHON_IMAGE={own}"] if own else []),
                         *build_flags, "."])  # fmt: skip
                except subprocess.CalledProcessError as exc:
                    raise ReleaseError(_build_failed(tool, platform, exc.returncode)) from None
            run([tool, "manifest", "push", "--all", *push_flags, "--digestfile",
                 str(digest_file), image, f"docker://{image}"])  # fmt: skip
            digest = digest_file.read_text().strip()
    if not DIGEST.fullmatch(digest):
        raise ReleaseError(f"the push reported {digest!r}, not a sha256 digest")
    return digest


def _build_failed(tool: str, platform: str, code: int) -> str:
    """What to say when an image build failed: the step, and the usual cause offline
    (the base image cannot be pulled) with its fix."""
    return (
        f"{tool} build for {platform} exited {code} (its output is above). Offline, or "
        "where the base image cannot be pulled, give one per platform that is here: "
        "RELEASE_FLAGS='--base linux/amd64=IMAGE --base linux/arm64=IMAGE' (buildah: "
        "BUILD_FLAGS=--pull=never)"
    )


def chart_for(folder: Path, repository: str, digest: str) -> None:
    """In a copy of the chart at ``folder``: ``image.repository`` and ``image.digest``
    default to the pushed image (values.yaml's text edited, its comments kept)."""
    values = folder / "values.yaml"
    text = values.read_text()
    text, repositories = re.subn(
        r"(?m)^(  repository: ).*$", lambda m: m[1] + repository, text, count=1
    )
    text, digests = re.subn(
        r'(?m)^(  digest: )"".*$', lambda m: m[1] + f'"{digest}"', text, count=1
    )
    if (repositories, digests) != (1, 1):
        raise ReleaseError("values.yaml: no image.repository or image.digest line to set")
    values.write_text(text)


def package_and_push_chart(
    helm: str, version: str, repository: str, digest: str, target: str, plain_http: bool,
    keep: Path | None = None,
) -> str:  # fmt: skip
    """The chart for ``repository@digest``, packaged as ``version`` and pushed to the OCI
    ``target`` (``oci://REGISTRY/charts``), the package copied into ``keep`` when given;
    the chart's digest."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / NAME
        shutil.copytree(CHART, folder)
        chart_for(folder, repository, digest)
        run([helm, "lint", "--strict", str(folder)], stdout=subprocess.DEVNULL)
        run([helm, "package", str(folder), "--version", version, "--app-version", version,
             "--destination", scratch], stdout=subprocess.DEVNULL)  # fmt: skip
        package = Path(scratch) / f"{NAME}-{version}.tgz"
        if keep is not None:
            shutil.copy2(package, keep / package.name)
        pushed = run([helm, "push", str(package), target,
                      *(["--plain-http"] if plain_http else [])],
                     capture_output=True)  # fmt: skip
    said = pushed.stdout + pushed.stderr
    found = re.search(r"Digest: (sha256:[0-9a-f]{64})", said)
    if found is None:
        raise ReleaseError(f"helm push did not report a digest: {said.strip()}")
    return found[1]


def build_wheel(python: str, version: str, dist: Path) -> Path:
    """The package's wheel, built by ``python -m pip wheel`` into ``dist`` from a clean
    export of the commit (``git archive HEAD``: a git-ignored ``build/lib`` left by an
    earlier build never reaches it), named by :func:`python_version`. Raises
    ReleaseError when it is not there after."""
    with tempfile.TemporaryDirectory(prefix="ndp-release-") as folder:
        tree = Path(folder) / "tree"
        tree.mkdir()
        run(["git", "-C", str(REPO), "archive", "--format=tar", "--output",
             str(Path(folder) / "tree.tar"), "HEAD"])  # fmt: skip
        run(["tar", "-xf", str(Path(folder) / "tree.tar"), "-C", str(tree)])
        run([python, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--wheel-dir", str(dist), str(tree)], stdout=subprocess.DEVNULL)  # fmt: skip
    wheel = dist / f"{NAME.replace('-', '_')}-{python_version(version)}-py3-none-any.whl"
    if not wheel.is_file():
        raise ReleaseError(f"pip wheel made no {wheel.name} in {dist}")
    return wheel


def checksums(dist: Path) -> str:
    """``SHA256SUMS`` of every file in ``dist`` (``sha256sum`` format), written there too."""
    import hashlib

    lines = [
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n"
        for path in sorted(dist.iterdir())
        if path.is_file() and path.name != "SHA256SUMS"
    ]
    (dist / "SHA256SUMS").write_text("".join(lines))
    return "".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make release", description=__doc__.split("\n")[0])
    parser.add_argument("version", help="X.Y.Z: what __init__.py, Chart.yaml and CHANGELOG say")
    parser.add_argument("--registry", required=True, help="HOST[:PORT][/PATH] to push to")
    parser.add_argument("--tool", required=True, choices=("buildah", "podman", "docker"))
    parser.add_argument("--platforms", default="linux/amd64,linux/arm64",
                        help="comma-separated (default: %(default)s)")  # fmt: skip
    parser.add_argument("--base", action="append", default=[], metavar="PLATFORM=IMAGE",
                        help="one platform's base image (default: the Dockerfile's)")  # fmt: skip
    parser.add_argument("--build-flags", default="", help="more flags for each build")
    parser.add_argument("--push-flags", default="", help="more flags for the image push")
    parser.add_argument("--plain-http", action="store_true",
                        help="the registry speaks plain HTTP (helm push --plain-http)")  # fmt: skip
    parser.add_argument("--helm", default="helm", help="the helm program")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python that builds the wheel (default: this one)")  # fmt: skip
    parser.add_argument("--source", default="", help="the image's source label")
    parser.add_argument("--tagged", action="store_true",
                        help="CI on a pushed tag vX.Y.Z: build it, tag nothing")  # fmt: skip
    args = parser.parse_args(argv)
    bases = {}
    for item in args.base:
        platform, sep, image = item.partition("=")
        if not sep or not image:
            parser.error(f"--base {item!r}: PLATFORM=IMAGE")
        bases[platform] = image
    args.bases = bases
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Release; 0 when all was pushed and tagged, 2 for a failed check, 1 when a
    build, push or tag failed (nothing is tagged then)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    version = args.version
    try:
        entry = check(version, args.tagged)
    except ReleaseError as exc:
        print(f"make release: {exc}", file=sys.stderr)
        return 2
    repository = f"{args.registry}/{NAME}"
    image = f"{repository}:{version}"
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()]
    # The commit checked and built: the tag names it, whatever HEAD is by the end (a
    # commit made while the images build must not get the release's tag).
    revision = git("rev-parse", "HEAD").strip()
    labels = {"VERSION": version, "REVISION": revision, "SOURCE": args.source}
    target = f"oci://{args.registry}/charts"
    dist = REPO / "dist" / f"v{version}"
    try:
        if dist.exists():
            shutil.rmtree(dist)
        dist.mkdir(parents=True)
        wheel = build_wheel(args.python, version, dist)
        digest = build_and_push_image(
            args.tool, image, platforms, args.bases,
            args.build_flags.split(), args.push_flags.split(), labels,
        )  # fmt: skip
        chart_digest = package_and_push_chart(
            args.helm, version, repository, digest, target, args.plain_http, dist
        )
        sums = checksums(dist)
        message = (
            f"{NAME} {version}\n\n{entry}\n\n"
            f"image: {image}@{digest} ({', '.join(platforms)})\n"
            f"chart: {target}/{NAME} {version} ({chart_digest})\n"
            f"files (SHA256SUMS):\n{sums}"
        )
        if not args.tagged:  # CI on a pushed tag: the tag is there already
            run(["git", "tag", "--annotate", "--cleanup=whitespace", f"v{version}",
                 "--message", message, revision])  # fmt: skip
    except (subprocess.CalledProcessError, ReleaseError, OSError) as exc:
        # nothing released: no file of it left to publish by mistake (a wheel without
        # its SHA256SUMS was)
        shutil.rmtree(dist, ignore_errors=True)
        print(f"make release: {exc}; nothing was tagged, {dist.relative_to(REPO)}/ removed",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"released {NAME} {version}")
    print(f"image:   {image}@{digest} ({', '.join(platforms)})")
    print(f"chart:   {target}/{NAME} --version {version} ({chart_digest})")
    if not args.tagged:
        print(f"tag:     v{version} (publish it: git push origin v{version})")
    print(f"files:   {dist.relative_to(REPO)}/ ({wheel.name}, the chart, SHA256SUMS):"
          " publish them beside the image and chart")  # fmt: skip
    print("install:")
    print(f"  helm install {NAME} {target}/{NAME} --version {version} --namespace kube-system \\")
    print(f"    --set image.digest={digest}{' --plain-http' if args.plain_http else ''}")
    print(f"  pip install '{wheel.name}[top]'   # kubectl numa, from the published file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
