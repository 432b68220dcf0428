"""Meta-evaluation: statistics against hand computations, readers on files in each released format,
protocol details (per-rating rows, ties and unmatched pairs as misses, per-annotator averages), and the
CLI end to end on the shared judgment files."""

from __future__ import annotations

import itertools
import json
import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capreward.metaeval import (
    JudgmentError,
    index_scores,
    kendall,
    meta_evaluate,
    normalize_caption,
    pairwise_accuracy,
    pairwise_outcomes,
    read_judgments,
    read_scores,
    visual_aliases,
)
import cli_process

REPO = Path(__file__).resolve().parents[1]
HJ = REPO.parent / "shared" / "data" / "human_judgments"


# ------------------------------------------------------------------ independent reference statistics
def pair_counts(x, y):
    """Concordant, discordant, ties only in x, ties only in y (pairs tied in both are in neither)."""
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx == dy:
            c += 1
        else:
            d += 1
    return c, d, tx, ty


def tau_b_ref(x, y):
    c, d, tx, ty = pair_counts(x, y)
    return (c - d) / math.sqrt((c + d + tx) * (c + d + ty))


def tau_c_ref(x, y):
    c, d, _, _ = pair_counts(x, y)
    n, m = len(x), min(len(set(x)), len(set(y)))
    return 2 * (c - d) / (n * n * (m - 1) / m)


def test_kendall_hand_computed_example():
    # x strictly increasing, y with two tied pairs: 4 concordant, 0 discordant, 2 ties in y.
    x, y = [1, 2, 3, 4], [1, 1, 2, 2]
    assert kendall(x, y, "b") == pytest.approx(4 / math.sqrt(4 * 6))
    assert kendall(x, y, "c") == pytest.approx(1.0)  # 2*4 / (16 * (2-1)/2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), min_size=3, max_size=25))
def test_kendall_matches_pair_counting(pairs):
    x = [float(a) for a, _ in pairs]
    y = [float(b) for _, b in pairs]
    if len(set(x)) < 2 or len(set(y)) < 2:
        assert math.isnan(kendall(x, y, "b"))
        return
    assert kendall(x, y, "b") == pytest.approx(tau_b_ref(x, y), abs=1e-12)
    assert kendall(x, y, "c") == pytest.approx(tau_c_ref(x, y), abs=1e-12)


def test_kendall_rejects_bad_input():
    with pytest.raises(ValueError, match="variant"):
        kendall([1, 2], [1, 2], "a")
    with pytest.raises(ValueError, match="equal length"):
        kendall([1, 2, 3], [1, 2], "b")


def test_pairwise_accuracy_counts_ties_and_unscored_as_misses():
    preferred, other = [2.0, 1.0, 1.0, None, 3.0], [1.0, 1.0, 2.0, 0.0, float("nan")]
    assert pairwise_outcomes(preferred, other) == {"hits": 1, "ties": 1, "wrong": 1, "unscored": 2}
    assert pairwise_accuracy(preferred, other) == pytest.approx(1 / 5)


def test_caption_and_visual_keys():
    assert normalize_caption("  A  dog\truns .\n") == "A dog runs ."
    assert visual_aliases("Flickr8k_Dataset/12_ab.jpg") == ("Flickr8k_Dataset/12_ab.jpg", "12_ab.jpg", "12_ab")
    assert visual_aliases("vid1", "x/y.avi") == ("vid1", "x/y.avi", "y.avi", "y")


# ------------------------------------------------------------------ readers (released formats)
def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def flickr_file(tmp_path: Path) -> Path:
    """Two images; captions rated by three experts each; one NaN rating."""
    data = {}
    for img, caps in {"111_a": [("a dog runs", [4, 4, 3]), ("a cat", [1, 2, 1])],
                      "222_b": [("two men  talk", [3, 3, 3]), ("a tree", [1, float("nan"), 2])]}.items():
        hj = [{"image_id": img, "image_path": f"Flickr8k_Dataset/{img}.jpg", "caption": c, "rating": r}
              for c, rs in caps for r in rs]
        data[img] = {"image_id": img, "image_path": f"Flickr8k_Dataset/{img}.jpg", "ground_truth": ["x"], "human_judgement": hj}
    return tmp_path / "flickr.json", data


