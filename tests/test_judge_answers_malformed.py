"""No judge answer can crash a step (#43 item 1): every reader of judge output refuses log-probabilities
that are not a finite number at most 0, alternatives whose probabilities sum above 1 and answers larger
than was asked, and gives that sample no score and the reason; a remote backend asks such an answer again
like a failed request and never caches it, and reads no body past its byte bound.

Property tests feed random log-probability lists and random JSON bodies through every reader, directly and
through the project's test chat server made to lie (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from capreward import GVEval, VisCE2
from capreward.judges.injection_judge import yes_probability
from capreward.judges.protocol import (
    ChatRequest,
    ChatResponse,
    MalformedAnswer,
    SyncBackendMixin,
    TokenLogprob,
    answer_problem,
    checked_logprob,
    listed_probabilities,
    user_turn,
)
from capreward.judges.remote import OpenAIJudge, parse_completion
from capreward.metrics.gveval import alternatives_after_marker, alternatives_distribution
from capreward.scorers.claims import ClaimScorer, YesNoReader, read_alternatives
from capreward.scorers.fleur_remote import RemoteFLEUR
from capreward.scorers.qa_utility import QAUtility
from capreward.scorers.remote_numbers import read_node, remote_distributions
from capreward.scorers.vlm_common import alternative_distributions
from capreward.testing.chat_server import ChatServer

# -------------------------------------------------------------------------------- strategies
#: What a lying or broken server puts where a log-probability belongs.
LIES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1000.0, 709.8, 5.0, 1e-3, 0.0, -0.0, -1e-12, -9999.0, -1e308, float("nan"), float("inf"), -float("inf")]),
    st.floats(min_value=-30, max_value=0),
)
TEXTS = st.sampled_from(["0", "1", "5", "7", "9", " 8", "10", "100", "85", "$", " yes", "Yes", "no", "No", "A", "B)",
                         "the", "", "\u2581", "α", "0.", "."])
PAIRS = st.lists(st.tuples(TEXTS, LIES), max_size=25)


@st.composite
def tokens(draw, max_size=12):
    out = []
    for _ in range(draw(st.integers(0, max_size))):
        ranked = tuple(draw(PAIRS))
        top: dict[str, float] = {}
        for text, lp in ranked:
            top.setdefault(text, lp)
        out.append(TokenLogprob(draw(TEXTS), draw(LIES), top, ranked))
    return tuple(out)


@st.composite
def responses(draw):
    toks = draw(tokens())
    text = "".join(t.token for t in toks) if draw(st.booleans()) else draw(st.sampled_from(
        ["The score is $85$.", "0.7", "Yes", "B", "", "9" * 5000, "$", "The final score is $100$"]))
    return ChatResponse(text=text, tokens=toks, finish_reason=draw(st.sampled_from(["stop", "length", None])))


def _probability_ok(p: float) -> bool:
    return 0.0 <= p <= 1.0 + 1e-9


class Scripted(SyncBackendMixin):
    """A backend answering every request with the next scripted response (cycled)."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = list(answers) or [ChatResponse("")]
        self.calls = 0

    def generate(self, requests):
        out = []
        for _ in requests:
            out.append(self.answers[self.calls % len(self.answers)])
            self.calls += 1
        return out


IMAGE = Image.new("RGB", (16, 16), (200, 30, 30))
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ the shared checks
def test_the_issue_values_are_refused_with_a_reason():
    for bad in (1000.0, 5.0, float("nan"), float("inf"), -float("inf"), "0.5", None, True):
        with pytest.raises(MalformedAnswer):
            checked_logprob(bad, "x")
    assert checked_logprob(-9999.0) == -9999.0 and checked_logprob(5e-5) == 0.0  # vLLM's floor; rounding
    with pytest.raises(MalformedAnswer, match="above 1"):  # three tokens each "certain"
        listed_probabilities([("Yes", 0.0), ("yes", 0.0), ("YES", 0.0)])
    yes5 = ChatResponse("Yes", (TokenLogprob("Yes", 5.0, {"Yes": 5.0}, (("Yes", 5.0),)),))
    assert "finite number at most 0" in answer_problem(yes5)
    assert read_alternatives(yes5).error is not None  # "Yes: +5" is no p(yes) = 0.998
    big = ChatResponse("9" * 40_000, ())
    assert "max_tokens=8 allows at most 8192" in answer_problem(big, max_tokens=8)


