"""Rewards no sign artefact can hack (issue 20, item 4).

EMScore's F = 2PR/(P+R) and RefCLIP-S's harmonic mean explode and change sign when their two parts
have opposite signs; clipped to the reward's range, the explosion became the top reward for a wrong
caption ("a yellow image." on a red image: +1.0 against 0.872 for "a red image."). The rewards use the
sign-safe harmonic mean H(a, b) = 2ab/(a+b) if a > 0 and b > 0 else min(a, b); the scorers keep the
released formula, and the rewards offer it as ``harmonic_mean="released"``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capreward.caption_reading import as_read, read_caption
from capreward.metrics.clipscore import ref_clip_s
from capreward.metrics.harmonic import harmonic_mean, released_harmonic_mean, sign_safe_harmonic_mean
from capreward.rewards import (
    CLIPScoreReward,
    CompositeReward,
    EMScoreReward,
    HallucinationPenalty,
    PACScoreReward,
)
from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore, group_max
from capreward.scorers.results import MatchScores

unit = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False, width=32)
step = st.floats(min_value=0.0, max_value=2.0, allow_nan=False, width=32)


def t(x: float) -> torch.Tensor:
    return torch.tensor([x], dtype=torch.float32)


# ------------------------------------------------------------------------------ the pure function
def test_sign_safe_mean_by_hand():
    assert sign_safe_harmonic_mean(t(0.5), t(0.25)).item() == pytest.approx(2 * 0.125 / 0.75)
    assert sign_safe_harmonic_mean(t(-0.6), t(0.46)).item() == pytest.approx(-0.6)  # released: 3.45
    assert released_harmonic_mean(t(-0.6), t(0.46)).item() == pytest.approx(2 * -0.6 * 0.46 / -0.14)
    assert sign_safe_harmonic_mean(t(0.0), t(0.7)).item() == 0.0
    assert sign_safe_harmonic_mean(t(-0.2), t(-0.7)).item() == pytest.approx(-0.7)
    assert harmonic_mean("sign-safe") is sign_safe_harmonic_mean
    assert harmonic_mean("released") is released_harmonic_mean
    with pytest.raises(ValueError, match="harmonic_mean must be one of"):
        harmonic_mean("geometric")


@settings(max_examples=300, deadline=None)
@given(a=unit, b=unit, da=step, db=step)
def test_sign_safe_mean_stays_between_its_parts_and_never_decreases(a, b, da, db):
    h = sign_safe_harmonic_mean(t(a), t(b)).item()
    assert min(a, b) - 1e-6 <= h <= max(a, b) + 1e-6
    assert h == pytest.approx(sign_safe_harmonic_mean(t(b), t(a)).item(), abs=1e-7)
    up_a = sign_safe_harmonic_mean(t(a + da), t(b)).item()
    up_b = sign_safe_harmonic_mean(t(a), t(b + db)).item()
    assert up_a >= h - 1e-6 and up_b >= h - 1e-6
    if a > 0 and b > 0:
        assert h == pytest.approx(released_harmonic_mean(t(a), t(b)).item(), rel=1e-5, abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(a=st.floats(min_value=1e-4, max_value=1.0), b=unit)
def test_sign_safe_mean_is_continuous_where_its_branches_meet(a, b):
    """Approaching a = 0 (or b = 0) from the positive side gives the min branch's value there."""
    for eps in (1e-3, 1e-5):
        assert sign_safe_harmonic_mean(t(eps), t(a)).item() == pytest.approx(
            sign_safe_harmonic_mean(t(0.0), t(a)).item(), abs=2 * eps)
    if b > 0:
        assert sign_safe_harmonic_mean(t(a), t(b)).item() >= 0


def test_sign_safe_mean_has_finite_gradients_everywhere():
    a = torch.tensor([0.3, -0.3, 0.0, 0.5, -0.5], requires_grad=True)
    b = torch.tensor([-0.3, 0.3, 0.0, 0.5, 0.5], requires_grad=True)  # a + b == 0 in three places
    sign_safe_harmonic_mean(a, b).sum().backward()
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


# --------------------------------------------------------------- the rewards' F over random P and R
@settings(max_examples=200, deadline=None)
@given(p=unit, r=unit, coarse=unit, rp=unit, rr=unit, rc=unit, dp=step, dr=step)
def test_emscore_reward_fields_stay_in_range_and_never_decrease_in_p_or_r(p, r, coarse, rp, rr, rc, dp, dr):
    """Every field of the reward (fine_f, full_f; video, reference over two references, combined),
    formed as the EMScore reward forms it, lies in [-1, 1] and does not decrease when the video's P or R
    (clamped to 1) grows."""
    mean = sign_safe_harmonic_mean

    def fields(p, r):
        video = MatchScores.from_parts(t(coarse), t(p), t(r), mean(t(p), t(r)))
        owner = torch.tensor([0, 0])
        ref_p, ref_r, ref_c = torch.tensor([rp, p]), torch.tensor([rr, r]), torch.tensor([rc, coarse])
        parts = (ref_c, ref_p, ref_r, mean(ref_p, ref_r))
        reference = MatchScores.from_parts(*(group_max(v, owner, 1) for v in parts))
        combined = MatchScores.average(video, reference)
        return [float(getattr(s, f)) for s in (video, reference, combined) for f in ("fine_f", "full_f")]

    base = fields(p, r)
    assert all(-1.0 <= v <= 1.0 for v in base), base
    for grown in (fields(min(1.0, p + dp), r), fields(p, min(1.0, r + dr))):
        assert all(g >= b - 1e-6 for g, b in zip(grown, base)), (base, grown)


