"""CapArena's published agreement (caption-level with and without ties, model-level Elo ranking
correlations) and DetailCaps' 1 - R², on small files written here in the benchmarks' formats; every
number recomputed by hand or through an independent path (pandas resampling as CapArena's cal_ranking.py
does it, SciPy's rank correlations)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from scipy import stats

from capreward.metaeval import ScoreRow, meta_evaluate
from capreward.metaeval.elo import CAPARENA_HUMAN_RANKING, elo_ranking, elo_ratings
from test_metaeval_long import battles


def pandas_elo_ranking(rows, rounds, seed=42):
    """CapArena's ranking by another path: a DataFrame of battles resampled by pandas after
    np.random.seed, Elo per round by itertuples, medians by DataFrame.median, sorted descending."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(rows, columns=["source1", "source2", "winner"])

    def elo(frame):
        rating = {}
        for _, a, b, w in frame[["source1", "source2", "winner"]].itertuples():
            ra, rb = rating.get(a, 1000.0), rating.get(b, 1000.0)
            ea, eb = 1 / (1 + 10 ** ((rb - ra) / 400)), 1 / (1 + 10 ** ((ra - rb) / 400))
            sa = 1.0 if w == a else 0.0 if w == b else 0.5
            rating[a], rating[b] = ra + 4 * (sa - ea), rb + 4 * (1 - sa - eb)
        return rating

    np.random.seed(seed)
    table = pd.DataFrame([elo(df.sample(frac=1.0, replace=True)) for _ in range(rounds)])
    medians = table.median()
    return list(medians.sort_values(ascending=False, kind="stable").index)


def test_elo_by_hand():
    r = elo_ratings([("a", "b", 1.0), ("b", "c", 0.5)])
    assert r["a"] == pytest.approx(1002.0) and r["b"] == pytest.approx(998.0 + 4 * (0.5 - 1 / (1 + 10 ** (2 / 400))))
    assert r["c"] == pytest.approx(1000.0 + 4 * (0.5 - 1 / (1 + 10 ** (-2 / 400))))
    assert list(r) == ["a", "b", "c"]


def test_bootstrap_ranking_matches_pandas_resampling():
    rng = random.Random(3)
    models = ["m1", "m2", "m3", "m4", "m5"]
    strength = {m: k for k, m in enumerate(models)}
    rows = []
    for _ in range(60):
        a, b = rng.sample(models, 2)
        p = 0.5 + 0.1 * (strength[b] - strength[a])  # lower index: stronger
        roll = rng.random()
        rows.append((a, b, a if roll < p - 0.05 else b if roll > p + 0.05 else "tie"))
    battles_ = [(a, b, 1.0 if w == a else 0.0 if w == b else 0.5) for a, b, w in rows]
    assert elo_ranking(battles_, rounds=200) == pandas_elo_ranking(rows, 200)
    assert elo_ranking(battles_, rounds=200)[0] in ("m1", "m2")


def test_caparena_caption_level_without_ties(tmp_path):
    path = battles(tmp_path)  # test_metaeval_long's five battles (one with the human source)
    scores = {("a.jpg", "a long caption one"): 0.9, ("a.jpg", "a long caption two"): 0.5,
              ("a.jpg", "a long caption three"): 0.4, ("b.jpg", "b one"): 0.7, ("b.jpg", "b two"): 0.7,
              ("b.jpg", "b three"): 0.8, ("b.jpg", "b human"): 0.1}
    rows = [ScoreRow(f"s{i}", v, c, s) for i, ((v, c), s) in enumerate(scores.items())]
    r = meta_evaluate("caparena", path, rows)
    # battle 3 is a human tie: left out; battles 1 and 5 agree, 2 does not
    assert r.measures["overall_without_ties"] == pytest.approx(200 / 3)
    assert r.measures["level 1_without_ties"] == pytest.approx(100.0)
    assert r.measures["level 2_without_ties"] == pytest.approx(50.0)
    assert r.details["battles_without_ties"] == {"overall": 3, "level 1": 1, "level 2": 2}
    assert r.measures["overall"] == pytest.approx(75.0)  # the with-ties number is unchanged


