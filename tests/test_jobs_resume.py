"""Resumes never destroy finished rows: only a torn last line is repaired; any other line of a results file
that is not a result row stops the job (exit 2, the line named, the file byte for byte as it was) or,
with ``--quarantine-bad-lines``, moves to ``<out>.quarantine``. A disk error (full disk, read-only file
system, no permission, an immutable file) is one line naming the file and the rows already safe, and the
same command completes after the fault with every row exactly once. Ctrl-C (a real SIGINT to a real
subprocess) is one line saying how many rows are safe and that the same command resumes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from capreward.cli.main import main
from capreward.jobs.results_file import KILL_AFTER_BATCH_ENV
from capreward.jobs.settings_file import record_path

from conftest import write_job_media

ROWS = 6


def score_args(manifest: Path, out: Path, clip: Path, *extra: str) -> list[str]:
    return ["score", str(manifest), "--out", str(out), "--metrics", "clip-s", "--clip-model", str(clip),
            "--batch-size", "2", "--no-progress", *extra]


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines() if line.strip()]


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_clip_path):
    """A manifest of ROWS image rows and its complete results (the reference every resume must equal)."""
    folder = tmp_path_factory.mktemp("resume")
    image, _ = write_job_media(folder)
    rows = [{"id": f"r{i}", "caption": f"caption {i} of a red car", "image": str(image)} for i in range(ROWS)]
    manifest = folder / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference = folder / "reference.jsonl"
    assert main(score_args(manifest, reference, tiny_clip_path)) == 0
    lines = reference.read_bytes().splitlines(keepends=True)
    assert len(lines) == ROWS
    return manifest, reference, lines, tiny_clip_path


def partial(job, out: Path, lines: list[bytes]) -> Path:
    """``out`` holding ``lines`` (bytes), with the reference's settings record (the same settings)."""
    out.write_bytes(b"".join(lines))
    shutil.copyfile(record_path(job[1]), record_path(out))
    return out


def assert_complete(job, out: Path) -> None:
    """Every manifest row exactly once, each equal to the reference run's."""
    reference = {r["id"]: r for r in rows_of(job[1])}
    got = rows_of(out)
    assert sorted(r["id"] for r in got) == sorted(reference)
    for r in got:
        assert r["clip_s"] == pytest.approx(reference[r["id"]]["clip_s"], abs=1e-6)


# ------------------------------------------------------------------------------- corrupt lines
BAD_LINES = {
    "invalid JSON": b'{"id": "x", "clip_s": 0.1\n',
    "invalid UTF-8": b'{"id": "r9", "caption": "caf\xe9"}\n',
    "row without an id": b'{"caption": "a red car", "clip_s": 0.2}\n',
    "not an object": b"[1, 2, 3]\n",
}


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_corrupt_middle_line_stops_the_resume_and_leaves_the_file_as_it_is(kind, job, tmp_path, capsys):
    _, _, lines, clip = job
    out = partial(job, tmp_path / "out.jsonl", [lines[0], lines[1], BAD_LINES[kind], lines[2], lines[3]])
    before = out.read_bytes()
    assert main(score_args(job[0], out, clip)) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and f"{out}:3:" in errors[0] and "--quarantine-bad-lines" in errors[0], errors
    assert out.read_bytes() == before
    assert not (tmp_path / "out.jsonl.quarantine").exists()


