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

#: A strict build renders every API page (minutes on a busy 2-core machine: 362 s measured for the site
#: fixture): out of the fast lane, in every CI run.
pytestmark = pytest.mark.slow

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
    # the metric-page hook is left out: this docs folder has no metrics section
    config.write_text(f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\nhooks: []\nnav:\n  - index.md\n  - page.md\n")
    out = build(config, tmp_path / "site")
    assert out.returncode != 0, f"the strict build accepted {broken}:\n{out.stderr}"
    assert any(why.lower() in w.lower() for w in warnings_of(out)), out.stderr


# ------------------------------------------------------------------ metric pages, from the registry
def metric_pages():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_metric_pages
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return docs_metric_pages


def test_every_registered_metric_has_a_page_with_its_sub_scores(site):
    """Each spec of the registry has its generated page, listing the results-file field of every sub-score
    it writes for each visual kind, with and without references as it allows, and with each boolean option
    flipped; its options and the option that restores each deviation from the released code."""
    import html

    from capreward import registry

    specs = registry.specs()
    assert [s.name for s in specs] == list(registry.names()) and len(specs) >= 7
    index = html.unescape((site / "metrics" / "index.html").read_text(encoding="utf-8"))
    for spec in specs:
        page = site / "metrics" / spec.name / "index.html"
        assert page.is_file(), f"no page for {spec.name}"
        text = html.unescape(page.read_text(encoding="utf-8"))
        assert spec.title in text and f'href="{spec.name}/"' in index, spec.name
        flips = [{o.name: not o.default} for o in spec.options if isinstance(o.default, bool)]
        for config in [{}, *flips]:
            refs = {"none": [False], "optional": [False, True], "required": [True]}[spec.references_for(config)]
            for kind in spec.visual_kinds(config):
                for with_refs in refs:
                    for sub in spec.sub_scores_for({**config, "visual": kind, "references": with_refs}):
                        assert spec.field_of(sub) in text, f"{spec.name}: {spec.field_of(sub)} ({kind}, {config})"
        for option in spec.options:
            assert option.name in text, f"{spec.name}: option {option.name}"
        for deviation in spec.deviations:
            assert deviation.what in text and (deviation.restore is None or deviation.restore in text), deviation


def test_the_metric_pages_say_what_the_scorers_write(site):
    """Facts read from the scorers' results, independently of the registry: EMScore's parts and components,
    CLIP-S's legacy RefCLIP-S field, G-VEval's ACCR dimensions, VisCE² on images only."""
    import html

    def page(name):
        return html.unescape((site / "metrics" / name / "index.html").read_text(encoding="utf-8"))

    em = page("emscore")
    for part in ("video", "reference", "combined"):
        for field in ("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f"):
            assert f"emscore/{part}/{field}" in em
    assert "idf='batch'" in em and "long_captions='truncate'" in em
    assert "ref_clip_s" in page("clip_s")
    gv = page("gveval")
    assert all(f"gveval/{d}" in gv for d in ("accuracy", "completeness", "conciseness", "relevance"))
    assert "temperature=1.0" in gv
    assert re.search(r"visuals</td>\s*<td>image</td>", page("visce2"))


def test_a_newly_registered_metric_gets_a_page():
    """Adding a metric is one spec: the generator needs nothing else."""
    from capreward.registry import Deviation, MetricSpec, Option

    spec = MetricSpec(
        name="toy", aliases=("toy_score",), title="Toy", summary="Counts colour words.", paper="nobody, 2026",
        released_code=None, scorer="toy.module:Toy",
        sub_scores=lambda c: ("words",) + (("ref",) if c.get("references") else ()) + (("long",) if c.get("long") else ()),
        value_range=(0.0, 1.0), visuals=("image",), references="optional",
        options=(Option("long", False, "also count long words"),),
        deviations=(Deviation("counts twice", "once=True"),),
    )
    text = metric_pages().metric_page(spec)
    assert text.startswith("# Toy\n\nCounts colour words.")
    for field in ("toy/words", "toy/ref", "toy/long"):
        assert f"`{field}`" in text
    assert "`once=True`" in text and "| range | [0, 1], higher is better |" in text
    assert "`long=True`" in text  # the configuration that writes toy/long is labelled


def test_every_command_has_its_page_with_every_option_of_its_parser(site):
    """Each sub-command of ``capreward`` has a page that lists every option its parser declares (the
    ``--help`` block is generated from the parser when the site is built)."""
    import html

    from capreward.cli.main import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"score", "serve", "report", "explain", "meta-eval", "demo"} <= set(commands)
    for name, parser in commands.items():
        page = site / "cli" / name / "index.html"
        assert page.is_file(), f"capreward {name} has no page"
        text = html.unescape(page.read_text(encoding="utf-8"))
        assert f"usage: capreward {name}" in text, name
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, f"capreward {name}: {flag} is not on its page"


def test_no_page_shows_a_sphinx_role(site):
    """Docstrings rendered on the pages (API reference, design pages) show names, not ``:func:`` roles."""
    shown = {}
    for page in site.rglob("*.html"):
        found = re.findall(r":(?:func|class|data|meth|mod|attr|obj|exc|const):(?:<code>|`)", page.read_text(encoding="utf-8"))
        if found:
            shown[str(page.relative_to(site))] = len(found)
    assert not shown, shown


def test_the_per_metric_classes_show_their_options_in_the_reference(site):
    """A reward or Metric fixed to one metric shows its run-time signature (its scorer's options, added by
    scripts/griffe_explicit_signatures.py), not the generic ``(metric, /, **options)``."""
    import html as html_lib

    rewards = html_lib.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "rewards" / "index.html").read_text("utf-8")))
    em = rewards[rewards.index("EMScoreReward("):][:3000]
    assert "idf_default" in em and "harmonic_mean" in em and "image_column" in em
    assert "metric=None" not in em
    metrics = html_lib.unescape(re.sub(r"<[^>]+>", "", (site / "api" / "metrics" / "index.html").read_text("utf-8")))
    visce2 = metrics[metrics.index("VisCE2Metric("):][:3000]
    assert "context_max_tokens" in visce2 and "dataset_size" in visce2
