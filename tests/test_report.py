"""`capreward report`: the HTML page renders in a real headless Chromium with frames, tokens
coloured by alignment, flagged tokens and scores."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capreward.jobs.results_file import read_results

from conftest import random_video, write_mp4

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "capreward.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tiny_clip_path):
    d = tmp_path_factory.mktemp("report")
    videos = [write_mp4(d / f"v{i}.mp4", random_video(i, frames=12)) for i in range(2)]
    manifest = d / "m.jsonl"
    rows = [{"id": "a", "caption": "a man is cooking", "video": str(videos[0])},
            {"id": "b", "caption": "a dog runs in a park", "video": str(videos[1])},
            {"id": "c", "caption": "a missing clip", "video": str(d / "gone.mp4")}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = d / "scores.jsonl"
    proc = cli("score", manifest, "--out", out, "--metrics", "emscore", "--clip-model", tiny_clip_path,
               "--alignment", "--frames", "4", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    # mark a token as flagged, as a hallucination penalty would
    results = read_results(out)
    results[1]["hallucination.flagged"] = [2]
    out.write_text("".join(json.dumps(r) + "\n" for r in results))
    return d, out


def test_report_structure(scored):
    d, scores = scored
    page = d / "report.html"
    proc = cli("report", scores, "--out", page, "--frames", "4")
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert text.count('class="sample"') == 3
    assert text.count('<img class="frame') == 8  # 4 frames for each of the two readable clips
    assert text.count('class="token flagged"') == 1
    assert "cannot show the visual" in text and "does not exist" in text
    assert ">cooking<sup>" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/bootstrap.sh installs it)")
def test_report_renders_in_headless_chromium(scored, tmp_path):
    d, scores = scored
    page = d / "report_browser.html"
    assert cli("report", scores, "--out", page, "--frames", "4").returncode == 0
    profile = tmp_path / "profile"
    shot = tmp_path / "shot.png"
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1200,1600"]
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1200, 1600)
        assert len(set(im.convert("RGB").resize((60, 80)).get_flattened_data())) > 20  # not a blank page
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count('class="sample"') == 3
    assert dom.count('class="token flagged"') == 1
    assert dom.count("<img") == 8