def test_flickr8k_reader_one_item_per_rating(tmp_path):
    path, data = flickr_file(tmp_path)
    write_json(path, data)  # json.dumps writes NaN, as the released files do
    j = read_judgments("flickr8k-expert", path)
    assert len(j.rated) == 12
    assert j.rated[0].visual == ("111_a", "Flickr8k_Dataset/111_a.jpg", "111_a.jpg")
    assert [i.human["rating"] for i in j.rated[:3]] == [4, 4, 3]
    assert sum(math.isnan(i.human["rating"]) for i in j.rated) == 1


def test_flickr8k_protocol_uses_rating_rows_and_drops_nan(tmp_path):
    path, data = flickr_file(tmp_path)
    write_json(path, data)
    scores = {"a dog runs": 0.9, "a cat": 0.2, "two men talk": 0.7, "a tree": 0.1}
    rows = write_jsonl(tmp_path / "s.jsonl", [{"image": f"/imgs/{img}.jpg", "caption": c, "score": s}
                                               for img, c, s in [("111_a", "a dog runs", 0.9), ("111_a", "a cat", 0.2),
                                                                 ("222_b", "two men talk", 0.7), ("222_b", "a tree", 0.1)]])
    res = meta_evaluate("flickr8k-expert", path, rows)
    human, metric = [], []
    for img in data.values():
        for h in img["human_judgement"]:
            if not math.isnan(h["rating"]):
                human.append(h["rating"])
                metric.append(scores[normalize_caption(h["caption"])])
    assert res.n_matched == 11 and res.n_unmatched == 0
    assert res.details["nan_ratings_dropped"] == 1
    assert res.measures["tau_c"] == pytest.approx(100 * tau_c_ref(metric, human))
    assert res.measures["tau_b"] == pytest.approx(100 * tau_b_ref(metric, human))
    cf = meta_evaluate("flickr8k-cf", path, rows)
    assert set(cf.measures) == {"tau_b"} and cf.measures["tau_b"] == res.measures["tau_b"]
    assert set(meta_evaluate("composite", path, rows).measures) == {"tau_c"}


def test_unmatched_rows_are_counted_with_reasons(tmp_path):
    path, data = flickr_file(tmp_path)
    write_json(path, data)
    rows = write_jsonl(tmp_path / "s.jsonl", [
        {"image": "111_a", "caption": "a dog runs", "score": 0.9},
        {"image": "111_a", "caption": "a cat", "score": None, "errors": {"fleur": "no number"}},
        {"image": "222_b.jpg", "caption": "two men talk", "score": 0.5},
        {"image": "999_z.jpg", "caption": "not in the benchmark", "score": 0.5},
    ])
    res = meta_evaluate("flickr8k-expert", path, rows)
    assert res.n_matched == 6 and res.n_unmatched == 6
    reasons = {u["caption"]: u["reason"] for u in res.unmatched}
    assert "no number" in reasons["a cat"]
    assert reasons["a tree"] == "no score row for this image and caption"
    assert res.n_unused_scores == 1


def test_pascal_reader_and_protocol_ties_and_unmatched_are_misses(tmp_path):
    def item(img, a, b, label):
        return {"image": f"VOC2012/JPEGImages/{img}.jpg", "captions": [a, b], "label": label, "references": ["r"] * 5}

    data = {"HC": [item("1", "a", "b", 0), item("2", "c", "d", 1), item("3", "e", "f", 0)],
            "HI": [item("4", "g", "h", 1), item("5", "i", "j", 0)],
            "HM": [item("6", "k", "l", 0)],
            "MM": [item("7", "m", "n", 1), item("8", "o", "p", 1)]}
    path = write_json(tmp_path / "pascal.json", data)
    j = read_judgments("pascal50s", path)
    assert len(j.pairs) == 8 and j.pairs[1].preferred == 1
    s = {("1", "a"): 2, ("1", "b"): 1,  # HC hit
         ("2", "c"): 5, ("2", "d"): 5,  # HC tie -> miss
         ("3", "e"): 1,                 # HC f unscored -> miss
         ("4", "g"): 0, ("4", "h"): 1,  # HI hit (label 1)
         ("5", "i"): 0, ("5", "j"): 1,  # HI wrong
         ("6", "k"): 3, ("6", "l"): 1,  # HM hit
         ("7", "m"): 1, ("7", "n"): 2, ("8", "o"): 1, ("8", "p"): 2}  # MM both hits
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": f"{i}.jpg", "caption": c, "clip_s": v} for (i, c), v in s.items()])
    res = meta_evaluate("pascal50s", path, scores)
    assert res.measures["HC"] == pytest.approx(100 / 3)
    assert res.measures["HI"] == pytest.approx(50.0)
    assert res.measures["HM"] == pytest.approx(100.0)
    assert res.measures["MM"] == pytest.approx(100.0)
    assert res.measures["mean"] == pytest.approx((100 / 3 + 50 + 100 + 100) / 4)
    assert res.details["ties"] == 1 and res.details["unscored_pairs"] == 1
    assert res.n_unmatched == 1 and res.n_matched == 7
    assert res.unmatched[0]["caption"] == "f"
    from capreward.metaeval.plot import plot_result

    png = plot_result(res, tmp_path / "pairs.png", "clip_s")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pascal_reader_rejects_bad_label(tmp_path):
    path = write_json(tmp_path / "p.json", {"HC": [{"image": "x.jpg", "captions": ["a", "b"], "label": 2}]})
    with pytest.raises(JudgmentError, match=r"\['HC'\]\[0\].*label"):
        read_judgments("pascal50s", path)


