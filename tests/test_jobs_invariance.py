"""`capreward score`: a row's output is a function of that row alone.

One manifest mixes images, synthetic and real videos, rows with and without references, and bad rows
(missing files, an undecodable video, empty captions and references). Every row's output must be
identical (1e-6 of the metric's scale) whatever the batch size, the row order, and after real
`capreward score` processes are SIGKILLed at exact points (the results writer's fault-injection hook)
and resumed. The same for the judge metrics: FLEUR/RefFLEUR rows, and VisCE² and G-VEval (combined
mode: each row with its own references) rows on the tiny local VLM judge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from capreward.cli.main import main
from capreward.jobs.idf_file import record_path
from capreward.jobs.output_lock import lock_path
from capreward.locks import read_holder
from capreward.jobs.results_file import KILL_AFTER_BATCH_ENV, read_results

from conftest import random_video, sample_clips, write_mp4
import cli_process

METRICS = "emscore,clip-s,hallucination"


def score_args(manifest: Path, out: Path, clip: Path, batch_size: int) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", METRICS, "--clip-model", str(clip),
            "--alignment", "--frames", "4", "--batch-size", str(batch_size), "--no-progress"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("invariance")
    v0 = write_mp4(d / "v0.mp4", random_video(0, frames=12))
    v1 = write_mp4(d / "v1.mp4", random_video(1, frames=7, height=48, width=64))
    real = sample_clips()[:1] or [write_mp4(d / "v2.mp4", random_video(2, frames=20))]
    im0, im1 = d / "im0.png", d / "im1.jpg"
    Image.fromarray(random_video(10, frames=1)[0]).save(im0)
    Image.fromarray(random_video(11, frames=1, height=64, width=48)[0]).save(im1)
    corrupt = d / "corrupt.mp4"
    corrupt.write_text("this is not a video")
    spec = [  # (id, caption, kind, path, references)
        ("img-refs", "a red car at night", "image", im0, ["a car", "a red vehicle on a road"]),
        ("img-norefs", "a dog runs in a park", "image", im1, None),
        ("vid-refs", "a man is cooking", "video", v0, ["someone cooks food"]),
        ("vid-norefs", "two people dance", "video", v1, None),
        ("real-refs", "a person talks to the camera", "video", real[0], ["a man speaks", "someone talking", "a vlog"]),
        ("real-norefs", "a person talks to the camera", "video", real[0], None),
        ("missing-img", "a cat", "image", d / "missing.png", ["a cat on a mat"]),
        ("missing-vid", "a cat", "video", d / "missing.mp4", None),
        ("empty-caption", "   ", "image", im0, ["a car"]),
        ("corrupt-vid", "a broken clip", "video", corrupt, ["nothing"]),
        ("img-one-ref", "a photo of a red car", "image", im0, ["a red car"]),
        ("vid-long", " ".join(["a very long caption about a kitchen"] * 20), "video", v0, ["a kitchen", "cooking", "food"]),
        ("img-same-image", "a blue sky", "image", im1, None),
        ("empty-ref", "a car", "image", im0, [""]),
    ]
    return [{"id": rid, "caption": cap, kind: str(path), **({"references": refs} if refs is not None else {})}
            for rid, cap, kind, path, refs in spec]


def write_manifest(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def by_id(path: Path) -> dict[str, dict]:
    results = read_results(path)
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)), "a row was written twice"
    return {r["id"]: r for r in results}


def assert_same(a, b, where: str, tol: float = 1e-6) -> None:
    """Equal structures, floats within ``tol``."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=tol), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}", tol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]", tol)
    else:
        assert a == b, where


def assert_same_rows(got: dict[str, dict], want: dict[str, dict], tol: float = 1e-6) -> None:
    assert got.keys() == want.keys()
    for rid in want:
        assert_same(got[rid], want[rid], rid, tol)


@pytest.fixture(scope="module")
def reference(rows, tmp_path_factory, tiny_clip_path):
    """The whole manifest scored in one batch."""
    d = tmp_path_factory.mktemp("reference")
    manifest = write_manifest(d / "m.jsonl", rows)
    assert main(score_args(manifest, d / "all.jsonl", tiny_clip_path, 1000)) == 0
    return manifest, by_id(d / "all.jsonl")