@FAST
@given(PAIRS)
def test_listed_probabilities_accepts_only_a_distribution(pairs):
    try:
        listed = listed_probabilities(pairs)
    except MalformedAnswer as exc:
        assert str(exc)
        return
    assert all(_probability_ok(p) for _, p in listed) and sum(p for _, p in listed) <= 1 + 1e-3
    assert all(isinstance(v, float) and math.isfinite(v) and v <= 1e-4 for _, v in pairs)


# ------------------------------------------------------------------------ every reader, directly
@FAST
@given(PAIRS, st.sampled_from(["", " "]))
def test_a_digit_tree_node_never_raises(pairs, lead):
    node = read_node(pairs, lead)
    if node.error is None:
        assert np.all((node.probs >= 0) & (node.probs <= 1)) and node.probs.sum() <= 1 + 1e-3
        assert math.isfinite(node.unlisted) and node.unlisted >= 0


@FAST
@given(PAIRS)
def test_gveval_alternatives_never_raise_anything_but_a_malformed_answer(pairs):
    try:
        p = alternatives_distribution(pairs, strip=True)
    except MalformedAnswer:
        p = None
    assert p is None or (np.all(p >= 0) and abs(p.sum() - 1) < 1e-9)
    p, why = alternatives_after_marker(["$"] + [t for t, _ in pairs[:1]], [(), pairs], "$")
    assert (p is None) == (why is not None)


@FAST
@given(st.lists(responses(), min_size=1, max_size=4), st.data())
def test_number_readers_never_raise(resps, data):
    markers = [data.draw(st.sampled_from(["$", None])) for _ in resps]
    probs, reasons = alternative_distributions(resps, markers)
    for p, why in zip(probs, reasons):
        assert (p is None) == (why is not None) and (p is None or abs(p.sum() - 1) < 1e-9)
    backend = Scripted([data.draw(responses()) for _ in range(3)])
    requests = [ChatRequest((user_turn("rate", [IMAGE]),)) for _ in resps]
    for read in remote_distributions(backend, requests, resps, markers):
        assert (read.probs is None) == (read.error is not None)
        if read.probs is not None:
            assert np.all(read.probs >= 0) and read.probs.sum() <= 1 + 1e-6


@FAST
@given(st.lists(responses(), min_size=1, max_size=4))
def test_fleur_reader_never_raises(resps):
    result = RemoteFLEUR(Scripted([]), max_tokens=64).read(resps)
    for i, score in enumerate(result.score.tolist()):
        assert (math.isnan(score) and result.error[i]) or 0.0 <= score <= 1.0


@FAST
@given(responses())
def test_yes_no_and_letter_readers_never_raise(response):
    reading = read_alternatives(response)
    if reading.error is None:
        assert _probability_ok(reading.p_yes) and _probability_ok(reading.p_no)
        assert reading.p_yes + reading.p_no <= 1 + 1e-3
    first = response.tokens[0] if response.tokens else None
    p = yes_probability(first.top if first is not None else {})
    assert p is None or _probability_ok(p)
    qa = QAUtility(Scripted([response]), cache_size=0)
    result = qa.score(["a red ball"], questions=[[{"question": "What colour?", "options": ["red", "blue"], "answer": 0}]])
    assert (math.isnan(result.score[0]) and result.error[0]) or 0 <= result.score[0] <= 1


