"""G-VEval against the released ``scorer.py`` (ztangaj/gveval): the request a server receives (captured by
a real local chat server), the re-query of unreadable answers, and duplicate top alternatives."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from capreward import GVEval
from capreward.judges.protocol import ChatResponse, SyncBackendMixin, TokenLogprob
from capreward.judges.remote import OpenAIJudge, parse_completion
from capreward.judges.vlm_prompts import gveval_prompt, gveval_template
from capreward.metrics.gveval import alternatives_after_marker, expected_score
from capreward.testing.chat_server import ChatServer
from capreward.testing.tiny_llava import fleur_task_image
from capreward.testing.tiny_vlm_judges import synthetic_video

RELEASE_MODEL = "gpt-4o-2024-05-13"


def release_normalize(alternatives):
    """The released ``Scorer.normalize_responses`` on ``[(token, logprob), ...]`` (retyped): one dict
    assignment per alternative, so a later duplicate overwrites an earlier one; then Σ n·p(n)."""
    updated = {str(i): 0 for i in range(101)}
    for token, logprob in alternatives:
        if token in updated:
            updated[token] = math.exp(logprob)
    total = sum(updated.values())
    return sum(int(k) * v / total for k, v in updated.items())


# --------------------------------------------------------------------------- the request (item 4)
@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("gveval-echo") / "server.log"
    with ChatServer("echo", model=RELEASE_MODEL, log_path=log) as server:
        yield server


def test_request_matches_the_released_scorer(echo_server):
    # The default model is the release's snapshot: the server serves only that name (404 otherwise).
    judge = OpenAIJudge(echo_server.base_url, api_key_env=None, max_retries=0)
    image = fleur_task_image("red", random.Random(0))
    echo_server.control(reset=True)
    result = GVEval(judge, mode="combined").score(["a red car"], images=[image], references=[["a car", "a red car"]])
    bodies = echo_server.requests()
    # The echo answer has no "$N$": unreadable, asked again twice (the release's three attempts), then NaN.
    assert len(bodies) == 3 and np.isnan(result.score[0]) and "no score" in result.error[0]
    body = bodies[0]
    assert body["model"] == RELEASE_MODEL
    assert "max_tokens" not in body and "max_completion_tokens" not in body  # the release sets no limit
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["temperature"] == 0.0  # our deliberate deviation (the release: 1); temperature=1.0 restores it
    (message,) = body["messages"]
    text, picture = message["content"]  # text first, then the image, as released
    assert message["role"] == "user"
    assert text == {"type": "text", "text": gveval_prompt(gveval_template("img", "combined"), "a red car", ["a car", "a red car"])}
    assert picture["type"] == "image_url" and picture["image_url"]["detail"] == "low"
    assert picture["image_url"]["url"].startswith("data:image/png;base64,")


def test_video_images_go_in_high_detail_and_ref_only_without_visual_as_system(echo_server):
    judge = OpenAIJudge(echo_server.base_url, api_key_env=None, max_retries=0)
    echo_server.control(reset=True)
    GVEval(judge, mode="ref-free", requery=0).score(["a red car"], videos=[synthetic_video("red")])
    (body,) = echo_server.requests()
    assert body["messages"][0]["content"][1]["image_url"]["detail"] == "high"  # video: always "high"
    echo_server.control(reset=True)
    GVEval(judge, mode="ref-free", requery=0, resolution="high").score(["a red car"], images=[fleur_task_image("red", random.Random(0))])
    assert echo_server.requests()[0]["messages"][0]["content"][1]["image_url"]["detail"] == "high"
    echo_server.control(reset=True)
    result = GVEval(judge, mode="ref-only", requery=0).score(["a red car"], references=[["a car"]])
    (body,) = echo_server.requests()
    prompt = gveval_prompt(gveval_template("img", "ref-only"), "a red car", ["a car"])
    assert body["messages"] == [{"role": "system", "content": prompt}]
    assert result.raw[0] == "echo: " + prompt  # the server answered the system prompt


# ------------------------------------------------------------------ synthetic top-logprobs answers
def answer(score_alternatives, written="85"):
    """A response "Fine. The final score is $<written>$." tokenised like GPT-4o ("$" its own token, the
    number one token) with ``score_alternatives`` [(text, logprob), ...] at the number."""
    if score_alternatives is None:
        return ChatResponse(text="Fine. No score today.", tokens=(TokenLogprob("Fine", -0.1, {"Fine": -0.1}),), finish_reason="stop")
    pieces = ["Fine", ".", " The", " final", " score", " is", " $", written, "$."]
    tokens = []
    for piece in pieces:
        if piece == written:
            top = {}
            for t, lp in score_alternatives:
                top.setdefault(t, lp)
            tokens.append(TokenLogprob(piece, score_alternatives[0][1], top, tuple(score_alternatives)))
        else:
            tokens.append(TokenLogprob(piece, -0.01, {piece: -0.01}, ((piece, -0.01),)))
    return ChatResponse(text="".join(pieces), tokens=tuple(tokens), finish_reason="stop")


class ScriptedServer(SyncBackendMixin):
    """A backend that plays back scripted answers per caption (one per time the caption is asked), as a
    remote server with top logprobs would answer; counts the requests."""

    name = "scripted"

    def __init__(self, script):
        self.script = {caption: list(answers) for caption, answers in script.items()}
        self.asked: list[str] = []

    def generate(self, requests):
        out = []
        for request in requests:
            caption = next(c for c in self.script if f"Generated captions:\n{c}\n" in request.turns[0].text)
            self.asked.append(caption)
            answers = self.script[caption]
            out.append(answers.pop(0) if len(answers) > 1 else answers[0])
        return out


def test_duplicate_alternatives_keep_the_last_as_released():
    alternatives = [("85", math.log(0.5)), ("90", math.log(0.2)), ("85", math.log(0.1)), ("x", math.log(0.1))]
    response = answer(alternatives)
    probs, why = alternatives_after_marker([t.token for t in response.tokens], [t.ranked for t in response.tokens], "$")
    assert why is None and probs[85] == pytest.approx(0.1 / 0.3) and probs[90] == pytest.approx(0.2 / 0.3)
    assert expected_score(probs) == pytest.approx(release_normalize(alternatives))
    result = GVEval(ScriptedServer({"a red car": [response]})).score(["a red car"], images=[fleur_task_image("red", random.Random(0))])
    assert result.score[0] == pytest.approx(release_normalize(alternatives)) and result.source == ["expected"]
    assert result.score[0] == pytest.approx((85 * 0.1 + 90 * 0.2) / 0.3)


def test_parse_completion_keeps_every_listed_alternative_in_order():
    from openai.types.chat import ChatCompletion

    top = [{"token": "85", "logprob": -0.7}, {"token": "90", "logprob": -1.6}, {"token": "85", "logprob": -2.3}]
    completion = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": RELEASE_MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "$85$"},
                     "logprobs": {"content": [
                         {"token": "$", "logprob": -0.01, "top_logprobs": [{"token": "$", "logprob": -0.01}]},
                         {"token": "85", "logprob": -0.7, "top_logprobs": top},
                     ]}}],
    })  # fmt: skip
    parsed = parse_completion(completion).tokens[1]
    assert parsed.ranked == (("85", -0.7), ("90", -1.6), ("85", -2.3))
    assert parsed.top == {"85": -0.7, "90": -1.6}  # the first, most likely, for readers that want one value


# ------------------------------------------------------------------------------- re-query (item 5)
def test_unreadable_answers_are_asked_again_then_nan_and_no_sample_moves():
    good = [("85", math.log(0.6)), ("80", math.log(0.4))]
    later = [("70", math.log(1.0))]
    script = {
        "cap a": [answer(good)],  # readable at once
        "cap b": [answer(None), answer(later, "70")],  # unreadable, then readable on the first re-query
        "cap c": [answer(None)],  # never readable
        "cap d": [answer([("high", -0.1)], "high")],  # a "$" but no integer alternative: unreadable
    }
    images = [fleur_task_image("red", random.Random(k)) for k in range(4)]
    server = ScriptedServer(script)
    result = GVEval(server).score(list(script), images=images)
    assert server.asked.count("cap a") == 1 and server.asked.count("cap b") == 2
    assert server.asked.count("cap c") == 3 and server.asked.count("cap d") == 3  # the release's three attempts
    assert result.score[0] == pytest.approx(0.6 * 85 + 0.4 * 80) and result.score[1] == pytest.approx(70)
    assert np.isnan(result.score[2]) and "no '$'" in result.error[2] and result.source[2] is None
    assert np.isnan(result.score[3]) and "no alternative after '$'" in result.error[3]
    assert result.error[:2] == [None, None] and result.raw[1].endswith("$70$.")

    once = ScriptedServer({k: list(v) for k, v in script.items()})
    no_requery = GVEval(once, requery=0).score(list(script), images=images)
    assert len(once.asked) == 4 and np.isnan(no_requery.score[1]) and no_requery.score[0] == result.score[0]


def test_fallback_parsed_uses_the_written_number_after_the_requeries():
    script = {"cap d": [answer([("high", -0.1)], "77")]}  # "$77$" written, no integer among alternatives
    server = ScriptedServer(script)
    result = GVEval(server, fallback="parsed", requery=1).score(["cap d"], images=[fleur_task_image("red", random.Random(0))])
    assert len(server.asked) == 2 and result.score[0] == 77 and result.source == ["parsed"] and result.error == [None]
    with pytest.raises(ValueError, match="fallback"):
        GVEval(server, fallback="zero")
    with pytest.raises(ValueError, match="requery"):
        GVEval(server, requery=-1)
