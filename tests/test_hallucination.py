"""HallucinationPenalty: the pure math by hand, properties on real alignments, TRL contract, and the
foil behaviour with a CLIP trained on colour words."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capreward.rewards import HallucinationPenalty
from capreward.rewards.support import STOP_WORDS, conformal_threshold, content_mask, support_report
from capreward.scorers.emscore import TokenAlignment

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)
from conftest import random_video, sample_clips


# ------------------------------------------------------------------------------ pure math
def test_content_mask_ignores_specials_punctuation_and_function_words():
    tokens = ["<sos>", "a", "man", "is", "riding", "the", "horse", ".", "<eos>"]
    assert content_mask(tokens) == [False, False, True, False, True, False, True, False, False]
    # with idf weights, frequency decides: "man" here is as frequent as a function word
    weights = [1.0, 0.1, 0.5, 0.2, 2.0, 0.1, 3.0, 0.1, 1.5]
    assert content_mask(tokens, weights, idf_threshold=0.6) == [False, False, False, False, True, False, True, False, False]


def test_support_report_by_hand():
    tokens = ["<sos>", "a", "red", "dog", "runs", "<eos>"]
    sims = [0.9, 0.1, 0.30, 0.15, 0.25, 0.9]
    content = content_mask(tokens)
    r = support_report(tokens, sims, 0.2, content)
    assert r.tokens == ["red", "dog", "runs"] and r.flagged == ["dog"]
    assert r.index == [2, 3, 4] and r.flagged_index == [3]  # positions in the full token list (SOS at 0)
    assert r.penalty == pytest.approx(-1 / 3)
    # idf weights: dog carries 2 of the 2 + 1 + 1 content weight
    w = [1.0, 0.1, 1.0, 2.0, 1.0, 1.0]
    assert support_report(tokens, sims, 0.2, content, w).penalty == pytest.approx(-2 / 4)
    assert support_report(tokens, sims, 0.31, content).penalty == -1.0
    assert support_report(tokens, sims, 0.15, content).penalty == 0.0  # strictly below the threshold
    # no content token: nothing unsupported
    assert support_report(["<sos>", "the", "<eos>"], [0.0, -1.0, 0.0], 0.5, [False] * 3).penalty == 0.0
    assert support_report(["<sos>", "the", "<eos>"], [0.0, -1.0, 0.0], 0.5, [False] * 3, empty_penalty=-1.0).penalty == -1.0
    with pytest.raises(ValueError, match="one entry per token"):
        support_report(tokens, sims[:-1], 0.2, content)
    # count pricing: each unsupported content token costs claim_cost, weights aside
    assert support_report(tokens, sims, 0.2, content, w, claim_cost=0.5).penalty == -0.5
    assert support_report(tokens, sims, 0.26, content, claim_cost=0.5).penalty == -1.0  # dog and runs: 2 x 0.5
    assert support_report(tokens, sims, 0.26, content, claim_cost=0.25).penalty == -0.5
    for bad in (0.0, 1.5, -0.1, "0.5"):
        with pytest.raises(ValueError, match="claim_cost"):
            support_report(tokens, sims, 0.2, content, claim_cost=bad)


def test_count_pricing_does_not_dilute_a_false_word():
    """One unsupported word after n supported ones: the fraction's cost falls as 1/(n+1), the count's
    stays claim_cost (fails on the fraction-only math of 5b8107d: no claim_cost)."""
    def caption(n):
        tokens = ["<sos>"] + ["red"] * n + ["blue", "<eos>"]
        return tokens, [0.9] + [0.5] * n + [0.1, 0.9], content_mask(tokens)

    costs = {n: support_report(*caption(n)[:2], 0.2, caption(n)[2], claim_cost=0.5).penalty for n in (0, 4, 80)}
    assert costs == {0: -0.5, 4: -0.5, 80: -0.5}
    assert support_report(*caption(80)[:2], 0.2, caption(80)[2]).penalty == pytest.approx(-1 / 81)  # the average


def test_conformal_threshold():
    # n = 20, rate 0.1: k = floor(2.1) = 2, the second smallest
    scores = [0.5, 0.1, 0.4, 0.3, 0.2, 0.05, 0.6, 0.7, 0.8, 0.9, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 1.0]
    assert conformal_threshold(scores, 0.1) == 0.1
    assert conformal_threshold(scores, 0.0) == 0.05  # the minimum: nothing known-good below it
    assert conformal_threshold(list(range(199)), 0.05) == 9.0  # k = floor(0.05 * 200) = 10
    with pytest.raises(ValueError, match="at least 19 known-good"):
        conformal_threshold(scores[:18], 0.05)  # k = floor(0.95) = 0: the rate cannot be held
    assert conformal_threshold(scores[:19], 0.05) == 0.05
    with pytest.raises(ValueError, match="no content tokens"):
        conformal_threshold([], 0.05)
    with pytest.raises(ValueError, match="rate"):
        conformal_threshold([0.1], 1.5)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), rate=st.floats(0.01, 0.5), seed=st.integers(0, 2**16))
def test_conformal_threshold_flags_at_most_the_rate_in_rank(n, rate, seed):
    """Exchangeability by construction: over every position of a new item among n + 1 distinct scores, the
    share that falls strictly below the threshold computed from the other n is k / (n + 1) <= rate."""
    rng = np.random.default_rng(seed)
    pool = rng.permutation(n + 1).astype(float)
    k = math.floor(rate * (n + 1))
    if k < 1:
        with pytest.raises(ValueError, match="known-good"):
            conformal_threshold(pool[:n], rate)
        return
    below = sum(pool[j] < conformal_threshold(np.delete(pool, j), rate) for j in range(n + 1))
    assert below == k and below / (n + 1) <= rate + 1e-12


@settings(max_examples=60, deadline=None)
@given(
    sims=st.lists(st.floats(-1, 1), min_size=1, max_size=12),
    t1=st.floats(-1.1, 1.1),
    t2=st.floats(-1.1, 1.1),
    data=st.data(),
)
def test_penalty_in_range_and_monotone_in_threshold(sims, t1, t2, data):
    content = data.draw(st.lists(st.booleans(), min_size=len(sims), max_size=len(sims)))
    weights = data.draw(st.lists(st.floats(0, 5), min_size=len(sims), max_size=len(sims)))
    tokens = [f"w{j}" for j in range(len(sims))]
    lo, hi = sorted((t1, t2))
    for w in (None, weights):
        p_lo = support_report(tokens, sims, lo, content, w).penalty
        p_hi = support_report(tokens, sims, hi, content, w).penalty
        assert -1.0 <= p_hi <= p_lo <= 0.0  # a higher bar flags at least as much


# ------------------------------------------------------------------------------ on real alignments
@pytest.fixture(scope="module")
def penalty(tiny_clip_path):
    return HallucinationPenalty(model=str(tiny_clip_path))


CAPTIONS = ["a man is cooking in the kitchen.", "the dog and the cat are on a sofa", "people dancing"]


def test_thresholds_order_penalties_and_function_words_never_flagged(penalty):
    videos = [random_video(i) for i in range(3)]
    alignments = penalty.alignments(CAPTIONS, videos)
    all_sims = [s for a in alignments for s in a.similarity]
    for a in alignments:
        strict = penalty.report_for(a, threshold=max(all_sims) + 1)
        lenient = penalty.report_for(a, threshold=min(all_sims) - 1)
        mid = penalty.report_for(a, threshold=float(np.median(all_sims)))
        assert strict.penalty == -1.0 and lenient.penalty == 0.0
        assert strict.penalty <= mid.penalty <= lenient.penalty
        # every flagged token is a content word: function words and punctuation never count
        assert strict.tokens and not set(strict.tokens) & STOP_WORDS
        assert all(any(ch.isalpha() for ch in t) for t in strict.tokens)
    # the penalty is exactly claim_cost per content token below the threshold, read off the alignment
    a = alignments[0]
    threshold = float(np.median(all_sims))
    content = [t for t in a.tokens if t in {"man", "cooking", "kitchen"}]
    sims = {t: s for t, s in zip(a.tokens, a.similarity)}
    expected = -min(1.0, 0.5 * sum(sims[t] < threshold for t in content))
    assert penalty.report_for(a, threshold).penalty == pytest.approx(expected)


def test_calibrate_sets_a_conformal_order_statistic_of_good_captions(penalty):
    videos = [random_video(i) for i in range(3)]
    p = pickle.loads(pickle.dumps(penalty))
    low = p.calibrate(CAPTIONS, videos, quantile=0.0)
    assert all(r.penalty == 0.0 for r in p.reports(CAPTIONS, videos))  # nothing below the minimum
    sims = [r.similarity for r in p.reports(CAPTIONS, videos)]
    assert low == min(min(s) for s in sims)
    # per caption (default): each caption's lowest content similarity is one score; 3 captions hold a
    # rate of 0.5 (k = floor(0.5 * 4) = 2: the second lowest caption minimum)
    assert p.calibrate(CAPTIONS, videos, quantile=0.5) == sorted(min(s) for s in sims)[1]
    # per token: every content token is one score (8 of them: k = floor(0.5 * 9) = 4)
    assert p.calibrate(CAPTIONS, videos, quantile=0.5, unit="token") == sorted(x for s in sims for x in s)[3]
    with pytest.raises(ValueError, match="known-good"):
        p.calibrate(CAPTIONS, videos, quantile=0.05)  # three captions cannot hold 5 %
    with pytest.raises(ValueError, match="unit"):
        p.calibrate(CAPTIONS, videos, unit="word")


def test_trl_contract_values_and_bad_inputs(penalty, tmp_path):
    videos = [random_video(i) for i in range(3)]
    penalty.threshold = 0.0
    expected = [r.penalty for r in penalty.reports(CAPTIONS, videos)]
    logged = {}
    conv = [[{"role": "assistant", "content": c}] for c in CAPTIONS]
    values = penalty(None, conv, video=videos, log_metric=logged.__setitem__)
    assert values == pytest.approx(expected)
    assert all(-1.0 <= v <= 0.0 for v in values)
    assert logged["rewards/hallucination/content_tokens"] == pytest.approx((3 + 3 + 2) / 3)
    bad = penalty(None, ["a cat.", "", "a dog."], video=[videos[0], videos[1], str(tmp_path / "nope.mp4")])
    assert bad[0] is not None and bad[1] is None and bad[2] is None
    assert penalty(None, ["a cat."], references=[["a cat"]]) == [None]  # references alone do not say what is visible


def test_idf_decides_function_words(tiny_clip_path):
    corpus = ["a man in a kitchen", "a dog on a sofa", "a woman on a horse", "a car in a street"]
    p = HallucinationPenalty(model=str(tiny_clip_path), idf=corpus, threshold=10.0)  # flag every content token
    report = p.reports(["a man on a horse"], [random_video(0)])[0]
    # "a" is in every caption (idf ln(5/5) = 0), "on" in two (ln(5/3) < ln 2): not content
    assert report.tokens == ["man", "horse"] and report.penalty == -1.0


def test_report_for_a_constructed_alignment(penalty):
    a = TokenAlignment(
        tokens=["<sos>", "a", "purple", "elephant", "<eos>"],
        token_ids=[0, 1, 2, 3, 4],
        best_frame=[0, 0, 1, 2, 0],
        similarity=[0.9, 0.05, 0.31, 0.12, 0.8],
        weight=[1.0] * 5,
    )
    report = penalty.report_for(a, threshold=0.2)
    assert report.flagged == ["elephant"] and report.penalty == pytest.approx(-0.5)
    assert report.flagged_index == [3] and a.tokens[3] == "elephant"


# ------------------------------------------------------------------------------ foils, trained CLIP
@pytest.mark.slow
def test_foil_captions_on_sample_clips_with_a_colour_clip():
    """Colour-tinted frames of the sample clips; true caption names the tint, the foil swaps the colour.
    The threshold is calibrated on other true captions of the same clips (5% quantile). Calibration
    captions name the colour before every other content word: this CLIP only knows colour words, and
    under its causal text tower a word before the colour ("the picture is red") has not seen it, so its
    similarity is meaningless and would drag the quantile down. Generic words ("image", "picture") are
    not content, so the calibration's content words are its 12 colour words alone and any quantile above
    0 flags the least similar correct one by construction: the threshold is their minimum (quantile 0)."""
    from capreward.media import load_video
    from capreward.testing.colour_task import colour_foils
    from capreward.testing.trained_clip import COLOURS, trained_clip_path

    clips = sample_clips()
    if not clips:
        pytest.skip("sample clips not available")
    task = colour_foils([load_video(c, frames=6) for c in clips], colours=list(COLOURS))
    videos, truth, foils, calib = task.videos, task.truth, task.foils, task.calibration
    p = HallucinationPenalty(model=str(trained_clip_path()), frames=None)
    threshold = p.calibrate(calib, videos, quantile=0.0)
    true_reports, foil_reports = p.reports(truth, videos), p.reports(foils, videos)
    true_pen = np.array([r.penalty for r in true_reports])
    foil_pen = np.array([r.penalty for r in foil_reports])
    # every foil is penalised more than its true caption, and its swapped colour word is flagged
    assert (foil_pen < true_pen).all(), (true_pen, foil_pen, threshold)
    for r, caption in zip(foil_reports, foils):
        assert caption.split()[1] in r.flagged
    for r, caption in zip(true_reports, truth):
        assert caption.split()[1] not in r.flagged
    assert true_pen.mean() > -0.1 and (foil_pen <= -0.5).all()  # one false word costs claim_cost (0.5)
    # the same through the reward call
    values = p(None, foils[:2] + truth[:2], video=videos[:2] * 2)
    assert values == pytest.approx(list(foil_pen[:2]) + list(true_pen[:2]))
