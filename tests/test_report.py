"""`capreward report`: the HTML page renders in a real headless Chromium with frames, tokens
coloured by alignment, flagged tokens and scores; its summary equals an independent computation, and
sorting and filtering work in the browser."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from capreward.jobs.results_file import read_results

from conftest import random_video, write_mp4
import cli_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli(*args):
    return cli_process.run(args, timeout=300)


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
    results[1]["hallucination/flagged"] = [2]
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


def test_report_finds_the_media_as_score_did_from_another_working_directory(tmp_path, tiny_clip_path):
    """A manifest named by a relative path, with relative media paths (resolved against the manifest's
    folder by score): the report, run from elsewhere, shows every visual."""
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    write_mp4(data / "clip.mp4", random_video(5, frames=6))
    (data / "m.jsonl").write_text(json.dumps({"id": "a", "caption": "a man is cooking", "video": "clip.mp4"}) + "\n")
    proc = cli_process.run(["score", "data/m.jsonl", "--out", "scores.jsonl", "--metrics", "clip-s", "--clip-model",
                            tiny_clip_path, "--frames", "2", "--no-progress"], timeout=300, cwd=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = cli_process.run(["report", "../work/scores.jsonl", "--out", "r.html", "--frames", "2", "--no-progress"],
                           timeout=300, cwd=elsewhere)
    assert proc.returncode == 0 and "not found" not in proc.stderr, proc.stderr
    text = (elsewhere / "r.html").read_text()
    assert "cannot show the visual" not in text and text.count('<img class="frame') == 2


def test_report_warns_about_visuals_it_cannot_find(scored, tmp_path):
    _, scores = scored
    proc = cli("report", scores, "--out", tmp_path / "r.html", "--frames", "4", "--no-progress")
    assert proc.returncode == 0
    assert "warning: 1 of 3 visuals not found" in proc.stderr and "gone.mp4" in proc.stderr


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


# --- summary, histograms, references, folded sub-scores, sorting and filtering -------------------------


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    """Scored rows as `capreward score` writes them (emscore with sub-scores, clip_s, fleur with some
    errors, references, flagged tokens), on small PNGs: the report is a renderer, so its input can be
    written directly."""
    from PIL import Image

    d = tmp_path_factory.mktemp("report-handmade")
    rng = random.Random(7)
    rows = []
    for k in range(12):
        image = d / f"img{k}.png"
        Image.new("RGB", (48, 32), (rng.randrange(256), rng.randrange(256), rng.randrange(256))).save(image)
        row = {"id": f"r{k:02d}", "caption": f"caption number {k}", "image": str(image),
               "references": [f"reference one of {k}", f"reference two of {k}"], "errors": {}}
        row["emscore"] = round(rng.uniform(0.1, 0.4), 6)
        sep = "/" if k % 3 else "."  # every third row as files written before sub-scores were named with "/"
        for part in ("video", "reference"):
            for comp in ("fine_p", "fine_r", "fine_f", "coarse", "full_p", "full_r", "full_f"):
                row[f"emscore{sep}{part}{sep}{comp}"] = round(rng.uniform(0, 1), 6)
        row["clip_s"] = round(rng.uniform(0.2, 1.0), 6) if k != 5 else 0.55  # one tie with k=6 below
        if k == 6:
            row["clip_s"] = 0.55
        if k % 4 == 3:
            row["fleur"] = None
            row["errors"]["fleur"] = "answer 'no idea' is not a number in [0, 1]"
        else:
            row["fleur"] = round(rng.uniform(0, 1), 6)
            row[f"fleur{sep}raw"] = "0.7"
        if k in (2, 9):
            row[f"hallucination{sep}flagged"] = [1]
        rows.append(row)
    path = d / "scores.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = d / "report.html"
    proc = cli("report", path, "--out", page, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return rows, page


def summary_cells(text: str) -> dict[str, dict[str, float | str]]:
    table = re.search(r'<table class="summary">(.*?)</table>', text, re.S).group(1)
    out = {}
    for metric, cells in re.findall(r'<tr data-metric="([^"]+)">(.*?)</tr>', table, re.S):
        out[metric] = {stat: (float(v) if v else None)
                       for stat, v in re.findall(r'<td data-stat="(\w+)"(?: data-value="([^"]*)")?>', cells)}
    return out


def test_summary_numbers_equal_an_independent_computation(handmade):
    rows, page = handmade
    got = summary_cells(page.read_text())
    assert list(got) == ["emscore", "clip_s", "fleur"]  # headline metrics; sub-scores and .raw are not
    for metric in got:
        values = np.array([r[metric] for r in rows if r.get(metric) is not None], dtype=np.float64)
        want = {"n": len(values), "mean": values.mean(), "median": np.median(values), "std": values.std(ddof=0),
                "min": values.min(), "max": values.max(),
                "errors": sum(1 for r in rows if metric in r["errors"])}
        for stat, value in want.items():
            assert got[metric][stat] == pytest.approx(value, rel=1e-12, abs=1e-12), (metric, stat)
    assert got["fleur"]["errors"] == 3 and got["emscore"]["errors"] == 0


def test_histograms_count_every_score_in_ten_bins(handmade):
    rows, page = handmade
    text = page.read_text()
    for metric in ("emscore", "clip_s", "fleur"):
        figure = re.search(rf'<figure class="histogram" data-metric="{metric}">(.*?)</figure>', text, re.S).group(1)
        counts = [int(c) for c in re.findall(r'data-count="(\d+)"', figure)]
        values = [r[metric] for r in rows if r.get(metric) is not None]
        assert counts == np.histogram(values, bins=10, range=(min(values), max(values)))[0].tolist()
    assert re.search(r'(src|href)="(?!data:)', text) is None and "<link" not in text  # no external assets


def test_samples_show_references_and_fold_sub_scores_under_the_headline(handmade):
    rows, page = handmade
    text = page.read_text()
    sections = re.findall(r'<div class="sample".*?(?=<div class="sample"|</div><script>)', text, re.S)
    assert len(sections) == len(rows)
    for row, section in zip(rows, sections):
        assert f'data-id="{row["id"]}"' in section
        assert section.count("<li>") == 2 and f"<li>reference two of {row['id'][1:].lstrip('0') or '0'}</li>" in section
        folded = re.search(r'<details class="headline" data-metric="emscore"><summary>(.*?)</summary>(.*?)</details>',
                           section, re.S)
        assert folded and f"{row['emscore']:.4f}" in folded.group(1) and "14 sub-scores" in folded.group(1)
        sep = "." if "emscore.video.fine_p" in row else "/"
        assert folded.group(2).count("<tr>") == 14 and f"video{sep}fine_p" in folded.group(2)


def chromium_dom(page: Path, fragment: str, profile: Path) -> str:
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=2000", "--dump-dom",
                           page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    return proc.stdout


def dom_samples(dom: str) -> list[tuple[str, bool]]:
    """(id, hidden) of the sample sections in document order."""
    tags = re.findall(r'<div class="sample"[^>]*>', dom)
    return [(re.search(r'data-id="([^"]+)"', t).group(1), " hidden" in t) for t in tags]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/bootstrap.sh installs it)")
def test_sorting_and_filtering_in_headless_chromium(handmade, tmp_path):
    rows, page = handmade
    order = {r["id"]: k for k, r in enumerate(rows)}
    dom = chromium_dom(page, "#sort=clip_s&dir=asc&filter=all", tmp_path / "p1")
    got = dom_samples(dom)
    want = sorted(rows, key=lambda r: (r["clip_s"], order[r["id"]]))
    assert [i for i, _ in got] == [r["id"] for r in want]  # ascending, ties in manifest order
    assert not any(hidden for _, hidden in got)

    dom = chromium_dom(page, "#sort=fleur&dir=desc&filter=errors", tmp_path / "p2")
    got = dom_samples(dom)
    scored = sorted((r for r in rows if r["fleur"] is not None), key=lambda r: (-r["fleur"], order[r["id"]]))
    unscored = [r for r in rows if r["fleur"] is None]
    assert [i for i, _ in got] == [r["id"] for r in scored + unscored]  # rows without the score last
    assert {i for i, hidden in got if not hidden} == {r["id"] for r in rows if r["errors"]}
    assert re.search(r'id="shown">3<', dom)

    dom = chromium_dom(page, "#sort=order&dir=asc&filter=flagged", tmp_path / "p3")
    got = dom_samples(dom)
    assert [i for i, _ in got] == [r["id"] for r in rows]
    assert {i for i, hidden in got if not hidden} == {"r02", "r09"}

    # opened as it is (no fragment, the default "highest first"), or with dir=desc: manifest order
    for fragment, profile in (("", "p4"), ("#sort=order&dir=desc&filter=all", "p5")):
        got = dom_samples(chromium_dom(page, fragment, tmp_path / profile))
        assert [i for i, _ in got] == [r["id"] for r in rows], fragment


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/bootstrap.sh installs it)")
def test_summary_renders_in_headless_chromium(handmade, tmp_path):
    from PIL import Image

    _, page = handmade
    shot = tmp_path / "summary.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    with Image.open(shot) as im:
        top = np.asarray(im.convert("RGB"))[:450]  # the title, the summary table and the histograms
    bar = np.all(np.abs(top.astype(int) - (0x3B, 0x6E, 0xA5)) <= 3, axis=-1)
    assert bar.sum() > 500  # histogram bars drawn
    dark = np.all(top < 100, axis=-1)
    assert dark[:, :600].sum() > 2000  # text of the table
    assert len(np.unique(top.reshape(-1, 3), axis=0)) > 20


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "caption": 5, "clip_s": 0.5}', ":1: 'caption' is a int, not text"),
    ('{"id": "a", "caption": "x", "clip_s": null, "errors": "boom"}', ":1: 'errors' is a str, not an object"),
    ('[1, 2, 3]', ":1: a JSON list, not a result row"),
    ('{"id": "a", "caption": "x", "image": "i.png"}', "has no scores"),  # a manifest, not its results
    ('', "has no rows"),
])
def test_report_refuses_rows_it_cannot_show_in_one_line(tmp_path, line, message):
    """Round 3: these rows gave a traceback (or, for a manifest, an empty page and exit 0)."""
    scores = tmp_path / "scores.jsonl"
    scores.write_text(line + "\n" if line else "")
    result = cli("report", scores, "--out", tmp_path / "r.html", "--no-progress")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in lines[0] and lines[0].startswith("capreward report: error:")
    assert not (tmp_path / "r.html").exists()
