"""Pixel formats, size limits and CLIP's released preprocessing order.

Every PIL mode becomes the RGB a viewer shows (checked against the 8-bit RGB equivalent); decompression
bombs and over-large files are refused from their header; CLIP preprocessing resizes and crops before
converting to RGB, as open_clip's transform (and clipscore, PAC-S, EMScore) do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capreward.media import (
    DEFAULT_MAX_PIXELS,
    MediaError,
    get_media_limits,
    load_image,
    load_video,
    media_limits,
    viewable,
)

from conftest import random_video, write_mp4

RNG = np.random.default_rng(7)
GREY = RNG.integers(0, 256, size=(24, 36), dtype=np.uint8)
RGB = RNG.integers(0, 256, size=(24, 36, 3), dtype=np.uint8)
ALPHA = np.where(RNG.random((24, 36)) < 0.5, 0, 255).astype(np.uint8)


def _grey_rgb() -> np.ndarray:
    return np.repeat(GREY[..., None], 3, axis=2)


def _save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def _palette_image() -> Image.Image:
    rng = np.random.default_rng(11)
    palette_rgb = rng.integers(0, 256, size=(16, 3), dtype=np.uint8)
    indices = rng.integers(0, 16, size=(24, 36), dtype=np.uint8)
    image = Image.fromarray(indices, mode="P")
    image.putpalette(palette_rgb.flatten().tolist())
    image.info["transparency"] = 3
    return image


# (name, writer(tmp_path) -> path or PIL image, expected 8-bit RGB array)
FORMATS = {
    "16-bit PNG (I;16)": (lambda d: _save(Image.fromarray(GREY.astype(np.uint16) * 257), d / "g16.png"), _grey_rgb),
    "32-bit I": (lambda d: Image.fromarray(GREY.astype(np.int32) * 257, mode="I"), _grey_rgb),
    "float F in [0, 1]": (lambda d: Image.fromarray(GREY.astype(np.float32) / 255, mode="F"), _grey_rgb),
    "8-bit L": (lambda d: _save(Image.fromarray(GREY), d / "g8.png"), _grey_rgb),
    "1-bit": (
        lambda d: _save(Image.fromarray(GREY >= 128), d / "b1.png"),
        lambda: np.repeat(np.where(GREY >= 128, 255, 0).astype(np.uint8)[..., None], 3, axis=2),
    ),
    "CMYK JPEG-free TIFF": (lambda d: _save(Image.fromarray(RGB).convert("CMYK"), d / "c.tiff"), lambda: RGB),
    "RGBA (alpha dropped)": (lambda d: _save(Image.fromarray(np.dstack([RGB, ALPHA]), "RGBA"), d / "a.png"), lambda: RGB),
    "LA (alpha dropped)": (lambda d: _save(Image.fromarray(np.dstack([GREY, ALPHA]), "LA"), d / "la.png"), _grey_rgb),
    "P with transparency": (
        lambda d: _save(_palette_image(), d / "p.png"),
        lambda: np.asarray(_palette_image().convert("RGBA"))[..., :3],
    ),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_mode_loads_as_its_8bit_rgb_equivalent(tmp_path, name):
    make, expected = FORMATS[name]
    loaded = load_image(make(tmp_path), index=0)
    assert loaded.mode == "RGB"
    assert np.array_equal(np.asarray(loaded), expected()), name


def test_16bit_and_float_scaling_rounds_and_clips():
    sixteen = Image.fromarray(np.array([[0, 128, 129, 385, 65535]], dtype=np.uint16))
    assert np.asarray(viewable(sixteen, "x")).tolist() == [[0, 0, 1, 1, 255]]
    wide = Image.fromarray(np.array([[-5, 70000]], dtype=np.int32), mode="I")
    assert np.asarray(viewable(wide, "x")).tolist() == [[0, 255]]
    floats = Image.fromarray(np.array([[-0.5, 0.5, 2.0, 0.0]], dtype=np.float32), mode="F")
    assert np.asarray(viewable(floats, "x")).tolist() == [[0, 128, 255, 0]]
    for bad in (np.nan, np.inf, -np.inf):  # no colour to show: refused (test_nan_images_are_refused_everywhere)
        with pytest.raises(MediaError, match="NaN or infinite"):
            viewable(Image.fromarray(np.array([[0.5, bad]], dtype=np.float32), mode="F"), "x")
    # PIL's own conversion saturates: the bug this fixes
    assert np.asarray(sixteen.convert("RGB"))[0, 3].tolist() == [255, 255, 255]  # 385 is 1.5 in 8 bits


def test_16bit_png_scores_like_its_8bit_equivalent(tmp_path, tiny_backbone):
    from capreward.scorers.clipscore import CLIPScore

    sixteen = FORMATS["16-bit PNG (I;16)"][0](tmp_path)
    eight = FORMATS["8-bit L"][0](tmp_path)
    cs = CLIPScore(backbone=tiny_backbone)
    scores = cs.score(["a grey picture", "a grey picture"], images=[sixteen, eight]).clip_s
    assert float(scores[0]) == pytest.approx(float(scores[1]), abs=1e-6)


@pytest.mark.parametrize("kind", ["RGBA", "P"])
def test_clip_preprocessing_follows_the_released_order(tmp_path, tiny_backbone, kind):
    """open_clip: Resize, CenterCrop, convert("RGB"), ToTensor, Normalize. On a crafted RGBA image
    (fully transparent pixels whose colour differs from their neighbours) and a palette image,
    resize-then-convert differs from convert-then-resize; capreward must give the former."""
    rng = np.random.default_rng(3)
    if kind == "RGBA":
        pixels = np.dstack([rng.integers(0, 256, (61, 83, 3)), np.where(rng.random((61, 83)) < 0.5, 0, 255)])
        image = Image.fromarray(pixels.astype(np.uint8), "RGBA")
    else:
        image = Image.fromarray(rng.integers(0, 8, (61, 83)).astype(np.uint8), "P")
        image.putpalette(rng.integers(0, 256, 24).tolist())
    path = _save(image, tmp_path / f"crafted_{kind}.png")
    backbone = tiny_backbone
    with Image.open(path) as opened:
        released = backbone.encode_pixels(backbone.preprocess(opened)[None])
    with Image.open(path) as opened:
        convert_first = backbone.encode_pixels(backbone.preprocess(opened.convert("RGB"))[None])
    assert (released - convert_first).abs().max() > 1e-4, "precondition: the two orders differ"
    ours = backbone.visual_embeddings([str(path)], kind="image")[0]
    assert torch.allclose(ours, released, atol=1e-6)
    # the same image given in memory (PIL, mode kept) takes the same path
    backbone.cache.clear()
    assert torch.allclose(backbone.visual_embeddings([image], kind="image")[0], released, atol=1e-6)


# ------------------------------------------------------------------------------------ size limits
def test_default_limit_is_well_below_pils():
    assert get_media_limits().max_pixels == DEFAULT_MAX_PIXELS == 2**25
    assert DEFAULT_MAX_PIXELS < Image.MAX_IMAGE_PIXELS < 2 * Image.MAX_IMAGE_PIXELS


def test_decompression_bomb_is_a_media_error_naming_the_item(tmp_path):
    bomb = _save(Image.new("L", (30000, 30000)), tmp_path / "bomb.png")
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(MediaError, match=r"item 4 \('.*bomb.png'\).*too large"):
        load_image(bomb, index=4)


def test_over_limit_png_is_refused_from_its_header(tmp_path):
    path = _save(Image.new("L", (300, 200)), tmp_path / "big.png")
    with media_limits(max_pixels=50_000):
        with pytest.raises(MediaError, match=r"big.png.*300x200 = 60,000 pixels, over the limit of 50,000"):
            load_image(path, index=1)
        with Image.open(path) as lazy:  # an opened (lazy) PIL image is refused before decoding too
            with pytest.raises(MediaError, match="over the limit"):
                load_image(lazy)
            assert lazy.tile, "the image was not decoded"
    assert load_image(path).size == (300, 200)  # the context manager restored the default


def test_over_limit_jpeg_is_decoded_at_a_reduced_scale(tmp_path):
    full = np.kron(RNG.integers(0, 256, (10, 15, 3)), np.ones((40, 40, 1))).astype(np.uint8)  # 400x600
    path = _save(Image.fromarray(full), tmp_path / "big.jpg", quality=95)
    with media_limits(max_pixels=400 * 600 // 3):  # 1/2 scale (60,000 px) fits, full size does not
        reduced = load_image(path)
    assert reduced.size == (300, 200)
    reference = np.asarray(Image.open(path).convert("RGB").resize((300, 200), Image.BOX), dtype=np.float32)
    assert np.abs(np.asarray(reduced, dtype=np.float32) - reference).mean() < 3.0
    with media_limits(max_pixels=1000):  # even 1/8 (75x50) is too large
        with pytest.raises(MediaError, match="over the limit"):
            load_image(path)


def test_limits_from_the_environment(tmp_path):
    path = _save(Image.new("RGB", (20, 10)), tmp_path / "small.png")
    code = "import sys; from capreward.media import load_image; load_image(sys.argv[1])"
    env = {**os.environ, "CAPREWARD_MAX_PIXELS": "150"}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "200 pixels, over the limit of 150" in proc.stderr


def test_video_limits(tmp_path):
    path = write_mp4(tmp_path / "clip.mp4", random_video(0, frames=12, height=40, width=56))
    with media_limits(max_pixels=40 * 56 - 1):
        with pytest.raises(MediaError, match=r"clip.mp4.*56x40 = 2,240 pixels, over the limit"):
            load_video(path, index=2)
    with media_limits(max_video_pixels=12 * 40 * 56 - 1):
        assert load_video(path, frames=10).shape == (10, 40, 56, 3)
        with pytest.raises(MediaError, match="12 frames of 56x40.*max_video_pixels"):
            load_video(path, frames=None)
    with media_limits(max_pixels=100):
        with pytest.raises(MediaError, match="over the limit of 100"):
            load_video(random_video(0, frames=3), index=0)


def test_video_frames_in_any_mode(tmp_path):
    frames = [Image.fromarray(GREY.astype(np.uint16) * 257) for _ in range(3)]
    assert np.array_equal(load_video(frames, frames=None), np.stack([_grey_rgb()] * 3))


def test_a_broken_lazily_opened_image_is_a_media_error_everywhere(tmp_path, tiny_backbone):
    """A truncated file opened with Image.open decodes only when used: keying it must not raise, and
    loading it raises MediaError naming the item (not PIL's OSError)."""
    from capreward.media import media_key

    full = _save(Image.fromarray(RGB), tmp_path / "full.png")
    (tmp_path / "cut.png").write_bytes(full.read_bytes()[:200])
    lazy = Image.open(tmp_path / "cut.png")
    assert media_key(lazy) is None
    with pytest.raises(MediaError, match=r"item 0 \(PngImageFile '.*cut.png'\): cannot read image"):
        tiny_backbone.visual_embeddings([lazy], kind="image")
