"""``devices`` and ``check`` at fleet scale: a stand-in API server on 127.0.0.1 with
``--nodes`` plugin pods (default 1,000), each answering its ``/debug/state`` (four
disks with mount points, two NICs, ten pods holding resources), one of them after
``--slow`` seconds (a pod that never answers in time). Each command runs as a process,
as a user runs it; the figures are its wall time, its own peak RSS (``VmHWM``, through
:mod:`benchmarks.peak`: ``ru_maxrss`` carried the benchmark's own 512 MB) and whether
every other node was printed while the slow one was named.

Run: ``python -m benchmarks.fleet`` (or ``python -m benchmarks.bench fleet``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.peak import peak_mb, wrapped
from numa_device_plugin.kubelet_standin.apiserver import json_api

LABEL = {"app.kubernetes.io/name": "numa-device-plugin"}


def plugin_state(index: int) -> dict[str, Any]:
    """One node's ``/debug/state`` parts that devices and check read."""
    disks = [
        {"name": "nvme0n1", "nodes": [0], "serial": f"ROOT-{index}", "wwid": None,
         "model": "SAMSUNG", "size_bytes": 1 << 40, "pci": ["0000:01:00.0"],
         "mountpoints": ["/", "/boot"]},
        {"name": "nvme1n1", "nodes": [index % 2], "serial": f"A-{index}", "wwid": None,
         "model": "SAMSUNG", "size_bytes": 4 << 40, "pci": ["0000:41:00.0"],
         "mountpoints": ["/mnt/disks/a"]},
        {"name": "nvme2n1", "nodes": [1 - index % 2], "serial": f"B-{index}", "wwid": None,
         "model": "SAMSUNG", "size_bytes": 4 << 40, "pci": ["0000:81:00.0"],
         "mountpoints": ["/mnt/disks/b"]},
        {"name": "nvme3n1", "nodes": [1], "serial": f"S-{index}", "wwid": None,
         "model": "SAMSUNG", "size_bytes": 1 << 40, "pci": ["0000:82:00.0"], "mountpoints": []},
    ]  # fmt: skip
    holders = [
        {"pod": f"search/es-{index}-{i}", "container": "es", "cpus": str(2 * (index % 2) + i % 2),
         "memory": [{"numa_node": index % 2, "type": "memory", "bytes": 1 << 30}],
         "devices": {"numa-align/data-a": [f"numa{index % 2}-slot{i:04}"]}}
        for i in range(10)
    ]  # fmt: skip
    near = {"resource": "numa-align/data-a", "nodes": [index % 2],
            "by_node": {str(index % 2): ["nvme1n1"]}, "reason": None}  # fmt: skip
    nics = [{"name": f"ens{n}", "nodes": [n], "pci": [f"0000:1{n}:00.0"], "driver": "mlx5_core"}
            for n in (0, 1)]  # fmt: skip
    return {
        "numa_nodes": [{"id": 0, "cpus": "0-1"}, {"id": 1, "cpus": "2-3"}],
        "resources": {"numa-align/data-a": {"lost": None}},
        "near": [near],
        "inventory": {"disks": disks, "nics": nics, "accelerators": []},
        "pod_resources": {"holders": holders},
    }


def _page(kind: str, items: list[dict[str, Any]], query: str) -> dict[str, Any]:
    start = int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("continue", 0))
    limit = int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("limit", 500))
    rest = start + limit
    return {"kind": kind, "apiVersion": "v1",
            "metadata": {"continue": str(rest)} if rest < len(items) else {},
            "items": items[start:rest]}  # fmt: skip


def hostile_state(index: int, kind: str) -> dict[str, Any]:
    """A lying plugin's ``/debug/state`` of just under 4 MiB (the per-answer cap): a
    list of ``kind`` made of the smallest objects, the most objects to parse for the
    bytes (``empty``: ``{}``; ``disks``: ``{"name": "d"}`` disk entries)."""
    entry: dict[str, Any] = {} if kind == "empty" else {"name": f"d{index}"}
    each = len(json.dumps(entry)) + 2  # and ", "
    count = ((4 << 20) - 4096) // each
    return {"inventory": {"disks": [entry] * count, "nics": [], "accelerators": []}}


