"""`capreward score`: manifests in, every row exactly once out, resumable after a kill, per-row
errors, CSV, and the Ray engine agreeing with the local one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capreward import EMScore
from capreward.jobs.results_file import read_results, recover

from conftest import random_video, write_mp4
import cli_process

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
    return cli_process.run(args, timeout=600, **kwargs)


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
    assert all(r["errors"] is None and "emscore/video/fine_p" in r or "emscore/combined/coarse" in r for r in good)
    # values equal a direct scorer call (independent of how the job batched the rows)
    em = EMScore(model=tiny_clip_path, idf=[ref for r in rows for ref in r["references"]])
    r0 = by_id(rows)["r0"]
    direct = em.score([r0["caption"]], videos=[r0["video"]], references=[r0["references"]],
                      harmonic_mean="sign-safe")  # how score forms F by default (--harmonic-mean)
    assert r0["emscore"] == pytest.approx(direct.score.item(), abs=1e-6)
    assert r0["emscore/video/fine_p"] == pytest.approx(direct.video.fine_p.item(), abs=1e-6)
    csv_lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert len(csv_lines) == 10 and csv_lines[0].startswith("id,")


def test_killed_run_resumes_without_duplicates_or_gaps(tmp_path, media, tiny_clip_path):
    manifest = make_manifest(tmp_path / "m.jsonl", media, 60)
    args = ["score", manifest, "--metrics", "emscore", "--clip-model", tiny_clip_path, "--no-progress"]
    reference = tmp_path / "uninterrupted.jsonl"
    assert cli(*args, "--batch-size", "16", "--out", reference).returncode == 0
    args += ["--batch-size", "1"]
    out = tmp_path / "interrupted.jsonl"
    # the results writer SIGKILLs the process mid-write of its 11th row (a torn line), at an exact point
    env = dict(os.environ, CAPREWARD_JOBS_KILL_AFTER_BATCH="10+torn")
    assert cli(*args, "--out", out, env=env).returncode == -signal.SIGKILL
    assert out.read_text().count("\n") == 10 and not out.read_text().endswith("\n")
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


# ------------------------------------------------------------------------------ hallucination
HALLUCINATION_THRESHOLD = 0.5  # the colour CLIP puts correct colour words above 0.9 and foils below 0.4


@pytest.fixture(scope="module")
def colour_clip():
    from capreward.testing.trained_clip import trained_clip_path

    return trained_clip_path()  # trained once (about a minute), then cached on disk


@pytest.fixture(scope="module")
def hallucination_job(tmp_path_factory, colour_clip):
    """True captions ("a red image.") and foils (the colour swapped) on colour images and a colour video,
    scored by `capreward score` with emscore (for `alignment`) and hallucination on the colour CLIP."""
    import random

    from capreward.testing.trained_clip import COLOURS, colour_image

    d = tmp_path_factory.mktemp("hallucination")
    colours = list(COLOURS)
    rows = []
    for k, colour in enumerate(colours[:3] + ["purple"]):
        foil = colours[(colours.index(colour) + 1) % len(colours)]
        if colour == "purple":  # a video row
            frames = np.stack([np.asarray(colour_image(colour, random.Random(f"v{t}"), size=(40, 32))) for t in range(6)])
            visual = {"video": str(write_mp4(d / f"{colour}.mp4", frames))}
        else:
            path = d / f"{colour}.png"
            colour_image(colour, random.Random(f"cli-{colour}")).save(path)
            visual = {"image": str(path)}
        rows.append({"id": f"{colour}-true", "caption": f"a {colour} image.", **visual})
        rows.append({"id": f"{colour}-foil", "caption": f"a {foil} image.", **visual, "foil": foil})
    manifest = d / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = d / "scores.jsonl"
    proc = cli("score", manifest, "--out", out, "--metrics", "emscore,hallucination", "--clip-model", colour_clip,
               "--alignment", "--frames", "4", "--idf", "none", "--hallucination-threshold", HALLUCINATION_THRESHOLD,
               "--batch-size", "3", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return d, out, rows, by_id(read_results(out))


def test_hallucination_equals_the_penalty_called_directly(hallucination_job, colour_clip):
    from capreward.rewards import HallucinationPenalty

    _, _, rows, scored = hallucination_job
    direct = HallucinationPenalty(model=str(colour_clip), frames=4, threshold=HALLUCINATION_THRESHOLD)
    for kind in ("image", "video"):
        mine = [r for r in rows if kind in r]
        reports = direct.reports([r["caption"] for r in mine], [r[kind] for r in mine], kind=kind)
        for r, report in zip(mine, reports):
            got = scored[r["id"]]
            assert got["errors"] is None
            assert got["hallucination"] == pytest.approx(report.penalty, abs=1e-6)
            assert got["hallucination/flagged"] == report.flagged_index
            assert -1.0 <= got["hallucination"] <= 0.0


def test_hallucination_flags_index_the_alignment_tokens(hallucination_job):
    _, _, rows, scored = hallucination_job
    for r in rows:
        got = scored[r["id"]]
        tokens, sims = got["alignment"]["tokens"], got["alignment"]["similarity"]
        flagged = got["hallucination/flagged"]
        assert tokens[0] == "<sos>" and tokens[-1] == "<eos>"
        # the indices are positions in alignment.tokens; the colour word (2) is the only content word
        # ("image" is generic), flagged when its similarity, in the caption or encoded alone, is below the threshold
        assert set(flagged) <= {2} and len(sims) == len(tokens)
        if "foil" in r:
            assert tokens[2] == r["foil"] and 2 in flagged
            assert got["hallucination"] < 0
        else:
            assert flagged == [] and got["hallucination"] == 0.0


def test_report_outlines_the_flagged_tokens(hallucination_job):
    import re

    d, out, rows, scored = hallucination_job
    page = d / "report.html"
    proc = cli("report", out, "--out", page, "--frames", "4")
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    for r in rows:
        section = text.split(f'id="sample-{r["id"]}"', 1)[1].split('<div class="sample"', 1)[0]
        outlined = re.findall(r'<span class="token flagged"[^>]*data-index="(\d+)"[^>]*>([^<]*)<sup>', section)
        flagged = scored[r["id"]]["hallucination/flagged"]
        assert [int(i) for i, _ in outlined] == flagged
        assert [t for _, t in outlined] == [scored[r["id"]]["alignment"]["tokens"][j] for j in flagged]
        if "foil" in r:
            assert (str(2), r["foil"]) in outlined


def test_hallucination_alone_writes_the_same_alignment_as_emscore(tmp_path, media, tiny_clip_path):
    from capreward.jobs.manifest import read_manifest
    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.rewards import DEFAULT_THRESHOLD, HallucinationPenalty

    rows = read_manifest(make_manifest(tmp_path / "m.jsonl", media, 5))
    common = dict(clip_model=str(tiny_clip_path), alignment=True, frames=4)
    alone = ManifestScorer(ScoreOptions(metrics=["hallucination"], **common)).score_rows(rows)
    both = ManifestScorer(ScoreOptions(metrics=["emscore", "hallucination"], **common)).score_rows(rows)
    direct = HallucinationPenalty(model=str(tiny_clip_path), frames=4)
    assert direct.threshold == DEFAULT_THRESHOLD  # the default when no threshold is given
    for row, a, b in zip(rows, alone, both):
        assert a["alignment"]["tokens"] == b["alignment"]["tokens"]
        np.testing.assert_allclose(a["alignment"]["similarity"], b["alignment"]["similarity"], atol=1e-6)
        report = direct.reports([row.caption], [row.path], kind=row.kind)[0]
        assert a["hallucination"] == pytest.approx(report.penalty) and a["hallucination/flagged"] == report.flagged_index
        assert "emscore" not in a


# ------------------------------------------------------------------------------ VisCE² and G-VEval
JUDGE_ROWS = [  # (id, kind, colour, caption): every answer format of the tiny judge
    ("green", "image", "green", "a green ball"),
    ("blue", "image", "blue", "a blue kite"),
    ("yellow", "image", "yellow", "a photo of a kite"),  # VisCE² "no idea" (0), G-VEval no score (null)
    ("many", "image", "red", "many red cars"),  # VisCE² "250" (out of range: 0)
    ("vid-red", "video", "red", "a red car"),
    ("vid-blue", "video", "blue", "a blue kite"),
]


@pytest.fixture(scope="module")
def vlm_dir():
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge_dir

    return tiny_vlm_judge_dir()  # trained once (a few minutes), then cached on disk


@pytest.fixture(scope="module")
def chat(vlm_dir):
    """The tiny judge as the local chat backend, for calling the scorers directly."""
    import torch

    from capreward.judges import LocalChatJudge
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LocalChatJudge(tiny_vlm_judge())
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def judge_manifest(tmp_path_factory):
    from capreward.testing.tiny_vlm_judges import probe_image, synthetic_video

    d = tmp_path_factory.mktemp("judges")
    rows = []
    for rid, kind, colour, caption in JUDGE_ROWS:
        path = d / f"{rid}.{'png' if kind == 'image' else 'mp4'}"
        if kind == "image":
            probe_image("visce2", colour).save(path)
        else:
            write_mp4(path, synthetic_video(colour))
        rows.append({"id": rid, "caption": caption, kind: str(path), "references": [f"a {colour} square"]})
    manifest = d / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest, rows


def judge_score(manifest, out, *args, env=None):
    proc = cli("score", manifest, "--out", out, "--metrics", "visce2,gveval", "--no-progress", *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, by_id(read_results(out))


@pytest.fixture(scope="module")
def judged(tmp_path_factory, judge_manifest, vlm_dir):
    manifest, _ = judge_manifest
    return judge_score(manifest, tmp_path_factory.mktemp("judged") / "scores.jsonl", "--judge-model", vlm_dir)[1]


def nan_to_none(x):
    return None if np.isnan(x) else float(x)


def approx_or_none(x, **tolerance):
    """What `capreward score` writes for the score ``x``: null for NaN, else ``x`` (approximately)."""
    return None if np.isnan(x) else pytest.approx(float(x), **tolerance)


def assert_gveval_rows(scored, rows, result, accr=False):
    for pos, r in enumerate(rows):
        got = scored[r["id"]]
        assert got["gveval"] == approx_or_none(result.score[pos], rel=1e-5)
        assert got["gveval/raw"] == result.raw[pos]
        assert (got["errors"] or {}).get("gveval") == result.error[pos]
        for name in ("accuracy", "completeness", "conciseness", "relevance"):
            if accr:
                assert got[f"gveval/{name}"] == approx_or_none(getattr(result, name)[pos], rel=1e-5)
            else:
                assert f"gveval/{name}" not in got


def test_visce2_equals_the_scorer_called_directly(judged, judge_manifest, chat):
    from capreward import VisCE2

    _, rows = judge_manifest
    images = [r for r in rows if "image" in r]
    want = VisCE2(chat).score([r["caption"] for r in images], [r["image"] for r in images])
    for pos, r in enumerate(images):
        got = judged[r["id"]]
        in_range = 0 <= want.score[pos] <= 100  # a first integer above 100 has no score (the reason says why)
        assert got["visce2"] == (nan_to_none(want.score[pos]) if in_range else None)
        assert got["visce2/raw"] == want.raw[pos] and got["visce2/context"] == want.context[pos]
        assert (got["errors"] or {}).get("visce2") == want.error[pos]
    assert judged["green"]["visce2"] == 85 and judged["green"]["errors"] is None
    assert judged["yellow"]["visce2"] == 0 and "no integer" in judged["yellow"]["errors"]["visce2"]
    for rid in ("vid-red", "vid-blue"):  # image-only metric: an error on the video rows, no crash
        assert "visce2" not in judged[rid] and "images only" in judged[rid]["errors"]["visce2"]


def test_gveval_equals_the_scorer_called_directly(judged, judge_manifest, chat):
    from capreward import GVEval

    _, rows = judge_manifest
    scorer = GVEval(chat)
    for kind in ("image", "video"):
        mine = [r for r in rows if kind in r]
        want = scorer.score([r["caption"] for r in mine], **{f"{kind}s": [r[kind] for r in mine]})
        assert_gveval_rows(judged, mine, want)
    assert judged["yellow"]["gveval"] is None and "no score" in judged["yellow"]["errors"]["gveval"]
    assert judged["vid-red"]["gveval"] is not None and judged["green"]["gveval"] > 90


def test_gveval_accr_and_reference_modes(judge_manifest, vlm_dir, chat):
    from capreward import GVEval
    from capreward.jobs.manifest import read_manifest
    from capreward.jobs.runners import ManifestScorer, ScoreOptions

    manifest, rows = judge_manifest
    manifest_rows = read_manifest(manifest)
    manifest_rows[-1].references = None  # a video row without references
    options = ScoreOptions(metrics=["gveval"], judge_model=str(vlm_dir), gveval_mode="ref-only", gveval_accr=True)
    scored = by_id(ManifestScorer(options).score_rows(manifest_rows))
    video = rows[-2:-1]
    want = GVEval(chat, mode="ref-only", accr=True).score(
        [r["caption"] for r in video], videos=[r["video"] for r in video], references=[r["references"] for r in video])
    assert_gveval_rows(scored, video, want, accr=True)
    assert scored["vid-red"]["gveval/accuracy"] is not None
    assert "needs references" in scored["vid-blue"]["errors"]["gveval"] and "gveval" not in scored["vid-blue"]
    for r in rows[:4]:  # the released ACCR prompts are for videos only
        assert "videos only" in scored[r["id"]]["errors"]["gveval"] and "gveval" not in scored[r["id"]]


class AsServer:
    """The local backend's answers without token ids: what a server sends (text and top alternatives)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def generate(self, requests):
        from capreward.judges.protocol import ChatResponse

        return [ChatResponse(a.text, a.tokens, a.error, a.finish_reason) for a in self.inner.generate(requests)]


