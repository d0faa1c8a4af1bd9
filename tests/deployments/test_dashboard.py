"""The chart's Grafana dashboard (``monitoring.dashboard.enabled``) and alerts against a
real Prometheus: Debian's ``prometheus`` scrapes a real ``serve`` (``--capacity cpus
--memory-unit``) against the kubelet stand-in, whose pods hold CPUs and memory, and
every dashboard query and every alert expression must parse and return series.

The alerts need trouble to return anything: the stand-in's pods make a misaligned
container and a full NUMA node from the start; stopping the stand-in's kubelet and
its pod resources API then makes the other two fire. ``make prometheus`` unpacks
Debian's package; without it these tests skip, or fail under CI.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from numa_device_plugin.kubelet_standin import KubeletStandIn
from tests.conftest import venv_tool
from tests.deployments.test_alerts import rules_by_alert
from tests.deployments.test_helm import CHART, RELEASE, of_kind, template
from tests.standin_helpers import eventually, held_port, serve_process, wait_all_live

DASHBOARD = f"{RELEASE}-dashboard"
NODE = "node-a"
TARGET_LABELS = {"node": NODE, "namespace": "kube-system", "pod": "numa-device-plugin-x1"}
GiB = 1 << 30
R0, R1 = "numa-align/numa-0", "numa-align/numa-1"
# numa-0, numa-1 and, in cpus mode, any (each with its memory resource).
RESOURCES = [R0, f"{R0}-memory", R1, f"{R1}-memory", "numa-align/any", "numa-align/any-memory"]


def dashboard() -> dict[str, Any]:
    """The dashboard JSON of the rendered ConfigMap."""
    rendered = template("--set", "monitoring.dashboard.enabled=true")
    config_map = of_kind(rendered, "ConfigMap", DASHBOARD)
    (document,) = config_map["data"].values()
    result: dict[str, Any] = json.loads(document)
    return result


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, expression)`` of every target, as Grafana sends them for node
    ``node-a`` (``$node``) and a 30 s ``$__rate_interval``."""
    found = []
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$node", NODE).replace("$__rate_interval", "30s")
            found.append((panel["title"], expr))
    return found


@dataclass
class Prometheus:
    """A running prometheus: ``query(expr)`` -> the instant vector's series."""

    port: int

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                document = json.load(answer)
        except urllib.error.HTTPError as exc:  # 400: the expression does not parse
            raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from None
        assert document["status"] == "success", document
        series: list[dict[str, Any]] = document["data"]["result"]
        return series


async def start_prometheus(folder: Path, metrics_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus scraping 127.0.0.1:``metrics_port`` every second, with the labels the
    chart's PodMonitor gives a plugin pod (node, namespace, pod)."""
    port = held_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "numa-device-plugin",
            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"],
                                "labels": TARGET_LABELS}],
        }],
    }  # fmt: skip
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            venv_tool("prometheus"), f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log.close()
    return process, port


@pytest.fixture
async def scraped(
    two_nodes: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[Prometheus, KubeletStandIn]]:
    """The plugin (CPUs 0-3 on NUMA node 0, 4-7 on node 1, 1 GiB each) against the
    stand-in with pods: ``shop/db`` holds numa-0 with CPU 0 and 256 MiB there (ours);
    ``shop/bad`` holds numa-1 with CPU 1 of node 0 (misaligned); ``ops/cache`` holds
    CPUs 2-3 exclusively with no device: NUMA node 0 is full."""
    venv_tool("prometheus")
    metrics_port = held_port()
    standin = KubeletStandIn(
        sock_dir,
        pod_resources_dir=sock_dir / "pr",
        allocatable_cpus=range(8),
        allocatable_memory={0: GiB, 1: GiB},
    )
    async with standin as kubelet, serve_process(
        two_nodes, sock_dir, "--capacity", "cpus", "--memory-unit", "256Mi",
        "--metrics-address", f"127.0.0.1:{metrics_port}",
        "--pod-resources-socket", str(kubelet.pod_resources_socket),
        "--pod-resources-interval", "0.5",
    ):  # fmt: skip
        await wait_all_live(kubelet, RESOURCES, timeout=20)
        kubelet.add_pod("shop", "db", [
            ("db", {R0: ["numa0-cpu0000"], f"{R0}-memory": ["numa0-mem0000"]}, [0],
             [("memory", 256 << 20, [0])]),
        ])  # fmt: skip
        kubelet.add_pod("shop", "bad", [("bad", {R1: ["numa1-cpu0004"]}, [1])])
        kubelet.add_pod("ops", "cache", [("redis", {}, [2, 3])])
        for _ in range(3):  # the Allocate counter and histogram get their series
            await kubelet.allocate(R0, ["numa0-cpu0001"])
        process, port = await start_prometheus(tmp_path, metrics_port)
        try:
            prometheus = Prometheus(port)

            def scraped_twice() -> bool:
                try:
                    return bool(prometheus.query(
                        'count_over_time(numa_node_misaligned_containers{numa_node="1"}[30s]) >= 2'
                        ' and numa_node_misaligned_containers > 0'
                    ))  # fmt: skip
                except (OSError, AssertionError):
                    return False

            await eventually(scraped_twice, timeout=60)
            yield prometheus, kubelet
        finally:
            process.terminate()
            process.wait(30)