def serve_fleet(
    nodes: int, slow: float, latency: float = 0.0, hostile: str | None = None
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """The answer function of a fleet of ``nodes``: plugin pods p-N on nodes n-N, each
    with its state after ``latency`` seconds (the API server to kubelet to pod round
    trip), p-0 after ``slow``; ten search pods per node."""
    plugins = [{"kind": "Pod", "metadata": {"name": f"p-{i}", "namespace": "kube-system",
                                            "labels": LABEL},
                "spec": {"nodeName": f"n-{i}"}, "status": {"phase": "Running"}}
               for i in range(nodes)]  # fmt: skip
    requests = {"cpu": "1", "numa-align/data-a": "1"}
    pods = [{"kind": "Pod", "metadata": {"name": f"es-{i}-{j}", "namespace": "search"},
             "spec": {"nodeName": f"n-{i}", "containers": [
                 {"name": "es", "resources": {"requests": requests, "limits": requests}}]},
             "status": {"phase": "Running"}}
            for i in range(nodes) for j in range(10)]  # fmt: skip
    states = {f"p-{i}": plugin_state(i) if hostile is None else hostile_state(i, hostile)
              for i in range(nodes)}  # fmt: skip

    def answer(path: str, token: str) -> tuple[int, dict[str, Any]]:
        route, _, query = path.partition("?")
        if route == "/api/v1/namespaces/kube-system/pods":
            return 200, _page("PodList", plugins, query)
        if route == "/api/v1/pods":
            return 200, _page("PodList", pods, query)
        if route.endswith("/proxy/debug/state"):
            name = route.split("/")[6].rpartition(":")[0]
            time.sleep(slow if name == "p-0" else latency)
            return 200, states[name]
        return 404, {"kind": "Status", "code": 404}

    return answer, plugins, states


def run_command(argv: list[str], cwd: str) -> tuple[float, float, int, str, str]:
    """(wall seconds, peak RSS MB, exit status, stdout, stderr) of ``python -m`` argv
    (``[python..., "-m", module, args...]``) run as a process in ``cwd`` (``-m`` looks
    there first); the peak is the command's own (:mod:`benchmarks.peak`)."""
    split = argv.index("-m")
    peak_file = Path(cwd) / "peak-kb"
    peak_file.unlink(missing_ok=True)
    argv = wrapped(argv[:split], peak_file, argv[split + 1], *argv[split + 2 :])
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=cwd)  # fmt: skip
    out: list[str] = []
    err: list[str] = []
    stdout, stderr = process.stdout, process.stderr
    assert stdout is not None
    assert stderr is not None
    readers = [threading.Thread(target=lambda: out.append(stdout.read())),
               threading.Thread(target=lambda: err.append(stderr.read()))]  # fmt: skip
    for reader in readers:
        reader.start()
    process.wait()
    for reader in readers:
        reader.join()
    seconds = time.perf_counter() - started
    return seconds, peak_mb(peak_file), process.returncode, "".join(out), "".join(err)


def measure(
    nodes: int = 1000, slow: float = 60.0, timeout: float = 20.0, latency: float = 0.02,
    python_path: str | None = None, hostile: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The figures of ``devices`` and ``check`` against a fleet of ``nodes`` (the
    package from ``python_path`` when given: another checkout, for a before and after;
    ``hostile``: every pod answers :func:`hostile_state` of that kind)."""
    answer, _, _ = serve_fleet(nodes, slow, latency, hostile)
    figures: dict[str, Any] = {"nodes": nodes, "slow_pod_seconds": slow, "timeout": timeout,
                               "latency_seconds": latency, "hostile": hostile}  # fmt: skip
    python = [sys.executable]
    if python_path is not None:  # without site: the editable install would win over it
        import sysconfig

        python = [sys.executable, "-S"]
        paths = sysconfig.get_paths()
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [python_path, paths["purelib"], paths["platlib"]]
        )
    with (
        tempfile.TemporaryDirectory(prefix="ndp-fleet-") as folder,
        json_api(answer, Path(folder)) as kubeconfig,
    ):
        for command in ("devices", "check"):
            argv = [*python, "-m", "numa_device_plugin", command, "--kubeconfig",
                    str(kubeconfig), "--timeout", str(timeout), "--output", "json"]  # fmt: skip
            seconds, rss, code, out, err = run_command(argv, folder)
            document = json.loads(out) if out.strip() else {}
            shown = (len(document.get("nodes", [])) if command == "devices"
                     else len({p["node"] for p in document.get("pods", [])
                               if p["verdict"] != "unknown"}))  # fmt: skip
            figures[command] = {
                "wall_seconds": round(seconds, 2), "peak_rss_mb": round(rss, 1),
                "exit": code, "nodes_shown": shown,
                "slow_pod_named": "n-0 (p-0): not read within the deadline" in err,
            }  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--slow", type=float, default=60.0, help="seconds p-0 takes")
    parser.add_argument("--timeout", type=float, default=20.0, help="each command's --timeout")
    parser.add_argument(
        "--latency",
        type=float,
        default=0.02,
        help="seconds each /debug/state answer takes (the pod proxy's trip)",
    )
    parser.add_argument(
        "--python-path",
        default=None,
        help="run the commands of another checkout (PYTHONPATH), for a before",
    )
    parser.add_argument(
        "--hostile", choices=("empty", "disks"), default=None,
        help="every pod answers just under 4 MiB of the smallest objects (with --nodes 64:"
             " the caps, 256 MiB in all); the figure to watch is peak_rss_mb",
    )  # fmt: skip
    args = parser.parse_args(argv)
    figures = measure(args.nodes, args.slow, args.timeout, args.latency, args.python_path,
                      args.hostile)  # fmt: skip
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
