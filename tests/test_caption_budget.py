"""Issue 43 item 5: one caption budget (characters and claims) at every door.

Reading a 1 MB caption took 10-37 s and one claims-reward call on 2.3 MB took 209 s; through TRL and veRL
nothing bounded it, and the server took 64 strings of 256 Ki characters in one body. One setting
(:mod:`capreward.caption_budget`) now bounds a caption before anything reads it, and every door applies
it: a reward (None and the reason; the other samples score as they do alone), a composite with guards,
a torchmetrics Metric (a named error), a scoring job (the row's error for every metric), the reward
server and the veRL adapter (the fallback, the reason in ``errors``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from capreward.caption_budget import (DEFAULT_MAX_CHARS, CaptionBudget, CaptionOverBudget, caption_budget,
                                      caption_problem, get_caption_budget)

OVER = "a red car on a grey road. " * 800  # 20,800 characters, a handful of claims
MANY_CLAIMS = " ".join(f"object {k} is red." for k in range(300))  # under 16 Ki characters, 300 claims
BUDGET_WORDS = "over the caption budget"


def test_the_budget_counts_characters_and_claims():
    budget = CaptionBudget()
    assert budget == get_caption_budget() and budget.max_chars == DEFAULT_MAX_CHARS == 16384
    assert budget.problem("a red car. a blue sky.") is None
    assert len(OVER) > budget.max_chars and len(MANY_CLAIMS) < budget.max_chars
    assert budget.problem(OVER) == (f"has {len(OVER)} characters, over the caption budget of 16384 "
                                    "(CAPREWARD_MAX_CAPTION_CHARS, --max-caption-chars)")
    assert budget.problem(MANY_CLAIMS).startswith("holds 300 claims, over the caption budget of 256")
    assert CaptionBudget(max_claims=300).problem(MANY_CLAIMS) is None
    with caption_budget(max_chars=len(OVER)):
        assert caption_problem(OVER) is None
    assert caption_problem(OVER) is not None
    with pytest.raises(ValueError, match="max_chars must be a positive int"):
        CaptionBudget(max_chars=0)


def test_the_budget_is_read_from_the_environment():
    code = "from capreward.caption_budget import get_caption_budget as g; b = g(); print(b.max_chars, b.max_claims)"
    env = {**os.environ, "CAPREWARD_MAX_CAPTION_CHARS": "32_768", "CAPREWARD_MAX_CAPTION_CLAIMS": "64"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.stdout.split() == ["32768", "64"], proc.stderr


@pytest.fixture(scope="module")
def clip_reward(tiny_clip_path):
    from capreward.rewards import CLIPScoreReward

    return CLIPScoreReward(model=str(tiny_clip_path))


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("budget") / "i.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(path)
    return str(path)


def test_a_reward_gives_an_over_budget_caption_none_and_the_reason(clip_reward, image):
    captions = ["a red image.", OVER, MANY_CLAIMS, "a blue image."]
    out = clip_reward.compute(None, captions, image=[image] * 4)
    assert out.values[1] is None and out.values[2] is None
    assert f"completions[1] has {len(OVER)} characters, {BUDGET_WORDS}" in str(out.reasons[1])
    assert "completions[2] holds 300 claims" in str(out.reasons[2]) and out.reasons[1].kind == "input"
    alone = clip_reward.compute(None, [captions[0], captions[3]], image=[image] * 2)
    assert [out.values[0], out.values[3]] == pytest.approx(alone.values, abs=1e-6)
    # TRL's call: the same (None for the sample, the step goes on)
    values = clip_reward(prompts=["p"] * 2, completions=[captions[0], OVER], completion_ids=[[1], [2]], image=[image] * 2)
    assert values[1] is None and values[0] == pytest.approx(alone.values[0], abs=1e-6)
    with caption_budget(max_chars=len(OVER) + 1):  # raised: scored
        assert clip_reward.compute(None, [OVER], image=[image]).values[0] is not None


def test_a_composite_with_guards_never_reads_an_over_budget_caption(clip_reward, image):
    from capreward.rewards import CompositeReward, Guards

    composite = CompositeReward([(clip_reward, 1.0), (lambda prompts, completions, **kw: [0.5] * len(completions), 1.0,
                                                      (0.0, 1.0))], guards=Guards())
    out = composite.compute(None, ["a red image.", OVER], image=[image] * 2)
    assert out.values[0] is not None and out.values[1] is None
    assert BUDGET_WORDS in str(out.reasons[1])
    assert all(math.isnan(column[1]) for key, column in out.metrics.items() if key.startswith("guard/"))


def test_a_metric_refuses_an_over_budget_caption_naming_it(tiny_clip_path, image):
    from capreward.torchmetrics import CLIPScoreMetric

    metric = CLIPScoreMetric(model=str(tiny_clip_path), visual="image")
    with pytest.raises(CaptionOverBudget, match=rf"candidates\[1\] has {len(OVER)} characters, {BUDGET_WORDS}"):
        metric.update(["a red image.", OVER], [image, image])
    with pytest.raises(CaptionOverBudget, match=r"candidates\[0\] holds 300 claims"):
        metric.update(MANY_CLAIMS, [image])


def test_a_job_gives_an_over_budget_row_its_error_for_every_metric(tmp_path, tiny_clip_path, image, capsys):
    from capreward.cli.main import main
    from capreward.jobs.results_file import read_results

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "ok", "caption": "a red image.", "image": image}) + "\n"
                        + json.dumps({"id": "long", "caption": OVER, "image": image}) + "\n")
    out = tmp_path / "o.jsonl"
    args = ["score", str(manifest), "--out", str(out), "--metrics", "clip_s,emscore", "--clip-model",
            str(tiny_clip_path), "--no-progress"]
    assert main(args) == 0
    rows = {r["id"]: r for r in read_results(out)}
    assert rows["ok"]["errors"] is None
    for metric in ("clip_s", "emscore"):
        assert rows["long"]["errors"][metric] == f"row 'long': the caption has {len(OVER)} characters, " \
                                                 f"{BUDGET_WORDS} of 16384 (CAPREWARD_MAX_CAPTION_CHARS, --max-caption-chars)"
    # a raised budget is recorded: a resume with another is refused
    raised = tmp_path / "raised.jsonl"
    assert main([*args[:3], str(raised), *args[4:], "--max-caption-chars", "30000"]) == 0
    assert read_results(raised)[1]["errors"] is None
    assert json.loads((tmp_path / "raised.jsonl.settings.json").read_text())["settings"]["max_caption_chars"] == 30000
    capsys.readouterr()
    assert main([*args[:3], str(raised), *args[4:]]) == 2
    assert "--max-caption-chars was 30000, now not used" in capsys.readouterr().err


def test_the_server_and_verl_give_an_over_budget_caption_the_fallback(clip_reward, image, tmp_path):
    from capreward.adapters.verl import make_compute_score
    from capreward.server.http import RewardService, ServerLimits

    service = RewardService(clip_reward, media_root=os.path.dirname(image), limits=ServerLimits())
    name = os.path.basename(image)
    answer = service.handle({"query": ["P a red image.", "P " + OVER], "prompts": ["P", "P"],
                             "labels": [{"image": name}, {"image": name}]})
    assert answer["rewards"][1] == service.fallback and answer["extra_logs"]["unscored"] == [0.0, 1.0]
    assert answer["errors"][0] is None and answer["errors"][1].startswith("query[1] has ")
    assert BUDGET_WORDS in answer["errors"][1]
    alone = clip_reward.compute(None, ["a red image."], image=[image]).values[0]
    assert answer["rewards"][0] == pytest.approx(alone, abs=1e-6)
    verl = make_compute_score(clip_reward, return_dict=True)
    rows = verl.batch(["d", "d"], ["a red image.", OVER], [None, None], [{"image": image}] * 2)
    assert rows[1]["unscored"] == 1.0 and rows[1]["score"] == verl.fallback
    assert rows[0]["score"] == pytest.approx(alone, abs=1e-6)
