"""A video over the size limits is refused from its container header, before any frame is decoded here.

decord would only tell the frame size by decoding a frame; the loader asks ffmpeg for the header's
declared size first (in a child process). The tests spy on decord: an over-large video never reaches
it, or reaches it only to count frames and never decodes one. Without an ffmpeg binary the first
decoded frame is still checked.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import capreward.media.probe as probe
from capreward.media import ConfinedFile, MediaError, load_video, media_limits
from capreward.media.probe import header_frame_sizes, parse_stream_sizes

from conftest import random_video, write_mp4

H, W, T = 40, 56, 6  # the clip: 2,240 pixels a frame


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "clip.mp4"
    return write_mp4(path, random_video(7, frames=T, height=H, width=W))


@pytest.fixture()
def decord_calls(monkeypatch) -> list[str]:
    """'open' for every decord.VideoReader made, 'decode' for every batch of frames decoded."""
    import decord

    calls: list[str] = []
    reader_class = decord.VideoReader

    class Spy:
        def __init__(self, *args, **kwargs):
            calls.append("open")
            self.reader = reader_class(*args, **kwargs)

        def __len__(self):
            return len(self.reader)

        def get_batch(self, indices):
            calls.append("decode")
            return self.reader.get_batch(indices)

    monkeypatch.setattr(decord, "VideoReader", Spy)
    return calls


def test_the_header_gives_the_size_without_decoding(clip):
    assert header_frame_sizes(str(clip)) == [(W, H)]
    fd = os.open(clip, os.O_RDONLY)
    try:  # through the descriptor, as confined files are read; ffmpeg's own decoder bounded to 100 px
        assert header_frame_sizes(f"/proc/self/fd/{fd}", pass_fd=fd, max_pixels=100) == [(W, H)]
    finally:
        os.close(fd)
    assert header_frame_sizes(str(clip.parent / "absent.mp4")) is None


def test_stream_listing_parse():
    text = """Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'x.mp4':
  Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), 1920x1080 [SAR 1:1 DAR 16:9], 25 fps
  Stream #0:1[0x2](und): Audio: aac (LC) (mp4a / 0x6134706D), 44100 Hz, stereo, fltp, 128 kb/s
  Stream #0:2: Video: mjpeg (Baseline), yuvj420p(pc, bt470bg/unknown/unknown), 600x800, 90k tbn (attached pic)
  Stream #0:3: Video: h264, none, 0x0
"""
    assert parse_stream_sizes(text) == [(1920, 1080), (600, 800)]  # tags like 0x31637661 are no sizes


@pytest.mark.parametrize("confined", [False, True])
def test_an_oversized_video_is_refused_before_decord_sees_it(clip, decord_calls, confined):
    item = ConfinedFile(clip.parent.resolve(), clip.name) if confined else str(clip)
    with media_limits(max_pixels=H * W - 1), pytest.raises(MediaError) as exc:
        load_video(item, index=3)
    assert f"item 3 ('{clip.resolve() if confined else clip}')" in str(exc.value)
    assert f"{W}x{H} = {H * W:,} pixels, over the limit of {H * W - 1:,}" in str(exc.value)
    assert decord_calls == []
    with media_limits(max_pixels=H * W):  # at the limit: decoded
        assert load_video(item, frames=2).shape == (2, H, W, 3)
    assert decord_calls == ["open", "decode", "decode"]


def test_too_many_frames_are_refused_before_any_frame_is_decoded(clip, decord_calls):
    with media_limits(max_video_pixels=4 * H * W - 1), pytest.raises(MediaError, match="4 frames of 56x40"):
        load_video(clip, frames=4, index=0)
    assert decord_calls == ["open"]  # opened to count the frames, none decoded
    decord_calls.clear()
    with media_limits(max_video_pixels=4 * H * W):
        frames = load_video(clip, frames=4)
    assert frames.shape == (4, H, W, 3) and decord_calls == ["open", "decode", "decode"]
    assert np.array_equal(frames, load_video(clip, frames=4))


def test_without_ffmpeg_the_first_decoded_frame_is_checked(clip, decord_calls, monkeypatch):
    monkeypatch.setattr(probe, "ffmpeg_exe", lambda: None)
    assert header_frame_sizes(str(clip)) is None
    with media_limits(max_pixels=H * W - 1), pytest.raises(MediaError, match="over the limit"):
        load_video(clip)
    assert decord_calls == ["open", "decode"]  # one frame, then refused
