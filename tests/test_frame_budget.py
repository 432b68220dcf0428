"""Memory bounded by what the encoder sees (issue 21.5).

A video's frames are refused before decoding when frames x the encoder's input pixels exceed the frame
budget ``max_model_pixels``, and the frames within it are decoded, preprocessed and encoded a chunk at a
time. Peak RSS is measured in processes of their own (``VmHWM``; the CLI's two runs as
children of the test zygote, :mod:`cli_process`) on a long synthetic video
(1,000 frames of 32x32: 3 MB decoded) scored with ``frames=None`` (``--frames 0``) by a tiny CLIP with
a 224-px input (random weights, OpenAI format, loaded as any checkpoint), at every entry point: the
Python API, ``capreward score`` and the reward server. Before this change the whole video's preprocessed
pixels were held at once, twice: 1,000 x 602 KB = 0.6 GB per copy; now one chunk of 64 frames (39 MB).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capreward.media import MediaError, media_limits

import cli_process
from conftest import random_video, write_mp4
from serve_process import Server

LONG_FRAMES = 1_000
#: Growth of the peak RSS allowed for scoring the long video over scoring a 12-frame one: generous (the
#: chunked encoder holds ~2 chunks of 64 x 602 KB; holding the preprocessed pixels took ~1.2 GB).
GROWTH_BOUND = 400 * 2**20
CAPTION = "a red and green image."


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("budget")
    base = random_video(1, frames=16, height=32, width=32)
    frames = base[np.arange(LONG_FRAMES) % 16]  # cheap to encode: a loop of 16 frames
    return {"long": write_mp4(d / "long.mp4", frames, fps=30), "short": write_mp4(d / "short.mp4", base[:12]),
            "root": d}


@pytest.fixture(scope="module")
def clip224(tmp_path_factory) -> Path:
    """A tiny CLIP whose image tower takes 224-px inputs (7x7 patches of 32 px), as ViT-B/32 does."""
    import copy

    import torch

    from capreward.testing.tiny_clip import TINY_CLIP_CONFIG, build_tiny_clip, openai_state_dict

    cfg = copy.deepcopy(TINY_CLIP_CONFIG)
    cfg["vision"].update(image_size=224, patch_size=32)
    path = tmp_path_factory.mktemp("clip224") / "tiny224.pt"
    torch.save(openai_state_dict(build_tiny_clip(0, cfg)), path)
    return path


def test_the_frame_budget_is_checked_before_decoding(videos, tiny_backbone):
    from capreward.scorers.emscore import EMScore

    assert tiny_backbone.input_pixels == 32 * 32
    em = EMScore(backbone=tiny_backbone, frames=None)
    with media_limits(max_model_pixels=12 * 32 * 32 - 1), pytest.raises(MediaError) as exc:
        em.score([CAPTION, CAPTION], videos=[str(videos["short"])] * 2, video_ids=["a", "b"])
    assert "item 0" in str(exc.value)
    assert "12 frames at the encoder's input of 1,024 pixels are 12,288 pixels, over the frame budget of 12,287" \
        in str(exc.value)
    with media_limits(max_model_pixels=12 * 32 * 32):  # at the budget: scored
        assert np.isfinite(float(em.score([CAPTION], videos=[str(videos["short"])]).score[0]))
    # in-memory frames are counted the same way
    with media_limits(max_model_pixels=5 * 32 * 32), pytest.raises(MediaError, match="frame budget"):
        em.score([CAPTION], videos=[random_video(2, frames=6, height=32, width=32)])


def test_chunked_encoding_gives_the_same_embeddings(videos):
    from capreward.backbones import CLIPBackbone
    from capreward.testing import tiny_clip_factory

    small = CLIPBackbone(tiny_clip_factory(seed=0), image_batch_size=5)
    large = CLIPBackbone(tiny_clip_factory(seed=0), image_batch_size=256)
    items = [str(videos["short"]), random_video(3, frames=7, height=40, width=56)]
    a = small.visual_embeddings(items, kind="video", frames=None)
    b = large.visual_embeddings(items, kind="video", frames=None)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        assert float((x - y).abs().max()) < 1e-5


# ---------------------------------------------------------------------------- peak RSS, fresh processes
# VmHWM, not ru_maxrss: after fork and exec, ru_maxrss starts at the pages the parent (a large pytest
# worker) had, so a child's growth below that reads as zero; VmHWM is the new program's own peak
API_CODE = """
import re, sys
from capreward.backbones import CLIPBackbone
from capreward.scorers.emscore import EMScore
em = EMScore(model=sys.argv[1], frames=None)
def peak():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
em.score(["a red and green image."], videos=[sys.argv[2]])  # warm: model, decoders, allocator
before = peak()
result = em.score(["a red and green image."], videos=[sys.argv[3]])
print("GROWTH", peak() - before, "SCORE", float(result.score[0]))
"""


def _growth(text: str) -> int:
    return int(re.search(r"GROWTH (-?\d+)", text).group(1))


def test_api_peak_rss_on_a_long_video(videos, clip224):
    proc = subprocess.run([sys.executable, "-c", API_CODE, str(clip224), str(videos["short"]),
                           str(videos["long"])], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    growth = _growth(proc.stdout)
    assert re.search(r"SCORE -?\d", proc.stdout), proc.stdout
    print(f"API, frames=None, {LONG_FRAMES} frames: peak RSS +{growth / 2**20:.1f} MB")
    assert growth < GROWTH_BOUND, f"+{growth / 2**20:.0f} MB"


def _cli_peak(videos, clip_path: Path, video: Path, tmp: Path) -> tuple[str, int]:
    """How the CLI ran (a zygote's child or a plain process) and its peak RSS in bytes."""
    manifest = tmp / f"{video.stem}.jsonl"
    manifest.write_text(json.dumps({"id": "v", "caption": CAPTION, "video": str(video)}) + "\n")
    out = tmp / f"{video.stem}.scores.jsonl"
    out.unlink(missing_ok=True)
    proc = cli_process.run(["score", manifest, "--out", out, "--metrics", "emscore", "--clip-model", clip_path,
                            "--frames", "0", "--no-progress"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(out.read_text().splitlines()[0])
    assert not row.get("errors") and np.isfinite(row["emscore"]), row
    return cli_process.last_run, proc.peak_rss


def test_cli_frames_0_peak_rss_on_a_long_video(videos, clip224, tmp_path):
    for _ in range(2):  # two zygote children: the first run in an environment may be plain, whose wait4 peak
        # counts this process's own pages before its exec and would show nothing
        (short_kind, short), (long_kind, long) = (_cli_peak(videos, clip224, videos[v], tmp_path) for v in ("short", "long"))
        if short_kind == long_kind == "zygote":
            break
    if "plain" in (short_kind, long_kind):
        pytest.skip("CAPREWARD_TEST_PLAIN_CLI=1: a plain child's peak RSS counts this process's pages")
    print(f"capreward score --frames 0, {LONG_FRAMES} frames: peak RSS {long / 2**20:.0f} MB "
          f"(12 frames: {short / 2**20:.0f} MB)")
    assert long - short < GROWTH_BOUND, f"+{(long - short) / 2**20:.0f} MB"


def test_server_frames_0_peak_rss_on_a_long_video(videos, clip224):
    srv = Server(["--reward", "emscore", "--clip-model", str(clip224), "--media-root", str(videos["root"]),
                  "--frames", "0", "--fallback", "-7"], timeout=300)

    def hwm() -> int:
        status = Path(f"/proc/{srv.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024

    try:
        status, body = srv.post({"query": [CAPTION], "labels": [{"video": "short.mp4"}]})
        assert status == 200 and body["errors"] == [None], body
        before = hwm()
        status, body = srv.post({"query": [CAPTION], "labels": [{"video": "long.mp4"}]})
        after = hwm()
    finally:
        assert srv.stop() == 0
    assert status == 200 and body["errors"] == [None], body
    print(f"reward server --frames 0, {LONG_FRAMES} frames: peak RSS +{(after - before) / 2**20:.1f} MB")
    assert after - before < GROWTH_BOUND, f"+{(after - before) / 2**20:.0f} MB"
