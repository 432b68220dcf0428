"""The reward server inside OpenRLHF's own code (openrlhf 0.11.2, installed by ``bootstrap.sh --test``).

The path a rollout takes in OpenRLHF: ``SingleTurnAgentExecutor.execute`` decodes prompt + response
with the policy's tokenizer and POSTs one query to ``--remote_rm_url`` (its own aiohttp client);
``SamplesGenerator._process_response_into_experience`` turns each answer into a one-sample
``Experience`` (``info[key]`` per ``extra_logs`` key); ``Experience.concat_experiences`` stacks a
micro-batch and the replay buffer's ``split_experience_batch`` splits it again per sample, refusing
any ``info`` entry whose length is not the batch size. Here a real capreward server on 127.0.0.1
answers a batch that mixes a sample with references, one without and one it cannot score: every
answer must carry the same ``extra_logs`` keys (NaN where a sub-score is undefined), or the split
fails ("Size of info[clip_s] (2) does not match batch_size (3)").

Only OpenRLHF's GPU engine is absent: ``samples_generator`` imports vLLM at module level for names
this path never calls, so while that module is imported a stand-in ``vllm`` module provides those
names (the vLLM engine's generation is replaced by fixed response tokens, which is what is scored).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import types
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from capreward.server.http import make_server
from capreward.rewards import CLIPScoreReward, CompositeReward, EMScoreReward
from capreward.rewards.guards import Guards

from conftest import random_video, write_mp4

pytestmark = pytest.mark.integration

openrlhf = pytest.importorskip("openrlhf", reason="openrlhf is installed by scripts/bootstrap.sh --test")

PROMPT = "USER: Describe the image ASSISTANT:"
SAMPLES = [  # (response, label): references, none, and a file the server cannot read
    ("a red image of the colour red", {"image": "red.png", "references": ["a red image", "a photo of red"]}),
    ("a blue image", {"image": "blue.png"}),
    ("a green image", {"image": "missing.png"}),
]


def import_samples_generator():
    """``openrlhf.trainer.ppo_utils.samples_generator`` (and so ``openrlhf.trainer.ray.vllm_engine``),
    with a stand-in ``vllm`` providing the names they import when vLLM is not installed."""
    name = "openrlhf.trainer.ppo_utils.samples_generator"
    if name in sys.modules:
        return sys.modules[name]
    try:
        import vllm  # noqa: F401
        stubs = {}
    except ImportError:
        def unused(*args, **kwargs):
            raise AssertionError("vLLM is not available in this test")

        root = types.ModuleType("vllm")
        root.__version__ = "0.0.0"
        root.SamplingParams = root.AsyncEngineArgs = root.AsyncLLMEngine = unused
        inputs, utils = types.ModuleType("vllm.inputs"), types.ModuleType("vllm.utils")
        inputs.TokensPrompt, utils.random_uuid = unused, unused
        root.inputs, root.utils = inputs, utils
        stubs = {"vllm": root, "vllm.inputs": inputs, "vllm.utils": utils}
    sys.modules.update(stubs)
    try:
        import importlib

        return importlib.import_module(name)
    finally:
        for key in stubs:
            sys.modules.pop(key, None)


class FixedEngine:
    """Stands in for OpenRLHF's vLLM rollout actor: ``generate`` answers with the given response."""

    def __init__(self, tokenizer, response: str):
        self.ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=list(self.ids), finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