def test_msvd_reader_means_annotators_and_protocol_per_dimension(tmp_path):
    rng = random.Random(3)
    data, human = {}, []
    for v in range(12):
        ann = [[rng.randint(1, 5) for _ in range(4)] for _ in range(2)]
        data[f"vid{v}"] = {"vname": f"clip{v}_1_2.avi", "ref": ["r"], "candidate": f"caption {v}",
                           "human_score": [a + [sum(a) / 4] for a in ann]}
        human.append([(ann[0][d] + ann[1][d]) / 2 for d in range(4)] + [(sum(ann[0]) + sum(ann[1])) / 8])
    path = write_json(tmp_path / "msvd.json", data)
    j = read_judgments("msvd-eval", path)
    assert j.rated[0].human["accuracy"] == human[0][0] and j.rated[0].human["overall"] == human[0][4]
    metric = [rng.random() for _ in range(12)]
    scores = write_jsonl(tmp_path / "s.jsonl", [{"video": f"/v/clip{v}_1_2.mp4", "caption": f"caption  {v}", "score": m}
                                                 for v, m in enumerate(metric)])
    res = meta_evaluate("msvd-eval", path, scores, protocol="annotator-mean")
    assert res.n_matched == 12 and res.details["protocol"] == "annotator-mean"
    for d, name in enumerate(["accuracy", "completeness", "conciseness", "relevance", "overall"]):
        h = [row[d] for row in human]
        assert res.details["dimensions"][name]["tau_b"] == pytest.approx(100 * tau_b_ref(metric, h))
        assert res.details["dimensions"][name]["tau_c"] == pytest.approx(100 * tau_c_ref(metric, h))
    assert res.measures["tau_b"] == res.details["dimensions"]["overall"]["tau_b"]


def msvd_file(tmp_path: Path, n: int = 10, seed: int = 5):
    """MSVD-Eval judgments of ``n`` candidates by two annotators, in the released layout, and the raw
    annotator arrays [candidate, annotator, dimension] (accuracy, completeness, conciseness, relevance, overall)."""
    rng = np.random.default_rng(seed)
    human = rng.integers(1, 6, size=(n, 2, 5)).astype(float)
    data = {f"vid{v}": {"vname": f"clip{v}.avi", "ref": ["r"], "candidate": f"caption {v}",
                        "human_score": human[v].tolist()} for v in range(n)}
    return write_json(tmp_path / "msvd.json", data), human


