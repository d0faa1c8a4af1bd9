"""Offline tests of the harness's image modes (test/local/shipped.py, ``PLUGIN=kustomize`` or
``helm``): the files it renders, the README commands it runs, what it refuses to start
without. ``make test-e2e-local PLUGIN=…`` runs them for real."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "test" / "local"))
import cluster
import kubecluster
import plan as run_plan
import render
import shipped

README = (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    ("value", "mode"),
    [("", "process"), ("process", "process"), ("kustomize", "kustomize"), (" HELM ", "helm")],
)
def test_plugin_values(value: str, mode: str) -> None:
    assert shipped.mode_wanted(value) == mode


@pytest.mark.parametrize("value", ["docker", "chart", "1"])
def test_a_bad_plugin_value_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=f"PLUGIN={value!r}: use one of process, kustomize, helm"):
        shipped.mode_wanted(value)


def test_a_bad_plugin_exits_2_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGIN", "docker")
    with pytest.raises(SystemExit) as exited:
        cluster.main(["run", "--bin-dir", "/nonexistent"])
    assert exited.value.code == 2


def test_the_readme_commands_are_what_the_harness_runs() -> None:
    """The harness installs with the README's own commands, only the registry changed:
    a README edit that breaks them breaks the e2e run, not only a reader."""
    kustomize = shipped.readme_command(README, "kustomize")
    assert kustomize == (
        'kubectl kustomize deployments/ | sed "s#registry.local:5000/numa-device-plugin:'
        '[^\\" ]*#$(make -s image-name REGISTRY=registry.local:5000)#" | kubectl apply -f -'
    )
    helm = shipped.readme_command(README, "helm")
    assert helm == (
        "helm install numa-device-plugin deployments/helm/numa-device-plugin "
        "--namespace kube-system --set image.repository=registry.local:5000/numa-device-plugin "
        '--set image.tag="$(make -s image-tag)"'
    )
    assert shipped.README_REGISTRY in README


def test_readme_command_joins_continuations_drops_comments_and_names_a_missing_one() -> None:
    text = ("intro\nhelm install numa-device-plugin deployments/a \\\n"
            "  --set x=registry.example.com:5000/p   # note\nafter\n")  # fmt: skip
    assert shipped.readme_command(text, "helm", "r:1") == (
        "helm install numa-device-plugin deployments/a --set x=r:1/p"
    )
    with pytest.raises(LookupError, match=r"no line starting 'kubectl kustomize deployments/ \|'"):
        shipped.readme_command(text, "kustomize")


def test_emulated_guests_install_with_the_probes_budgets_scaled() -> None:
    """A TCG guest's kernel stalled past the liveness probe's minute once (soft
    lockups): the harness scales the startup and liveness failure budgets with the
    run's time scale, on the README's helm command only; the chart renders them."""
    from tests.deployments.test_helm import container, template

    helm = shipped.readme_command(README, "helm")
    assert shipped.scaled_probes(helm, 1.0) == helm
    kustomize = shipped.readme_command(README, "kustomize")
    assert shipped.scaled_probes(kustomize, 4.0) == kustomize
    scaled = shipped.scaled_probes(helm, 2.5)
    assert scaled == helm + (
        " --set probes.startup.failureThreshold=150 --set probes.liveness.failureThreshold=15"
    )
    rendered = container(template(*scaled.split(helm, 1)[1].split()))
    assert rendered["startupProbe"]["failureThreshold"] == 150
    assert rendered["livenessProbe"]["failureThreshold"] == 15
    assert rendered["livenessProbe"]["periodSeconds"] == 10
    assert rendered["readinessProbe"]["failureThreshold"] == 2
    chart = yaml.safe_load((REPO / "deployments/helm/numa-device-plugin/values.yaml").read_text())
    assert {
        probe: chart["probes"][probe]["failureThreshold"] for probe in shipped.PROBE_BUDGETS
    } == shipped.PROBE_BUDGETS


def test_the_registry_serves_plain_http_on_loopback_from_the_storage() -> None:
    config = json.loads(shipped.registry_config(Path("/w/registry")))
    assert config["http"] == {"addr": "127.0.0.1:5000"}
    assert config["storage"]["filesystem"] == {"rootdirectory": "/w/registry"}
    assert shipped.REGISTRY.endswith(":5000")


def test_containerd_pulls_the_registry_over_http() -> None:
    hosts = tomllib.loads(shipped.hosts_toml("registry.local:5000"))
    assert hosts["server"] == "http://registry.local:5000"
    assert hosts["host"]["http://registry.local:5000"]["capabilities"] == ["pull", "resolve"]


def test_containerd_config_names_the_cni_plugins_and_the_registry_folder(tmp_path: Path) -> None:
    text = render.containerd_config(
        tmp_path, cni_bin_dir=Path("/usr/lib/cni"), registry_config=tmp_path / "certs.d"
    )
    cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert cri["registry"]["config_path"] == str(tmp_path / "certs.d")
    plain = tomllib.loads(render.containerd_config(tmp_path))["plugins"]
    assert "registry" not in plain["io.containerd.grpc.v1.cri"]


def test_the_pod_network_is_a_bridge_with_the_node_as_gateway() -> None:
    network = shipped.cni_network()
    bridge = network["plugins"][0]
    assert bridge["type"] == "bridge"
    assert bridge["bridge"] == shipped.BRIDGE
    assert bridge["ipam"]["ranges"] == [[{"subnet": shipped.POD_SUBNET,
                                          "gateway": shipped.NODE_IP}]]  # fmt: skip


def test_the_kubernetes_service_is_sent_to_the_api_server() -> None:
    """No kube-proxy: pods (PREROUTING) and the node (OUTPUT) reach the API server at the
    ``kubernetes`` Service's ClusterIP, the first address of the service range."""
    commands = shipped.network_commands(6443)
    nat = [c for c in commands if c[0] == "iptables"]
    assert {c[4] for c in nat} == {"PREROUTING", "OUTPUT"}
    for command in nat:
        assert command[command.index("-d") + 1] == f"{shipped.SERVICE_IP}/32"
        assert command[-1] == f"{shipped.NODE_IP}:6443"
    assert shipped.SERVICE_RANGE.startswith(shipped.SERVICE_IP.rpartition(".")[0])


