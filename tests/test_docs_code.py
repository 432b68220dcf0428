"""The docs cannot drift from the code: every ```python block of docs/**/*.md runs as the README's blocks
do (tests/test_readme.py: the same substitutions of real model names by tiny local models, the same
namespace of tiny models and user data, the same setup for blocks that need a policy, a judge or a
captioner). Shell blocks are not run, as in the README; a block that cannot run must be listed in
:data:`NOT_RUN` with the reason. The facts other tests pin to a page's text live here too: the builder
table of the quick start and the veRL overrides.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from test_readme import inputs, python_blocks, run_block  # noqa: F401  (inputs: the fixture the blocks use)

DOCS = REPO / "docs"
#: Pages whose blocks train or run a larger tiny model (the README's slow sections moved here).
SLOW_PAGES = {"judges.md", "experiments.md"}
#: Blocks (page, first line) that are not executed, with the reason.
NOT_RUN: dict[tuple[str, str], str] = {
    ("adding-a-metric.md", "from typing import Any, Mapping, Sequence"):
        "a module of its own (its spec names its scorer by the module's import path, f'{__name__}:WordOverlap'); "
        "the same metric is tests/toy_metric.py, which tests/test_new_metric.py and tests/test_metric_plugin.py "
        "reach from every entry point",
    ("adding-a-metric.md", "from capreward.rewards import reward_for"):
        "uses the metric the block above registers (a module of its own); tests/test_new_metric.py makes these "
        "calls on tests/toy_metric.py",
    ("adding-a-metric.md", "from conformance import ConformanceCase, MetricConformance   # tests/conformance.py"):
        "runs from the repository's tests/ folder (the conformance tester is not in the wheel); "
        "tests/test_conformance.py runs it over every registered metric",
    ("integrations/goodhart.md", "from capreward.callbacks import GoodhartCallback, GoodhartMonitor"):
        "a sketch inside a TRL script (the trainer's other arguments elided); tests/test_goodhart.py runs the "
        "monitor inside TRL's GRPOTrainer",
    ("judges.md", "from capreward.judges import SGLangJudge, VLLMJudge"):
        "needs an SGLang or vLLM server; tests/test_exact_remote_scores.py makes the same calls against the test "
        "chat server speaking both protocols",
    ("judges.md", "from vllm import LLM"):
        "needs vLLM or SGLang installed (the GPU command's engines step runs it); tests/test_engine_judge.py runs "
        "EngineJudge against faithful offline fakes of both engines",
}


def doc_blocks() -> list[tuple[str, str, str]]:
    """(page relative to docs/, section heading, code) of every ```python block of the docs."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS).as_posix()
        # a "# docs-script" block runs as pasted, in a subprocess: tests/test_docs_scripts.py
        out += [(rel, heading, code) for heading, code in python_blocks(page.read_text(encoding="utf-8"))
                if not code.startswith("# docs-script")]
    return out


BLOCKS = doc_blocks()


def test_the_docs_have_the_blocks_the_readme_had():
    """The README's examples moved to these pages: each still has its runnable block."""
    pages = {page for page, _, _ in BLOCKS}
    pages |= {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")
              if "```python\n# docs-script" in page.read_text(encoding="utf-8")}  # run by test_docs_scripts.py
    assert {"quickstart.md", "integrations/trl.md", "integrations/scst.md", "judges.md", "design/encoders.md",
            "design/caption-reading.md", "experiments.md"} <= pages, pages


@pytest.mark.parametrize(
    "page,heading,code",
    [pytest.param(p, h, c, id=f"{p}-{i}-{h[:30]}", marks=[pytest.mark.slow] if p in SLOW_PAGES else [])
     for i, (p, h, c) in enumerate(BLOCKS)],
)
def test_docs_python_block_runs(page, heading, code, inputs):  # noqa: F811
    first = code.strip().splitlines()[0]
    if (page, first) in NOT_RUN:
        pytest.skip(NOT_RUN[(page, first)])
    run_block(code, inputs, f"docs/{page}[{heading}]")


def test_every_not_run_entry_names_an_existing_block():
    assert set(NOT_RUN) <= {(p, c.strip().splitlines()[0]) for p, _, c in BLOCKS}


def test_every_repository_file_the_docs_cite_exists():
    """A file named in backticks (`tests/test_bad_inputs.py`, `benchmarks/README.md`) is in the repository
    (links between pages are checked by the strict build)."""
    missing = []
    for page in DOCS.rglob("*.md"):
        for path in re.findall(r"`((?:tests|benchmarks|experiments|recipes|scripts)/[\w./-]+\.(?:py|md|sh|txt))`",
                               page.read_text(encoding="utf-8")):
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(DOCS)}: {path}")
    assert not missing, missing


BUILDER_TABLE = re.compile(r"^\| builder \| what you get \|\n\|[- |]+\|\n((?:\|.*\|\n)+)", re.M)


def quickstart_builders() -> list[tuple[str, str]]:
    """``(name, argument text)`` of every builder in the quick start's "Try it without weights" table."""
    table = BUILDER_TABLE.search((DOCS / "quickstart.md").read_text(encoding="utf-8"))
    assert table, "docs/quickstart.md has no '| builder | what you get |' table"
    out = []
    for line in table.group(1).splitlines():
        cell = line.split("|")[1].strip()
        call = re.fullmatch(r"`([A-Za-z_][\w.]*)\((.*)\)`", cell)
        assert call, f"builder cell {cell!r} is not a `name(args)` call"
        out.append((call.group(1), call.group(2)))
    return out


def test_every_builder_in_the_quickstart_table_is_importable_from_capreward_testing():
    """Each builder the quick start names is a top-level name of capreward.testing (``from
    capreward.testing import name``), callable with the arguments the table shows (their names and
    defaults)."""
    import inspect

    import capreward.testing as testing

    builders = quickstart_builders()
    assert len(builders) >= 5
    for name, args in builders:
        assert "." not in name, f"{name}: name the builder as capreward.testing exports it"
        assert name in testing.__all__ and callable(getattr(testing, name, None)), f"capreward.testing lacks {name}"
        params = inspect.signature(getattr(testing, name)).parameters
        for arg in filter(None, (a.strip() for a in args.split(","))):
            key, _, default = arg.partition("=")
            assert key in params, f"{name}({args}): no parameter {key!r}"
            if default:
                assert repr(params[key].default) == default, f"{name}: {key} defaults to {params[key].default!r}"