def test_msvd_default_protocol_stacks_annotator_rows_like_the_release(tmp_path):
    """G-VEval's correlation.py: one row per (candidate, annotator); a scalar metric is repeated on both
    rows; ACCR scores go dimension by dimension against the matching human dimension, the main score
    against 'overall'. Reference values: scipy's kendalltau on arrays stacked here by hand."""
    from scipy.stats import kendalltau

    path, human = msvd_file(tmp_path)
    n = human.shape[0]
    rng = np.random.default_rng(7)
    accr = rng.integers(0, 101, size=(n, 4)).astype(float)
    main = accr.mean(axis=1)
    rows = [{"video": f"clip{v}.mp4", "caption": f"caption {v}", "gveval": main[v],
             **{f"gveval.{d}": accr[v, k] for k, d in enumerate(["accuracy", "completeness", "conciseness", "relevance"])}}
            for v in range(n)]
    scores = write_jsonl(tmp_path / "s.jsonl", rows)
    res = meta_evaluate("msvd-eval", path, scores)
    assert res.details["protocol"] == "per-annotator" and res.details["rows"] == 2 * n and res.n_matched == n
    stacked_human = human.reshape(2 * n, 5)  # candidate 0 annotator 0, candidate 0 annotator 1, ...
    stacked_metric = np.repeat(np.column_stack([accr, main]), 2, axis=0)
    for k, d in enumerate(["accuracy", "completeness", "conciseness", "relevance", "overall"]):
        for variant in ("b", "c"):
            want = 100 * kendalltau(stacked_metric[:, k], stacked_human[:, k], variant=variant).statistic
            assert res.details["dimensions"][d][f"tau_{variant}"] == pytest.approx(want)
    assert res.details["metric_column"]["accuracy"] == "score.accuracy"
    assert res.measures == {"tau_b": res.details["dimensions"]["overall"]["tau_b"],
                            "tau_c": res.details["dimensions"]["overall"]["tau_c"]}

    # The named variant: one row per candidate against the annotators' mean (the ACCR parts still match).
    mean = meta_evaluate("msvd-eval", path, scores, protocol="annotator-mean")
    assert mean.details["protocol"] == "annotator-mean" and mean.details["rows"] == n
    for k, d in enumerate(["accuracy", "overall"]):
        col = k if d == "accuracy" else 4
        metric = accr[:, 0] if d == "accuracy" else main
        want = 100 * kendalltau(metric, human[:, :, col].mean(axis=1), variant="b").statistic
        assert mean.details["dimensions"][d]["tau_b"] == pytest.approx(want)
    assert mean.measures["tau_b"] != pytest.approx(res.measures["tau_b"])  # the protocols really differ here

    # A single score (no parts) goes against every human dimension, stacked.
    single = write_jsonl(tmp_path / "one.jsonl", [{"video": f"clip{v}", "caption": f"caption {v}", "score": main[v]}
                                                   for v in range(n)])
    res1 = meta_evaluate("msvd-eval", path, single)
    want = 100 * kendalltau(np.repeat(main, 2), stacked_human[:, 0], variant="b").statistic
    assert res1.details["dimensions"]["accuracy"]["tau_b"] == pytest.approx(want)
    assert res1.details["metric_column"]["accuracy"] == "score"
    with pytest.raises(ValueError, match="per-candidate"):
        meta_evaluate("msvd-eval", path, single, protocol="per-candidate")


def test_flickr8k_expert_per_candidate_protocol_averages_each_triple(tmp_path):
    """G-VEval's variant: per image, ratings three at a time; a NaN in a triple drops it; an image whose
    rating count is not a multiple of 3 is skipped entirely. Reference: scipy on means computed here."""
    from scipy.stats import kendalltau

    nan = float("nan")
    images = {
        "111_a": [("a dog runs", [4, 4, 3]), ("a cat", [1, 2, 1]), ("a red ball", [2, 3, 3])],
        "222_b": [("two men talk", [3, 3, 4]), ("a tree", [1, nan, 2]), ("a bike", [2, 2, 1])],
        "333_c": [("a boat", [4, 4, 4]), ("odd one", [1])],  # 4 ratings: skipped, as the release does
        "444_d": [("a house", [1, 1, 2]), ("a child smiles", [4, 3, 4])],
    }
    data = {img: {"image_id": img, "image_path": f"Flickr8k_Dataset/{img}.jpg", "ground_truth": ["x"],
                  "human_judgement": [{"image_id": img, "image_path": f"Flickr8k_Dataset/{img}.jpg", "caption": c,
                                       "rating": r} for c, rs in caps for r in rs]} for img, caps in images.items()}
    path = write_json(tmp_path / "flickr8k.json", data)
    metric = {"a dog runs": 0.9, "a cat": 0.1, "a red ball": 0.3, "two men talk": 0.6, "a tree": 0.2, "a bike": 0.4,
              "a boat": 0.8, "odd one": 0.5, "a house": 0.35, "a child smiles": 0.7}
    image_of = {c: img for img, caps in images.items() for c, _ in caps}
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": f"{image_of[c]}.jpg", "caption": c, "score": v}
                                                 for c, v in metric.items() if c != "a bike"])
    res = meta_evaluate("flickr8k-expert", path, scores, protocol="per-candidate")
    kept = ["a dog runs", "a cat", "a red ball", "two men talk", "a house", "a child smiles"]  # "a bike" unscored
    caps = {c: rs for img in images.values() for c, rs in img}
    human = [sum(caps[c]) / 3 for c in kept]
    m = [metric[c] for c in kept]
    assert res.n_matched == 6 and res.n_unmatched == 1 and res.unmatched[0]["caption"] == "a bike"
    assert res.details["nan_triples_dropped"] == 1 and res.details["images_skipped_not_multiple_of_3"] == 1
    assert res.measures["tau_b"] == pytest.approx(100 * kendalltau(m, human, variant="b").statistic)
    assert res.measures["tau_c"] == pytest.approx(100 * kendalltau(m, human, variant="c").statistic)
    per_rating = meta_evaluate("flickr8k-expert", path, scores)  # the default is unchanged
    assert per_rating.details["protocol"] == "per-rating" and per_rating.n_matched == 24  # 28 ratings, 1 NaN, 3 of the unscored caption


