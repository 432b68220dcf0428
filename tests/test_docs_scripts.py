"""The docs' scripts run as pasted: every integration page and the quick start open with a complete
script (a ```python block whose first line is a ``# docs-script`` comment), and each metric page shows its
scorer's example as one. Each script is written to a file and run as ``python script.py`` in a process of
its own (a child of the test zygote, :mod:`cli_process`: the heavy libraries imported once, capreward
and the script's own imports afresh), in an empty folder, with nothing but the tree's ``src`` on ``PYTHONPATH`` and the hub offline: no
substitution, no prepared namespace (tests/test_docs_code.py runs the pages' other blocks its way and
leaves these to this file). The scripts use the tiny models of ``capreward.testing`` (built in seconds,
trained ones cached in ``$CAPREWARD_CACHE``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cli_process
from conftest import REPO

DOCS = REPO / "docs"
MARK = "# docs-script"
#: The pages that must open with a script.
OPENING = ["quickstart.md", "integrations/trl.md", "integrations/verl.md", "integrations/openrlhf.md", "integrations/easyr1.md",
           "integrations/lightning.md", "integrations/trainer.md", "integrations/ray.md", "integrations/scst.md"]
#: Scripts that train or start a framework (seconds to a minute each on a busy 2-core machine).
TIMEOUT = 600
#: Pages whose script starts a cluster (Ray: a minute and more before its first actor runs, as
#: tests/test_cli_score.py's Ray test, also slow) or trains (measured on the busy 2-core machine, load 7:
#: TRL 208 s, Trainer 128 s, SCST 120 s; the fast lane's TRL, Trainer and SCST tests run the same paths).
#: The others took 63-90 s each there.
SLOW_PAGES = {"integrations/ray.md", "integrations/trl.md", "integrations/trainer.md", "integrations/scst.md"}


def fences(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of a markdown text, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M)]


def scripts(text: str) -> list[str]:
    """The ``# docs-script`` blocks of a markdown text."""
    return [code for lang, code in fences(text) if lang == "python" and code.startswith(MARK)]


def all_scripts() -> list[tuple[str, int, str]]:
    """(page, index, code) of every docs-script of docs/ and the README."""
    out = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        rel = page.relative_to(DOCS).as_posix() if page.is_relative_to(DOCS) else page.name
        out += [(rel, i, code) for i, code in enumerate(scripts(page.read_text(encoding="utf-8")))]
    return out


def run_script(code: str, folder: Path) -> subprocess.CompletedProcess:
    """``python script.py`` in ``folder``, as a user who pasted it would (the tree's ``src`` importable)."""
    script = folder / "script.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore::DeprecationWarning")
    return cli_process.run([], script=script, cwd=folder, env=env, timeout=TIMEOUT)


def check(out: subprocess.CompletedProcess, label: str) -> None:
    assert out.returncode == 0, f"{label} failed as pasted:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"


@pytest.mark.parametrize("page", OPENING)
def test_the_page_opens_with_a_complete_script(page):
    """The page's first code block is its script (prose may come before it, no other code)."""
    blocks = fences((DOCS / page).read_text(encoding="utf-8"))
    assert blocks, f"{page} has no code"
    lang, code = blocks[0]
    assert lang == "python" and code.startswith(MARK), f"{page}: its first code block is not a '{MARK}' block"


@pytest.mark.parametrize("page,index,code", [
    pytest.param(p, i, c, id=f"{p}-{i}", marks=[pytest.mark.slow] if p in SLOW_PAGES else []) for p, i, c in all_scripts()])
def test_the_script_runs_as_pasted(page, index, code, tmp_path):
    check(run_script(code, tmp_path), f"{page} script {index}")


def metric_pages():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_metric_pages
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return docs_metric_pages


def metric_scripts() -> dict[str, str]:
    """name -> the docs-script of each registered metric's generated page (exactly one per page)."""
    from capreward import registry

    pages = metric_pages()
    found = {}
    for spec in registry.specs():
        page_scripts = scripts(pages.metric_page(spec))
        assert len(page_scripts) == 1, f"the page of {spec.name} has {len(page_scripts)} scripts"
        found[spec.name] = page_scripts[0]
    return found


def test_every_metric_page_shows_its_scorers_doctest_as_a_script_that_names_nothing_undefined(tmp_path):
    """Each metric page's script is its scorer's ``Examples:`` doctest (which tests/test_docs_examples.py
    runs, so the code itself is run there, once); as a script of its own it must import every name it uses (a doctest sees its
    module's globals, a pasted script does not): ruff's undefined-name rule reads each one."""
    found = metric_scripts()
    assert len(found) >= 9
    for name, code in found.items():
        compile(code, name, "exec")
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.is_file():
        pytest.skip("ruff is not installed (the lint extra)")
    out = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F821,F822,F823", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    (tmp_path / "control.py").write_text(f"{MARK}\nprint(video)\n", encoding="utf-8")  # the control fails
    out = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F821", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "control.py" in out.stdout


def test_every_test_builder_a_page_uses_is_documented():
    """Every name a docs-script or a metric page's script imports from ``capreward.testing`` (or its
    modules) is on docs/api/testing.md: rendered (``::: ...name``) or in its table (``name(...)``)."""
    import ast

    page = (DOCS / "api" / "testing.md").read_text(encoding="utf-8")
    codes = [code for _, _, code in all_scripts()] + list(metric_scripts().values())
    used = set()
    for code in codes:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("capreward.testing"):
                used |= {alias.name for alias in node.names}
    assert {"trained_clip_path", "tiny_caption_policy", "tiny_vlm_judge"} <= used, used
    missing = sorted(n for n in used if not re.search(rf"(^::: [\w.]+\.{n}$|`{n}\()", page, flags=re.M))
    assert not missing, f"docs/api/testing.md does not document {missing}"


def test_a_failing_script_fails_the_check(tmp_path):
    """The control: a script with an undefined name (the quick start's old ``NameError: video``) fails."""
    out = run_script(f"{MARK}\nprint(video)\n", tmp_path)
    assert out.returncode != 0 and "NameError" in out.stderr
    with pytest.raises(AssertionError, match="failed as pasted"):
        check(out, "control")


def test_search_finds_option_names_with_dots_and_no_link_to_a_missing_repository():
    """The site's search splits words at dots (so ``remote_url`` finds ``--reward.remote_url``) but not at
    underscores; mkdocs.yml names no repository (the one it named does not exist)."""
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert "repo_url" not in config and "edit_uri" not in config
    search = next(p["search"] for p in config["plugins"] if isinstance(p, dict) and "search" in p)
    words = [w for w in re.split(search["separator"], "--reward.remote_url http://host:5000/get_reward") if w]
    assert "remote_url" in words and "reward" in words and "get_reward" in words, words
