"""A video over the size limits is refused from its container header, before any frame is decoded here.

The header is read through PyAV (:mod:`capreward.media.probe`) with the demuxer forced and FFmpeg's
own decoder limit ``max_pixels`` in force while it analyses the streams. The tests spy on decord: an
over-large video never reaches it, or reaches it only to count frames and never decodes one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from capreward.media import ConfinedFile, MediaError, load_video, media_limits
from capreward.media.backends import decord_available
from capreward.media.probe import ProbeError, probe_video

from conftest import random_video, write_mp4

needs_decord = pytest.mark.skipif(not decord_available(), reason="decord is not installed here")

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


def test_the_header_gives_the_size_and_count_before_a_frame_is_decoded(clip):
    fd = os.open(clip, os.O_RDONLY)
    try:
        seen = []
        header = probe_video(fd, "mp4", max_pixels=H * W, before_decode=lambda *a: seen.append(a))
        assert seen == [(((W, H),), T)]  # what the header declares, handed over before the first decode
        assert (header.width, header.height, header.declared_frames, header.container) == (W, H, T, "mp4")
        assert header.orientation.identity
        with pytest.raises(RuntimeError, match="refused"):  # the caller's refusal stops the probe there
            probe_video(fd, "mp4", before_decode=lambda *a: (_ for _ in ()).throw(RuntimeError("refused")))
        # FFmpeg's decoder itself is bounded while the probe decodes (at about twice the limit, as it
        # counts its padded buffer): a limit far under the frame fails in the decoder
        with pytest.raises(ProbeError, match="first frame"):
            probe_video(fd, "mp4", max_pixels=H * W // 8)  # 2 x 280 + 1024 < 64 x 40 padded
    finally:
        os.close(fd)


@needs_decord
@pytest.mark.parametrize("confined", [False, True])
def test_an_oversized_video_is_refused_before_decord_sees_it(clip, decord_calls, confined):
    item = ConfinedFile(clip.parent.resolve(), clip.name) if confined else str(clip)
    with media_limits(max_pixels=H * W - 1), pytest.raises(MediaError) as exc:
        load_video(item, index=3, backend="decord")
    assert f"item 3 ('{clip.resolve() if confined else clip}')" in str(exc.value)
    assert f"{W}x{H} = {H * W:,} pixels, over the limit of {H * W - 1:,}" in str(exc.value)
    assert decord_calls == []
    with media_limits(max_pixels=H * W):  # at the limit: decoded
        assert load_video(item, frames=2, backend="decord").shape == (2, H, W, 3)
    assert decord_calls == ["open", "decode", "decode"]  # its first frame checked, then the sampled ones


@needs_decord
def test_too_many_frames_are_refused_before_any_frame_is_decoded(clip, decord_calls):
    with media_limits(max_video_pixels=4 * H * W - 1), pytest.raises(MediaError, match="4 frames of 56x40"):
        load_video(clip, frames=4, index=0, backend="decord")
    assert decord_calls == ["open"]  # opened to count the frames, none decoded
    decord_calls.clear()
    with media_limits(max_video_pixels=4 * H * W):
        frames = load_video(clip, frames=4, backend="decord")
    assert frames.shape == (4, H, W, 3) and decord_calls == ["open", "decode", "decode"]
    assert np.array_equal(frames, load_video(clip, frames=4, backend="pyav"))
