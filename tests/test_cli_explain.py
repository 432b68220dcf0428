"""``capreward explain`` on the trained tiny judges: real subprocess runs, compared with the scorers
called directly, per-row errors, and resuming after an interrupted run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_llava import colour_images, fleur, one_torch_thread, tiny_judge, tiny_judge_path  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
MAX_NEW = 12


def explain_cli(manifest: Path, out: Path, judge: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "capreward.cli.main", "explain", str(manifest), "--out", str(out),
         "--judge-model", str(judge), "--device", "cpu", "--dtype", "float32", "--batch-size", "2",
         "--max-new-tokens", str(MAX_NEW), "--no-progress", *extra],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


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
        assert row["fleur.raw"] == expected.raw[k]
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
    out = tmp_path / "partial.jsonl"
    out.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed while writing row 3
    proc = explain_cli(path, out, tiny_judge_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1])["skipped"] == 2
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
    assert got[0]["fleur.raw"] == expected.raw[0]
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
    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "explain", str(manifest), "--out", str(out),
                           "--metric", "gveval", "--judge-model", str(judge_dir), "--device", "cpu", "--dtype", "float32",
                           "--max-new-tokens", "120", "--no-progress"], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    got = read_rows(out)
    expected = GVEval(LocalChatJudge(tiny_vlm_judge(), batch_size=8), max_tokens=120).score(
        [r["caption"] for r in rows], images=[r["image"] for r in rows])
    for k, row in enumerate(got):
        assert row["metric"] == "gveval" and row["gveval.raw"] == expected.raw[k]
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
