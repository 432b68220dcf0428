"""G-VEval on the local chat judge: the trained tiny judge's "$NN$" and Greek-letter answers, the exact
score distribution against a brute-force teacher-forced computation, the remote (top-alternatives) rule,
video composites, and error rows that never shift other samples."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from capreward import GVEval
from capreward.judges.local_chat import LocalChatJudge, LocalChatResponse
from capreward.judges.protocol import ChatRequest, ChatResponse, JudgeBackend, SyncBackendMixin, user_turn
from capreward.judges.vlm_prompts import gveval_prompt, gveval_template
from capreward.metrics.gveval import alternatives_distribution, expected_score, parse_marked_score
from capreward.testing.tiny_llava import TinyLlavaSpec, build_tiny_llava, fleur_task_image
from capreward.testing.tiny_vlm_judges import (
    ACCR_ANSWERS,
    GVEVAL_ANSWERS,
    VLM_PROBES,
    probe_image,
    synthetic_video,
)
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def backend(vlm_judge):
    return vlm_judge


class FaultyBackend(SyncBackendMixin):
    """A real backend whose requests listed in ``fail`` (by caption substring) come back with an error,
    as a remote backend's would after its last retry; counts the requests it sees."""

    def __init__(self, inner, fail=(), strip_ids=False):
        self.inner, self.fail, self.strip_ids = inner, tuple(fail), strip_ids
        self.name = inner.name
        self.seen = 0

    def __getattr__(self, name):
        # A local backend's exact-distribution methods, unless this backend plays a remote server.
        if name in ("integer_distributions", "number_prefix") and not self.strip_ids:
            return getattr(self.inner, name)
        raise AttributeError(name)

    def generate(self, requests):
        self.seen += len(requests)
        keep = [i for i, r in enumerate(requests) if not any(f in r.turns[-1].text for f in self.fail)]
        answers = self.inner.generate([requests[i] for i in keep])
        out = [ChatResponse(text="", error="HTTP 500 after 3 retries") for _ in requests]
        for i, a in zip(keep, answers):
            # strip_ids: look like a remote server (text and top alternatives only).
            out[i] = ChatResponse(a.text, a.tokens, a.error, a.finish_reason) if self.strip_ids else a
        return out


def _brute_force(judge, prompt_ids, features, image_index=0):
    """p(k) for k = 0..100 by teacher forcing each candidate answer's digits in one full forward pass."""
    answers = [[judge.digit_token_ids()[int(c)] for c in str(k)] for k in range(101)]
    inputs = judge.teacher_forcing_inputs([prompt_ids] * 101, answers, [list(range(len(a) + 1)) for a in answers])
    with torch.inference_mode():
        logits = judge.logits_at(inputs, features, [image_index] * 101).double()
    probs = torch.softmax(logits, dim=-1)
    digits = torch.tensor(judge.digit_token_ids())
    out = np.zeros(101)
    for k, a in enumerate(answers):
        p = 1.0
        for t, tok in enumerate(a):
            p *= float(probs[k, t, tok])
        p *= 1.0 - float(probs[k, len(a)].index_select(0, digits).sum())
        out[k] = p
    return out


def _request(kind, colour, caption, mode="ref-free", references=None):
    visual = "vid" if kind == "accr" else "img"
    text = gveval_prompt(gveval_template(visual, mode, kind == "accr"), caption, references)
    return ChatRequest(turns=(user_turn(text, [probe_image(kind, colour)]),), max_tokens=120, top_logprobs=5)


# --------------------------------------------------------------------------------- the tiny judge
def test_tiny_judge_writes_dollar_scores(backend):
    _, colour, caption = VLM_PROBES["gveval_score"]
    response = backend.generate([_request("gveval", colour, caption)])[0]
    assert response.ok and response.finish_reason == "stop"
    assert response.text == f"the image is {colour}. The final score is ${GVEVAL_ANSWERS[colour]}$."
    _, colour, caption = VLM_PROBES["gveval_no_score"]
    assert backend.generate([_request("gveval", colour, caption)])[0].text == "I cannot tell."


def test_tiny_judge_writes_greek_accr_scores(backend):
    _, colour, caption = VLM_PROBES["accr"]
    text = backend.generate([_request("accr", colour, caption)])[0].text
    got = [parse_marked_score(text, m) for m in ("α", "β", "ψ", "δ")]
    assert got == list(ACCR_ANSWERS[colour]), text


