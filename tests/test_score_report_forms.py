"""Issue 43 item 7, what a new user met: ``capreward report`` reads every file ``capreward score`` writes.

Every manifest form ``score`` accepts (an image by absolute or relative path, a video, a row with several
images, references as a list or a string, no id, the dataset's own keys, a visual that is missing), with and
without ``--alignment``, is scored and then reported: the page shows every row (each image of a row with
several, and its per-image values) and says which harmonic mean formed EMScore's F. The report exited 2 on
any file with a several-image row ("not written by capreward score"). A settings record given in place of
the results is named as such; ``--out`` never follows a planted link; bad numbers are argument errors.
"""

from __future__ import annotations

import json
import re

import pytest

from capreward.cli.main import build_parser, main
from capreward.jobs.results_file import read_results

from conftest import random_video, write_mp4


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("forms")
    (d / "media").mkdir()
    for k in range(3):
        Image.fromarray(random_video(10 + k, frames=1)[0]).save(d / "media" / f"im{k}.png")
    write_mp4(d / "media" / "clip.mp4", random_video(20, frames=8))
    rows = [
        {"id": "abs", "caption": "a red car on a road", "image": str(d / "media" / "im0.png")},
        {"id": "rel", "caption": "a blue sky", "image": "media/im1.png", "references": ["the sky", "a blue sky"]},
        {"id": "video", "caption": "a person walks", "video": "media/clip.mp4", "references": "someone walking"},
        {"id": "several", "caption": "two photos of a car", "image": ["media/im0.png", str(d / "media" / "im2.png")]},
        {"caption": "no id here", "image": "media/im2.png", "source": {"url": "http://x", "split": ["a", 1]}},
        {"id": "gone", "caption": "a missing image", "image": "media/none.png"},
        {"id": "several-gone", "caption": "one of two is missing", "image": ["media/im1.png", "media/none.png"]},
    ]
    manifest = d / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d, manifest, rows


def score_args(manifest, out, clip, *extra):
    return ["score", str(manifest), "--out", str(out), "--metrics", "emscore,clip_s", "--clip-model", str(clip),
            "--frames", "4", "--no-progress", *map(str, extra)]


def samples(page_text: str) -> dict[str, str]:
    """Each sample's HTML by its id."""
    parts = re.split(r'(?=<div class="sample" )', page_text.split('<div id="samples">', 1)[1])
    return {re.search(r'data-id="([^"]*)"', p).group(1): p for p in parts if p.startswith('<div class="sample"')}


@pytest.mark.parametrize("alignment", [False, True])
def test_report_reads_every_form_score_writes(forms, tiny_clip_path, tmp_path, alignment, capsys):
    d, manifest, rows = forms
    out = tmp_path / "scores.jsonl"
    assert main(score_args(manifest, out, tiny_clip_path, *(["--alignment"] if alignment else []))) == 0
    written = read_results(out)
    assert len(written) == len(rows)
    page = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(page), "--frames", "4", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "2 of 9 visuals not found" in err  # none.png, twice
    text = page.read_text()
    shown = samples(text)
    assert set(shown) == {r["id"] for r in written}
    assert shown["several"].count('<img class="frame') == 2 and shown["video"].count('<img class="frame') == 4
    assert shown["several-gone"].count('<img class="frame') == 1 and "cannot show the visual" in shown["several-gone"]
    several = next(r for r in written if r["id"] == "several")
    per_image = [e["emscore"] for e in several["emscore/per_image"]]
    for k, value in enumerate(per_image):  # each image's value under the headline
        assert re.search(rf'data-image="{k}"><td>image {k}</td><td>{value:.4f}</td>', shown["several"])
    assert f"{several['emscore']:.4f}" in shown["several"]
    assert ("token" in shown["abs"]) == alignment  # the alignment's coloured tokens, when scored with it
    # the settings the rows were scored with, the harmonic mean among them
    settings = re.search(r'<section id="settings">(.*?)</section>', text, re.S).group(1)
    assert re.search(r"--harmonic-mean</td><td>sign-safe: sign-safe harmonic mean", settings)
    assert "--clip-model" in settings and "--frames</td><td>4" in settings


def test_a_settings_record_given_to_report_is_named_with_the_results_to_pass(forms, tiny_clip_path, tmp_path, capsys):
    d, manifest, _ = forms
    out = tmp_path / "scores.jsonl"
    assert main(score_args(manifest, out, tiny_clip_path)) == 0
    for companion in (out.with_name("scores.jsonl.settings.json"), out.with_name("scores.jsonl.idf.json")):
        assert companion.exists()
        capsys.readouterr()
        assert main(["report", str(companion), "--out", str(tmp_path / "r.html"), "--no-progress"]) == 2
        [line] = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert f"{companion} is the" in line and f"of {out}, not a results file; pass {out}" in line, line
    renamed = tmp_path / "settings-copy.json"
    renamed.write_bytes(out.with_name("scores.jsonl.settings.json").read_bytes())
    assert main(["report", str(renamed), "--out", str(tmp_path / "r.html"), "--no-progress"]) == 2
    assert "is the settings record of a results file" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_out_never_follows_a_planted_link(forms, tiny_clip_path, tmp_path, capsys):
    d, manifest, _ = forms
    out = tmp_path / "scores.jsonl"
    out.write_text(json.dumps({"id": "a", "caption": "x", "clip_s": 0.5, "errors": None}) + "\n")
    foreign = tmp_path / "someone_elses.html"
    foreign.write_text("precious")
    link = tmp_path / "r.html"
    link.symlink_to(foreign)
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(link), "--no-progress"]) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert f"--out {link} is a symbolic link" in line
    assert foreign.read_text() == "precious" and link.is_symlink()
    # no settings record beside a hand-written file: the page says so
    assert main(["report", str(out), "--out", str(tmp_path / "ok.html"), "--no-progress"]) == 0
    assert "how the rows were scored is not known" in (tmp_path / "ok.html").read_text()


@pytest.mark.parametrize("argv, flag, value", [
    (["score", "m.jsonl", "--out", "o.jsonl", "--frames", "-1"], "--frames", "-1"),
    (["score", "m.jsonl", "--out", "o.jsonl", "--batch-size", "0"], "--batch-size", "0"),
    (["score", "m.jsonl", "--out", "o.jsonl", "--num-actors", "two"], "--num-actors", "two"),
    (["score", "m.jsonl", "--out", "o.jsonl", "--judge-top-logprobs-cap", "0"], "--judge-top-logprobs-cap", "0"),
    (["score", "m.jsonl", "--out", "o.jsonl", "--hallucination-threshold", "nan"], "--hallucination-threshold", "nan"),
    (["report", "s.jsonl", "--out", "r.html", "--frames", "-1"], "--frames", "-1"),
    (["serve", "--frames", "-2"], "--frames", "-2"),
    (["serve", "--port", "70000"], "--port", "70000"),
    (["serve", "--queue-timeout", "-1"], "--queue-timeout", "-1"),
])
def test_bad_values_are_argument_errors(argv, flag, value, capsys):
    """``--frames -1`` exited 0 and wrote a Python ValueError on every row."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"capreward {argv[0]}: error: argument {flag}: invalid value '{value}'"), last
