"""One docs page per metric, generated from its spec in the registry (``capreward.registry.specs()``).

Used as a mkdocs hook (mkdocs.yml ``hooks:``): when the site is built, each registered metric gets the
page ``metrics/<name>.md`` (definition, range, what it takes, the sub-scores and results-file fields it
writes for each configuration, its options, and its deviations from the released code with the option
that restores each), listed under "Metrics" in the nav; the marker ``<!-- metrics-table -->`` of
``metrics/index.md`` becomes a table of every metric. Nothing is written into docs/: the pages cannot
drift from the registry. ``python scripts/docs_metric_pages.py NAME`` prints one page's markdown.
"""

from __future__ import annotations

import ast
import doctest
import inspect
import io
import itertools
import re
import sys
import tokenize
from typing import Any

#: The marker of docs/metrics/index.md that the table of metrics replaces.
TABLE_MARKER = "<!-- metrics-table -->"
#: The nav section the metric pages are listed under (mkdocs.yml).
NAV_SECTION = "Metrics"
#: The first line of a script that runs as pasted (tests/test_docs_scripts.py runs every one).
SCRIPT_MARK = "# docs-script"
#: The API reference page of each documented scorer module (links from a metric page to its scorer).
API_PAGES = {"capreward.scorers.": "../api/scorers.md"}


def page_path(name: str) -> str:
    return f"metrics/{name}.md"


def cell(text: Any) -> str:
    """``text`` for a markdown table cell (a ``|`` would end the cell)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def value_range(spec) -> str:
    lo, hi = spec.value_range
    return f"[{_fmt(lo)}, {_fmt(hi)}]"


def _choices(option) -> list[Any]:
    """The values worth trying for ``option``: both booleans, or the quoted values its doc names."""
    if isinstance(option.default, bool):
        return [not option.default]
    if isinstance(option.default, str):
        quoted = re.findall(r"'([^']+)'", option.doc)
        return [q for q in dict.fromkeys(quoted) if q != option.default]
    return []


def _written(spec, config: dict[str, Any]) -> dict[tuple[str, bool], tuple[str, ...]]:
    """(visual kind, with references) -> sub-scores, for every combination ``config`` allows."""
    refs = {"none": [False], "optional": [False, True], "required": [True]}[spec.references_for(config)]
    return {(kind, r): spec.sub_scores_for({**config, "visual": kind, "references": r})
            for kind, r in itertools.product(spec.visual_kinds(config), refs)}


def configurations(spec) -> list[tuple[str, dict[str, Any]]]:
    """(label, configuration) of every configuration to show: each visual kind, with and without
    references as the metric allows, at the options' defaults; then, for each option value (a boolean
    flipped, or another quoted value of its doc) that changes what is written, its combinations."""
    out = []

    def add(label: str, config: dict[str, Any]) -> None:
        for (kind, with_refs) in _written(spec, config):
            where = kind + (", with references" if with_refs else "")
            out.append((where + label, {**config, "visual": kind, "references": with_refs}))

    add("", {})
    default = _written(spec, {})
    for option in spec.options:
        for value in _choices(option):
            if _written(spec, {option.name: value}) != default:
                add(f", `{option.name}={value!r}`", {option.name: value})
    return out


def _comment(source: str) -> str:
    """The comments of ``source`` (one line of code), joined."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "  ".join(t.string for t in tokens if t.type == tokenize.COMMENT)


