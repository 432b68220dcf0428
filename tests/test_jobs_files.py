"""`capreward score`'s files next to the results: the idf record (fixed per results file, reused on
resume, a different one refused), the writer lock (a second writer refused, a killed holder never
blocks), and the CSV's column order."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from capreward import EMScore
from capreward.cli.main import build_parser, main
from capreward.jobs.idf_file import corpus_digest, record_path
from capreward.jobs.output_lock import lock_path
from capreward.locks import holder_path, read_holder, try_holding
from capreward.jobs.results_file import read_results

from conftest import write_job_media
import cli_process


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return write_job_media(tmp_path_factory.mktemp("media"))


def manifest_rows(media, n: int, refs_from: int = 0) -> list[dict]:
    image, video = media
    return [{"id": f"cat-{i}", "caption": f"caption number {i} about a red car",
             **({"image": str(image)} if i % 2 else {"video": str(video)}),
             "references": [f"reference {i + refs_from} of a vehicle", "a car"]} for i in range(n)]


def write_manifest(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score(manifest, out, clip, *extra) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", "emscore", "--clip-model", str(clip),
            "--frames", "4", "--no-progress", *map(str, extra)]


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# ------------------------------------------------------------------------------ idf record
def test_idf_is_recorded_once_and_reused_on_resume(tmp_path, media, tiny_clip_path):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 4))
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, tiny_clip_path)) == 0
    record = json.loads(record_path(out).read_text())
    corpus = [ref for r in manifest_rows(media, 4) for ref in r["references"]]
    assert record["corpus_sha256"] == corpus_digest(corpus) and record["corpus_size"] == 8
    assert record["source"].startswith("auto: the 8 references in") and str(manifest) in record["source"]
    # the recorded table is the released idf procedure over the manifest's references
    table = EMScore(model=str(tiny_clip_path), idf=corpus).idf_table
    assert record["default"] == pytest.approx(math.log(9))
    assert {int(k): v for k, v in record["weights"].items()} == pytest.approx(table.weights, abs=1e-12)
    # a resume after a lost row reuses the record as it is and scores the row as before
    rows = read_results(out)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    before = record_path(out).read_bytes()
    assert main(score(manifest, out, tiny_clip_path, "--batch-size", "1")) == 0
    assert record_path(out).read_bytes() == before
    resumed = {r["id"]: r for r in read_results(out)}
    for r in rows:
        assert resumed[r["id"]]["emscore"] == pytest.approx(r["emscore"], abs=1e-6)


def test_a_resume_with_another_idf_is_refused(tmp_path, media, tiny_clip_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 3))
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, tiny_clip_path)) == 0
    capsys.readouterr()
    scored = out.read_bytes()
    # the manifest grew by rows with new references: --idf auto would now mean another corpus
    write_manifest(manifest, manifest_rows(media, 3) + manifest_rows(media, 5, refs_from=100)[3:])
    for idf in ("auto", "none"):
        assert main(score(manifest, out, tiny_clip_path, "--idf", idf)) == 2
        [line] = error_lines(capsys)
        assert str(out) in line and str(record_path(out)) in line and "--idf" in line
    assert out.read_bytes() == scored
    # keeping the recorded idf explicitly scores the new rows with it
    assert main(score(manifest, out, tiny_clip_path, "--idf", record_path(out))) == 0
    new = {r["id"]: r for r in read_results(out)}["cat-4"]
    old_corpus = [ref for r in manifest_rows(media, 3) for ref in r["references"]]
    direct = EMScore(model=str(tiny_clip_path), idf=old_corpus, frames=4).score(
        [new["caption"]], videos=[new["video"]], references=[new["references"]], harmonic_mean="sign-safe")
    assert new["emscore"] == pytest.approx(direct.score.item(), abs=1e-6)


def test_a_results_file_without_its_idf_record_is_not_resumed(tmp_path, media, tiny_clip_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, tiny_clip_path)) == 0
    record_path(out).unlink()
    capsys.readouterr()
    assert main(score(manifest, out, tiny_clip_path)) == 2
    [line] = error_lines(capsys)
    assert "no out.jsonl.idf.json" in line


def test_help_documents_the_idf_default_and_the_files():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["score"]
    text = " ".join(sub.format_help().split())
    assert "default: auto = the manifest's references" in text
    assert "<out>.idf.json" in text and "<out>.lock" in text


# ------------------------------------------------------------------------------ one writer per file
def lock_holder(out: Path) -> subprocess.Popen:
    """A separate process holding the lock of ``out`` until killed; returns once it holds it."""
    code = ("import sys\nfrom capreward.jobs.output_lock import exclusive_output\n"
            f"with exclusive_output({str(out)!r}):\n    print('locked', flush=True)\n    sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_is_refused_and_a_killed_holder_does_not_block(tmp_path, media, tiny_clip_path):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    out = tmp_path / "out.jsonl"
    holder = lock_holder(out)
    try:
        proc = cli_process.run(score(manifest, out, tiny_clip_path), timeout=600)
        assert proc.returncode == 2
        [line] = proc.stderr.strip().splitlines()
        assert str(out) in line and f"PID {holder.pid}" in line
        assert not out.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert read_holder(lock_path(out))["pid"] == holder.pid  # its holder file, left behind by the killed holder
    rerun = subprocess.Popen([sys.executable, "-m", "capreward.cli.main", *score(manifest, out, tiny_clip_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-2000:]
    assert [r["id"] for r in read_results(out)] == ["cat-0", "cat-1"]
    assert not holder_path(lock_path(out)).exists()  # the rerun replaced it, and removed it when it finished


def test_explain_takes_the_same_writer_lock(tmp_path, media):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 1))
    out = tmp_path / "why.jsonl"
    holder = lock_holder(out)
    try:
        proc = cli_process.run(["explain", manifest, "--out", out, "--metric", "fleur", "--judge-model",
                                tmp_path / "unused", "--no-progress"], timeout=600)
        assert proc.returncode == 2
        [line] = proc.stderr.strip().splitlines()
        assert str(out) in line and f"PID {holder.pid}" in line  # refused before any model is loaded
        assert not out.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_the_lock_is_held_while_scoring(tmp_path, media, tiny_clip_path, monkeypatch):
    """While a job writes, its lock is taken (checked from inside the job), and released after it."""
    from capreward.jobs import score_job

    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    out = tmp_path / "out.jsonl"
    seen = []
    original = score_job.run_local

    def probing(*args, **kwargs):
        with try_holding(lock_path(out)) as free:
            seen.append("free" if free else read_holder(lock_path(out))["pid"])
        return original(*args, **kwargs)

    monkeypatch.setattr(score_job, "run_local", probing)
    assert main(score(manifest, out, tiny_clip_path)) == 0
    assert seen == [os.getpid()]
    with try_holding(lock_path(out)) as free:
        assert free  # released


# ------------------------------------------------------------------------------ CSV and row errors
def test_csv_puts_id_caption_and_headline_scores_first_and_alignment_last(tmp_path, media, tiny_clip_path):
    rows = manifest_rows(media, 3)
    rows[1]["image"] = str(tmp_path / "missing.png")
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    out, table = tmp_path / "out.jsonl", tmp_path / "out.csv"
    assert main(["score", str(manifest), "--out", str(out), "--metrics", "emscore,clip-s,hallucination",
                 "--clip-model", str(tiny_clip_path), "--frames", "4", "--alignment", "--csv", str(table),
                 "--no-progress"]) == 0
    with table.open(newline="") as f:
        header, *lines = list(csv.reader(f))
    assert header[:6] == ["id", "caption", "emscore", "clip_s", "ref_clip_s", "hallucination"]
    assert header[-1] == "alignment" and header.index("emscore/video/fine_p") > header.index("errors")
    assert [line[0] for line in lines] == ["cat-0", "cat-1", "cat-2"]
    errors = json.loads(lines[1][header.index("errors")])
    for metric in ("emscore", "clip_s", "hallucination"):
        assert errors[metric] == f"row 'cat-1': file does not exist ({tmp_path / 'missing.png'})"
    assert json.loads(lines[0][-1])["tokens"][0] == "<sos>"
