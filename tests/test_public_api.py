"""The public surface is what the API reference documents, and the reference follows one docstring
convention.

- Every name of every public package's ``__all__`` (``capreward``, ``capreward.rewards``, ...) is rendered
  by a ``::: module.Name`` line of docs/api/*.md, and every rendered object is in a public ``__all__``. A name left
  out of an ``__all__`` stays importable: user code does not break.
- Every documented class has an ``Examples:`` section of doctests (griffe renders ``Example:`` as an
  admonition, not as code) (run by tests/test_docs_examples.py) and, when its
  constructor takes arguments, an ``Args:`` section; every documented function and every public method a
  class page renders (all of them, or the ``members:`` the page lists) has ``Args:`` when it takes
  arguments and ``Returns:`` (or ``Yields:``) when it returns something.
- Every docstring example of a module the reference renders runs (as ``--doctest-modules`` would).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re

import pytest

from conftest import REPO

API = REPO / "docs" / "api"

#: The packages (and the public modules) whose ``__all__`` is public API.
PACKAGES = ("capreward", "capreward.caption_reading", "capreward.caption_budget", "capreward.random_state", "capreward.adapters", "capreward.backbones", "capreward.callbacks",
            "capreward.judges", "capreward.media", "capreward.metaeval", "capreward.registry", "capreward.report", "capreward.rewards", "capreward.server",
            "capreward.testing", "capreward.torchmetrics", "capreward.training")

def entries() -> list[tuple[str, object]]:
    """``(path, members)`` of every ``::: path`` line of docs/api/*.md; ``members`` is the page's
    ``members:`` option (a list, or False for none), None when the page renders every public member."""
    out = []
    for page in sorted(API.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for k, line in enumerate(lines):
            m = re.fullmatch(r"::: ([\w.]+)", line)
            if not m:
                continue
            members = None
            for opt in lines[k + 1:]:
                if not opt.startswith(" ") or not opt.strip():
                    break
                got = re.fullmatch(r"\s+members:\s*(.*)", opt)
                if got:
                    value = got.group(1).strip()
                    members = False if value == "false" else [v.strip() for v in value.strip("[]").split(",") if v.strip()]
            out.append((m.group(1), members))
    return out


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def public_names() -> dict[tuple[str, str], object]:
    out = {}
    for package in PACKAGES:
        mod = importlib.import_module(package)
        for name in mod.__all__:
            out[(package, name)] = getattr(mod, name)
    return out


def same(a, b) -> bool:
    return a is b


def test_every_public_name_is_documented():
    documented = [resolve(p) for p, _ in entries()]
    missing = [f"{package}.{name}" for (package, name), obj in public_names().items()
               if not any(same(obj, d) for d in documented)]
    assert not missing, f"in an __all__ but not in docs/api/*.md (document it, or drop it from __all__): {missing}"


def test_every_documented_object_is_public():
    public = public_names()
    stray = []
    for path, _ in entries():
        obj, name = resolve(path), path.rpartition(".")[2]
        if not any(same(obj, o) and n == name for (_, n), o in public.items()):
            stray.append(path)
    assert not stray, f"documented in docs/api/*.md but in no public __all__: {stray}"


def test_old_names_stay_importable():
    """Names that left an ``__all__`` when the surface was trimmed still import from where they did."""
    from capreward import EMScoreResult, MatchScores  # noqa: F401
    from capreward.adapters import Label, parse_label, reward_names  # noqa: F401
    from capreward.backbones import LRUCache, split_windows  # noqa: F401
    from capreward.judges import FLEUR_PROMPT, DecodeState, load_llava, resolve_device  # noqa: F401
    from capreward.media import NAN_IMAGE, ConfinedFile, media_key, to_rgb  # noqa: F401
    from capreward.metaeval import BENCHMARKS, ScoreRow, index_scores  # noqa: F401
    from capreward.rewards import GroupScores, collect_inputs, completion_text  # noqa: F401
    from capreward.server import DynamicBatcher as _D, RewardHTTPServer  # noqa: F401
    from capreward.testing import JudgeRecipe, openai_state_dict  # noqa: F401
    from capreward.torchmetrics import CaptionScores  # noqa: F401
    from capreward.training import gumbel_softmax_st, relaxed_decode  # noqa: F401


# ------------------------------------------------------------------------------ the docstring convention
def sections(doc: str | None) -> set[str]:
    return set(re.findall(r"^(\w[\w ]*):[ \t]*$", doc or "", flags=re.M))


def arguments(func) -> list[str]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values() if p.name not in ("self", "cls")]


def returns_something(func) -> bool:
    ret = inspect.signature(func).return_annotation
    return ret not in (None, "None", inspect.Signature.empty)


def convention_problems(path: str, obj, members) -> list[str]:
    problems = []

    def check_function(where: str, func) -> None:
        s = sections(inspect.getdoc(func))
        if arguments(func) and "Args" not in s:
            problems.append(f"{where}: no Args section")
        if returns_something(func) and not s & {"Returns", "Yields"}:
            problems.append(f"{where}: no Returns section")

    if not inspect.isclass(obj):
        if callable(obj):
            check_function(path, obj)
        return problems
    doc = inspect.getdoc(obj) or ""
    if not re.search(r"^Examples:\n(?:\s+.*\n)*?\s+>>> ", doc + "\n", flags=re.M):
        problems.append(f"{path}: no Examples section of doctests")  # "Example:" renders as an admonition
    init = vars(obj).get("__init__")  # its own (a Protocol's placeholder __init__ is not a constructor)
    if init is not None and getattr(init, "__qualname__", "").startswith(obj.__qualname__ + ".") and arguments(init) and "Args" not in sections(doc):
        problems.append(f"{path}: the constructor's arguments have no Args section")
    if members is False:
        return problems
    names = members if members is not None else [n for n in vars(obj) if not n.startswith("_")]
    for name in names:
        func = vars(obj).get(name)
        assert func is not None or members is None, f"{path}: the page lists member {name!r}, which it lacks"
        if inspect.isfunction(func) or isinstance(func, (staticmethod, classmethod)):
            check_function(f"{path}.{name}", getattr(obj, name))
    return problems


CHECKED = entries()


@pytest.mark.parametrize("path,members", CHECKED, ids=[p for p, _ in CHECKED])
def test_documented_docstrings_follow_the_convention(path, members):
    problems = convention_problems(path, resolve(path), members)
    assert not problems, "\n".join(problems)


def test_the_convention_check_finds_a_missing_section():
    """The control: an undocumented argument, a return without Returns and a class without an example."""

    def f(x: int) -> int:
        """Doubles."""
        return 2 * x

    class C:
        """A class.

        Args:
            a: a thing.
        """

        def __init__(self, a):
            self.a = a

        def g(self, y) -> int:
            """Args:
                y: why.
            """
            return y

    assert convention_problems("f", f, None) == ["f: no Args section", "f: no Returns section"]
    assert convention_problems("C", C, None) == ["C: no Examples section of doctests", "C.g: no Returns section"]
    assert convention_problems("C", C, False) == ["C: no Examples section of doctests"]


# ------------------------------------------------------------------------------ every example runs
MODULES = sorted({getattr(resolve(p), "__module__", None) or p.rpartition(".")[0] for p, _ in entries()}
                 | {"capreward.errors"})


@pytest.mark.parametrize("module", MODULES)
def test_every_docstring_example_of_a_documented_module_runs(module):
    mod = importlib.import_module(module)
    tests = [t for t in doctest.DocTestFinder().find(mod, module) if t.examples]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    for test in tests:
        runner.run(test, out=out.append)
    assert runner.summarize(verbose=False).failed == 0, "".join(out)