def test_the_manifest_exercises_every_case(reference):
    _, want = reference
    assert want["img-refs"]["errors"] is None and "ref_clip_s" in want["img-refs"]
    assert "emscore/combined/full_f" in want["vid-refs"] and "emscore/reference/full_f" in want["real-refs"]
    assert "ref_clip_s" not in want["img-norefs"] and "emscore/reference/full_f" not in want["vid-norefs"]
    # the same video without references has no reference components, with them it has
    assert want["real-norefs"]["emscore/video/full_f"] == pytest.approx(want["real-refs"]["emscore/video/full_f"], abs=1e-6)
    for rid, problem in [("missing-img", "does not exist"), ("missing-vid", "does not exist"),
                         ("empty-caption", "caption is empty"), ("corrupt-vid", "cannot decode"),
                         ("empty-ref", "references[0] is empty")]:
        for metric in ("emscore", "clip_s", "hallucination"):
            assert want[rid]["errors"][metric].startswith(f"row {rid!r}: "), (rid, metric)
            assert problem in want[rid]["errors"][metric], (rid, metric)
            assert "item 0" not in want[rid]["errors"][metric]
        assert "emscore" not in want[rid] and "clip_s" not in want[rid]
    good = [r for r in want.values() if r["errors"] is None]
    assert len(good) == 9 and all("alignment" in r and "hallucination" in r for r in good)


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_every_row_is_independent_of_the_batch_size(batch_size, reference, tmp_path, tiny_clip_path):
    manifest, want = reference
    out = tmp_path / "out.jsonl"
    assert main(score_args(manifest, out, tiny_clip_path, batch_size)) == 0
    assert_same_rows(by_id(out), want)


def test_every_row_is_independent_of_the_row_order(rows, reference, tmp_path, tiny_clip_path):
    _, want = reference
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    manifest = write_manifest(tmp_path / "shuffled.jsonl", shuffled)
    out = tmp_path / "out.jsonl"
    assert main(score_args(manifest, out, tiny_clip_path, 4)) == 0
    assert [r["id"] for r in read_results(out)] == [r["id"] for r in shuffled]
    assert_same_rows(by_id(out), want)


def run_cli(args: list[str], kill_after: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(KILL_AFTER_BATCH_ENV, None)
    if kill_after is not None:
        env[KILL_AFTER_BATCH_ENV] = kill_after
    return cli_process.run(args, timeout=600, env=env)


def complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_every_row_survives_kill_and_resume(reference, tmp_path, tiny_clip_path):
    """Three real processes on one results file: killed after its first batch of 3, resumed with batches
    of 2 and killed mid-write of its third batch (a torn line), resumed with batches of 5 to the end."""
    manifest, want = reference
    out = tmp_path / "out.jsonl"

    first = run_cli(score_args(manifest, out, tiny_clip_path, 3), kill_after="1")
    assert first.returncode == -9, first.stderr[-2000:]
    assert complete_lines(out) == 3 and out.read_bytes().endswith(b"\n")
    idf_record = record_path(out).read_bytes()
    # the killed run's holder file is still there, naming it; it must not block the resume
    assert isinstance(read_holder(lock_path(out)).get("pid"), int)

    second = run_cli(score_args(manifest, out, tiny_clip_path, 2), kill_after="2+torn")
    assert second.returncode == -9, second.stderr[-2000:]
    assert complete_lines(out) == 3 + 4 and not out.read_bytes().endswith(b"\n")  # a torn eighth line

    third = run_cli(score_args(manifest, out, tiny_clip_path, 5))
    assert third.returncode == 0, third.stderr[-2000:]
    assert record_path(out).read_bytes() == idf_record  # the idf was computed once and reused
    assert_same_rows(by_id(out), want)


def test_fleur_rows_are_independent_of_their_batch(tmp_path):
    """FLEUR and RefFLEUR rows (images and a video) mixed in one batch: each row equals its score alone,
    whatever the batch size and order (RefFLEUR rows keep their references next to FLEUR rows)."""
    import torch

    from capreward.jobs.manifest import read_manifest
    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir
    from capreward.testing.tiny_llava import fleur_task_image

    rows = []
    for k, (colour, caption, refs) in enumerate([
        ("red", "a red car", ["a red square"]), ("blue", "a red kite", None), ("green", "a green ball", None),
        ("red", "the kite is blue", ["a blue kite", "a kite"]), ("yellow", "a photo of a ball", None),
    ]):
        path = tmp_path / f"im{k}.png"
        fleur_task_image(colour).save(path)
        rows.append({"id": f"f{k}", "caption": caption, "image": str(path), **({"references": refs} if refs else {})})
    rows.append({"id": "video", "caption": "a red car", "video": str(write_mp4(tmp_path / "v.mp4", random_video(5, frames=6))),
                 "references": ["a car"]})
    rows.append({"id": "missing", "caption": "a red car", "image": str(tmp_path / "missing.png")})
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    manifest_rows = read_manifest(manifest)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scorer = ManifestScorer(ScoreOptions(metrics=["fleur"], judge_model=str(tiny_judge_dir(FLEUR_RECIPE))))
        alone = {r.id: scorer.score_rows([r])[0] for r in manifest_rows}
        together = {r["id"]: r for r in scorer.score_rows(manifest_rows)}
        reversed_ = {r["id"]: r for r in scorer.score_rows(manifest_rows[::-1])}
        without_refs = [scorer.score_rows([dataclasses.replace(manifest_rows[k], references=None)])[0] for k in (0, 3)]
    finally:
        torch.set_num_threads(threads)
    assert alone["f0"]["fleur"] is not None and alone["f1"]["fleur"] is not None
    # RefFLEUR differs from FLEUR on these rows, so losing a row's references would show
    assert [r["fleur"] for r in without_refs] != [alone["f0"]["fleur"], alone["f3"]["fleur"]]
    assert "does not exist" in alone["missing"]["errors"]["fleur"]
    assert_same_rows(together, alone)
    assert_same_rows(reversed_, alone)


# ------------------------------------------------------------------------------ VisCE² and G-VEval
JUDGE_SPEC = [  # (id, kind, colour, caption, references): every answer format of the tiny VLM judge
    ("j-green", "image", "green", "a green ball", ["a green square"]),
    ("j-blue", "image", "blue", "a blue kite", ["a blue kite", "a kite"]),
    ("j-yellow", "image", "yellow", "a photo of a kite", ["a yellow square"]),  # no score from either judge
    ("j-many", "image", "red", "many red cars", None),  # VisCE² 250 (out of range); G-VEval combined needs references
    ("j-vid-red", "video", "red", "a red car", ["a red square"]),
    ("j-vid-blue", "video", "blue", "a blue kite", ["a blue square", "a square"]),
    ("j-missing", "image", None, "a red car", ["a red car"]),
    ("j-empty", "image", "green", "  ", ["a green square"]),
]


#: 1e-6 of the judges' 0..100 scale. G-VEval's score is an expectation over the judge's score-token
#: probabilities times 100: float32 rounding of the batched (padded) and the single forward pass, ~1e-7
#: relative, shows as ~1e-5 on that scale; every other field (answers, contexts, errors) must be equal.
JUDGE_TOL = 1e-6 * 100


def judge_args(manifest: Path, out: Path, judge: Path, batch_size: int) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", "visce2,gveval", "--judge-model", str(judge),
            "--gveval-mode", "combined", "--batch-size", str(batch_size), "--no-progress"]