def test_judges_through_an_openai_compatible_server(tmp_path, judge_manifest, vlm_dir, judged, chat):
    from capreward import GVEval
    from capreward.testing.chat_server import ChatServer

    manifest, rows = judge_manifest
    key = "sk-test-do-not-print-4242"
    with ChatServer("local", judge_dir=vlm_dir, model="tiny-vlm", api_key=key, log_path=tmp_path / "server.log") as s:
        env = dict(os.environ, OPENAI_API_KEY=key)
        proc, scored = judge_score(manifest, tmp_path / "remote.jsonl", "--judge-base-url", s.base_url,
                                   "--judge-api-model", "tiny-vlm", env=env)
    assert key not in proc.stdout + proc.stderr + (tmp_path / "remote.jsonl").read_text()
    for r in rows:  # VisCE² reads the written integer: the same as on the local judge
        for field_ in ("visce2", "visce2/raw", "visce2/context"):
            assert scored[r["id"]].get(field_) == judged[r["id"]].get(field_)
        assert (scored[r["id"]]["errors"] or {}).get("visce2") == (judged[r["id"]]["errors"] or {}).get("visce2")
    # G-VEval on a server reads the top alternatives after "$" (the released rule)
    images = [r for r in rows if "image" in r]
    want = GVEval(AsServer(chat)).score([r["caption"] for r in images], images=[r["image"] for r in images])
    for pos, r in enumerate(images):
        assert scored[r["id"]]["gveval"] == approx_or_none(want.score[pos], rel=1e-5)
        assert scored[r["id"]]["gveval/raw"] == want.raw[pos]


