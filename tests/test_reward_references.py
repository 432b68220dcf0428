"""Invalid reference lists (issue 20, item 6): ``[]``, ``[""]``, blank or non-str entries give that
sample None and a reason in every reward (the fallback and the reason in the server and veRL), the same
rule as the scorers and ``capreward score``; never a silent switch to the reference-free metric.

Before, the reward API read them as "no references" and scored another metric: two samples with the
same caption and image in one group got EMScore_ref+video and plain EMScore.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from capreward.rewards import (
    CLIPScoreReward,
    CompositeReward,
    EMScoreReward,
    FLEURReward,
    GVEvalReward,
    HallucinationPenalty,
    PACScoreReward,
    VisCE2Reward,
)
from capreward.scorers.emscore import EMScore

INVALID = {
    "empty list": ([], r"references\[1\] must be a non-empty list"),
    "empty string": ([""], r"references\[1\]\[0\]: empty caption"),
    "blank entry": (["a dog", "   "], r"references\[1\]\[1\]: empty caption"),
    "non-str entry": (["a dog", 5], r"references\[1\]\[1\]: caption must be str, got int"),
    "blank str": ("  ", r"references\[1\]\[0\]: empty caption"),
    "wrong type": (5, r"references\[1\] must be a str or list of str, got int"),
    "dict": ({"text": "a dog"}, r"references\[1\] must be a str or list of str, got dict"),
}
CAPTIONS = ["a dog runs on the grass", "a dog runs on the grass", "a cat sleeps"]


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def clip_rewards(tiny_backbone):
    em = EMScoreReward(backbone=tiny_backbone)
    clip = CLIPScoreReward(backbone=tiny_backbone)
    return {
        "EMScoreReward": em,
        "CLIPScoreReward": clip,
        "PACScoreReward": PACScoreReward(model="unused", backbone=tiny_backbone),
        "HallucinationPenalty": HallucinationPenalty(backbone=tiny_backbone),
        "CompositeReward": CompositeReward([(em, 1.0), (clip, 0.5)]),
    }


@pytest.mark.parametrize("case", list(INVALID))
@pytest.mark.parametrize("name", ["EMScoreReward", "CLIPScoreReward", "PACScoreReward", "HallucinationPenalty",
                                  "CompositeReward"])
def test_invalid_references_give_none_and_a_reason(clip_rewards, image, name, case):
    reward = clip_rewards[name]
    refs, reason = INVALID[case]
    references = [["a dog on a lawn"], refs, None]
    out = reward.compute(None, CAPTIONS, image=[image] * 3, references=references)
    assert out.values[1] is None, f"{name} scored invalid references {refs!r}: {out.values[1]}"
    assert re.search(reason, out.reasons[1]), out.reasons[1]
    # the neighbours score as they do alone
    alone = [reward.compute(None, [CAPTIONS[i]], image=[image], references=[references[i]]).values[0] for i in (0, 2)]
    assert [out.values[0], out.values[2]] == pytest.approx(alone, abs=1e-6)


def test_the_issue_case_same_sample_two_metrics(tiny_backbone, image):
    """Same caption, same image, references [""] next to references ["a dog on a lawn"]: the second
    sample was scored by EMScore(X, V) while the first by EMScore(X, V, X*)."""
    reward = EMScoreReward(backbone=tiny_backbone)
    out = reward.compute(None, CAPTIONS[:2], image=[image] * 2, references=[["a dog on a lawn"], [""]])
    assert out.values[0] is not None and out.values[1] is None
    plain = EMScore(backbone=tiny_backbone).score(CAPTIONS[1:2], images=[image], harmonic_mean="sign-safe").score
    assert out.values[0] != pytest.approx(float(plain[0]), abs=1e-6), "precondition: references change the metric"
    # reference-only samples (no visual) follow the same rule
    only = reward.compute(None, CAPTIONS[:2], references=[["a dog on a lawn"], []])
    assert only.values[0] is not None and only.values[1] is None and "non-empty" in only.reasons[1]


@pytest.mark.parametrize("reward", [
    FLEURReward(model="/nonexistent/judge"),
    VisCE2Reward(backend=None),
    GVEvalReward(backend=None, mode="combined"),
    GVEvalReward(backend=None, mode="ref-only"),
], ids=["FLEURReward", "VisCE2Reward", "GVEvalReward-combined", "GVEvalReward-ref-only"])
def test_judge_rewards_refuse_invalid_references_before_the_judge(reward, image):
    """The judge rewards apply the rule to each sample before anything is scored: a batch of invalid
    samples never builds the (here unloadable) judge and gets None with the reasons."""
    cases = list(INVALID.values())
    references = [refs for refs, _ in cases]
    out = reward.compute(None, ["a red ball"] * len(cases), image=[image] * len(cases), references=references)
    assert out.values == [None] * len(cases)
    for (refs, reason), got in zip(cases, out.reasons):
        assert re.search(reason.replace(r"references\[1\]", r"references\[\d\]"), got), (refs, got)
    assert reward._scorer is None


# ------------------------------------------------------------------------------------- the adapters
def test_server_gives_the_fallback_with_the_reason(tiny_backbone, image, tmp_path):
    from PIL import Image

    from capreward.server.http import RequestError, RewardService

    Image.fromarray(image).save(tmp_path / "i.png")
    reward = CLIPScoreReward(backbone=tiny_backbone)
    service = RewardService(reward, fallback=-5.0, media_root=str(tmp_path))
    labels = [{"image": "i.png", "references": ["a dog on a lawn"]}, {"image": "i.png", "references": []},
              {"image": "i.png", "references": ["", " "]}, {"references": [""]}, {"image": "i.png"}]
    answer = service.handle({"query": ["a dog runs"] * 5, "labels": labels})
    assert answer["rewards"][1:4] == [-5.0] * 3 and answer["extra_logs"]["unscored"] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert re.search(r"labels\[1\] references must be a non-empty list", answer["errors"][1]), answer["errors"]
    assert re.search(r"labels\[2\] references\[0\]: empty caption", answer["errors"][2]), answer["errors"]
    assert re.search(r"labels\[3\] references\[0\]: empty caption", answer["errors"][3]), answer["errors"]
    assert answer["rewards"][0] != answer["rewards"][4]  # RefCLIP-S and CLIP-S
    # a non-str entry is a malformed label (as a manifest row's is for capreward score): 400 naming it
    with pytest.raises(RequestError, match=r"labels\[0\]: references\[1\] must be a str"):
        service.parse({"query": ["a dog runs"], "labels": [{"image": "i.png", "references": ["ok", 5]}]})


def test_verl_gives_the_fallback_and_logs_the_reason(tiny_backbone, image, tmp_path, caplog):
    from PIL import Image

    from capreward.adapters.verl import make_compute_score

    Image.fromarray(image).save(tmp_path / "i.png")
    compute_score = make_compute_score(CLIPScoreReward(backbone=tiny_backbone), fallback=-5.0, media_root=str(tmp_path))
    truths = [["a dog on a lawn"], [], [""], '["", "a dog"]', ["ok", 5], None]
    with caplog.at_level(logging.WARNING, logger="capreward"):
        values = compute_score.batch(["d"] * 6, ["a dog runs"] * 6, truths, [{"image": "i.png"}] * 6)
    assert values[1:5] == [-5.0] * 4 and values[0] != -5.0 and values[5] != -5.0
    assert "must be a non-empty list" in caplog.text and "empty caption" in caplog.text
    assert "references[1] must be a str" in caplog.text


@pytest.mark.parametrize("mode", ["ref-only", "combined"])
def test_gveval_scorer_applies_the_same_rule(mode):
    from capreward import GVEval

    scorer = GVEval(None, mode=mode)
    for refs, reason in [([], r"references\[0\] must be a non-empty list"), ([""], r"references\[0\]\[0\]: empty caption"),
                         (["ok", 5], r"references\[0\]\[1\]: caption must be str"), ("a dog", "got a str")]:
        with pytest.raises(ValueError, match=reason):
            scorer.requests(["a red ball"], references=[refs])