def test_the_namespaces_hosts_name_the_registry_and_the_node() -> None:
    lines = shipped.etc_hosts("numa-e2e").splitlines()
    assert "127.0.0.1 localhost registry.local" in lines
    assert f"{shipped.NODE_IP} numa-e2e" in lines


def test_buildah_storage_stays_in_the_work_folder() -> None:
    conf = tomllib.loads(shipped.storage_conf(Path("/w/containers")))["storage"]
    assert conf == {"driver": "vfs", "graphroot": "/w/containers/graph",
                    "runroot": "/w/containers/run"}  # fmt: skip


def test_image_modes_name_each_missing_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda program: None)
    monkeypatch.setattr(shipped, "CNI_BIN_DIR", Path("/nonexistent"))
    lines = shipped.missing_tools(None)
    for program, package in shipped.TOOLS.items():
        assert f"{program}: not on PATH (Debian package {package})" in lines
    assert any("containernetworking-plugins" in line for line in lines)
    assert any(line.startswith("helm:") for line in lines)


def test_a_helm_under_tmp_is_refused_at_preflight_naming_it() -> None:
    """The tests run with a /tmp of their own: a helm found under the host's /tmp
    installed the chart, then every test failed with FileNotFoundError."""
    held = Path(tempfile.mkdtemp(prefix="ndp-helm-", dir="/tmp"))
    try:
        helm = held / "helm"
        helm.write_text("#!/bin/sh\n")
        helm.chmod(0o755)
        lines = shipped.missing_tools(helm)
        assert f"helm at {helm.resolve()}: the tests run with a /tmp of their own" in "\n".join(
            lines
        )
        outside = Path("/usr/local/bin/helm")  # judged by its path: it need not exist
        assert not shipped.under_private_tmp(outside)
        assert shipped.missing_tools(outside) == [
            line for line in lines if not line.startswith("helm at")
        ]
    finally:
        shutil.rmtree(held)


