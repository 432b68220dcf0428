"""Each benchmark's meta-evaluation protocol: judgments + scores -> the measures the paper reports.

Measures are in percent (a Kendall tau of 0.532 is reported as 53.2). Judgment items without a score
are never dropped silently: they are counted in ``n_unmatched`` (and listed in ``unmatched``); for the
pairwise benchmarks a pair missing either score is a miss, as a tie is.

Some benchmarks offer more than one protocol (``run_protocol(..., protocol=name)``, ``capreward meta-eval
--protocol``); the first listed is the default.

- Flickr8k-Expert: ``per-rating`` (default; the CLIP-S / PAC-S evaluation): one row per expert rating,
  NaN ratings dropped (counted in ``details``); tau-c, tau-b. ``per-candidate`` (G-VEval's released
  ``correlation.py``/``dataset.py``): each image's ratings taken three at a time in file order, one row
  per triple with the mean of its three ratings; a triple with a NaN rating is dropped, and so is every
  triple of an image whose number of ratings is not a multiple of 3; tau-c, tau-b.
- Flickr8k-CF: one row per rating; tau-b.   Composite: tau-c against ``rating``, and where the judgements
  carry them tau-b against ``correctness`` and ``thoroughness`` (as VisCE² reports).
- THumB: Pearson against the total ``human_score`` and, where given, against precision ``P`` and recall
  ``R`` (as VisCE² reports).
- Pascal-50S: per category (HC, HI, HM, MM) the share of pairs whose preferred caption scores strictly
  higher, and the mean of the categories.   FOIL: the same share over all (original, foil) pairs.
- VATEX-EVAL: Kendall tau-b and Spearman against each annotator, averaged; scores rounded to 4 decimals
  first, as the released evaluation does (``round_vatex=None`` turns that off).
- MSVD-Eval: tau-b and tau-c per ACCR dimension and overall (the top-level ``tau_b``/``tau_c`` are the
  overall ones). ``per-annotator`` (default; G-VEval's released ``correlation.py``): one row per
  (candidate, annotator), the two annotators' rows stacked. ``annotator-mean``: one row per candidate
  against the annotators' mean. A metric that gives one score per dimension (``gveval/accuracy`` … with
  ``--score-field gveval``) is correlated dimension by dimension with the matching human dimension and
  its main score with ``overall``, as the release does for G-VEval's ACCR; a single score is correlated
  with every human dimension (the release reports only ``overall`` for such metrics).
- CapArena (``caption-level``, its ``caparena_metrics.py``): battles involving the ``human`` source
  skipped; the metric's verdict on a battle is the caption with the strictly higher score, a tie when
  they are equal; agreement = the share of battles where it equals the people's verdict, ties included
  (``include_tie=True``, the paper's number), overall and per cluster (``level 1`` .. ``level 4``), and
  without ties (``<cluster>_without_ties``: only battles where neither the people nor the metric call a
  tie, as ``cal_agreement(include_tie=False)``). A battle missing a score counts as a disagreement.
  Model-level agreement (``model_spearman``, ``model_kendall``): the metric's verdicts ranked by Elo
  (:mod:`~capreward.metaeval.elo`: ``cal_ranking.py``'s online Elo, 1000 bootstrap rounds, seed 42,
  median rating; battles missing a score left out) and correlated with the people's ranking: the
  release's ``ranking_human`` when it holds every model, else (files with other models) the same Elo
  ranking of the people's own verdicts on the same battles (``details["human_ranking_from"]`` says which).
- DetailCaps (``per-caption``, the CAPTURE paper's consistency table: PCC, 1-R², Kendall's tau, sample
  tau): Pearson (PCC) and Kendall tau-b over all captions; ``one_minus_r2``: 1 - R² of the metric's
  scores taken as predictions of the human scores, sum((h - m)²) / sum((h - mean h)²), no fit (lower is
  better; a ratio, not in percent: the paper's table has 8.29 for CAPTURE and 2.6e7 for CIDEr, which
  only an unfitted R² gives; the scores must be on the human scale); and the sample tau: Kendall tau-b
  among the captions of each image, averaged over images with at least two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from collections.abc import Callable
from typing import cast

from .elo import BOOTSTRAP_ROUNDS, CAPARENA_HUMAN_RANKING, elo_ranking, ranking_correlations
from .judgments import Judgments, RatedItem
from .readers import ACCR_DIMENSIONS, PASCAL_CATEGORIES
from .scores import ScoreIndex
from .stats import kendall, pairwise_outcomes, pearson, percent, spearman

# benchmark -> (human column, measures) for the rated benchmarks with one human score per row
RATED = {
    "flickr8k-expert": ("rating", ("tau_c", "tau_b")),
    "flickr8k-cf": ("rating", ("tau_b",)),
    "composite": ("rating", ("tau_c",)),
    "thumb": ("human_score", ("pearson",)),
}
# benchmark -> {measure: (human column, statistic)} reported where the judgements have that column
RATED_EXTRA = {
    "composite": {"tau_b_correctness": ("correctness", "tau_b"), "tau_b_thoroughness": ("thoroughness", "tau_b")},
    "thumb": {"pearson_p": ("P", "pearson"), "pearson_r": ("R", "pearson")},
}
STATISTICS = {
    "tau_c": lambda metric, human: kendall(metric, human, "c"),
    "tau_b": lambda metric, human: kendall(metric, human, "b"),
    "pearson": pearson,
}
MSVD_PARTS = ACCR_DIMENSIONS[:4]  # the dimensions a metric can score separately (G-VEval's ACCR)


@dataclass
class MetaEvalResult:
    """The outcome of one protocol (:func:`~capreward.metaeval.meta_evaluate` returns it).

    Args:
        benchmark: the benchmark's name.
        measures: measure name -> value in percent (NaN when undefined, e.g. constant scores).
        n_matched: judgment rows (pairs for pairwise benchmarks) with scores.
        n_unmatched: judgment rows without scores.
        unmatched: one dict per unmatched judgment caption: ``where``, ``image``, ``caption``, ``reason``.
        details: protocol-specific counts (ties, per-annotator values, dropped NaN ratings, ...).
        human: the matched human ratings (rated benchmarks), for plots.
        metric: the matched metric scores (rated benchmarks).
        preferred: the preferred caption's score per pair (pairwise benchmarks).
        other: the other caption's score per pair.
        category: each pair's category.
        n_unused_scores: score rows that matched no judgment.

    Examples:
        >>> from capreward.metaeval import MetaEvalResult
        >>> r = MetaEvalResult("flickr8k-expert", {"kendall_c": 51.2}, n_matched=5664, n_unmatched=0)
        >>> r.to_json()["kendall_c"], r.to_json()["n_matched"]
        (51.2, 5664)
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
        """The result as JSON.

        Returns:
            A flat JSON-able dict: the measures, ``n_matched``, ``n_unmatched``, ``n_unused_scores``,
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


def _statistic(name: str, metric: list[float], human: list[float]) -> float:
    """``name`` (tau_c, tau_b, pearson) in percent over the rows whose human value is a number."""
    rows = [(m, h) for m, h in zip(metric, human) if not math.isnan(h)]
    return percent(_safe(STATISTICS[name], [m for m, _ in rows], [h for _, h in rows]))


def rated_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """Flickr8k-Expert (per rating), Flickr8k-CF, Composite and THumB (see :data:`RATED`, :data:`RATED_EXTRA`)."""
    column, measures = RATED[judgments.benchmark]
    matched, unmatched = _match_rated(judgments, index)
    rows = [(item.human[column], s) for item, s in matched if not math.isnan(item.human[column])]
    human, metric = [h for h, _ in rows], [s for _, s in rows]
    values = {m: _statistic(m, metric, human) for m in measures}
    details = {"nan_ratings_dropped": len(matched) - len(rows), "column": column}
    for measure, (extra, stat) in RATED_EXTRA.get(judgments.benchmark, {}).items():
        if any(extra in item.human for item, _ in matched):
            column_values = [item.human.get(extra, math.nan) for item, _ in matched]
            values[measure] = _statistic(stat, [s for _, s in matched], column_values)
            details[f"rows_{extra}"] = sum(not math.isnan(h) for h in column_values)
    return MetaEvalResult(judgments.benchmark, values, len(rows), len(unmatched), unmatched, details, human, metric,
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def flickr8k_per_candidate_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """Flickr8k-Expert as G-VEval's release evaluates it: one row per candidate, its three ratings averaged.

    Each image's ratings are taken three at a time in file order (the release's ``dataset.py`` reads
    ``human_judgement[j:j+3]`` and the caption of the first); a triple with a NaN rating is dropped, and so
    are all triples of an image whose number of ratings is not a multiple of 3 (both counted in ``details``).
    """
    groups: dict[str, list[RatedItem]] = {}
    for item in judgments.rated:
        groups.setdefault(item.group or item.visual[0], []).append(item)
    human, metric, unmatched, used = [], [], [], set()
    nan_triples = skipped_images = 0
    for items in groups.values():
        if len(items) % 3:
            skipped_images += 1
            continue
        for j in range(0, len(items), 3):
            triple = items[j:j + 3]
            ratings = [it.human["rating"] for it in triple]
            if any(math.isnan(r) for r in ratings):
                nan_triples += 1
                continue
            first = triple[0]
            used.add(first.key)
            score = index.get(first.key)
            if score is None:
                unmatched.append(_unmatched_entry(first, first.caption, index, first.key))
                continue
            human.append(sum(ratings) / 3)
            metric.append(score)
    values = {m: _statistic(m, metric, human) for m in ("tau_c", "tau_b")}
    details = {"protocol": "per-candidate", "nan_triples_dropped": nan_triples,
               "images_skipped_not_multiple_of_3": skipped_images}
    return MetaEvalResult(judgments.benchmark, values, len(human), len(unmatched), unmatched, details, human, metric,
                          n_unused_scores=_unused(index, used))


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


def _msvd(judgments: Judgments, index: ScoreIndex, stacked: bool) -> MetaEvalResult:
    matched, unmatched = _match_rated(judgments, index)
    # (item, annotator's scores) rows: one per annotator stacked, or one per item with the annotators' mean
    rows = [(item, a) for item, _ in matched for a in (item.annotators or (item.human,))] if stacked \
        else [(item, item.human) for item, _ in matched]
    dims, metric_column = {}, {}
    for d in ACCR_DIMENSIONS:
        own = d in MSVD_PARTS and bool(rows) and all(d in index.parts.get(item.key, {}) for item, _ in rows)
        metric = cast(list[float], [index.parts[item.key][d] if own else index.get(item.key) for item, _ in rows])  # matched: scored
        human = [a[d] for _, a in rows]
        dims[d] = {m: _statistic(m, metric, human) for m in ("tau_b", "tau_c")}
        metric_column[d] = f"score.{d}" if own else "score"
    overall_metric = cast(list[float], [index.get(item.key) for item, _ in rows])  # matched: scored
    details = {"protocol": "per-annotator" if stacked else "annotator-mean", "dimensions": dims,
               "metric_column": metric_column, "rows": len(rows)}
    return MetaEvalResult(judgments.benchmark, dict(dims["overall"]), len(matched), len(unmatched), unmatched, details,
                          [a["overall"] for _, a in rows], overall_metric,
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def msvd_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """MSVD-Eval as G-VEval's release evaluates it: each annotator's scores a row of their own (stacked);
    tau-b and tau-c per ACCR dimension and overall (top level = overall)."""
    return _msvd(judgments, index, stacked=True)


def msvd_mean_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """MSVD-Eval against the annotators' mean: one row per candidate; tau-b and tau-c per dimension and overall."""
    return _msvd(judgments, index, stacked=False)


