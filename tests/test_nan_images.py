"""NaN and infinite float images are refused in every path with the same message (issue 21.9): a float
TIFF file, a PIL float image, a float tensor, a float array, a float video array or tensor, and
through a scorer. Before, an all-NaN float TIFF scored as a black image while tensors refused NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from capreward.media import MediaError, load_image, load_video

MESSAGE = "image contains NaN or infinite values"  # capreward.media.NAN_IMAGE


def _float_tiff(path, value: float):
    Image.fromarray(np.full((8, 8), value, np.float32), mode="F").save(path)
    return path


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_every_form_gives_the_same_refusal(tmp_path, value):
    tiff = _float_tiff(tmp_path / "f.tiff", value)
    partly = np.full((8, 8), 0.5, np.float32)
    partly[3, 4] = value  # one bad pixel is enough
    forms = {
        "file": str(tiff),
        "PIL file": Image.open(tiff),
        "PIL": Image.fromarray(partly, mode="F"),
        "tensor": torch.full((3, 8, 8), value),
        "array": np.full((8, 8, 3), value, np.float32),
        "float64 array": np.full((8, 8, 3), value, np.float64),
    }
    for form, item in forms.items():
        with pytest.raises(MediaError) as exc:
            load_image(item, index=2)
        assert exc.value.problem == MESSAGE, form
        assert "item 2" in str(exc.value)
    for video in (np.full((2, 8, 8, 3), value, np.float32), torch.full((2, 8, 8, 3), value),
                  [Image.fromarray(partly, mode="F")]):
        with pytest.raises(MediaError) as exc:
            load_video(video, index=1)
        assert exc.value.problem == MESSAGE


def test_finite_float_images_still_load(tmp_path):
    tiff = _float_tiff(tmp_path / "half.tiff", 0.5)
    assert np.asarray(load_image(str(tiff))).tolist()[0][0] == [128, 128, 128]


def test_a_nan_tiff_is_refused_by_the_scorers(tmp_path, tiny_backbone):
    from capreward.rewards import CLIPScoreReward
    from capreward.scorers.clipscore import CLIPScore

    tiff = str(_float_tiff(tmp_path / "nan.tiff", np.nan))
    black = str(tmp_path / "black.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(black)
    cs = CLIPScore(backbone=tiny_backbone)
    with pytest.raises(MediaError, match=MESSAGE):
        cs.score(["a black image", "a black image"], images=[black, tiff])
    out = CLIPScoreReward(scorer=cs).compute(None, ["a black image"] * 2, image=[black, tiff])
    assert out.values[0] is not None and out.values[1] is None and MESSAGE in out.reasons[1]
