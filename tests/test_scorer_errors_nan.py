"""``errors="nan"`` on EMScore and CLIPScore: a GRPO group with an empty completion (or an unreadable
visual) is scored directly; the bad items get NaN and a reason, every other item gets exactly the value
it gets when scored alone."""

from __future__ import annotations

import math

import pytest
import torch

from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore

from conftest import random_video

GROUP = ["a man is cooking.", "", "a dog runs on the grass", "   ", "people dancing on a stage"]


@pytest.fixture(scope="module")
def scorers(tiny_backbone):
    return EMScore(backbone=tiny_backbone, frames=4), CLIPScore(backbone=tiny_backbone, frames=4)


def test_emscore_group_with_empty_completions(scorers):
    em, _ = scorers
    video = random_video(0)
    refs = [["a person cooks food"]] * len(GROUP)
    with pytest.raises(ValueError, match=r"candidates\[1\] is an empty caption"):
        em.score(GROUP, videos=[video] * len(GROUP))
    res = em.score(GROUP, videos=[video] * len(GROUP), references=refs, errors="nan")
    assert res.errors == [None, "empty caption", None, "empty caption", None]
    for i, caption in enumerate(GROUP):
        if res.errors[i] is not None:
            assert math.isnan(res.score[i]) and math.isnan(res.video.fine_f[i]) and math.isnan(res.combined.coarse[i])
            assert res.alignment[i] is None and res.truncated[i] is False
            continue
        alone = em.score([caption], videos=[video], references=[refs[i]])
        assert res.score[i].item() == pytest.approx(alone.score[0].item(), abs=1e-6)
        for part in ("video", "reference", "combined"):
            for name, value in getattr(alone, part).as_dict().items():
                assert getattr(getattr(res, part), name)[i].item() == pytest.approx(value[0].item(), abs=1e-6)
        assert res.alignment[i].tokens == alone.alignment[0].tokens
    assert res.rows()[0]["score"] == pytest.approx(res.score[0].item())
    # a clean call reports no errors either way
    clean = em.score(GROUP[:1], videos=[video], errors="nan")
    assert clean.errors == [None] and clean.score[0].item() == pytest.approx(em.score(GROUP[:1], videos=[video]).score[0].item(), abs=1e-6)


def test_unreadable_visual_and_all_bad(scorers, tmp_path):
    em, cs = scorers
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video")
    videos = [random_video(1), str(bad), random_video(2)]
    captions = ["a red car", "a blue car", ""]
    for scorer, field in ((em, "score"), (cs, "clip_s")):
        res = scorer.score(captions, videos=videos, errors="nan")
        assert res.errors[0] is None and "broken.mp4" in res.errors[1] and res.errors[2] == "empty caption"
        assert torch.isnan(getattr(res, field)[1:]).all()
        alone = scorer.score(captions[:1], videos=videos[:1])
        assert getattr(res, field)[0].item() == pytest.approx(getattr(alone, field)[0].item(), abs=1e-6)
        nothing = scorer.score(["", " "], videos=videos[:2], errors="nan")
        assert torch.isnan(nothing.score).all() and nothing.errors == ["empty caption", "empty caption"]
    with pytest.raises(ValueError, match="errors must be one of"):
        em.score(captions, videos=videos, errors="skip")


def test_clipscore_group_with_references(scorers):
    _, cs = scorers
    image = random_video(3, frames=1)[0]
    refs = [["a photo of food"], ["x"], [""], ["a stage"], ["a kitchen"]]
    res = cs.score(GROUP, images=[image] * len(GROUP), references=refs, errors="nan")
    assert res.errors == [None, "empty caption", "references[0]: empty caption", "empty caption", None]
    for i in (0, 4):
        alone = cs.score([GROUP[i]], images=[image], references=[refs[i]])
        assert res.clip_s[i].item() == pytest.approx(alone.clip_s[0].item(), abs=1e-6)
        assert res.ref_clip_s[i].item() == pytest.approx(alone.ref_clip_s[0].item(), abs=1e-6)
    assert torch.isnan(res.ref_clip_s[[1, 2, 3]]).all()