def pairwise_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """Pascal-50S (per category and mean) and FOIL (one accuracy): strict wins over all pairs."""
    preferred, other, category, unmatched = [], [], [], []
    used: set[tuple] = set()
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


def _caparena_model_level(metric_battles: list, human_battles: list, rounds: int) -> tuple[dict, dict]:
    """Spearman and Kendall (percent) between the Elo ranking of the metric's verdicts and the people's."""
    if not metric_battles:
        return {"model_spearman": math.nan, "model_kendall": math.nan}, {"metric_ranking": []}
    metric_ranking = elo_ranking(metric_battles, rounds)
    if all(m in CAPARENA_HUMAN_RANKING for m in metric_ranking):
        human_ranking, source = list(CAPARENA_HUMAN_RANKING), "caparena_metrics.py ranking_human"
    else:
        human_ranking, source = elo_ranking(human_battles, rounds), "Elo of the people's verdicts in this file"
    rho = ranking_correlations(metric_ranking, human_ranking)
    values = {"model_spearman": percent(rho["spearman"]), "model_kendall": percent(rho["kendall"])}
    return values, {"metric_ranking": metric_ranking, "human_ranking": [m for m in human_ranking if m != "human"],
                    "human_ranking_from": source, "elo_rounds": rounds}


def caparena_protocol(judgments: Judgments, index: ScoreIndex, elo_rounds: int = BOOTSTRAP_ROUNDS) -> MetaEvalResult:
    """CapArena's caption-level agreement (ties included, and without ties) and model-level Elo ranking
    agreement (see the module docstring). ``elo_rounds``: bootstrap rounds of the Elo ranking."""
    agree: dict[str, list[int]] = {}
    agree_no_tie: dict[str, list[int]] = {}
    metric_battles: list[tuple[str, str, float]] = []
    human_battles: list[tuple[str, str, float]] = []
    unmatched, skipped, n_unmatched = [], 0, 0
    used: set[tuple] = set()
    preferred, other, category = [], [], []
    for pair in judgments.pairs:
        if pair.sources is not None and "human" in pair.sources:
            skipped += 1
            continue
        keys = (pair.key(0), pair.key(1))
        s = (index.get(keys[0]), index.get(keys[1]))
        used.update(keys)
        if s[0] is None or s[1] is None:
            n_unmatched += 1
            for i in (0, 1):
                if s[i] is None:
                    unmatched.append(_unmatched_entry(pair, pair.captions[i], index, keys[i]))
            verdict = None
        else:
            verdict = 0 if s[0] > s[1] else 1 if s[1] > s[0] else -1
        hit = int(verdict is not None and verdict == pair.preferred)
        agree.setdefault("overall", []).append(hit)
        agree.setdefault(pair.category, []).append(hit)
        if pair.preferred >= 0 and verdict != -1:  # neither side a tie (a missing score: a miss)
            agree_no_tie.setdefault("overall", []).append(hit)
            agree_no_tie.setdefault(pair.category, []).append(hit)
        if pair.sources is not None:
            outcome = {0: 1.0, 1: 0.0, -1: 0.5}
            human_battles.append((*pair.sources, outcome[pair.preferred]))
            if verdict is not None:
                metric_battles.append((*pair.sources, outcome[verdict]))
        keep = pair.preferred if pair.preferred >= 0 else 0
        preferred.append(s[keep])
        other.append(s[1 - keep])
        category.append(pair.category)
    values = {k: percent(sum(v) / len(v)) for k, v in agree.items()}
    values.update({f"{k}_without_ties": percent(sum(v) / len(v)) for k, v in agree_no_tie.items()})
    model_level, ranking_details = _caparena_model_level(metric_battles, human_battles, elo_rounds)
    values.update(model_level)
    details = {"battles": {k: len(v) for k, v in agree.items()},
               "battles_without_ties": {k: len(v) for k, v in agree_no_tie.items()}, "human_battles_skipped": skipped,
               "human_ties": sum(p.preferred < 0 for p in judgments.pairs), "unscored_battles": n_unmatched,
               **ranking_details}
    return MetaEvalResult(judgments.benchmark, values, len(agree.get("overall", [])) - n_unmatched, n_unmatched,
                          unmatched, details, preferred=preferred, other=other, category=category,
                          n_unused_scores=_unused(index, used))


