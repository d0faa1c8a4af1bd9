"""The documentation site as built: every page link works when the site is opened
from disk (``make docs``, then ``site/index.html``)."""

from __future__ import annotations

import html
import json
import re
import shlex
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.conftest import REPO, readme_command


def test_the_built_site_links_to_pages_not_folders(tmp_path: Path) -> None:
    """Under file:// a link to a folder shows a directory listing (issue 38's trap 2)."""
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(tmp_path / "site")],
        cwd=REPO, check=True, capture_output=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                       "PATH": str(Path(sys.executable).parent)},
    )  # fmt: skip
    index = (tmp_path / "site" / "index.html").read_text()
    links = [
        href for href in re.findall(r'href="([^"#]*)"', index)
        if href and not href.startswith(("http:", "https:", "mailto:")) and "assets/" not in href
    ]  # fmt: skip
    assert any(link.endswith("getting-started.html") for link in links), links
    for link in links:
        assert not link.endswith("/"), f"a link to a folder: {link}"
        assert (tmp_path / "site" / link).resolve().is_file(), link


MEASURE = """<script>
window.addEventListener('load', () => {
  const column = document.querySelector('article').getBoundingClientRect();
  const edge = Math.max(column.right, window.innerWidth) + 1;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const wide = [...document.querySelectorAll('article pre')]
    .filter(pre => {
      const code = pre.querySelector('code') || pre;
      const clipped = code.scrollWidth > code.clientWidth + 1 && !scrolls(code) && !scrolls(pre);
      return pre.getBoundingClientRect().right > edge || clipped;
    })
    .map(pre => pre.textContent.slice(0, 60));
  if (document.documentElement.scrollWidth > window.innerWidth + 1) wide.push('(the page)');
  const broken = [...document.querySelectorAll('article table tr td:first-child code')]
    .filter(code => code.getClientRects().length > 1)
    .map(code => code.textContent);
  document.body.setAttribute('data-measured', JSON.stringify({wide, broken}));
});
</script>"""


def built_site(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(folder)],
        cwd=REPO, check=True, capture_output=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                       "PATH": str(Path(sys.executable).parent)},
    )  # fmt: skip
    return folder


