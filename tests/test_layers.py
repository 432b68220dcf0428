"""The house's floors: which part of ``capreward`` may import which, read from the code itself.

The import graph is drawn from the source (no import runs): every ``import`` and ``from ... import``
statement of every module of ``src/capreward``, at module level and inside functions alike (an import
made lazy to keep ``import capreward`` cheap is still a dependency), and every
``importlib.import_module("capreward....")`` with a literal name. Imports under ``if TYPE_CHECKING:``
are left out (they never run). A name imported from a package whose ``__init__`` serves it lazily (its
``_LAZY`` table) is an arrow to the module the table names, as it is when it runs. Registry discovery
(the spec modules found by package scan or entry point) names no module in the source and is no arrow.

The rules, as docs/design/architecture.md draws them:

- no import circle between modules;
- the parts (each folder of the package, each top-level module) sit on the floors of :data:`FLOORS`, and
  an arrow between two parts goes to a lower floor; at most one arrow may run up, and it is listed in
  :data:`UPWARD` with its reason;
- a package's lazy table serves only its own modules (no re-export of another part's names).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "capreward"

#: The floors, lowest first; a part may import the parts of the floors below its own.
FLOORS: list[tuple[str, ...]] = [
    # ground: no capreward import (the packages' names served on first use, from their _LAZY tables)
    ("lazy_exports",),
    # the package's own __init__ (the version and lazy public names), the error model, text, status bars
    ("capreward", "errors", "text", "progress", "default_models", "bounded_cache"),
    # inputs that must be regular files; bounds on a JSON text; cross-process locks
    ("input_files", "json_limits", "locks"),
    # services and inputs: optional extras, devices, torch's random streams kept across a model load, the
    # hub, text files, media, the caption as read, the registry of metric facts
    ("_extras", "devices", "random_state", "hub", "jsonl", "media", "caption_reading", "registry"),
    # models and pure math; the registry's names and the options it declares
    ("backbones", "metrics", "names", "metric_options", "explicit_options"),
    # the judges (chat models, prompts); what reads the registry's names for a command line
    ("judges", "terms", "metric_flags"),
    # the metrics' scorers and specs
    ("scorers",),
    # the caption budget every door applies (it counts claims as the claim scorer splits them)
    ("caption_budget",),
    # rewards and training objectives over the scorers
    ("rewards", "training"),
    # consumers of scores: framework adapters, jobs and results, torchmetrics Metrics, meta-evaluation, the
    # HTML report, the tiny models and tasks of tests and the demo
    ("adapters", "jobs", "torchmetrics", "metaeval", "testing"),
    # integrations on top: the reward server, the training callbacks, the recipes
    ("server", "callbacks", "recipes", "report"),
    # the command line
    ("cli",),
]

#: The arrows allowed to run up a floor: ``(from part, to part): reason`` (at most one).
UPWARD: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------------------------ the graph, from the source
def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its ``__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def lazy_table(tree: ast.Module) -> dict[str, str]:
    """A package ``__init__``'s ``_LAZY`` table: public name -> dotted module that defines it."""
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and isinstance(node.value, ast.Dict):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def import_graph(package: Path) -> tuple[dict[str, set[str]], dict[str, dict[str, str]]]:
    """``(arrows, lazy tables)``: module -> the package's modules it imports (see the module doc), and each
    package's lazy table."""
    root = package.name
    files = module_files(package)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in files.items()}
    lazy = {name: lazy_table(tree) for name, tree in trees.items() if files[name].name == "__init__.py"}

    def owner(dotted: str) -> str | None:  # the module a dotted name lands in
        while dotted and dotted not in files:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def targets(module: str, node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names if a.name.split(".")[0] == root]
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if files[module].name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == root:
                source = node.module
            else:
                return []
            out = []
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append(sub if sub in files else lazy.get(source, {}).get(alias.name, source))
            return out
        if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.split(".")[0] == root):
            return [node.args[0].value]
        return []

    arrows: dict[str, set[str]] = {name: set() for name in files}
    for name, tree in trees.items():
        skipped = type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in targets(name, node):
                landed = owner(target)
                if landed is not None and landed != name:
                    arrows[name].add(landed)
    return arrows, lazy


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def part(module: str) -> str:
    """The part a module belongs to: its top-level folder or module (``capreward`` for the root)."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def part_arrows(arrows: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """``(from part, to part)`` -> the module arrows that make it, for parts that differ."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, targets in arrows.items():
        for target in targets:
            if part(source) != part(target):
                out[(part(source), part(target))].append(f"{source} -> {target}")
    return dict(out)


