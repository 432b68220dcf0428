"""Round 3: a job's files are never opened through a link planted in advance, only a regular file (or
a new path) is a results file, and a resume refuses rows whose caption, references or visual changed
since they were scored."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from capreward.cli.main import main
from capreward.jobs.output_lock import lock_path
from capreward.jobs.results_file import quarantine_path, read_results

from conftest import write_job_media
from test_jobs_files import error_lines, manifest_rows, score, write_manifest


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return write_job_media(tmp_path_factory.mktemp("media"))


@pytest.fixture
def foreign(tmp_path) -> Path:
    """A file the job does not own, with content that must survive."""
    path = tmp_path / "someone_elses.txt"
    path.write_text("precious\n")
    return path


def refused(capsys, *words) -> str:
    lines = error_lines(capsys)
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("planted", ["lock", "csv", "out"])
def test_a_planted_link_is_refused_and_the_foreign_file_kept(planted, tmp_path, media, tiny_clip_path, foreign, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    out, csv = tmp_path / "out.jsonl", tmp_path / "out.csv"
    link = {"lock": lock_path(out), "csv": csv, "out": out}[planted]
    link.symlink_to(foreign)
    assert main(score(manifest, out, tiny_clip_path, "--csv", csv)) == 2
    refused(capsys, str(link), "symbolic link")
    assert foreign.read_text() == "precious\n"
    assert link.is_symlink()


def test_a_planted_quarantine_link_is_refused(tmp_path, media, tiny_clip_path, foreign, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "cat-0", "caption": "x"}\nnot json\n')
    quarantine_path(out).symlink_to(foreign)
    assert main(score(manifest, out, tiny_clip_path, "--quarantine-bad-lines", "--accept-unrecorded-settings")) == 2
    refused(capsys, str(quarantine_path(out)), "symbolic link")
    assert foreign.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory"])
def test_out_must_be_a_regular_file_or_a_new_path(kind, tmp_path, media, tiny_clip_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows(media, 2))
    if kind == "character device":
        out = Path("/dev/zero")  # read without bound by an unchecked resume
    elif kind == "FIFO":
        out = tmp_path / "fifo"
        os.mkfifo(out)  # an unchecked resume blocks forever opening it
    else:
        out = tmp_path / "results"
        out.mkdir()
    assert main(score(manifest, out, tiny_clip_path)) == 2
    refused(capsys, str(out), f"is a {kind}", "regular file")


def test_a_resume_refuses_rows_whose_inputs_changed(tmp_path, media, tiny_clip_path, capsys):
    image, video = media
    own_image = tmp_path / "own.png"
    shutil.copy(image, own_image)
    rows = manifest_rows(media, 4)
    rows[1]["image"] = str(own_image)
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, tiny_clip_path)) == 0
    written = read_results(out)
    assert all(len(r["visual_hash"]) == 32 for r in written)
    capsys.readouterr()
    # the same manifest resumes (nothing to do)
    assert main(score(manifest, out, tiny_clip_path)) == 0
    capsys.readouterr()
    # one caption, one reference list and one visual's content change; one more row is added
    changed = [dict(r) for r in rows] + [{"id": "new", "caption": "a new row", "image": str(image)}]
    changed[0]["caption"] = "a different caption"
    changed[2]["references"] = ["another reference"]
    write_manifest(manifest, changed)
    with own_image.open("r+b") as f:  # same path, other content
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    before = out.read_bytes()
    assert main(score(manifest, out, tiny_clip_path)) == 2
    line = refused(capsys, "3 row(s)", "'cat-0': caption", "'cat-1': visual content", "'cat-2': references")
    assert "cat-3" not in line
    assert out.read_bytes() == before  # nothing scored, nothing changed
