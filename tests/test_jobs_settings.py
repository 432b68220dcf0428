"""`capreward score`'s settings record: a resume never mixes rows scored with other settings.

The first run records in `<out>.settings.json` every setting that changes a row; a resume with the same
settings continues (whatever the batch size or engine), one with any other setting (CLIP model, new
weights at the same path, metrics, frames, precision, alignment, a judge option) exits 2 with one line
naming each differing setting with its old and new value and leaves the results byte-identical, and a
results file with rows but no record is only resumed with --accept-unrecorded-settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from capreward.cli.main import main
from capreward.jobs.idf_file import record_path as idf_record_path
from capreward.jobs.results_file import KILL_AFTER_BATCH_ENV, read_results
from capreward.jobs.runners import ScoreOptions
from capreward.jobs.settings_file import model_identity, record_path, scoring_settings
from capreward.testing import save_tiny_clip_openai

from conftest import write_job_media
import cli_process

METRICS = "emscore,hallucination"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return write_job_media(tmp_path_factory.mktemp("media"))


def write_manifest(path: Path, media, n: int) -> Path:
    image, video = media
    rows = [{"id": f"s-{i}", "caption": f"caption number {i} about a red car",
             **({"image": str(image)} if i % 2 else {"video": str(video)}),
             "references": [f"reference {i} of a vehicle", "a car"]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score_args(manifest, out, clip, *extra) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", METRICS, "--clip-model", str(clip),
            "--frames", "4", "--batch-size", "2", "--no-progress", *map(str, extra)]


def cli(args: list[str], kill_after: str | None = None, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != KILL_AFTER_BATCH_ENV}
    if kill_after is not None:
        environ[KILL_AFTER_BATCH_ENV] = kill_after
    return cli_process.run(args, timeout=600, env={**environ, **env})


def by_id(path: Path) -> dict[str, dict]:
    rows = read_results(path)
    assert len(rows) == len({r["id"] for r in rows}), "a row was written twice"
    return {r["id"]: r for r in rows}


def assert_same(a, b, where: str = "") -> None:
    """Equal structures, floats within 1e-6."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-6), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def files_of(out: Path) -> dict[str, bytes]:
    """The results file and its records, byte for byte."""
    return {p.name: p.read_bytes() for p in (out, record_path(out), idf_record_path(out)) if p.exists()}


def copy_job(src: Path, dst: Path) -> Path:
    """A copy of results file ``src`` with its records (a job to resume without touching the original)."""
    for a, b in ((src, dst), (record_path(src), record_path(dst)), (idf_record_path(src), idf_record_path(dst))):
        if a.exists():
            shutil.copyfile(a, b)
    return dst


