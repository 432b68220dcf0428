"""One name per metric and one sub-score separator at every entry point.

Every alias of :mod:`capreward.names` is accepted for its metric by ``capreward score --metrics``,
``serve --reward``, ``explain --metric``, the Python API (``ScoreOptions``, ``build_reward``, veRL's
``CAPREWARD_REWARD``), and the name that comes out is the canonical one: the rewards' TRL names and logged
keys, the torchmetrics metrics' names, the fields of results files. Sub-scores are named with "/" in every
key (TRL logs, metric outputs, results fields)."""

from __future__ import annotations

import math

import pytest

from capreward import names, terms
from capreward.cli.main import build_parser


def subparser(command: str):
    return build_parser()._subparsers._group_actions[0].choices[command]


def spellings(name: str) -> list[str]:
    """The name, its aliases, and each in upper case with "-" for "_"."""
    base = [name, *names.aliases_of(name)]
    return base + [b.upper().replace("_", "-") for b in base]


def test_the_table_maps_every_alias_to_a_metric_and_refuses_others():
    assert set(names.ALIASES.values()) <= set(names.METRICS)
    assert not set(names.ALIASES) & set(names.METRICS)
    for name in names.METRICS:
        for spelled in spellings(name):
            assert names.canonical(spelled) == name
    assert names.canonical("ClipScore") == "clip_s" and names.canonical("PAC-S") == "pac_s"
    with pytest.raises(ValueError, match="unknown metric 'bleu'; choose one of emscore, clip_s, pac_s"):
        names.canonical("bleu")
    assert names.sub_score("emscore", "video", "full_f") == "emscore/video/full_f"


@pytest.mark.parametrize("metric", names.METRICS)
def test_score_accepts_every_spelling_of_every_metric(metric):
    parser = subparser("score")
    for spelled in spellings(metric):
        args = parser.parse_args(["m.jsonl", "--out", "o.jsonl", "--metrics", f"emscore,{spelled}"])
        assert args.metrics == ["emscore", metric]
    from capreward.jobs.runners import ScoreOptions

    assert ScoreOptions(metrics=spellings(metric)[-1:]).metrics == [metric]


def test_serve_and_the_reward_factory_accept_the_same_aliases():
    from capreward.adapters.factory import REWARD_NAMES, canonical_name

    parser = subparser("serve")
    for reward in REWARD_NAMES:
        for spelled in spellings(reward):
            assert parser.parse_args(["--reward", spelled]).reward == reward
            assert canonical_name(spelled) == reward
    with pytest.raises(ValueError, match="unknown reward 'bleu'; choose one of emscore, clip_s"):
        canonical_name("bleu")


def test_explain_accepts_the_aliases_of_its_metrics():
    parser = subparser("explain")
    assert parser.parse_args(["m.jsonl", "--out", "o.jsonl", "--metric", "G-VEval"]).metric == "gveval"
    assert parser.parse_args(["m.jsonl", "--out", "o.jsonl", "--metric", "FLEUR"]).metric == "fleur"


def test_reward_classes_are_named_by_their_metric(tiny_clip_path):
    from capreward.adapters.factory import RewardOptions, build_reward
    from capreward.rewards import (
        CLIPScoreReward,
        EMScoreReward,
        FLEURReward,
        GVEvalReward,
        HallucinationPenalty,
        PACScoreReward,
        VisCE2Reward,
    )

    classes = {EMScoreReward: "emscore", CLIPScoreReward: "clip_s", PACScoreReward: "pac_s", FLEURReward: "fleur",
               HallucinationPenalty: "hallucination", VisCE2Reward: "visce2", GVEvalReward: "gveval"}
    for cls, name in classes.items():
        assert vars(cls)["__name__"] == name, cls  # an instance's __name__: TRL's metric prefix rewards/<name>/
    for spelled in spellings("clip_s"):
        assert build_reward(spelled, RewardOptions(clip_model=str(tiny_clip_path))).__name__ == "clip_s"


def test_metrics_are_named_by_their_metric(tiny_backbone):
    from capreward import PACScore
    from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric, FLEURMetric, GVEvalMetric, VisCE2Metric

    assert EMScoreMetric(backbone=tiny_backbone).name == "emscore"
    assert CLIPScoreMetric(backbone=tiny_backbone).name == "clip_s"
    pac = CLIPScoreMetric(scorer=PACScore(None, backbone=tiny_backbone))
    assert pac.name == "pac_s" and pac.plot_upper_bound == 2.0
    assert (FLEURMetric.default_name, VisCE2Metric.default_name, GVEvalMetric.default_name) == ("fleur", "visce2", "gveval")
    assert all(names.SEP in c for c in EMScoreMetric.columns if c not in ("score", "empty", "truncated"))
    assert not any("." in c for c in EMScoreMetric.columns)


def test_trl_logs_use_the_canonical_name_and_slash_sub_scores(tiny_backbone):
    from capreward import PACScore
    from capreward.rewards import CLIPScoreReward, EMScoreReward, PACScoreReward
    from capreward.testing.trained_clip import colour_image

    logged: dict[str, float] = {}
    image = colour_image("red")
    pac = PACScoreReward(scorer=PACScore(None, backbone=tiny_backbone))
    for reward in (CLIPScoreReward(backbone=tiny_backbone), EMScoreReward(backbone=tiny_backbone), pac):
        values = reward(None, ["a red image", "a dog"], image=[image, image], references=[["a red picture"]] * 2,
                        log_metric=lambda k, v: logged.__setitem__(k, v))
        assert all(v is not None and math.isfinite(v) for v in values)
    assert "rewards/clip_s/clip_s" in logged and "rewards/clip_s/ref_similarity" in logged
    assert "rewards/emscore/video/full_f" in logged and "rewards/emscore/reference/fine_p" in logged
    assert "rewards/pac_s/pac_s" in logged and "rewards/pac_s/clip_s" not in logged
    assert not any("clipscore" in k or "." in k for k in logged)


def test_verl_reads_the_reward_name_through_the_table(monkeypatch, tiny_clip_path):
    from capreward.adapters import verl

    monkeypatch.setenv("CAPREWARD_REWARD", "ClipScore")
    monkeypatch.setenv("CAPREWARD_CLIP_MODEL", str(tiny_clip_path))
    verl.reset_default_scorer()
    try:
        assert verl.default_scorer().reward.__name__ == "clip_s"
    finally:
        verl.reset_default_scorer()


def test_one_weighted_terms_syntax_accepts_both_separators():
    assert terms.parse_weighted_terms("emscore=1, clipscore:0.5,hallucination") == [
        ("emscore", 1.0), ("clip_s", 0.5), ("hallucination", 1.0)]
    assert terms.parse_weighted_terms("emscore=1,clip_s=0.5") == terms.parse_weighted_terms("emscore:1,clip_s:0.5")
    with pytest.raises(ValueError, match="did you mean 'emscore'"):
        terms.parse_weighted_terms("emscor=1")
    with pytest.raises(ValueError, match="bad weight 'x'"):
        terms.parse_weighted_terms("emscore=x")
    with pytest.raises(ValueError, match="given twice"):
        terms.parse_weighted_terms("emscore=1,em=2")
    assert terms.parse_weighted_terms("emscore=1,em=2", unique=False) == [("emscore", 1.0), ("emscore", 2.0)]
    from capreward.adapters.factory import parse_terms

    assert parse_terms("emscore:1,composite=2") == [("emscore", 1.0), ("composite", 2.0)]