def example_script(spec) -> str:
    """The ``Examples:`` doctest of ``spec``'s scorer class as a script that runs as pasted: each ``>>>``
    statement as it is, an expression whose output the doctest shows printed, that output in a comment.
    The doctest itself runs in tests/test_docs_examples.py, the script in tests/test_docs_scripts.py.

    Raises:
        ValueError: the scorer's docstring has no doctest.
    """
    from capreward import registry

    scorer = registry.import_path(spec.scorer)
    doc = inspect.getdoc(scorer) or ""
    section = re.search(r"^Examples?:\n((?:[ \t]+.*\n|\n)*)", doc + "\n", flags=re.M)
    examples = doctest.DocTestParser().get_examples(inspect.cleandoc(section.group(1))) if section else []
    if not examples:
        raise ValueError(f"{spec.scorer} has no 'Examples:' doctest for the page of {spec.name}")
    lines = [f"{SCRIPT_MARK}: {spec.title} on the tiny offline models of capreward.testing"]
    for example in examples:
        source, want = example.source.rstrip("\n"), example.want.strip()
        tree = ast.parse(source)
        if want and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
            why = _comment(source).lstrip("# ")
            source = f"print({ast.unparse(tree.body[0].value)})  # {' '.join(want.split())}" + (f"  ({why})" if why else "")
        lines.append(source)
    return "\n".join(lines) + "\n"


def metric_page(spec) -> str:
    """The markdown of ``spec``'s page."""
    lines = [f"# {spec.title}", "", spec.summary, ""]
    module, _, attr = spec.scorer.partition(":")
    api = next((page for prefix, page in API_PAGES.items() if module.startswith(prefix)), None)
    scorer = f"`{module}.{attr}`" + (f" ([API]({api}))" if api else "")
    aliases = ", ".join(f"`{a}`" for a in spec.aliases)
    rows = [
        ("name", f"`{spec.name}`" + (f" (also {aliases}; any case, `-` for `_`)" if aliases else "")),
        ("paper", spec.paper),
        ("released code", spec.released_code or "none"),
        ("range", f"{value_range(spec)}, {'higher' if spec.higher_is_better else 'lower'} is better"),
        ("visuals", ", ".join(spec.visuals)),
        ("references", spec.references),
        ("runs on", {"clip": "a CLIP", "chat_judge": "a chat judge (local or an OpenAI-compatible server)"}
         .get(spec.backbone, spec.backbone or "its own model")),
        ("shares", {"clip": "one CLIP with the other CLIP metrics of a job",
                    "chat_judge": "one chat judge with the other judge metrics of a job"}.get(spec.shares, "nothing")),
        ("idf", "weighs tokens by idf (a job fixes one idf per results file)" if spec.uses_idf else "no"),
        ("scorer", scorer),
    ]
    lines += ["| | |", "| --- | --- |", *(f"| {k} | {cell(v)} |" for k, v in rows), ""]
    try:
        example = example_script(spec)
    except (ImportError, ValueError):  # a metric whose scorer cannot be imported here, or has no doctest
        example = None  # (every built-in metric has one: tests/test_docs_scripts.py checks its page)
    if example is not None:
        lines += ["## Example", "",
                  "Runs as pasted, offline: the tiny models of `capreward.testing` ([Test builders](../api/testing.md)) "
                  "stand in for real weights (a CLIP name such as `\"ViT-B-32/openai\"`, a judge folder or server).", "",
                  "```python", example.rstrip("\n"), "```", ""]
    lines += ["## Sub-scores", "",
              f"What the scorer writes, per configuration. The headline score is `{spec.name}`; wherever a "
              f"sub-score `s` is logged its name is `{spec.name}/s` (`rewards/{spec.name}/s` in TRL, "
              f"`val/{spec.name}/s` in Lightning, `eval_{spec.name}/s` in the Trainer), and results files hold "
              f"it under the field shown.", "",
              "| configuration | sub-score | results-file field |", "| --- | --- | --- |"]
    for label, config in configurations(spec):
        subs = spec.sub_scores_for(config)
        if not subs:
            lines.append(f"| {label} | (none) | `{spec.name}` |")
        for i, sub in enumerate(subs):
            lines.append(f"| {label if i == 0 else ''} | `{sub}` | `{spec.field_of(sub)}` |")
    lines.append("")
    if spec.options:
        lines += ["## Options", "", "| option | default | what it does |", "| --- | --- | --- |"]
        lines += [f"| `{o.name}` | `{cell(repr(o.default))}` | {cell(o.doc)} |" for o in spec.options]
        lines.append("")
    # every metric has a reward and a torchmetrics Metric: the generic one fixed to it (under a name or not)
    from capreward.rewards import MetricReward
    from capreward.torchmetrics import RegisteredMetric, judges, metrics  # noqa: F401  (the named classes)

    reward_named, metric_named = MetricReward.named.get(spec.name), RegisteredMetric.named.get(spec.name)
    reward_alias = f" (the same as `{reward_named.__name__}(...)`)" if reward_named else ""
    metric_alias = f" (the same as `{metric_named.__name__}(...)`)" if metric_named else ""
    lines += ["## As a reward and a Metric", "",
              f"- reward (TRL's reward-function contract): `MetricReward({spec.name!r}, ...)`{reward_alias}, or "
              f"`reward_for({spec.name!r}, ...)`, from `capreward.rewards`",
              f"- torchmetrics Metric: `RegisteredMetric({spec.name!r}, ...)`{metric_alias}, or "
              f"`metric_for({spec.name!r}, ...)`, from `capreward.torchmetrics`", "",
              "They take the scorer's options above (and the scorer's other constructor arguments) as keywords: "
              "`inspect.signature` lists them, and a misspelt one is refused when the object is built.", ""]
    flags = getattr(spec, "job_flags", ())
    if flags:
        lines += ["## Command-line options", "",
                  "Its own options of `capreward score` (recorded per results file)"
                  + (", also taken by `capreward serve`, the GRPO recipe and the adapters' `RewardOptions` "
                     "(`CAPREWARD_<NAME>` in the environment) where marked" if any(f.adapters for f in flags) else "")
                  + ".", "", "| flag | sets | default | adapters | what it does |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| `{f.flags[0]}` | {f'`{f.option}`' if f.option else '(the job)'} | "
                  f"`{cell(repr(spec.job_value(f, None)))}` | {'yes' if f.adapters else 'no'} | {cell(f.help)} |"
                  for f in flags]
        lines.append("")
    lines += ["## Deviations from the released code", ""]
    if spec.deviations:
        lines += ["| capreward's default | restores the released behaviour |", "| --- | --- |"]
        lines += [f"| {cell(d.what)} | {f'`{cell(d.restore)}`' if d.restore else 'nothing (deliberate)'} |"
                  for d in spec.deviations]
    else:
        lines.append("None.")
    lines += ["", "The measured reasons: [Parity with the released metrics](../design/parity.md).", ""]
    return "\n".join(lines)


