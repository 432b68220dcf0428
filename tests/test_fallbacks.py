"""Fallbacks at the bottom (issue 20, item 7): where an RL stack needs a number for every sample (the
reward server, veRL), an unscorable sample gets the bottom of the reward's range by default, never a
mid-range value: the server's old default 0.0 ranked an empty completion above every wrong caption
under EMScore (range [-1, 1]). Configurable (``--fallback``, ``fallback=``, ``CAPREWARD_FALLBACK``).
"""

from __future__ import annotations

import logging

import pytest

from capreward.server.http import RewardService
from capreward.adapters.verl import make_compute_score
from capreward.rewards import (
    CLIPScoreReward,
    CompositeReward,
    EMScoreReward,
    FLEURReward,
    GVEvalReward,
    Guards,
    HallucinationPenalty,
    VisCE2Reward,
)
from serve_process import Server

TRUE, WRONG = "a red image.", ["a green image.", "a blue image.", "a yellow image.", "a purple image."]


def plain_reward(prompts, completions, **kwargs):
    """A TRL-style reward function that states no range."""
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize("reward, bottom", [
    (EMScoreReward(), -1.0),
    (CLIPScoreReward(use_references=False), 0.0),
    (CLIPScoreReward(), -1.0),  # RefCLIP-S reaches -1 with the sign-safe mean
    (CLIPScoreReward(harmonic_mean="released"), 0.0),
    (HallucinationPenalty(), -1.0),
    (FLEURReward(), 0.0),
    (VisCE2Reward(), 0.0),
    (GVEvalReward(scale=1.0), 0.0),
    (CompositeReward([(EMScoreReward(), 1.0), (HallucinationPenalty(), 0.5)], guards=Guards(length=0.5)),
     -1.0 - 0.5 - 1.0 - 1.0 - 0.5 - 1.0),  # terms, repetition, truncation, length, injection
], ids=lambda x: x if isinstance(x, float) else type(x).__name__)
def test_the_default_fallback_is_the_bottom_of_the_range(reward, bottom):
    from capreward.adapters.scoring import resolve_fallback

    assert resolve_fallback(reward) == bottom == reward.value_range()[0]
    assert RewardService(reward).fallback == bottom
    assert make_compute_score(reward).fallback == bottom


def test_explicit_fallbacks_and_rewards_without_a_range(caplog):
    em = EMScoreReward()
    assert RewardService(em, fallback=-3).fallback == -3.0
    with caplog.at_level(logging.WARNING, logger="capreward.adapters.scoring"):
        assert make_compute_score(em, fallback=0.0).fallback == 0.0
    assert "above the bottom -1" in caplog.text  # allowed, but never silently
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            RewardService(em, fallback=bad)
    for rangeless in (plain_reward, CompositeReward([plain_reward])):
        with pytest.raises(ValueError, match="states no range.*fallback"):
            RewardService(rangeless)
        with pytest.raises(ValueError, match="states no range.*fallback"):
            make_compute_score(rangeless)
        assert RewardService(rangeless, fallback=-1).fallback == -1.0


@pytest.fixture(scope="module")
def colour_clip_path():
    from capreward.testing.trained_clip import trained_clip_path

    return trained_clip_path()


@pytest.fixture(scope="module")
def red_image(tmp_path_factory):
    from capreward.testing.trained_clip import colour_image

    root = tmp_path_factory.mktemp("fallback_media")
    colour_image("red").save(root / "red.png")
    return root


def test_serve_defaults_rank_an_empty_completion_below_every_wrong_caption(colour_clip_path, red_image):
    """``capreward serve --reward emscore`` with its defaults (no --fallback): the issue's case."""
    server = Server(["--reward", "emscore", "--clip-model", str(colour_clip_path), "--media-root", str(red_image)])
    try:
        captions = [TRUE, *WRONG, "", "   </s>"]
        status, body = server.post({"query": captions, "labels": [{"image": "red.png"}] * len(captions)})
        assert status == 200, body
        rewards, errors = body["rewards"], body["errors"]
        assert rewards[-2:] == [-1.0, -1.0] and all("empty" in e for e in errors[-2:]), body
        assert all(r > -1.0 for r in rewards[:-2]), rewards  # every scored caption, wrong ones included
        assert rewards[0] == max(rewards)
        assert any("unscorable samples get -1" in line for line in server.lines), server.lines  # said at start
    finally:
        assert server.stop() == 0


def test_verl_environment_default_is_the_bottom(colour_clip_path, red_image, monkeypatch):
    from capreward.adapters import verl

    monkeypatch.setenv("CAPREWARD_REWARD", "emscore")
    monkeypatch.setenv("CAPREWARD_CLIP_MODEL", str(colour_clip_path))
    monkeypatch.setenv("CAPREWARD_MEDIA_ROOT", str(red_image))
    monkeypatch.delenv("CAPREWARD_FALLBACK", raising=False)
    verl.reset_default_scorer()
    try:
        info = {"image": "red.png"}
        values = verl.compute_score_batch(["d"] * 3, [TRUE, WRONG[1], ""], [None] * 3, [info] * 3)
        assert values[2] == -1.0 and values[1] > -1.0 and values[0] > values[1]
        monkeypatch.setenv("CAPREWARD_FALLBACK", "-4.5")
        verl.reset_default_scorer()
        assert verl.compute_score("d", "", None, info) == -4.5
    finally:
        verl.reset_default_scorer()
