"""Outputs that no text can break: a lone surrogate ("\\ud800", what a truncated emoji escape in scraped
JSON decodes to) in a caption, a reference, an id or a carried key never stops a writer. ``capreward
score`` (JSONL and CSV), ``explain``, ``report`` and the idf corpus hashing write it (escaped), every
line stays valid UTF-8 JSON, ids read back equal the manifest's, and a resume skips the rows written."""

from __future__ import annotations

import csv
import hashlib
import json

import pytest

from capreward.cli.main import main
from capreward.jobs.idf_file import corpus_digest
from capreward.jobs.results_file import read_results

from conftest import write_job_media

LONE = "\ud800"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return write_job_media(tmp_path_factory.mktemp("media"))


def rows_with_surrogates(image) -> list[dict]:
    return [
        {"id": "plain", "caption": "a red car on a road", "image": str(image), "references": ["a car", "a red car"]},
        {"id": f"id-{LONE}", "caption": f"a red {LONE} car", "image": str(image),
         "references": [f"a car \udc00", "a red car"], f"note-{LONE}": f"scraped {LONE} text"},
        {"id": "other", "caption": "a blue sky", "image": str(image), "references": ["the sky", "a car"]},
    ]


def write_manifest(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps escapes "\ud800" as \ud800


def check_lines(path) -> list[dict]:
    """Every line of ``path`` is valid UTF-8 and JSON; returns the rows."""
    raw = path.read_bytes()
    raw.decode("utf-8")  # strict: no lone surrogate bytes written
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def test_score_writes_rows_with_lone_surrogates_and_resumes_them(tmp_path, media, tiny_clip_path, capsys):
    image, _ = media
    rows = rows_with_surrogates(image)
    manifest, out, table = tmp_path / "m.jsonl", tmp_path / "out.jsonl", tmp_path / "out.csv"
    write_manifest(manifest, rows)
    args = ["score", str(manifest), "--out", str(out), "--csv", str(table), "--metrics", "emscore,clip-s",
            "--clip-model", str(tiny_clip_path), "--frames", "4", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err  # emscore's idf hashes the references (auto)
    written = check_lines(out)
    assert [r["id"] for r in written] == [r["id"] for r in rows]  # the id comes back exactly, escaped on disk
    bad = written[1]
    assert bad["caption"] == rows[1]["caption"] and bad["references"] == rows[1]["references"]
    assert bad["errors"] is None and isinstance(bad["emscore"], float)
    # the CSV is valid UTF-8 with the id escaped
    with table.open(encoding="utf-8", newline="") as f:
        ids = [r["id"] for r in csv.DictReader(f)]
    assert ids == ["plain", "id-\\ud800", "other"]
    # the good rows score exactly as they do without the row of surrogates beside them
    alone_manifest, alone_out = tmp_path / "alone.jsonl", tmp_path / "alone_out.jsonl"
    write_manifest(alone_manifest, [rows[0], rows[2]])
    assert main([*args[:1], str(alone_manifest), "--out", str(alone_out), *args[6:]]) == 0
    alone = {r["id"]: r for r in read_results(alone_out)}
    for r in (written[0], written[2]):
        assert r["clip_s"] == pytest.approx(alone[r["id"]]["clip_s"], abs=1e-6)
    # a resume finds every row: nothing rescored, the file untouched
    before = out.read_bytes()
    capsys.readouterr()
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert summary["skipped"] == 3 and summary["written"] == 0
    assert out.read_bytes() == before


def test_report_of_rows_with_lone_surrogates(tmp_path, media, capsys):
    image, _ = media
    scores, page = tmp_path / "scores.jsonl", tmp_path / "report.html"
    rows = [{"id": f"x{LONE}", "caption": f"a red {LONE} car", "image": str(image), "references": [f"r {LONE}"],
             "clip_s": 0.5, "errors": None}]
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["report", str(scores), "--out", str(page), "--no-progress"]) == 0
    text = page.read_bytes().decode("utf-8")
    assert "a red \\ud800 car" in text and "x\\ud800" in text and "<img" in text


def test_json_line_escapes_only_what_utf8_cannot_encode():
    from capreward.jsonl import json_line
    from capreward.text import well_formed

    assert json_line({"c": "café 🐕"}) == '{"c": "café 🐕"}'  # readable as before
    line = json_line({"id": f"a{LONE}", "c": "café"})
    line.encode("utf-8")
    assert json.loads(line) == {"id": f"a{LONE}", "c": "café"}
    assert well_formed(f"a{LONE}b") == "a\ufffdb" and well_formed("café") == "café"


def test_idf_corpus_digest_takes_lone_surrogates_and_keeps_old_digests():
    corpus = ["a red car", "café 🐕"]
    # the digest of encodable text is what earlier versions recorded (resumes keep their idf record)
    old = hashlib.sha256(json.dumps(sorted(corpus), ensure_ascii=False).encode("utf-8")).hexdigest()
    assert corpus_digest(corpus) == old
    with_lone = corpus_digest(["a red car", f"café {LONE}"])
    assert with_lone != corpus_digest(["a red car", "café \udc00"]) != corpus_digest(["a red car", "café \ufffd"])
    assert with_lone == corpus_digest([f"café {LONE}", "a red car"])  # a multiset: order does not matter


def test_explain_writes_a_row_with_lone_surrogates(tmp_path, tiny_judge_path, capsys):
    from capreward.testing import fleur_task_image

    fleur_task_image("red").save(tmp_path / "red.png")
    rows = [{"id": "a", "caption": "a red ball", "image": "red.png", "references": ["a ball"]},
            {"id": f"b{LONE}", "caption": f"a red {LONE} ball", "image": "red.png", "references": [f"r {LONE}"]}]
    manifest, out = tmp_path / "m.jsonl", tmp_path / "explained.jsonl"
    write_manifest(manifest, rows)
    args = ["explain", str(manifest), "--out", str(out), "--judge-model", str(tiny_judge_path), "--device", "cpu",
            "--dtype", "float32", "--batch-size", "2", "--max-new-tokens", "4", "--references", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    written = check_lines(out)
    assert [r["id"] for r in written] == ["a", f"b{LONE}"]
    assert written[1]["caption"] == rows[1]["caption"]
    before = out.read_bytes()
    assert main(args) == 0 and out.read_bytes() == before  # the resume skips both


@pytest.fixture(scope="module")
def tiny_judge_path():
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir

    return tiny_judge_dir(FLEUR_RECIPE)