def one_minus_r2(metric: list[float], human: list[float]) -> float:
    """1 - R² of ``metric`` as predictions of ``human`` (no fit): sum((h - m)²) / sum((h - mean h)²);
    NaN when the human scores are constant or there are none."""
    h, m = np.asarray(human, dtype=np.float64), np.asarray(metric, dtype=np.float64)
    total = float(((h - h.mean()) ** 2).sum()) if len(h) else 0.0
    return float(((h - m) ** 2).sum()) / total if total > 0 else math.nan


def detailcaps_protocol(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    """DetailCaps consistency: PCC, 1-R², Kendall tau-b and the per-image sample tau (see the module docstring)."""
    matched, unmatched = _match_rated(judgments, index)
    rows = [(item, item.human["human_score"], s) for item, s in matched if not math.isnan(item.human["human_score"])]
    human, metric = [h for _, h, _ in rows], [s for _, _, s in rows]
    by_image: dict[str, list[tuple[float, float]]] = {}
    for item, h, s in rows:
        by_image.setdefault(item.visual[0], []).append((s, h))
    taus = [_safe(kendall, [s for s, _ in v], [h for _, h in v], "b") for v in by_image.values() if len(v) >= 2]
    taus = [t for t in taus if not math.isnan(t)]
    values = {"pearson": percent(_safe(pearson, metric, human)), "tau_b": percent(_safe(kendall, metric, human, "b")),
              "sample_tau": percent(float(np.mean(taus))) if taus else math.nan,
              "one_minus_r2": one_minus_r2(metric, human)}
    details = {"images_in_sample_tau": len(taus), "nan_ratings_dropped": len(matched) - len(rows)}
    return MetaEvalResult(judgments.benchmark, values, len(rows), len(unmatched), unmatched, details, human, metric,
                          n_unused_scores=_unused(index, {i.key for i, _ in matched}))


def _vatex(judgments: Judgments, index: ScoreIndex) -> MetaEvalResult:
    return vatex_protocol(judgments, index)


# benchmark -> {protocol name: function}; the first is the benchmark's default
PROTOCOLS: dict[str, dict[str, Callable[[Judgments, ScoreIndex], MetaEvalResult]]] = {
    "flickr8k-expert": {"per-rating": rated_protocol, "per-candidate": flickr8k_per_candidate_protocol},
    "flickr8k-cf": {"per-rating": rated_protocol},
    "composite": {"per-rating": rated_protocol},
    "thumb": {"per-caption": rated_protocol},
    "vatex-eval": {"per-annotator-average": _vatex},
    "msvd-eval": {"per-annotator": msvd_protocol, "annotator-mean": msvd_mean_protocol},
    "pascal50s": {"pairwise": pairwise_protocol},
    "foil": {"pairwise": pairwise_protocol},
    "caparena": {"caption-level": caparena_protocol},
    "detailcaps": {"per-caption": detailcaps_protocol},
}


def protocol_names(benchmark: str) -> tuple[str, ...]:
    """The protocols a benchmark offers.

    Args:
        benchmark: one of :data:`~capreward.metaeval.readers.BENCHMARKS`.

    Returns:
        The protocol names, its default first.
    """
    if benchmark not in PROTOCOLS:
        raise ValueError(f"no protocol for benchmark {benchmark!r}")
    return tuple(PROTOCOLS[benchmark])


def run_protocol(judgments: Judgments, index: ScoreIndex, protocol: str | None = None) -> MetaEvalResult:
    """The protocol ``protocol`` (default: the benchmark's first, see :data:`PROTOCOLS`) of
    ``judgments.benchmark`` applied to the matched scores; ``details["protocol"]`` names it."""
    names = protocol_names(judgments.benchmark)
    name = protocol or names[0]
    if name not in names:
        raise ValueError(f"{judgments.benchmark} has no protocol {name!r}; choose from {list(names)}")
    result = PROTOCOLS[judgments.benchmark][name](judgments, index)
    result.details["protocol"] = name
    return result
