"""The claim and QA rewards at every entry point: the reward server (a real HTTP server on 127.0.0.1),
veRL's compute_score, ``capreward score``'s runners (and its CLI), each giving the scorer's own numbers,
and a real TRL GRPO run with both rewards logging their parts."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading

import pytest
import torch
from PIL import Image

from capreward import registry
from capreward.adapters.factory import RewardOptions, build_reward
from capreward.judges import LocalChatJudge
from capreward.scorers.claims import ClaimScorer
from capreward.scorers.qa_utility import QAUtility
from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge, tiny_claim_judge_dir
from capreward.testing.tiny_qa_judge import colour_questions, qa_backend, tiny_qa_judge_dir
from fixtures_llava import one_torch_thread  # noqa: F401

#: the third: a claim in another script is a claim (round 4: it was free over HTTP and through veRL)
CAPTIONS = ["the background is red. there is a green patch.", "the background is red. a blue ball.",
            "the background is red. 背景是蓝色的。"]
REFS = ["the background is red and there is a green patch."]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims-media")
    claim_image("red", "green", random.Random("entry")).save(root / "im.png")
    return root


@pytest.fixture(scope="module")
def expected(media):
    image = Image.open(media / "im.png").convert("RGB")
    n = len(CAPTIONS)
    return ClaimScorer(LocalChatJudge(tiny_claim_judge())).score(CAPTIONS, images=[image] * n, references=[REFS] * n)


def test_names_are_accepted_where_metric_names_are_read():
    from capreward.adapters.factory import canonical_name
    from capreward.jobs.runners import ScoreOptions

    assert canonical_name("claims") == "claims" and canonical_name("QA-utility") == "qa_utility"
    assert ScoreOptions(metrics=["claim", "qa_utility"]).metrics == ["claims", "qa_utility"]
    assert registry.get("caprl").name == "qa_utility"


def test_verl_compute_score_gives_the_scorer_numbers(media, expected):
    from capreward.adapters.verl import make_compute_score

    reward = build_reward("claims", RewardOptions(judge_model=str(tiny_claim_judge_dir())))
    verl = make_compute_score(reward, return_dict=True, subscores=["precision", "recall"])
    n = len(CAPTIONS)
    out = verl.batch(["toy"] * n, CAPTIONS, [REFS] * n, [{"image": str(media / "im.png")}] * n)
    assert [o["score"] for o in out] == pytest.approx(expected.score.tolist(), abs=1e-6)
    assert expected.precision[2] < expected.precision[0]  # the claim in Chinese is judged, not free
    assert [o["precision"] for o in out] == pytest.approx(expected.precision.tolist(), abs=1e-6)
    assert [o["recall"] for o in out] == pytest.approx(expected.recall.tolist(), abs=1e-6)


def test_the_reward_server_answers_the_scorer_numbers(media, expected):
    from capreward.server.http import make_server, post_json

    reward = build_reward("claims", RewardOptions(judge_model=str(tiny_claim_judge_dir())))
    server = make_server(reward, media_root=str(media))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        prompt = "USER: describe ASSISTANT:"
        status, body = post_json(f"{server.url}/get_reward", {
            "query": [prompt + c for c in CAPTIONS], "prompts": [prompt] * len(CAPTIONS),
            "labels": [{"image": "im.png", "references": REFS}] * len(CAPTIONS)})
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    assert body["rewards"] == pytest.approx(expected.score.tolist(), abs=1e-6)
    assert any("precision" in k for k in body["extra_logs"])


def test_score_runners_write_the_spec_fields(media, expected):
    from capreward.jobs.manifest import ManifestRow
    from capreward.jobs.runners import ManifestScorer, ScoreOptions

    rows = [ManifestRow("a", CAPTIONS[0], "image", str(media / "im.png"), REFS, {"questions": colour_questions("red")}),
            ManifestRow("b", CAPTIONS[1], "image", str(media / "im.png"), None, {"questions": colour_questions("red")})]
    options = ScoreOptions(metrics=["claims", "qa_utility"], judge_model=str(tiny_claim_judge_dir()),
                           qa_model=str(tiny_qa_judge_dir()))
    out = ManifestScorer(options).score_rows(rows)
    assert out[0]["claims"] == pytest.approx(expected.score[0], abs=1e-6)
    for row, refs in zip(out, (True, False)):
        for metric in ("claims", "qa_utility"):
            written = {k for k in row if k == metric or k.startswith(metric + "/")}
            assert written == set(registry.get(metric).fields({"references": refs, "visual": "image"})), metric
    qa = QAUtility(qa_backend()).score(CAPTIONS[:1], questions=[colour_questions("red")])
    assert out[0]["qa_utility"] == pytest.approx(qa.score[0], abs=1e-6)
    assert [c["text"] for c in out[0]["claims/claims"]] == ["the background is red", "there is a green patch"]


def test_capreward_score_cli_runs_claims(media, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"id": str(i), "caption": c, "image": str(media / "im.png")})
                                  for i, c in enumerate(CAPTIONS)))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--metrics", "claims",
           "--judge-model", str(tiny_claim_judge_dir()), "--out", str(out), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["claims"] > rows[1]["claims"]  # the hallucinated blue ball costs precision
    assert rows[1]["claims/n_claims"] == 2


def test_the_length_guard_follows_the_target_and_the_parts_split(media):
    from capreward.recipes.dense import LengthGuardReward, aggregation_args, dense_rewards

    guard = LengthGuardReward()
    refs = [["a red image with a green patch"]]  # 7 words: ceil(1.5 * 7) = 11 words free
    ten, fifteen = " ".join(["red"] + ["patch"] * 9) + ".", " ".join(f"w{k}" for k in range(15)) + "."
    out = guard.compute(None, [ten, fifteen], references=refs * 2)
    assert out.metrics["guard/length"] == [0.0, pytest.approx(-4 / 11)]
    funcs, weights = dense_rewards(LocalChatJudge(tiny_claim_judge()), coverage="lexical")
    image = Image.open(media / "im.png").convert("RGB")
    n = len(CAPTIONS)
    values = [f.compute(None, CAPTIONS, image=[image] * n, references=[REFS] * n).values for f in funcs[:2]]
    direct = ClaimScorer(LocalChatJudge(tiny_claim_judge()), coverage="lexical").score(
        CAPTIONS, images=[image] * n, references=[REFS] * n)
    assert values[0] == pytest.approx(direct.precision.tolist()) and values[1] == pytest.approx(direct.recall.tolist())
    assert funcs[0].scorer is funcs[1].scorer and weights == [1.0, 1.0, 0.5]
    assert aggregation_args() == {"multi_objective_aggregation": "normalize_then_sum"}


@pytest.mark.integration
def test_grpo_trains_a_tiny_captioner_with_both_rewards_logging_their_parts(tmp_path):
    """Two real GRPOTrainer steps of a tiny LLaVA policy with the dense configuration (claim precision,
    claim recall, the target-conditioned length guard, normalised apart) and QA utility."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from capreward.recipes.dense import aggregation_args, dense_rewards
    from capreward.rewards.claims import ClaimsReward
    from capreward.rewards.qa_utility import QAUtilityReward
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    words = ("a", "the", "is", "background", "patch", "there", "red", "green", "blue", "yellow", "ball", "Describe", "image")
    model, processor = build_tiny_llava(TinyLlavaSpec(words=words, seed=0))
    rows = [{"prompt": [{"role": "user", "content": "Describe the image"}],
             "image": claim_image(b, p, random.Random(f"grpo{b}")), "references": [f"the background is {b}."],
             "questions": json.dumps(colour_questions(b))}
            for b, p in (("red", "green"), ("blue", "yellow"))]
    dense, weights = dense_rewards(LocalChatJudge(tiny_claim_judge()), coverage="lexical")
    claims = ClaimsReward(scorer=dense[0].scorer)  # the F-score too, on the same scorer (cached verdicts)
    qa = QAUtilityReward(scorer=QAUtility(qa_backend()))
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                      report_to=[], seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                      per_device_train_batch_size=4, num_generations=2, max_completion_length=8, beta=0.0,
                      reward_weights=weights + [1.0, 1.0], **aggregation_args())
    trainer = GRPOTrainer(model=model.train(), reward_funcs=dense + [claims, qa], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=processor)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rewards/claims/mean" in h]
    assert [h["step"] for h in logs] == [1, 2]
    for key in ("rewards/claims_precision/mean", "rewards/claims_recall/mean", "rewards/length/mean",
                "rewards/claims/precision", "rewards/claims/n_claims", "rewards/qa_utility/n_questions"):
        assert any(key in h for h in logs), key