def test_thumb_pearson_against_total_precision_and_recall(tmp_path):
    from scipy.stats import pearsonr

    rng = np.random.default_rng(11)
    p, r = rng.uniform(1, 5, 8).round(1), rng.uniform(1, 5, 8).round(1)
    rows = [{"image": f"COCO_val2014_{i:012d}.jpg", "hyp": f"cap {i}", "P": p[i], "R": r[i],
             "human_score": (p[i] + r[i]) / 2 - 0.1 * (i % 2)} for i in range(8)]
    path = write_jsonl(tmp_path / "thumb.jsonl", rows)
    metric = rng.random(8)
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": row["image"], "caption": row["hyp"], "score": m}
                                                 for row, m in zip(rows, metric)])
    res = meta_evaluate("thumb", path, scores)
    assert res.measures["pearson"] == pytest.approx(100 * pearsonr(metric, [row["human_score"] for row in rows]).statistic)
    assert res.measures["pearson_p"] == pytest.approx(100 * pearsonr(metric, p).statistic)
    assert res.measures["pearson_r"] == pytest.approx(100 * pearsonr(metric, r).statistic)


def test_composite_tau_b_per_dimension(tmp_path):
    from scipy.stats import kendalltau

    rng = np.random.default_rng(12)
    n = 9
    correct, thorough = rng.integers(1, 6, n), rng.integers(1, 6, n)
    data = {f"img{i}": {"image_id": f"img{i}", "image_path": f"img{i}.jpg", "ground_truth": ["x"],
                        "human_judgement": [{"image_id": f"img{i}", "image_path": f"img{i}.jpg", "caption": f"c {i}",
                                             "rating": int(correct[i]), "correctness": int(correct[i]),
                                             "thoroughness": int(thorough[i])}]} for i in range(n)}
    path = write_json(tmp_path / "composite.json", data)
    metric = rng.random(n)
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": f"img{i}.jpg", "caption": f"c {i}", "score": metric[i]} for i in range(n)])
    res = meta_evaluate("composite", path, scores)
    assert res.measures["tau_c"] == pytest.approx(100 * kendalltau(metric, correct, variant="c").statistic)
    assert res.measures["tau_b_correctness"] == pytest.approx(100 * kendalltau(metric, correct, variant="b").statistic)
    assert res.measures["tau_b_thoroughness"] == pytest.approx(100 * kendalltau(metric, thorough, variant="b").statistic)


def vatex_reference(metric, human):
    from scipy.stats import spearmanr

    metric = np.around(np.asarray(metric), 4)
    taus = [tau_b_ref(list(metric), list(human[:, k])) for k in range(human.shape[1])]
    rhos = [spearmanr(metric, human[:, k]).statistic for k in range(human.shape[1])]
    return 100 * np.mean(taus), 100 * np.mean(rhos)


