"""Every scorer of the registry, by its one name, at every entry point: ``capreward serve --reward NAME``
(its parser and the reward it builds), veRL's ``compute_score`` adapter (``CAPREWARD_REWARD``), veRL's
batch reward manager backed by veRL's reward pool (``reward_router_address``), and ``capreward score
--metrics NAME`` (its parser and the job's runner). Judge metrics (VisCE², G-VEval, FLEUR remote, claims,
qa_utility) reach the judge server they are pointed at; CLIP metrics the CLIP given. Nothing is loaded
from a hub: CLIP metrics use a tiny CLIP, the judge server's URL is never called (building is lazy).

Scoring through each entry point is tested per metric elsewhere (tests/test_serve.py,
test_judges_by_name.py, test_claims_entry_points.py, test_verl_contract.py, test_verl_judge_router.py,
test_cli_score.py); this file checks that no name is missing from any of them."""

from __future__ import annotations

import pytest

from capreward import registry
from capreward.judges.remote import OpenAIJudge

NAMES = registry.names()
URL = "http://127.0.0.1:9/v1"


def judge_metric(name: str) -> bool:
    spec = registry.get(name)
    return bool(spec.judge_backend or spec.remote_scorer or spec.text_judge)


def served_judges(reward) -> list[OpenAIJudge]:
    """The OpenAI-compatible judges a reward's scorer asks."""
    scorer = getattr(reward, "scorer", None)
    found = [getattr(scorer, a, None) for a in ("backend", "question_backend")]
    return [b for b in found if isinstance(b, OpenAIJudge)]


def check_reward(name: str, reward, url: str, model: str) -> None:
    spec = registry.get(name)
    from capreward.rewards import MetricReward

    assert isinstance(reward, MetricReward) and reward.metric == name, (name, type(reward))
    if name in MetricReward.named:
        assert type(reward) is MetricReward.named[name]
    if judge_metric(name):
        judges = served_judges(reward)
        assert judges, f"{name}: no judge server reached"
        assert all(j.base_url == url and j.model == model for j in judges), name
        if spec.remote_scorer and not spec.judge_backend:  # FLEUR: its remote scorer on the server
            assert type(reward.scorer).__name__ == spec.remote_scorer.rsplit(":", 1)[-1]


def test_the_registry_holds_every_scorer_the_issue_names():
    assert {"visce2", "gveval", "fleur", "claims", "qa_utility", "clip_s", "pac_s", "emscore"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_serve_builds_every_scorer_by_name(name, tiny_clip_path):
    from capreward.adapters.factory import RewardOptions, build_reward
    from capreward.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--reward", name.replace("_", "-").upper(), "--judge-url", URL,
                                      "--judge-model", "served", "--clip-model", str(tiny_clip_path)])
    assert args.reward == name
    options = RewardOptions(clip_model=args.clip_model, judge_url=args.judge_url, judge_model=args.fleur_model,
                            judge_api_key_env=None, gveval_mode=args.gveval_mode)
    check_reward(name, build_reward(args.reward, options), URL, "served")


@pytest.fixture()
def clean_env(monkeypatch):
    import capreward.adapters.verl as capreward_verl

    for key in ("CAPREWARD_JUDGE_URL", "CAPREWARD_JUDGE_MODEL", "CAPREWARD_REWARD"):
        monkeypatch.delenv(key, raising=False)
    capreward_verl.reset_default_scorer()
    yield monkeypatch
    capreward_verl.reset_default_scorer()


@pytest.mark.parametrize("name", NAMES)
def test_the_verl_adapter_builds_every_scorer_by_name(name, clean_env, tiny_clip_path):
    from capreward.adapters.verl import default_scorer

    clean_env.setenv("CAPREWARD_REWARD", name)
    clean_env.setenv("CAPREWARD_JUDGE_URL", URL)
    clean_env.setenv("CAPREWARD_JUDGE_MODEL", "served")
    clean_env.setenv("CAPREWARD_CLIP_MODEL", str(tiny_clip_path))
    check_reward(name, default_scorer().reward, URL, "served")


@pytest.mark.parametrize("name", NAMES)
def test_the_verl_manager_backs_every_judge_by_the_reward_pool(name, clean_env, tiny_clip_path):
    """veRL hands the manager its reward pool's router (``reward_router_address``) and the served model
    (``reward.reward_model.model_path``): every judge metric asks that server."""
    pytest.importorskip("verl", reason="verl is installed by scripts/bootstrap.sh --test")
    from omegaconf import OmegaConf

    from capreward.adapters.verl_manager import CaprewardRewardManager

    clean_env.setenv("CAPREWARD_REWARD", name)
    clean_env.setenv("CAPREWARD_CLIP_MODEL", str(tiny_clip_path))
    config = OmegaConf.create({"reward": {"reward_model": {"enable": True, "model_path": "/pool/judge"}}})
    manager = CaprewardRewardManager(config, tokenizer=None, reward_router_address="127.0.0.1:8123")
    check_reward(name, manager.scorer.reward, "http://127.0.0.1:8123/v1", "/pool/judge")


@pytest.mark.parametrize("name", NAMES)
def test_capreward_score_runs_every_scorer_by_name(name, tiny_clip_path):
    from capreward.cli.main import build_parser
    from capreward.jobs.runners import ManifestScorer, ScoreOptions

    args = build_parser().parse_args(["score", "m.jsonl", "--out", "o.jsonl", "--metrics", name.replace("_", "-"),
                                      "--judge-base-url", URL, "--judge-api-model", "served"])
    assert args.metrics == [name]
    options = ScoreOptions(metrics=args.metrics, clip_model=str(tiny_clip_path), pac_model=str(tiny_clip_path),
                           judge_base_url=args.judge_base_url, judge_api_model=args.judge_api_model)
    scorer = ManifestScorer(options)
    assert list(scorer._runners) == [name] and callable(scorer._runners[name])
    if judge_metric(name):
        chat = scorer._chat_backend()
        assert isinstance(chat, OpenAIJudge) and chat.base_url == URL and chat.model == "served"
