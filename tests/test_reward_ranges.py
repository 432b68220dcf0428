"""Ranges promised are ranges kept: the scorers stay faithful (their F-measures can leave the nominal
range), every reward clips to the range its docstring states and counts what it clipped. (With the
default sign-safe harmonic mean the EMScore and RefCLIP-S rewards need no clipping: see
test_sign_safe_rewards.py; with ``harmonic_mean="released"`` they clip as below.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from capreward.rewards import (
    CLIPScoreReward,
    CompositeReward,
    EMScoreReward,
    FLEURReward,
    GVEvalReward,
    Guards,
    HallucinationPenalty,
    PACScoreReward,
    RewardFunction,
    RewardOutput,
    VisCE2Reward,
)
from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore

# Found by scanning punctuation strings with the seed-0 tiny CLIP (values asserted below, so a change of
# the tiny model shows up as a failed precondition, not as a vacuous pass).
EMSCORE_ESCAPEE = ') the " a the = " a $ &'
REFCLIP_ESCAPEE = "'2\"0?59(~/{:@00?"
REFCLIP_REFERENCE = ":["


def _image_and_video():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    video = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    return image, video


@pytest.fixture(scope="module")
def scorers(tiny_backbone):
    return EMScore(backbone=tiny_backbone), CLIPScore(backbone=tiny_backbone, prefix="")


def test_emscore_leaves_its_range_and_the_released_reward_clips_and_counts(scorers):
    em, _ = scorers
    _, video = _image_and_video()
    captions = [EMSCORE_ESCAPEE, "a dog on the grass."]
    raw = em.score(captions, videos=[video, video]).video
    p, r, f = float(raw.fine_p[0]), float(raw.fine_r[0]), float(raw.full_f[0])
    assert p * r < 0 and abs(f) > 1, "precondition: P and R of opposite signs take F outside [-1, 1]"
    assert -1 <= float(raw.full_f[1]) <= 1

    reward = EMScoreReward(scorer=em, harmonic_mean="released")
    logged = {}
    values = reward(None, captions, video=[video, video], log_metric=logged.__setitem__)
    assert values[0] == math.copysign(1.0, f)
    assert values[1] == pytest.approx(float(raw.full_f[1]), abs=1e-6)  # in range: untouched
    assert logged["rewards/emscore/clipped"] == 1.0
    assert reward.compute(None, captions, video=[video, video]).clipped == [0]
    # the default (sign-safe) reward: F = min(P, R) when the signs differ, in range, nothing clipped
    logged = {}
    safe = EMScoreReward(scorer=em)(None, captions, video=[video, video], log_metric=logged.__setitem__)
    for i in range(2):
        fp, fr, coarse = float(raw.fine_p[i]), float(raw.fine_r[i]), float(raw.coarse[i])
        fine = 2 * fp * fr / (fp + fr) if fp > 0 and fr > 0 else min(fp, fr)
        assert safe[i] == pytest.approx((fine + coarse) / 2, abs=1e-6)
    assert logged["rewards/emscore/clipped"] == 0.0


def test_refclip_s_leaves_its_range_and_the_released_reward_clips(scorers):
    _, cs = scorers
    image, _ = _image_and_video()
    captions = [REFCLIP_ESCAPEE, "a red square"]
    refs = [[REFCLIP_REFERENCE], ["a red square"]]
    raw = cs.score(captions, images=[image, image], references=refs)
    assert float(raw.ref_similarity[0]) < 0 and not 0 <= float(raw.ref_clip_s[0]) <= cs.w, "precondition"

    reward = CLIPScoreReward(scorer=cs, harmonic_mean="released")
    assert reward.value_range() == (0.0, 2.5)
    out = reward.compute(None, captions, image=[image, image], references=refs)
    assert out.values[0] == (0.0 if float(raw.ref_clip_s[0]) < 0 else 2.5)
    assert out.values[1] == pytest.approx(float(raw.ref_clip_s[1]), abs=1e-6)
    assert out.clipped == [0] and out.metrics["clipped"] == [1.0, 0.0]
    # the default (sign-safe) reward: the negative reference cosine itself, inside [-1, 2.5]
    safe = CLIPScoreReward(scorer=cs)
    assert safe.value_range() == (-1.0, 2.5)
    out = safe.compute(None, captions, image=[image, image], references=refs)
    assert out.values[0] == pytest.approx(float(raw.ref_similarity[0]), abs=1e-6) and out.clipped == []
    assert out.values[1] == pytest.approx(float(raw.ref_clip_s[1]), abs=1e-6)


def test_every_reward_states_a_range():
    assert EMScoreReward().value_range() == (-1.0, 1.0)
    assert CLIPScoreReward().value_range() == (-1.0, 2.5)  # RefCLIP-S with a negative reference cosine
    assert CLIPScoreReward(use_references=False).value_range() == (0.0, 2.5)
    assert CLIPScoreReward(harmonic_mean="released").value_range() == (0.0, 2.5)
    assert CLIPScoreReward(w=3.0).value_range() == (-1.0, 3.0)
    assert CLIPScoreReward(w=0.5).value_range() == pytest.approx((-1.0, 2 * 0.5 / 1.5))
    assert PACScoreReward(model="unused.pt").value_range() == (-1.0, 2.0)
    assert FLEURReward().value_range() == (0.0, 1.0)
    assert VisCE2Reward().value_range() == (0.0, 1.0)
    assert GVEvalReward(scale=1.0).value_range() == (0.0, 100.0)
    assert HallucinationPenalty().value_range() == (-1.0, 0.0)
    composite = CompositeReward(
        [(EMScoreReward(), 2.0), (CLIPScoreReward(), -1.0)], guards=Guards(length=0.5), allow_negative_weights=True
    )
    # 2*[-1, 1] + (-1)*[-1, 2.5] + repetition [-1, 0] + truncation [-1, 0] + length [-0.5, 0] + injection [-1, 0]
    assert composite.value_range() == (-2.0 - 2.5 - 3.5, 2.0 + 1.0)
    assert CompositeReward([lambda prompts, completions, **kw: [0.0] * len(completions)]).value_range() is None


class AlwaysNone(RewardFunction):
    """A reward in [0, 1] that never scores (a judge whose server is down)."""

    __name__ = "always_none"

    def value_range(self):
        return (0.0, 1.0)

    def compute(self, prompts, completions, **kwargs):
        return RewardOutput([None] * len(completions), ["server down"] * len(completions))


def test_composite_renormalisation_is_clipped_to_the_composite_range(scorers):
    em, _ = scorers
    _, video = _image_and_video()
    # -EMScore (weight -1) + a reward that is always None (weight 3): "renormalize" scales -EMScore by 4,
    # which leaves the composite's range -[-1, 1] + 3 [0, 1] = [-1, 4] below -1 (never above the floor,
    # -EMScore + 3 * 0: a missing judgment never pays).
    released = EMScoreReward(scorer=em, harmonic_mean="released")  # the F that leaves [-1, 1]
    composite = CompositeReward(
        [(released, -1.0), (AlwaysNone(), 3.0)], guards=None, on_none="renormalize", allow_negative_weights=True
    )
    lo, hi = composite.value_range()
    assert (lo, hi) == (-1.0, 4.0)
    captions = ["a dog.", EMSCORE_ESCAPEE, "grass"]
    alone = released.compute(None, captions, video=[video] * 3).values
    out = composite.compute(None, captions, video=[video] * 3)
    assert any(not lo <= min(-4 * a, -a) <= hi for a in alone), "precondition: renormalisation leaves the range"
    for value, a in zip(out.values, alone):
        assert value == pytest.approx(min(max(min(-4 * a, -a), lo), hi), abs=1e-5)
    assert out.clipped == [i for i, a in enumerate(alone) if not lo <= min(-4 * a, -a) <= hi]
    logged = {}
    composite.report(out, log_metric=logged.__setitem__)
    assert logged["rewards/composite/clipped"] == float(len(out.clipped))


def test_reward_parameters_are_validated_at_construction():
    """Round 3: CLIPScoreReward(w=-2.5) inverted CLIP-S, w=nan left every sample unscored."""
    for bad in (-2.5, 0.0, math.nan, math.inf, "2.5"):
        with pytest.raises(ValueError, match="w must be a finite number > 0"):
            CLIPScoreReward(w=bad)
    assert CLIPScoreReward(w=1.0).value_range() == (-1.0, 1.0)
