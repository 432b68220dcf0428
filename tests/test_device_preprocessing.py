"""The device-side image path (issue #44 item 3): CLIP preprocessing as tensors
(``CLIPBackbone(preprocessing="device")``, :class:`capreward.media.device_pixels.TensorPreprocess`) against
the released PIL transform, on the CPU (the same code runs on a GPU).

PIL resizes in two passes with an 8-bit image between them; the tensor path does the same, so the pixels
equal PIL's but for its fixed-point rounding (one 8-bit level, in at most 4 of 1,000 values), and
EMScore's scores stay within what that allows; other image modes keep the PIL path exactly; a transform
with a step the tensor path does not reproduce is refused, naming the step.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from capreward import EMScore
from capreward.backbones import CLIPBackbone
from capreward.media.device_pixels import TensorPreprocess
from capreward.testing import tiny_clip_factory

from conftest import random_video


@pytest.fixture(scope="module")
def backbones():
    pil = CLIPBackbone(tiny_clip_factory(seed=0))
    device = CLIPBackbone(tiny_clip_factory(seed=0), preprocessing="device")
    return pil, device


def levels(a: torch.Tensor, b: torch.Tensor, std) -> torch.Tensor:
    """|a - b| of normalised pixels in 8-bit levels."""
    return ((a - b) * torch.tensor(std)[:, None, None] * 255).abs()


@pytest.mark.parametrize("height,width", [(40, 56), (240, 320), (37, 300), (100, 80), (20, 24), (32, 32)])
def test_device_pixels_equal_pils_up_to_its_fixed_point_rounding(backbones, height, width):
    pil, device = backbones
    frames = random_video(height * 7 + width, frames=4, height=height, width=width)
    a, b = pil.pixels_of(frames), device.pixels_of(frames)
    assert a.shape == b.shape
    diff = levels(a, b, device._tensor_preprocess.std)
    assert float(diff.max()) <= 1.0 + 1e-4
    assert float((diff > 0.5).float().mean()) <= 1e-2  # measured: at most 3.7e-3 (upscaling 20x24)


def test_at_clip_size_against_open_clips_own_transform():
    import open_clip

    _, _, transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    prep = TensorPreprocess.from_transform(transform)
    assert (prep.size, prep.interpolation, prep.crop) == (224, "bicubic", (224, 224))
    for h, w in ((240, 320), (480, 360), (150, 700)):
        frames = random_video(h + w, frames=2, height=h, width=w)
        ref = torch.stack([transform(Image.fromarray(f)) for f in frames])
        diff = levels(ref, prep(frames, "cpu"), prep.std)
        assert float(diff.max()) <= 1.0 + 1e-4 and float((diff > 0.5).float().mean()) <= 1e-3


def test_emscore_with_device_pixels_stays_within_the_measured_deviation(backbones):
    pil, device = backbones
    videos = [random_video(s, frames=6, height=48, width=64) for s in (1, 2)]
    captions = ["a red square on a blue field", "two shapes moving", "a dark scene", "bright colours"]
    refs = [["a square moves"], ["shapes"], ["darkness"], ["colour fields"]]
    vids = [videos[0], videos[0], videos[1], videos[1]]
    a = EMScore(backbone=pil, frames=6).score(captions, videos=vids, references=refs).combined
    b = EMScore(backbone=device, frames=6).score(captions, videos=vids, references=refs).combined
    for name, value in a.as_dict().items():
        assert float((value - b.as_dict()[name]).abs().max()) <= 1e-3, name


def test_images_of_other_modes_keep_the_pil_path(backbones):
    pil, device = backbones
    rgba = Image.fromarray(random_video(5, frames=1, height=30, width=44)[0]).convert("RGBA")
    rgba.putalpha(128)
    torch.testing.assert_close(device.image_pixels(rgba, 0), pil.image_pixels(rgba, 0), atol=0, rtol=0)
    rgb = Image.fromarray(random_video(6, frames=1, height=30, width=44)[0])
    diff = levels(device.image_pixels(rgb, 0), pil.image_pixels(rgb, 0), device._tensor_preprocess.std)
    assert float(diff.max()) <= 1.0 + 1e-4


def test_a_transform_the_tensor_path_does_not_reproduce_is_refused():
    from torchvision import transforms as T

    random_crop = T.Compose([T.Resize(32), T.RandomCrop(32), T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)])
    with pytest.raises(ValueError, match="RandomCrop"):
        TensorPreprocess.from_transform(random_crop)
    with pytest.raises(ValueError, match="Compose"):
        TensorPreprocess.from_transform(lambda image: image)
    with pytest.raises(ValueError, match="'pil' or 'device'"):
        CLIPBackbone(tiny_clip_factory(seed=0), preprocessing="gpu")
    assert TensorPreprocess.from_transform(T.Compose([T.Resize(32, max_size=40), T.ToTensor(),
                                                     T.Normalize((0.5,) * 3, (0.5,) * 3)])).output_size(20, 100) == (8, 40)
