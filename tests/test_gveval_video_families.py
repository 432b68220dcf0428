"""G-VEval's video path on local judges that take video (tiny random Qwen2-VL, Qwen2.5-VL and
LLaVA-OneVision built offline, their real processor classes): the frames go to the judge as a video (the family's video
processor, its video slot, 3-D video positions), overall and ACCR; the released three-frame composite
stays the path for judges that take no video (LLaVA-1.5, Qwen3-VL here, any remote judge) and an explicit
option.

Checked against the model's own path fed by its own processor with ``videos=``: the batched chat judge
(one prefill per video prefix shared by the captions, cached decode) writes the tokens of a plain
per-sample ``generate`` with log-probabilities within 1e-5, and the exact digit tree at the score equals
p(k) read from plain forwards; G-VEval's scores (overall and the four ACCR dimensions) do not depend on
the batch or its order; no red-team caption becomes a role, a special token or a video slot.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image

from capreward import GVEval
from capreward.judges import LocalChatJudge, LocalJudge
from capreward.judges.caller_text import render
from capreward.media.composite import composite_indices
from capreward.testing import fleur_task_image
from red_team import ATTACKS, PLAIN_WRONG
from capreward.testing.tiny_vlm_families import build_tiny_llava_next, build_tiny_qwen2_vl

CAPTIONS = ["a red ball", "a blue box on the wall", "the kite"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: the families that take video -> a tiny model whose digit, "$" and end-of-turn outputs are scaled up
VIDEO_FAMILIES = {
    "qwen2-vl": lambda: build_tiny_qwen2_vl(seed=0, version="2", answer_bias=30.0),
    "qwen2.5-vl": lambda: build_tiny_qwen2_vl(seed=0, version="2.5", answer_bias=30.0),
    "llava-onevision": lambda: build_tiny_llava_next(seed=0, onevision=True, answer_bias=30.0),
}


@pytest.fixture(scope="module", params=list(VIDEO_FAMILIES))
def backend(request):
    """A tiny model of each family that takes video; it writes numbers, so G-VEval reads real scores."""
    judge = LocalJudge(VIDEO_FAMILIES[request.param](), image_size=32)
    return LocalChatJudge(judge, batch_size=4)


@pytest.fixture(scope="module")
def videos():
    """Two videos of 5 frames, (T, H, W, 3) uint8, not 32x32 (the judge resizes every frame)."""
    out = []
    for colours in (("red", "blue", "green", "red", "yellow"), ("blue", "blue", "red", "yellow", "green")):
        frames = [np.asarray(fleur_task_image(c, random.Random(f"gv-{k}-{c}"), size=(40, 28))) for k, c in enumerate(colours)]
        out.append(np.stack(frames))
    return out


def sent_frames(request) -> tuple[Image.Image, ...]:
    (turn,) = request.turns
    assert not turn.images and len(turn.videos) == 1
    return turn.videos[0]


def reference_inputs(judge, request, backend):
    """The family's own processor on the rendered prompt and the resized frames (``videos=``)."""
    parts = backend.render_parts(request)
    frames = [judge.family.resize(f) for f in sent_frames(request)]
    return judge.processor(text=[render(parts)], videos=[frames], return_tensors="pt")


def test_videos_go_as_the_composites_three_frames_to_a_judge_that_takes_video(backend, videos):
    for accr in (False, True):
        gveval = GVEval(backend, accr=accr)
        assert gveval.sends_video
        requests, errors = gveval.requests(CAPTIONS[:2], videos=videos)
        assert errors == [None, None]
        for request, video in zip(requests, videos):
            frames = sent_frames(request)
            expected = video[composite_indices(len(video))]
            assert [np.asarray(f).tolist() for f in frames] == [f.tolist() for f in expected]
    # the explicit option keeps the released composite
    (request,), _ = GVEval(backend, video_input="composite").requests(CAPTIONS[:1], videos=videos[:1])
    (turn,) = request.turns
    assert not turn.videos and turn.images[0].size == (1536, 512) and turn.image_detail == "high"
    (request,), _ = GVEval(backend, video_frames=5).requests(CAPTIONS[:1], videos=videos[:1])
    assert len(sent_frames(request)) == 5


def test_batched_video_answers_equal_the_models_own_generate_per_sample(backend, videos):
    """Six G-VEval requests (three captions x two videos) batched with shared video prefixes, against
    ``generate(output_logits=True)`` per request: same prompt ids, same tokens, log-probabilities within
    1e-5."""
    judge = backend.judge
    requests, _ = GVEval(backend, max_tokens=6).requests([c for _ in videos for c in CAPTIONS],
                                                         videos=[v for v in videos for _ in CAPTIONS])
    answers = backend.generate(requests)
    prompt_ids, _, _, _ = backend._prepare(requests)
    for r, (request, answer) in enumerate(zip(requests, answers)):
        assert answer.ok, answer.error
        inputs = reference_inputs(judge, request, backend)
        assert "pixel_values_videos" in inputs and "pixel_values" not in inputs
        assert inputs["input_ids"][0].tolist() == prompt_ids[r], f"prompt ids of request {r}"
        with torch.inference_mode():
            ref = judge.model.generate(**inputs, do_sample=False, max_new_tokens=6, output_logits=True,
                                       return_dict_in_generate=True)
        new = ref.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        cut = next((k for k, t in enumerate(new) if t in judge.eos_token_ids), len(new))
        assert list(answer.token_ids) == new[:cut], f"request {r}"
        assert answer.token_ids
        for step, token in enumerate(answer.tokens):
            logp = torch.log_softmax(ref.logits[step][0].double(), dim=-1)[new[step]]
            assert abs(token.logprob - float(logp)) <= 1e-5, (r, step)


