"""Multi-image samples in the torchmetrics metrics: a sample whose visual is a list of images is scored
with its caption against each image (in the same batch as the other samples) and aggregated with
``image_aggregation`` (mean, min, max of the per-image scores; other columns: their mean), as the rewards
do. Checked against the scorer called on every (caption, image) pair directly, in any sample order and
any order of a sample's images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_video

from capreward import EMScore
from capreward.backbones import CLIPBackbone
from capreward.torchmetrics import EMScoreMetric
from capreward.testing import tiny_clip_factory

CAPTIONS = ["a red car on a road", "two dogs", "a bowl of fruit"]
REFS = [["a car", "a red vehicle"], ["dogs playing"], ["fruit in a bowl"]]


@pytest.fixture(scope="module")
def images():
    return [random_video(s, frames=1, height=32, width=32)[0] for s in range(6)]


@pytest.fixture(scope="module")
def direct(images):
    """The scorer on its own backbone, one (caption, image) pair per row: sample 0 has images 0-2,
    sample 1 image 3, sample 2 images 4-5."""
    scorer = EMScore(backbone=CLIPBackbone(tiny_clip_factory(0)))
    captions = [CAPTIONS[0]] * 3 + [CAPTIONS[1]] + [CAPTIONS[2]] * 2
    refs = [REFS[0]] * 3 + [REFS[1]] + [REFS[2]] * 2
    return scorer.score(captions, images=images, references=refs)


GROUPS = [[0, 1, 2], [3], [4, 5]]
REDUCE = {"mean": np.mean, "min": np.min, "max": np.max}


@pytest.mark.parametrize("aggregation", ["mean", "min", "max"])
def test_each_image_scored_and_aggregated(tiny_backbone, images, direct, aggregation):
    metric = EMScoreMetric(backbone=tiny_backbone, visual="image", per_sample=True, sub_scores=True,
                           image_aggregation=aggregation)
    visuals = [[images[k] for k in g] if len(g) > 1 else images[g[0]] for g in GROUPS]
    metric.update(CAPTIONS, visuals, REFS, ids=range(3))
    out = metric.compute()
    score = direct.score.double().numpy()
    want = [REDUCE[aggregation](score[g]) for g in GROUPS]
    np.testing.assert_allclose(out["per_sample/score"].numpy(), want, atol=1e-5, rtol=0)
    fine_p = direct.video.fine_p.double().numpy()
    np.testing.assert_allclose(out["per_sample/video/fine_p"].numpy(), [fine_p[g].mean() for g in GROUPS],
                               atol=1e-5, rtol=0)
    assert len({round(float(v), 6) for v in score[GROUPS[0]]}) == 3  # the images differ: aggregation matters


def test_sample_and_image_order_change_nothing(tiny_backbone, images, direct):
    order = [2, 0, 1]
    inner = {0: [2, 0, 1], 1: [3], 2: [5, 4]}
    metric = EMScoreMetric(backbone=tiny_backbone, visual="image", per_sample=True, image_aggregation="min")
    metric.update([CAPTIONS[o] for o in order], [[images[k] for k in inner[o]] for o in order], [REFS[o] for o in order],
                  ids=order)
    out = metric.compute()
    score = direct.score.double().numpy()
    by_id = dict(zip(out["per_sample/id"].tolist(), out["per_sample/score"].tolist()))
    for o in range(3):
        assert by_id[o] == pytest.approx(float(score[GROUPS[o]].min()), abs=1e-5)


def test_an_empty_image_list_and_an_unknown_aggregation_are_refused(tiny_backbone, images):
    with pytest.raises(ValueError, match=r"visuals\[1\] is an empty list of images"):
        EMScoreMetric(backbone=tiny_backbone, visual="image").update(CAPTIONS[:2], [images[0], []])
    with pytest.raises(ValueError, match="image_aggregation must be one of"):
        EMScoreMetric(backbone=tiny_backbone, visual="image", image_aggregation="median")


def test_a_sample_with_an_image_without_a_score_has_no_score(tiny_backbone, images):
    """An empty caption scores ``empty_score``; here the point is NaN propagation: with empty_score=None an
    empty caption has no score, and a multi-image sample of it has none either (never an aggregate of
    the others)."""
    metric = EMScoreMetric(backbone=tiny_backbone, visual="image", per_sample=True, empty_score=None)
    metric.update(["", "two dogs"], [[images[0], images[1]], images[2]], ids=[0, 1])
    out = metric.compute()
    assert torch.isnan(out["per_sample/score"][0]) and torch.isfinite(out["per_sample/score"][1])
