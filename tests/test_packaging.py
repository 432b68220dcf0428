"""The package's declared dependencies match its code: core dependencies are what the scorers, rewards
and the rest of the core import, every other import is behind an extra that ``require()`` names, the
extras are consistent, torch has no upper bound in the metadata, and a missing extra is one line naming
it (simulated here by hiding the extras' modules in a subprocess; tests/test_install.py checks the same
in a real core-only install of the built wheel)."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from capreward._extras import EXTRAS, MissingExtraError, require

from conftest import REPO

SRC = REPO / "src" / "capreward"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CORE = PYPROJECT["dependencies"]
OPTIONAL = PYPROJECT["optional-dependencies"]
#: Extras that are bundles of the others (the test extra adds the test tools).
BUNDLES = {"all", "test"}
#: Extras for the project's own tools, which no module of the package imports (the docs site builder).
TOOLS = {"docs"}


def dist_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


@functools.cache
def _closure(requirements: tuple[str, ...]) -> frozenset[str]:
    return frozenset(closure(list(requirements)))


def closure(requirements: list[str]) -> set[str]:
    """Normalised names of the distributions ``requirements`` install (with the extras they name), as
    the installed metadata says; markers evaluated for this interpreter."""
    seen: set[tuple[str, frozenset]] = set()
    names: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = (dist_name(str(req)), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            reqs = metadata.requires(key[0]) or []
        except metadata.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(Requirement(str(r).split(";")[0]) if r.marker is not None else r)
    return names


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of every non-stdlib module ``path`` imports (at the top or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return {m for m in out if m not in sys.stdlib_module_names and m != "capreward"}


def required_extras(path: Path) -> set[str]:
    """The extras ``path`` names in its ``require("<extra>", ...)`` calls."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and node.args
                and isinstance(node.args[0], ast.Constant)):
            out.add(node.args[0].value)
    return out


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def providers(module: str) -> set[str]:
    return {re.sub(r"[-_.]+", "-", d).lower() for d in _distributions().get(module, [])}


MODULE_FILES = sorted(SRC.rglob("*.py"))
#: Modules that a framework loads into its own process as a plugin: they import that framework (no
#: capreward extra can install it) and, without it, fail on import with a message naming it.
FRAMEWORK_PLUGINS = {"capreward.adapters.verl_manager": "verl"}
#: Modules that drive an inference engine the user installed, imported only when a user builds one
#: (EngineJudge on vLLM's or SGLang's engine): not an extra, since each engine pins its own torch.
ENGINE_USERS = {"capreward.judges.engines": {"vllm", "sglang"}}


def test_torch_has_no_upper_bound_or_pin_in_the_metadata():
    """A library must not make pip downgrade (or refuse) a user's torch: lower bounds only. The local
    wheel is pinned by the bootstrap's constraints file instead."""
    for group, reqs in [("dependencies", CORE), *OPTIONAL.items()]:
        for r in map(Requirement, reqs):
            if dist_name(str(r)) in ("torch", "torchvision"):
                assert all(s.operator in (">=", ">") for s in r.specifier), f"{group}: {r}"
    assert "torch>=2.4" in CORE
    constraints = (REPO / "scripts" / "constraints.txt").read_text().split()
    assert "torch==2.14.1" in constraints and "torchvision==0.29.1" in constraints


def test_every_core_dependency_is_imported_by_the_package():
    """Core = what the package imports outside its extras: trl, peft, lightning, torchmetrics, openai...
    are not core (the package never imports trl or peft outside the recipe)."""
    imported: set[str] = set()
    for path in MODULE_FILES:
        for module in third_party_imports(path):
            imported |= providers(module)
    unused = sorted(d for d in map(dist_name, CORE) if d not in imported)
    assert unused == [], f"core dependencies no core module imports: {unused}"
    for extra_only in ("trl", "peft", "lightning", "torchmetrics", "openai", "accelerate", "scipy", "ray"):
        assert extra_only not in set(map(dist_name, CORE)), extra_only


