"""capreward's in-process ``reward_func`` file inside OpenRLHF's own code (openrlhf 0.11.2).

OpenRLHF's path: ``SingleTurnAgentExecutor(remote_rm_url=<file>.py)`` loads the file's ``reward_func`` with
its own ``importlib`` loader (a standalone module named ``reward_func``); ``execute`` decodes prompt +
response with the policy's tokenizer and calls ``reward_func([query], [prompt], [label])`` in a worker
thread, reading ``rewards``/``scores``/``extra_logs`` exactly as it reads the reward server's answer. Here
the same rollouts go once through the file and once through a real ``capreward serve`` subprocess on
127.0.0.1 configured alike, and OpenRLHF must read the same numbers from both; the answers then pass
OpenRLHF's concat and split of experiences. A malformed label is refused (OpenRLHF logs it; the rollout
gets no reward), never scored.

Only OpenRLHF's GPU engine is absent (the vLLM rollout is replaced by fixed response tokens, as in
tests/test_openrlhf_contract.py). Cost: the tiny CLIP in this process and in one server subprocess.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

import capreward.server.reward_func as reward_func_module
from capreward.rewards import CLIPScoreReward

from serve_process import Server

pytestmark = pytest.mark.integration

pytest.importorskip("openrlhf", reason="openrlhf is installed by scripts/bootstrap.sh --test")

from test_openrlhf_contract import (  # noqa: E402 - after the skip: the contract module needs openrlhf
    PROMPT,
    SAMPLES,
    FixedEngine,
    experiences_through_openrlhf,
    media,  # noqa: F401 - the fixture
    tokenizer,  # noqa: F401 - the fixture
)

FILE = reward_func_module.__file__
LABELS = [*SAMPLES, ("a red image", {"image": "../outside.png"})]  # and a file outside the media root


def rollouts(endpoint: str, tokenizer, samples):
    """OpenRLHF's executor for ``endpoint`` (the reward file, or a server's URL) run on each sample
    concurrently, as its rollout workers do; returns the executor and its outputs."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=endpoint)
    params = SimpleNamespace(max_tokens=16, logprobs=None)

    async def run():
        return await asyncio.gather(*(
            executor.execute(PROMPT, label if isinstance(label, str) else json.dumps(label), params, 128, tokenizer,
                             FixedEngine(tokenizer, response))
            for response, label in samples))

    return executor, asyncio.run(run())


@pytest.fixture
def configured(tiny_clip_path, media, monkeypatch):
    for name, value in (("REWARD", "clip_s"), ("CLIP_MODEL", str(tiny_clip_path)), ("MEDIA_ROOT", str(media))):
        monkeypatch.setenv(f"CAPREWARD_{name}", value)
    for name in ("FALLBACK", "PROMPT_TOKENIZER", "SUBSCORES"):
        monkeypatch.delenv(f"CAPREWARD_{name}", raising=False)
    return ["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media)]


def same(a, b) -> bool:
    return all(x == pytest.approx(y, abs=1e-6, nan_ok=True) for x, y in zip(a, b, strict=True))


def test_openrlhf_reads_the_same_answer_from_the_file_as_from_capreward_serve(configured, tokenizer, media,
                                                                              tiny_clip_path):
    executor, from_file = rollouts(FILE, tokenizer, LABELS)
    loaded = executor.reward_func  # the function OpenRLHF's loader took from the file
    try:
        assert loaded.__name__ == "reward_func" and loaded.__module__ == "reward_func"
        assert loaded.__globals__["__file__"] == FILE
        # one request of all four, beside the rollouts: the whole answer, errors included
        payload = {"query": [f"{PROMPT} {text}" for text, _ in LABELS], "prompts": [PROMPT] * len(LABELS),
                   "labels": [json.dumps(label) for _, label in LABELS]}
        server = Server(configured)
        try:
            _, from_server = rollouts(server.url + "/get_reward", tokenizer, LABELS)
            status, served = server.post(payload)
        finally:
            server.stop()
        assert status == 200
        answer = loaded(payload["query"], payload["prompts"], payload["labels"])
        assert set(answer) == set(served) == {"rewards", "scores", "extra_logs", "errors"}
        assert same(answer["rewards"], served["rewards"]) and same(answer["scores"], served["scores"])
        assert answer["errors"] == served["errors"] and "media root" in answer["errors"][3]
        assert answer["errors"][:3] == [None, None, served["errors"][2]] and served["errors"][2]
        for key in served["extra_logs"]:
            assert same(answer["extra_logs"][key], served["extra_logs"][key]), key
        for got, want in zip(from_file, from_server, strict=True):
            assert got["reward"] is not None and same(got["reward"], want["reward"])
            assert same(got["scores"], want["scores"])
            assert set(got["extra_logs"]) == set(want["extra_logs"])
            for key in want["extra_logs"]:
                assert same(got["extra_logs"][key], want["extra_logs"][key]), key
        # and both are the reward's own values for the response text (the fallback for the unscored)
        reward = CLIPScoreReward(model=str(tiny_clip_path))
        direct = reward(None, [LABELS[0][0], LABELS[1][0]], image=[str(media / "red.png"), str(media / "blue.png")],
                        references=[LABELS[0][1]["references"], None])
        bottom = reward.value_range()[0]
        assert [r["reward"][0] for r in from_file] == pytest.approx([*direct, bottom, bottom], abs=1e-6)
        assert [r["extra_logs"]["unscored"] for r in from_file] == [[0.0], [0.0], [1.0], [1.0]]
        assert set(from_file[0]["extra_logs"]) == {*reward.metric_names(), "unscored"}
        assert math.isfinite(from_file[0]["extra_logs"]["ref_similarity"][0])
        assert math.isnan(from_file[1]["extra_logs"]["ref_similarity"][0])
        # OpenRLHF's own concat and split of the answers as experiences
        _, items, batch = experiences_through_openrlhf(from_file)
        assert len(items) == len(LABELS) and len(batch.info["clip_s"]) == len(LABELS)
    finally:
        loaded.__globals__["reset"]()


def test_a_malformed_call_is_refused_naming_the_item_and_openrlhf_gives_no_reward(configured, tokenizer):
    executor, outputs = rollouts(FILE, tokenizer, [("a red image", "not a label"), ("a red image", "[1, 2]")])
    loaded = executor.reward_func
    try:
        assert [out["reward"] for out in outputs] == [None, None]  # OpenRLHF logged the refusal
        with pytest.raises(ValueError, match=r"labels\[0\]"):
            loaded([f"{PROMPT} a red image"], [PROMPT], ["not a label"])
        with pytest.raises(ValueError, match="prompts"):
            loaded([f"{PROMPT} a red image"], [PROMPT, PROMPT], [json.dumps({"image": "red.png"})])
        with pytest.raises(ValueError, match="does not contain its prompt"):
            loaded(["a red image"], [PROMPT], [json.dumps({"image": "red.png"})])
    finally:
        loaded.__globals__["reset"]()
