"""What we ship, on the one-machine cluster: the image built by ``make image`` over a Python
base, pushed by ``make push`` to a local registry, and installed with the README's own
commands (``PLUGIN=kustomize`` or ``PLUGIN=helm``; ``PLUGIN=process`` runs the checkout).

The pure functions render the files (buildah's storage, the registry's configuration,
containerd's ``hosts.toml``, the bridge CNI network) and read the install command out of
the README; :func:`build_image` and :func:`push_image` run on the host, each in a private
namespace (:mod:`cluster` starts them), so the host keeps no trace of either. The facts
behind each choice are in ``../shared/REAL-CLUSTER.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

MODES = ("process", "kustomize", "helm")
# The registry the manifests and the chart name by default; the private namespace's
# /etc/hosts maps it to 127.0.0.1.
REGISTRY = "registry.local:5000"
# What the README's deploy commands write for the user's registry.
README_REGISTRY = "registry.example.com:5000"
# The node's address: on the CNI bridge (this kernel has no dummy network driver).
BRIDGE = "cni0"
NODE_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/16"
SERVICE_RANGE = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # the ``kubernetes`` Service's ClusterIP: first of the range
# The stand-in for python:3.11-slim-bookworm where no image registry is reachable.
STANDIN_IMAGE = "localhost/python-standin:3.11-bookworm"
STANDIN_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3",
                    "ca-certificates")  # fmt: skip
# What Debian's slim images leave out and the image never reads: apt's package lists (no
# apt-get runs in the Dockerfile), translations, documentation. Without them the base
# layer the workers pull is ~100 MB smaller (it was 249 MB, 93 MB compressed).
STANDIN_DROPPED = ("var/lib/apt/lists", "var/cache/apt", "usr/share/locale", "usr/share/doc",
                   "usr/share/man", "usr/share/info")  # fmt: skip
# Bumped whenever the stand-in's content changes: a cached archive of an older one is
# made again instead of being used.
STANDIN_REVISION = 2
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS = {  # program: the Debian package that has it
    "buildah": "buildah",
    "docker-registry": "docker-registry",
    "debootstrap": "debootstrap",
    "iptables": "iptables",
    "ip": "iproute2",
    "kubectl": "kubectl (Kubernetes' apt repository)",
}


def mode_wanted(value: str) -> str:
    """``PLUGIN``: empty → ``process``; one of :data:`MODES`. Raises ValueError."""
    mode = value.strip().lower() or "process"
    if mode not in MODES:
        raise ValueError(f"PLUGIN={value!r}: use one of {', '.join(MODES)}")
    return mode


def missing_tools(helm: Path | None) -> list[str]:
    """What the image modes need and this machine lacks, one line each."""
    lines = [
        f"{program}: not on PATH (Debian package {package})"
        for program, package in TOOLS.items()
        if shutil.which(program) is None
    ]
    if not (CNI_BIN_DIR / "bridge").is_file():
        lines.append(f"{CNI_BIN_DIR / 'bridge'}: missing (Debian package "
                     "containernetworking-plugins)")  # fmt: skip
    if helm is None:
        lines.append("helm: not on PATH nor in .venv/bin (make helm)")
    elif under_private_tmp(helm):
        lines.append(f"helm at {helm.resolve()}: the tests run with a /tmp of their own and "
                     "cannot reach it there; put helm outside /tmp (make helm puts it into "
                     ".venv/bin)")  # fmt: skip
    return lines


def under_private_tmp(path: Path) -> bool:
    """Whether ``path`` (resolved) is under /tmp, which the tests' mount namespace
    replaces with a private one (a tool found there installs the chart, then every test
    failed with FileNotFoundError)."""
    return Path("/tmp") in path.resolve().parents


# --- pure renderers ------------------------------------------------------------------------


def storage_conf(root: Path) -> str:
    """containers-storage.conf(5) keeping buildah's images under ``root`` (the ``vfs``
    driver: it works on any file system, overlays and 9p included)."""
    return f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'


def registry_config(storage: Path, address: str = "127.0.0.1:5000") -> str:
    """The configuration of Debian's ``docker-registry`` (distribution 2.8): plain HTTP
    on ``address``, blobs under ``storage``, deletes allowed (the tests retag)."""
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"addr": address},
        }
    )  # JSON is YAML: the registry reads it


def hosts_toml(registry: str) -> str:
    """containerd's ``certs.d/<registry>/hosts.toml``: pull from ``registry`` over plain
    HTTP (containerd 1.6 reads it through the CRI plugin's ``config_path``)."""
    return (
        f'server = "http://{registry}"\n\n[host."http://{registry}"]\n'
        '  capabilities = ["pull", "resolve"]\n  skip_verify = true\n'
    )


def cni_network(subnet: str = POD_SUBNET, gateway: str = NODE_IP) -> dict[str, Any]:
    """The pod network: one bridge (:data:`BRIDGE`, which the harness makes and gives the
    gateway's address) with host-local addresses from ``subnet`` (a worker of the test
    cluster passes its own)."""
    return {
        "cniVersion": "0.4.0",
        "name": "numa-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def network_commands(apiserver_port: int) -> list[list[str]]:
    """Inside the cluster's network namespace: loopback up, the bridge with the node's
    address, and the ``kubernetes`` Service's ClusterIP sent to the API server (what
    kube-proxy would do for that one Service)."""
    return [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{NODE_IP}/16", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
        ["iptables", "-t", "nat", "-A", "PREROUTING", "-d", f"{SERVICE_IP}/32", "-p", "tcp",
         "--dport", "443", "-j", "DNAT", "--to-destination", f"{NODE_IP}:{apiserver_port}"],
        ["iptables", "-t", "nat", "-A", "OUTPUT", "-d", f"{SERVICE_IP}/32", "-p", "tcp",
         "--dport", "443", "-j", "DNAT", "--to-destination", f"{NODE_IP}:{apiserver_port}"],
    ]  # fmt: skip


def etc_hosts(node: str) -> str:
    """The namespace's ``/etc/hosts``: the registry on loopback, the node on the bridge
    (``kubectl logs``/``exec`` reach the kubelet by the node's name)."""
    return (f"127.0.0.1 localhost {REGISTRY.partition(':')[0]}\n"
            f"{NODE_IP} {node}\n")  # fmt: skip


def readme_command(readme: str, mode: str, registry: str = REGISTRY) -> str:
    """The README's install command for ``mode`` (``kustomize``: the line that pipes
    ``kubectl kustomize deployments/`` into ``kubectl apply``; ``helm``: ``helm install``
    with its continuation lines), comment dropped, :data:`README_REGISTRY` replaced by
    ``registry``. Raises LookupError when the README has no such command."""
    start = {
        "kustomize": "kubectl kustomize deployments/ |",
        "helm": "helm install numa-device-plugin deployments/",
        "release": "helm install numa-device-plugin oci://",
    }[mode]
    lines = readme.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(start):
            command = line
            while command.rstrip().endswith("\\"):
                index += 1
                command = command.rstrip()[:-1].rstrip() + " " + lines[index].strip()
            command = re.sub(r"\s+#.*$", "", command).strip()
            return command.replace(README_REGISTRY, registry)
    raise LookupError(f"the README has no line starting {start!r}")


# --- on the host, in private namespaces ----------------------------------------------------


def log(message: str) -> None:
    print(f"[test-e2e-local] {message}", file=sys.stderr, flush=True)


def python_standin(cache: Path, arch: str = "amd64") -> Path:
    """A root file system standing in for ``python:3.11-slim-bookworm`` (bookworm's
    python3 is 3.11) for ``arch`` (Debian's name: amd64, arm64): ``debootstrap
    --variant=minbase`` with :data:`STANDIN_PACKAGES`, the host's CA bundle, without
    ``EXTERNALLY-MANAGED``, as a tar in ``cache`` (made once: ~3 min; a foreign arch
    runs its second stage under qemu user emulation, ~20 min). Raises
    subprocess.CalledProcessError."""
    archive = cache / f"python-standin-bookworm-{arch}-r{STANDIN_REVISION}.tar"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"python-standin-root-{arch}"
    shutil.rmtree(root, ignore_errors=True)
    log(f"making the Python base image's stand-in for {arch} with debootstrap (once)")
    subprocess.run(
        ["debootstrap", f"--arch={arch}", "--variant=minbase",
         "--include=" + ",".join(STANDIN_PACKAGES), "bookworm", str(root), DEBIAN_MIRROR],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return standin_archive(root, archive)


def standin_archive(root: Path, archive: Path) -> Path:
    """``root`` (a debootstrapped bookworm) made the stand-in and packed as ``archive``;
    ``root`` removed. The build's pip trusts what this host trusts (a network whose proxy
    re-signs TLS has its authority only in the host's bundle); :data:`STANDIN_DROPPED`
    are emptied (the folders stay, as in Debian's slim images)."""
    shutil.copyfile(HOST_CA_BUNDLE, root / "etc/ssl/certs/ca-certificates.crt")
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for folder in STANDIN_DROPPED:
        for entry in (root / folder).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w") as tar:
        tar.add(root, arcname=".")
    partial.rename(archive)
    shutil.rmtree(root, ignore_errors=True)
    return archive


def private_overlays(work: Path, folders: tuple[str, ...] = ("/etc", "/var/lib")) -> None:
    """In a private mount namespace: each of ``folders`` becomes an overlay whose writes
    land under ``work`` (buildah writes to ``/var/lib/containers`` and ``/etc/cni``
    whatever its flags say, the CNI plugins to ``/var/lib/cni``; the namespace has its
    own ``/etc/hosts``)."""
    for folder in folders:
        upper = work / "overlay" / folder.strip("/").replace("/", "-")
        (upper / "data").mkdir(parents=True, exist_ok=True)
        (upper / "work").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={folder},upperdir={upper / 'data'},workdir={upper / 'work'}", folder],
            check=True,
        )  # fmt: skip


def image_env(work: Path) -> dict[str, str]:
    """The environment of ``make image`` and ``make push``: buildah with its storage
    under ``work/containers``."""
    conf = work / "containers" / "storage.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(storage_conf(work / "containers"))
    return dict(os.environ, CONTAINERS_STORAGE_CONF=str(conf), CONTAINER_TOOL="buildah")


def import_standin(env: dict[str, str], archive: Path, image: str, arch: str = "amd64") -> None:
    """The stand-in's ``archive`` as the local image ``image`` of architecture ``arch``."""
    container = subprocess.run(
        ["buildah", "from", "scratch"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["buildah", "add", "--quiet", container, str(archive), "/"], env=env,
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run(["buildah", "config", "--cmd", "python3", "--arch", arch, "--os", "linux",
                    container], env=env, check=True)  # fmt: skip
    subprocess.run(["buildah", "commit", "--quiet", "--rm", container, image],
                   env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def build_image(repo: Path, work: Path, standin: Path) -> None:
    """``make image`` with buildah over the stand-in base (run in a private mount
    namespace; the build fetches the locked wheels from PyPI)."""
    private_overlays(work)
    env = image_env(work)
    import_standin(env, standin, STANDIN_IMAGE)
    # The tag is fixed once: an edit of the checkout during the run changes what
    # `make image-name` says (-dirty-<hash>), and the push must find what was built.
    image = subprocess.run(
        ["make", "-s", "-C", str(repo), "image-name", f"REGISTRY={REGISTRY}"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (work / "image-tag").write_text(image.rpartition(":")[2])
    started = time.monotonic()
    subprocess.run(
        ["make", "-C", str(repo), "image", f"REGISTRY={REGISTRY}", f"TAG={image_tag(work)}",
         f"PYTHON_IMAGE={STANDIN_IMAGE}", "BUILD_FLAGS=--pull=never --network=host"],
        env=env, check=True,
    )  # fmt: skip
    log(f"make image: {time.monotonic() - started:.0f} s")
    sizes = subprocess.run(
        ["buildah", "images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    for line in sizes.splitlines():
        log(f"image size: {line}")


def release_version(repo: Path) -> str:
    """The version ``numa_device_plugin/__init__.py`` says (what ``make release`` takes)."""
    init = (repo / "numa_device_plugin" / "__init__.py").read_text()
    found = re.search(r'__version__ = "([^"]+)"', init)
    if found is None:
        raise RuntimeError("numa_device_plugin/__init__.py has no __version__")
    return found[1]


def make_release(repo: Path, work: Path, standins: dict[str, Path], helm: str) -> dict[str, str]:
    """``make release`` for linux/amd64 and linux/arm64 over the stand-ins (``standins``:
    Debian arch -> archive), pushing to a registry on this host's loopback
    (``registry.local`` in this mount namespace's /etc/hosts) whose storage the cluster's
    registry then serves; ``helm`` pushes the chart. Runs on a clone of ``repo``'s HEAD
    (the release tags it; the checkout is left alone). Writes and returns
    ``work/release.json``: version, image digest, chart digest."""
    private_overlays(work)
    Path("/etc/hosts").write_text(etc_hosts("numa-e2e"))
    env = image_env(work)
    bases = []
    for arch, archive in standins.items():
        image = f"{STANDIN_IMAGE}-{arch}"
        import_standin(env, archive, image, arch)
        bases.append(f"--base linux/{arch}={image}")
    source = work / "release-source"
    shutil.rmtree(source, ignore_errors=True)
    # --no-tags: a release made here before (the tag vX.Y.Z) must not stop this one.
    subprocess.run(["git", "clone", "--quiet", "--no-tags", str(repo), str(source)], check=True)
    version = release_version(source)
    registry = start_registry(work, work / "registry")
    try:
        started = time.monotonic()
        # `make release` as a maintainer runs it, in the clone, on this run's venv
        # (-o install: the venv is not made again for the clone).
        done = subprocess.run(
            ["make", "-s", "-C", str(source), "-o", "install", "release",
             f"VENV={Path(sys.executable).parent.parent}", f"VERSION={version}",
             f"REGISTRY={REGISTRY}", "CONTAINER_TOOL=buildah",
             f"PLATFORMS={','.join(f'linux/{arch}' for arch in standins)}",
             "BUILD_FLAGS=--pull=never --network=host", "PUSH_FLAGS=--tls-verify=false",
             f"RELEASE_FLAGS=--plain-http {' '.join(bases)}"],
            env={**env, "PATH": f"{Path(helm).parent}:{env['PATH']}"},
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        log(f"make release VERSION={version}: {time.monotonic() - started:.0f} s")
        log_index("numa-device-plugin", version)
    except subprocess.CalledProcessError as failed:
        log(f"the release failed:\n{failed.stdout[-2000:]}\n{failed.stderr[-4000:]}")
        raise
    finally:
        registry.terminate()
        registry.wait()
    said = done.stdout.splitlines()
    start = next((i for i, line in enumerate(said) if line.startswith("released ")), 0)
    for line in said[start:]:  # what it made and the install command, not the build
        log(f"release: {line}")
    pushed = re.search(r"^image: +\S+@(sha256:[0-9a-f]{64})", done.stdout, re.M)
    chart = re.search(r"^chart: .*\((sha256:[0-9a-f]{64})\)", done.stdout, re.M)
    if pushed is None or chart is None:
        raise RuntimeError(f"the release printed no digests:\n{done.stdout}")
    found = {"version": version, "digest": pushed[1], "chart_digest": chart[1]}
    (work / "release.json").write_text(json.dumps(found))
    return found


def log_index(repository: str, tag: str, registry: str = "http://127.0.0.1:5000") -> None:
    """What the registry on loopback holds for ``repository:tag`` (the registry API's
    manifest, as ``skopeo inspect --raw`` shows it): its media type and each manifest's
    platform and digest, logged; RuntimeError unless it is an index of linux/amd64 and
    linux/arm64."""
    request = urllib.request.Request(
        f"{registry}/v2/{repository}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.index.v1+json, "
                           "application/vnd.docker.distribution.manifest.list.v2+json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        raw = answer.read().decode()
    index = json.loads(raw)
    log(f"the registry's {repository}:{tag}: {index.get('mediaType')}")
    platforms = set()
    for manifest in index.get("manifests", []):
        platform = manifest.get("platform", {})
        platforms.add(f"{platform.get('os')}/{platform.get('architecture')}")
        log(f"  {platform.get('os')}/{platform.get('architecture')}: {manifest.get('digest')}")
    if not {"linux/amd64", "linux/arm64"} <= platforms:
        raise RuntimeError(f"{repository}:{tag} is not an index of linux/amd64 and arm64: {raw}")


def release_install_command(readme: str, release: dict[str, str]) -> str:
    """The README's install-from-a-release command, for the cluster's registry
    (``--plain-http``: it serves HTTP) with the version and digest this run's release
    printed. Raises LookupError when the README has none."""
    command = readme_command(readme, "release")
    command = re.sub(r"--version \S+", f"--version {release['version']}", command)
    command = re.sub(r"sha256:(<[^>]*>|[0-9a-f]{64})", release["digest"], command)
    return command + " --plain-http"


# The chart's failureThreshold defaults (values.yaml ``probes``; a test keeps them equal).
PROBE_BUDGETS = {"startup": 60, "liveness": 6}


def scaled_probes(command: str, time_scale: float) -> str:
    """A ``helm install`` ``command`` with the chart's startup and liveness probes given
    ``time_scale`` times their default failure budgets (``--set`` after the README's
    flags), for emulated (TCG) guests: a guest kernel stalled for a minute and more under
    load (soft lockups seen at 22 s) once had the liveness probe restart the plugin in
    the middle of a test. Unchanged at a scale of 1 or less, and for a command that is
    no ``helm install``."""
    if time_scale <= 1 or not command.startswith("helm install "):
        return command
    sets = [f"--set probes.{probe}.failureThreshold={int(threshold * time_scale + 0.5)}"
            for probe, threshold in PROBE_BUDGETS.items()]  # fmt: skip
    return " ".join([command, *sets])


def image_tag(work: Path) -> str:
    """The commit's tag :func:`build_image` built (``0.2.0-<commit>[-dirty-<hash>]``)."""
    return (work / "image-tag").read_text().strip()


def start_registry(
    work: Path, storage: Path, address: str = "127.0.0.1:5000"
) -> subprocess.Popen[bytes]:
    """Debian's docker-registry on ``address`` (this namespace's; ``0.0.0.0:5000`` serves
    the worker guests on the bridge too), storing under ``storage``, logging to
    ``work/registry.log``; returns once it answers ``/v2/`` on loopback. Raises
    RuntimeError."""
    config = work / "registry.json"
    config.write_text(registry_config(storage, address))
    out = open(work / "registry.log", "ab")  # noqa: SIM115 (kept by the child)
    child = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen("http://127.0.0.1:5000/v2/", timeout=2),
        ):
            return child
        if child.poll() is not None:
            break
        time.sleep(0.2)
    child.kill()
    raise RuntimeError(f"the registry did not answer; see {work / 'registry.log'}")


def push_image(repo: Path, work: Path) -> None:
    """``make push`` to the local registry (run in a private mount and network
    namespace, where ``registry.local`` is 127.0.0.1)."""
    private_overlays(work)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/etc/hosts").write_text(etc_hosts("numa-e2e"))
    registry = start_registry(work, work / "registry")
    try:
        started = time.monotonic()
        subprocess.run(
            ["make", "-C", str(repo), "push", f"REGISTRY={REGISTRY}", f"TAG={image_tag(work)}",
             "PUSH_FLAGS=--tls-verify=false"],
            env=image_env(work), check=True,
        )  # fmt: skip
        log(f"make push: {time.monotonic() - started:.0f} s")
    finally:
        registry.terminate()
        registry.wait()
