"""The bad-input matrix: every kind of hostile or unusual media and caption x every public entry point.

Each cell puts one case between two good samples. An invalid case must give a clear error naming the
item: the scorers that raise (EMScore, CLIP-S, PAC-S, FLEUR) raise naming item 1; everything that
isolates samples (VisCE², G-VEval, the rewards, the composite, ``capreward score``, the reward server,
the veRL adapter) gives that sample None / the fallback with a reason, and the good samples the values
they get when scored alone. A valid case (1-frame video, 1x1, 16-bit, CMYK, RGBA, palette, float,
1-bit, emoji and over-long captions) must score, equal to its 8-bit RGB equivalent where it has one.
Nothing may hang (subprocesses and HTTP calls run under timeouts) and the bombs must not cost memory
(peak RSS checks, see :func:`bounded_memory`).

To keep the module fast, the isolating entry points score all cases of a visual kind in one batch
(computed once per entry point); the raising scorers are called once per case.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from capreward.media import DEFAULT_MAX_PIXELS, MediaError

from capreward.adapters.openrlhf import post_json
from conftest import random_video, write_mp4
from fixtures_llava import one_torch_thread, tiny_judge, tiny_judge_path, vlm_judge  # noqa: F401
from serve_process import Server

MEMORY_BOUND = 400 * 2**20  # bytes a bad item may add to a process's peak RSS (a bomb would add GBs)
GOOD_CAPTIONS = ["a red ball", "a green box"]  # captions the tiny judges were trained on
SIDE = 32  # the tiny CLIP's input size: resize and crop are no-ops, so alpha cannot change CLIP pixels


# ------------------------------------------------------------------------------------------ the cases
@dataclass
class Case:
    """One kind of input. ``kind``: "image", "video" or "caption" (the caption of the middle sample).
    ``make(root)`` returns the input; ``equivalent(root)`` its 8-bit RGB equivalent (valid cases);
    ``error``: regex the reason must match (invalid cases); ``files``: expressible as a path in a
    manifest, a server label or a veRL label; ``valid_for``: entry points where a case that is an
    error elsewhere is valid (or the reverse with ``invalid_for``)."""

    kind: str
    make: Callable[[Path], Any]
    error: str | None = None
    equivalent: Callable[[Path], Any] | None = None
    files: bool = True
    invalid_for: dict[str, str] = field(default_factory=dict)  # entry point -> error regex
    files_equivalent: bool = True  # the equivalent is a file too (else only in-process entry points compare)

    @property
    def valid(self) -> bool:
        return self.error is None


def _image(array: np.ndarray, mode: str | None = None) -> Image.Image:
    return Image.fromarray(array, mode) if mode else Image.fromarray(array)


RNG = np.random.default_rng(12)
RGB = RNG.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
GREY = RNG.integers(0, 256, (SIDE, SIDE), dtype=np.uint8)
ALPHA = np.where(RNG.random((SIDE, SIDE)) < 0.5, 0, 255).astype(np.uint8)
PALETTE = RNG.integers(0, 256, 48).tolist()
INDICES = RNG.integers(0, 16, (SIDE, SIDE)).astype(np.uint8)


def saved(name: str, image: Image.Image | Callable[[], Image.Image], **kwargs) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        path = root / name
        if not path.exists():
            (image() if callable(image) else image).save(path, **kwargs)
        return str(path)

    return make


def written(name: str, content: bytes | Callable[[Path], bytes]) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        path = root / name
        if not path.exists():
            path.write_bytes(content(root) if callable(content) else content)
        return str(path)

    return make


def blank_png(width: int, height: int) -> Callable[[Path], bytes]:
    """A black greyscale PNG of any size, written row by row (the pixels never exist in memory)."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    def make(root: Path) -> bytes:
        compressor = zlib.compressobj(9)
        row = bytes(width + 1)  # filter byte 0, then the row's zeros
        idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
        header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")

    return make


def _palette() -> Image.Image:
    image = Image.fromarray(INDICES, "P")
    image.putpalette(PALETTE)
    image.info["transparency"] = 2
    return image


def _good_video(root: Path, i: int) -> str:
    path = root / f"good{i}.mp4"
    if not path.exists():
        write_mp4(path, random_video(80 + i, frames=12, height=SIDE, width=SIDE))
    return str(path)


