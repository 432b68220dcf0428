"""Reward callables under TRL's real reward-call path (GRPOTrainer._calculate_rewards on a stand-in
trainer object), compared with the scorers' direct scores."""

from __future__ import annotations

import asyncio
import logging
import math
import pickle
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from capreward.metrics.harmonic import sign_safe_harmonic_mean
from capreward.rewards import CLIPScoreReward, EMScoreReward, completion_text, prompt_images
from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore

from conftest import random_video, write_mp4

pytestmark = pytest.mark.integration  # run by scripts/version_matrix.sh at both ends


# ------------------------------------------------------------------------------ TRL's call path
def trl_name(func) -> str:
    """TRL's name for a reward function: ``get_callable_name`` (trl >= 1.9) or ``__name__``."""
    from trl.trainer import utils as trl_utils

    return trl_utils.get_callable_name(func) if hasattr(trl_utils, "get_callable_name") else func.__name__


def trl_is_async(func) -> bool:
    """Whether TRL awaits a reward: ``is_async_callable`` (trl >= 1.14) or ``inspect.iscoroutinefunction``."""
    import inspect

    from trl.trainer import utils as trl_utils

    return trl_utils.is_async_callable(func) if hasattr(trl_utils, "is_async_callable") else inspect.iscoroutinefunction(func)


class TrainerStandIn:
    """The attributes GRPOTrainer._calculate_rewards reads, so the real method can run without a model."""

    def __init__(self, reward_funcs):
        from accelerate import PartialState

        PartialState()  # TRL's logger and gather() need accelerate's (single-process) state
        self.reward_funcs = list(reward_funcs)
        self.reward_processing_classes = [None] * len(self.reward_funcs)
        self.reward_func_names = [trl_name(f) for f in self.reward_funcs]
        self.args = SimpleNamespace(report_to=[])
        self.state = SimpleNamespace(global_step=0)
        self.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
        self.environments = None
        self.extra = defaultdict(list)
        self.metrics = defaultdict(list)
        self.async_loop = None

    def _log_completion_extra(self, column, values):
        self.extra[column].extend(values)

    def _log_metric(self, name, value):
        self.metrics[name].append(value)

    def start_async_loop(self):
        from trl.trainer.utils import start_event_loop_in_daemon

        self._thread, self.async_loop, ready = start_event_loop_in_daemon(name="test-async-loop")
        ready.wait()

    def stop_async_loop(self):
        from trl.trainer.utils import shutdown_event_loop_in_daemon

        shutdown_event_loop_in_daemon(self._thread, self.async_loop)


def trl_rewards(reward_funcs, inputs, completions, trainer=None):
    """Run TRL's GRPOTrainer._calculate_rewards: ``inputs`` are the dataset rows (one per completion,
    already repeated per generation as TRL does); returns (rewards tensor [N, F], trainer)."""
    from trl import GRPOTrainer

    trainer = trainer or TrainerStandIn(reward_funcs)
    prompts = [x["prompt"] for x in inputs]
    completion_ids = [[1, 2, 3] for _ in completions]
    rewards = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
    return rewards, trainer


def conversational(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def conversational_parts(texts):
    return [[{"role": "assistant", "content": [{"type": "text", "text": t}]}] for t in texts]


CAPTIONS = [
    "a man is cooking in a kitchen",
    "a dog runs on the grass",
    "people are dancing on a stage",
    "a woman plays the guitar",
]


@pytest.fixture(scope="module")
def clip_model(tiny_clip_path):
    return str(tiny_clip_path)


@pytest.fixture(scope="module")
def video_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    return [str(write_mp4(d / f"v{i}.mp4", random_video(i))) for i in range(2)]


def group_inputs(visual_column, visuals, generations=4, references=None):
    """Dataset rows repeated ``generations`` times each, as TRL builds them for a GRPO group."""
    rows = []
    for j, v in enumerate(visuals):
        for _ in range(generations):
            row = {"prompt": "Describe the video.", visual_column: v}
            if references is not None:
                row["references"] = references[j]
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------ parsing
def test_completion_text_both_formats():
    assert completion_text("a cat") == "a cat"
    assert completion_text([{"role": "assistant", "content": "a cat"}]) == "a cat"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "cat"}]}]
    assert completion_text(parts) == "a cat"
    with pytest.raises(TypeError, match=r"completions\[3\]"):
        completion_text(42, 3)


