"""capreward's EasyR1 reward file inside EasyR1's own reward manager, in two versions of EasyR1's code: its
newest release, v0.3.2 (``verl.workers.reward.{RewardConfig, BatchFunctionRewardManager,
SequentialFunctionRewardManager}``), and its main branch (``AutoRewardManager``, which takes the batch or
sequential form from the file's ``REWARD_TYPE``), each with its ``verl.protocol.DataProto``, loaded from
tests/frameworks/easyr1/<version> under a name of its own (``easyr1_v0_3_2_verl``, ``easyr1_main_verl``)
since EasyR1 is on no package index and its package is named ``verl`` like veRL's (see PROVENANCE.md there).

EasyR1's path: ``RewardConfig.post_init`` splits ``reward_function=FILE:compute_score``; the manager loads the
file with ``importlib``, binds ``reward_function_kwargs``, decodes each response with the policy's tokenizer
and calls the function; ``"overall"`` goes on the response's last token and every key is collected per
sample. Here a batch mixes a sample with references, one without, one whose file is outside the media
root and one whose ground truth is not a label: each gets a number, the same keys, and the reward's own
value for its response. Every metric name reaches its reward through the file's keyword arguments.
Cost: the tiny CLIP, one batch of four in each manager form (about 5 s), plus a build per metric name
(lazy: no model is loaded for the judge metrics).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import capreward.adapters.easyr1 as adapter
from capreward import registry
from capreward.adapters.factory import reward_names
from capreward.rewards import CLIPScoreReward

from conftest import REPO

pytestmark = pytest.mark.integration

FRAMEWORK = REPO / "tests" / "frameworks" / "easyr1"
RELEASE, MAIN = "v0.3.2", "main"
FILE = adapter.__file__


def easyr1(version: str = RELEASE):
    """EasyR1's ``verl.workers.reward`` and ``verl.protocol`` of ``version``, imported as
    ``easyr1_<version>_verl.*``."""
    alias = f"easyr1_{version.replace('.', '_')}_verl"
    if alias not in sys.modules:
        root = FRAMEWORK / version / "verl"
        spec = importlib.util.spec_from_file_location(alias, root / "__init__.py", submodule_search_locations=[str(root)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"{alias}.workers.reward"), importlib.import_module(f"{alias}.protocol")


@pytest.fixture(scope="module")
def tokenizer():
    from capreward.testing import build_tiny_tokenizer

    return build_tiny_tokenizer(("a", "an", "image", "of", "the", "colour", "red", "blue", "green", "photo"))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("easyr1_media")
    for name, rgb in (("red", (215, 30, 35)), ("blue", (35, 70, 215))):
        pixels = np.clip(np.array(rgb) + np.random.default_rng(0).normal(0, 10, (32, 32, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"{name}.png")
    return root


SAMPLES = [  # (response, ground truth): references, none, a file outside the media root, not a label
    ("a red image of the colour red", json.dumps({"image": "red.png", "references": ["a red image", "a photo of red"]})),
    ("a blue image", json.dumps({"image": "blue.png"})),
    ("a green image", json.dumps({"image": "/etc/hostname"})),
    ("a red image", "red"),
]


def batch_of(tokenizer, samples, version: str = RELEASE):
    """EasyR1's DataProto for ``samples``: right-padded response ids, their mask, the ground truths."""
    _, protocol = easyr1(version)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text, _ in samples]
    width = max(map(len, ids))
    responses = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    truths = np.array([truth for _, truth in samples], dtype=object)
    return protocol.DataProto.from_dict(tensors={"responses": responses, "response_mask": mask},
                                        non_tensors={"ground_truth": truths}), mask.sum(-1)


def manager(kind: str, tokenizer, **kwargs):
    """EasyR1's reward manager for this file: the release's class for ``kind`` (``"batch"`` or
    ``"sequential"``), or main's ``AutoRewardManager`` (``kind="main"``: the file's ``REWARD_TYPE``)."""
    reward, _ = easyr1(MAIN if kind == "main" else RELEASE)
    config = reward.RewardConfig(reward_function=f"{FILE}:compute_score", reward_function_kwargs=kwargs,
                                 **({} if kind == "main" else {"reward_type": kind}))
    config.post_init()
    assert config.reward_function == FILE and config.reward_function_name == "compute_score"
    if kind == "main":
        made = reward.AutoRewardManager(config, tokenizer)
        assert made.reward_type == adapter.REWARD_TYPE == "batch"  # read from the file
        return made
    cls = reward.BatchFunctionRewardManager if kind == "batch" else reward.SequentialFunctionRewardManager
    return cls(config, tokenizer)


