"""CompositeReward and its guards: hand-computed values, None handling, logging, real components."""

from __future__ import annotations

import asyncio
import math
import pickle

import pytest
import torch

from capreward.rewards import (
    CompositeReward,
    EMScoreReward,
    Guards,
    HallucinationPenalty,
    length_penalty,
    repetition_penalty,
    truncation_penalty,
)
from capreward.rewards.guards import words

from conftest import random_video
from test_rewards import trl_is_async, trl_name, trl_rewards

pytestmark = pytest.mark.integration  # run by scripts/version_matrix.sh at both ends


# ------------------------------------------------------------------------------ guards by hand
def test_words_split():
    assert words("A man's dog, running!") == ["a", "man's", "dog", "running"]


def test_repetition_penalty_by_hand():
    # 8 words -> 7 bigrams, 3 distinct (a dog / dog and / and a) -> 4 repeat an earlier one
    assert repetition_penalty("a dog and a dog and a dog", 2) == pytest.approx(-4 / 7)
    assert repetition_penalty("a man rides a horse", 2) == 0.0
    assert repetition_penalty("red red red red", 1) == pytest.approx(-3 / 4)
    assert repetition_penalty("dog", 2) == 0.0
    with pytest.raises(ValueError):
        repetition_penalty("x", 0)


def test_truncation_penalty_by_hand():
    assert truncation_penalty("A man rides a horse.") == 0.0
    assert truncation_penalty("Is it a horse?") == 0.0
    assert truncation_penalty("a man rides a horse") == -1.0  # no terminal punctuation
    assert truncation_penalty("a man rides a horse", require_punctuation=False) == 0.0
    assert truncation_penalty("a man sitting down", require_punctuation=False) == 0.0
    assert truncation_penalty("a man and the", require_punctuation=False) == -1.0  # dangling article
    assert truncation_penalty("a man is riding a.") == -1.0
    assert truncation_penalty("   ") == -1.0


def test_length_penalty_by_hand():
    text = " ".join(["word"] * 45)
    assert length_penalty(text, 40) == pytest.approx(-5 / 40)
    assert length_penalty(text, 40, scale=10) == pytest.approx(-0.5)
    assert length_penalty(text, 45) == 0.0
    assert length_penalty(" ".join(["w"] * 200), 40) == -1.0


def test_guard_terms_weighted_and_disabled():
    g = Guards(repetition=0.5, ngram=1, truncation=2.0, length=0.0)
    assert g.terms("dog dog") == {"repetition": pytest.approx(-0.25), "truncation": -2.0}


# ------------------------------------------------------------------------------ composite math
def fixed(name, values):
    def reward(prompts, completions, **kwargs):
        return list(values)

    reward.__name__ = name
    return reward


def test_weighted_sum_and_none_policies_by_hand():
    a = fixed("a", [0.5, None, 0.2, None])
    b = fixed("b", [1.0, 0.4, None, None])
    completions = ["x.", "y.", "z.", "w."]
    strict = CompositeReward([(a, 2.0), (b, -1.0)], guards=None)
    assert strict(None, completions) == [pytest.approx(2 * 0.5 - 1.0), None, None, None]
    renorm = CompositeReward([(a, 2.0), (b, -1.0)], guards=None, on_none="renormalize")
    values = renorm(None, completions)
    assert values[0] == pytest.approx(0.0)
    assert values[1] == pytest.approx(-0.4 * 3 / 1)  # only b: scaled by (|2| + |-1|) / |-1|
    assert values[2] == pytest.approx(2 * 0.2 * 3 / 2)
    assert values[3] is None
    out = strict.compute(None, completions)
    assert out.reasons[1] == "a: returned None" and out.reasons[3] == "a: returned None; b: returned None"