def test_prompt_images_found_in_order():
    a, b = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    prompt = [
        {"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "image", "image": b}]},
    ]
    assert prompt_images(prompt) == [a, b]
    assert prompt_images("plain prompt") == []


def test_trl_names_and_async_detection(clip_model):
    r = EMScoreReward(model=clip_model)
    assert trl_name(r) == "emscore"
    assert trl_name(CLIPScoreReward(model=clip_model)) == "clip_s"
    assert trl_name(EMScoreReward(model=clip_model, name="em_ref")) == "em_ref"
    assert not isinstance(r, torch.nn.Module)
    assert not trl_is_async(r)
    assert trl_is_async(r.as_async())
    assert trl_name(r.as_async()) == "emscore"


# ------------------------------------------------------------------------------ values
def test_trl_call_matches_direct_scores_both_formats(clip_model, video_paths):
    em, cs = EMScoreReward(model=clip_model), CLIPScoreReward(model=clip_model)
    inputs = group_inputs("video", video_paths)
    completions = CAPTIONS + CAPTIONS[::-1]
    videos = [x["video"] for x in inputs]
    expected_em = EMScore(model=clip_model).score(completions, videos=videos, harmonic_mean="sign-safe").score
    expected_cs = CLIPScore(model=clip_model).score(completions, videos=videos).clip_s

    for fmt in (lambda t: t, conversational, conversational_parts):
        rewards, trainer = trl_rewards([em, cs], inputs, fmt(completions))
        assert rewards.shape == (8, 2)
        torch.testing.assert_close(rewards[:, 0], expected_em, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rewards[:, 1], expected_cs, rtol=1e-5, atol=1e-6)
        assert trainer.metrics["rewards/emscore/unscored_frac"] == [0.0]
        assert not trainer.extra  # nothing to report


def test_image_sources_image_images_and_prompt(clip_model):
    imgs = [Image.fromarray(random_video(10 + i, frames=1)[0]) for i in range(2)]
    expected = CLIPScore(model=clip_model).score(CAPTIONS[:2], images=imgs).clip_s.tolist()
    r = CLIPScoreReward(model=clip_model)
    assert r(None, CAPTIONS[:2], image=imgs) == pytest.approx(expected, rel=1e-5)
    assert r(None, CAPTIONS[:2], images=[[imgs[0], imgs[1]], [imgs[1]]]) == pytest.approx(
        [expected[0], CLIPScore(model=clip_model).score(CAPTIONS[1:2], images=[imgs[1]]).clip_s.item()], rel=1e-5
    )
    prompts = [[{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": "?"}]}] for im in imgs]
    assert r(prompts, conversational(CAPTIONS[:2])) == pytest.approx(expected, rel=1e-5)


def test_references_and_reference_only_samples(clip_model, video_paths):
    refs = [["a person cooks food", "someone in a kitchen"], ["a dog on a lawn"]]
    em = EMScoreReward(model=clip_model)
    direct = EMScore(model=clip_model)
    # sample 0: video + references (combined score); sample 1: references only (EMScore_ref)
    values = em(None, CAPTIONS[:2], video=[video_paths[0], None], references=refs)
    safe = dict(harmonic_mean="sign-safe")  # the reward's F (the scorer's default is the released one)
    assert values[0] == pytest.approx(direct.score(CAPTIONS[:1], videos=video_paths[:1], references=refs[:1], **safe).score.item(), rel=1e-5)
    assert values[1] == pytest.approx(direct.score(CAPTIONS[1:2], references=refs[1:], **safe).score.item(), rel=1e-5)
    # use_references=False ignores the column; CLIP-S without a visual cannot score
    no_refs = EMScoreReward(model=clip_model, use_references=False)(None, CAPTIONS[:2], video=[video_paths[0], None], references=refs)
    assert no_refs[0] == pytest.approx(direct.score(CAPTIONS[:1], videos=video_paths[:1], **safe).score.item(), rel=1e-5)
    assert no_refs[1] is None
    assert CLIPScoreReward(model=clip_model)(None, CAPTIONS[:1], references=refs[:1]) == [None]
    raw = CLIPScore(model=clip_model).score(CAPTIONS[:1], videos=video_paths[:1], references=refs[:1])
    got = CLIPScoreReward(model=clip_model)(None, CAPTIONS[:1], video=video_paths[:1], references=refs[:1])
    assert got[0] == pytest.approx(sign_safe_harmonic_mean(raw.clip_s, raw.ref_similarity).item(), rel=1e-5)
    released = CLIPScoreReward(model=clip_model, harmonic_mean="released")
    got = released(None, CAPTIONS[:1], video=video_paths[:1], references=refs[:1])
    assert got[0] == pytest.approx(min(max(raw.ref_clip_s.item(), 0.0), 2.5), rel=1e-5)


def test_bad_video_and_empty_completion_give_none_with_reasons(clip_model, video_paths, tmp_path, caplog):
    missing = str(tmp_path / "missing.mp4")
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all")
    inputs = [{"prompt": "p", "video": v} for v in (video_paths[0], missing, video_paths[1], str(garbage), video_paths[0])]
    completions = [CAPTIONS[0], CAPTIONS[1], "   ", CAPTIONS[2], CAPTIONS[3]]
    em = EMScoreReward(model=clip_model)
    with caplog.at_level(logging.WARNING, logger="capreward.rewards.base"):
        rewards, trainer = trl_rewards([em], inputs, completions)
    values = rewards[:, 0]
    assert torch.isnan(values[[1, 2, 3]]).all()
    expected = EMScore(model=clip_model).score([completions[0], completions[4]], videos=[video_paths[0]] * 2,
                                                harmonic_mean="sign-safe").score
    torch.testing.assert_close(values[[0, 4]], expected, rtol=1e-5, atol=1e-6)
    errors = trainer.extra["emscore/error"]
    assert errors[0] is None and errors[4] is None
    assert "missing.mp4" in errors[1] and "does not exist" in errors[1]
    assert "empty" in errors[2]
    assert "garbage.mp4" in errors[3]
    assert trainer.metrics["rewards/emscore/unscored_frac"] == [pytest.approx(3 / 5)]
    assert "3/5 samples unscored" in caplog.text and "missing.mp4" in caplog.text


def test_one_value_per_completion_and_column_checks(clip_model, video_paths):
    em = EMScoreReward(model=clip_model)
    out = em(None, [CAPTIONS[0], 17, ""], video=[video_paths[0]] * 3)
    assert len(out) == 3 and out[0] is not None and out[1] is None and out[2] is None
    with pytest.raises(ValueError, match="'video' has 2 entries for 3 completions"):
        em(None, CAPTIONS[:3], video=video_paths)
    with pytest.raises(ValueError, match="field must be one of"):
        EMScoreReward(model=clip_model, field="nope")
    with pytest.raises(ValueError, match="batch"):
        EMScoreReward(model=clip_model, idf="batch")


def test_bad_configuration_raises_instead_of_none(video_paths):
    # a misspelt scorer argument is refused at construction (a TypeError, as before at the first call),
    # naming the nearest option
    with pytest.raises(TypeError, match="'modle' .*did you mean 'model'"):
        EMScoreReward(modle="ViT-B/32")


def test_visual_id_column_narrows_the_cache_key(clip_model):
    em = EMScoreReward(model=clip_model, visual_id_column="video_id")
    frames = random_video(3)
    first = em(None, CAPTIONS[:1], video=[frames], video_id=["clip-3"])
    misses = em.scorer.backbone.cache.misses
    assert em(None, CAPTIONS[:1], video=[frames.copy()], video_id=["clip-3"]) == first  # same pixels, same id: cached
    assert em.scorer.backbone.cache.misses == misses
    # the id never serves an embedding by itself: other pixels under the same id get their own score
    other = em(None, CAPTIONS[:1], video=[random_video(4)], video_id=["clip-3"])
    assert other != first and other == em(None, CAPTIONS[:1], video=[random_video(4)])


def test_subscores_logged_as_batch_means(clip_model, video_paths):
    em = EMScoreReward(model=clip_model)
    logged = {}
    em(None, CAPTIONS[:2], video=video_paths, log_metric=lambda k, v: logged.setdefault(k, v))
    direct = EMScore(model=clip_model).score(CAPTIONS[:2], videos=video_paths)
    assert logged["rewards/emscore/video/fine_p"] == pytest.approx(direct.video.fine_p.mean().item(), rel=1e-5)
    assert logged["rewards/emscore/video/coarse"] == pytest.approx(direct.video.coarse.mean().item(), rel=1e-5)
    quiet = {}
    EMScoreReward(model=clip_model, log_subscores=False)(None, CAPTIONS[:2], video=video_paths, log_metric=quiet.__setitem__)
    # health metrics stay: the unscored fraction, the number of values clipped into [-1, 1] and of
    # captions cut to the text context (none: long captions are read whole by default)
    assert quiet == {"rewards/emscore/unscored_frac": 0.0, "rewards/emscore/truncated": 0.0, "rewards/emscore/clipped": 0.0}


# ------------------------------------------------------------------------------ lifecycle
def test_pickle_round_trip_before_and_after_first_call(clip_model, video_paths):
    em = EMScoreReward(model=clip_model, frames=4)
    assert em._scorer is None  # lazy: nothing loaded yet
    fresh = pickle.loads(pickle.dumps(em))
    before = fresh(None, CAPTIONS[:2], video=video_paths)
    after_first = em(None, CAPTIONS[:2], video=video_paths)
    assert em._scorer is not None
    blob = pickle.dumps(em)
    assert len(blob) < 10_000  # the CLIP is not in the pickle
    clone = pickle.loads(blob)
    assert clone._scorer is None and clone.__name__ == "emscore"
    assert clone(None, CAPTIONS[:2], video=video_paths) == pytest.approx(after_first, rel=1e-6)
    assert before == pytest.approx(after_first, rel=1e-6)


def test_group_visual_encoded_once_across_calls(clip_model, video_paths):
    em = EMScoreReward(model=clip_model)
    backbone = em.scorer.backbone
    encoded = []
    original = backbone.encode_pixels
    backbone.encode_pixels = lambda pixels: encoded.append(pixels.shape[0]) or original(pixels)
    captions = [f"{c} number {k}" for k, c in enumerate(CAPTIONS * 2)]
    # a GRPO group of 8 on one video, split over two calls (e.g. two ranks' slices on one process)
    first = em(None, captions[:4], video=[video_paths[0]] * 4)
    second = em(None, captions[4:], video=[video_paths[0]] * 4)
    assert len(encoded) == 1 and encoded[0] == 10  # one video, its 10 sampled frames, encoded once
    # the same pixels as in-memory frames are keyed by content hash: one more encode, then cached
    frames = random_video(0)
    em(None, captions[:2], video=[frames, frames.copy()])
    em(None, captions[2:3], video=[frames.copy()])
    assert len(encoded) == 2
    assert all(v is not None for v in first + second)


def test_async_variant_same_values_through_trl(clip_model, video_paths):
    em = EMScoreReward(model=clip_model)
    async_em = em.as_async()
    inputs = group_inputs("video", video_paths, generations=2)
    completions = CAPTIONS
    sync_values = em(None, completions, video=[x["video"] for x in inputs])
    direct = asyncio.run(async_em(None, completions, video=[x["video"] for x in inputs]))
    assert direct == sync_values
    trainer = TrainerStandIn([async_em, CLIPScoreReward(model=clip_model).as_async()])
    trainer.start_async_loop()
    try:
        rewards, _ = trl_rewards(trainer.reward_funcs, inputs, completions, trainer=trainer)
    finally:
        trainer.stop_async_loop()
    assert rewards[:, 0].tolist() == pytest.approx(sync_values, rel=1e-6)
    assert not math.isnan(rewards[:, 1].sum().item())


def test_given_scorer_and_shared_backbone(clip_model, video_paths):
    scorer = EMScore(model=clip_model)
    em = EMScoreReward(scorer=scorer)
    cs = CLIPScoreReward(backbone=scorer.backbone)
    assert em.scorer is scorer
    assert cs.scorer.backbone is scorer.backbone
    v = em(None, CAPTIONS[:1], video=video_paths[:1])
    assert v[0] == pytest.approx(scorer.score(CAPTIONS[:1], videos=video_paths[:1], harmonic_mean="sign-safe").score.item(), rel=1e-6)
    # the visual encoded for EMScore is reused by CLIP-S (same backbone cache, same frame sampling)
    misses = scorer.backbone.cache.misses
    cs(None, CAPTIONS[:1], video=video_paths[:1])
    assert scorer.backbone.cache.misses == misses


# ------------------------------------------------------------------------------ FLEUR (tiny judge)
from fixtures_llava import colour_images, one_torch_thread, tiny_judge, tiny_judge_path  # noqa: E402,F401


def test_fleur_reward_matches_scorer_and_reports_unparseable(tiny_judge, colour_images):
    from capreward.rewards import FLEURReward
    from capreward.scorers.fleur import FLEUR

    red, blue = colour_images["red"], colour_images["blue"]
    captions = ["a red car", "a blue kite", "a red ball", "a photo of a kite"]
    images = [red, red, blue, blue]
    expected = FLEUR(tiny_judge).score(captions, images).score.tolist()
    reward = FLEURReward(model=tiny_judge)
    inputs = [{"prompt": "Describe.", "image": im} for im in images]
    rewards, trainer = trl_rewards([reward], inputs, conversational(captions))
    assert rewards[:, 0].tolist() == pytest.approx(expected, abs=1e-6, nan_ok=True)
    # the tiny judge answers "no idea" for the caption outside its toy task: NaN in TRL, with the reason
    assert math.isnan(expected[3]) and all(0.0 <= v <= 1.0 for v in expected[:3])
    assert "contains no number" in trainer.extra["fleur/error"][3]
    assert trainer.extra["fleur/error"][:3] == [None] * 3
    assert "rewards/fleur/parsed" in trainer.metrics  # the answer read as a number

    # an answer cut off before it ends has no score: None with the judge's reason, the rest still scored
    short = FLEURReward(model=tiny_judge, max_new_tokens=3)
    logged = {}
    values = short(None, ["a green ball", ""], image=[colour_images["green"]] * 2, log_extra=logged.__setitem__)
    assert values == [None, None]
    assert "did not end within max_new_tokens=3" in logged["fleur/error"][0]
    assert "empty" in logged["fleur/error"][1]


def test_fleur_reward_async_same_values(tiny_judge, colour_images):
    from capreward.rewards import FLEURReward

    reward = FLEURReward(model=tiny_judge)
    captions = ["a green ball", "a red ball"]
    images = [colour_images["green"]] * 2
    sync_values = reward(None, captions, image=images)
    async_values = asyncio.run(reward.as_async()(None, captions, image=images))
    assert async_values == sync_values and all(v is not None for v in sync_values)
