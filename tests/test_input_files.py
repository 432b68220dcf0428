"""Issue 43 item 5: every file a user names is read only when it is a regular file. A FIFO or a
character device given as a visual in a manifest is a row error, never a hang (the per-image hash read
every visual in full); as the manifest, the report's results, ``--idf`` or the settings record it is a
one-line refusal, never a read without end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capreward.input_files import NotARegularFile, file_kind, open_regular, read_regular_bytes

from conftest import write_job_media
import cli_process

#: A hang shows as this many seconds without an answer (the runs themselves take a few seconds).
HANG = 240


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return cli_process.run(args, timeout=HANG, cwd=cwd)


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.png"
    os.mkfifo(path)  # no writer ever comes: a blocking open waits forever
    return path


def test_open_regular_refuses_what_is_not_a_regular_file_without_reading(tmp_path, fifo):
    regular = tmp_path / "a.txt"
    regular.write_bytes(b"abc")
    link = tmp_path / "link.txt"
    link.symlink_to(regular)
    assert read_regular_bytes(regular) == b"abc"
    assert read_regular_bytes(link) == b"abc"  # a link to a regular file is followed
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"), (tmp_path, "a directory")):
        with pytest.raises(NotARegularFile, match=f"the input {path} is {kind}, not a regular file"):
            open_regular(path, "the input")
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
    assert file_kind(os.stat(regular).st_mode) == "a regular file"


def test_the_visual_hash_never_opens_a_fifo_or_reads_a_device(tmp_path, fifo):
    """Run apart: on the code before, the digest of the FIFO blocks in open() for good."""
    code = ("import sys; from capreward.jobs.row_inputs import VisualDigests; d = VisualDigests(); "
            "print(d(sys.argv[1]), d('/dev/zero'), d(sys.argv[2]))")
    regular = tmp_path / "r.bin"
    regular.write_bytes(b"x" * 10)
    proc = subprocess.run([sys.executable, "-c", code, str(fifo), str(regular)], capture_output=True, text=True,
                          timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    fifo_digest, device_digest, regular_digest = proc.stdout.split()
    assert (fifo_digest, device_digest) == ("None", "None")
    import hashlib

    assert regular_digest == hashlib.blake2b(b"x" * 10, digest_size=16).hexdigest()


def test_score_gives_a_fifo_or_a_device_image_a_row_error(tmp_path, fifo, tiny_clip_path):
    image, _ = write_job_media(tmp_path)
    manifest = tmp_path / "m.jsonl"
    rows = [{"id": "ok", "caption": "a red car", "image": str(image)},
            {"id": "fifo", "caption": "a red car", "image": str(fifo)},
            {"id": "zero", "caption": "a red car", "image": "/dev/zero"},
            {"id": "both", "caption": "a red car", "image": [str(image), str(fifo)]}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    proc = cli("score", manifest, "--out", out, "--metrics", "clip_s", "--clip-model", tiny_clip_path, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert got["ok"]["errors"] is None and got["ok"]["clip_s"] is not None
    for rid in ("fifo", "zero", "both"):
        assert got[rid].get("clip_s") is None
        assert "not a file" in got[rid]["errors"]["clip_s"], got[rid]["errors"]
    assert got["fifo"]["visual_hash"] is None and got["zero"]["visual_hash"] is None
    assert got["both"]["visual_hash"][0] == got["ok"]["visual_hash"] and got["both"]["visual_hash"][1] is None


@pytest.mark.parametrize("where", ["manifest", "report", "idf"])
def test_a_fifo_or_device_named_as_an_input_file_is_refused_in_one_line(where, tmp_path, fifo, tiny_clip_path):
    image, _ = write_job_media(tmp_path)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a red car", "image": str(image)}) + "\n")
    named = {"manifest": fifo, "report": Path("/dev/zero"), "idf": fifo}[where]  # both kinds: the unit test above
    if where == "manifest":
        proc = cli("score", named, "--out", tmp_path / "o.jsonl", "--clip-model", tiny_clip_path, "--no-progress")
    elif where == "report":
        proc = cli("report", named, "--out", tmp_path / "r.html", "--no-progress")
    else:
        proc = cli("score", manifest, "--out", tmp_path / "o.jsonl", "--clip-model", tiny_clip_path,
                   "--idf", named, "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{named} is a" in lines[0] and "not a regular file" in lines[0], lines[0]


def test_a_settings_record_that_is_a_fifo_is_refused(tmp_path, fifo, tiny_clip_path):
    image, _ = write_job_media(tmp_path)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a red car", "image": str(image)}) + "\n")
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps({"id": "x", "caption": "c", "clip_s": 0.5, "errors": None}) + "\n")
    os.mkfifo(tmp_path / "o.jsonl.settings.json")
    proc = cli("score", manifest, "--out", out, "--metrics", "clip_s", "--clip-model", tiny_clip_path, "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert "is a FIFO" in proc.stderr and "Traceback" not in proc.stderr


def test_a_fifo_given_as_a_judgments_file_is_refused(tmp_path, fifo):
    """Run apart: on the code before, reading the FIFO blocks for good."""
    code = ("import sys\nfrom capreward.metaeval.readers import JudgmentError, read_flickr8k, read_jsonl_objects\n"
            "for read in (read_flickr8k, read_jsonl_objects):\n"
            "    try:\n        read(__import__('pathlib').Path(sys.argv[1]))\n"
            "    except JudgmentError as exc:\n        print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and all(f"{fifo} is a FIFO, not a regular file" in line for line in lines), lines
