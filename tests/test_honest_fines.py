"""No fine for an honest caption (#41 item 3): the guards fine none of the scenes world's true captions
and none of the human-written captions of the human-judgment corpora; the hallucination penalty flags
true captions at its nominal rate and never fines a caption with nothing flagged; the guard holes
(non-adjacent repeats, joined words, the length allowance and its silent fallback, the tiny policy's
unpunctuated captions) are closed. Each assertion here failed on 5b8107d."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from capreward.metaeval.readers import read_flickr8k, read_msvd_eval, read_pascal50s
from capreward.rewards import CompositeReward, Guards, HallucinationPenalty, repetition_penalty, truncation_penalty
from capreward.rewards.guards import TERMINAL_PUNCTUATION, words
from capreward.metrics.token_support import conformal_threshold
from scenes_world import world

REPO = Path(__file__).resolve().parents[1]
HUMAN_JUDGMENTS = next(
    (p / "shared" / "data" / "human_judgments" for p in (REPO.parent, REPO.parent.parent)
     if (p / "shared" / "data" / "human_judgments").is_dir()),
    REPO.parent / "shared" / "data" / "human_judgments",
)


def corpus_captions() -> dict[str, list[str]]:
    """The distinct captions of the human-judgment corpora the project reads: the rated candidates
    through :mod:`capreward.metaeval.readers`, and the references of each file."""
    if not HUMAN_JUDGMENTS.is_dir():
        pytest.skip(f"human judgments not found in {HUMAN_JUDGMENTS}")
    flickr = HUMAN_JUDGMENTS / "flickr8k_expert.json"
    pascal = HUMAN_JUDGMENTS / "pascal50s.json"
    msvd = HUMAN_JUDGMENTS / "msvd_eval.json"
    out = {
        "flickr8k-expert": [r.caption for r in read_flickr8k(flickr).rated]
        + [c for item in json.loads(flickr.read_text()).values() for c in item.get("ground_truth", [])],
        "pascal-50s": [c for p in read_pascal50s(pascal).pairs for c in p.captions]
        + [c for items in json.loads(pascal.read_text()).values() for item in items for c in item["references"]],
        "msvd-eval (machine candidates)": [r.caption for r in read_msvd_eval(msvd).rated],
        "msvd-eval references": [c for item in json.loads(msvd.read_text()).values() for c in item["ref"]],
    }
    return {k: sorted(set(v)) for k, v in out.items()}


def test_the_guards_fine_no_human_caption_of_the_corpora():
    captions = corpus_captions()
    assert sum(map(len, captions.values())) > 20_000
    for name, texts in captions.items():
        fined = [t for t in texts if repetition_penalty(t) < 0]
        if name.startswith("msvd-eval (machine"):
            # the one caption fined is a machine loop: two sentences said ten times over
            assert len(fined) == 1 and fined[0].count("There is a potted plant in the dining room.") >= 8, fined
        else:
            assert fined == [], (name, fined[:5])
        # the truncation guard fines only captions cut off: no terminal punctuation and a last word that
        # cannot end a sentence there ("a man sitting on a sofa with", "red sports car of")
        for t in texts:
            if truncation_penalty(t) < 0:
                assert not t.strip().endswith(TERMINAL_PUNCTUATION) or words(t)[-1] in ("a", "the", "and", "of"), t


def test_the_guards_fine_no_true_scene_caption():
    """1,000 scenes, each true caption in a random order of its groups: no repetition or truncation fine
    (on 5b8107d the bigram guard fined 7.5 % of them: "a red square and a red circle" repeats "a red")."""
    rng = random.Random("honest-scenes")
    captions = [world.true_caption(world.random_scene(rng), rng) for _ in range(1000)]
    assert sum(" a red " in f" {c} " and c.count(" red ") + c.startswith("red ") >= 1 for c in captions) > 0
    guards = Guards()
    fined = [c for c in captions if guards.terms(c)["repetition"] < 0 or guards.terms(c)["truncation"] < 0]
    assert fined == [], fined[:5]
    assert repetition_penalty("a red square and a red circle") == 0.0
    assert repetition_penalty("a man in a red shirt holds a red cup next to a red car") == 0.0  # the old keyword rule


@pytest.mark.parametrize("caption, repeats, n_words", [
    ("a red image red", 1, 4),  # not adjacent: "image" says nothing new
    ("a red image red.", 1, 4),
    ("red\u2060red", 1, 2),  # a word joiner: read "redred", seen by a text encoder as "red" twice
    ("a red\u200bred image", 1, 4),
    ("\u200b".join(["dog"] * 3), 2, 3),
    ("a red car, a red car", 2, 6),  # a phrase restated
    ("a red image. a red image. a red image.", 2, 9),  # a loop of sentences
])
def test_guard_holes_are_closed(caption, repeats, n_words):
    assert repetition_penalty(caption) == pytest.approx(-repeats / n_words)


def test_the_tiny_policys_captions_pass_the_default_guards():
    """The documented tiny policy writes "a <colour> image" without a full stop: the default guards
    cost it nothing (on 5b8107d the truncation guard gave -1 on every GRPO step)."""
    from capreward.testing.colour_task import TASK_COLOURS

    guards = Guards()
    for c in TASK_COLOURS:
        assert sum(guards.terms(f"a {c} image").values()) == 0.0
    assert guards.terms("a red image and")["truncation"] == -1.0  # still cut off


# ------------------------------------------------------------------------------ the penalty
@pytest.fixture(scope="module")
def colour_minima():
    """Each true caption's lowest content-word similarity, as the penalty's calibration reads it, for
    600 held-out colour images (one scorer pass)."""
    from capreward.testing.colour_task import colour_rows
    from capreward.testing.trained_clip import trained_clip_path

    penalty = HallucinationPenalty(model=str(trained_clip_path()))
    rows = colour_rows(600, 7000)
    reports = penalty.reports([f"a {r['colour']} image" for r in rows], [r["image"] for r in rows], kind="image")
    assert all(len(r.similarity) == 1 for r in reports)
    return penalty, rows, np.array([min(r.similarity) for r in reports])


def test_penalty_flags_true_captions_at_the_nominal_rate(colour_minima):
    """Calibrated on n known-good captions at 5 %, the share of *other* known-good captions flagged is
    5 % on average over calibration draws (k / (n + 1) with k = floor(0.05 (n + 1))); on 5b8107d the
    interpolated quantile of 19 captions flagged 9-10 % (and of 16, the demo's, about 10 %)."""
    penalty, rows, minima = colour_minima
    rng = np.random.default_rng(0)
    for n, nominal in ((19, 1 / 20), (64, 3 / 65), (199, 10 / 200)):
        rates = []
        for _ in range(200):
            order = rng.permutation(len(minima))
            threshold = conformal_threshold(minima[order[:n]], 0.05)
            rates.append(float(np.mean(minima[order[n:]] < threshold)))
        assert statistics.fmean(rates) == pytest.approx(nominal, abs=0.01), (n, statistics.fmean(rates))
        assert nominal <= 0.05
    # the penalty's own calibrate is that order statistic of the captions' minima
    sub = rows[:19]
    threshold = penalty.calibrate([f"a {r['colour']} image" for r in sub], [r["image"] for r in sub], kind="image")
    assert threshold == pytest.approx(float(np.sort(minima[:19])[0]))
    with pytest.raises(ValueError, match="at least 19 known-good"):
        penalty.calibrate([f"a {r['colour']} image" for r in rows[:16]], [r["image"] for r in rows[:16]], kind="image")


def test_no_penalty_with_nothing_flagged(colour_minima):
    """With an idf corpus where every word is frequent (a small manifest's ``--idf auto``), a right
    caption's content is still judged: 0, not the empty penalty (on 5b8107d: -0.5 with nothing flagged)."""
    from capreward.testing import colour_image
    from capreward.testing.trained_clip import trained_clip_path

    small = ["a red image", "a red image", "a red image"]  # every word in every caption: idf 0
    penalty = HallucinationPenalty(model=str(trained_clip_path()), idf=small, threshold=colour_minima[2].min() - 0.01)
    red = colour_image("red")
    out = penalty.compute(None, ["a red image.", "a blue image.", "an image."], image=[red] * 3)
    assert out.values[0] == 0.0 and out.metrics["unsupported_tokens"][0] == 0.0
    assert out.values[1] < 0 and out.metrics["unsupported_tokens"][1] >= 1.0
    report = penalty.reports(["a red image."], [red], kind="image")[0]
    assert report.tokens and not report.flagged
    # a fine comes with a flagged word, or with no content word at all
    for caption, value, (content, flagged) in zip(["a red image.", "a blue image.", "an image."], out.values,
                                                  zip(out.metrics["content_tokens"], out.metrics["unsupported_tokens"])):
        assert value == 0.0 or flagged > 0 or content == 0, caption


def test_composite_with_a_length_target_names_the_missing_target():
    def fixed(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    comp = CompositeReward([(fixed, 1.0, (0.0, 1.0))], guards=Guards(length_target="references"))
    out = comp.compute(None, ["a dog runs."], references=[None])
    assert out.values == [None] and "length_fallback" in str(out.reasons[0])
