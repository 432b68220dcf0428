"""Manifests as people write them: a near miss of a known key ("refrences", "imgae", "captoin") is refused
with "did you mean ..." (exit 2, naming the line) instead of being ignored; other keys are carried to the
results (JSONL and CSV) untouched; a line that is not JSON (invalid UTF-8, nesting too deep, an integer
over Python's 4300-digit limit) is one line naming the line, never a traceback."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from capreward.cli.main import main
from capreward.jobs.results_file import read_results

from conftest import write_job_media


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return write_job_media(tmp_path_factory.mktemp("media"))[0]


def score(manifest: Path, out: Path, clip: str, *extra: str) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", "clip-s", "--clip-model", clip, "--no-progress",
            *extra]


def one_line_error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


NEAR_MISSES = [  # (the misspelt row, the key it meant)
    ({"caption": "a red car", "image": "{image}", "refrences": ["a car"]}, "references"),
    ({"caption": "a red car", "imgae": "{image}"}, "image"),
    ({"captoin": "a red car", "image": "{image}"}, "caption"),
    ({"caption": "a red car", "video": "{image}", "Refrence": ["a car"]}, "references"),
    ({"caption": "a red car", "image": "{image}", "ID": "x"}, "id"),
]


@pytest.mark.parametrize("row, meant", NEAR_MISSES, ids=["refrences", "imgae", "captoin", "Refrence", "ID"])
def test_a_near_miss_of_a_known_key_is_refused_with_did_you_mean(row, meant, image, tmp_path, capsys):
    manifest = tmp_path / "m.jsonl"
    good = {"caption": "a blue sky", "image": str(image)}
    row = {k: (v.format(image=image) if isinstance(v, str) else v) for k, v in row.items()}
    manifest.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, "no-such-model.pt")) == 2  # refused before any model is loaded
    error = one_line_error(capsys)
    assert f"{manifest}:2:" in error and f"did you mean {meant!r}" in error, error
    assert not out.exists()


def test_other_keys_are_carried_to_the_results_untouched(image, tiny_clip_path, tmp_path, capsys):
    extra = {"source": "coco/val2014", "split": {"name": "val", "fold": [1, 2]}, "uid": 7, "vid": "clip-3",
             "weight": 0.25, "flag": None, "notes": ["x", {"y": True}]}
    rows = [{"id": "a", "caption": "a red car", "image": str(image), **extra},
            {"id": "b", "caption": "a blue sky", "video": str(image).replace("im.png", "v.mp4"), "vid": "v-1"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, table = tmp_path / "out.jsonl", tmp_path / "out.csv"
    assert main(score(manifest, out, str(tiny_clip_path), "--csv", str(table))) == 0, capsys.readouterr().err
    got = {r["id"]: r for r in read_results(out)}
    assert {k: got["a"][k] for k in extra} == extra and got["b"]["vid"] == "v-1"
    assert isinstance(got["a"]["clip_s"], float) and got["a"]["errors"] is None
    with table.open(newline="") as f:
        first = next(csv.DictReader(f))
    assert first["source"] == "coco/val2014" and json.loads(first["split"]) == extra["split"]


def test_a_carried_key_may_not_hide_a_written_field(image, tmp_path, capsys):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a red car", "image": str(image), "clip_s": 1.0}) + "\n")
    assert main(score(manifest, tmp_path / "out.jsonl", "no-such-model.pt")) == 2
    error = one_line_error(capsys)
    assert f"{manifest}:1:" in error and "'clip_s'" in error


BAD_LINES = {
    "invalid UTF-8": (b'{"caption": "caf\xe9 au lait", "image": "im.png"}\n', r"not valid UTF-8"),
    "deep nesting": (b'{"caption": "a", "image": "im.png", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
                     r"nested too deeply"),
    "nesting over the row limit": (b'{"caption": "a", "image": "im.png", "x": ' + b"[" * 200 + b"]" * 200 + b"}\n",
                                   r"nested deeper than"),
    "huge integer": (b'{"caption": "a", "image": "im.png", "n": ' + b"9" * 5000 + b"}\n", r"more than 4300 digits"),
    "huge integer id": (b'{"id": ' + b"1" * 4301 + b', "caption": "a", "image": "im.png"}\n', r"more than 4300 digits"),
}


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_line_that_is_not_json_is_one_line_naming_it(kind, image, tmp_path, capsys):
    line, says = BAD_LINES[kind]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(json.dumps({"caption": "a blue sky", "image": str(image)}).encode() + b"\n" + line)
    assert main(score(manifest, tmp_path / "out.jsonl", "no-such-model.pt")) == 2
    error = one_line_error(capsys)
    assert f"{manifest}:2:" in error and __import__("re").search(says, error), error
    assert len(error) < 400  # the line itself is not echoed


def test_near_miss_rules():
    from capreward.jobs.manifest import edit_distance, near_miss

    assert edit_distance("imgae", "image") == 1 and edit_distance("captoin", "caption") == 1
    assert edit_distance("refrences", "references") == 1 and edit_distance("vid", "video") == 2
    assert near_miss("refrences", {}) == "references" and near_miss("Caption", {}) == "caption"
    # a dataset's own fields
    for key in ("uid", "source", "split", "url", "label", "kind", "name", "frames"):
        assert near_miss(key, {"caption": "c", "image": "i"}) is None, key
    assert near_miss("vid", {"caption": "c", "video": "v"}) is None
    assert near_miss("vid", {"caption": "c", "image": "i"}) is None  # a row with an image lacks no video
    assert near_miss("reference", {"caption": "c", "image": "i", "references": []}) is None  # has the real key