def test_fleur_scores_image_and_video_rows_like_the_scorer(judge_manifest):
    """One batch mixing image and video rows: images as they are, videos on the three-frame composite,
    each equal to FLEUR called directly (a video row no longer fails the batch)."""
    import torch

    from capreward import FLEUR
    from capreward.jobs.manifest import read_manifest
    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir

    manifest, _ = judge_manifest
    rows = read_manifest(manifest)
    assert {r.kind for r in rows} == {"image", "video"}
    judge = str(tiny_judge_dir(FLEUR_RECIPE))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scored = ManifestScorer(ScoreOptions(metrics=["fleur"], judge_model=judge)).score_rows(rows)
        direct = FLEUR(model=judge, device="cpu")
        for kind in ("image", "video"):
            part = [(r, s) for r, s in zip(rows, scored) if r.kind == kind]
            res = direct.score([r.caption for r, _ in part], references=[r.references for r, _ in part],
                               **{f"{kind}s": [r.path for r, _ in part]})
            for j, (_, s) in enumerate(part):
                assert s["fleur/raw"] == res.raw[j]
                assert s["fleur"] == approx_or_none(float(res.score[j]), abs=1e-6)
                assert (s["errors"] or {}).get("fleur") == res.error[j]
    finally:
        torch.set_num_threads(threads)
