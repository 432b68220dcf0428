"""Videos as people record them (issue 21.6), on files the ffmpeg command line wrote: rotated videos (a
display matrix in the header, as phones record) come out upright, as ffmpeg's own autorotation shows
them, and score like an upright copy; frames narrower than 32 px decode and score. Each through the
default backend and each installed backend by name (``backend=None`` uses only the API main had)."""

from __future__ import annotations

import numpy as np
import pytest

from capreward.media import load_video

from conftest import random_video, write_mp4
from media_files import ffmpeg_upright, quadrant_clip, write_rotated

try:
    import decord  # noqa: F401

    BACKENDS = [None, "pyav", "decord"]
except ImportError:
    BACKENDS = [None, "pyav"]


def _load(path, name, **kwargs):
    return load_video(str(path), **kwargs, **({"backend": name} if name else {}))


ORIENTATIONS = {  # every way a frame can be turned and mirrored, for telling the right one from the rest
    "identity": lambda f: f, "rot90": lambda f: np.rot90(f, 1, axes=(1, 2)),
    "rot180": lambda f: np.rot90(f, 2, axes=(1, 2)), "rot270": lambda f: np.rot90(f, 3, axes=(1, 2)),
    "flip_x": lambda f: f[:, :, ::-1], "flip_y": lambda f: f[:, ::-1],
    "transpose": lambda f: f.transpose(0, 2, 1, 3), "anti": lambda f: np.rot90(f, 2, axes=(1, 2)).transpose(0, 2, 1, 3),
}


@pytest.mark.parametrize("degrees, hflip", [(90, False), (180, False), (270, False), (-90, False), (90, True), (0, True)])
@pytest.mark.parametrize("name", BACKENDS)
def test_rotated_videos_come_out_upright(tmp_path, degrees, hflip, name):
    stored = quadrant_clip()
    path = write_rotated(tmp_path / "phone.mp4", stored, degrees, hflip)
    frames = _load(path, name, frames=None)
    turned = degrees % 180 != 0
    h, w = stored.shape[1:3]
    assert frames.shape == ((6, w, h, 3) if turned else (6, h, w, 3))
    shown = ffmpeg_upright(path, frames.shape[2], frames.shape[1]).astype(int)  # ffmpeg's autorotation
    diff = np.abs(frames.astype(int) - shown).mean()
    assert diff < 4, diff  # ffmpeg turns the YUV planes before converting: chroma edges differ slightly
    for other, turn in ORIENTATIONS.items():  # any other orientation is far off
        candidate = turn(frames)
        if candidate.shape == frames.shape and not np.array_equal(candidate, frames):
            assert np.abs(candidate.astype(int) - shown).mean() > 30, other


def test_a_rotated_video_scores_like_its_upright_copy(tmp_path, tiny_backbone):
    from capreward.scorers.emscore import EMScore

    stored = quadrant_clip(frames=4)
    rotated = write_rotated(tmp_path / "rot.mp4", stored, 90)
    upright = write_mp4(tmp_path / "upright.mp4", np.ascontiguousarray(np.rot90(stored, 1, axes=(1, 2))))
    sideways = write_mp4(tmp_path / "sideways.mp4", stored)
    em = EMScore(backbone=tiny_backbone)
    result = em.score(["a red and green picture"] * 3, videos=[str(rotated), str(upright), str(sideways)])
    s = [float(v) for v in result.video.fine_r]  # frame-level: sees the frames' layout
    assert s[0] == pytest.approx(s[1], abs=2e-3)
    assert abs(s[0] - s[2]) > 10 * abs(s[0] - s[1])  # the stored (sideways) frames score differently


@pytest.mark.parametrize("width", [2, 8, 16, 24, 30, 48])  # decord garbles all but 30
@pytest.mark.parametrize("name", BACKENDS)
def test_narrow_frames_decode(tmp_path, width, name):
    frames = random_video(width, frames=5, height=48, width=width)
    path = write_mp4(tmp_path / f"w{width}.mp4", frames)
    got = _load(path, name, frames=None)
    assert got.shape == (5, 48, width, 3)
    shown = ffmpeg_upright(path, width, 48).astype(int)  # the ffmpeg command line's decode
    assert np.abs(got.astype(int) - shown).max() <= 2


def test_narrow_frames_score(tmp_path, tiny_backbone):
    from capreward.scorers.emscore import EMScore

    path = write_mp4(tmp_path / "narrow.mp4", random_video(3, frames=4, height=64, width=16))
    result = EMScore(backbone=tiny_backbone).score(["a tall thin picture"], videos=[str(path)])
    assert np.isfinite(float(result.score[0]))
