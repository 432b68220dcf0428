"""Media loading: every accepted form, frame sampling, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from capreward.media import MediaError, load_image, load_video, media_key, sample_indices

from conftest import random_video, write_mp4


def test_sample_indices_follow_linspace_rule():
    # int(linspace(0, T-1, 10)) for T = 25: 0, 2.67, 5.33, 8, 10.67, 13.33, 16, 18.67, 21.33, 24
    assert sample_indices(25, 10).tolist() == [0, 2, 5, 8, 10, 13, 16, 18, 21, 24]
    assert sample_indices(7, None).tolist() == list(range(7))
    assert sample_indices(3, 5).tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        sample_indices(0, 10)


def test_image_forms_give_identical_pixels(tmp_path):
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    path = tmp_path / "im.png"
    Image.fromarray(array).save(path)
    tensor = torch.from_numpy(array).permute(2, 0, 1).float() / 255
    forms = [str(path), path, Image.fromarray(array), array, tensor]
    for form in forms:
        assert np.array_equal(np.asarray(load_image(form)), array), type(form)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((4, 4, 3), dtype=np.float32), "uint8"),
        (np.zeros((4, 4), dtype=np.uint8), "shape"),
        (torch.full((3, 4, 4), float("nan")), "NaN"),
        (torch.full((3, 4, 4), 2.0), "[0, 1]"),
        (torch.zeros((4, 4, 4)), "(3, H, W) or (H, W, 3)"),
        (torch.zeros((3, 4)), "(3, H, W) or (H, W, 3)"),
        (torch.full((3, 4, 4), 300), "0..255"),
        (None, "missing"),
        (12, "unsupported"),
    ],
)
def test_bad_images_raise_naming_the_item(bad, message):
    with pytest.raises(MediaError) as exc:
        load_image(bad, index=3)
    assert "item 3" in str(exc.value) and message in str(exc.value)


def test_missing_and_unreadable_image_files(tmp_path):
    with pytest.raises(MediaError, match="does not exist"):
        load_image(tmp_path / "nope.jpg")
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"not an image")
    with pytest.raises(MediaError, match="junk.jpg.*cannot read image"):
        load_image(junk)


def test_video_forms_agree(tmp_path):
    clip = random_video(1, frames=15)
    path = write_mp4(tmp_path / "v.mp4", clip)
    decoded_all = load_video(path, frames=None)
    assert decoded_all.shape == (15, 40, 56, 3)
    sampled = load_video(path, frames=10)
    assert np.array_equal(sampled, decoded_all[sample_indices(15, 10)])
    # arrays, tensors and frame lists of the same pixels sample identically
    for form in (decoded_all, torch.from_numpy(decoded_all), [Image.fromarray(f) for f in decoded_all], list(decoded_all)):
        assert np.array_equal(load_video(form, frames=10), sampled)
    assert load_video(decoded_all, frames=4).shape[0] == 4


def test_real_clips_decode(real_clips):
    for clip in real_clips:
        frames = load_video(clip, frames=10)
        assert frames.shape[0] == 10 and frames.dtype == np.uint8 and frames.shape[3] == 3
        assert frames.std() > 1.0  # real content, not a blank decode


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((0, 4, 4, 3), dtype=np.uint8), "zero frames"),
        (np.zeros((2, 4, 4, 3), dtype=np.float32), "uint8"),
        (np.zeros((2, 4, 4), dtype=np.uint8), "(T, H, W, 3)"),
        ([], "zero frames"),
        ([np.zeros((4, 4, 3), np.uint8), np.zeros((5, 4, 3), np.uint8)], "different shapes"),
        (torch.zeros((2, 4, 4, 3)), "uint8"),
    ],
)
def test_bad_videos_raise_naming_the_item(bad, message):
    with pytest.raises(MediaError) as exc:
        load_video(bad, index=5)
    assert "item 5" in str(exc.value) and message in str(exc.value)


def test_missing_and_corrupt_video_files(tmp_path):
    with pytest.raises(MediaError, match="does not exist"):
        load_video(tmp_path / "missing.mp4")
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 100)
    with pytest.raises(MediaError, match="corrupt.mp4.*cannot decode"):
        load_video(corrupt)


def test_media_keys(tmp_path):
    a = np.zeros((2, 4, 4, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0, 0] = 1
    assert media_key(a) == media_key(a.copy())
    assert media_key(a) != media_key(b)
    assert media_key(a, explicit_id="x") == f"id:x|{media_key(a)}"  # an id narrows, never replaces
    p = tmp_path / "f.bin"
    p.write_bytes(b"1")
    assert media_key(p) == media_key(str(p))
    assert media_key(tmp_path / "absent") is None


def test_exif_orientation_is_applied_to_images(tmp_path):
    """Round 3: EXIF orientation was ignored on images (videos' display matrix was already applied). A
    phone photo stored sideways with Orientation 6 (rotate 90 degrees clockwise to display) is scored
    upright; an image without the tag is unchanged."""
    from PIL import Image

    from capreward.media import load_image

    stored = np.zeros((40, 60, 3), dtype=np.uint8)  # 60 wide, 40 high: red left half, blue right half
    stored[:, :30, 0] = 255
    stored[:, 30:, 2] = 255
    stored[:5, :, 1] = 255  # a green top band, so that every rotation is distinguishable
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6
    path = tmp_path / "sideways.png"
    image.save(path, exif=exif.tobytes())
    upright = np.rot90(stored, k=-1)  # 90 degrees clockwise, computed independently of PIL
    loaded = np.asarray(load_image(str(path)))
    assert loaded.shape == (60, 40, 3)
    assert np.array_equal(loaded, upright)
    with Image.open(path) as lazy:  # an in-memory PIL image with the tag, as a user passes it
        assert np.array_equal(np.asarray(load_image(lazy)), upright)
    plain = tmp_path / "plain.png"
    image.save(plain)
    assert np.array_equal(np.asarray(load_image(str(plain))), stored)


def test_a_short_video_sampled_to_more_frames_says_so_once(caplog):
    """Round 3: an 8-frame array was resampled to 10 frames (two repeated) without a word."""
    import logging

    from capreward.media import load_video
    from capreward.media.videos import _WARNED_REPEATS

    _WARNED_REPEATS.discard((8, 10))
    frames = np.random.default_rng(0).integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)
    with caplog.at_level(logging.WARNING, logger="capreward.media.videos"):
        out = load_video(frames, frames=10)
        load_video(frames, frames=10)
    assert len(out) == 10
    warned = [r.getMessage() for r in caplog.records if "sampled to frames=10" in r.getMessage()]
    assert len(warned) == 1 and "8 frames" in warned[0] and "2 of the 10 samples" in warned[0]
    assert "frames=None" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="capreward.media.videos"):
        assert len(load_video(frames, frames=None)) == 8 and len(load_video(frames, frames=8)) == 8
    assert not caplog.records
