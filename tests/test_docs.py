"""The documentation site as built: every page link works when the site is opened
from disk (``make docs``, then ``site/index.html``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


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
