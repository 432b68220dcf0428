"""``capreward explain`` on the trained tiny judges: real subprocess runs, compared with the scorers
called directly, per-row errors, resuming after an interrupted run, and its settings record (a resume
with another setting is refused, naming it, and leaves the files byte-identical)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_llava import colour_images, fleur, one_torch_thread, tiny_judge, tiny_judge_path  # noqa: F401

from capreward.cli.main import main
from capreward.jobs.settings_file import record_path
import cli_process

REPO = Path(__file__).resolve().parents[1]
MAX_NEW = 12


def explain_args(manifest: Path, out: Path, judge: Path, *extra: str) -> list[str]:
    return ["explain", str(manifest), "--out", str(out), "--judge-model", str(judge), "--device", "cpu",
            "--dtype", "float32", "--batch-size", "2", "--max-new-tokens", str(MAX_NEW), "--no-progress", *extra]


def explain_cli(manifest: Path, out: Path, judge: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return cli_process.run(explain_args(manifest, out, judge, *extra), timeout=600, cwd=REPO, env=env)


def files_of(out: Path) -> dict[str, bytes]:
    """The output and its settings record, byte for byte."""
    return {p.name: p.read_bytes() for p in (out, record_path(out)) if p.exists()}


def copy_job(src: Path, dst: Path, lines: int | None = None) -> Path:
    """A copy of output ``src`` (its first ``lines`` rows) with its settings record."""
    dst.write_text("".join(src.read_text().splitlines(keepends=True)[:lines]))
    shutil.copyfile(record_path(src), record_path(dst))
    return dst


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, colour_images):
    """Rows with a score (captions naming a colour), without one (out of range, no colour word), and
    one whose image does not exist."""
    folder = tmp_path_factory.mktemp("explain")
    for colour, image in colour_images.items():
        image.save(folder / f"{colour}.png")
    colours = sorted(colour_images)
    rows = [
        {"id": "a", "image": f"{colours[0]}.png", "caption": f"a {colours[0]} car", "references": ["a car"]},
        {"id": "b", "image": f"{colours[0]}.png", "caption": f"a {colours[1]} ball"},
        {"id": "c", "image": f"{colours[1]}.png", "caption": f"many {colours[1]} boxes"},
        {"id": "d", "image": "missing.png", "caption": f"a {colours[1]} kite"},
        {"id": "e", "image": f"{colours[1]}.png", "caption": "a wall"},
        {"id": "f", "image": f"{colours[1]}.png", "caption": f"the {colours[1]} shirt"},
    ]
    path = folder / "manifest.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


@pytest.fixture(scope="module")
def fleur_run(manifest, tiny_judge_path, tmp_path_factory):
    path, _ = manifest
    out = tmp_path_factory.mktemp("explain-out") / "explanations.jsonl"
    proc = explain_cli(path, out, tiny_judge_path)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_explain_matches_fleur_called_directly(manifest, fleur_run, fleur):
    path, rows = manifest
    out, proc = fleur_run
    got = {r["id"]: r for r in read_rows(out)}
    assert list(got) == [r["id"] for r in rows]
    ok = [r for r in rows if r["id"] != "d"]
    images = [str(path.parent / r["image"]) for r in ok]
    expected = fleur.score([r["caption"] for r in ok], images)
    scored = 0
    for k, r in enumerate(ok):
        row = got[r["id"]]
        assert row["metric"] == "fleur" and row["caption"] == r["caption"] and row["image"] == images[k]
        assert "references" not in row  # not asked for with --references
        assert row["fleur/raw"] == expected.raw[k]
        if expected.error[k] is None:
            scored += 1
            assert row["fleur"] == pytest.approx(float(expected.score[k]), abs=1e-5)
            want = fleur.explain([r["caption"]], [images[k]], scores=[row["fleur"]], max_new_tokens=MAX_NEW)
            assert row["explanation"] == want[0]
            assert row["errors"] is None
        else:  # no score: the reason is kept, nothing is explained
            assert row["fleur"] is None and row["explanation"] is None
            assert row["errors"] == {"fleur": expected.error[k]}
    assert scored >= 2 and scored < len(ok)  # both branches exercised
    assert "missing.png" in got["d"]["errors"]["fleur"] and got["d"]["fleur"] is None
    summary = json.loads(proc.stderr.strip().splitlines()[-1])
    assert summary == {"total": 6, "skipped": 0, "written": 6, "errors": sum(1 for r in got.values() if r["errors"])}


def test_explain_resumes_after_interruption(manifest, fleur_run, tiny_judge_path, tmp_path):
    path, rows = manifest
    full, _ = fleur_run
    lines = full.read_text().splitlines(keepends=True)
    out = copy_job(full, tmp_path / "partial.jsonl")
    out.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed while writing row 3
    record = record_path(out).read_bytes()
    proc = explain_cli(path, out, tiny_judge_path, "--batch-size", "3")  # the batch size is not a setting
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1])["skipped"] == 2
    assert record_path(out).read_bytes() == record
    resumed, reference = read_rows(out), read_rows(full)
    assert [r["id"] for r in resumed] == [r["id"] for r in rows]
    for a, b in zip(resumed, reference):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], abs=1e-5)
            else:
                assert a[key] == b[key], key
    again = explain_cli(path, out, tiny_judge_path)  # nothing left to do: no model is even loaded
    assert json.loads(again.stderr.strip().splitlines()[-1])["written"] == 0
    assert len(read_rows(out)) == len(rows)


def test_explain_with_references_uses_reffleur(manifest, tiny_judge_path, fleur, tmp_path):
    path, rows = manifest
    small = tmp_path / "refs.jsonl"
    small.write_text(json.dumps({**rows[0], "image": str(path.parent / rows[0]["image"])}) + "\n"
                     + json.dumps({**rows[1], "image": str(path.parent / rows[1]["image"])}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = explain_cli(small, out, tiny_judge_path, "--references")
    assert proc.returncode == 0, proc.stderr
    got = read_rows(out)
    assert got[0]["references"] == ["a car"]
    expected = fleur.score([rows[0]["caption"]], [str(path.parent / rows[0]["image"])], references=[["a car"]])
    assert got[0]["fleur/raw"] == expected.raw[0]
    assert got[1]["errors"] == {"fleur": f"ValueError: --references: row {rows[1]['id']!r} has no references"}


@pytest.mark.slow
def test_explain_gveval_reasons(tmp_path):
    from capreward.judges.local_chat import LocalChatJudge
    from capreward.scorers.gveval import GVEval
    from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge, tiny_vlm_judge_dir

    judge_dir = tiny_vlm_judge_dir()
    rng = random.Random(0)
    rows = []
    for i, colour in enumerate(["red", "green", "yellow"]):
        image = tmp_path / f"{colour}.png"
        probe_image("gveval", colour).save(image)
        rows.append({"id": str(i), "image": str(image), "caption": f"a {colour} {rng.choice(['box', 'ball'])}"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "g.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = cli_process.run(["explain", manifest, "--out", out, "--metric", "gveval", "--judge-model", judge_dir, "--device",
                            "cpu", "--dtype", "float32", "--max-new-tokens", "120", "--no-progress"], timeout=600,
                           cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    got = read_rows(out)
    expected = GVEval(LocalChatJudge(tiny_vlm_judge(), batch_size=8), max_tokens=120).score(
        [r["caption"] for r in rows], images=[r["image"] for r in rows])
    for k, row in enumerate(got):
        assert row["metric"] == "gveval" and row["gveval/raw"] == expected.raw[k]
        assert row["explanation"] == expected.raw[k]
        if expected.error[k] is None:
            assert row["gveval"] == pytest.approx(float(expected.score[k]), abs=1e-4)
        else:
            assert row["gveval"] is None and row["errors"] == {"gveval": expected.error[k]}
    assert "The final score is $" in got[0]["explanation"]


def test_explain_refuses_images_over_max_pixels(manifest, tiny_judge_path, tmp_path):
    path, rows = manifest
    out = tmp_path / "limited.jsonl"
    proc = explain_cli(path, out, tiny_judge_path, "--max-pixels", "100")
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in read_rows(out)}
    for r in rows:
        error = got[r["id"]]["errors"]["fleur"]
        assert got[r["id"]]["fleur"] is None and got[r["id"]]["explanation"] is None
        assert r["image"] in error  # the item is named
        assert ("does not exist" if r["id"] == "d" else "over the limit of 100 ") in error, error


# ------------------------------------------------------------------------------ the settings record
def test_explain_records_the_settings_that_change_an_explanation(fleur_run, tiny_judge_path):
    from capreward.media.limits import get_media_limits

    out, _ = fleur_run
    record = json.loads(record_path(out).read_text())
    assert record["format"] == "capreward-settings/1" and record["command"] == "explain"
    limits = get_media_limits()  # the subprocess inherited this environment
    files = sorted(p for p in Path(tiny_judge_path).iterdir() if not p.name.startswith("."))
    judge = record["settings"]["judge_model"]
    assert judge["path"] == os.path.abspath(tiny_judge_path) and judge["files"] == len(files)
    assert judge["bytes"] == sum(p.stat().st_size for p in files)
    assert judge["mtime_ns"] == max(p.stat().st_mtime_ns for p in files)
    assert record["settings"] == {"metric": "fleur", "references": False, "judge_model": judge,
                                  "judge_dtype": "float32", "max_new_tokens": MAX_NEW,
                                  "max_pixels": limits.max_pixels, "max_video_pixels": limits.max_video_pixels,
                                  "sub_score_separator": "/"}


def test_batch_size_device_and_progress_are_not_settings(tiny_judge_path, tmp_path):
    from capreward.cli.explain import explanation_settings
    from capreward.cli.main import build_parser

    def settings(*extra):
        return explanation_settings(build_parser().parse_args(
            ["explain", "m.jsonl", "--out", str(tmp_path / "o.jsonl"), "--judge-model", str(tiny_judge_path), *extra]))

    base = settings("--device", "cpu")
    assert settings("--device", "cpu", "--batch-size", "1", "--no-progress") == base
    assert settings("--device", "cpu", "--dtype", "float32") == base  # the CPU default, given explicitly
    assert settings("--device", "cpu", "--dtype", "bfloat16")["judge_dtype"] == "bfloat16"
    assert settings("--device", "cuda")["judge_dtype"] == "float16"  # the default dtype on a GPU
    assert settings("--device", "cpu", "--judge-model", "llava-hf/llava-1.5-7b-hf")["judge_model"] \
        == "llava-hf/llava-1.5-7b-hf"  # a hub name as given


CHANGES = [  # (case, extra arguments of the resume, what the refusal says)
    ("metric", ["--metric", "gveval"], ["--metric was fleur, now gveval"]),
    ("references", ["--references"], ["--references was false, now true"]),
    ("judge model", ["--judge-model", "llava-hf/llava-1.5-7b-hf"],
     ["--judge-model was {judge} (", "bytes, modified ", "now llava-hf/llava-1.5-7b-hf"]),
    ("dtype", ["--dtype", "bfloat16"], ["--dtype was float32, now bfloat16"]),
    ("max new tokens", ["--max-new-tokens", "20"], [f"--max-new-tokens was {MAX_NEW}, now 20"]),
    ("max pixels", ["--max-pixels", "100"], ["--max-pixels was {max_pixels}, now 100"]),
    ("max video pixels", ["--max-video-pixels", "1000"], ["--max-video-pixels was {max_video_pixels}, now 1000"]),
]


@pytest.mark.parametrize("case, extra, says", CHANGES, ids=[c[0] for c in CHANGES])
def test_explain_resume_with_another_setting_is_refused(case, extra, says, manifest, fleur_run, tiny_judge_path,
                                                         tmp_path, capsys):
    from capreward.media.limits import get_media_limits

    path, _ = manifest
    out = copy_job(fleur_run[0], tmp_path / "out.jsonl", lines=3)
    before = files_of(out)
    limits = get_media_limits()
    values = {"judge": tiny_judge_path, "max_pixels": limits.max_pixels, "max_video_pixels": limits.max_video_pixels,
                                  "sub_score_separator": "/"}
    capsys.readouterr()
    assert main(explain_args(path, out, tiny_judge_path, *extra)) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"capreward explain: error: {out} was explained with other settings than this run's")
    assert str(record_path(out)) in line and "explain into a new --out" in line
    for text in says:
        assert text.format(**values) in line, line
    assert line.count(", now ") == 1, line  # only the changed setting is named
    assert files_of(out) == before


def test_explain_refuses_new_weights_at_the_same_path(manifest, tiny_judge_path, tmp_path, capsys):
    path, rows = manifest
    judge = tmp_path / "judge"
    shutil.copytree(tiny_judge_path, judge)
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({**rows[3], "image": str(path.parent / rows[3]["image"])}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = explain_cli(one, out, judge)
    assert proc.returncode == 0, proc.stderr
    before = files_of(out)
    weights = judge / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(weights.read_bytes())  # new weights of the same size written over the old file
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # whatever the clock's resolution
    capsys.readouterr()
    assert main(explain_args(one, out, judge)) == 2
    [line] = error_lines(capsys)
    assert f"--judge-model was {judge} (" in line and f"now {judge} (" in line and line.count(", now ") == 1, line
    assert files_of(out) == before


def test_explain_output_without_a_settings_record_needs_the_flag(manifest, fleur_run, tiny_judge_path, tmp_path,
                                                                 capsys):
    path, rows = manifest
    full, _ = fleur_run
    out = tmp_path / "old.jsonl"
    out.write_text("".join(full.read_text().splitlines(keepends=True)[:5]))  # from before settings were recorded
    before = files_of(out)
    capsys.readouterr()
    assert main(explain_args(path, out, tiny_judge_path)) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"capreward explain: error: {out} already has results but no old.jsonl.settings.json")
    assert "--accept-unrecorded-settings" in line and "explain into a new --out" in line
    assert files_of(out) == before
    # with the flag: this run's settings are recorded as the rows', and the job resumes
    proc = explain_cli(path, out, tiny_judge_path, "--accept-unrecorded-settings")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1])["written"] == 1
    assert json.loads(record_path(out).read_text()) == json.loads(record_path(full).read_text())
    assert [r["id"] for r in read_rows(out)] == [r["id"] for r in rows]
    assert read_rows(out)[-1]["explanation"] == read_rows(full)[-1]["explanation"]
    # from now on the record holds: the flag does not let another setting through
    capsys.readouterr()
    assert main(explain_args(path, out, tiny_judge_path, "--max-new-tokens", "20", "--accept-unrecorded-settings")) == 2
    [line] = error_lines(capsys)
    assert f"--max-new-tokens was {MAX_NEW}, now 20" in line


@pytest.mark.parametrize("unnamed", [False, True], ids=["named", "record from before commands were named"])
def test_explain_refuses_an_output_of_capreward_score(unnamed, manifest, fleur_run, tiny_judge_path, tmp_path, capsys):
    from capreward.jobs.runners import ScoreOptions
    from capreward.jobs.settings_file import job_settings

    path, _ = manifest
    out = tmp_path / "scores.jsonl"
    out.write_text("".join(fleur_run[0].read_text().splitlines(keepends=True)[:2]))
    # the record capreward score writes for a FLEUR job on the same judge
    options = ScoreOptions(metrics=["fleur"], judge_model=str(tiny_judge_path), device="cpu")
    job_settings(out, options, has_results=False)
    if unnamed:
        record = json.loads(record_path(out).read_text())
        del record["command"]
        record_path(out).write_text(json.dumps(record))
    before = files_of(out)
    capsys.readouterr()
    assert main(explain_args(path, out, tiny_judge_path)) == 2
    [line] = error_lines(capsys)
    assert f"{out} was written by capreward score, not capreward explain" in line, line
    assert files_of(out) == before


def test_explain_help_documents_the_settings_record():
    from capreward.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["explain"]
    text = " ".join(sub.format_help().split())
    assert "<out>.settings.json" in text and "a resume with any of them different is refused" in text
    assert "not the batch size, device or progress" in text
    assert "--accept-unrecorded-settings resume an output that has rows but no <out>.settings.json" in text


def test_a_several_image_row_is_refused_and_the_others_explained(manifest, fleur_run, tiny_judge_path, tmp_path):
    """An explanation is about one visual: a row whose ``image`` lists several gets an error naming how
    many, the other rows of its batch are explained as in a run without it."""
    path, rows = manifest
    several = {"id": "g", "image": [rows[0]["image"], rows[2]["image"]], "caption": rows[0]["caption"]}
    mixed = tmp_path / "manifest.jsonl"
    mixed.write_text(json.dumps(rows[0]) + "\n" + json.dumps(several) + "\n")
    for row in (rows[0],):
        shutil.copyfile(path.parent / row["image"], tmp_path / row["image"])
    shutil.copyfile(path.parent / rows[2]["image"], tmp_path / rows[2]["image"])
    out = tmp_path / "out.jsonl"
    assert main(explain_args(mixed, out, tiny_judge_path)) == 0
    got = {r["id"]: r for r in read_rows(out)}
    assert got["g"]["fleur"] is None and got["g"]["explanation"] is None
    assert "the row has 2 images; an explanation is about one visual" in got["g"]["errors"]["fleur"]
    alone = {r["id"]: r for r in read_rows(fleur_run[0])}["a"]
    assert got["a"]["fleur"] == pytest.approx(alone["fleur"], abs=1e-5)  # another batch: fp32 rounding
    assert got["a"]["explanation"] == alone["explanation"]