def test_the_dashboard_config_map_carries_the_sidecars_label() -> None:
    rendered = template("--set", "monitoring.dashboard.enabled=true")
    config_map = of_kind(rendered, "ConfigMap", DASHBOARD)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(config_map["data"]) == ["numa-device-plugin.json"]
    assert not [d for d in template() if d["metadata"]["name"] == DASHBOARD], "off by default"
    assert (CHART / "dashboards" / "numa-device-plugin.json").is_file()


def test_every_panel_selects_the_node_and_has_a_unique_id() -> None:
    document = dashboard()
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    for title, expr in dashboard_queries():
        assert f'node=~"{NODE}"' in expr, title
    variables = {v["name"] for v in document["templating"]["list"]}
    assert variables == {"datasource", "node"}


async def test_every_dashboard_and_alert_query_returns_series_from_a_real_prometheus(
    scraped: tuple[Prometheus, KubeletStandIn],
) -> None:
    prometheus, kubelet = scraped
    with pytest.raises(AssertionError, match="parse error"):  # the check can fail
        prometheus.query("sum by (node (up)")
    counts: dict[str, int] = {}
    for title, expr in dashboard_queries():
        counts[f"{title}: {expr}"] = len(prometheus.query(expr))
    alerts = {name: rule["expr"] for name, rule in rules_by_alert().items()}
    for name in ("NumaDevicePluginMisalignedContainers", "NumaNodeFull"):
        counts[f"alert {name}: {alerts[name]}"] = len(prometheus.query(alerts[name]))
    # Values, not only series, for the scenario of ``scraped``: node 0 has CPU 0 ours,
    # 1-3 others' (full); node 1 has all 4 free; shop/bad (numa-1 on CPU 1) misaligned.
    queries = dict(dashboard_queries())

    def by_numa_node(title: str) -> dict[str, float]:
        found = prometheus.query(queries[title])
        return {r["metric"]["numa_node"]: float(r["value"][1]) for r in found}

    assert by_numa_node("Free exclusive CPUs per NUMA node") == {"0": 0.0, "1": 4.0}
    assert by_numa_node("Exclusive CPUs per NUMA node: allocatable") == {"0": 4.0, "1": 4.0}
    assert by_numa_node("Misaligned containers") == {"0": 0.0, "1": 1.0}
    registered = prometheus.query(queries["Resources registered with the kubelet"])
    assert {r["metric"]["resource"]: float(r["value"][1]) for r in registered} == dict.fromkeys(
        RESOURCES, 1.0
    )
    # The other two need a kubelet that went away.
    await kubelet.stop()
    await kubelet.stop_pod_resources()
    troubled = ("NumaDevicePluginNotRegistered", "NumaDevicePluginPodResourcesDown")
    await eventually(lambda: all(prometheus.query(alerts[n]) for n in troubled), timeout=60)
    for name in troubled:
        counts[f"alert {name}: {alerts[name]}"] = len(prometheus.query(alerts[name]))
    print("\n".join(f"{n:3d}  {q}" for q, n in counts.items()))  # the figures, with -s
    assert not [q for q, n in counts.items() if n == 0], "queries without a series"
    # Series carry the PodMonitor's labels, so the alerts' $labels.pod expands.
    (misaligned,) = prometheus.query(alerts["NumaDevicePluginMisalignedContainers"])
    assert {k: misaligned["metric"][k] for k in TARGET_LABELS} == TARGET_LABELS
    assert misaligned["metric"]["numa_node"] == "1"
