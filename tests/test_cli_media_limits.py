"""``--max-pixels`` / ``--max-video-pixels`` of the commands that read media (score, serve, explain):
shown with their defaults, validated by argparse (one line, exit 2), applied for the command only, and
carried to the Ray engine's actors, which run in other processes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image

import capreward.cli.explain as explain_module
from capreward.cli.main import build_parser, main
from capreward.jobs.results_file import read_results
from capreward.media import DEFAULT_MAX_PIXELS, DEFAULT_MAX_VIDEO_PIXELS, get_media_limits

from conftest import random_video, write_mp4
from serve_process import Server
import cli_process

H, W = 40, 56  # the big image and video frames: 2,240 pixels
LIMIT = 1000  # refuses them, lets the 24x24 image through
COMMANDS = ("score", "serve", "explain")


def cli(*args, env=None) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    for var in ("CAPREWARD_MAX_PIXELS", "CAPREWARD_MAX_VIDEO_PIXELS"):
        env.pop(var, None)
    return cli_process.run(args, timeout=600, env=env)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("limits")
    Image.fromarray(random_video(1, frames=1, height=H, width=W)[0]).save(d / "big.png")
    Image.fromarray(random_video(2, frames=1, height=24, width=24)[0]).save(d / "small.png")
    write_mp4(d / "clip.mp4", random_video(3, frames=6, height=H, width=W))
    rows = [{"id": "big", "image": "big.png", "caption": "a red ball"},
            {"id": "small", "image": "small.png", "caption": "a red ball"},
            {"id": "clip", "video": "clip.mp4", "caption": "a red ball"}]
    (d / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def subparser(name: str):
    return build_parser()._subparsers._group_actions[0].choices[name]


def test_the_options_show_their_defaults():
    for name in COMMANDS:
        text = subparser(name).format_help()
        assert "--max-pixels N" in text and f"(default: {DEFAULT_MAX_PIXELS})" in text, name
        assert "--max-video-pixels N" in text and f"(default: {DEFAULT_MAX_VIDEO_PIXELS})" in text, name
        args = subparser(name).parse_args((["m.jsonl", "--out", "o.jsonl"] if name != "serve" else [])
                                          + ["--max-pixels", "1_000", "--max-video-pixels", "5000"])
        assert (args.max_pixels, args.max_video_pixels) == (1000, 5000)


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "abc", "", "1e6"])
def test_bad_values_exit_2_with_one_line(value, capsys):
    with pytest.raises(SystemExit) as exc:
        subparser("score").parse_args(["m.jsonl", "--out", "o.jsonl", "--max-pixels", value])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"capreward score: error: argument --max-pixels: invalid pixel count {value!r} (a positive integer, e.g. 33554432)"


def test_the_limits_hold_for_the_command_only(monkeypatch, media):
    seen = []
    monkeypatch.setattr(explain_module, "run", lambda args: seen.append(get_media_limits()) or 0)
    before = get_media_limits()
    assert main(["explain", str(media / "m.jsonl"), "--out", str(media / "o.jsonl"), "--max-pixels", "77",
                 "--max-video-pixels", "88"]) == 0
    assert (seen[0].max_pixels, seen[0].max_video_pixels) == (77, 88)
    assert get_media_limits() == before


def check_refused(rows: dict, metric: str) -> None:
    big, clip = rows["big"]["errors"][metric], rows["clip"]["errors"][metric]
    assert big.startswith("row 'big': ") and "big.png" in big
    assert f"{W}x{H} = {W * H:,} pixels, over the limit of {LIMIT:,}" in big
    assert clip.startswith("row 'clip': ") and "clip.mp4" in clip and f"video frames are {W}x{H}" in clip
    assert rows["small"]["errors"] is None and rows["small"][metric] is not None
    assert metric not in rows["big"] and metric not in rows["clip"]


def test_score_refuses_oversized_media_naming_the_row(media, tiny_clip_path, tmp_path):
    out = tmp_path / "o.jsonl"
    proc = cli("score", media / "m.jsonl", "--out", out, "--metrics", "clip-s", "--clip-model", tiny_clip_path,
               "--max-pixels", LIMIT, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    check_refused({r["id"]: r for r in read_results(out)}, "clip_s")
    out = tmp_path / "frames.jsonl"  # frames within --max-pixels, but 6 of them over --max-video-pixels
    proc = cli("score", media / "m.jsonl", "--out", out, "--metrics", "clip-s", "--clip-model", tiny_clip_path,
               "--max-video-pixels", 5 * W * H, "--frames", 6, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in read_results(out)}
    assert rows["clip"]["errors"]["clip_s"].startswith("row 'clip': ")
    assert f"6 frames of {W}x{H}" in rows["clip"]["errors"]["clip_s"] and rows["big"]["errors"] is None


def test_serve_refuses_oversized_media_per_sample(media, tiny_clip_path):
    srv = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media),
                  "--fallback", "-1", "--max-pixels", str(LIMIT)])
    try:
        status, body = srv.post({"query": ["a red ball"] * 3,
                                 "labels": [{"image": "big.png"}, {"image": "small.png"}, {"video": "clip.mp4"}]})
    finally:
        assert srv.stop() == 0
    assert status == 200, body
    assert body["rewards"][0] == -1.0 and body["rewards"][2] == -1.0 and body["rewards"][1] >= 0
    assert "'<media-root>/big.png'" in body["errors"][0] and f"over the limit of {LIMIT:,}" in body["errors"][0]
    assert "'<media-root>/clip.mp4'" in body["errors"][2] and f"over the limit of {LIMIT:,}" in body["errors"][2]
    assert body["errors"][1] is None


@pytest.mark.slow
def test_ray_actors_get_the_drivers_limits(media, tiny_clip_path, tmp_path):
    """The actors are other processes, started without the flag in their environment."""
    pytest.importorskip("ray")
    out = tmp_path / "ray.jsonl"
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    proc = cli("score", media / "m.jsonl", "--out", out, "--metrics", "clip-s", "--clip-model", tiny_clip_path,
               "--max-pixels", LIMIT, "--engine", "ray", "--num-actors", "1", "--no-progress", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_refused({r["id"]: r for r in read_results(out)}, "clip_s")