@pytest.mark.parametrize("kind", ["batch", "sequential", "main"])
def test_a_mixed_batch_through_easyr1s_reward_manager(kind, tiny_clip_path, tokenizer, media):
    kwargs = {"reward": "clip_s", "clip_model": str(tiny_clip_path), "media_root": str(media), "subscores": "all"}
    data, lengths = batch_of(tokenizer, SAMPLES, MAIN if kind == "main" else RELEASE)
    scores, metrics = manager(kind, tokenizer, **kwargs).compute_reward(data)
    reward = CLIPScoreReward(model=str(tiny_clip_path))
    keys = {"overall", "unscored", *reward.metric_names()}
    assert set(metrics) == keys and all(len(column) == len(SAMPLES) for column in metrics.values())
    direct = reward(None, [SAMPLES[0][0], SAMPLES[1][0]], image=[str(media / "red.png"), str(media / "blue.png")],
                    references=[["a red image", "a photo of red"], None])
    bottom = reward.value_range()[0]  # the default fallback: the bottom of the reward's range
    assert metrics["overall"] == pytest.approx([*direct, bottom, bottom], abs=1e-5)
    assert metrics["unscored"] == [0.0, 0.0, 1.0, 1.0]
    # EasyR1 put each "overall" on the response's last token, zero elsewhere
    for i, n in enumerate(lengths.tolist()):
        assert scores[i, n - 1].item() == pytest.approx(metrics["overall"][i], abs=1e-5)
        assert scores[i].abs().sum().item() == pytest.approx(abs(metrics["overall"][i]), abs=1e-5)
    assert math.isfinite(metrics["ref_similarity"][0]) and math.isnan(metrics["ref_similarity"][1])
    assert all(math.isnan(metrics[key][2]) for key in reward.metric_names())


def test_the_older_two_argument_form_and_the_default_keys(tiny_clip_path, media, monkeypatch):
    monkeypatch.setenv("CAPREWARD_REWARD", "clip_s")
    monkeypatch.setenv("CAPREWARD_CLIP_MODEL", str(tiny_clip_path))
    monkeypatch.setenv("CAPREWARD_MEDIA_ROOT", str(media))
    adapter.reset()
    try:
        got = adapter.compute_score("a red image", json.dumps({"image": "red.png"}))
        assert set(got) == {"overall", "unscored"} and got["unscored"] == 0.0
        again = adapter.compute_score({"response": "a red image", "response_length": 3,
                                       "ground_truth": {"image": "red.png"}})
        assert again == got
        assert adapter.compute_score(None, "{}")["unscored"] == 1.0  # never scored as the text "None"
    finally:
        adapter.reset()
    with pytest.raises(TypeError, match="unknown reward_function_kwargs"):
        adapter.compute_score([], clip_modle="x")


@pytest.mark.parametrize("name", reward_names())
def test_every_metric_is_reachable_by_name_with_its_sub_scores(name, tiny_clip_path, tokenizer, media):
    """Each name builds its reward through EasyR1's manager (judges on a server that is never called: every
    sample here names a file outside the media root, so nothing is scored), and the results carry
    exactly that reward's sub-scores."""
    kwargs = {"reward": name, "clip_model": str(tiny_clip_path), "media_root": str(media), "subscores": "all",
              "judge_url": "http://127.0.0.1:9/v1", "judge_model": "served"}
    data, _ = batch_of(tokenizer, [("a red image", json.dumps({"image": "/etc/hostname"}))] * 2)
    rewarder = manager("batch", tokenizer, **kwargs)
    scores, metrics = rewarder.compute_reward(data)
    built = sys.modules["custom_reward_fn"].scorer_for(**kwargs).reward
    if name != "composite":
        assert built.metric == registry.get(name).name, (name, type(built))
    assert set(metrics) == {"overall", "unscored", *built.metric_names()}
    assert metrics["unscored"] == [1.0, 1.0] and metrics["overall"] == [built.value_range()[0]] * 2
