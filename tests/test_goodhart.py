"""The Goodhart monitor (capreward.callbacks.goodhart): per-step means computed by hand, the verdict's
windows, the watched TRL reward returning exactly the reward's values, and the callbacks inside a real
transformers Trainer and a real Lightning Trainer."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch

from capreward.callbacks.goodhart import GoodhartCallback, GoodhartMonitor, GoodhartWarning


def contains_red(prompts, completions, **kwargs):
    return [float("red" in c) for c in completions]


def test_step_means_gap_and_verdict_by_hand():
    messages = []
    m = GoodhartMonitor({"truth": contains_red}, window=2, min_rise=0.1, warn=messages.append)
    # step 1 in two batches (sizes 2 and 1): sample-weighted means, None left out of the training mean
    m.observe([0.0, None], None, ["red", "red"])
    m.observe([0.3], None, ["blue"])
    logs = m.flush(step=1)
    assert logs == {"goodhart/train": pytest.approx(0.1), "goodhart/truth": pytest.approx(2 / 3),
                    "goodhart/gap/truth": pytest.approx(0.1 - 2 / 3)}
    # (the first batch's training mean is 0.0 over its one scored value, weighted by its 2 samples)
    for step, (train, captions) in enumerate([(0.2, ["red", "red"]), (0.8, ["blue", "red"]), (1.0, ["blue", "blue"])], 2):
        m.observe([train, train], None, captions)
        m.flush(step)
    assert [r["train"] for r in m.rows] == pytest.approx([0.1, 0.2, 0.8, 1.0])
    assert [r["truth"] for r in m.rows] == pytest.approx([2 / 3, 1.0, 0.5, 0.0])
    # first window (steps 1-2): train 0.15, truth 5/6; latest (3-4): train 0.9, truth 0.25
    assert m.changes() == {"train": pytest.approx((0.15, 0.9)), "truth": pytest.approx((5 / 6, 0.25))}
    assert messages == ["Goodhart: the training reward rose 0.150 -> 0.900 over steps 1-2 -> 3-4 while truth fell 0.833 -> 0.250"]
    # still bad at the next step: not repeated; a good verdict re-arms the warning
    m.observe([1.0], None, ["blue"]); m.flush(5)
    assert len(messages) == 1
    m.rows[2:] = [dict(r, truth=1.0) for r in m.rows[2:]]
    assert m.verdict() is None
    m.observe([1.0], None, ["red"]); m.flush(6)
    m.observe([1.0, 1.0], None, ["blue", "blue"]); m.flush(7)
    assert len(messages) == 2


def test_no_verdict_before_two_windows_or_when_the_judge_follows():
    m = GoodhartMonitor({"truth": contains_red}, window=3, warn=pytest.fail)
    for i in range(6):  # the reward rises and so does the truth
        m.observe([i / 5], None, ["red" if i >= 3 else "blue"])
        m.flush()
        assert (m.verdict() is None) and (m.changes() is None) == (i < 5)
    # the reward does not rise by min_rise: no verdict however the judge moves
    flat = GoodhartMonitor({"truth": contains_red}, window=1, min_rise=0.5, warn=pytest.fail)
    for reward, caption in ((0.0, "red"), (0.4, "blue")):
        flat.observe([reward], None, [caption]); flat.flush()
    assert flat.verdict() is None and flat.changes()["truth"] == (1.0, 0.0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one"):
        GoodhartMonitor({})
    with pytest.raises(ValueError, match="reserved"):
        GoodhartMonitor({"train": contains_red})
    m = GoodhartMonitor({"t": contains_red})
    with pytest.raises(ValueError, match="1 training rewards for 2"):  # the caller's error, not a judge's
        m.observe([0.0], None, ["a", "b"])
    assert m.flush() == {}  # nothing observed: nothing logged
    assert math.isnan(GoodhartMonitor({"t": contains_red}).observe([None], None, ["red"])["train"])


def _raises(prompts, completions, **kwargs):
    raise RuntimeError("judge server down")


MALFORMED = {
    "short": lambda prompts, completions, **k: [1.0],
    "text": lambda prompts, completions, **k: "0.5",
    "strings": lambda prompts, completions, **k: ["0.5"] * len(completions),
    "dict": lambda prompts, completions, **k: {"score": 1.0},
    "raises": _raises,
    "positional_only": lambda p, c, **k: [1.0] * len(c),  # not TRL's contract: called by keyword, it fails
}


def test_a_failing_or_malformed_judge_is_logged_and_its_row_left_empty(caplog):
    """The observer never stops training: each bad judge's entry is NaN (left out of the means), the good
    judge beside it is kept, each failure is counted and logged once with the judge's name and reason,
    and an empty judge raises no Goodhart alarm."""
    messages = []
    m = GoodhartMonitor({**MALFORMED, "truth": contains_red}, window=1, warn=messages.append)
    with caplog.at_level("WARNING", logger="capreward.callbacks.goodhart"):
        for step, (reward, captions) in enumerate([(0.0, ["red", "red"]), (1.0, ["red", "blue"])], 1):
            row = m.observe([reward] * 2, None, captions)
            assert all(math.isnan(row[name]) for name in MALFORMED) and row["truth"] == 1.0 / step
            logs = m.flush(step)
            assert all(math.isnan(logs[f"goodhart/{name}"]) for name in MALFORMED)
    assert m.failures == {name: 2 for name in MALFORMED}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == len(MALFORMED)  # the first failure of each judge (then every 100th)
    assert any("'raises' failed" in x and "RuntimeError: judge server down" in x for x in logged)
    assert any("'short' failed" in x and "returned 1 values for 2 completions" in x for x in logged)
    assert any("'strings' failed" in x and "value 0 is not a number: str" in x for x in logged)
    assert any("'positional_only' failed" in x and "TypeError" in x for x in logged)
    # only the working judge can raise the alarm: truth fell 1.0 -> 0.5 while the reward rose
    assert messages == ["Goodhart: the training reward rose 0.000 -> 1.000 over steps 1 -> 2 while truth fell 1.000 -> 0.500"]
    assert m.verdict() == messages[0]


def test_watched_reward_returns_the_rewards_values_and_judges_see_the_same_samples():
    seen = []

    def judge(prompts, completions, colour, **kwargs):
        seen.append((prompts, completions, colour, sorted(kwargs)))
        return [1.0] * len(completions)

    def reward(prompts, completions, **kwargs):  # TRL's contract, no completion_ids parameter of its own
        return [len(c[0]["content"]) / 10 if c[0]["content"] else None for c in completions]

    reward.__name__ = "my_reward"
    m = GoodhartMonitor({"judge": judge})
    watched = m.watch(reward)
    completions = [[{"role": "assistant", "content": "a red image"}], [{"role": "assistant", "content": ""}]]
    # as TRL calls it: everything by keyword, completion_ids included
    assert watched(prompts=["p1", "p2"], completions=completions, completion_ids=[[5], []], colour=["red", "blue"]) == [1.1, None]
    assert watched.__name__ == "my_reward"
    # conversational completions as text; the judge gets the same keywords (completion_ids among the columns)
    assert seen == [(["p1", "p2"], ["a red image", ""], ["red", "blue"], ["completion_ids"])]
    assert m.flush(3) == {"goodhart/train": pytest.approx(1.1), "goodhart/judge": 1.0, "goodhart/gap/judge": pytest.approx(0.1)}
    # positional calls (a custom loop) are forwarded as they came
    assert m.watch(lambda prompts, completions, completion_ids=None, **k: [0.5] * len(completions))(
        ["p"], ["a red image"], None, colour=["red"]) == [0.5]
    assert m.flush(4)["goodhart/train"] == 0.5 and m.failures == {}


def test_a_reward_that_returns_garbage_is_returned_as_is_and_the_observer_logs_it(caplog):
    """What the training reward returns is the trainer's business (TRL raises its own error for a wrong
    count): the watched reward returns it unchanged and the monitor only logs that it could not observe."""
    m = GoodhartMonitor({"truth": contains_red})
    watched = m.watch(lambda prompts, completions, **k: [1.0])
    with caplog.at_level("WARNING", logger="capreward.callbacks.goodhart"):
        assert watched(prompts=["p", "q"], completions=["red", "blue"]) == [1.0]
    assert m.failures == {"watch": 1} and "1 training rewards for 2 completions" in caplog.text


def test_an_async_reward_is_watched_by_an_async_function():
    import asyncio

    from trl.trainer import utils as trl_utils

    async def reward(prompts, completions, **kwargs):
        return [0.25] * len(completions)

    m = GoodhartMonitor({"truth": contains_red})
    watched = m.watch(reward)
    assert getattr(trl_utils, "is_async_callable", inspect.iscoroutinefunction)(watched)
    assert asyncio.run(watched(prompts=["p"], completions=["red"], completion_ids=[[1]])) == [0.25]
    assert m.flush(1) == {"goodhart/train": 0.25, "goodhart/truth": 1.0, "goodhart/gap/truth": -0.75}


@pytest.mark.integration
def test_trl_grpo_trainer_runs_with_plain_trl_rewards_and_failing_judges(tmp_path):
    """TRL's own GRPOTrainer, two steps on the tiny LLaVA policy: a plain TRL reward
    ``def f(prompts, completions, **kwargs)`` and an async one, both watched; held-out judges that raise or
    return malformed values are logged and left empty while the working judge is logged beside the reward,
    and training completes."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from capreward.rewards import completion_text
    from capreward.testing import TinyLlavaSpec, build_tiny_llava
    from capreward.testing.colour_task import WORDS, colour_rows

    def length(prompts, completions, **kwargs):
        return [float(len(completion_text(c))) for c in completions]

    async def has_a(prompts, completions, **kwargs):
        return [float("a" in completion_text(c)) for c in completions]

    def words(prompts, completions, colour, **kwargs):
        assert "trainer_state" in kwargs and len(colour) == len(completions)
        return [float(len(c.split())) for c in completions]

    monitor = GoodhartMonitor({"words": words, **MALFORMED}, window=1)
    callback = GoodhartCallback(monitor)
    torch.manual_seed(0)
    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=0))
    rows = colour_rows(4, 0)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Describe the image"}], "image": r["image"],
                                  "colour": r["colour"]} for r in rows])
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                      report_to=[], seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                      per_device_train_batch_size=4, num_generations=2, max_completion_length=4, beta=0.0)
    trainer = GRPOTrainer(model=model.train(), reward_funcs=[monitor.watch(length), monitor.watch(has_a)], args=args,
                          train_dataset=dataset, processing_class=processor, callbacks=[callback])
    callback.install(trainer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "goodhart/train" in h]
    assert [h["step"] for h in logs] == [1, 2]
    assert all(math.isfinite(h["goodhart/words"]) and math.isnan(h["goodhart/raises"]) for h in logs)
    # both rewards were observed each step (two batches per step), and their values are TRL's own
    assert all(h["goodhart/train"] == pytest.approx((h["rewards/length/mean"] + h["rewards/has_a/mean"]) / 2, abs=1e-4)
               for h in logs)
    assert monitor.failures == {name: 4 for name in MALFORMED}