@settings(max_examples=200, deadline=None)
@given(cos=unit, sim=unit, dc=step, ds=step, w=st.sampled_from([2.5, 2.0, 0.5]))
def test_refclip_s_reward_stays_in_range_and_never_decreases(cos, sim, dc, ds, w):
    reward = CLIPScoreReward(w=w)
    lo, hi = reward.value_range()

    def value(cos, sim):
        return ref_clip_s(w * t(cos).clamp_min(0), t(sim), sign_safe_harmonic_mean).item()

    v = value(cos, sim)
    assert lo - 1e-6 <= v <= hi + 1e-6
    assert value(min(1.0, cos + dc), sim) >= v - 1e-6
    assert value(cos, min(1.0, sim + ds)) >= v - 1e-6


# ---------------------------------------------------------------- real rewards on a random tiny CLIP
@pytest.fixture(scope="module")
def tiny_scorers(tiny_backbone):
    return EMScore(backbone=tiny_backbone), CLIPScore(backbone=tiny_backbone, prefix="")


caption_text = st.text(alphabet=st.sampled_from(list("a the dog red ) \" = $ & ' ~ / { : @ ? 0 2 5 9 ( [ .")), min_size=1,
                       max_size=40).filter(lambda s: s.strip())


@settings(max_examples=25, deadline=None)
@given(captions=st.lists(caption_text, min_size=1, max_size=4), reference=caption_text)
def test_real_rewards_never_clip_and_equal_the_sign_safe_formula(tiny_scorers, captions, reference):
    """On the random tiny CLIP (where punctuation strings give P and R of opposite signs), the default
    rewards need no clipping, and their values are H of the scorer's parts on the captions as read, or
    on what a suspect span may stand for when that is lower ("a0a" may be "aoa": capreward.caption_reading)."""
    em, cs = tiny_scorers
    read = [as_read(c) for c in captions]
    decoded = [read_caption(c).decoded for c in captions]
    rng = np.random.default_rng(1)
    video = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    refs = [[reference]] * len(captions)
    for kwargs in ({}, {"references": refs}):
        out = EMScoreReward(scorer=em).compute(None, captions, video=[video] * len(captions), **kwargs)
        assert out.clipped == [] and all(-1 <= v <= 1 for v in out.values)
        raw = em.score(read, videos=[video] * len(captions), **kwargs)
        parts = raw.video
        if not kwargs:
            expected = (sign_safe_harmonic_mean(parts.fine_p, parts.fine_r) + parts.coarse) / 2
            alt = em.score(decoded, videos=[video] * len(captions)).video
            expected = torch.minimum(expected, (sign_safe_harmonic_mean(alt.fine_p, alt.fine_r) + alt.coarse) / 2)
            assert out.values == pytest.approx(expected.tolist(), abs=1e-5)
        image = video[0]
        out = CLIPScoreReward(scorer=cs).compute(None, captions, image=[image] * len(captions), **kwargs)
        lo, hi = CLIPScoreReward(scorer=cs).value_range()
        assert out.clipped == [] and all(lo <= v <= hi for v in out.values)
        if kwargs:
            raw = cs.score(read, images=[image] * len(captions), **kwargs)
            expected = sign_safe_harmonic_mean(raw.clip_s, raw.ref_similarity)
            alt = cs.score(decoded, images=[image] * len(captions), **kwargs)
            expected = torch.minimum(expected, sign_safe_harmonic_mean(alt.clip_s, alt.ref_similarity))
            assert out.values == pytest.approx(expected.tolist(), abs=1e-5)


def test_scorers_keep_the_released_formula(tiny_scorers):
    """Fidelity: the scorer's default F is the paper's (it leaves [-1, 1] on the tiny CLIP's escapee)."""
    em, _ = tiny_scorers
    video = np.random.default_rng(1).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    caption = ') the " a the = " a $ &'
    raw = em.score([caption], videos=[video]).video
    p, r = raw.fine_p, raw.fine_r
    assert float(p * r) < 0, "precondition: P and R of opposite signs"
    assert torch.allclose(raw.fine_f, released_harmonic_mean(p, r))
    safe = em.score([caption], videos=[video], harmonic_mean="sign-safe").video
    assert torch.allclose(safe.fine_f, torch.minimum(p, r)) and torch.allclose(safe.fine_p, p)
    with pytest.raises(ValueError, match="harmonic_mean"):
        EMScoreReward(harmonic_mean="arithmetic")