def test_make_passes_plugin_and_release_to_the_harness() -> None:
    done = subprocess.run(
        ["make", "-n", "test-e2e-local", "PLUGIN=helm", "RELEASE=1", "KUBE_BIN_DIR=/k"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert 'PLUGIN="helm"' in done.stdout
    assert 'RELEASE="1"' in done.stdout


def test_the_release_is_installed_with_the_readmes_command_at_this_runs_digest() -> None:
    """RELEASE=1: the README's install-from-a-release line, with the registry, version
    and digest of this run's release, over plain HTTP (the cluster's registry)."""
    digest = "sha256:" + "ab" * 32
    command = shipped.release_install_command(README, {"version": "9.8.7", "digest": digest})
    assert command == (
        "helm install numa-device-plugin oci://registry.local:5000/charts/numa-device-plugin "
        f"--version 9.8.7 --namespace kube-system --set image.digest={digest} --plain-http"
    )
    # The checkout's install line is still the helm mode's, whatever comes after it.
    assert "oci://" not in shipped.readme_command(README, "helm")


def test_release_without_helm_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cluster.main(["run", "--plugin", "kustomize", "--release", "--bin-dir", "/k"])
    assert exited.value.code == 2
    assert "RELEASE=1 installs the released chart: it needs PLUGIN=helm" in capsys.readouterr().err


def test_the_apiserver_is_private_to_loopback_in_process_mode_and_on_the_bridge_otherwise(
    tmp_path: Path,
) -> None:
    def spec(plugin: str) -> run_plan.Spec:
        return run_plan.Spec(bin_dir="/k", work=str(tmp_path), python="p", pytest_args=[],
                            plugin=plugin)  # fmt: skip

    local = kubecluster.Cluster(spec("process")).apiserver_network()
    assert local[local.index("--bind-address") + 1] == "127.0.0.1"
    assert "ServiceAccount" in local
    image = kubecluster.Cluster(spec("helm")).apiserver_network()
    assert image[image.index("--advertise-address") + 1] == shipped.NODE_IP
    assert "ServiceAccount" not in image
    assert kubecluster.Cluster(spec("helm")).node_ip == shipped.NODE_IP
    assert kubecluster.Cluster(spec("process")).node_ip == "127.0.0.1"


def serve_once(body: dict[str, Any]) -> tuple[str, list[str]]:
    """A registry stand-in on 127.0.0.1:0 answering one GET with ``body``; its URL and
    the Accept header it was sent."""
    import http.server
    import threading

    accepted: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            accepted.append(self.headers.get("Accept", ""))
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", accepted


def index(*platforms: str) -> dict[str, Any]:
    return {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": f"sha256:{n}", "platform": {"os": "linux", "architecture": arch}}
            for n, arch in enumerate(platforms)
        ],
    }


def test_the_release_check_wants_an_index_of_both_platforms() -> None:
    url, accepted = serve_once(index("amd64", "arm64"))
    shipped.log_index("numa-device-plugin", "0.2.0", url)
    assert "application/vnd.oci.image.index.v1+json" in accepted[0]
    url, _ = serve_once(index("amd64"))
    with pytest.raises(RuntimeError, match="not an index of linux/amd64 and arm64"):
        shipped.log_index("numa-device-plugin", "0.2.0", url)


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("r.local:5000/numa-device-plugin:0.2.0", ("r.local:5000/numa-device-plugin", "0.2.0", "")),
        ("r.local:5000/numa-device-plugin:0.2.0@sha256:ab",
         ("r.local:5000/numa-device-plugin", "0.2.0", "sha256:ab")),
    ],
)  # fmt: skip
def test_the_e2e_rollout_reads_tag_and_digest_apart(
    image: str, parts: tuple[str, str, str]
) -> None:
    """A release's chart pins the digest: the rollout tests once took the digest's hex as
    the tag (RELEASE=1 run, test_a_rolling_update_to_a_new_tag_leaves_workload_pods_untouched)."""
    from tests.e2e.test_shipped import image_parts

    assert image_parts(image) == parts


def test_the_python_stand_in_leaves_out_apt_lists_translations_and_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base layer every worker pulls: what Debian's slim images drop is emptied
    (the folders stay), Python, its packages and the C.UTF-8 locale stay, the host's CA
    bundle replaces the root's and pip may install (no EXTERNALLY-MANAGED)."""
    import tarfile

    bundle = tmp_path / "host-ca.crt"
    bundle.write_text("HOST CA\n")
    monkeypatch.setattr(shipped, "HOST_CA_BUNDLE", bundle)
    root = tmp_path / "root"
    kept = ["usr/bin/python3.11", "usr/lib/python3.11/os.py",
            "usr/lib/python3.11/__pycache__/os.cpython-311.pyc",
            "usr/lib/locale/C.utf8/LC_CTYPE", "usr/share/zoneinfo/UTC",
            "var/lib/dpkg/status", "etc/ssl/certs/ca-certificates.crt"]  # fmt: skip
    dropped = ["var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages",
               "var/lib/apt/lists/partial/x", "var/cache/apt/archives/python3_3.11.deb",
               "var/cache/apt/pkgcache.bin", "usr/share/locale/de/LC_MESSAGES/apt.mo",
               "usr/share/doc/python3/copyright", "usr/share/man/man1/python3.1.gz",
               "usr/share/info/dir", "usr/lib/python3.11/EXTERNALLY-MANAGED"]  # fmt: skip
    for name in kept + dropped:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "usr/share/doc/python3.11").symlink_to("python3")
    archive = shipped.standin_archive(root, tmp_path / "standin.tar")
    with tarfile.open(archive) as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
        ca = tar.extractfile("./etc/ssl/certs/ca-certificates.crt")
        assert ca is not None
        assert ca.read() == b"HOST CA\n"
    assert set(kept) <= names
    assert not set(dropped) & names
    for folder in shipped.STANDIN_DROPPED:
        assert folder in names
        assert not [n for n in names if n.startswith(folder + "/")], folder
    assert not root.exists()


def test_a_cached_stand_in_of_another_revision_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive cached by a harness whose stand-in held more (apt lists, docs) has
    another name: the harness makes its own instead of pushing the old one."""
    old = tmp_path / "python-standin-bookworm.tar"
    old.write_text("an older stand-in")
    made: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **_: made.append(argv))
    monkeypatch.setattr(shipped, "standin_archive", lambda root, archive: archive)
    found = shipped.python_standin(tmp_path)
    assert found != old
    assert f"-r{shipped.STANDIN_REVISION}" in found.name
    assert made
    assert made[0][0] == "debootstrap"
    found.write_text("this revision's")
    made.clear()
    assert shipped.python_standin(tmp_path) == found
    assert not made