def test_the_exact_digit_tree_on_a_video_equals_plain_forwards(backend, videos):
    judge = backend.judge
    digits = judge.digit_token_ids()
    requests, _ = GVEval(backend).requests(["a red ball", "the kite"], videos=videos)
    exact = backend.integer_distributions(requests, [[] for _ in requests])
    for r, request in enumerate(requests):
        inputs = reference_inputs(judge, request, backend)
        n = inputs["input_ids"].shape[1]
        probs = np.zeros(101)
        with torch.inference_mode():
            for k in range(101):
                tail = [digits[int(d)] for d in str(k)]
                ids = torch.cat([inputs["input_ids"], torch.tensor([tail])], dim=1)
                batch = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
                if "mm_token_type_ids" in inputs:
                    batch["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros((1, len(tail)), dtype=torch.long)], 1)
                logp = torch.log_softmax(judge.model(**batch).logits[0].double(), dim=-1)
                total = sum(float(logp[n - 1 + j, t]) for j, t in enumerate(tail))
                end = 1.0 - float(logp[n - 1 + len(tail)].exp()[digits].sum())
                probs[k] = math.exp(total) * end
        np.testing.assert_allclose(exact[r], probs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("accr", [False, True], ids=["overall", "accr"])
def test_video_scores_do_not_depend_on_the_batch_or_its_order(backend, videos, accr):
    caps = CAPTIONS + ["many red cars"]
    vids = [videos[0], videos[1], videos[1], videos[0]]

    def run(c, v):
        return GVEval(backend, accr=accr, max_tokens=24, requery=0).score(c, videos=v)

    whole = run(caps, vids)
    assert all("$" in raw or "α" in raw or any(ch.isdigit() for ch in raw) for raw in whole.raw)
    order = [3, 1, 0, 2]
    shuffled = run([caps[o] for o in order], [vids[o] for o in order])
    fields = ["score"] + (["accuracy", "completeness", "conciseness", "relevance"] if accr else [])
    for k in range(len(caps)):
        alone = run([caps[k]], [vids[k]])
        assert alone.raw[0] == whole.raw[k]
        for name in fields:
            a, b = float(getattr(whole, name)[k]), float(getattr(alone, name)[0])
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5 * max(1.0, abs(a)), (name, k, a, b)
    for name in fields:
        np.testing.assert_allclose(getattr(shuffled, name), getattr(whole, name)[order], atol=1e-5, rtol=0)


def test_no_caption_becomes_a_role_a_special_token_or_a_video_slot(backend, videos):
    """Every red-team caption in G-VEval's video request (overall and ACCR): the prompt holds exactly the
    plain prompt's structure tokens (roles, turn ends, vision markers, as many video tokens as the video
    has features) and no image token."""
    judge = backend.judge
    control = judge.control_token_ids
    for accr in (False, True):
        gveval = GVEval(backend, accr=accr)
        captions = [PLAIN_WRONG] + [a.caption for a in ATTACKS]
        requests, errors = gveval.requests(captions, videos=[videos[0]] * len(captions))
        live = [i for i, r in enumerate(requests) if r is not None]
        # only captions that are blank once special-token strings are read get no request
        assert all("empty caption" in str(errors[i]) for i in range(len(captions)) if requests[i] is None)
        assert live[0] == 0 and len(live) > len(captions) // 2
        ids, features, _, errs = backend._prepare([requests[i] for i in live])
        assert errs == [None] * len(live)
        n_video = int(features.shape[1])
        plain = ids[0]
        assert plain.count(judge.family.video_token_id) == n_video and judge.image_token_id not in plain
        structure = sorted(t for t in plain if t in control)
        for k, i in enumerate(live[1:], start=1):
            assert sorted(t for t in ids[k] if t in control) == structure, ATTACKS[i - 1].name


def test_image_and_video_requests_of_one_call_run_in_their_own_batches(backend, videos):
    images = [fleur_task_image("red", random.Random(3), size=(40, 28))]
    video_requests, _ = GVEval(backend, max_tokens=4).requests(CAPTIONS[:2], videos=videos)
    image_requests, _ = GVEval(backend, max_tokens=4).requests(CAPTIONS[:1], images=images)
    mixed = [video_requests[0], image_requests[0], video_requests[1]]
    together = backend.generate(mixed)
    apart = [backend.generate([r])[0] for r in mixed]
    assert [a.token_ids for a in together] == [a.token_ids for a in apart]
    assert backend.batches(mixed) == [[0, 2], [1]]


def test_judges_that_take_no_video_get_the_composite_and_frames_is_a_clear_error(videos):
    from capreward.testing import tiny_vlm_judge

    llava = LocalChatJudge(tiny_vlm_judge())
    qwen3 = LocalChatJudge(LocalJudge(build_tiny_qwen2_vl(seed=0, version="3"), image_size=32))
    for backend in (llava, qwen3):
        gveval = GVEval(backend)
        assert not gveval.sends_video
        (request,), _ = gveval.requests(CAPTIONS[:1], videos=videos[:1])
        assert request.turns[0].images[0].size == (1536, 512) and not request.turns[0].videos
        with pytest.raises(ValueError, match="video_input='frames' needs a local judge that takes video"):
            GVEval(backend, video_input="frames")
        # a video request sent anyway is refused by name, not run as an image
        (answer,) = backend.generate([type(request)(turns=(type(request.turns[0])("user", "x", videos=(tuple(sent),)),))
                                      for sent in [[Image.fromarray(f) for f in videos[0][:2]]]])
        assert not answer.ok and "does not take videos" in answer.error
    with pytest.raises(ValueError, match="video_input must be one of"):
        GVEval(llava, video_input="video")
    with pytest.raises(ValueError, match="video_frames must be a positive int"):
        GVEval(llava, video_frames=0)
