"""torchmetrics metrics for VisCE² and G-VEval on the trained tiny chat judge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capreward import GVEval, VisCE2
from capreward.torchmetrics.judges import GVEvalMetric, VisCE2Metric
from capreward.testing.tiny_vlm_judges import ACCR_ANSWERS, VISCE2_ANSWERS, probe_image, synthetic_video
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def backend(vlm_judge):
    return vlm_judge


def test_visce2_metric_accumulates_batches_and_matches_the_scorer(backend):
    metric = VisCE2Metric(backend, expected=True, per_sample=True, sub_scores=True)
    images = [probe_image("visce2", c) for c in ("green", "blue", "red", "yellow")]
    captions = ["a green ball", "a blue kite", "", "a photo of a kite"]
    metric.update(captions[:2], images[:2], ids=[0, 1])
    metric.update(captions[2:], images[2:], ids=[2, 3])
    out = metric.compute()
    direct = VisCE2(backend, expected=True).score([captions[0], captions[1], captions[3]], [images[0], images[1], images[3]])
    per = out["per_sample/score"]
    assert per.tolist() == [VISCE2_ANSWERS["green"], VISCE2_ANSWERS["blue"], 0.0, 0.0]  # empty and "no idea" score 0
    assert out["per_sample/empty"].tolist() == [0, 0, 1, 0]
    assert float(out["score"]) == pytest.approx(float(np.mean(per.numpy())))
    np.testing.assert_allclose(out["per_sample/expected"][[0, 1]].numpy(), direct.expected[:2], rtol=1e-5)
    assert math.isnan(float(out["per_sample/expected"][3]))
    assert "visce2" not in metric.state_dict() and len(metric.state_dict()) == 0


def test_gveval_metric_accr_on_videos(backend):
    metric = GVEvalMetric(
        backend, mode="ref-only", accr=True, visual="video", sub_scores=True, scorer_kwargs={"max_tokens": 120}
    )
    videos = [synthetic_video("red"), synthetic_video("red")]
    refs = [["a red car"], "the red box"]
    metric.update(["a red car", "red"], videos, refs)
    out = metric.compute()
    direct = GVEval(backend, mode="ref-only", accr=True, max_tokens=120).score(
        ["a red car", "red"], videos=videos, references=[["a red car"], ["the red box"]]
    )
    assert direct.parsed[0] == pytest.approx(np.mean(ACCR_ANSWERS["red"]))
    for name in ("accuracy", "completeness", "conciseness", "relevance"):
        assert float(out[name]) == pytest.approx(float(np.mean(getattr(direct, name))), rel=1e-5)
    assert float(out["scored"]) == 1.0
    assert float(out["score"]) == pytest.approx(float(np.mean(direct.score)), rel=1e-5)


def test_judge_metric_argument_errors(backend):
    with pytest.raises(ValueError, match="either"):
        VisCE2Metric()
    with pytest.raises(ValueError, match="video"):
        GVEvalMetric(backend, accr=True, visual="image")
    metric = VisCE2Metric(backend)
    with pytest.raises(ValueError, match="no references"):
        metric.update(["a"], [probe_image("visce2", "red")], [["ref"]])
    g = GVEvalMetric(backend, mode="combined")
    with pytest.raises(ValueError, match="needs references"):
        g.update(["a"], [probe_image("gveval", "red")])


def test_judge_metrics_refuse_an_id_twice_in_one_update(backend):
    """Two samples with one id in one update: the second would be dropped at compute; refused before the
    judge is asked anything."""
    images = [probe_image("visce2", c) for c in ("green", "blue")]
    for metric in (VisCE2Metric(backend), GVEvalMetric(backend, visual="image")):
        with pytest.raises(ValueError, match=r"ids\[1\] = 7 repeats ids\[0\] in one update"):
            metric.update(["a green ball", "a blue kite"], images, ids=[7, 7])
        assert metric.ids == []