def test_a_resume_records_the_judges_of_claims_and_qa_utility(tmp_path):
    from capreward.jobs.runners import ScoreOptions
    from capreward.jobs.settings_file import model_identity, scoring_settings

    judge = str(tiny_claim_judge_dir())
    claims = scoring_settings(ScoreOptions(metrics=["claims"], judge_model=judge))
    assert claims["judge_model"] == model_identity(judge) and "judge_dtype" in claims
    remote = scoring_settings(ScoreOptions(metrics=["claims"], judge_base_url="http://127.0.0.1:8000/v1"))
    assert remote["judge_base_url"] == "http://127.0.0.1:8000/v1" and "judge_model" not in remote
    qa = scoring_settings(ScoreOptions(metrics=["qa_utility"], qa_model=str(tiny_qa_judge_dir()), judge_model=judge))
    assert qa["qa_model"] == model_identity(str(tiny_qa_judge_dir())) and qa["judge_model"] == model_identity(judge)


def test_the_grpo_recipe_builds_claims_and_qa_utility_on_the_tiny_judges():
    from capreward.recipes.grpo_captioner import build_parser, build_rewards, parse_rewards

    args = build_parser().parse_args(["--tiny", "--rewards", "claims:1,qa_utility:0.5"])
    args.reward_list = parse_rewards(args.rewards)
    funcs, weights = build_rewards(args)
    assert [f.__name__ for f in funcs] == ["claims", "qa_utility"] and weights == [1.0, 0.5]
    image = claim_image("red", "green", random.Random("recipe"))
    assert funcs[0](None, [CAPTIONS[0]], image=[image])[0] > funcs[0](None, [CAPTIONS[1]], image=[image])[0]
