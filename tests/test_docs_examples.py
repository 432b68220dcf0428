"""The API reference's examples run: every class the reference documents (a ``::: module.Class`` line of
docs/api/*.md) has an ``Example:`` section of doctests in its docstring, and they pass; a documented
function's examples, where it has some, pass too. The examples use the tiny local models of
``capreward.testing`` (nothing is downloaded).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re

import pytest

from conftest import REPO

API = REPO / "docs" / "api"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def documented() -> list[str]:
    """Dotted paths of the objects the API reference renders, in page order."""
    out = []
    for page in sorted(API.glob("*.md")):
        out += re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return out


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_reference_documents_the_public_classes():
    paths = documented()
    assert len(paths) == len(set(paths)), "an object is documented twice"
    names = {p.rpartition(".")[2] for p in paths}
    assert {"EMScore", "CLIPScore", "PACScore", "FLEUR", "RemoteFLEUR", "VisCE2", "GVEval", "CompositeReward",
            "EMScoreReward", "EMScoreMetric", "LocalChatJudge", "OpenAIJudge", "SelfCriticalStep"} <= names


@pytest.mark.parametrize("path", documented())
def test_documented_example_runs(path):
    obj = resolve(path)
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        assert re.search(r"^Examples?:\n(?:\s+.*\n)*?\s+>>> ", doc + "\n", flags=re.M), (
            f"{path}: a documented class needs an 'Example:' section of doctests")
    module = importlib.import_module(path.rpartition(".")[0])
    tests = doctest.DocTestFinder(recurse=False).find(obj, path, globs=dict(vars(module)))  # as --doctest-modules
    if inspect.isclass(obj):
        assert sum(len(t.examples) for t in tests) > 0, path
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test, out=out.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(out)