def test_scorers_give_none_with_the_reason_for_a_1000_logprob():
    """The issue's crash: a logprob above ~709 made math.exp raise OverflowError out of G-VEval and the
    claims scorer, and the whole batch failed. Now that sample has no score and the reason."""
    lie = ChatResponse("The score is $9$.", (
        TokenLogprob("The score is ", -0.1, {"The score is ": -0.1}),
        TokenLogprob("$", -0.1, {"$": -0.1}),
        TokenLogprob("9", 1000.0, {"9": 1000.0, "8": -3.0}, (("9", 1000.0), ("8", -3.0))),
        TokenLogprob("$", -0.1, {"$": -0.1}),
        TokenLogprob(".", -0.1, {".": -0.1}),
    ), finish_reason="stop")
    result = GVEval(Scripted([lie]), requery=0, max_tokens=64).score(["a red car"], images=[IMAGE])
    assert math.isnan(result.score[0]) and "malformed answer" in result.error[0] and "1000.0" in result.error[0]
    result = VisCE2(Scripted([lie]), expected=True).score(["a red car"], [IMAGE])
    assert math.isnan(result.expected[0]) and "1000.0" in result.expected_error[0]
    yes = ChatResponse("Yes", (TokenLogprob("Yes", 1000.0, {"Yes": 1000.0}, (("Yes", 1000.0),)),))
    claims = ClaimScorer(Scripted([yes]), cache_size=0).score(["a red car."], [IMAGE])
    assert math.isnan(claims.score[0]) and "1000.0" in str(claims.error[0])
    assert YesNoReader(Scripted([yes])).read([ChatRequest((user_turn("?", [IMAGE]),))])[0].error is not None


def test_rewards_on_a_lying_judge_give_none_not_an_exception():
    """The issue's GVEvalReward and ClaimsReward on a remote judge: one lying answer is one None."""
    from capreward.rewards import GVEvalReward
    from capreward.rewards.claims import ClaimsReward

    lie = ChatResponse("The score is $9$.", (
        TokenLogprob("The score is ", -0.1, {"The score is ": -0.1}),
        TokenLogprob("$", -0.1, {"$": -0.1}),
        TokenLogprob("9", 1000.0, {"9": 1000.0}, (("9", 1000.0),)),
        TokenLogprob("$", -0.1, {"$": -0.1}),
    ), finish_reason="stop")
    values = GVEvalReward(backend=Scripted([lie]), requery=0, max_tokens=64)(None, ["a red car"], image=[IMAGE])
    assert values == [None]
    yes = ChatResponse("Yes", (TokenLogprob("Yes", 1000.0, {"Yes": 1000.0}, (("Yes", 1000.0),)),))
    assert ClaimsReward(scorer=ClaimScorer(Scripted([yes]), cache_size=0))(None, ["a red car."], image=[IMAGE]) == [None]


# ----------------------------------------------------------------- through a lying HTTP server
@pytest.fixture(scope="module")
def liar(tmp_path_factory):
    with ChatServer("echo", model="liar", log_path=tmp_path_factory.mktemp("liar") / "server.log") as server:
        yield server


def _judge(server, **kw):
    kw.setdefault("max_retries", 0)
    return OpenAIJudge(server.base_url, "liar", api_key_env=None, timeout=30, **kw)


def _completion(content, logprobs, finish="stop"):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "liar",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": {"content": logprobs}, "finish_reason": finish}]}


def _entry(token, lp, top):
    return {"token": token, "logprob": lp, "bytes": None, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8) | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def lying_bodies(draw):
    """Random JSON, or chat completions whose log-probabilities are random lies."""
    if draw(st.booleans()):
        return draw(JSON)
    toks = [_entry(t, lp, draw(PAIRS)) for t, lp in draw(st.lists(st.tuples(TEXTS, LIES), max_size=6))]
    return _completion(draw(st.sampled_from(["The score is $85$.", "Yes", "0.8", "B", None, 7])), toks,
                       draw(st.sampled_from(["stop", "length"])))