@pytest.fixture(scope="module")
def one_torch_thread():
    """The tiny judge's ops are tiny: on a loaded 2-core machine extra threads only slow them down."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def judge_rows(tmp_path_factory) -> list[dict]:
    from capreward.testing.tiny_vlm_judges import probe_image, synthetic_video

    d = tmp_path_factory.mktemp("judge-invariance")
    rows = []
    for rid, kind, colour, caption, refs in JUDGE_SPEC:
        path = d / f"{rid}.{'png' if kind == 'image' else 'mp4'}"
        if colour is not None and kind == "image":
            probe_image("visce2", colour).save(path)
        elif colour is not None:
            write_mp4(path, synthetic_video(colour))
        rows.append({"id": rid, "caption": caption, kind: str(path), **({"references": refs} if refs else {})})
    return rows


@pytest.fixture(scope="module")
def judge_reference(judge_rows, tmp_path_factory, one_torch_thread):
    """The judge manifest scored by VisCE² and G-VEval (combined: each row with its own references) in one batch."""
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge_dir

    d = tmp_path_factory.mktemp("judge-reference")
    judge = tiny_vlm_judge_dir()
    manifest = write_manifest(d / "m.jsonl", judge_rows)
    assert main(judge_args(manifest, d / "all.jsonl", judge, 1000)) == 0
    return manifest, judge, by_id(d / "all.jsonl")


def test_the_judge_manifest_exercises_every_case(judge_reference):
    _, _, want = judge_reference
    scored = [want[r]["gveval"] for r in ("j-green", "j-blue", "j-vid-red", "j-vid-blue")]
    assert None not in scored and len(set(scored)) > 1  # rows differ, so a row scored with another's inputs shows
    assert want["j-green"]["visce2"] == 85  # a first integer above 100 (250) has no score, the reason says why
    assert want["j-many"]["visce2"] is None and "250, outside 0..100" in want["j-many"]["errors"]["visce2"]
    assert want["j-yellow"]["gveval"] is None and "no score" in want["j-yellow"]["errors"]["gveval"]
    assert "needs references" in want["j-many"]["errors"]["gveval"] and "gveval" not in want["j-many"]
    assert "images only" in want["j-vid-red"]["errors"]["visce2"]
    for rid, problem in (("j-missing", "does not exist"), ("j-empty", "caption is empty")):
        for metric in ("visce2", "gveval"):
            assert want[rid]["errors"][metric].startswith(f"row {rid!r}: ") and problem in want[rid]["errors"][metric]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_judge_rows_are_independent_of_the_batch_size(batch_size, judge_reference, tmp_path):
    manifest, judge, want = judge_reference
    out = tmp_path / "out.jsonl"
    assert main(judge_args(manifest, out, judge, batch_size)) == 0
    assert_same_rows(by_id(out), want, JUDGE_TOL)


def test_judge_rows_are_independent_of_the_row_order(judge_rows, judge_reference, tmp_path):
    _, judge, want = judge_reference
    shuffled = judge_rows[:]
    random.Random(3).shuffle(shuffled)
    manifest = write_manifest(tmp_path / "shuffled.jsonl", shuffled)
    out = tmp_path / "out.jsonl"
    assert main(judge_args(manifest, out, judge, 4)) == 0
    assert [r["id"] for r in read_results(out)] == [r["id"] for r in shuffled]
    assert_same_rows(by_id(out), want, JUDGE_TOL)