def test_local_chat_token_logprobs_match_a_full_forward(backend):
    """Each reported token log-probability and its alternatives equal a teacher-forced forward pass."""
    _, colour, caption = VLM_PROBES["gveval_score"]
    request = _request("gveval", colour, caption)
    response = backend.generate([request])[0]
    assert isinstance(response, LocalChatResponse)
    assert len(response.tokens) == len(response.token_ids) > 5
    assert "".join(t.token for t in response.tokens).strip() == response.text
    judge = backend.judge
    features = judge.image_features(judge.preprocess([request.turns[0].images[0]]))
    prompt = judge.encode_prompts([backend.render(request)], features.shape[1])[0]
    ids = list(response.token_ids)
    inputs = judge.teacher_forcing_inputs([prompt], [ids], [list(range(len(ids)))])
    with torch.inference_mode():
        logp = torch.log_softmax(judge.logits_at(inputs, features, [0])[0].double(), dim=-1)
    for t, (tok, info) in enumerate(zip(ids, response.tokens)):
        assert info.logprob == pytest.approx(float(logp[t, tok]), abs=1e-4)
        assert len(info.top) <= 5 and max(info.top.values()) == pytest.approx(info.logprob, abs=1e-6)  # greedy
        best = torch.topk(logp[t], 5)
        assert sorted(info.top.values(), reverse=True)[0] == pytest.approx(float(best.values[0]), abs=1e-4)


# ------------------------------------------------------------------------- exact distribution
def test_exact_distribution_equals_brute_force_on_the_trained_judge(backend):
    _, colour, caption = VLM_PROBES["gveval_score"]
    request = _request("gveval", colour, caption)
    response = backend.generate([request])[0]
    prefix = backend.number_prefix(response.token_ids, "$")
    assert backend.judge.decode(prefix).endswith("$")
    exact = backend.integer_distributions([request], [prefix])[0]
    judge = backend.judge
    features = judge.image_features(judge.preprocess([request.turns[0].images[0]]))
    prompt = judge.encode_prompts([backend.render(request)], features.shape[1])[0]
    brute = _brute_force(judge, prompt + prefix, features)
    np.testing.assert_allclose(exact, brute, rtol=1e-4, atol=1e-9)
    assert exact.sum() > 0.9  # the trained judge writes a number after "$"
    assert abs(expected_score(exact) - 95) < 3


def test_exact_distribution_equals_brute_force_on_a_random_model_in_chunks():
    """An untrained model spreads mass everywhere (including "100" and leading zeros); two requests in
    one batch, branches run 7 rows at a time to exercise the chunking."""
    model, processor = build_tiny_llava(TinyLlavaSpec(seed=3))
    chat = LocalChatJudge((model, processor), batch_size=2)
    images = [fleur_task_image("red", random.Random(1)), fleur_task_image("blue", random.Random(2))]
    requests = [ChatRequest(turns=(user_turn(f"rate caption {i}", [im]),)) for i, im in enumerate(images)]
    prefixes = [[], chat.judge.tokenizer.encode("$", add_special_tokens=False)]
    exact = chat.integer_distributions(requests, prefixes, max_branch_rows=7)
    judge = chat.judge
    features = judge.image_features(judge.preprocess(images))
    for i, request in enumerate(requests):
        prompt = judge.encode_prompts([chat.render(request)], features.shape[1])[0]
        brute = _brute_force(judge, prompt + prefixes[i], features, image_index=i)
        np.testing.assert_allclose(exact[i], brute, rtol=1e-4, atol=1e-12)
        assert exact[i, 100] > 0 and exact[i].sum() < 1


# ------------------------------------------------------------------------------------ the scorer
def test_gveval_scores_images_with_expected_scores(backend):
    g = GVEval(backend, mode="ref-free", max_tokens=120)
    captions = ["a green ball", "a red car", "the box", "a blue kite"]
    images = [probe_image("gveval", c) for c in ("green", "red", "yellow", "blue")]
    r = g.score(captions, images=images)
    assert list(r.parsed[[0, 1, 3]]) == [GVEVAL_ANSWERS[c] for c in ("green", "red", "blue")]
    assert r.source[:2] == ["expected", "expected"] and r.source[3] == "expected"
    assert abs(r.score[0] - 95) < 3 and abs(r.score[1] - 88) < 3
    # "100" is three digit steps: the tiny judge leaks a few percent to "9", "10" and "1" ending early
    assert abs(r.score[3] - 100) < 8
    assert np.isnan(r.score[2]) and "no score" in r.error[2] and r.raw[2] == "I cannot tell."
    assert all(0 <= s <= 100 for s in r.score[[0, 1, 3]])


