"""SpecificityReward: a caption's CLIP-S on its own visual minus its mean (or max) on the batch's other
distinct visuals, recomputed here from CLIP-S scored pair by pair; an image-blind caption sums to zero;
hedging and generic captions, which CLIP-S pays, earn nothing on average."""

from __future__ import annotations

import numpy as np
import pytest

from capreward.rewards import CLIPScoreReward, CompositeReward, SpecificityReward

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

COLOURS = ("red", "green", "blue", "yellow")
RIGHT = [f"a {c} image" for c in COLOURS]
#: image-blind captions: hedges naming two colours, generic captions, a repeated generic word, one colour everywhere
BLIND = ["green blue", "red yellow", "an image", "a picture", "image", "image image", "a green image"]


@pytest.fixture(scope="module")
def clip():
    from capreward.testing.trained_clip import TrainedClipFactory, trained_clip_path

    trained_clip_path()
    return TrainedClipFactory()


@pytest.fixture(scope="module")
def images():
    import random

    from capreward.testing.trained_clip import colour_image

    return [colour_image(c, random.Random(i)) for i, c in enumerate(COLOURS)]


def pairwise(clip, captions, images):
    """CLIP-S of every caption against every image, one pair at a time."""
    cs = CLIPScoreReward(model=clip)
    return np.array([[cs(None, [c], image=[im])[0] for im in images] for c in captions])


def test_values_are_own_minus_the_other_visuals_by_hand(clip, images):
    captions = [RIGHT[0], "green blue", "an image", RIGHT[3]]
    s = pairwise(clip, captions, images)
    mean = SpecificityReward(model=clip)(None, captions, image=images)
    worst = SpecificityReward(model=clip, contrast="max")(None, captions, image=images)
    for i in range(4):
        others = [s[i, j] for j in range(4) if j != i]
        assert mean[i] == pytest.approx(s[i, i] - np.mean(others), abs=1e-5)
        assert worst[i] == pytest.approx(s[i, i] - max(others), abs=1e-5)
        assert worst[i] <= mean[i] + 1e-9


def test_image_blind_captions_earn_nothing_while_clip_s_pays_them(clip, images):
    """Measured against hedging and generic captions: under CLIP-S alone a hedge or a generic caption
    earns a fair reward on every image (the exploits a blind policy lives on); under specificity any
    caption said whatever the image sums to exactly zero over a batch of distinct visuals, and the right
    captions are well above."""
    spec, cs = SpecificityReward(model=clip), CLIPScoreReward(model=clip)
    right = spec(None, RIGHT, image=images)
    assert min(right) > 1.0
    for caption in BLIND:
        values = spec(None, [caption] * 4, image=images)
        assert sum(values) == pytest.approx(0.0, abs=1e-5), caption
        assert np.mean(values) < np.mean(right) - 1.5
    # what CLIP-S pays a hedge and a generic caption on average over the four colours (0.94 and 0.81 measured)
    for caption in ("green blue", "an image"):
        assert np.mean(cs(None, [caption] * 4, image=images)) > 0.5, caption


def test_a_groups_repeated_visual_counts_once_and_one_visual_is_unscored(clip, images):
    """A GRPO group repeats its visual once per completion: the contrast is with the *other* visuals."""
    spec = SpecificityReward(model=clip)
    captions = ["a red image", "red yellow", "a green image", "image"]
    grouped = spec(None, captions, image=[images[0], images[0], images[1], images[1]])
    s = pairwise(clip, captions, images[:2])
    assert grouped == pytest.approx([s[0, 0] - s[0, 1], s[1, 0] - s[1, 1], s[2, 1] - s[2, 0], s[3, 1] - s[3, 0]], abs=1e-5)
    # equal copies are the same visual; a visual_id column decides when given
    import copy

    assert spec(None, captions[:2], image=[images[0], copy.deepcopy(images[0])]) == [None, None]
    ids = spec(None, captions[:2], image=[images[0], copy.deepcopy(images[0])], visual_id=["a", "b"])
    assert ids == pytest.approx([0.0, 0.0], abs=1e-6)  # two "different" visuals with the same pixels
    out = spec.compute(None, ["a red image"], image=[images[0]])
    assert out.values == [None] and "at least two different images" in out.reasons[0]
    assert spec.compute(None, ["a red image"]).reasons == ["specificity needs an image or video column"]


def test_usable_in_a_composite_and_bad_arguments_are_refused(clip, images):
    cs, spec = CLIPScoreReward(model=clip), SpecificityReward(model=clip)
    composite = CompositeReward([(cs, 1.0), (spec, 0.5)], guards=None)
    captions = [RIGHT[0], "green blue", RIGHT[2], "image"]
    expected = np.array(cs(None, captions, image=images)) + 0.5 * np.array(spec(None, captions, image=images))
    assert composite(None, captions, image=images) == pytest.approx(expected.tolist(), abs=1e-5)
    lo, hi = cs.value_range()
    assert spec.value_range() == (lo - hi, hi - lo) and spec.__name__ == "specificity"
    with pytest.raises(ValueError, match="contrast"):
        SpecificityReward(model=clip, contrast="median")
    with pytest.raises(ValueError, match="either base or CLIP-S"):
        SpecificityReward(cs, model=clip)
