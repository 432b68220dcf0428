"""Every scorer by its one name in the adapters: ``capreward serve --reward visce2|gveval`` backed by an
OpenAI-compatible judge server (``--judge-url``), and the factory's judge options (``CAPREWARD_JUDGE_*``),
against the scorers called directly on the local judge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capreward import GVEval, VisCE2
from capreward.adapters.factory import REWARD_NAMES, RewardOptions, build_reward
from capreward.judges.remote import OpenAIJudge
from capreward.names import METRICS
from capreward.testing.chat_server import ChatServer
from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge_dir
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)
from serve_process import Server

WIDE = 1000


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("judge-server") / "server.log"
    with ChatServer("local", judge_dir=tiny_vlm_judge_dir(), model="tiny-vlm", log_path=log, max_logprobs=WIDE) as s:
        yield s


def test_every_metric_is_a_reward_name():
    assert set(METRICS) <= set(REWARD_NAMES)


def test_options_from_the_environment(monkeypatch):
    monkeypatch.setenv("CAPREWARD_JUDGE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CAPREWARD_JUDGE_MODEL", "served-judge")
    monkeypatch.setenv("CAPREWARD_JUDGE_TOP_LOGPROBS_CAP", "64")
    monkeypatch.setenv("CAPREWARD_GVEVAL_MODE", "combined")
    opts = RewardOptions.from_env()
    reward = build_reward("G-VEval", opts)
    backend = reward.scorer.backend
    assert isinstance(backend, OpenAIJudge) and backend.base_url == "http://127.0.0.1:9/v1"
    assert backend.model == "served-judge" and backend.top_logprobs_cap == 64
    assert reward.scorer.mode == "combined" and reward.scorer.tree_top_logprobs == 64
    fleur = build_reward("fleur", opts)
    assert type(fleur.scorer).__name__ == "RemoteFLEUR" and fleur.scorer.backend.model == "served-judge"
    with pytest.raises(ValueError, match="judge_model"):
        build_reward("visce2", RewardOptions(judge_url="http://127.0.0.1:9/v1"))


def test_gveval_reward_by_name_on_a_judge_server_equals_the_local_exact_score(judge_server, vlm_judge):
    opts = RewardOptions(judge_url=judge_server.base_url, judge_model="tiny-vlm", judge_api_key_env=None,
                         judge_top_logprobs_cap=WIDE)
    reward = build_reward("gveval", opts)
    images = [probe_image("gveval", c) for c in ("green", "red")]
    got = reward(None, ["a green ball", "a red car"], image=images)
    want = GVEval(vlm_judge).score(["a green ball", "a red car"], images=images).score * 0.01
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_serve_visce2_on_a_judge_server(judge_server, vlm_judge, tmp_path):
    colours = ("green", "red")
    for c in colours:
        probe_image("visce2", c).save(tmp_path / f"{c}.png")
    server = Server(["--reward", "visce2", "--judge-url", judge_server.base_url, "--judge-model", "tiny-vlm",
                     "--judge-api-key-env", "NO_SUCH_KEY_VARIABLE", "--media-root", str(tmp_path)])
    try:
        captions = ["a green ball", "a red car"]
        status, body = server.post({"query": captions, "prompts": [""] * 2,
                                    "labels": [json.dumps({"image": f"{c}.png"}) for c in colours]})
    finally:
        assert server.stop() == 0
    assert status == 200, body
    want = VisCE2(vlm_judge).score(captions, [probe_image("visce2", c) for c in colours]).score * 0.01
    np.testing.assert_allclose(body["rewards"], want, rtol=1e-6)


def test_grpo_recipe_and_score_cli_take_every_scorer_and_the_judge_server():
    from capreward.cli.main import build_parser as cli_parser
    from capreward.recipes.grpo_captioner import REWARD_NAMES as RECIPE_NAMES
    from capreward.recipes.grpo_captioner import build_parser, build_reward

    assert set(METRICS) <= set(RECIPE_NAMES)
    args = build_parser().parse_args(["--judge-url", "http://127.0.0.1:9/v1", "--judge", "served-judge",
                                      "--judge-top-logprobs-cap", "64", "--gveval-mode", "combined"])
    for name in ("visce2", "gveval", "fleur"):
        reward = build_reward(name, args, None, None)
        assert reward.scorer.backend.base_url == "http://127.0.0.1:9/v1" and reward.scorer.backend.model == "served-judge"
    assert build_reward("gveval", args, None, None).scorer.tree_top_logprobs == 64
    score = cli_parser().parse_args(["score", "m.jsonl", "--out", "o.jsonl", "--metrics", "gveval",
                                     "--judge-base-url", "http://127.0.0.1:9/v1", "--judge-top-logprobs-cap", "64"])
    assert score.judge_top_logprobs_cap == 64


def test_score_cli_runs_fleur_on_the_judge_server_exactly(tmp_path):
    """``capreward score --metrics fleur --judge-base-url ...``: FLEUR on the served judge (RemoteFLEUR's
    exact reading): the answer the local judge gives on the same weights, and its exact score or none
    with the reason (never a partial one); the settings record names the server, the served model and
    the logprob cap, not a local judge."""
    import random
    import subprocess
    import sys

    import torch

    from capreward import FLEUR
    from capreward.judges import LocalJudge
    from capreward.testing import fleur_task_image
    from susceptible_judge import red_image, susceptible_judge_dir

    judge_dir = susceptible_judge_dir()  # a LLaVA judge trained on FLEUR's answers, 1024 positions
    images = [red_image(random.Random(0)), fleur_task_image("blue", random.Random(1))]
    captions = ["a red ball", "a red car"]
    rows = []
    for k, (caption, image) in enumerate(zip(captions, images)):
        image.save(tmp_path / f"{k}.png")
        rows.append({"id": f"r{k}", "caption": caption, "image": str(tmp_path / f"{k}.png")})
    manifest, out = tmp_path / "m.jsonl", tmp_path / "out.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ChatServer("local", judge_dir=judge_dir, model="susceptible", log_path=tmp_path / "server.log") as server:
        proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out", str(out),
                               "--metrics", "fleur", "--judge-base-url", server.base_url, "--judge-api-model",
                               "susceptible", "--judge-top-logprobs-cap", "20", "--no-progress"],
                              capture_output=True, text=True, timeout=600)
        served = server.stats()["chat_requests"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert served >= len(rows)  # the server answered: no local judge was loaded instead
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    local = FLEUR(model=LocalJudge(str(judge_dir), device="cpu")).score(captions, images)
    assert torch.isfinite(local.score).all()
    for k in range(len(rows)):
        row = got[f"r{k}"]
        assert row["fleur/raw"] == local.raw[k]
        if row["fleur"] is not None:  # every digit the score weighs among the server's 20: the exact score
            assert abs(row["fleur"] - float(local.score[k])) <= 1e-5
        else:  # this judge spreads its digits past the top 20: no score rather than a partial one, with why
            assert "missing from the top-20 alternatives" in row["errors"]["fleur"]
    settings = json.loads((tmp_path / "out.jsonl.settings.json").read_text())["settings"]
    assert settings["judge_base_url"] == server.base_url and settings["judge_api_model"] == "susceptible"
    assert settings["judge_top_logprobs_cap"] == 20 and "judge_model" not in settings
