"""The package's shape: one job per class, small modules, imports that never run in a
circle (data flows one way: sysfs -> topology -> devices -> servicers -> registration)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "numa_device_plugin"
# No module over 400 lines, no class over 250: past either, split by job.
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250


def modules() -> dict[str, Path]:
    """Module name -> file, generated protobuf stubs left out."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "api" in path.relative_to(PACKAGE).parts:
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports at module level (not inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def test_no_module_or_class_is_too_big() -> None:
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        assert len(lines) <= MAX_MODULE_LINES, f"{name}: {len(lines)} lines"
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                assert size <= MAX_CLASS_LINES, f"{name}.{node.name}: {size} lines"


def test_no_import_runs_in_a_circle() -> None:
    found = modules()
    graph = {name: imports(path, set(found)) - {name} for name, path in found.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name in done:
            return
        for imported in graph[name]:
            if imported != name.rsplit(".", 1)[0]:  # a package's own __init__ is not a cycle
                visit(imported, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def test_the_poller_and_the_watcher_only_feed_or_wake() -> None:
    """They (and what starts the watches) never reach back into the manager or the
    endpoints."""
    found = modules()
    for name in (
        "numa_device_plugin.plugin.counts.poller",
        "numa_device_plugin.kubelet.watcher",
        "numa_device_plugin.plugin.lifecycle.watches",
    ):
        imported = imports(found[name], set(found))
        assert not imported & {
            "numa_device_plugin.plugin.lifecycle.manager",
            "numa_device_plugin.plugin.serving.endpoint",
        }


# The layers, bottom up, and what each may import (besides itself and the package's
# __version__): data flows up from sysfs to the kubelet's registration.
LAYERS = {
    "topology": set(),
    "kubelet": {"topology", "api"},
    "ops": {"topology"},
    "plugin": {"topology", "kubelet", "ops", "api"},
    "nodeconfig": {"topology", "kubelet", "ops", "plugin", "api"},
    "cluster": {"ops"},
}


def every_import(path: Path) -> set[str]:
    """The package modules ``path`` imports anywhere: at module level, inside functions
    and under ``TYPE_CHECKING``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("numa_device_plugin.")}


def layer(module: str) -> str:
    """``numa_device_plugin.plugin.lifecycle.manager`` -> ``plugin``."""
    return module.split(".")[1]


def test_each_layer_imports_only_the_layers_below_it() -> None:
    found = modules()
    for name, path in found.items():
        if name.count(".") < 2 or layer(name) not in LAYERS:
            continue  # the cli, the kubelet stand-in and the package's root use any layer
        allowed = LAYERS[layer(name)] | {layer(name)}
        wrong = sorted(
            imported
            for imported in every_import(path)
            if layer(imported) not in allowed | {"__version__"}
        )
        assert not wrong, f"{name} ({layer(name)}) imports {wrong}"


def test_every_module_is_in_a_layer_or_a_tool() -> None:
    """The folders show the architecture: nothing is left at the package's top."""
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__"}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {*LAYERS, "api", "cli", "kubelet_standin"}


def test_package_discovery_never_walks_folders_outside_the_package() -> None:
    """An unpacked sysfs snapshot in the checkout (its link cycles) made `pip install -e .`
    run for minutes while setuptools' namespace search walked it (over 200 s, against
    under 7 s with the search limited to folders with an __init__.py)."""
    import tomllib

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert found["packages"]["find"] == {"include": ["numa_device_plugin*"], "namespaces": False}


# The plugin's sub-packages, bottom up: each imports only itself and those before it.
PLUGIN = "numa_device_plugin.plugin"
PLUGIN_JOBS = ("model", "settings", "advertised", "serving", "counts", "reports", "lifecycle")


def plugin_job(module: str) -> str | None:
    """``numa_device_plugin.plugin.counts.poller`` -> ``counts``; None outside the plugin's
    sub-packages (the plugin package itself)."""
    parts = module.split(".")
    return parts[2] if module.startswith(f"{PLUGIN}.") and len(parts) > 2 else None


def test_the_plugin_is_split_by_job_into_known_sub_packages() -> None:
    """Nothing lies loose in plugin/: every module is in one job's folder."""
    folder = PACKAGE / "plugin"
    assert {path.name for path in folder.glob("*.py")} == {"__init__.py"}
    found = {p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert found == set(PLUGIN_JOBS)


def test_each_plugin_job_imports_only_itself_and_the_jobs_before_it() -> None:
    """Every import counts: at module level, inside functions and under TYPE_CHECKING
    (a type-only import running back up still ties the lower job to the higher)."""
    wrong = []
    for name, path in modules().items():
        job = plugin_job(name)
        if job is None:
            continue
        allowed = set(PLUGIN_JOBS[: PLUGIN_JOBS.index(job) + 1])
        for imported in every_import(path):
            target = plugin_job(imported)
            if imported.startswith(f"{PLUGIN}.") and target is not None and target not in allowed:
                wrong.append(f"{name} ({job}) imports {imported} ({target})")
    assert not wrong, "\n".join(wrong)


def circle(graph: dict[str, set[str]]) -> tuple[str, ...] | None:
    """A circle of ``graph`` (module -> the modules it imports) as the path that closes
    it, or None; a package importing its own sub-modules' ``__init__`` is no circle."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if name in path:
            return (*path, name)
        if name in done:
            return None
        for imported in sorted(graph.get(name, ())):
            if not name.startswith(f"{imported}."):
                found = visit(imported, (*path, name))
                if found:
                    return found
        done.add(name)
        return None

    for name in sorted(graph):
        found = visit(name, ())
        if found:
            return found
    return None


def test_no_import_inside_the_plugin_runs_in_a_circle_even_lazily() -> None:
    """The plugin's modules form no circle even counting imports inside functions and
    under TYPE_CHECKING (the old devices <-> near pair was one)."""
    found = modules()
    names = {name for name in found if name.startswith(f"{PLUGIN}.")}
    graph = {name: {m for m in every_import(found[name]) if m in names} - {name} for name in names}
    assert circle(graph) is None, " -> ".join(circle(graph) or ())


def test_the_circle_check_finds_a_circle_and_spares_a_package_init() -> None:
    """:func:`circle` on made graphs, so the check above cannot pass for want of edges."""
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ("a", "b", "c", "a")
    assert circle({"p.x": {"p"}, "p": {"p.x"}}) is None
    assert circle({"a": {"b"}, "b": set()}) is None
    assert plugin_job(f"{PLUGIN}.model.ids") == "model"
    assert plugin_job(PLUGIN) is None


def test_no_file_name_repeats_its_folder_name() -> None:
    """``counts/counts.py`` or ``reports/reports_page.py`` says nothing its folder does not."""
    wrong = [
        str(path.relative_to(REPO))
        for path in PACKAGE.rglob("*.py")
        if "api" not in path.relative_to(PACKAGE).parts
        and path.parent.name in path.stem
        and path.parent != PACKAGE
    ]
    assert not wrong, wrong


def test_each_plugin_sub_package_says_its_job_and_what_it_may_import() -> None:
    """One paragraph in each sub-package's docstring, naming the jobs it may import (or
    that it imports none of them)."""
    for job in PLUGIN_JOBS:
        doc = ast.get_docstring(ast.parse((PACKAGE / "plugin" / job / "__init__.py").read_text()))
        assert doc, f"plugin/{job}/__init__.py has no docstring"
        assert "\n\n" not in doc.strip(), f"plugin/{job}: one paragraph"
        assert "import" in doc, f"plugin/{job}: says what it may import"
        for lower in PLUGIN_JOBS[: PLUGIN_JOBS.index(job)]:
            assert lower in doc or "every" in doc, f"plugin/{job} does not name {lower}"
