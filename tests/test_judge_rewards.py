"""VisCE² and G-VEval rewards (sync and async) on the trained tiny chat judge."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from capreward import GVEval, VisCE2
from capreward.rewards.judges import GVEvalReward, VisCE2Reward
from capreward.testing.tiny_vlm_judges import ACCR_ANSWERS, VISCE2_ANSWERS, probe_image, synthetic_video
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def backend(vlm_judge):
    return vlm_judge


def test_visce2_reward_values_reasons_and_async(backend):
    images = [probe_image("visce2", c) for c in ("green", "blue", "yellow", "green")]
    captions = ["a green ball", "a blue kite", "a photo of a kite", ""]
    reward = VisCE2Reward(backend=backend)
    logged, metrics = {}, {}
    values = reward(None, captions, image=images, log_extra=logged.__setitem__, log_metric=metrics.__setitem__)
    assert values[:3] == [VISCE2_ANSWERS["green"] / 100, 1.0, 0.0]  # "no idea" scores 0, as in the paper
    assert values[3] is None and "empty" in logged["visce2/error"][3]
    # parsed: the integer each answer wrote (the "no idea" answer wrote none); 1 of 3 unscored (the empty caption)
    assert metrics["rewards/visce2/parsed"] == pytest.approx((VISCE2_ANSWERS["green"] + 100) / 2)
    assert asyncio.run(reward.as_async()(None, captions, image=images)) == values
    assert reward(None, ["a red car"], video=[synthetic_video("red")]) == [None]  # VisCE² is image-only


def test_visce2_reward_expected_matches_the_scorer(backend):
    images = [probe_image("visce2", "green"), probe_image("visce2", "red")]
    reward = VisCE2Reward(backend=backend, use_expected=True)
    values = reward(None, ["a green ball", "a red car"], image=images)
    direct = VisCE2(backend, expected=True).score(["a green ball", "a red car"], images)
    assert values == pytest.approx(list(direct.expected / 100))


def test_gveval_reward_accr_videos_and_a_missing_reference(backend):
    reward = GVEvalReward(backend=backend, mode="combined", accr=True, max_tokens=120)
    videos = [synthetic_video("red"), synthetic_video("red")]
    refs = [["a red car"], []]
    logged, metrics = {}, {}
    values = reward(
        None, ["a red car", "a red car"], video=videos, references=refs, log_extra=logged.__setitem__, log_metric=metrics.__setitem__
    )
    direct = GVEval(backend, mode="combined", accr=True, max_tokens=120).score(["a red car"], videos=videos[:1], references=refs[:1])
    assert values[0] == pytest.approx(direct.score[0] / 100)
    assert values[1] is None and logged["gveval/error"][1]
    assert metrics["rewards/gveval/parsed"] == pytest.approx(direct.parsed[0])
    assert abs(direct.parsed[0] - np.mean(ACCR_ANSWERS["red"])) < 5  # the judge writes the four scores it learned
    assert "rewards/gveval/accuracy" in metrics
