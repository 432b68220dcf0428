"""`capreward score`: manifests in, every row exactly once out, resumable after a kill, per-row
errors, CSV, and the Ray engine agreeing with the local one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capreward import EMScore
from capreward.jobs.results_file import read_results, recover

from conftest import random_video, write_mp4

CAPTIONS = ["a man is cooking", "a dog runs in a park", "two people dance", "a red car at night", "someone is talking"]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    videos = [write_mp4(d / f"v{i}.mp4", random_video(i, frames=12)) for i in range(3)]
    images = []
    for i in range(2):
        p = d / f"im{i}.png"
        Image.fromarray(random_video(10 + i, frames=1)[0]).save(p)
        images.append(p)
    return videos, images


def make_manifest(path: Path, media, n_rows: int, bad_row: int | None = None) -> Path:
    videos, images = media
    with path.open("w") as f:
        for i in range(n_rows):
            row = {"id": f"r{i}", "caption": CAPTIONS[i % len(CAPTIONS)], "references": ["a person", CAPTIONS[(i + 1) % 5]]}
            if i % 4 == 3:
                row["image"] = str(images[i % 2])
            else:
                row["video"] = str(videos[i % 3])
            if i == bad_row:
                row["video"] = str(path.parent / "missing.mp4")
                row.pop("image", None)
            f.write(json.dumps(row) + "\n")
    return path


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "capreward.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=600, **kwargs)


def by_id(rows):
    return {r["id"]: r for r in rows}


def test_scores_every_row_once_with_errors_on_the_bad_row_only(tmp_path, media, tiny_clip_path):
    manifest = make_manifest(tmp_path / "m.jsonl", media, 9, bad_row=4)
    out = tmp_path / "scores.jsonl"
    proc = cli("score", manifest, "--out", out, "--metrics", "emscore,clip-s", "--clip-model", tiny_clip_path,
               "--batch-size", "4", "--csv", tmp_path / "scores.csv", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rows = read_results(out)
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(9)]
    bad = by_id(rows)["r4"]
    assert "does not exist" in bad["errors"]["emscore"] and "does not exist" in bad["errors"]["clip_s"]
    assert "emscore" not in bad
    good = [r for r in rows if r["id"] != "r4"]
    assert all(r["errors"] is None and "emscore.video.fine_p" in r or "emscore.combined.coarse" in r for r in good)
    # values equal a direct scorer call (independent of how the job batched the rows)
    em = EMScore(model=tiny_clip_path, idf=[ref for r in rows for ref in r["references"]])
    r0 = by_id(rows)["r0"]
    direct = em.score([r0["caption"]], videos=[r0["video"]], references=[r0["references"]])
    assert r0["emscore"] == pytest.approx(direct.score.item(), abs=1e-6)
    assert r0["emscore.video.fine_p"] == pytest.approx(direct.video.fine_p.item(), abs=1e-6)
    csv_lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert len(csv_lines) == 10 and csv_lines[0].startswith("id,")


def test_killed_run_resumes_without_duplicates_or_gaps(tmp_path, media, tiny_clip_path):
    manifest = make_manifest(tmp_path / "m.jsonl", media, 60)
    args = ["score", manifest, "--metrics", "emscore", "--clip-model", tiny_clip_path, "--no-progress"]
    reference = tmp_path / "uninterrupted.jsonl"
    assert cli(*args, "--batch-size", "16", "--out", reference).returncode == 0
    args += ["--batch-size", "1"]
    out = tmp_path / "interrupted.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "capreward.cli.main", *map(str, args), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and (not out.exists() or out.read_text().count("\n") < 10):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = out.read_text().count("\n")
    assert 10 <= partial < 60, "the kill must land mid-run"
    with out.open("a") as f:  # simulate a torn write at the moment of the kill
        f.write('{"id": "r9999", "capt')
    assert cli(*args, "--out", out).returncode == 0
    resumed, full = read_results(out), read_results(reference)
    assert sorted(r["id"] for r in resumed) == sorted(r["id"] for r in full)
    assert len(resumed) == 60
    for rid, row in by_id(full).items():
        assert by_id(resumed)[rid]["emscore"] == pytest.approx(row["emscore"], abs=1e-6)


def test_recover_cuts_a_torn_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "x"')
    assert recover(p) == {"a", "b"}
    assert p.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_bad_manifest_rows_are_named(tmp_path, tiny_clip_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"caption": "a dog", "image": "x.png"}\n{"caption": 3, "image": "y.png"}\n')
    proc = cli("score", m, "--out", tmp_path / "o.jsonl", "--clip-model", tiny_clip_path)
    assert proc.returncode != 0 and "m.jsonl:2" in proc.stderr and "caption" in proc.stderr


@pytest.mark.slow
def test_ray_engine_matches_local(tmp_path, media, tiny_clip_path):
    pytest.importorskip("ray")
    manifest = make_manifest(tmp_path / "m.jsonl", media, 10, bad_row=6)
    common = ["--metrics", "emscore,clip-s", "--clip-model", tiny_clip_path, "--batch-size", "3", "--no-progress"]
    assert cli("score", manifest, "--out", tmp_path / "local.jsonl", *common).returncode == 0
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    proc = cli("score", manifest, "--out", tmp_path / "ray.jsonl", "--engine", "ray", "--num-actors", "2", *common, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local, remote = by_id(read_results(tmp_path / "local.jsonl")), by_id(read_results(tmp_path / "ray.jsonl"))
    assert local.keys() == remote.keys()
    for rid, row in local.items():
        assert row["errors"] == remote[rid]["errors"]
        for k, v in row.items():
            if isinstance(v, float):
                assert remote[rid][k] == pytest.approx(v, abs=1e-6), (rid, k)
