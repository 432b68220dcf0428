"""The in-process engine judge (issue #44 item 4) against **fakes** of vLLM's and SGLang's offline engines
(tests/fake_engines.py: each implements exactly the documented offline API the backend uses, on the tiny
LLaVA judge run by transformers' own ``generate``). The real engines cannot be installed here; the GPU run
tests them where its device image carries them.

On the same model the engine judge answers as the local judge does (text, token ids, log-probabilities
within 1e-5, top alternatives) and reads the same exact distributions: the digit tree over 0..100 (so
VisCE² scores equal the local judge's), and yes/no token probabilities. The engine is given the image
capreward's own path starts from (LLaVA-1.5: padded to a square), the text side needs no weights, and an
engine without ``logprob_token_ids`` is read through every token's log-probability.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from capreward.judges import ChatRequest, LocalChatJudge, user_turn
from capreward.judges.engines import EngineJudge, SGLangEngine, VLLMEngine, text_front_end
from capreward.testing import fleur_task_image

from fake_engines import FakeLLM, FakeSGLangEngine, OldSamplingParams, SamplingParams


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    from capreward.testing import tiny_vlm_judge

    return tiny_vlm_judge()


@pytest.fixture(scope="module")
def local(model):
    return LocalChatJudge(model, batch_size=4)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def engine(request, model, local):
    if request.param == "vllm":
        fake = FakeLLM(model)
        return EngineJudge(VLLMEngine(fake, SamplingParams), local.judge), fake.core
    fake = FakeSGLangEngine(model)
    return EngineJudge(SGLangEngine(fake), local.judge), fake.core


@pytest.fixture(scope="module")
def images():
    # not square: LLaVA-1.5 pads to a square, which the engines' processors do not do
    return [fleur_task_image(c, random.Random(f"engine-{c}"), size=(40, 28)) for c in ("red", "blue")]


def requests_for(images, top=3, max_tokens=8):
    prompts = ["Rate the caption from 0 to 100. Caption: a red ball", "Describe the colour of the square."]
    return [ChatRequest(turns=(user_turn(p, [im]),), max_tokens=max_tokens, top_logprobs=top)
            for im in images for p in prompts]


def test_answers_equal_the_local_judges(engine, local, images):
    judge, core = engine
    requests = requests_for(images)
    seen = len(core.images_seen)
    mine, theirs = judge.generate(requests), local.generate(requests)
    assert all(size[0] == size[1] for size in core.images_seen[seen:])  # the engine got the padded square
    for a, b in zip(mine, theirs):
        assert a.ok and b.ok
        assert a.text == b.text and a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert len(a.tokens) == len(b.tokens) > 0
        for x, y in zip(a.tokens, b.tokens):
            assert x.token == y.token and math.isclose(x.logprob, y.logprob, abs_tol=1e-5)
            assert [p for p, _ in x.ranked] == [p for p, _ in y.ranked]
            assert all(math.isclose(u, v, abs_tol=1e-5) for (_, u), (_, v) in zip(x.ranked, y.ranked))


def test_the_digit_tree_and_token_readings_equal_the_local_judges(engine, local, images):
    judge, _ = engine
    requests = requests_for(images, top=0)[::2]
    prefixes = [[], [local.judge.tokenizer.encode("5", add_special_tokens=False)[-1]]]
    exact = judge.integer_distributions(requests, prefixes)
    np.testing.assert_allclose(exact, local.integer_distributions(requests, prefixes), atol=1e-5, rtol=0)
    assert exact.sum(axis=1).max() <= 1 + 1e-9
    yes_no = [local.judge.tokenizer.encode(w, add_special_tokens=False)[-1] for w in ("yes", "no")]
    got = judge.token_distributions(requests, [[], []], yes_no)
    prompt_ids, features, image_index, _ = local._prepare(requests)
    with torch.inference_mode():
        state = local.judge.start(prompt_ids, features, image_index)
    ref = torch.softmax(state.logits.double(), dim=-1)[:, yes_no].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)


def test_the_claim_reader_through_the_engine_equals_the_local_judge(engine, local, images):
    from capreward.scorers.claims import YesNoReader

    judge, _ = engine
    requests = [ChatRequest(turns=(user_turn(f"Is this true of the image: {c}? Answer yes or no.", [im]),), max_tokens=1)
                for c in ("the square is red", "the square is blue") for im in images]
    readers = YesNoReader(judge), YesNoReader(local)
    digits = local.judge.digit_token_ids()
    for reader in readers:  # the tiny judge has no "yes" token: two of its tokens stand in for the answers
        reader._ids = ([digits[1], digits[2]], [digits[0]])
    mine, theirs = readers[0].read(requests), readers[1].read(requests)
    for a, b in zip(mine, theirs):
        assert a.error is None and b.error is None
        assert math.isclose(a.p_yes, b.p_yes, abs_tol=1e-6) and math.isclose(a.p_no, b.p_no, abs_tol=1e-6)


def test_visce2_through_the_engine_equals_the_local_judge(engine, local, images):
    from capreward import VisCE2

    judge, _ = engine
    caps = ["a red square", "a blue square on white"]
    a = VisCE2(judge, expected=True, max_tokens=8, context_max_tokens=8).score(caps, images)
    b = VisCE2(local, expected=True, max_tokens=8, context_max_tokens=8).score(caps, images)
    assert a.raw == b.raw
    np.testing.assert_allclose(np.asarray(a.expected, float), np.asarray(b.expected, float), atol=1e-4, rtol=0)


def test_the_text_side_needs_no_weights_and_old_vllm_reads_every_token(model, local, images):
    from capreward.testing import tiny_vlm_judge_dir

    front = text_front_end(str(tiny_vlm_judge_dir()))
    assert next(front.model.parameters()).device.type == "meta"
    fake = FakeLLM(model, max_logprobs=-1)
    judge = EngineJudge(VLLMEngine(fake, OldSamplingParams), str(tiny_vlm_judge_dir()))
    assert judge.engine.token_ids_field is False
    requests = requests_for(images[:1], top=0)[:1]
    np.testing.assert_allclose(judge.integer_distributions(requests, [[]]), local.integer_distributions(requests, [[]]),
                               atol=1e-5, rtol=0)
    assert judge.generate(requests)[0].token_ids == local.generate(requests)[0].token_ids


def test_a_video_request_is_an_error_and_an_unknown_engine_is_refused(engine, images):
    judge, _ = engine
    video = ChatRequest(turns=(user_turn("What happens?", videos=[images]),), max_tokens=4)
    [answer] = judge.generate([video])
    assert not answer.ok and "video" in answer.error
    with pytest.raises(TypeError, match="vllm.LLM"):
        EngineJudge(object(), judge.judge)