def test_random_lies_through_the_server_never_reach_a_reader_unchecked(liar):
    judge = _judge(liar, cache_size=64)
    request = ChatRequest((user_turn("rate it"),), max_tokens=16, top_logprobs=5)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(lying_bodies())
    def check(body):
        liar.control(reset=True)
        liar.control(body=body)
        [answer] = judge.generate([request])
        if answer.ok:
            assert answer_problem(answer, request.max_tokens) is None  # what reaches readers is checked
        read_alternatives(answer)
        alternative_distributions([answer], ["$"])
        RemoteFLEUR(judge, max_tokens=16).read([answer])
        if not answer.ok:  # a refused answer is never cached: the same request is sent again
            before = liar.stats()["chat_requests"]
            judge.generate([request])
            assert liar.stats()["chat_requests"] == before + 1

    check()


def test_a_lying_answer_is_asked_again_and_the_honest_retry_is_used(liar):
    liar.control(reset=True)
    liar.control(body=_completion("Yes", [_entry("Yes", 5.0, [("Yes", 5.0)])]))
    judge = _judge(liar, max_retries=2, cache_size=8)
    request = ChatRequest((user_turn("is it red?"),), max_tokens=4, top_logprobs=2)
    [answer] = judge.generate([request])
    assert answer.ok and answer.text.startswith("echo:")  # the second attempt, from the honest backend
    assert liar.stats()["chat_requests"] == 2
    liar.control(reset=True)
    liar.control(body=_completion("Yes", [_entry("Yes", 5.0, [("Yes", 5.0)])]), count=3)
    [answer] = judge.generate([ChatRequest((user_turn("is it blue?"),), max_tokens=4, top_logprobs=2)])
    assert not answer.ok and "malformed response" in answer.error and "finite number at most 0" in answer.error


@pytest.mark.parametrize("chunked", [False, True])
def test_an_answer_past_the_byte_bound_is_not_read_whole(liar, chunked):
    liar.control(reset=True)
    liar.control(oversize=4_000_000, chunked=chunked)
    judge = _judge(liar, max_response_bytes=200_000)
    [answer] = judge.generate([ChatRequest((user_turn("x"),), max_tokens=8)])
    assert not answer.ok and "malformed response" in answer.error and "200000" in answer.error
    liar.control(reset=True)
    liar.control(oversize=40_000, chunked=chunked)  # under the byte bound, but far past max_tokens=8
    [answer] = _judge(liar).generate([ChatRequest((user_turn("x"),), max_tokens=8)])
    assert not answer.ok and "max_tokens=8 allows at most 8192" in answer.error


def test_the_cache_bounds_bytes_as_well_as_entries(liar):
    liar.control(reset=True)
    judge = _judge(liar, cache_size=1000, cache_bytes=200_000)
    requests = [ChatRequest((user_turn(f"sample {i} " + "word " * 40),), max_tokens=64, top_logprobs=5) for i in range(30)]
    judge.generate(requests)
    assert 0 < len(judge._cache) < 30 and judge._cache_total <= 200_000
    sent = liar.stats()["chat_requests"]
    judge.generate(requests[-1:])  # the most recent is kept
    assert liar.stats()["chat_requests"] == sent


def test_parse_completion_keeps_the_values_answer_problem_refuses():
    from types import SimpleNamespace as NS

    item = NS(token="9", logprob=1000.0, top_logprobs=[NS(token="9", logprob=1000.0)])
    completion = NS(choices=[NS(message=NS(content="9"), logprobs=NS(content=[item]), finish_reason="stop")],
                    model_extra={"prompt_logprobs": [None, {"5": {"logprob": float("nan"), "rank": 1, "decoded_token": "x"}}]})
    response = parse_completion(completion)
    assert "1000.0" in answer_problem(response)
    clean = ChatResponse("9", (TokenLogprob("9", -0.1, {"9": -0.1}),), prompt_logprobs=response.prompt_logprobs)
    assert "prompt log-probabilities at position 1" in answer_problem(clean)