# ------------------------------------------------------------------------------ what is recorded
def test_only_the_settings_that_change_a_row_are_recorded(tmp_path, tiny_clip_path):
    from capreward.judges.remote import DEFAULT_API_MODEL
    from capreward.rewards.hallucination import DEFAULT_THRESHOLD

    from capreward.media.limits import DEFAULT_MAX_PIXELS, DEFAULT_MAX_VIDEO_PIXELS

    # recorded for every metric: the media limits, and how the rows name their sub-score fields
    limits = {"max_pixels": DEFAULT_MAX_PIXELS, "max_video_pixels": DEFAULT_MAX_VIDEO_PIXELS, "sub_score_separator": "/"}
    clip = model_identity(tiny_clip_path)
    assert clip == {"path": os.path.abspath(tiny_clip_path), "bytes": tiny_clip_path.stat().st_size,
                    "mtime_ns": tiny_clip_path.stat().st_mtime_ns}
    # "clip-s" and "clip_s" are one metric, and the metrics' order changes nothing
    a = scoring_settings(ScoreOptions(metrics=["hallucination", "clip-s", "emscore"], clip_model=str(tiny_clip_path),
                                      frames=None, batch_size=3, device="cpu"))
    assert a == {"metrics": ["clip_s", "emscore", "hallucination"], "clip_model": clip, "precision": "fp32",
                 "frames": 0, "harmonic_mean": "sign-safe", "hallucination_threshold": DEFAULT_THRESHOLD,
                 "alignment": False, **limits}
    b = scoring_settings(ScoreOptions(metrics=["emscore", "clip_s", "hallucination"], clip_model=str(tiny_clip_path),
                                      frames=None, batch_size=64, hallucination_threshold=DEFAULT_THRESHOLD))
    assert a == b  # batch size and an explicit default threshold are no change
    # the CLIP model and frames do not matter to a judge-only job; the local judge's dtype does
    judge_dir = tmp_path / "judge"
    judge_dir.mkdir()
    (judge_dir / "config.json").write_text("{}")
    (judge_dir / ".cache").mkdir()  # hub download metadata: not the model
    (judge_dir / ".cache" / "x.lock").write_text("")
    fleur = scoring_settings(ScoreOptions(metrics=["fleur"], judge_model=str(judge_dir), clip_model="no/such"))
    assert fleur.keys() == {"metrics", "judge_model", "judge_dtype", *limits} and fleur["judge_dtype"] == "float32"
    assert fleur["judge_model"]["path"] == str(judge_dir) and fleur["judge_model"]["files"] == 1
    assert scoring_settings(ScoreOptions(metrics=["fleur"], judge_model="llava-hf/llava-1.5-7b-hf"))["judge_model"] \
        == "llava-hf/llava-1.5-7b-hf"  # a hub name is recorded as given
    # visce2/gveval on a server: its URL and the served model (the backend's default when not named)
    remote = scoring_settings(ScoreOptions(metrics=["gveval"], judge_base_url="http://127.0.0.1:8000/v1"))
    assert remote == {"metrics": ["gveval"], "judge_base_url": "http://127.0.0.1:8000/v1",
                      "judge_api_model": DEFAULT_API_MODEL, "judge_top_logprobs_cap": 20, "gveval_mode": "ref-free",
                      "gveval_accr": False, **limits}
    # fleur on a server too (no local judge), with the server's logprob cap
    remote_fleur = scoring_settings(ScoreOptions(metrics=["fleur"], judge_api_model="m", judge_top_logprobs_cap=5))
    assert remote_fleur == {"metrics": ["fleur"], "judge_base_url": None, "judge_api_model": "m",
                            "judge_top_logprobs_cap": 5, **limits}
    # an open_clip checkpoint given with its architecture is a local file too
    arch = model_identity(f"ViT-B-32/{tiny_clip_path}", open_clip=True)  # ViT-B-32//tmp/...
    assert arch == {**clip, "architecture": "ViT-B-32"}
    assert model_identity("ViT-B-32/openai", open_clip=True) == "ViT-B-32/openai"
    from capreward.jobs.settings_file import describe

    assert describe(arch).startswith(f"ViT-B-32/{tiny_clip_path} (")
    # PAC-S: its own checkpoint, precision and frames; the CLIP of --clip-model is not used
    pac = scoring_settings(ScoreOptions(metrics=["pac_s"], pac_model=str(tiny_clip_path), precision="bf16", frames=2))
    assert pac == {"metrics": ["pac_s"], "pac_model": clip, "precision": "bf16", "frames": 2,
                   "harmonic_mean": "sign-safe", **limits}
    # the media limits in force (a command's --max-pixels) are part of every job's settings
    from capreward.media.limits import media_limits

    with media_limits(max_pixels=1000):
        assert scoring_settings(ScoreOptions(metrics=["pac_s"], pac_model=str(tiny_clip_path)))["max_pixels"] == 1000


def test_a_new_file_in_a_model_folder_changes_its_identity(tmp_path):
    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    before = model_identity(folder)
    (folder / "model.safetensors").write_bytes(b"\0" * 10)
    after = model_identity(folder)
    assert after["files"] == before["files"] + 1 and after["listing_sha256"] != before["listing_sha256"]


# ------------------------------------------------------------------------------ a scored job to resume
@pytest.fixture(scope="module")
def clip_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return save_tiny_clip_openai(d / "clip_a.pt", seed=0), save_tiny_clip_openai(d / "clip_b.pt", seed=1)