def metrics_table(specs) -> str:
    rows = ["| metric | name | range | visuals | references |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| [{s.title}]({s.name}.md) | `{s.name}` | {value_range(s)} | {', '.join(s.visuals)} | {s.references} |"
             for s in specs]
    return "\n".join(rows)


def _specs():
    from capreward import registry

    return registry.specs()


# ------------------------------------------------------------------ mkdocs hook
def on_config(config, **kwargs):
    """List every metric page under the nav's "Metrics" section."""
    for entry in config.nav or []:
        if isinstance(entry, dict) and NAV_SECTION in entry:
            section = entry[NAV_SECTION]
            listed = {next(iter(e.values())) if isinstance(e, dict) else e for e in section}
            section += [{s.title: page_path(s.name)} for s in _specs() if page_path(s.name) not in listed]
            return config
    raise ValueError(f"mkdocs.yml's nav has no {NAV_SECTION!r} section for the metric pages")


def on_files(files, config, **kwargs):
    """Add the generated metric pages."""
    from mkdocs.structure.files import File

    for spec in _specs():
        if files.get_file_from_path(page_path(spec.name)) is not None:
            raise ValueError(f"docs/{page_path(spec.name)} exists: the metric pages are generated from the registry")
        files.append(File.generated(config, page_path(spec.name), content=metric_page(spec)))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri == "metrics/index.md":
        if TABLE_MARKER not in markdown:
            raise ValueError(f"docs/metrics/index.md lost its {TABLE_MARKER} marker")
        return markdown.replace(TABLE_MARKER, metrics_table(_specs()))
    return markdown


if __name__ == "__main__":
    from capreward import registry

    for name in sys.argv[1:] or registry.names():
        print(metric_page(registry.get(name)))
