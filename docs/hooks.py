"""MkDocs hooks: the reference pages' tables, generated from the code at every build so
they cannot drift (``mkdocs.yml``: ``hooks``).

A page holds a marker, ``<!-- generated: NAME -->``, followed by the table as ``make
reference`` last wrote it (up to ``<!-- end generated: NAME -->``): the Markdown read on
the forge holds the tables too, and tests/test_docs.py fails when one is stale. At each
build :func:`on_page_markdown` writes the table NAME afresh: ``cli`` (every command
with its usage and every option as ``--help`` shows it: flags, variable, default,
meaning), ``metrics`` (every family of the plugin's Prometheus registry, with its
type, labels and help) or ``helm-values`` (every chart value with its default from
``values.yaml`` and its meaning from ``values.schema.json``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deployments" / "helm" / "numa-device-plugin"
# A generated block: its marker, the table as last written (make reference), its end.
MARKER = re.compile(
    r"<!-- generated: ([a-z-]+) -->(?:\n.*?\n<!-- end generated: \1 -->)?", re.DOTALL
)


def helm_values_table() -> str:
    """The chart's values: ``| value | default | meaning |``, one row per leaf of
    values.schema.json (an object with a description of its own, such as
    ``securityContext``, is one leaf), the default from values.yaml. Raises KeyError for a value the
    schema describes but values.yaml lacks."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = ["| value | default | meaning |", "|---|---|---|"]

    def walk(properties: dict[str, Any], values: dict[str, Any], prefix: str) -> None:
        for key, spec in properties.items():
            if "properties" in spec and "description" not in spec:
                walk(spec["properties"], values[key], f"{prefix}{key}.")
                continue
            default = json.dumps(values[key], separators=(", ", ": "))
            rows.append(f"| `{prefix}{key}` | `{default}` | {_cell(spec['description'])} |")

    walk(schema["properties"], defaults, "")
    return "\n".join(rows)


def metrics_table() -> str:
    """Every metric the plugin serves with ``--metrics-address``: a recorder fed one
    of each event on a two-NUMA-node topology, so every family has a series to show
    its labels; the process, platform and GC collectors left out."""
    from numa_device_plugin.plugin.reports.prometheus import documented_families

    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for family in documented_families():
        if family.name.startswith(("process_", "python_")):
            continue
        names = sorted({s.name for s in family.samples if not s.name.endswith("_created")})
        labels = sorted({k for s in family.samples for k in s.labels} - {"le"})
        shown = (
            ", ".join(f"`{n}`" for n in names)
            if family.type != "histogram"
            else (f"`{family.name}` (`_bucket`, `_sum`, `_count`)")
        )
        label_text = ", ".join(f"`{label}`" for label in labels) or "none"
        rows.append(f"| {shown} | {family.type} | {label_text} | {_cell(family.documentation)} |")
    return "\n".join(rows)


def cli_reference() -> str:
    """Per command of ``numa-device-plugin``: a section with its usage, its help and a
    table of its options, each as ``--help`` shows it (the click option's own help
    record: flags and metavar; help with its variable and default)."""
    import click

    from numa_device_plugin.cli import COMMANDS, cli

    root = click.Context(cli, info_name="numa-device-plugin")
    parts = []
    for name in COMMANDS:
        command = cli.get_command(root, name)
        assert command is not None, name
        ctx = click.Context(command, info_name=name, parent=root)
        usage = " ".join(command.collect_usage_pieces(ctx))
        rows = ["| option | meaning |", "|---|---|"]
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            flags, meaning = record
            rows.append(f"| <code>{_cell(flags)}</code> | {_cell(meaning)} |")
        parts.append(
            f"## `{name}`\n\n`numa-device-plugin {name} {usage}`\n\n"
            f"{_cell(command.help or '')}\n\n" + "\n".join(rows)
        )
    return "\n\n".join(parts)


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell and in HTML: one line, ``&``, ``<``, ``>``
    and ``|`` as entities."""
    text = " ".join(text.split())
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "&#124;")):
        text = text.replace(char, entity)
    return text


TABLES = {"cli": cli_reference, "metrics": metrics_table, "helm-values": helm_values_table}


def regenerated(markdown: str) -> str:
    """``markdown`` with each generated block (its marker and, when written before,
    the table up to ``<!-- end generated: NAME -->``) holding the table as the code
    makes it now. Raises ValueError for an unknown marker."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"unknown generated table {name!r}")
        return f"<!-- generated: {name} -->\n{TABLES[name]()}\n<!-- end generated: {name} -->"

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The site always shows the tables as the code makes them (:func:`regenerated`),
    whatever the committed page holds; an unknown marker fails the build."""
    return regenerated(markdown)


def main() -> int:
    """``make reference``: write the tables into the pages themselves, so that the
    Markdown read on the forge holds them too (tests/test_docs.py fails when a
    committed page is stale)."""
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text()
        fresh = regenerated(text)
        if fresh != text:
            page.write_text(fresh)
            print(f"wrote {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