def test_vatex_reader_pickle_folder_and_jsonl_average_over_annotators(tmp_path):
    rng = np.random.default_rng(0)
    n = 15
    cands = np.array([f"cand {i}" for i in range(n)])
    vids = np.array([f"video{i // 3}" for i in range(n)])
    human = rng.integers(1, 6, size=(n, 3)).astype(float)
    folder = tmp_path / "VATEX-EVAL"
    folder.mkdir()
    for name, obj in [("candidates_list.pkl", cands), ("video_ids.pkl", vids),
                      ("human_scores.pkl", human.T.reshape(-1))]:  # annotator by annotator, as released
        with (folder / name).open("wb") as f:
            pickle.dump(obj, f)
    metric = rng.random(n) + 1e-6 * rng.random(n)  # the 4-decimal rounding must not matter for ranks here
    scores = write_jsonl(tmp_path / "s.jsonl", [{"video": f"{vids[i]}.mp4", "caption": cands[i], "emscore": float(metric[i])}
                                                for i in range(n)])
    res = meta_evaluate("vatex-eval", folder, scores)
    tau, rho = vatex_reference(metric, human)
    assert res.n_matched == n
    assert res.measures["tau_b"] == pytest.approx(tau)
    assert res.measures["spearman"] == pytest.approx(rho)
    assert set(res.details["per_annotator"]) == {"annotator_1", "annotator_2", "annotator_3"}
    jsonl = write_jsonl(tmp_path / "vatex.jsonl", [{"video": vids[i], "caption": cands[i], "human_scores": human[i].tolist()}
                                                   for i in range(n)])
    assert meta_evaluate("vatex-eval", jsonl, scores).measures == res.measures


def test_thumb_reader_and_pearson(tmp_path):
    rows = [{"SYS": "m", "seg_id": str(i), "hyp": f"cap {i}", "image": f"COCO_val2014_{i:012d}.jpg",
             "P": 4.0, "R": 3.0, "human_score": h} for i, h in enumerate([3.5, 4.0, 2.0, 5.0, 4.5])]
    path = write_jsonl(tmp_path / "thumb.jsonl", rows)
    metric = [0.3, 0.5, 0.1, 0.6, 0.2]
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": r["image"], "caption": r["hyp"], "score": m} for r, m in zip(rows, metric)])
    res = meta_evaluate("thumb", path, scores)
    assert res.measures["pearson"] == pytest.approx(100 * np.corrcoef(metric, [r["human_score"] for r in rows])[0, 1])


def test_foil_reader_pairs_original_with_each_foil(tmp_path):
    anns = [{"id": 1, "image_id": 42, "caption": "a dog on grass", "foil": False},
            {"id": 1, "image_id": 42, "caption": "a cat on grass", "foil": True, "target_word": "dog", "foil_word": "cat"},
            {"id": 1, "image_id": 42, "caption": "a cow on grass", "foil": True},
            {"id": 2, "image_id": 7, "caption": "a red bus", "foil": False},
            {"id": 2, "image_id": 7, "caption": "a red car", "foil": True},
            {"id": 3, "image_id": 7, "caption": "lonely original", "foil": False}]
    path = write_json(tmp_path / "foil.json", {"images": [], "annotations": anns})
    j = read_judgments("foil", path)
    assert [(p.captions, p.preferred) for p in j.pairs] == [
        (("a dog on grass", "a cat on grass"), 0), (("a dog on grass", "a cow on grass"), 0), (("a red bus", "a red car"), 0)]
    assert j.pairs[0].visual[:2] == ("42", "COCO_val2014_000000000042.jpg")
    s = {"a dog on grass": 0.5, "a cat on grass": 0.4, "a cow on grass": 0.6, "a red bus": 0.3, "a red car": 0.3}
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": "COCO_val2014_000000000042.jpg" if "grass" in c else "7",
                                                 "caption": c, "score": v} for c, v in s.items()])
    assert meta_evaluate("foil", path, scores).measures == {"accuracy": pytest.approx(100 / 3)}