# ----------------------------------------------------------------------- the colour task, every reward
@pytest.fixture(scope="module")
def colour_backbone():
    from capreward.backbones import CLIPBackbone
    from capreward.testing.trained_clip import trained_clip_path

    return CLIPBackbone(str(trained_clip_path()))


def test_the_issue_case_a_yellow_image_no_longer_tops_the_reward(colour_backbone):
    """Red image, colour CLIP: "a yellow image." got +1.0 (the top of the range, clipped from F's
    explosion at P -0.61, R 0.46) while the true "a red image." got 0.872."""
    from capreward.testing.trained_clip import colour_image

    red = colour_image("red")
    captions = ["a red image.", "a yellow image."]
    released = EMScoreReward(backbone=colour_backbone, harmonic_mean="released").compute(None, captions, image=[red] * 2)
    assert released.values[1] == 1.0 and released.clipped == [1], "precondition: the issue's case"
    assert released.values[0] == pytest.approx(0.872, abs=0.01)
    out = EMScoreReward(backbone=colour_backbone).compute(None, captions, image=[red] * 2)
    assert out.clipped == [] and out.values[0] == pytest.approx(0.872, abs=0.01)
    assert out.values[1] < 0 < out.values[0]


def test_no_wrong_colour_caption_outranks_the_true_one_under_any_reward(colour_backbone):
    """Every colour, every caption template, images and videos, with and without references (and
    references alone): under each CLIP-based reward at its default settings the caption naming the
    visual's colour scores at least as high as the same template naming any other colour."""
    from capreward.testing.trained_clip import CAPTION_TEMPLATES, COLOURS, colour_image, trained_clip_path

    rewards = {
        "emscore": EMScoreReward(backbone=colour_backbone),
        "clip_s": CLIPScoreReward(backbone=colour_backbone),
        "pac_s": PACScoreReward(model=str(trained_clip_path())),
        "hallucination": HallucinationPenalty(backbone=colour_backbone),
        "composite": CompositeReward([EMScoreReward(backbone=colour_backbone),
                                      HallucinationPenalty(backbone=colour_backbone)]),
    }
    colours = list(COLOURS)
    wrong: list[tuple] = []
    checked = 0
    for c in colours:
        rng = random.Random(c)
        image = colour_image(c, rng)
        video = np.stack([np.asarray(colour_image(c, rng, size=(40, 32))) for _ in range(3)])
        refs = [f"a {c} picture", f"the image is {c}"]
        for template in CAPTION_TEMPLATES:
            captions = [template.format(colour=x) for x in colours]
            n, truth = len(captions), colours.index(c)
            inputs = [{kind: [v] * n, **extra} for kind, v in (("image", image), ("video", video))
                      for extra in ({}, {"references": [refs] * n})]
            inputs.append({"references": [refs] * n})
            for columns in inputs:
                for name, reward in rewards.items():
                    if name != "emscore" and "image" not in columns and "video" not in columns:
                        continue
                    values = reward.compute(None, captions, **columns).values
                    assert None not in values
                    checked += 1
                    for j, v in enumerate(values):
                        if j != truth and v > values[truth]:
                            wrong.append((name, c, template, sorted(columns), colours[j], v, values[truth]))
    assert checked > 400
    assert not wrong, wrong[:10]


def test_server_and_verl_emscore_rank_the_issue_case_right(colour_backbone, tmp_path):
    """``capreward serve --reward emscore`` (the server's default reward) and veRL's ``emscore``: the
    adapters' reward is the sign-safe one; ``harmonic_mean="released"`` restores the paper's F."""
    from capreward.adapters.factory import RewardOptions, build_reward
    from capreward.server.http import RewardService
    from capreward.adapters.verl import make_compute_score
    from capreward.testing.trained_clip import colour_image

    colour_image("red").save(tmp_path / "red.png")
    captions = ["a red image.", "a yellow image."]
    payload = {"query": captions, "labels": [{"image": "red.png"}] * 2}
    for mean, truth_wins in (("sign-safe", True), ("released", False)):
        reward = build_reward("emscore", RewardOptions(harmonic_mean=mean), backbone=colour_backbone)
        answer = RewardService(reward, media_root=str(tmp_path)).handle(payload)
        assert (answer["rewards"][0] > answer["rewards"][1]) is truth_wins, answer
        verl = make_compute_score(reward, media_root=str(tmp_path))
        values = verl.batch(["src"] * 2, captions, [None] * 2, [{"image": "red.png"}] * 2)
        assert (values[0] > values[1]) is truth_wins, values
