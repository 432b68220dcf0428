"""TRL's own trainers with capreward rewards: GRPOTrainer, RLOOTrainer and the experimental
OnlineDPOTrainer each run two real optimisation steps on the tiny LLaVA policy (conversational prompts,
an image column) with CLIP-S on the tiny CLIP as the reward, synchronous and ``as_async()``.

What is checked against the trainers' own logs: every step calls the rewards once with the whole
generation batch and one value per completion; the values TRL logs are the means of what the rewards
returned; the async form is awaited by the trainer (its column equals the synchronous one, step by
step) and named like the reward. TRL detects async rewards with ``inspect.iscoroutinefunction``
(trl < 1.14) or ``is_async_callable`` (later): both must see ``as_async()`` as a coroutine function.
OnlineDPOTrainer calls its rewards synchronously: the README says so, and the last test keeps that
true (it fails, telling to update the README, once OnlineDPOTrainer awaits async rewards).
"""

from __future__ import annotations

import inspect
import math
import pickle

import pytest
from PIL import Image

from capreward.rewards import CLIPScoreReward
from reward_recording import Recording, nanmean

pytestmark = pytest.mark.integration

WORDS = ("a", "an", "the", "of", "image", "photo", "red", "green", "blue", "yellow", "Describe", "describe")
COLOURS = {"red": (215, 30, 35), "green": (35, 165, 50), "blue": (35, 70, 215), "yellow": (240, 215, 35)}


@pytest.fixture(scope="module")
def clip_model(tiny_clip_path):
    return str(tiny_clip_path)


@pytest.fixture(scope="module")
def dataset():
    """Four conversational rows with a PIL image each (TRL inserts the image into the user turn)."""
    import numpy as np
    from datasets import Dataset, Features, Image as ImageFeature, List, Value

    rng = np.random.default_rng(0)
    rows = []
    for colour, rgb in COLOURS.items():
        pixels = np.clip(np.array(rgb) + rng.normal(0, 10, (32, 32, 3)), 0, 255).astype(np.uint8)
        rows.append({"prompt": [{"role": "user", "content": "Describe the image"}], "image": Image.fromarray(pixels)})
    features = Features({"prompt": List({"role": Value("string"), "content": Value("string")}), "image": ImageFeature()})
    return Dataset.from_list(rows, features=features)


def policy():
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=0))
    return model.train(), processor


COMMON = dict(max_steps=2, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], seed=0,
              use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, per_device_train_batch_size=4)


def step_logs(trainer, key):
    return [h for h in trainer.state.log_history if key in h]


# ------------------------------------------------------------------------------ async detection
def test_as_async_is_a_coroutine_function_for_every_trl(clip_model):
    reward = CLIPScoreReward(model=clip_model)
    async_reward = reward.as_async()
    assert inspect.iscoroutinefunction(async_reward)  # trl < 1.14
    from trl.trainer import utils as trl_utils

    if hasattr(trl_utils, "is_async_callable"):  # trl >= 1.14
        assert trl_utils.is_async_callable(async_reward)
    assert getattr(trl_utils, "get_callable_name", lambda f: f.__name__)(async_reward) == "clip_s"
    assert async_reward.__name__ == "clip_s"
    assert list(inspect.signature(async_reward).parameters) == ["prompts", "completions", "completion_ids", "kwargs"]
    clone = pickle.loads(pickle.dumps(async_reward))  # AsyncGRPOTrainer pickles rewards into its worker
    assert inspect.iscoroutinefunction(clone) and clone.__name__ == "clip_s"


# ------------------------------------------------------------------------------ GRPO and RLOO
def run_group_trainer(kind, clip_model, dataset, tmp_path):
    """Two steps of GRPOTrainer or RLOOTrainer with a recorded synchronous CLIP-S and the async form
    of a second CLIP-S reward (another name, the same model): both score the same completions."""
    sync = Recording(CLIPScoreReward(model=clip_model))
    async_reward = CLIPScoreReward(model=clip_model, name="clipscore_async").as_async()
    model, processor = policy()
    # beta=0: no reference model (RLOO would otherwise rebuild one from the hub id in the model's config)
    args = dict(COMMON, output_dir=str(tmp_path), num_generations=2, max_completion_length=6, beta=0.0)
    if kind == "grpo":
        from trl import GRPOConfig as Config, GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config, RLOOTrainer as Trainer
    trainer = Trainer(model=model, reward_funcs=[sync, async_reward], args=Config(**args), train_dataset=dataset,
                      processing_class=processor)
    trainer.train()
    return trainer, sync


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_group_trainer_two_steps_with_sync_and_async_rewards(kind, clip_model, dataset, tmp_path):
    trainer, sync = run_group_trainer(kind, clip_model, dataset, tmp_path)
    logs = step_logs(trainer, "rewards/clip_s/mean")
    assert [h["step"] for h in logs] == [1, 2]
    # one call per step with the whole generation batch: 2 prompts x 2 generations
    assert [c["n"] for c in sync.calls] == [4, 4]
    assert all(None not in c["values"] and len(c["values"]) == c["n"] for c in sync.calls)
    assert [h["rewards/clip_s/mean"] for h in logs] == pytest.approx([nanmean(c["values"]) for c in sync.calls], abs=1e-5)
    # the async reward was awaited on the same completions: its logged means equal the sync ones
    assert [h["rewards/clipscore_async/mean"] for h in logs] == pytest.approx(
        [h["rewards/clip_s/mean"] for h in logs], abs=1e-5)
    assert all(math.isfinite(h["reward"]) for h in logs)
    assert any(len(set(round(v, 6) for v in c["values"])) > 1 for c in sync.calls)  # real, differing scores


# ------------------------------------------------------------------------------ OnlineDPO
def online_dpo(clip_model, dataset, tmp_path, reward):
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    model, processor = policy()
    # the random tiny policy can sample the image token, which generate() then counts as one image
    # slot too many; OnlineDPOTrainer passes generation_kwargs to generate()
    args = OnlineDPOConfig(**dict(COMMON, per_device_train_batch_size=2), output_dir=str(tmp_path),
                           max_new_tokens=6, max_length=256,
                           generation_kwargs={"suppress_tokens": [model.config.image_token_id]})
    return OnlineDPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset,
                            processing_class=processor)


def test_online_dpo_two_steps_with_a_sync_reward(clip_model, dataset, tmp_path):
    sync = Recording(CLIPScoreReward(model=clip_model))
    trainer = online_dpo(clip_model, dataset, tmp_path, sync)
    trainer.train()
    logs = step_logs(trainer, "objective/scores")
    assert [h["step"] for h in logs] == [1, 2]
    # each step scores two completions per prompt (chosen and rejected are picked by the reward)
    assert [c["n"] for c in sync.calls] == [4, 4]
    assert all(None not in c["values"] for c in sync.calls)
    assert [h["objective/scores"] for h in logs] == pytest.approx([nanmean(c["values"]) for c in sync.calls], abs=1e-5)


def test_online_dpo_calls_rewards_synchronously_as_the_readme_says(clip_model, dataset, tmp_path):
    """The README tells OnlineDPOTrainer users to pass the reward itself, not ``as_async()``: this
    trainer does not await rewards. If a TRL release starts awaiting them, this test fails; then
    update the README's list of trainers that take async rewards."""
    trainer = online_dpo(clip_model, dataset, tmp_path, CLIPScoreReward(model=clip_model).as_async())
    with pytest.warns(RuntimeWarning, match="never awaited"), pytest.raises(TypeError, match="coroutine"):
        trainer.train()