class _Rising(torch.nn.Module):
    """A model for transformers' Trainer whose loss is a parameter's square (anything trains)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x=None, labels=None):
        return {"loss": (self.w * x.mean()) ** 2}


def test_transformers_trainer_logs_beside_the_training_reward_and_warns(tmp_path):
    """A custom RL loop in compute_loss feeds the monitor; the callback, installed first, puts goodhart/*
    into the very logs the trainer keeps, and warns once the reward has risen while the judge fell."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    monitor = GoodhartMonitor({"truth": contains_red}, window=2)
    callback = GoodhartCallback(monitor)

    class RLTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            step = self.state.global_step
            captions = ["red"] * max(0, 3 - step) + ["blue"] * min(3, step)  # truth falls 1 -> 0
            monitor.observe([0.2 * step] * 3, None, captions)  # the reward rises
            return model(**inputs)["loss"]

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=5, logging_steps=1, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = RLTrainer(model=_Rising(), args=args, train_dataset=Dataset.from_dict({"x": [[1.0]] * 10}))
    callback.install(trainer)
    assert trainer.callback_handler.callbacks[0] is callback
    with pytest.warns(GoodhartWarning, match=r"rose 0\.100 -> 0\.500 over steps 1-2 -> 3-4 while truth fell 0\.833 -> 0\.167"):
        trainer.train()
    logged = [h for h in trainer.state.log_history if "goodhart/train" in h]
    assert [h["step"] for h in logged] == [1, 2, 3, 4, 5]
    assert [h["goodhart/train"] for h in logged] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    assert [h["goodhart/truth"] for h in logged] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0, 0.0])
    assert all(h["goodhart/gap/truth"] == pytest.approx(h["goodhart/train"] - h["goodhart/truth"]) for h in logged)
    assert all("loss" in h for h in logged)  # beside the trainer's own values, in the same log


def test_lightning_callback_reads_training_step_outputs_and_logs(tmp_path):
    lightning = pytest.importorskip("lightning.pytorch")
    from capreward.callbacks.goodhart_lightning import GoodhartLightningCallback

    def right(prompts, completions, colour, **kwargs):
        return [float(c == k) for c, k in zip(completions, colour)]

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(1.0))

        def training_step(self, batch, batch_idx):
            # two captions per item (item-major); the reward rises, the captions stop naming the colour
            captions = [c if batch_idx < 2 else "grey" for c in batch["colour"] for _ in range(2)]
            rewards = torch.full((len(captions),), 0.5 * batch_idx)
            return {"loss": (self.w * batch["x"].mean()) ** 2, "captions": captions, "rewards": rewards}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = [{"x": torch.tensor([1.0]), "colour": c} for c in ["red", "blue"] * 4]
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    monitor = GoodhartMonitor({"right": right}, window=2)
    trainer = lightning.Trainer(max_steps=4, callbacks=[GoodhartLightningCallback(monitor, columns=("colour",))],
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu")
    with pytest.warns(GoodhartWarning, match=r"rose 0\.250 -> 1\.250 .* right fell 1\.000 -> 0\.000"):
        trainer.fit(Module(), loader)
    assert [r["right"] for r in monitor.rows] == [1.0, 1.0, 0.0, 0.0]
    assert trainer.callback_metrics["goodhart/train"].item() == pytest.approx(1.5)
    assert trainer.callback_metrics["goodhart/gap/right"].item() == pytest.approx(1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GoodhartWarning)
        bad = lightning.Trainer(max_steps=1, callbacks=[GoodhartLightningCallback(GoodhartMonitor({"right": right}))],
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu")

        class NoCaptions(Module):
            def training_step(self, batch, batch_idx):
                return (self.w * batch["x"].mean()) ** 2

        with pytest.raises(ValueError, match="must return a dict with 'captions' and 'rewards'"):
            bad.fit(NoCaptions(), loader)


def test_follow_flags_a_judge_that_stays_level_while_the_reward_climbs():
    """Ground truth that does not move while the reward rises (a blind policy exploiting the reward) is
    flagged with a per-judge ``follow``; the default flags only a judge that fell."""
    level = lambda prompts, completions, **k: [0.25] * len(completions)  # noqa: E731
    rising = lambda prompts, completions, **k: [float(x) for x in completions]  # noqa: E731
    messages = []
    m = GoodhartMonitor({"truth": level, "other": rising}, window=1, follow={"truth": 0.05}, warn=messages.append)
    for step, reward in enumerate((0.1, 0.5), 1):
        m.observe([reward], None, [str(step)]); m.flush(step)
    assert messages == ["Goodhart: the training reward rose 0.100 -> 0.500 over steps 1 -> 2 while truth did not follow, "
                        "0.250 -> 0.250 (needs +0.050)"]
    default = GoodhartMonitor({"truth": level}, window=1, warn=pytest.fail)
    for step, reward in enumerate((0.1, 0.5), 1):
        default.observe([reward], None, ["x"]); default.flush(step)
    assert default.verdict() is None


#: Each colour's partner in its family: a reward that sees the partner's image pays the wrong colour.
SWAPPED = {"red": "yellow", "yellow": "red", "green": "blue", "blue": "green"}


def scored_against_the_swapped_colour(reward):
    """``reward`` given, for each sample, a solid image of the :data:`SWAPPED` colour instead of the
    sample's own: a misaligned reward whose optimum names the wrong colour of the right family, which a
    policy from the weak start can learn as fast as the right one (the same within-family choice)."""
    import random

    from capreward.testing import colour_image
    from capreward.testing.colour_task import TASK_COLOURS

    images = {c: colour_image(SWAPPED[c], random.Random(0)) for c in TASK_COLOURS}

    def swapped(prompts, completions, colour, **kwargs):
        kwargs["image"] = [images[c] for c in colour]
        return reward(prompts, completions, colour=colour, **kwargs)

    swapped.__name__ = reward.__name__
    return swapped


def _grpo_with_monitor(tmp_path, steps: int, swapped: bool = False):
    """A real TRL GRPO run of the demo's tiny LLaVA watched by the monitor, from the demo's start (weak
    labels), with the demo's reward and settings; with ``swapped`` the reward scores each caption against
    the image of the colour's family partner (:func:`scored_against_the_swapped_colour`)."""
    from capreward.cli import demo
    from capreward.rewards import CLIPScoreReward
    from capreward.testing import TinyLlavaSpec, build_tiny_llava
    from capreward.testing.colour_task import WORDS, colour_rows, grpo_dataset, right_colour, sft_colours, weak_label
    from capreward.testing.trained_clip import ColourClipRecipe, TrainedClipFactory, trained_clip_path

    clip = TrainedClipFactory()
    held_recipe = ColourClipRecipe(seed=1)  # a second CLIP, trained independently: the held-out reward model
    trained_clip_path(held_recipe)
    held_clip_s = CLIPScoreReward(model=TrainedClipFactory(held_recipe))

    def truth(prompts, completions, colour, **kwargs):
        return [float(right_colour(c, k)) for c, k in zip(completions, colour)]

    def held_out(prompts, completions, image, **kwargs):
        return held_clip_s(prompts, completions, image=image)

    messages = []
    monitor = GoodhartMonitor({"truth": truth, "held_out_clip_s": held_out}, warn=messages.append)  # the defaults
    torch.manual_seed(0)
    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=0))
    sft_colours(model, processor, 80, 0, label=weak_label)
    reward = demo.build_reward(clip, colour_rows(demo.CALIBRATION_ROWS, 3000))  # the same reward and settings for both runs
    if swapped:
        reward = scored_against_the_swapped_colour(reward)
    recipe = demo.load_recipe()
    args = recipe.parse_args(demo.DEMO_SETTINGS.recipe_argv(str(tmp_path), 0, steps))
    callback = GoodhartCallback(monitor)
    with demo.quiet_third_parties():
        result = recipe.train(args, reward_funcs=[monitor.watch(reward)], model_and_processor=(model, processor),
                              dataset=grpo_dataset(colour_rows(32, 0), keep_colour=True), save=False, callbacks=[callback])
    return monitor, messages, result


@pytest.mark.slow
@pytest.mark.integration
def test_monitor_flags_a_misaligned_reward_and_stays_quiet_on_the_learning_run(tmp_path):
    """Demonstrated on the demo's task, two real GRPO runs of 48 steps from the same weak start: under the
    demo's reward scored against the image of each colour's family partner (a misaligned reward: it pays
    "a yellow image" for a red one) the training reward rises while the share of captions naming the right
    colour falls, and the monitor flags it, naming ground truth; under the demo's reward it stays quiet
    while the right-colour share rises. The monitor's defaults (window 8, follow 0, z 0), as measured on
    24 recorded runs (docs/integrations/goodhart.md). An image-blind start (the earlier demo) no longer
    serves as the collapse: since a reward's first call stopped drawing from the trainer's random
    generator, seed 0's blind run no longer raises the reward at all in 48 steps (-0.70 -> -0.87), and
    across five blind seeds only one collapsed."""
    from fixtures_llava import one_torch_thread  # noqa: F401

    torch.set_num_threads(1)
    monitor, messages, result = _grpo_with_monitor(tmp_path / "swapped", steps=48, swapped=True)
    ch = monitor.changes()
    assert ch["train"][1] - ch["train"][0] >= 0.05, ch  # the reward rose
    assert ch["truth"][1] - ch["truth"][0] < 0.0, ch  # the right-colour share fell
    assert len(messages) >= 1 and ("truth did not follow" in messages[0] or "truth fell" in messages[0]), messages
    logged = [h for h in result["log_history"] if "goodhart/train" in h]
    assert len(logged) == 48 and all(h["goodhart/train"] == pytest.approx(h["reward"], abs=1e-4) for h in logged)

    monitor, messages, _ = _grpo_with_monitor(tmp_path / "weak", steps=48)
    ch = monitor.changes()
    assert ch["truth"][1] - ch["truth"][0] >= 0.05 and messages == [], (ch, messages)


def test_the_verdict_weighs_each_change_against_its_noise_by_hand():
    """z standard errors: each change (latest window mean minus first) against the spread of its step means
    in the two windows, sqrt(var_first / k + var_latest / k); ``record`` replays rows, ``alarms`` and
    ``fired`` keep what was raised."""
    rows = [{"step": s, "train": t, "flat": f, "rising": r}
            for s, t, f, r in zip((1, 2, 3, 4), (0.0, 0.2, 1.0, 1.2), (0.5, 0.7, 0.6, 0.8), (0.1, 0.3, 0.9, 1.1))]
    judges = {"flat": contains_red, "rising": contains_red}
    m = GoodhartMonitor(judges, window=2, z=2.0, warn=lambda message: None)
    for row in rows:
        m.record(row)
    se = math.sqrt(0.02 / 2 + 0.02 / 2)  # the same spread in every series here
    assert m.noise() == pytest.approx({"train": se, "flat": se, "rising": se})
    # train rose 1.0 >= 2 se; "flat" rose 0.1, less than 2 se (0.283): not followed; "rising" 0.8: followed
    assert m.verdict() == ("Goodhart: the training reward rose 0.100 -> 1.100 over steps 1-2 -> 3-4 while flat did not "
                           "follow, 0.600 -> 0.700 (needs +0.283)")
    assert m.fired and m.alarms == [(4, m.verdict())]
    # without the noise (z = 0, the earlier rule) a judge that rose at all followed
    plain = GoodhartMonitor(judges, window=2, z=0.0, warn=pytest.fail)
    for row in rows:
        plain.record(row)
    assert plain.verdict() is None and not plain.fired
    # a training reward whose rise is within its own noise has not risen
    noisy = GoodhartMonitor(judges, window=2, z=2.0, warn=pytest.fail)
    for s, t in zip((1, 2, 3, 4), (0.0, 1.0, 0.3, 1.1)):  # rise 0.2, se sqrt(0.5/2 + 0.32/2) = 0.64
        noisy.record({"step": s, "train": t, "flat": 0.5, "rising": 0.5})
    assert noisy.verdict() is None