def dump_dom(url: str, width: int) -> str:
    from tests.plugin.test_nodepage import BROWSER_FLAGS, chromium

    return subprocess.run(
        [chromium(), *BROWSER_FLAGS, f"--window-size={width},900", "--virtual-time-budget=5000",
         "--dump-dom", url],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip


@pytest.mark.parametrize("width", [1280, 800, 420])
@pytest.mark.parametrize("page", ["getting-started.html", "reference/helm-values.html"])
def test_code_stays_in_the_column_and_value_names_are_never_broken(
    tmp_path: Path, page: str, width: int
) -> None:
    """Issue 38's trap 10: code blocks wider than the column, and the Helm values table
    breaking names mid-word. Chromium draws the built page; a script measures it: a
    code block stays within the column (on a narrow screen the theme lets it reach the
    screen's edges) and scrolls what is wider, the page never scrolls sideways, and a
    name in a table's first column is on one line."""
    site = built_site(tmp_path / "site")
    path = site / page
    path.write_text(path.read_text().replace("</body>", MEASURE + "</body>"))
    dom = dump_dom(path.as_uri(), width)
    found = re.search(r"data-measured=\"([^\"]*)\"", dom)
    assert found is not None, "the measuring script did not run"
    measured = json.loads(html.unescape(found[1]))
    assert measured["wide"] == [], f"code blocks wider than the column: {measured['wide']}"
    assert measured["broken"] == [], f"names broken over lines: {measured['broken']}"


def test_a_navigation_link_of_the_site_opened_from_disk_opens_its_page(tmp_path: Path) -> None:
    """Issue 38's trap 2 in the browser: from site/index.html under file://, the
    navigation's link to Getting started opens that page, not a directory listing."""
    site = built_site(tmp_path / "site")
    dom = dump_dom((site / "index.html").as_uri(), 1280)
    links = re.findall(
        r'class="md-nav__link"[^>]*href="([^"]+)"|href="([^"]+)"[^>]*class="md-nav__link"', dom
    )
    targets = [a or b for a, b in links]
    (started,) = {t for t in targets if "getting-started" in t}
    page = dump_dom(urllib.parse.urljoin((site / "index.html").as_uri(), started), 1280)
    assert "<title>Getting started" in page
    assert "Index of" not in page


def test_the_readme_tour_writes_its_machines_outside_the_checkout() -> None:
    """A sysfs tree in the repository's root (a snapshot's link cycles) made `pip install
    -e .` run for minutes: the tour's fake hosts go into a temporary folder."""
    assert readme_command('tour="$(mktemp -d)"') == ["tour=$(mktemp -d)"]
    writes = [line for line in (REPO / "README.md").read_text().splitlines()
              if line.startswith(".venv/bin/numa-device-plugin fake-host ")]  # fmt: skip
    assert len(writes) == 2
    for line in writes:
        assert shlex.split(line)[2].startswith("$tour/"), line
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        assert "--sysfs-root fakepcilocalities" not in page.read_text(), page


def test_the_readme_tour_prints_what_discover_prints(tmp_path: Path) -> None:
    """The README's tour, run: its fake hosts written (no ../shared needed), then its
    discover example, every line it shows (but "..." elisions) discover's."""
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith(".venv/bin/numa-device-plugin fake-host "):
            words = [w.replace("$tour", str(tmp_path)) for w in shlex.split(line)[1:]]
            subprocess.run([sys.executable, "-m", "numa_device_plugin", *words],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    command = readme_command(".venv/bin/numa-device-plugin discover --sysfs-root")
    args = [word.replace("$tour", str(tmp_path)) for word in command[1:]]
    printed = subprocess.run(
        [sys.executable, "-m", "numa_device_plugin", *args],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    readme = (REPO / "README.md").read_text()
    block = readme.split("$ .venv/bin/numa-device-plugin discover --sysfs-root", 1)[1]
    shown = block.split("```", 1)[0].splitlines()[2:]  # past the command's two lines
    assert len(shown) > 5, "the README shows no output"
    for line in shown:
        if line == "..." or not line.strip():
            continue
        if ", ...," in line:  # the resources line, elided in the middle
            head, tail = line.split(", ...,")
            assert any(p.startswith(head) and p.endswith(tail) for p in printed), line
            continue
        assert line in printed, line


def test_the_committed_reference_pages_hold_the_tables_the_code_makes() -> None:
    """The reference pages were markers only, empty on the forge though the README
    links them: their tables are committed (make reference) and kept fresh here."""
    from tests.conftest import load_script

    hooks = load_script(REPO / "docs" / "hooks.py", "docs_hooks_reference")
    for name in ("cli", "metrics", "helm-values"):
        page = REPO / "docs" / "reference" / f"{name}.md"
        text = page.read_text()
        assert f"<!-- end generated: {name} -->" in text, f"{page}: run make reference"
        assert hooks.regenerated(text) == text, f"{page} is stale: run make reference"
        assert text.count("\n|") > 5, f"{page} holds no table"


def test_the_home_page_and_the_readme_link_every_page_of_the_site() -> None:
    """docs/index.md lacked Align, Security, Upgrade, Uninstall and Compatibility, and
    the README never linked Compatibility."""
    import yaml

    def pages(entries: list[object]) -> list[str]:
        found: list[str] = []
        for entry in entries:
            assert isinstance(entry, dict)
            for value in entry.values():
                found.extend(pages(value) if isinstance(value, list) else [value])
        return found

    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    nav = [page for page in pages(config["nav"]) if page != "index.md"]
    index = (REPO / "docs" / "index.md").read_text()
    readme = (REPO / "README.md").read_text()
    for page in nav:
        assert f"]({page})" in index, f"docs/index.md does not link {page}"
        assert f"](docs/{page})" in readme, f"README.md does not link docs/{page}"


def test_the_compatibility_table_is_ordered_by_version_then_date() -> None:
    """Newest Kubernetes first, and within a version the newest run first (it was in
    the order the runs were made)."""
    text = (REPO / "docs" / "compatibility.md").read_text()
    rows = [line for line in text.splitlines() if re.match(r"\| 1\.\d+\.\d+ \|", line)]
    keys = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        keys.append((tuple(int(part) for part in cells[0].split(".")), cells[2]))
    assert len(keys) >= 6
    assert keys == sorted(keys, reverse=True)