@pytest.fixture(scope="module")
def scored(tmp_path_factory, media, clip_files):
    """Four rows scored in one run (the reference), and the same job killed (a real process, SIGKILL)
    after its first batch of two rows."""
    d = tmp_path_factory.mktemp("scored")
    manifest = write_manifest(d / "m.jsonl", media, 4)
    full = d / "full.jsonl"
    assert main(score_args(manifest, full, clip_files[0])) == 0
    partial = d / "partial.jsonl"
    proc = cli(score_args(manifest, partial, clip_files[0]), kill_after="1")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert len(read_results(partial)) == 2
    return manifest, full, partial


def test_the_first_run_records_its_settings(scored, clip_files):
    _, full, _ = scored
    record = json.loads(record_path(full).read_text())
    assert record["format"] == "capreward-settings/1"
    options = ScoreOptions(metrics=METRICS.split(","), clip_model=str(clip_files[0]), frames=4)
    assert record["settings"] == scoring_settings(options)
    assert record["settings"]["frames"] == 4 and record["settings"]["clip_model"]["path"] == str(clip_files[0])


def test_a_resume_with_the_same_settings_continues_whatever_the_batch_size(scored, tmp_path, clip_files):
    manifest, full, partial = scored
    out = copy_job(partial, tmp_path / "out.jsonl")
    record = record_path(out).read_bytes()
    proc = cli([*score_args(manifest, out, clip_files[0]), "--batch-size", "3", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stderr.strip().splitlines()[-1])
    assert summary.pop("idf").startswith("auto: ")  # the summary names the idf (see test_cli_usage)
    assert summary == {"total": 4, "skipped": 2, "written": 2, "errors": 0}
    assert record_path(out).read_bytes() == record
    got, want = by_id(out), by_id(full)
    assert got.keys() == want.keys()
    for rid in want:
        assert_same(got[rid], want[rid], rid)


CHANGES = [  # (case, extra arguments of the resume, the flag the refusal names, its old value, its new value)
    ("clip model", ["--clip-model", "{clip_b}"], "--clip-model", "{clip_a} (", "{clip_b} ("),
    ("metrics", ["--metrics", "emscore,clip-s,hallucination"], "--metrics", "emscore,hallucination",
     "clip_s,emscore,hallucination"),
    ("metric dropped", ["--metrics", "emscore"], "--metrics", "emscore,hallucination", "emscore"),
    ("frames", ["--frames", "3"], "--frames", "4", "3"),
    ("all frames", ["--frames", "0"], "--frames", "4", "0"),
    ("precision", ["--precision", "bf16"], "--precision", "fp32", "bf16"),
    ("threshold", ["--hallucination-threshold", "0.5"], "--hallucination-threshold", "0.2", "0.5"),
    ("alignment", ["--alignment"], "--alignment", "false", "true"),
    ("max pixels", ["--max-pixels", "1000000"], "--max-pixels", "33554432", "1000000"),
]


@pytest.mark.parametrize("case, extra, flag, old, new", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_resume_with_another_setting_is_refused(case, extra, flag, old, new, scored, tmp_path, clip_files, capsys):
    manifest, _, partial = scored
    out = copy_job(partial, tmp_path / "out.jsonl")
    before = files_of(out)
    paths = {"clip_a": clip_files[0], "clip_b": clip_files[1]}
    extra = [e.format(**paths) for e in extra]
    capsys.readouterr()
    assert main([*score_args(manifest, out, clip_files[0]), *extra]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"capreward score: error: {out} was scored with other settings")
    assert str(record_path(out)) in line and "score into a new --out" in line
    assert f"{flag} was {old.format(**paths)}" in line and f"now {new.format(**paths)}" in line
    if case != "metric dropped":  # dropping hallucination also drops its threshold; else only the flag differs
        assert line.count(", now ") == 1, line
    assert files_of(out) == before


def test_new_weights_at_the_same_path_are_refused(tmp_path, media, clip_files, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", media, 3)
    clip = tmp_path / "clip.pt"
    shutil.copyfile(clip_files[0], clip)
    out = tmp_path / "out.jsonl"
    assert main(score_args(manifest, out, clip)) == 0
    out.write_text("".join(json.dumps(r) + "\n" for r in read_results(out)[:1]))
    before = files_of(out)
    save_tiny_clip_openai(clip, seed=1)  # fine-tuned weights written over the old file
    capsys.readouterr()
    assert main(score_args(manifest, out, clip)) == 2
    [line] = error_lines(capsys)
    assert f"--clip-model was {clip} (" in line and f"now {clip} (" in line and line.count(", now ") == 1
    assert files_of(out) == before


# ------------------------------------------------------------------------------ judge options
@pytest.fixture(scope="module")
def judge_job(tmp_path_factory):
    """A VisCE²/G-VEval job on the tiny local judge: one image row scored, one to go."""
    from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge_dir

    d = tmp_path_factory.mktemp("judge")
    rows = []
    for colour in ("green", "blue"):
        probe_image("visce2", colour).save(d / f"{colour}.png")
        rows.append({"id": colour, "caption": f"a {colour} ball", "image": str(d / f"{colour}.png"),
                     "references": [f"a {colour} square"]})
    manifest = d / "m.jsonl"
    manifest.write_text(json.dumps(rows[0]) + "\n")
    out = d / "out.jsonl"
    judge = tiny_vlm_judge_dir()
    args = ["score", str(manifest), "--out", str(out), "--metrics", "visce2,gveval", "--judge-model", str(judge),
            "--no-progress"]
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return args, out


JUDGE_CHANGES = [  # (case, extra arguments, what the refusal must say)
    ("gveval mode", ["--gveval-mode", "combined"], ["--gveval-mode was ref-free, now combined"]),
    ("gveval accr", ["--gveval-accr"], ["--gveval-accr was false, now true"]),
    ("judge model", ["--judge-model", "{fleur_judge}"], ["--judge-model was {vlm_judge} (", "now {fleur_judge} ("]),
    ("judge server", ["--judge-base-url", "http://127.0.0.1:9/v1"],
     ["--judge-model was {vlm_judge} (", "now not used", "--judge-base-url was not used, now http://127.0.0.1:9/v1",
      "--judge-api-model was not used, now gpt-4o-2024-05-13", "dtype"]),
]


@pytest.mark.parametrize("case, extra, says", JUDGE_CHANGES, ids=[c[0] for c in JUDGE_CHANGES])
def test_a_resume_with_another_judge_option_is_refused(case, extra, says, judge_job, tmp_path):
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge_dir

    args, scored_out = judge_job
    out = copy_job(scored_out, tmp_path / "out.jsonl")
    args = [str(out) if a == str(scored_out) else a for a in args]
    before = files_of(out)
    paths = {"fleur_judge": tiny_judge_dir(FLEUR_RECIPE), "vlm_judge": tiny_vlm_judge_dir()}
    proc = cli([*args, *(e.format(**paths) for e in extra)])  # a real process: the exit status and stderr
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"capreward score: error: {out} was scored with other settings")
    for text in says:
        assert text.format(**paths) in line, line
    assert files_of(out) == before


def test_a_judge_resume_with_the_same_settings_continues(judge_job, tmp_path):
    args, scored_out = judge_job
    out = copy_job(scored_out, tmp_path / "out.jsonl")
    args = [str(out) if a == str(scored_out) else a for a in args]
    proc = cli([*args, "--batch-size", "1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = by_id(out)
    assert list(rows) == ["green", "blue"] and rows["green"] == by_id(scored_out)["green"]
    assert rows["blue"]["visce2"] is not None and rows["blue"]["gveval"] is not None


# ------------------------------------------------------------------------------ files without a record
def test_a_results_file_without_a_settings_record_needs_the_flag(scored, tmp_path, clip_files, capsys):
    manifest, full, partial = scored
    out = copy_job(partial, tmp_path / "out.jsonl")
    record_path(out).unlink()  # as written by capreward before settings were recorded
    before = files_of(out)
    capsys.readouterr()
    assert main(score_args(manifest, out, clip_files[0])) == 2
    [line] = error_lines(capsys)
    assert f"{out} already has results but no out.jsonl.settings.json" in line
    assert "--accept-unrecorded-settings" in line
    assert files_of(out) == before
    # with the flag: this run's settings are recorded as the rows', and the job resumes
    assert main([*score_args(manifest, out, clip_files[0]), "--accept-unrecorded-settings"]) == 0
    recorded = json.loads(record_path(out).read_text())["settings"]
    assert recorded == json.loads(record_path(full).read_text())["settings"]
    got, want = by_id(out), by_id(full)
    for rid in want:
        assert_same(got[rid], want[rid], rid)
    # from now on the record holds: the flag does not let another setting through
    capsys.readouterr()
    assert main([*score_args(manifest, out, clip_files[0]), "--frames", "3", "--accept-unrecorded-settings"]) == 2
    [line] = error_lines(capsys)
    assert "--frames was 4, now 3" in line


def test_a_results_file_without_rows_takes_the_new_settings(tmp_path, media, clip_files):
    """A record next to an empty results file (a run stopped before its first batch) is replaced."""
    manifest = write_manifest(tmp_path / "m.jsonl", media, 2)
    out = tmp_path / "out.jsonl"
    proc = cli(score_args(manifest, out, clip_files[0]), kill_after="0+torn")  # killed writing half a line
    assert proc.returncode == -9 and out.read_bytes() and not out.read_bytes().endswith(b"\n")
    # the torn line counts as results until a run repairs it: a change is refused, nothing is cut
    before = files_of(out)
    assert main([*score_args(manifest, out, clip_files[0]), "--frames", "3"]) == 2
    assert files_of(out) == before
    out.write_bytes(b"")
    assert main([*score_args(manifest, out, clip_files[0]), "--frames", "3"]) == 0
    assert json.loads(record_path(out).read_text())["settings"]["frames"] == 3
    assert len(read_results(out)) == 2


def test_a_run_refused_for_its_manifest_records_nothing(tmp_path, clip_files, capsys):
    out = tmp_path / "out.jsonl"
    assert main(score_args(tmp_path / "missing.jsonl", out, clip_files[0])) == 2
    assert "missing.jsonl" in error_lines(capsys)[-1]
    assert not out.exists() and not record_path(out).exists()


# ------------------------------------------------------------------------------ the Ray engine
def test_a_ray_resume_with_another_setting_is_refused(scored, tmp_path, clip_files, capsys):
    """The check runs before either engine starts: a Ray resume is refused like a local one."""
    manifest, _, partial = scored
    out = copy_job(partial, tmp_path / "out.jsonl")
    before = files_of(out)
    capsys.readouterr()
    assert main([*score_args(manifest, out, clip_files[1]), "--engine", "ray", "--num-actors", "1"]) == 2
    [line] = error_lines(capsys)
    assert f"--clip-model was {clip_files[0]} (" in line and f"now {clip_files[1]} (" in line
    assert files_of(out) == before


@pytest.mark.slow
def test_a_ray_resume_with_the_same_settings_continues(scored, tmp_path, clip_files):
    pytest.importorskip("ray")
    manifest, full, partial = scored
    out = copy_job(partial, tmp_path / "out.jsonl")
    record = record_path(out).read_bytes()
    proc = cli([*score_args(manifest, out, clip_files[0]), "--engine", "ray", "--num-actors", "1"],
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert record_path(out).read_bytes() == record
    got, want = by_id(out), by_id(full)
    assert got.keys() == want.keys()
    for rid in want:
        assert_same(got[rid], want[rid], rid)


def test_help_documents_the_settings_record():
    from capreward.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["score"]
    text = " ".join(sub.format_help().split())
    assert "<out>.settings.json" in text and "a resume with any of them different is refused" in text
    assert "not the batch size, device, engine or progress" in text
    assert "--accept-unrecorded-settings resume a results file that has rows but no <out>.settings.json" in text