@pytest.mark.parametrize("path", MODULE_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_each_module_imports_only_core_or_the_extras_it_requires(path):
    """Each third-party module a file imports comes with the core dependencies or with an extra the file
    names in a ``require()`` call (which turns its absence into the one-line error)."""
    extras = required_extras(path)
    assert extras <= set(OPTIONAL), f"{path.name} requires unknown extras {extras - set(OPTIONAL)}"
    allowed = _closure(tuple(CORE + [r for e in sorted(extras) for r in OPTIONAL[e]]))
    module = "capreward." + ".".join(path.relative_to(SRC).with_suffix("").parts)
    if module in FRAMEWORK_PLUGINS:
        allowed = allowed | {FRAMEWORK_PLUGINS[module]}
    engines = ENGINE_USERS.get(module, set())
    missing = {m: sorted(providers(m)) for m in third_party_imports(path)
               if not providers(m) & allowed and m.split(".")[0] not in engines}
    assert missing == {}, f"{path.relative_to(SRC)} imports {missing} outside core and its extras {sorted(extras)}"


def test_extras_are_consistent():
    """The extras the code names exist; `demo` installs what the recipes need; `all` is every extra; the
    test extra installs every extra too (the tests exercise them all)."""
    assert set(EXTRAS) <= set(OPTIONAL)
    assert set(OPTIONAL) - BUNDLES - TOOLS <= set(EXTRAS)
    assert not TOOLS & set(EXTRAS), "a tool's extra is named by code: it is a feature extra"
    assert sorted(OPTIONAL["demo"]) == sorted(OPTIONAL["recipes"])
    union = closure([r for e in set(OPTIONAL) - BUNDLES - TOOLS for r in OPTIONAL[e]])
    assert closure(OPTIONAL["all"]) >= union
    assert closure(OPTIONAL["test"]) >= closure(OPTIONAL["all"])
    for tool in TOOLS:  # the suite builds the docs site
        assert closure(OPTIONAL["test"]) >= closure(OPTIONAL[tool]), tool


def test_test_extra_covers_every_import_of_the_tests():
    allowed = closure(CORE + OPTIONAL["test"])
    # scripts/ (on the tests' path), the frameworks scripts/bootstrap.sh --test installs without their
    # dependencies, and vLLM, which the OpenRLHF contract test stands in for when it is not installed
    local = {p.stem for p in (REPO / "tests").glob("*.py")} | {p.stem for p in (REPO / "scripts").glob("*.py")}
    # experiments/ (on the tests' path too: the scenes world and the policy arms the tests share)
    local |= {p.stem for p in (REPO / "experiments").glob("*.py")} | {p.name for p in (REPO / "experiments").iterdir() if p.is_dir()}
    local |= {"openrlhf", "verl", "vllm"}
    missing = {}
    for path in sorted((REPO / "tests").glob("*.py")):
        for module in third_party_imports(path) - local:
            if not providers(module) & allowed:
                missing.setdefault(module, []).append(path.name)
    assert missing == {}, f"imported by the tests but not installed by the test extra: {missing}"


def test_require_returns_the_module_or_one_line_naming_the_extra():
    import json as json_module

    assert require("remote", "json") is json_module
    assert require("callbacks", "capreward_no_such_module", "json") is json_module  # alternatives in order
    with pytest.raises(MissingExtraError) as info:
        require("ray", "capreward_no_such_module", used_by="the Ray engine")
    assert isinstance(info.value, ModuleNotFoundError) and info.value.extra == "ray"
    assert str(info.value) == ("the Ray engine needs capreward_no_such_module, which is not installed: "
                               "pip install 'capreward[ray]'")
    with pytest.raises(ValueError, match="unknown extra"):
        require("no-such-extra", "json")


#: Code run in a process where every extra's modules are hidden (None in sys.modules: imports fail as if
#: not installed), one case per line: what it does and the extra its error must name.
HIDDEN = ["trl", "peft", "datasets", "lightning", "pytorch_lightning", "torchmetrics", "accelerate", "openai",
          "scipy", "matplotlib", "ray"]
CASES = {
    "import capreward.torchmetrics.metrics": "callbacks",
    "from capreward.torchmetrics import EMScoreMetric": "callbacks",
    "import capreward.callbacks.lightning": "callbacks",
    "from capreward.callbacks import CaptionEvalCallback": "callbacks",
    "import capreward.training.lightning": "callbacks",
    "import capreward.recipes.grpo_captioner": "recipes",
    "from capreward.cli.demo import load_recipe; load_recipe()": "demo",
    "from capreward.metaeval import kendall; kendall([1, 2, 3], [1, 3, 2])": "metaeval",
    "from capreward.metaeval.plot import plot_result; plot_result(None, 'x.png')": "plot",
    "from capreward.jobs.ray_engine import run_ray; run_ray([], None, 'x.jsonl')": "ray",
    "from capreward.server.ray_serve import reward_app; reward_app(lambda: None)": "serve",
    "from capreward.judges import OpenAIJudge; OpenAIJudge(base_url='http://127.0.0.1:9/v1', model='m').generate([])": "remote",
}
#: Core modules that import and work with no extra installed.
CORE_OK = [
    "import capreward, capreward.scorers.emscore, capreward.scorers.clipscore, capreward.scorers.fleur",
    "import capreward.scorers.visce2, capreward.scorers.gveval, capreward.scorers.fleur_remote",
    "import capreward.rewards, capreward.adapters, capreward.adapters.verl, capreward.judges, capreward.media",
    "import capreward.jobs.score_job, capreward.report.html, capreward.metaeval, capreward.testing",
    "import capreward.callbacks, capreward.training",
    "from capreward.cli.main import build_parser; build_parser()",
]

RUNNER = r"""
import json, sys, traceback
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
out = []
for code in json.loads(sys.argv[2]):
    try:
        exec(code, {})
        out.append({"code": code, "ok": True})
    except Exception as exc:
        out.append({"code": code, "ok": False, "type": type(exc).__name__, "message": str(exc),
                    "extra": getattr(exc, "extra", None)})
print(json.dumps(out))
"""


def run_hidden(codes: list[str]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(HIDDEN), json.dumps(codes)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_extras_core_works_and_each_extra_feature_fails_in_one_line_naming_its_extra():
    results = run_hidden(CORE_OK + list(CASES))
    for r in results[: len(CORE_OK)]:
        assert r["ok"], r
    for r in results[len(CORE_OK):]:
        extra = CASES[r["code"]]
        assert not r["ok"] and r["type"] == "MissingExtraError" and r["extra"] == extra, r
        assert "\n" not in r["message"] and r["message"].endswith(f"pip install 'capreward[{extra}]'"), r


def test_cli_demo_without_its_extra_is_one_line_and_exit_2():
    code = RUNNER.split("out = []")[0] + "from capreward.cli.main import main\nsys.exit(main(['demo', '--steps', '1']))\n"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(HIDDEN)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "capreward demo: error: capreward demo needs trl, which is not installed: pip install 'capreward[demo]'"]
    assert proc.stdout == ""