def test_gveval_never_reads_part_of_a_digit_split_number_on_a_server(backend):
    """Without token ids (a server's answer) on a digit-splitting tokenizer, the token after "$" is only
    the first digit: the released rule would give an expectation over "0".."9". The score is the exact
    digit tree of prefilled requests instead, or, on a backend that cannot continue a prefilled answer (this
    one: the local judge behind it refuses a final assistant turn), NaN with the reason."""
    remote = FaultyBackend(backend, strip_ids=True)
    g = GVEval(remote, mode="ref-free", max_tokens=120, requery=0)
    images = [probe_image("gveval", "green")]
    r = g.score(["a green ball"], images=images)
    response = remote.generate(g.requests(["a green ball"], images=images)[0])[0]
    at = next(i for i, t in enumerate(response.tokens) if "$" in t.token)
    partial = expected_score(alternatives_distribution(response.tokens[at + 1].top))
    assert partial < 10 and r.parsed[0] == GVEVAL_ANSWERS["green"]  # what the released rule would have read
    assert np.isnan(r.score[0]) and "prefilled request failed" in r.error[0]


def test_gveval_accr_on_videos_with_a_bad_video(backend):
    g = GVEval(backend, mode="ref-only", accr=True, max_tokens=120)
    videos = [synthetic_video("red"), np.zeros((0, 8, 8, 3), np.uint8), synthetic_video("red")]
    refs = [["a red car"], ["a red car"], ["the red box", "a red ball"]]
    r = g.score(["a red car", "a red car", "a red car"], videos=videos, references=refs)
    assert np.isnan(r.score[1]) and r.error[1] is not None and r.raw[1] == ""
    for i in (0, 2):
        assert r.error[i] is None, r.error[i]
        dims = [r.accuracy[i], r.completeness[i], r.conciseness[i], r.relevance[i]]
        assert r.score[i] == pytest.approx(np.mean(dims))
        assert r.parsed[i] == pytest.approx(np.mean(ACCR_ANSWERS["red"]))
        assert all(0 <= d <= 100 for d in dims)


def test_gveval_failed_requests_keep_their_place(backend):
    captions = ["a green ball", "a blue kite", "a red car", "a yellow box"]
    images = [probe_image("gveval", c) for c in ("green", "blue", "red", "yellow")]
    clean = GVEval(backend, max_tokens=120).score(captions, images=images)
    faulty = FaultyBackend(backend, fail=("a blue kite", "a yellow box"))
    r = GVEval(faulty, max_tokens=120).score(captions, images=images)
    assert faulty.seen == 4
    for i in (1, 3):
        assert np.isnan(r.score[i]) and "HTTP 500" in r.error[i] and r.source[i] is None
    np.testing.assert_allclose(r.score[[0, 2]], clean.score[[0, 2]], rtol=1e-6)
    assert r.raw[0] == clean.raw[0] and r.raw[2] == clean.raw[2]


def test_gveval_parsed_only_when_expected_is_off(backend):
    g = GVEval(backend, expected=False, max_tokens=120)
    r = g.score(["a green ball"], images=[probe_image("gveval", "green")])
    assert r.score[0] == r.parsed[0] == GVEVAL_ANSWERS["green"] and r.source == ["parsed"]


def test_gveval_argument_errors(backend):
    with pytest.raises(ValueError, match="mode"):
        GVEval(backend, mode="free")
    g = GVEval(backend, mode="combined")
    with pytest.raises(ValueError, match="references"):
        g.score(["a cap"], images=[probe_image("gveval", "red")])
    with pytest.raises(ValueError, match="video only"):
        GVEval(backend, accr=True).score(["a cap"], images=[probe_image("gveval", "red")])
    with pytest.raises(ValueError, match="needs images or videos"):
        GVEval(backend).score(["a cap"])
    with pytest.raises(ValueError, match="not both"):
        GVEval(backend).score(["a"], images=[1], videos=[1])


def test_local_chat_rejects_requests_it_cannot_run_without_shifting_others(backend):
    image = probe_image("gveval", "green")
    good = _request("gveval", "green", "a green ball")
    no_image = ChatRequest(turns=(user_turn("hello"),))
    two_images = ChatRequest(turns=(user_turn("hello", [image, image]),))
    too_long = ChatRequest(turns=(user_turn("hi", [image]),), max_tokens=10_000)
    out = backend.generate([no_image, good, two_images, too_long, good])
    assert [o.ok for o in out] == [False, True, False, False, True]
    assert "exactly one image" in out[0].error and "exceeds" in out[3].error
    assert out[1].text == out[4].text and out[1].text.endswith("$.")
    assert isinstance(backend, JudgeBackend)
    assert math.isfinite(out[1].tokens[0].logprob)
