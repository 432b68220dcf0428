"""A sample with several images (TRL's ``images`` column) is scored on every image and aggregated."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image

from capreward.rewards import CLIPScoreReward


def picture(rgb):
    pixels = np.clip(np.array(rgb) + np.random.default_rng(sum(rgb)).normal(0, 12, (32, 32, 3)), 0, 255)
    return Image.fromarray(pixels.astype(np.uint8))


@pytest.fixture(scope="module")
def images():
    return [picture((215, 30, 35)), picture((35, 70, 215)), picture((30, 200, 40))]


@pytest.mark.parametrize("how", ["mean", "min", "max"])
def test_every_image_is_scored_and_aggregated(tiny_clip_path, images, how, caplog):
    reward = CLIPScoreReward(model=str(tiny_clip_path), image_aggregation=how)
    captions = ["a red image", "a blue image"]
    alone = [[reward(None, [c], image=[im])[0] for im in images] for c in captions]
    with caplog.at_level(logging.INFO, logger="capreward.rewards.base"):
        got = reward(None, captions, images=[images, images[1:2]])
    pick = {"mean": np.mean, "min": min, "max": max}[how]
    assert got[0] == pytest.approx(pick(alone[0]), abs=1e-6)
    assert got[1] == pytest.approx(alone[1][1], abs=1e-6)  # one image: that image's score
    assert "per-image values" in caplog.text  # the per-image scores of the multi-image sample are logged


def test_an_unscorable_image_leaves_the_sample_unscored(tiny_clip_path, images, tmp_path):
    reward = CLIPScoreReward(model=str(tiny_clip_path), image_aggregation="max")
    out = reward.compute(None, ["a red image", "a red image"],
                         images=[[images[0], str(tmp_path / "missing.png")], [images[0]]])
    assert out.values[0] is None and "image 1 of 2" in out.reasons[0]
    assert out.values[1] is not None
    with pytest.raises(ValueError, match="image_aggregation"):
        CLIPScoreReward(model=str(tiny_clip_path), image_aggregation="median")
