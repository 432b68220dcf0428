"""Long-caption meta-evaluation: CapArena's pairwise battles and DetailCaps-style per-caption scores, on
small files written here in the benchmarks' formats; every number recomputed by hand."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from capreward.metaeval import JudgmentError, ScoreRow, meta_evaluate, read_judgments


def battles(tmp_path):
    data = [  # the layout of CapArena's caparena_annots_eval.json
        {"img": "a.jpg", "caption1": "a long caption one", "caption2": "a long caption two", "source1": "GPT-4o",
         "source2": "LLaVA", "winner": "GPT-4o", "cluster": "level 1", "ref": "r"},
        {"img": "a.jpg", "caption1": "a long caption two", "caption2": "a long caption three", "source1": "LLaVA",
         "source2": "Qwen", "winner": "Qwen", "cluster": "level 2", "ref": "r"},
        {"img": "b.jpg", "caption1": "b one", "caption2": "b two", "source1": "GPT-4o", "source2": "Qwen",
         "winner": "tie", "cluster": "level 1", "ref": "r"},
        {"img": "b.jpg", "caption1": "b one", "caption2": "b human", "source1": "GPT-4o", "source2": "human",
         "winner": "human", "cluster": "level 1", "ref": "r"},  # skipped by the protocol
        {"img": "b.jpg", "caption1": "b two", "caption2": "b three", "source1": "Qwen", "source2": "LLaVA",
         "winner": "LLaVA", "cluster": "level 2", "ref": "r"},
    ]
    path = tmp_path / "caparena_annots_eval.json"
    path.write_text(json.dumps(data))
    return path


def test_caparena_caption_level_agreement_with_ties(tmp_path):
    path = battles(tmp_path)
    scores = {("a.jpg", "a long caption one"): 0.9, ("a.jpg", "a long caption two"): 0.5,
              ("a.jpg", "a long caption three"): 0.4,  # battle 2: metric says 2 > 3, people 3: disagree
              ("b.jpg", "b one"): 0.7, ("b.jpg", "b two"): 0.7,  # battle 3: tie = tie: agree
              ("b.jpg", "b three"): 0.8, ("b.jpg", "b human"): 0.1}  # battle 5: agree
    rows = [ScoreRow(f"s{i}", v, c, s) for i, ((v, c), s) in enumerate(scores.items())]
    r = meta_evaluate("caparena", path, rows)
    # battles 1, 3, 5 agree; 2 does not; the human battle is skipped: 3/4 overall
    assert r.measures["overall"] == pytest.approx(75.0)
    assert r.measures["level 1"] == pytest.approx(100.0) and r.measures["level 2"] == pytest.approx(50.0)
    assert r.details["human_battles_skipped"] == 1 and r.n_matched == 4 and r.n_unmatched == 0
    missing = meta_evaluate("caparena", path, rows[:-2])  # "b three" unscored: battle 5 is a miss
    assert missing.measures["overall"] == pytest.approx(50.0) and missing.n_unmatched == 1


def test_caparena_reader_keeps_sources_ties_and_refuses_bad_battles(tmp_path):
    j = read_judgments("caparena", battles(tmp_path))
    assert [p.preferred for p in j.pairs] == [0, 1, -1, 1, 1]
    assert j.pairs[0].sources == ("GPT-4o", "LLaVA") and j.pairs[0].category == "level 1"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"img": "a.jpg", "caption1": "x", "caption2": "y", "winner": "x"}]))
    with pytest.raises(JudgmentError, match=r"bad.json\[0\].*source1"):
        read_judgments("caparena", bad)


def test_detailcaps_pcc_kendall_and_sample_tau(tmp_path):
    rows = [("i1", "c1", 3.0, 0.30), ("i1", "c2", 1.0, 0.35), ("i1", "c3", 2.0, 0.20),
            ("i2", "d1", 4.0, 0.90), ("i2", "d2", 2.0, 0.10), ("i3", "e1", 5.0, 0.5)]
    path = tmp_path / "detailcaps.jsonl"
    path.write_text("\n".join(json.dumps({"image": i, "caption": c, "human_score": h}) for i, c, h, _ in rows))
    r = meta_evaluate("detailcaps", path, [ScoreRow(f"s{k}", i, c, s) for k, (i, c, _, s) in enumerate(rows)])
    human, metric = [h for *_, h, _ in rows], [s for *_, s in rows]
    assert r.measures["pearson"] == pytest.approx(100 * stats.pearsonr(metric, human)[0])
    assert r.measures["tau_b"] == pytest.approx(100 * stats.kendalltau(metric, human).statistic)
    tau_1 = stats.kendalltau([0.30, 0.35, 0.20], [3.0, 1.0, 2.0]).statistic  # image i1: 1/3
    assert r.measures["sample_tau"] == pytest.approx(100 * (tau_1 + 1.0) / 2)  # i2 agrees; i3 has one caption
    assert r.details["images_in_sample_tau"] == 2 and r.n_matched == 6