@pytest.fixture(scope="module")
def tokenizer():
    from capreward.testing import build_tiny_tokenizer

    words = ("USER", "ASSISTANT", "Describe", "the", "image", "a", "an", "of", "colour", "red", "blue", "green",
             "photo")
    return build_tiny_tokenizer(words)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("openrlhf_media")
    for name, rgb in (("red", (215, 30, 35)), ("blue", (35, 70, 215))):
        pixels = np.clip(np.array(rgb) + np.random.default_rng(0).normal(0, 10, (32, 32, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"{name}.png")
    write_mp4(root / "clip.mp4", random_video(5, frames=8))
    return root


def serve(reward, media):
    server = make_server(reward, "127.0.0.1", 0, media_root=str(media))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server


def rollouts(server, tokenizer, samples):
    """OpenRLHF's executor run on each sample, as its rollout workers do (one query per request)."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=server.url + "/get_reward")
    params = SimpleNamespace(max_tokens=16, logprobs=None)

    async def run():
        return await asyncio.gather(*(
            executor.execute(PROMPT, json.dumps(label), params, 128, tokenizer, FixedEngine(tokenizer, response))
            for response, label in samples))

    return asyncio.run(run())


def experiences_through_openrlhf(responses):
    """Each answer as OpenRLHF's one-sample Experience, concatenated and split again."""
    from openrlhf.trainer.ppo_utils import Experience, make_experience_batch, split_experience_batch

    generator = import_samples_generator()
    singles = [generator.SamplesGenerator._process_response_into_experience(None, r, max_len=128) for r in responses]
    merged = Experience.concat_experiences(singles, pad_token_id=0)
    items = split_experience_batch(merged)
    return singles, items, make_experience_batch(items)


def test_mixed_batch_survives_concat_and_split(tiny_clip_path, tokenizer, media):
    reward = CLIPScoreReward(model=str(tiny_clip_path))
    server = serve(reward, media)
    try:
        responses = rollouts(server, tokenizer, SAMPLES)
    finally:
        server.shutdown()
        server.server_close()
    # OpenRLHF's own concat and split of the three answers (raised "Size of info[clip_s] (2) does not
    # match batch_size (3)" while extra_logs keys varied per answer)
    singles, items, batch = experiences_through_openrlhf(responses)
    # the server scored what OpenRLHF sent: the response after the decoded prompt
    assert all(r["reward"] is not None for r in responses)
    logs = [r["extra_logs"] for r in responses]
    keys = {"clip_s", "ref_similarity", "truncated", "clipped", "unscored"}
    assert [set(x) for x in logs] == [keys] * 3  # one key set, whatever the sample
    assert [x["unscored"] for x in logs] == [[0.0], [0.0], [1.0]]
    assert math.isfinite(logs[0]["ref_similarity"][0]) and math.isnan(logs[1]["ref_similarity"][0])
    assert all(math.isnan(v[0]) for k, v in logs[2].items() if k != "unscored")
    # the rewards are the reward's own values for the response text (the fallback for the unscored one)
    direct = reward(None, [SAMPLES[0][0], SAMPLES[1][0]], image=[str(media / "red.png"), str(media / "blue.png")],
                    references=[SAMPLES[0][1]["references"], None])
    bottom = reward.value_range()[0]  # the server's default fallback: the bottom of the reward's range
    assert [r["reward"][0] for r in responses] == pytest.approx([*direct, bottom], abs=1e-6)

    assert len(items) == 3
    for item, log in zip(items, logs):
        for key in keys:
            got = float(item.info[key].flatten()[0])
            assert got == pytest.approx(log[key][0], nan_ok=True)
    assert len(batch.info["clip_s"]) == 3  # and merged again for training (make_experience_batch)


def test_every_reward_answers_one_key_set(tiny_clip_path, tokenizer, media):
    """EMScore (videos and images, references or not) and a composite with guards: each server's
    answers share one key set, equal to the reward's declared metric_names() plus unscored."""
    clip = str(tiny_clip_path)
    composite = CompositeReward([(EMScoreReward(model=clip), 1.0), (CLIPScoreReward(model=clip), 0.5)], guards=Guards())
    samples = [
        ("a red image", {"image": "red.png", "references": ["a red image"]}),
        ("a moving video", {"video": "clip.mp4"}),
        ("", {"image": "blue.png"}),  # empty response: unscored
    ]
    for reward in (EMScoreReward(model=clip), composite):
        server = serve(reward, media)
        try:
            responses = rollouts(server, tokenizer, samples)
        finally:
            server.shutdown()
            server.server_close()
        # the reward itself reports exactly its declared sub-scores (an undeclared one would be missing
        # from the server's answers)
        direct = reward.compute(None, ["a red image", "a moving video", ""],
                                image=[str(media / "red.png"), None, str(media / "blue.png")],
                                video=[None, str(media / "clip.mp4"), None], references=[["a red image"], None, None])
        assert list(direct.metrics) == list(reward.metric_names()), reward.name
        expected = {*reward.metric_names(), "unscored"}
        assert [set(r["extra_logs"]) for r in responses] == [expected] * 3, reward.name
        assert [r["extra_logs"]["unscored"] for r in responses] == [[0.0], [0.0], [1.0]]
        _, items, _ = experiences_through_openrlhf(responses)
        assert len(items) == 3