def test_quarantine_moves_the_bad_lines_and_keeps_every_row(job, tmp_path, capsys):
    _, _, lines, clip = job
    kept = lines[2].replace(b'"clip_s": ', b'"clip_s": 123.0, "was": ')  # a finished row that must survive as is
    out = partial(job, tmp_path / "out.jsonl", [lines[0], BAD_LINES["invalid UTF-8"], kept, BAD_LINES["not an object"],
                                               lines[3], lines[4][:20]])  # and a torn last line
    assert main(score_args(job[0], out, clip, "--quarantine-bad-lines")) == 0, capsys.readouterr().err
    quarantine = tmp_path / "out.jsonl.quarantine"
    assert quarantine.read_bytes() == BAD_LINES["invalid UTF-8"] + BAD_LINES["not an object"]
    got = out.read_bytes().splitlines(keepends=True)
    assert got[:3] == [lines[0], kept, lines[3]]  # the finished rows, untouched, in their order
    by_id = {r["id"]: r for r in rows_of(out)}
    assert sorted(by_id) == [f"r{i}" for i in range(ROWS)] and len(got) == ROWS
    assert by_id["r2"]["clip_s"] == 123.0  # not rescored
    reference = {r["id"]: r for r in rows_of(job[1])}
    for rid in ("r1", "r4", "r5"):
        assert by_id[rid]["clip_s"] == pytest.approx(reference[rid]["clip_s"], abs=1e-6)


def test_a_whole_last_row_without_its_newline_is_kept(job, tmp_path):
    _, _, lines, clip = job
    last = lines[1].replace(b'"clip_s": ', b'"clip_s": 123.0, "was": ').rstrip(b"\n")
    out = partial(job, tmp_path / "out.jsonl", [lines[0], last])
    assert main(score_args(job[0], out, clip)) == 0
    assert out.read_bytes().splitlines(keepends=True)[:2] == [lines[0], last + b"\n"]
    assert {r["id"]: r for r in rows_of(out)}["r1"]["clip_s"] == 123.0 and len(rows_of(out)) == ROWS


def test_a_torn_last_line_is_still_cut(job, tmp_path):
    _, _, lines, clip = job
    out = partial(job, tmp_path / "out.jsonl", [lines[0], lines[1], lines[2][:25]])
    assert main(score_args(job[0], out, clip)) == 0
    assert out.read_bytes().startswith(lines[0] + lines[1])
    assert_complete(job, out)


# ------------------------------------------------------------------------------- disk errors
@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EACCES", "EPERM"])
def test_a_failed_write_keeps_whole_rows_and_the_same_command_completes(code, job, tmp_path, monkeypatch, capsys):
    """The fault is injected at the write call (the second batch fails half written)."""
    _, _, _, clip = job
    out = tmp_path / "out.jsonl"
    calls = {"n": 0}
    real_write = os.write

    def failing_write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}") != str(out):
            return real_write(fd, data)
        calls["n"] += 1
        if calls["n"] == 2:
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    assert main(score_args(job[0], out, clip)) == 2
    monkeypatch.undo()
    errors = error_lines(capsys)
    assert len(errors) == 1 and f"cannot write {out}" in errors[0] and os.strerror(getattr(errno, code)) in errors[0]
    assert f"2 rows are safe in {out}" in errors[0] and "run the same command again to resume" in errors[0]
    assert len(rows_of(out)) == 2 and out.read_bytes().endswith(b"\n")  # whole rows only: the torn batch is cut
    assert main(score_args(job[0], out, clip)) == 0
    assert_complete(job, out)


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs mounted in ``tmp_path`` (needs root and CAP_SYS_ADMIN; skipped otherwise)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def remount(mount: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(mount)], check=True)


def test_a_full_disk_and_then_free_space(job, tmpfs, tmp_path, capsys):
    manifest_rows = [{"id": f"m{i}", "caption": f"caption {i} of a red car", "image": json.loads(job[2][0])["image"]}
                     for i in range(60)]
    manifest = tmp_path / "many.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in manifest_rows))
    out = tmpfs / "out.jsonl"
    assert main(score_args(manifest, out, job[3])) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and "No space left on device" in errors[0], errors
    safe = len(rows_of(out)) if out.exists() else 0
    assert 0 < safe < 60 and f"{safe} rows are safe in {out}" in errors[0]
    remount(tmpfs, "size=4m")
    assert main(score_args(manifest, out, job[3])) == 0
    ids = [r["id"] for r in rows_of(out)]
    assert sorted(ids) == sorted(r["id"] for r in manifest_rows)  # every row exactly once


