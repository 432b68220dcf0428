"""The documentation site builds strictly: ``mkdocs build --strict`` of mkdocs.yml, in a subprocess, into a
temporary folder. Strict mode turns every warning into a failure, and mkdocs.yml's ``validation`` makes a
link to a missing page, a missing anchor, an absolute link, a page left out of the nav and an unresolved
API cross-reference warnings. A control build shows that a broken link or anchor does fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

DOCS = REPO / "docs"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=600,
    )


def warnings_of(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (out.stdout + out.stderr).splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    out = build(REPO / "mkdocs.yml", site)
    assert out.returncode == 0 and not warnings_of(out), f"mkdocs build --strict failed:\n{out.stdout}\n{out.stderr}"
    return site


def test_the_site_builds_strictly_without_a_warning(site):
    assert (site / "index.html").is_file()


def test_every_markdown_page_is_in_the_site(site):
    """No page is written and left unbuilt (``validation.omitted_files`` warns too: this names the page)."""
    pages = sorted(p.relative_to(DOCS) for p in DOCS.rglob("*.md"))
    assert pages
    for page in pages:
        html = site / (page.with_suffix("") / "index.html" if page.stem != "index" else page.with_suffix(".html"))
        assert html.is_file(), f"{page} has no page in the site ({html.relative_to(site)})"


@pytest.mark.parametrize("broken,why", [
    ("[a page](no_such_page.md)", "is not found among documentation files"),
    ("[an anchor](index.md#no-such-heading)", "does not contain an anchor"),
    ("[an anchor on this page](#nowhere)", "no such anchor"),
])
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path, broken, why):
    """The control: the same settings (mkdocs.yml inherited), a docs folder with one broken link."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nA heading.\n")
    (docs / "page.md").write_text(f"# Page\n\nSee {broken}.\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\nnav:\n  - index.md\n  - page.md\n")
    out = build(config, tmp_path / "site")
    assert out.returncode != 0, f"the strict build accepted {broken}:\n{out.stderr}"
    assert any(why.lower() in w.lower() for w in warnings_of(out)), out.stderr
