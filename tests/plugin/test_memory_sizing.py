"""Memory resources are sized and bounded: the per-pool and total device caps (exact at
their edges, exit 2 naming the flag and the figures), and the chart's schema accepting
exactly the ``memoryUnit`` values the plugin accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.cli import main
from numa_device_plugin.cli.options import config_from_params
from numa_device_plugin.plugin.advertised.discovery import discover
from numa_device_plugin.plugin.settings.values import memory_unit
from numa_device_plugin.topology.fake import build_machine
from numa_device_plugin.topology.memory import (
    MAX_MEMORY_DEVICES,
    MAX_TOTAL_MEMORY_DEVICES,
    MemoryUnitError,
    node_pools,
)
from tests.standin_helpers import bounded_serve

MI = 1 << 20
SCHEMA = (
    Path(__file__).resolve().parent.parent.parent
    / "deployments/helm/numa-device-plugin/values.schema.json"
)


def test_a_pool_of_exactly_the_cap_is_served_and_one_more_refused() -> None:
    pools = node_pools(0, MAX_MEMORY_DEVICES * MI, {}, MI, ())
    assert [pool.devices for pool in pools] == [MAX_MEMORY_DEVICES]
    with pytest.raises(MemoryUnitError, match=f"{MAX_MEMORY_DEVICES + 1} memory devices"):
        node_pools(0, (MAX_MEMORY_DEVICES + 1) * MI, {}, MI, ())


def machine(tmp_path: Path, nodes: int, node_bytes: int) -> Path:
    tree = build_machine(tmp_path / "sys", nodes=nodes)
    for node in range(nodes):
        tree.write(f"node/node{node}/meminfo", f"Node {node} MemTotal: {node_bytes >> 10} kB\n")
    return tree.root


def test_all_pools_together_are_capped(tmp_path: Path) -> None:
    per_node = MAX_TOTAL_MEMORY_DEVICES // 4
    root = machine(tmp_path, 4, per_node * MI)
    exact = discover(config_from_params({"sysfs_root": root, "memory_unit": MI}))
    total = sum(len(r.devices) for r in exact.resources.values() if r.memory is not None)
    assert total == MAX_TOTAL_MEMORY_DEVICES
    over = machine(tmp_path / "over", 4, (per_node + 1) * MI)
    with pytest.raises(MemoryUnitError) as caught:
        discover(config_from_params({"sysfs_root": over, "memory_unit": MI}))
    assert str(caught.value) == (
        f"--memory-unit 1Mi gives {MAX_TOTAL_MEMORY_DEVICES + 4} memory devices over 4 NUMA "
        f"nodes, more than {MAX_TOTAL_MEMORY_DEVICES} in all: choose a larger unit"
    )


def test_serve_exits_2_naming_the_flag_for_too_many_devices_in_all(
    tmp_path: Path, sock_dir: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad flag fails at once: serve stops at discovery, before any socket."""
    bounded_serve(monkeypatch)
    root = machine(tmp_path, 8, 5000 * MI)
    argv = ["serve", "--sysfs-root", str(root), "--socket-dir", str(sock_dir)]
    assert main([*argv, "--memory-unit", "1Mi"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--memory-unit'" in err
    assert "40000 memory devices over 8 NUMA nodes" in err


def schema_patterns() -> tuple[str, str]:
    config = json.loads(SCHEMA.read_text())["properties"]["config"]["properties"]
    named = config["named"]["additionalProperties"]["properties"]["memoryUnit"]["pattern"]
    return config["memoryUnit"]["pattern"], named


def plugin_accepts(text: str) -> bool:
    try:
        memory_unit(text)
    except ValueError:
        return False
    return True


def samples() -> list[str]:
    numbers = {0, 1, 2, 9, 10, 99, 512, 1000, 1023, 1024, 1025, 1048, 1049, 1050, 9999}
    numbers |= {10**k + d for k in range(3, 9) for d in (-1, 0, 1)}
    numbers |= {1048575, 1048576, 1048577, 1048599, 1048600, 1049000, 1100000, 99999999}
    texts = [str(n) for n in numbers]
    texts += [f"0{n}" for n in (0, 1, 1048576, 1049)]
    suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"]
    texts = [f"{text}{suffix}" for text in texts for suffix in suffixes]
    return [*texts, "", "Gi", "1.5Gi", "1e9", "-1Gi", "1gi", "1Gb", "1 Gi", "0x10Mi"]


@pytest.mark.parametrize("which", ["config.memoryUnit", "named memoryUnit"])
def test_the_charts_schema_accepts_exactly_what_the_plugin_accepts(which: str) -> None:
    top, named = schema_patterns()
    pattern = re.compile(top if which == "config.memoryUnit" else named)
    differ = []
    for text in samples():
        if which == "config.memoryUnit" and text == "":
            assert pattern.search(text), "empty: off"
            continue
        if bool(pattern.search(text)) != plugin_accepts(text):
            differ.append(text)
    assert differ == []