def test_a_read_only_file_system_and_then_writable_again(job, tmpfs, capsys):
    remount(tmpfs, "size=4m")
    _, _, lines, clip = job
    out = partial(job, tmpfs / "out.jsonl", lines[:2])
    remount(tmpfs, "ro")
    assert main(score_args(job[0], out, clip)) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and "Read-only file system" in errors[0] and f"2 rows are safe in {out}" in errors[0], errors
    remount(tmpfs, "rw")
    assert main(score_args(job[0], out, clip)) == 0
    assert_complete(job, out)


def test_an_immutable_output_file_and_then_writable_again(job, tmp_path, capsys):
    _, _, lines, clip = job
    out = partial(job, tmp_path / "out.jsonl", lines[:3])
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i does not work here (needs CAP_LINUX_IMMUTABLE and a file system that has it)")
    try:
        assert main(score_args(job[0], out, clip)) == 2
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    errors = error_lines(capsys)
    assert len(errors) == 1 and "Operation not permitted" in errors[0] and f"3 rows are safe in {out}" in errors[0], errors
    assert out.read_bytes() == b"".join(lines[:3])
    assert main(score_args(job[0], out, clip)) == 0
    assert_complete(job, out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions (the injected EACCES case covers it)")
def test_a_directory_without_write_permission_and_then_writable_again(job, tmp_path, capsys):
    _, _, lines, clip = job
    folder = tmp_path / "locked"
    folder.mkdir()
    out = partial(job, folder / "out.jsonl", lines[:2])
    (folder / "out.jsonl.lock").touch()
    out.chmod(0o444)
    folder.chmod(0o555)
    try:
        assert main(score_args(job[0], out, clip)) == 2
    finally:
        folder.chmod(0o755)
        out.chmod(0o644)
    errors = error_lines(capsys)
    assert len(errors) == 1 and "Permission denied" in errors[0] and f"2 rows are safe in {out}" in errors[0], errors
    assert main(score_args(job[0], out, clip)) == 0
    assert_complete(job, out)


# ------------------------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_is_one_line_with_the_rows_safe_and_the_same_command_resumes(job, tmp_path):
    image = json.loads(job[2][0])["image"]
    # the kill point is exact (below), so a few rows past it suffice for the resume to have work left
    rows = [{"id": f"c{i}", "caption": f"caption {i} of a red car", "image": image} for i in range(12)]
    manifest = tmp_path / "long.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    args = score_args(manifest, out, job[3])
    args[args.index("--batch-size") + 1] = "1"
    # the job sends itself SIGINT (a Ctrl-C) right after its third row is on disk: an exact point, whatever
    # the machine's load (a signal sent from here after polling the file could arrive after the last row)
    cmd = [sys.executable, "-m", "capreward.cli.main", *args]
    # (SIGINT back to its default in the child: a run started in the background inherits it ignored, and
    # Python then installs no KeyboardInterrupt handler)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, **{KILL_AFTER_BATCH_ENV: "3+int"}),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    stderr = proc.stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    safe = len(rows_of(out))
    assert safe == 3 and out.read_bytes().endswith(b"\n")
    assert lines[0] == f"capreward score: interrupted; {safe} rows are safe in {out}; run the same command to resume"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1])["skipped"] == safe
    assert sorted(r["id"] for r in rows_of(out)) == sorted(r["id"] for r in rows)


def test_explain_refuses_a_corrupt_middle_line_too(job, tmp_path, capsys):
    """explain shares the results file: a bad middle line stops it before any judge is loaded."""
    _, _, lines, _ = job
    out = tmp_path / "why.jsonl"
    out.write_bytes(lines[0] + BAD_LINES["invalid JSON"] + lines[1])
    before = out.read_bytes()
    args = ["explain", str(job[0]), "--out", str(out), "--judge-model", str(tmp_path / "no-judge"), "--device", "cpu",
            "--accept-unrecorded-settings", "--no-progress"]
    assert main(args) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and f"{out}:2:" in errors[0] and "--quarantine-bad-lines" in errors[0], errors
    assert out.read_bytes() == before
