"""Each benchmark's meta-evaluation protocol: judgments + scores -> the measures the paper reports.

Measures are in percent (a Kendall tau of 0.532 is reported as 53.2). Judgment items without a score
are never dropped silently: they are counted in ``n_unmatched`` (and listed in ``unmatched``); for the
pairwise benchmarks a pair missing either score is a miss, as a tie is.

- Flickr8k-Expert: one row per expert rating, NaN ratings dropped (counted in ``details``); tau-c, tau-b.
- Flickr8k-CF: the same rows; tau-b.   Composite: tau-c.   THumB: Pearson against ``human_score``.
- Pascal-50S: per category (HC, HI, HM, MM) the share of pairs whose preferred caption scores strictly
  higher, and the mean of the categories.   FOIL: the same share over all (original, foil) pairs.
- VATEX-EVAL: Kendall tau-b and Spearman against each annotator, averaged; scores rounded to 4 decimals
  first, as the released evaluation does (``round_vatex=None`` turns that off).
- MSVD-Eval: tau-b and tau-c against the annotators' mean, per ACCR dimension and overall (the top-level
  ``tau_b``/``tau_c`` are the overall ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .judgments import Judgments, RatedItem
from .readers import ACCR_DIMENSIONS, PASCAL_CATEGORIES
from .scores import ScoreIndex
from .stats import kendall, pairwise_outcomes, pearson, percent, spearman

# benchmark -> (human column, {measure: statistic}) for the single-column rated benchmarks
RATED = {
    "flickr8k-expert": ("rating", ("tau_c", "tau_b")),
    "flickr8k-cf": ("rating", ("tau_b",)),
    "composite": ("rating", ("tau_c",)),
    "thumb": ("human_score", ("pearson",)),
}


@dataclass
class MetaEvalResult:
    """The outcome of one protocol.

    - ``measures``: measure name -> value in percent (NaN when undefined, e.g. constant scores).
    - ``n_matched`` / ``n_unmatched``: judgment rows (pairs for pairwise benchmarks) with / without scores.
    - ``unmatched``: one dict per unmatched judgment caption: ``where``, ``image``, ``caption``, ``reason``.
    - ``details``: protocol-specific counts (ties, per-annotator values, dropped NaN ratings, ...).
    - ``human`` / ``metric`` (rated) or ``preferred`` / ``other`` / ``category`` (pairwise): the matched
      values, for plots.
    """

    benchmark: str
    measures: dict[str, float]
    n_matched: int
    n_unmatched: int
    unmatched: list[dict] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    human: list[float] = field(default_factory=list)
    metric: list[float] = field(default_factory=list)
    preferred: list[float | None] = field(default_factory=list)
    other: list[float | None] = field(default_factory=list)
    category: list[str] = field(default_factory=list)
    n_unused_scores: int = 0

    def to_json(self) -> dict:
        """A flat JSON-able dict: the measures, ``n_matched``, ``n_unmatched``, ``n_unused_scores``,
        ``benchmark`` and ``details``; NaN measures become null."""
        out: dict = {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 4)) for k, v in self.measures.items()}
        out.update(benchmark=self.benchmark, n_matched=self.n_matched, n_unmatched=self.n_unmatched,
                   n_unused_scores=self.n_unused_scores, details=_jsonable(self.details))
        return out


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    return x


def _unmatched_entry(item, caption: str, index: ScoreIndex, key) -> dict:
    return {"where": item.where, "image": item.visual[0], "caption": caption, "reason": index.why_missing(key)}


def _safe(fn, *args, **kwargs) -> float:
    """A statistic, or NaN when there are too few points to compute it."""
    try:
        return fn(*args, **kwargs)
    except ValueError:
        return math.nan


def _match_rated(judgments: Judgments, index: ScoreIndex) -> tuple[list[tuple[RatedItem, float]], list[dict]]:
    matched, unmatched = [], []
    for item in judgments.rated:
        score = index.get(item.key)
        if score is None:
            unmatched.append(_unmatched_entry(item, item.caption, index, item.key))
        else:
            matched.append((item, score))
    return matched, unmatched


def _unused(index: ScoreIndex, used: set) -> int:
    return len(index.unused) + len(set(index.scores) - used)


def rated_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """Flickr8k-Expert, Flickr8k-CF, Composite and THumB (see :data:`RATED`)."""
    column, measures = RATED[judgments.benchmark]
    matched, unmatched = _match_rated(judgments, index)
    rows = [(item.human[column], s) for item, s in matched if not math.isnan(item.human[column])]
    human, metric = [h for h, _ in rows], [s for _, s in rows]
    fns = {"tau_c": lambda: kendall(metric, human, "c"), "tau_b": lambda: kendall(metric, human, "b"),
           "pearson": lambda: pearson(metric, human)}
    values = {m: percent(_safe(fns[m])) for m in measures}
    details = {"nan_ratings_dropped": len(matched) - len(rows), "column": column}
    return MetaEvalResult(judgments.benchmark, values, len(rows), len(unmatched), unmatched, details, human, metric,
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def vatex_protocol(judgments: Judgments, index: ScoreIndex, round_vatex: int | None = 4) -> MetaEvalResult:
    """VATEX-EVAL: Kendall tau-b and Spearman per annotator, averaged."""
    matched, unmatched = _match_rated(judgments, index)
    annotators = sorted({k for item, _ in matched for k in item.human}, key=lambda k: int(k.rsplit("_", 1)[1]))
    metric_all = np.array([s for _, s in matched], dtype=float)
    if round_vatex is not None:
        metric_all = np.around(metric_all, decimals=round_vatex)
    per = {}
    for a in annotators:
        h = np.array([item.human.get(a, math.nan) for item, _ in matched], dtype=float)
        ok = ~np.isnan(h)
        per[a] = {"tau_b": percent(_safe(kendall, metric_all[ok], h[ok], "b")),
                  "spearman": percent(_safe(spearman, metric_all[ok], h[ok]))}
    values = {m: float(np.mean([per[a][m] for a in annotators])) if annotators else math.nan for m in ("tau_b", "spearman")}
    human = [float(np.nanmean(list(item.human.values()))) for item, _ in matched]
    return MetaEvalResult(judgments.benchmark, values, len(matched), len(unmatched), unmatched,
                          {"per_annotator": per}, human, metric_all.tolist(),
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def msvd_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """MSVD-Eval: tau-b and tau-c per ACCR dimension and overall (top level = overall)."""
    matched, unmatched = _match_rated(judgments, index)
    metric = [s for _, s in matched]
    dims = {}
    for d in ACCR_DIMENSIONS:
        h = [item.human[d] for item, _ in matched]
        dims[d] = {"tau_b": percent(_safe(kendall, metric, h, "b")), "tau_c": percent(_safe(kendall, metric, h, "c"))}
    values = dict(dims["overall"])
    return MetaEvalResult(judgments.benchmark, values, len(matched), len(unmatched), unmatched,
                          {"dimensions": dims}, [item.human["overall"] for item, _ in matched], metric,
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def pairwise_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """Pascal-50S (per category and mean) and FOIL (one accuracy): strict wins over all pairs."""
    preferred, other, category, unmatched, used = [], [], [], [], set()
    n_unmatched = 0
    for pair in judgments.pairs:
        keys = (pair.key(pair.preferred), pair.key(1 - pair.preferred))
        p, o = index.get(keys[0]), index.get(keys[1])
        used.update(keys)
        if p is None or o is None:
            n_unmatched += 1
            for i, s in ((pair.preferred, p), (1 - pair.preferred, o)):
                if s is None:
                    unmatched.append(_unmatched_entry(pair, pair.captions[i], index, pair.key(i)))
        preferred.append(p)
        other.append(o)
        category.append(pair.category)
    counts = {}
    for c in dict.fromkeys(category):
        sel = [i for i, ci in enumerate(category) if ci == c]
        counts[c] = {**pairwise_outcomes([preferred[i] for i in sel], [other[i] for i in sel]), "pairs": len(sel)}
    accuracy = {c: percent(v["hits"] / v["pairs"]) for c, v in counts.items()}
    if judgments.benchmark == "pascal50s":
        values = {c: accuracy[c] for c in PASCAL_CATEGORIES if c in accuracy}
        values["mean"] = float(np.mean(list(values.values())))
    else:
        total = sum(v["pairs"] for v in counts.values())
        values = {"accuracy": percent(sum(v["hits"] for v in counts.values()) / total)}
    details = {"counts": counts, "ties": sum(v["ties"] for v in counts.values()),
               "unscored_pairs": n_unmatched}
    return MetaEvalResult(judgments.benchmark, values, len(preferred) - n_unmatched, n_unmatched, unmatched, details,
                          preferred=preferred, other=other, category=category,
                          n_unused_scores=_unused(index, used))


def run_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """The protocol of ``judgments.benchmark`` applied to the matched scores."""
    b = judgments.benchmark
    if b in RATED:
        return rated_protocol(judgments, index)
    if b == "vatex-eval":
        return vatex_protocol(judgments, index)
    if b == "msvd-eval":
        return msvd_protocol(judgments, index)
    if b in ("pascal50s", "foil"):
        return pairwise_protocol(judgments, index)
    raise ValueError(f"no protocol for benchmark {b!r}")