# ------------------------------------------------------------------ scores files
def test_score_field_selection(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [
        {"id": "1", "image": "a.jpg", "caption": "x", "emscore": 0.3, "emscore.full_f": 0.4, "m": {"clip_s": 0.7}, "errors": None},
    ])
    assert read_scores(path)[0].score == 0.3  # the single metric `capreward score` wrote
    assert read_scores(path, "emscore.full_f")[0].score == 0.4  # flat key with a dot
    assert read_scores(path, "m.clip_s")[0].score == 0.7  # nested path
    missing = read_scores(path, "fleur")[0]
    assert missing.score is None and "fleur" in missing.reason
    two = write_jsonl(tmp_path / "t.jsonl", [{"image": "a.jpg", "caption": "x", "clip_s": 1.0, "pac_s": 2.0}])
    with pytest.raises(JudgmentError, match="--score-field"):
        read_scores(two)
    bad = write_jsonl(tmp_path / "b.jsonl", [{"caption": "x", "score": 1}])
    with pytest.raises(JudgmentError, match="b.jsonl:1"):
        read_scores(bad)


def test_conflicting_duplicate_scores_raise(tmp_path):
    path, data = flickr_file(tmp_path)
    write_json(path, data)
    rows = write_jsonl(tmp_path / "s.jsonl", [{"image": "111_a", "caption": "a cat", "score": 0.1},
                                               {"image": "111_a.jpg", "caption": "a  cat", "score": 0.1},
                                               {"image": "111_a", "caption": "a cat ", "score": 0.9}])
    with pytest.raises(JudgmentError, match="s.jsonl:3.*conflicts with 0.1 at .*s.jsonl:1"):
        index_scores(read_scores(rows), read_judgments("flickr8k-expert", path))


def test_cli_choices_match_readers():
    from capreward.cli.meta_eval import BENCHMARK_CHOICES
    from capreward.metaeval.readers import BENCHMARKS

    assert set(BENCHMARK_CHOICES) == set(BENCHMARKS)
    from capreward.cli.meta_eval import PROTOCOL_CHOICES
    from capreward.metaeval import PROTOCOLS

    assert set(PROTOCOLS) == set(BENCHMARKS)
    assert set(PROTOCOL_CHOICES) == {name for names in PROTOCOLS.values() for name in names}


# ------------------------------------------------------------------ end to end on the shared files
needs_shared = pytest.mark.skipif(not HJ.is_dir(), reason="shared human judgments not present")


def cli(*args, timeout=240):
    return cli_process.run(["meta-eval", *args], timeout=timeout, cwd=REPO)


def flickr_scores(tmp_path: Path, noise: float | None, drop: int = 0) -> tuple[Path, int]:
    """Scores for the shared Flickr8k-Expert captions: mean expert rating + noise, or uniform random
    (``noise=None``); the first ``drop`` captions are left out. Returns the path and the number of
    rating rows of the dropped captions."""
    data = json.loads((HJ / "flickr8k_expert.json").read_text())
    ratings: dict[tuple[str, str], list[float]] = {}
    for entry in data.values():
        for h in entry["human_judgement"]:
            ratings.setdefault((h["image_path"], normalize_caption(h["caption"])), []).append(h["rating"])
    rng = random.Random(0)
    rows, dropped = [], 0
    for n, ((image, caption), rs) in enumerate(ratings.items()):
        if n < drop:
            dropped += len(rs)
            continue
        score = sum(rs) / len(rs) + rng.gauss(0, noise) if noise is not None else rng.random()
        rows.append({"id": str(n), "image": f"/data/flickr8k/{image}", "caption": caption, "score": score})
    return write_jsonl(tmp_path / f"flickr_{noise}_{drop}.jsonl", rows), dropped


