"""Video backends (issue 22.3): decord where it is installed, PyAV everywhere, chosen at run time.

The same frame indices and the same pixels from both (on synthetic clips here, on the sample clips in
``test_sample_clips_agree``), the choice made explicitly through the API, a ``with`` block or
``CAPREWARD_VIDEO_BACKEND``. Rotated and narrow videos: ``test_video_orientation.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from capreward.media import MediaError, load_video, open_video
from capreward.media.backends import decord_available, get_video_backend, resolve_backend, set_video_backend, video_backend

from conftest import random_video, sample_clips, write_mp4

needs_decord = pytest.mark.skipif(not decord_available(), reason="decord is not installed here")
BACKENDS = ["pyav"] + (["decord"] if decord_available() else [])


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("backends")
    return {
        "plain": str(write_mp4(d / "plain.mp4", random_video(5, frames=23, height=40, width=56))),
        "one": str(write_mp4(d / "one.mp4", random_video(6, frames=1, height=40, width=56))),
        "mkv": str(_remux(write_mp4(d / "src.mp4", random_video(7, frames=17, height=40, width=56)), d / "clip.mkv")),
    }


def _remux(src, dst):
    from media_files import run_ffmpeg

    run_ffmpeg("-i", str(src), "-c", "copy", str(dst))
    return dst


# ------------------------------------------------------------------------------------------- choice
def test_auto_prefers_decord_when_it_is_installed(monkeypatch):
    import capreward.media.backends as backends

    assert resolve_backend("auto") == ("decord" if decord_available() else "pyav")
    monkeypatch.setattr(backends, "decord_available", lambda: False)
    assert resolve_backend("auto") == "pyav"
    with pytest.raises(ValueError, match="not installed"):
        resolve_backend("decord")
    with pytest.raises(ValueError, match="auto, decord, pyav"):
        resolve_backend("ffmpeg")


@pytest.mark.parametrize("name", BACKENDS)
def test_the_explicit_choice_decodes(clips, name):
    with open_video(clips["plain"], frames=5, backend=name) as video:
        assert video.backend == name and (video.count, video.total) == (5, 23)
    previous = get_video_backend()
    with video_backend(name):
        with open_video(clips["plain"]) as video:
            assert video.backend == name
    assert get_video_backend() == previous
    old = set_video_backend(name)
    try:
        with open_video(clips["plain"]) as video:
            assert video.backend == name
    finally:
        set_video_backend(old)


def test_the_environment_variable_chooses(clips):
    code = ("from capreward.media import open_video\n"
            f"with open_video({clips['plain']!r}) as v: print(v.backend)\n")
    env = dict(os.environ, CAPREWARD_VIDEO_BACKEND="pyav")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "pyav", out.stderr[-2000:]
    env["CAPREWARD_VIDEO_BACKEND"] = "gstreamer"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "CAPREWARD_VIDEO_BACKEND must be one of auto, decord, pyav" in out.stderr


# ------------------------------------------------------------------------------------ the same frames
@needs_decord
@pytest.mark.parametrize("clip", ["plain", "one", "mkv"])
@pytest.mark.parametrize("frames", [1, 4, 10, 40, None])
def test_both_backends_read_the_same_frames(clips, clip, frames):
    import decord

    a = load_video(clips[clip], frames=frames, backend="decord")
    b = load_video(clips[clip], frames=frames, backend="pyav")
    assert a.shape == b.shape
    assert np.abs(a.astype(int) - b).max() <= 2  # identical indices; pixels within rounding (0 here)
    # the frames are the ones decord itself returns at int(linspace(0, T-1, k)), read independently
    reader = decord.VideoReader(clips[clip])
    t = len(reader)
    expected = np.linspace(0, t - 1, frames).astype(int) if frames else np.arange(t)
    assert np.array_equal(a, reader.get_batch(list(expected)).asnumpy())


@pytest.mark.parametrize("name", BACKENDS)
def test_chunks_are_the_frames_in_order(clips, name):
    with open_video(clips["plain"], frames=None, backend=name) as video:
        parts = list(video.chunks(4))
    assert [len(p) for p in parts] == [4, 4, 4, 4, 4, 3]
    assert np.array_equal(np.concatenate(parts), load_video(clips["plain"], frames=None, backend=name))


@needs_decord
def test_sample_clips_agree():
    """The shared sample clips decode to the same pixels through both backends (the README quotes the
    differences: ``python benchmarks/video_backends.py``)."""
    clips = sample_clips()
    if not clips:
        pytest.skip("sample clips not found")
    for clip in clips:
        a = load_video(str(clip), frames=10, backend="decord")
        b = load_video(str(clip), frames=10, backend="pyav")
        assert a.shape == b.shape and np.abs(a.astype(int) - b).max() <= 2, clip


def test_a_bad_backend_name_is_an_error_naming_the_choices(clips):
    with pytest.raises(ValueError, match="auto, decord, pyav"):
        load_video(clips["plain"], backend="opencv")
    with pytest.raises(MediaError, match="does not exist"):
        load_video(clips["plain"] + ".absent", backend="pyav")


def test_decord_is_required_only_where_it_has_wheels():
    """pyproject: PyAV on every platform; decord (wheels for Linux and Windows on x86-64 only, no sdist)
    behind an environment marker, so that `pip install capreward` resolves on macOS arm64 and Linux
    aarch64."""
    import tomllib

    from packaging.requirements import Requirement

    from conftest import REPO

    deps = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    by_name = {r.name: r for r in deps}
    assert "av" in by_name and by_name["av"].marker is None
    decord = by_name["decord"]
    platforms = {
        ("linux", "x86_64"): True, ("win32", "AMD64"): True,
        ("linux", "aarch64"): False, ("darwin", "arm64"): False, ("darwin", "x86_64"): False,
    }
    for (system, machine), expected in platforms.items():
        env = {"sys_platform": system, "platform_machine": machine}
        assert (decord.marker is not None and decord.marker.evaluate(env)) is expected, (system, machine)
