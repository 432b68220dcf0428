"""capreward inside veRL's own reward loop (verl 0.9.1, installed by ``scripts/bootstrap.sh --test``).

veRL's trainer (``verl.trainer.main_ppo``) computes rewards in ``RewardLoopWorker``s: each loads its
reward manager from the composed Hydra config (``load_reward_manager``) and scores a chunk of the
batch with ``compute_score_batch``, one ``run_single`` task per sample; ``RewardLoopManager`` then
stacks every sample's ``reward_extra_info`` under the keys of the first sample. These tests compose
veRL's own ``ppo_trainer`` config with exactly the overrides docs/integrations/verl.md gives, build the worker as
veRL does and score a batch (a sample with references, one without, one with a missing file):

- the built-in ``naive`` manager calling ``capreward.adapters.verl.compute_score``;
- :class:`capreward.adapters.verl_manager.CaprewardRewardManager`, loaded by veRL through
  ``reward.reward_manager.source=importlib``, which scores the chunk in one batch.

Both must give the values of the reward called directly (the fallback for the unscorable sample), with
one ``reward_extra_info`` key set for every sample. One more test runs veRL's
``RewardLoopManager.compute_rm_score`` with its Ray worker actor (the trainer's own path, including
the key stacking) for the batch manager.
"""

from __future__ import annotations

import asyncio
import math
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

import capreward.adapters.verl as capreward_verl
from capreward.rewards import CLIPScoreReward

pytestmark = pytest.mark.integration

verl = pytest.importorskip("verl", reason="verl is installed by scripts/bootstrap.sh --test")