def test_guards_add_terms_and_log_each_separately():
    a = fixed("a", [0.5, 0.5, 0.5])
    completions = ["a dog runs.", "a dog a dog a dog", " ".join(["cat"] * 50) + "."]
    comp = CompositeReward([(a, 1.0)], guards=Guards(max_words=40), name="caption_reward")
    logged = {}
    values = comp(None, completions, log_metric=logged.__setitem__)
    rep1 = repetition_penalty(completions[1], 2)
    rep2 = repetition_penalty(completions[2], 2)
    assert values[0] == pytest.approx(0.5)
    assert values[1] == pytest.approx(0.5 + rep1 - 1.0)  # repeated and unpunctuated
    assert values[2] == pytest.approx(0.5 + rep2 - 10 / 40)
    assert comp.__name__ == "caption_reward"
    assert logged["rewards/caption_reward/a"] == pytest.approx(0.5)
    assert logged["rewards/caption_reward/guard/repetition"] == pytest.approx((rep1 + rep2) / 3)
    assert logged["rewards/caption_reward/guard/truncation"] == pytest.approx(-1 / 3)
    assert logged["rewards/caption_reward/guard/length"] == pytest.approx(-10 / 40 / 3)
    assert logged["rewards/caption_reward/unscored_frac"] == 0.0


def test_constructor_checks_and_duplicate_names():
    a = fixed("a", [0.0])
    with pytest.raises(ValueError, match="on_none"):
        CompositeReward([a], on_none="skip")
    with pytest.raises(ValueError, match="at least one"):
        CompositeReward([])
    with pytest.raises(TypeError, match=r"components\[1\]"):
        CompositeReward([a, (3, 1.0)])
    async def async_reward(prompts, completions, **kwargs):
        return [0.0]

    with pytest.raises(TypeError, match="async"):
        CompositeReward([async_reward])
    comp = CompositeReward([a, (a, 2.0)], guards=None)
    assert [label for label, _, _ in comp.components] == ["a", "a_2"]
    assert comp(None, ["x."]) == [0.0]


# ------------------------------------------------------------------------------ real components
@pytest.fixture(scope="module")
def components(tiny_clip_path):
    model = str(tiny_clip_path)
    em = EMScoreReward(model=model)
    hp = HallucinationPenalty(backbone=em.scorer.backbone, threshold=0.0)
    return em, hp


def test_composite_of_real_rewards_through_trl(components, tmp_path):
    em, hp = components
    comp = CompositeReward([(em, 1.0), (hp, 0.5)], guards=Guards(max_words=12))
    videos = [random_video(0), random_video(0), random_video(1), str(tmp_path / "missing.mp4")]
    completions = [
        [{"role": "assistant", "content": t}]
        for t in ["a man cooks food.", "a man a man a man a man", "two dogs play in a park.", "a cat sleeps."]
    ]
    inputs = [{"prompt": "Describe.", "video": v} for v in videos]
    rewards, trainer = trl_rewards([comp], inputs, completions)
    em_v = em(None, completions[:3], video=videos[:3])
    hp_v = hp(None, completions[:3], video=videos[:3])
    texts = [c[0]["content"] for c in completions]
    guards = [sum(Guards(max_words=12).terms(t).values()) for t in texts[:3]]
    expected = [e + 0.5 * h + g for e, h, g in zip(em_v, hp_v, guards)]
    assert rewards[:3, 0].tolist() == pytest.approx(expected, rel=1e-5)
    assert math.isnan(rewards[3, 0])
    reason = trainer.extra["composite/error"][3]
    assert "emscore:" in reason and "missing.mp4" in reason and "hallucination:" in reason
    for key in ("emscore", "hallucination", "guard/repetition", "guard/truncation", "emscore/video/fine_p"):
        assert f"rewards/composite/{key}" in trainer.metrics, key
    assert trainer.metrics["rewards/composite/unscored_frac"] == [pytest.approx(0.25)]


def test_composite_pickles_and_async_matches(components):
    em, hp = components
    comp = CompositeReward([(em.as_async(), 1.0), (hp, 0.5)])  # an async part is run synchronously
    assert comp.components[0][1] is em
    videos = [random_video(2)] * 2
    texts = ["a man cooks food.", "a woman sings"]
    sync_values = comp(None, texts, video=videos)
    assert asyncio.run(comp.as_async()(None, texts, video=videos)) == sync_values
    clone = pickle.loads(pickle.dumps(comp))
    assert clone(None, texts, video=videos) == pytest.approx(sync_values, rel=1e-6)

    assert trl_name(comp) == "composite" and trl_is_async(comp.as_async())
    assert not isinstance(comp, torch.nn.Module)