def _truncated_mp4(root: Path) -> bytes:
    data = Path(_good_video(root, 0)).read_bytes()
    return data[: len(data) // 2]


def _one_frame(root: Path) -> str:
    path = root / "one_frame.mp4"
    if not path.exists():
        write_mp4(path, random_video(90, frames=1, height=SIDE, width=SIDE))
    return str(path)


def _decoded_one_frame(root: Path) -> np.ndarray:
    import decord

    return decord.VideoReader(_one_frame(root))[0].asnumpy()[None]  # decord directly, not capreward


def _no_stream(root: Path) -> str:
    path = root / "no_frames.mp4"
    if not path.exists():
        import imageio_ffmpeg

        writer = imageio_ffmpeg.write_frames(str(path), (SIDE, SIDE), output_params=["-loglevel", "quiet"])
        writer.send(None)
        writer.close()
        if not path.exists():
            path.write_bytes(b"")
    return str(path)


def _directory(root: Path, name: str) -> str:
    (root / name).mkdir(exist_ok=True)
    return str(root / name)


TEXT = b"this is not an image, it is a text file\n" * 20
CANNOT = r"cannot (read|decode)"

CASES: dict[str, Case] = {
    # ---- image files
    "zero-byte image": Case("image", written("zero.png", b""), CANNOT),
    "missing image": Case("image", lambda r: str(r / "missing.png"), r"does not exist"),
    "directory as image": Case("image", lambda r: _directory(r, "a_dir.png"), r"not a file"),
    "text renamed .jpg": Case("image", written("text.jpg", TEXT), CANNOT),
    "truncated PNG": Case("image", written("trunc.png", lambda r: Path(saved("full.png", _image(RGB))(r)).read_bytes()[:300]), CANNOT),
    "decompression bomb PNG": Case("image", written("bomb.png", blank_png(30000, 30000)), r"too large"),
    "huge PNG": Case("image", written("huge.png", blank_png(8000, 6000)), r"over the limit"),
    "image is None": Case("image", lambda r: None, r"missing|no image", files=False),
    "NaN tensor image": Case("image", lambda r: __import__("torch").full((3, 8, 8), float("nan")), r"NaN", files=False),
    "unsupported image type": Case("image", lambda r: 12345, r"unsupported image type", files=False),
    "int tensor image out of 0..255": Case("image", lambda r: __import__("torch").full((3, 8, 8), 300), r"0\.\.255", files=False),
    # valid images, each equal to its 8-bit RGB equivalent
    "1x1 image": Case("image", saved("one.png", _image(RGB[:1, :1])), equivalent=lambda r: np.ascontiguousarray(RGB[:1, :1]),
                      files_equivalent=False),
    # torchmetrics' image tensors: int64 0..255, channel-first
    "int64 tensor image": Case("image", lambda r: __import__("torch").from_numpy(RGB).permute(2, 0, 1).to(__import__("torch").int64),
                               equivalent=lambda r: np.ascontiguousarray(RGB), files=False, files_equivalent=False),
    "16-bit PNG": Case("image", saved("g16.png", _image(GREY.astype(np.uint16) * 257)), equivalent=saved("g8.png", _image(GREY))),
    "float TIFF": Case("image", saved("f.tiff", _image(GREY.astype(np.float32) / 255, "F")), equivalent=saved("g8.png", _image(GREY))),
    "1-bit PNG": Case("image", saved("b1.png", _image(GREY >= 128)), equivalent=saved("b8.png", _image(np.where(GREY >= 128, 255, 0).astype(np.uint8)))),
    "CMYK TIFF": Case("image", saved("cmyk.tiff", _image(RGB).convert("CMYK")), equivalent=saved("rgb.png", _image(RGB))),
    "RGBA PNG": Case("image", saved("rgba.png", _image(np.dstack([RGB, ALPHA]), "RGBA")), equivalent=saved("rgb.png", _image(RGB))),
    "palette PNG with transparency": Case("image", saved("p.png", _palette), equivalent=saved("p_rgb.png", lambda: _palette().convert("RGB"))),
    # ---- video files
    "zero-byte mp4": Case("video", written("zero.mp4", b""), CANNOT),
    "missing video": Case("video", lambda r: str(r / "missing.mp4"), r"does not exist"),
    "directory as video": Case("video", lambda r: _directory(r, "a_dir.mp4"), r"not a file"),
    "text renamed .mp4": Case("video", written("text.mp4", TEXT), CANNOT),
    "truncated mp4": Case("video", written("trunc.mp4", _truncated_mp4), CANNOT),
    "mp4 without frames": Case("video", _no_stream, CANNOT),
    "video is None": Case("video", lambda r: None, r"missing|no image or video", files=False),
    "float video array": Case("video", lambda r: np.zeros((3, 8, 8, 3), np.float32), r"uint8", files=False),
    "1-frame video": Case("video", _one_frame, equivalent=_decoded_one_frame, files_equivalent=False),
    # ---- captions (the middle sample's; its visual is a good image)
    "empty caption": Case("caption", lambda r: "", r"empty"),
    "whitespace caption": Case("caption", lambda r: " \t\n ", r"empty"),
    "caption is None": Case("caption", lambda r: None, r"None|must be (a )?str|NoneType", files=False),
    "caption is an int": Case("caption", lambda r: 7, r"must be (a )?str|int", files=False),
    "20,000-char caption": Case("caption", lambda r: "a red ball and " * 1334, invalid_for={
        "FLEUR": r"context", "FLEURReward": r"context"}),
    "caption with NUL": Case("caption", lambda r: "a red\x00 ball"),
    "emoji caption": Case("caption", lambda r: "a red ball 🟥 with a 🐕 🌳"),
}
IMAGE_CASES = [k for k, c in CASES.items() if c.kind == "image"]
VIDEO_CASES = [k for k, c in CASES.items() if c.kind == "video"]
CAPTION_CASES = [k for k, c in CASES.items() if c.kind == "caption"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    for i, colour in enumerate(("red", "green")):
        from capreward.testing import fleur_task_image

        fleur_task_image(colour).save(root / f"good{i}.png")
        _good_video(root, i)
    for case in CASES.values():  # create every file once, up front
        case.make(root)
        if case.equivalent is not None:
            case.equivalent(root)
    return root


def good_visuals(root: Path, kind: str) -> list[str]:
    return [str(root / f"good{i}.{'mp4' if kind == 'video' else 'png'}") for i in range(2)]


def batch_for(root: Path, name: str, use_equivalent: bool = False) -> tuple[list, list, str]:
    """(captions, visuals, kind) of the three-sample batch around case ``name``."""
    case = CASES[name]
    kind = "image" if case.kind == "caption" else case.kind
    goods = good_visuals(root, kind)
    captions = [GOOD_CAPTIONS[0], GOOD_CAPTIONS[0], GOOD_CAPTIONS[1]]
    visuals = [goods[0], goods[0], goods[1]]
    value = (case.equivalent if use_equivalent else case.make)(root)
    if case.kind == "caption":
        captions[1] = value
    else:
        visuals[1] = value
    return captions, visuals, kind


# ------------------------------------------------------------------------------------ memory and hangs
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def bounded_memory(bound: int = MEMORY_BOUND):
    """Fail if the block raises this process's peak RSS by more than ``bound`` above its RSS at entry.
    (``ru_maxrss`` only grows, so a spike hidden under an earlier, higher peak passes; it never fails
    falsely. The subprocess entry points are checked on their own peaks.)"""
    rss, peak = _rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    yield
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert after <= max(peak, rss + bound), f"peak RSS rose by {(after - rss) / 2**20:.0f} MB"


def no_hang(func: Callable[[], Any], timeout: float = 600.0) -> Any:
    """Run ``func`` in a worker thread; fail (instead of blocking the suite) if it does not return."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = func()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"no answer within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -------------------------------------------------------------------------------------- entry points
@pytest.fixture(scope="module")
def clip_path(tiny_clip_path) -> str:
    return str(tiny_clip_path)


@pytest.fixture(scope="module")
def backbone(tiny_backbone):
    return tiny_backbone


@pytest.fixture(scope="module")
def scorers(backbone, tiny_judge, vlm_judge):  # noqa: F811
    from capreward import FLEUR, GVEval, VisCE2
    from capreward.scorers.clipscore import CLIPScore, PACScore
    from capreward.scorers.emscore import EMScore

    return {
        "EMScore": EMScore(backbone=backbone),
        "CLIPScore": CLIPScore(backbone=backbone),
        "PACScore": PACScore("unused", backbone=backbone),
        "FLEUR": FLEUR(tiny_judge),
        "VisCE2": VisCE2(vlm_judge),
        "GVEval": GVEval(vlm_judge, max_tokens=120),
    }


@pytest.fixture(scope="module")
def rewards(scorers):
    from capreward.rewards import (
        CLIPScoreReward,
        CompositeReward,
        EMScoreReward,
        FLEURReward,
        GVEvalReward,
        HallucinationPenalty,
        PACScoreReward,
        VisCE2Reward,
    )

    em = EMScoreReward(scorer=scorers["EMScore"])
    clip = CLIPScoreReward(scorer=scorers["CLIPScore"])
    return {
        "EMScoreReward": em,
        "CLIPScoreReward": clip,
        "PACScoreReward": PACScoreReward(scorer=scorers["PACScore"]),
        "FLEURReward": FLEURReward(scorer=scorers["FLEUR"]),
        "VisCE2Reward": VisCE2Reward(scorer=scorers["VisCE2"]),
        "GVEvalReward": GVEvalReward(scorer=scorers["GVEval"]),
        "HallucinationPenalty": HallucinationPenalty(scorer=scorers["EMScore"]),
        "CompositeReward": CompositeReward([(em, 1.0), (clip, 0.5)]),
    }


RAISING = ("EMScore", "CLIPScore", "PACScore", "FLEUR")
ISOLATING_SCORERS = ("VisCE2", "GVEval")
REWARDS = ("EMScoreReward", "CLIPScoreReward", "PACScoreReward", "FLEURReward", "VisCE2Reward", "GVEvalReward",
           "HallucinationPenalty", "CompositeReward")
SUBPROCESS = ("capreward score", "reward server", "veRL adapter")
ENTRY_POINTS = RAISING + ISOLATING_SCORERS + REWARDS + SUBPROCESS
IMAGE_ONLY = {"VisCE2", "VisCE2Reward"}


def applies(entry: str, name: str) -> bool:
    case = CASES[name]
    if case.kind == "video" and entry in IMAGE_ONLY:
        return False
    if entry in SUBPROCESS and not case.files:
        return False
    return True


MATRIX = [(entry, name) for entry in ENTRY_POINTS for name in CASES if applies(entry, name)]


def raises(entry: str, name: str) -> bool:
    """Whether ``entry`` raises for case ``name`` (rather than isolating the sample). The CLIP scorers
    and FLEUR raise for unusable visuals; FLEUR gives blank or over-long captions NaN with a reason;
    every scorer raises for a caption that is not a str."""
    case = CASES[name]
    if entry in RAISING:
        return not (entry == "FLEUR" and case.kind == "caption" and case.files)
    if entry in ISOLATING_SCORERS:
        return case.kind == "caption" and not case.files
    return False


MEDIA_REASON = r"cannot (read|decode)|does not exist|not a file|too large|over the limit|unsupported|is empty|uint8"


#: The reward server refuses every path it will not serve with one text that reveals nothing about the
#: path (issue 12.4), so a missing file reads like a directory or a path outside the root.
SERVER_REFUSAL = r"not a file under the server's media root"


def expected_error(entry: str, name: str) -> str | None:
    case = CASES[name]
    if entry == "reward server" and name in ("missing image", "missing video"):
        return SERVER_REFUSAL
    return case.invalid_for.get(entry, case.error)


def _scorer_values(entry: str, scorer, captions, visuals, kind) -> list[tuple[float | None, str | None]]:
    """(value, reason) per sample from a scorer call."""
    visual_kw = {"images": visuals} if kind == "image" else {"videos": visuals}
    if entry == "EMScore":
        result = scorer.score(captions, **visual_kw)
        return [(float(v), None) for v in result.score]
    if entry in ("CLIPScore", "PACScore"):
        return [(float(v), None) for v in scorer.score(captions, **visual_kw).score]
    if entry == "FLEUR":
        result = scorer.score(captions, **visual_kw)
        return [(None if math.isnan(float(s)) else float(s), e) for s, e in zip(result.score.tolist(), result.error)]
    if entry == "VisCE2":
        result = scorer.score(captions, visuals)
        return [(None if e else float(s), e) for s, e in zip(result.score.tolist(), result.error)]
    if entry == "GVEval":
        result = scorer.score(captions, **visual_kw)
        return [(None if math.isnan(float(s)) else float(s), e) for s, e in zip(result.score.tolist(), result.error)]
    raise AssertionError(entry)


def _reward_values(reward, captions, visuals, kind) -> list[tuple[float | None, str | None]]:
    out = reward.compute(None, captions, **{kind: visuals})
    lo, hi = reward.value_range()
    for v in out.values:
        assert v is None or lo <= v <= hi, f"{reward.name} value {v} outside its range [{lo}, {hi}]"
    return list(zip(out.values, out.reasons))


class Results:
    """Lazily computed, cached per entry point: the batch of every applicable case plus good rows, and
    the good rows alone."""

    def __init__(self):
        self.cache: dict[tuple, Any] = {}

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]


@pytest.fixture(scope="module")
def results():
    return Results()


def _isolating_batch(entry: str, run: Callable, root: Path, kind: str, use_equivalent: bool = False):
    """One batch: good0, then every applicable case of ``kind`` (captions: on good0's image), then
    good1. Returns (values by case name, values of the goods in the batch)."""
    names = [n for n in CASES if applies(entry, n) and not raises(entry, n)
             and (CASES[n].kind == kind or (kind == "image" and CASES[n].kind == "caption"))]
    if use_equivalent:
        names = [n for n in names if CASES[n].equivalent is not None
                 and (CASES[n].files_equivalent or entry not in SUBPROCESS)]
    goods = good_visuals(root, kind)
    captions, visuals = [GOOD_CAPTIONS[0]], [goods[0]]
    for n in names:
        c, v, _ = batch_for(root, n, use_equivalent)
        captions.append(c[1])
        visuals.append(v[1])
    captions.append(GOOD_CAPTIONS[1])
    visuals.append(goods[1])
    with bounded_memory():
        values = no_hang(lambda: run(captions, visuals, kind))
    assert len(values) == len(captions)
    return dict(zip(names, values[1:-1])), (values[0], values[-1])


# ------------------------------------------------------------------------- subprocess entry points
def _cli_rows(root: Path, clip_path: str, tmp: Path, rows: list[dict]) -> tuple[dict, int]:
    manifest = tmp / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "scores.jsonl"
    code = (
        "import resource, runpy, sys\n"
        "sys.argv = ['capreward'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('capreward.cli.main', run_name='__main__')\n"
        "finally:\n    print('PEAK_RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "score", str(manifest), "--out", str(out), "--metrics", "clip-s",
         "--clip-model", clip_path, "--batch-size", "8", "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = int(re.search(r"PEAK_RSS (\d+)", proc.stderr).group(1)) * 1024
    from capreward.jobs.results_file import read_results

    return {r["id"]: r for r in read_results(out)}, peak


def _cli_value(row: dict) -> tuple[float | None, str | None]:
    errors = row.get("errors") or {}
    if "clip_s" in errors:
        return None, "; ".join(str(e) for e in errors.values())
    return float(row["clip_s"]), None


class ServerProcess(Server):
    """The reward server of the matrix: CLIP-S confined to ``media_root``, fallback -7, with its memory."""

    def __init__(self, clip_path: str, media_root: Path):
        super().__init__(["--reward", "clip_s", "--clip-model", clip_path, "--media-root", str(media_root),
                          "--fallback", "-7"], timeout=300)

    def peak_rss(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024

    def rss(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def post(self, captions: list[str], labels: list[dict]) -> tuple[int, dict]:
        prompt = "<|user|> <image> Describe. <|assistant|> "
        payload = {"query": [prompt + c for c in captions], "prompts": [prompt] * len(captions), "labels": labels}
        return post_json(self.url + "/get_reward", payload, timeout=300)


def _relative(root: Path, path: Any) -> Any:
    return os.path.relpath(path, root) if isinstance(path, str) else path


@pytest.fixture(scope="module")
def server(clip_path, root):
    proc = ServerProcess(clip_path, root)
    yield proc
    proc.stop()


def _subprocess_run(entry: str, root: Path, clip_path: str, tmp_factory, server_fixture, rewards) -> Callable:
    """A ``run(captions, visuals, kind)`` for the subprocess-style entry points (veRL runs in process)."""
    if entry == "capreward score":
        def run(captions, visuals, kind):
            rows = [{"id": f"r{i}", "caption": c, kind: v} for i, (c, v) in enumerate(zip(captions, visuals))]
            by_id, peak = _cli_rows(root, clip_path, tmp_factory.mktemp("cli"), rows)
            run.peaks.append(peak)
            return [_cli_value(by_id[f"r{i}"]) for i in range(len(rows))]
        run.peaks = []
        return run
    if entry == "reward server":
        def run(captions, visuals, kind):
            rss, peak = server_fixture.rss(), server_fixture.peak_rss()
            status, body = server_fixture.post(captions, [{kind: _relative(root, v)} for v in visuals])
            assert status == 200, body
            after = server_fixture.peak_rss()
            assert after <= max(peak, rss + MEMORY_BOUND), f"server peak RSS rose by {(after - rss) / 2**20:.0f} MB"
            return [(None, e) if e else (v, None) for v, e in zip(body["rewards"], body["errors"])]
        return run
    if entry == "veRL adapter":
        from capreward.adapters import make_compute_score

        scorer = make_compute_score(rewards["CLIPScoreReward"], fallback=-7.0, return_dict=True, media_root=str(root))

        def run(captions, visuals, kind):
            infos = [{kind: _relative(root, v)} for v in visuals]
            rows = scorer.batch(["src"] * len(captions), captions, [None] * len(captions), infos)
            return [(None, "unscored") if r["unscored"] else (r["score"], None) for r in rows]
        return run
    raise AssertionError(entry)


def runner(entry: str, request) -> Callable:
    scorers, rewards = request.getfixturevalue("scorers"), request.getfixturevalue("rewards")
    if entry in RAISING + ISOLATING_SCORERS:
        return lambda c, v, k: _scorer_values(entry, scorers[entry], c, v, k)
    if entry in REWARDS:
        return lambda c, v, k: _reward_values(rewards[entry], c, v, k)
    server_fixture = request.getfixturevalue("server") if entry == "reward server" else None
    return _subprocess_run(entry, request.getfixturevalue("root"), request.getfixturevalue("clip_path"),
                           request.getfixturevalue("tmp_path_factory"), server_fixture, rewards)


def _close(a: float | None, b: float | None) -> bool:
    """Equal up to fp32 noise: 1e-5 absolute, or 2e-6 relative for the judges' 0..100 scales (a batched
    forward pass pads, which moves the last bits of an expected score)."""
    return a is not None and b is not None and math.isclose(a, b, rel_tol=2e-6, abs_tol=1e-5)


def _same(a: tuple, b: tuple) -> bool:
    """Two (value, reason) outcomes agree: close values, or both unscored for the same reason (a judge
    may answer a valid image without a number: the tiny judges say "no idea" to some inputs)."""
    if a[0] is None or b[0] is None:
        return a[0] is None and b[0] is None and a[1] == b[1]
    return _close(a[0], b[0])


def _valid_outcome(outcome: tuple) -> bool:
    """Scored, or unscored for a reason that is not about the input (a judge's own answer)."""
    value, reason = outcome
    if value is not None:
        return math.isfinite(value)
    return reason is not None and not re.search(MEDIA_REASON + r"|empty caption|must be str", reason)


# ------------------------------------------------------------------------------------------ the matrix
@pytest.mark.parametrize("entry, name", MATRIX, ids=[f"{e}-{n}" for e, n in MATRIX])
def test_bad_input(entry, name, request, root, results):
    case = CASES[name]
    error = expected_error(entry, name)
    run = runner(entry, request)
    kind = "image" if case.kind == "caption" else case.kind

    if raises(entry, name):
        captions, visuals, _ = batch_for(root, name)
        if error is not None:
            with bounded_memory(), pytest.raises((MediaError, ValueError, TypeError)) as exc:
                no_hang(lambda: run(captions, visuals, kind))
            message = str(exc.value)
            assert re.search(r"item 1\b|\[1\]|candidate 1\b", message), f"the error does not name item 1: {message}"
            assert re.search(error, message), message
            if case.files and isinstance(visuals[1], str) and case.kind != "caption":
                assert Path(visuals[1]).name in message
            return
        with bounded_memory():
            got = no_hang(lambda: run(captions, visuals, kind))
        assert _valid_outcome(got[1]), got[1]
        alone = results.get((entry, "alone", kind), lambda: [run([c], [v], kind)[0] for c, v in
                                                             zip(GOOD_CAPTIONS, good_visuals(root, kind))])
        assert _same(got[0], alone[0]) and _same(got[2], alone[1]), (got, alone)
        if case.equivalent is not None:
            eq_captions, eq_visuals, _ = batch_for(root, name, use_equivalent=True)
            equivalent = run(eq_captions, eq_visuals, kind)
            assert _same(got[1], equivalent[1]), (got[1], equivalent[1])
        return

    batch, goods = results.get((entry, "batch", kind), lambda: _isolating_batch(entry, run, root, kind))
    if entry == "capreward score":  # one process for the two good rows without the bad ones
        alone = results.get((entry, "alone", kind), lambda: run(GOOD_CAPTIONS, good_visuals(root, kind), kind))
    else:
        alone = results.get((entry, "alone", kind), lambda: [
            run([c], [v], kind)[0] for c, v in zip(GOOD_CAPTIONS, good_visuals(root, kind))])
    # the good samples of the batch full of bad ones score as they do alone
    assert _same(goods[0], alone[0]) and _same(goods[1], alone[1]), (goods, alone)
    value, reason = batch[name]
    if error is not None:
        assert value is None, f"{name}: expected no score, got {value}"
        if entry != "veRL adapter":  # veRL's contract has no reason field: the adapter logs it
            assert reason and re.search(error, reason), reason
        return
    assert _valid_outcome((value, reason)), reason
    if case.equivalent is not None and (case.files_equivalent or entry not in SUBPROCESS):
        equivalents, _ = results.get((entry, "equivalent", kind), lambda: _isolating_batch(entry, run, root, kind, True))
        assert _same((value, reason), equivalents[name]), ((value, reason), equivalents[name])


# ------------------------------------------------------------------------------- structural errors
@pytest.mark.parametrize("entry", RAISING + ISOLATING_SCORERS + REWARDS + ("veRL adapter",))
def test_mismatched_lengths_are_refused_naming_the_counts(entry, request, root):
    run = runner(entry, request)
    with pytest.raises(ValueError, match=r"\b2\b.*\b3\b|\b3\b.*\b2\b"):
        run(GOOD_CAPTIONS + ["a third caption"], good_visuals(root, "image"), "image")


def test_server_refuses_a_non_string_caption_naming_it(server, root):
    prompt = "<|user|> <image> Describe. <|assistant|> "
    payload = {"query": [prompt + "a red square", None], "prompts": [prompt] * 2, "labels": [{"image": "good0.png"}] * 2}
    status, body = post_json(server.url + "/get_reward", payload, timeout=300)
    assert status == 400 and re.search(r"query\[1\]", body["error"]), body


def test_cli_refuses_a_manifest_row_without_a_string_caption(root, clip_path, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a red square", "image": str(root / "good0.png")}) + "\n"
                        + json.dumps({"caption": None, "image": str(root / "good0.png")}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out",
                           str(tmp_path / "o.jsonl"), "--clip-model", clip_path, "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "m.jsonl:2" in proc.stderr and "caption" in proc.stderr


def test_cli_bad_rows_cost_no_memory(request, root, results):
    """The CLI's peak RSS with every bad file in its manifest stays within the bound of a clean run."""
    run = runner("capreward score", request)
    results.get(("capreward score", "batch", "image"), lambda: _isolating_batch("capreward score", run, root, "image"))
    clean = run(GOOD_CAPTIONS, good_visuals(root, "image"), "image")
    assert all(v is not None for v, _ in clean)
    bad_peak, clean_peak = run.peaks[0], run.peaks[-1]
    assert bad_peak <= clean_peak + MEMORY_BOUND, f"{bad_peak / 2**20:.0f} MB vs {clean_peak / 2**20:.0f} MB clean"


def test_media_loader_bounds_memory_in_a_fresh_process(root):
    """Bombs and huge files in a fresh interpreter: its peak RSS must stay within the bound of its RSS
    after imports (decoding the 30000x30000 bomb would need 0.9-2.7 GB, the 8000x6000 PNG 0.2-0.6 GB)."""
    code = (
        "import resource, sys\n"
        "from capreward.media import load_image, load_video, MediaError\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        load_image(path)\n    except MediaError as exc:\n        print('refused', exc)\n"
        "print('GROWTH', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n"
    )
    paths = [str(root / "bomb.png"), str(root / "huge.png")]
    proc = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused") == 2
    growth = int(re.search(r"GROWTH (\d+)", proc.stdout).group(1)) * 1024
    assert growth < 50 * 2**20, f"{growth / 2**20:.0f} MB"


def test_matrix_size():
    """The README's Reliability section quotes these counts."""
    assert len(CASES) >= 25 and len(ENTRY_POINTS) == 17
    assert DEFAULT_MAX_PIXELS == 2**25
    print(f"{len(CASES)} cases x {len(ENTRY_POINTS)} entry points = {len(MATRIX)} applicable cells")