# the veRL configuration of docs/integrations/verl.md, verbatim (test_docs_give_exactly_these_overrides checks it)
NAIVE_OVERRIDES = [
    "reward.custom_reward_function.path=pkg://capreward.adapters.verl",
    "reward.custom_reward_function.name=compute_score",
]
BATCH_OVERRIDES = [
    "reward.reward_manager.source=importlib",
    "reward.reward_manager.module.path=pkg://capreward.adapters.verl_manager",
    "reward.reward_manager.name=CaprewardRewardManager",
]
SAMPLES = [  # (response, ground_truth, extra_info)
    ("a red image of the colour red", ["a red image", "a photo of red"], {"image": "red.png"}),
    ("a blue image", None, {"image": "blue.png"}),
    ("a red image", ["a red image"], {"image": "red.png"}),
    ("a green image", None, {"image": "missing.png"}),
]
FALLBACK = -0.25


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl_media")
    for name, rgb in (("red", (215, 30, 35)), ("blue", (35, 70, 215))):
        pixels = np.clip(np.array(rgb) + np.random.default_rng(1).normal(0, 10, (32, 32, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"{name}.png")
    return root


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The policy's tokenizer, saved where veRL's config points (actor_rollout_ref.model.path)."""
    from capreward.testing import build_tiny_tokenizer

    words = ("a", "an", "the", "of", "image", "photo", "colour", "red", "blue", "green")
    path = tmp_path_factory.mktemp("policy")
    build_tiny_tokenizer(words).save_pretrained(path)
    return path


@pytest.fixture
def capreward_env(monkeypatch, tiny_clip_path, media):
    for key, value in {"CAPREWARD_REWARD": "clipscore", "CAPREWARD_CLIP_MODEL": str(tiny_clip_path),
                       "CAPREWARD_MEDIA_ROOT": str(media), "CAPREWARD_FALLBACK": str(FALLBACK),
                       "CAPREWARD_RETURN_DICT": "1", "CAPREWARD_SUBSCORES": "clip_s,ref_similarity"}.items():
        monkeypatch.setenv(key, value)
    capreward_verl.reset_default_scorer()
    yield
    capreward_verl.reset_default_scorer()


def verl_config(tokenizer_dir, overrides):
    """veRL's own ppo_trainer config, composed by Hydra with ``overrides``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            *overrides, f"actor_rollout_ref.model.path={tokenizer_dir}", "reward.num_workers=1"])


def data_proto(tokenizer_dir, samples):
    """A rollout batch as veRL's reward loop receives it: prompt and response token ids with the
    attention mask, and per sample data_source, reward_model.ground_truth and extra_info."""
    from transformers import AutoTokenizer
    from verl import DataProto

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    width = 16
    prompts = torch.full((len(samples), 4), tok.pad_token_id)
    responses = torch.full((len(samples), width), tok.pad_token_id)
    mask = torch.zeros((len(samples), 4 + width), dtype=torch.long)
    mask[:, :4] = 1
    for i, (text, _, _) in enumerate(samples):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        responses[i, :len(ids)] = torch.tensor(ids)
        mask[i, 4:4 + len(ids)] = 1
    non_tensors = {
        "data_source": np.array(["capreward"] * len(samples), dtype=object),
        "reward_model": np.array([{"ground_truth": gt, "style": "rule"} for _, gt, _ in samples], dtype=object),
        "extra_info": np.array([dict(info) for _, _, info in samples], dtype=object),
    }
    return DataProto.from_dict(tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
                               non_tensors=non_tensors)


def run_worker(config, data):
    """veRL's RewardLoopWorker, built in process as a Ray actor builds it, scoring ``data``."""
    from verl.experimental.reward_loop import RewardLoopWorker

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = RewardLoopWorker(config)
        return worker, loop.run_until_complete(worker.compute_score_batch(data))
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def expected_rows(tiny_clip_path, media):
    reward = CLIPScoreReward(model=str(tiny_clip_path))
    scored = reward.compute(None, [s[0] for s in SAMPLES[:3]], image=[str(media / s[2]["image"]) for s in SAMPLES[:3]],
                            references=[s[1] for s in SAMPLES[:3]])
    rows = [{"score": v, "unscored": 0.0, "clip_s": scored.metrics["clip_s"][i],
             "ref_similarity": scored.metrics["ref_similarity"][i]} for i, v in enumerate(scored.values)]
    rows[1]["ref_similarity"] = math.nan  # no references: NaN in dict mode, as the server answers
    return rows + [{"score": FALLBACK, "unscored": 1.0, "clip_s": math.nan, "ref_similarity": math.nan}]


def check(outputs, rows):
    assert [set(o["reward_extra_info"]) for o in outputs] == [set(rows[0])] * len(rows)
    assert [o["reward_score"] for o in outputs] == pytest.approx([r["score"] for r in rows], abs=1e-6)
    for out, row in zip(outputs, rows):
        assert out["reward_extra_info"] == pytest.approx(row, abs=1e-6, nan_ok=True)


def test_naive_manager_calls_compute_score(capreward_env, tiny_clip_path, media, tokenizer_dir):
    config = verl_config(tokenizer_dir, NAIVE_OVERRIDES)
    worker, outputs = run_worker(config, data_proto(tokenizer_dir, SAMPLES))
    assert type(worker.reward_manager).__name__ == "NaiveRewardManager"
    check(outputs, expected_rows(tiny_clip_path, media))


def test_capreward_batch_manager_scores_the_chunk_together(capreward_env, tiny_clip_path, media, tokenizer_dir):
    config = verl_config(tokenizer_dir, BATCH_OVERRIDES)
    worker, outputs = run_worker(config, data_proto(tokenizer_dir, SAMPLES))
    manager = worker.reward_manager
    assert type(manager).__name__ == "CaprewardRewardManager"
    check(outputs, expected_rows(tiny_clip_path, media))
    # every task reached the manager before its batch closed (they start in one loop iteration)
    assert manager.batches == 1


def test_batch_manager_results_do_not_depend_on_the_batch(capreward_env, tiny_clip_path, media, tokenizer_dir):
    """Samples scored alone (batches of one) equal the same samples scored together, in any order."""
    config = verl_config(tokenizer_dir, [*BATCH_OVERRIDES])
    _, together = run_worker(config, data_proto(tokenizer_dir, SAMPLES))
    alone = [run_worker(config, data_proto(tokenizer_dir, [s]))[1][0] for s in SAMPLES]
    _, reversed_ = run_worker(config, data_proto(tokenizer_dir, SAMPLES[::-1]))
    for a, b, c in zip(together, alone, reversed_[::-1]):
        assert a["reward_extra_info"] == pytest.approx(b["reward_extra_info"], abs=1e-6, nan_ok=True)
        assert a["reward_extra_info"] == pytest.approx(c["reward_extra_info"], abs=1e-6, nan_ok=True)


@pytest.mark.slow
def test_reward_loop_manager_with_its_ray_worker(capreward_env, tiny_clip_path, media, tokenizer_dir):
    """veRL's RewardLoopManager: a Ray RewardLoopWorker actor (the CAPREWARD_* environment reaches
    it through Ray's runtime env), rm_scores at each response's last token, and the extra infos
    stacked per key, as the trainer receives them."""
    import ray
    from verl.experimental.reward_loop import RewardLoopManager

    env = {k: v for k, v in os.environ.items() if k.startswith("CAPREWARD_")}
    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)
    try:
        config = verl_config(tokenizer_dir, BATCH_OVERRIDES)
        data = data_proto(tokenizer_dir, SAMPLES)
        out = RewardLoopManager(config).compute_rm_score(data)
    finally:
        ray.shutdown()
    rows = expected_rows(tiny_clip_path, media)
    last = data.batch["attention_mask"][:, 4:].sum(dim=1) - 1
    scores = out.batch["rm_scores"][torch.arange(len(SAMPLES)), last]
    assert scores.tolist() == pytest.approx([r["score"] for r in rows], abs=1e-6)
    assert out.batch["rm_scores"].sum(dim=1).tolist() == pytest.approx([r["score"] for r in rows], abs=1e-6)
    assert sorted(out.meta_info["reward_extra_keys"]) == sorted(rows[0])
    for key in rows[0]:
        assert out.non_tensor_batch[key].tolist() == pytest.approx([r[key] for r in rows], abs=1e-6, nan_ok=True)


def test_docs_give_exactly_these_overrides():
    from conftest import REPO

    text = (REPO / "docs" / "integrations" / "verl.md").read_text()
    for line in [*NAIVE_OVERRIDES, *BATCH_OVERRIDES]:
        assert re.search(rf"^\s+{re.escape(line)}( \\)?$", text, flags=re.M), line