def upward(arrows: dict[str, set[str]], floors: list[tuple[str, ...]]) -> dict[tuple[str, str], list[str]]:
    """The part arrows that do not go to a lower floor."""
    floor = {p: k for k, parts in enumerate(floors) for p in parts}
    return {pair: lines for pair, lines in part_arrows(arrows).items() if floor[pair[1]] >= floor[pair[0]]}


def foreign_lazy_names(lazy: dict[str, dict[str, str]], root: str) -> dict[str, list[str]]:
    """Package -> the modules of other parts its lazy table names (the root package serves every part)."""
    out = {package: sorted({m for m in table.values() if part(m) != part(package)})
           for package, table in lazy.items() if package != root}
    return {package: modules for package, modules in out.items() if modules}


def parts_of(package: Path) -> set[str]:
    return {part(m) for m in module_files(package)}


# ------------------------------------------------------------------------------ the rules
ARROWS, LAZY = import_graph(PACKAGE)


def test_every_part_is_on_one_floor():
    placed = [p for parts in FLOORS for p in parts]
    assert len(placed) == len(set(placed)), "a part on two floors"
    assert sorted(parts_of(PACKAGE) - set(placed)) == [], "a new folder or top-level module: put it on a floor"
    assert sorted(set(placed) - parts_of(PACKAGE)) == [], "a floor names a part that no longer exists"


def test_no_import_circle():
    assert circles(ARROWS) == []


def test_arrows_go_down_the_floors():
    assert len(UPWARD) <= 1
    found = upward(ARROWS, FLOORS)
    unexpected = {pair: lines for pair, lines in found.items() if pair not in UPWARD}
    assert not unexpected, "imports running up a floor (move the code, or the part):\n" + "\n".join(
        f"{a} -> {b}: {', '.join(lines)}" for (a, b), lines in sorted(unexpected.items()))
    assert set(UPWARD) <= set(found), "an allowed upward arrow that no longer exists: drop it from UPWARD"


def documented_floors(page: Path) -> list[tuple[str, ...]]:
    """The floors of the architecture page's table (``| floor | parts | ... |``), lowest first."""
    rows = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"\| (\d+) \| ((?:`[\w.]+`(?:, )?)+) \|.*", line)
        if m:
            rows[int(m.group(1))] = tuple(re.findall(r"`([\w.]+)`", m.group(2)))
    return [rows[k] for k in sorted(rows)]


def test_the_architecture_page_draws_these_floors():
    assert documented_floors(REPO / "docs" / "design" / "architecture.md") == FLOORS


def test_a_package_serves_only_its_own_modules_lazily():
    assert foreign_lazy_names(LAZY, PACKAGE.name) == {}, "a re-export table naming another part's modules"


def test_lazy_names_are_arrows_to_their_modules():
    """``from capreward.torchmetrics import EMScoreMetric`` is an arrow to the module that defines it."""
    assert LAZY["capreward.torchmetrics"]["EMScoreMetric"] == "capreward.torchmetrics.metrics"
    assert "capreward.torchmetrics.metrics" in ARROWS["capreward.callbacks.lightning"]


# ------------------------------------------------------------------------------ the checker finds what it must
@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package with a circle (``a <-> b``), a lazy name, a function-level import and a guarded one."""
    pkg = tmp_path / "toy"
    files = {
        "__init__.py": '_LAZY = {"Thing": "toy.low.thing"}\n',
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from .a import x\n",
        "low/__init__.py": '_LAZY = {"Thing": "toy.low.thing", "Other": "toy.high.other"}\n',
        "low/thing.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import other\n",
        "low/user.py": "import importlib\n\ndef g():\n    return importlib.import_module('toy.high.other')\n",
        "high/__init__.py": "",
        "high/other.py": "from ..low import Thing\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_the_checker_finds_a_circle_an_upward_arrow_and_a_foreign_lazy_name(toy):
    arrows, lazy = import_graph(toy)
    assert circles(arrows) == [["toy.a", "toy.b"]]  # the function-level import closes it
    assert arrows["toy.high.other"] == {"toy.low.thing"}  # through the lazy table
    assert arrows["toy.low.thing"] == set()  # TYPE_CHECKING: never runs
    assert upward(arrows, [("low",), ("a", "b", "high")]) == {
        ("low", "high"): ["toy.low.user -> toy.high.other"], ("a", "b"): ["toy.a -> toy.b"], ("b", "a"): ["toy.b -> toy.a"]}
    assert upward(arrows, [("low",), ("b",), ("a", "high")])[("b", "a")] == ["toy.b -> toy.a"]
    assert foreign_lazy_names(lazy, "toy") == {"toy.low": ["toy.high.other"]}