@needs_shared
def test_cli_flickr8k_expert_informative_scores_and_plot(tmp_path):
    scores, dropped = flickr_scores(tmp_path, noise=0.3, drop=5)
    plot = tmp_path / "plot.png"
    proc = cli("--benchmark", "flickr8k-expert", "--judgments", str(HJ / "flickr8k_expert.json"),
               "--scores", str(scores), "--json", "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # stdout holds exactly one JSON object
    assert out["n_unmatched"] == dropped > 0
    assert out["n_matched"] + dropped == 16992
    assert out["tau_c"] > 50 and out["tau_b"] > 50
    assert f"{dropped} judgment rows have no score" in proc.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(plot) as im:
        im.verify()


@needs_shared
def test_cli_flickr8k_expert_random_scores_near_zero(tmp_path):
    scores, _ = flickr_scores(tmp_path, noise=None)
    proc = cli("--benchmark", "flickr8k-expert", "--judgments", str(HJ / "flickr8k_expert.json"), "--scores", str(scores))
    assert proc.returncode == 0, proc.stderr
    table = dict(line.split() for line in proc.stdout.splitlines()[2:])
    assert abs(float(table["tau_c"])) < 5 and table["n_matched"] == "16992" and table["n_unmatched"] == "0"


@needs_shared
def test_cli_pascal50s_shared_file(tmp_path):
    """Random scores per (image, caption); the expected accuracies are counted straight from the raw
    file (preferred strictly higher; ties and pairs with a missing caption are misses)."""
    data = json.loads((HJ / "pascal50s.json").read_text())
    rng = random.Random(1)
    score: dict[tuple[str, str], float] = {}
    for items in data.values():
        for it in items:
            for cap in it["captions"]:
                # Rounded to 1 decimal so that ties occur between different captions too.
                score.setdefault((it["image"].split("/")[-1], " ".join(cap.split())), round(rng.random(), 1))
    missing = next(iter(score))
    rows = [{"image": img, "caption": cap, "clip_s": v} for (img, cap), v in score.items() if (img, cap) != missing]
    scores = write_jsonl(tmp_path / "pascal.jsonl", rows)
    proc = cli("--benchmark", "pascal50s", "--judgments", str(HJ / "pascal50s.json"), "--scores", str(scores),
               "--score-field", "clip_s", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected, unscored, ties = {}, 0, 0
    for cat, items in data.items():
        hits = 0
        for it in items:
            keys = [(it["image"].split("/")[-1], " ".join(c.split())) for c in it["captions"]]
            if missing in keys:
                unscored += 1
                continue
            p, o = score[keys[it["label"]]], score[keys[1 - it["label"]]]
            hits += p > o
            ties += p == o
        expected[cat] = 100 * hits / len(items)
        assert out[cat] == pytest.approx(expected[cat], abs=1e-4)
    assert out["mean"] == pytest.approx(sum(expected.values()) / 4, abs=1e-4)
    assert out["n_unmatched"] == unscored >= 1 and out["n_matched"] == 4000 - unscored
    assert out["details"]["ties"] == ties > 0


@needs_shared
def test_msvd_eval_shared_file_in_process(tmp_path, capsys):
    from capreward.cli.main import main

    data = json.loads((HJ / "msvd_eval.json").read_text())
    rng = random.Random(2)
    rows = [{"video": f"/videos/{e['vname']}", "caption": e["candidate"],
             "score": sum(a[4] for a in e["human_score"]) / len(e["human_score"]) + rng.gauss(0, 0.3)} for e in data.values()]
    scores = write_jsonl(tmp_path / "msvd.jsonl", rows)
    assert main(["meta-eval", "--benchmark", "msvd-eval", "--judgments", str(HJ / "msvd_eval.json"),
                 "--scores", str(scores), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_matched"] == len(data) and out["n_unmatched"] == 0
    assert out["tau_b"] > 50 and out["tau_c"] > 50
    assert set(out["details"]["dimensions"]) == {"accuracy", "completeness", "conciseness", "relevance", "overall"}
    assert out["details"]["protocol"] == "per-annotator" and out["details"]["rows"] == 2 * len(data)
    assert main(["meta-eval", "--benchmark", "msvd-eval", "--judgments", str(HJ / "msvd_eval.json"),
                 "--scores", str(scores), "--json", "--protocol", "annotator-mean"]) == 0
    mean = json.loads(capsys.readouterr().out)
    assert mean["details"]["protocol"] == "annotator-mean" and mean["tau_b"] != out["tau_b"]
    assert main(["meta-eval", "--benchmark", "msvd-eval", "--judgments", str(HJ / "msvd_eval.json"),
                 "--scores", str(scores), "--protocol", "per-candidate"]) == 2
    assert "no protocol 'per-candidate'" in capsys.readouterr().err


def test_cli_reports_bad_judgments_file(tmp_path, capsys):
    from capreward.cli.main import main

    bad = write_json(tmp_path / "p.json", {"HC": [{"image": "x.jpg", "captions": ["a"], "label": 0}]})
    scores = write_jsonl(tmp_path / "s.jsonl", [{"image": "x.jpg", "caption": "a", "score": 1}])
    assert main(["meta-eval", "--benchmark", "pascal50s", "--judgments", str(bad), "--scores", str(scores)]) == 2
    err = capsys.readouterr().err
    assert "['HC'][0]" in err and "two strings" in err
