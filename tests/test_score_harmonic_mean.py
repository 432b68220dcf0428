"""Issue 43 item 7: ``capreward score`` has one honest range for EMScore.

It wrote EMScore far outside the documented [-1, 1] (a wrong colour on a red image 3.24 against 0.985 for
the right caption) with no option to change it, ranking captions opposite to the veRL reward. The job now
forms EMScore's F (and RefCLIP-S) sign-safely by default, as every reward does: the written score stays
in [-1, 1], equals the scorer's sign-safe value and the veRL reward's, and ranks the true caption first.
``--harmonic-mean released`` keeps the papers' formula; the choice is recorded per results file, so a
resume with the other one is refused, and a record from before the option existed reads as "released".
"""

from __future__ import annotations

import json
import random

import pytest

from capreward.cli.main import main
from capreward.jobs.results_file import read_results
from capreward.jobs.settings_file import record_path

CAPTIONS = {"right": "a red image.", "wrong": "a yellow image."}


@pytest.fixture(scope="module")
def colour_job(tmp_path_factory):
    from capreward.testing.trained_clip import colour_image, trained_clip_path

    d = tmp_path_factory.mktemp("harmonic")
    colour_image("red", random.Random(3), size=(48, 48)).save(d / "red.png")
    manifest = d / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": k, "caption": c, "image": "red.png"}) + "\n"
                                for k, c in CAPTIONS.items()))
    return d, manifest, str(trained_clip_path())


def score(manifest, out, clip, *extra):
    return ["score", str(manifest), "--out", str(out), "--metrics", "emscore", "--clip-model", clip,
            "--no-progress", *map(str, extra)]


def by_id(path):
    return {r["id"]: r for r in read_results(path)}


def test_score_writes_emscore_in_range_as_the_rewards_rank_it(colour_job, tmp_path):
    from capreward import EMScore
    from capreward.adapters.verl import make_compute_score
    from capreward.backbones import CLIPBackbone
    from capreward.rewards import EMScoreReward

    d, manifest, clip = colour_job
    safe, released = tmp_path / "safe.jsonl", tmp_path / "released.jsonl"
    assert main(score(manifest, safe, clip)) == 0
    assert main(score(manifest, released, clip, "--harmonic-mean", "released")) == 0
    got, old = by_id(safe), by_id(released)
    assert old["wrong"]["emscore"] > 1.0 > old["right"]["emscore"], "precondition: the issue's case"
    assert -1.0 <= got["wrong"]["emscore"] < got["right"]["emscore"] <= 1.0
    for row in got.values():
        assert all(-1.0 <= v <= 1.0 for k, v in row.items() if k.startswith("emscore") and isinstance(v, float))
    backbone = CLIPBackbone(clip)
    captions = list(CAPTIONS.values())
    image = str(d / "red.png")
    for mean, rows in (("sign-safe", got), ("released", old)):
        direct = EMScore(backbone=backbone).score(captions, images=[image] * 2, harmonic_mean=mean)
        assert [rows[k]["emscore"] for k in CAPTIONS] == pytest.approx(direct.score.tolist(), abs=1e-6)
    verl = make_compute_score(EMScoreReward(backbone=backbone))
    rewards = [verl("d", c, None, {"image": image}) for c in captions]
    assert [got[k]["emscore"] for k in CAPTIONS] == pytest.approx(rewards, abs=1e-6)
    assert json.loads(record_path(safe).read_text())["settings"]["harmonic_mean"] == "sign-safe"
    assert json.loads(record_path(released).read_text())["settings"]["harmonic_mean"] == "released"


def test_a_resume_with_the_other_mean_is_refused_and_an_old_record_reads_released(colour_job, tmp_path, capsys):
    d, manifest, clip = colour_job
    out = tmp_path / "out.jsonl"
    assert main(score(manifest, out, clip)) == 0
    capsys.readouterr()
    assert main(score(manifest, out, clip, "--harmonic-mean", "released")) == 2
    assert "--harmonic-mean was sign-safe, now released" in capsys.readouterr().err
    # a record written before the option existed: its rows were formed with the released mean
    record = json.loads(record_path(out).read_text())
    del record["settings"]["harmonic_mean"]
    record_path(out).write_text(json.dumps(record))
    assert main(score(manifest, out, clip)) == 2
    assert "--harmonic-mean was released, now sign-safe" in capsys.readouterr().err
    assert main(score(manifest, out, clip, "--harmonic-mean", "released")) == 0