def arena(tmp_path, models, n=80, seed=5):
    """A CapArena file over ``models`` (best first by the people), and scores that mostly agree."""
    rng = random.Random(seed)
    data, scores = [], {}
    for k in range(n):
        a, b = rng.sample(models, 2)
        img = f"im{k}.jpg"
        better = a if models.index(a) < models.index(b) else b
        winner = better if rng.random() < 0.8 else (a if better == b else b)
        data.append({"img": img, "caption1": f"{a} on {k}", "caption2": f"{b} on {k}", "source1": a, "source2": b,
                     "winner": winner, "cluster": f"level {1 + k % 4}", "ref": "r"})
        # the metric: the model's quality plus noise (it swaps the two middle models' order)
        quality = {m: -models.index(m) for m in models}
        quality[models[2]], quality[models[3]] = quality[models[3]], quality[models[2]]
        for m in (a, b):
            scores[(img, f"{m} on {k}")] = quality[m] + rng.gauss(0, 0.8)
    path = tmp_path / "caparena_annots_eval.json"
    path.write_text(json.dumps(data))
    rows = [ScoreRow(f"s{i}", v, c, s) for i, ((v, c), s) in enumerate(scores.items())]
    return path, data, rows, scores


def metric_rows(data, scores):
    out = []
    for b in data:
        s1, s2 = scores[(b["img"], b["caption1"])], scores[(b["img"], b["caption2"])]
        out.append((b["source1"], b["source2"], b["source1"] if s1 > s2 else b["source2"] if s2 > s1 else "tie"))
    return out


def test_caparena_model_level_agreement_against_the_released_ranking(tmp_path):
    models = [m for m in CAPARENA_HUMAN_RANKING if m != "human"][:6]
    path, data, rows, scores = arena(tmp_path, models)
    r = meta_evaluate("caparena", path, rows)
    ranking = pandas_elo_ranking(metric_rows(data, scores), 1000)
    human = [CAPARENA_HUMAN_RANKING.index(m) + 1 for m in ranking]
    assert r.details["metric_ranking"] == ranking
    assert r.details["human_ranking_from"] == "caparena_metrics.py ranking_human"
    assert r.measures["model_spearman"] == pytest.approx(100 * stats.spearmanr(human, range(1, 7))[0])
    assert r.measures["model_kendall"] == pytest.approx(100 * stats.kendalltau(human, range(1, 7))[0])
    assert 0 < r.measures["model_kendall"] < 100  # the metric swapped two models


def test_caparena_model_level_with_other_models_ranks_the_peoples_verdicts(tmp_path):
    models = ["best", "good", "fair", "weak", "poor"]
    path, data, rows, scores = arena(tmp_path, models, seed=9)
    r = meta_evaluate("caparena", path, rows)
    people = pandas_elo_ranking([(b["source1"], b["source2"], b["winner"]) for b in data], 1000)
    metric = pandas_elo_ranking(metric_rows(data, scores), 1000)
    assert r.details["human_ranking"] == people and r.details["metric_ranking"] == metric
    human_pos = [people.index(m) + 1 for m in metric]
    assert r.measures["model_spearman"] == pytest.approx(100 * stats.spearmanr(human_pos, range(1, 6))[0])
    missing = meta_evaluate("caparena", path, rows[2:])  # battle 0 unscored: left out of the metric's Elo
    assert missing.n_unmatched == 1 and len(missing.details["metric_ranking"]) == 5


def test_detailcaps_one_minus_r2_by_hand(tmp_path):
    rows = [("i1", "c1", 0.6, 0.5), ("i1", "c2", 0.2, 0.3), ("i2", "d1", 0.9, 0.7), ("i2", "d2", 0.5, 0.6)]
    path = tmp_path / "detailcaps.jsonl"
    path.write_text("\n".join(json.dumps({"image": i, "caption": c, "human_score": h}) for i, c, h, _ in rows))
    r = meta_evaluate("detailcaps", path, [ScoreRow(f"s{k}", i, c, s) for k, (i, c, _, s) in enumerate(rows)])
    # residuals 0.1, -0.1, 0.2, -0.1 -> 0.07; human mean 0.55 -> 0.0025 + 0.1225 + 0.1225 + 0.0025 = 0.25
    assert r.measures["one_minus_r2"] == pytest.approx(0.07 / 0.25)
    assert r.measures["pearson"] == pytest.approx(100 * stats.pearsonr([0.5, 0.3, 0.7, 0.6], [0.6, 0.2, 0.9, 0.5])[0])
