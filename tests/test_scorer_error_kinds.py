"""Every scorer gives an unscored sample a typed :class:`~capreward.errors.SampleError` (its kind says what
failed), never a plain-text reason a consumer would have to parse; the texts stay as they were.

The judges here are scripted backends (a failed request, an answer without log-probabilities, an answer
with them), so each kind is produced on purpose; the CLIP scorers run on the tiny local CLIP."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from capreward.errors import SampleError
from capreward.judges.protocol import ChatResponse, SyncBackendMixin, TokenLogprob


class ScriptedBackend(SyncBackendMixin):
    """Answers every request with ``answer(request)`` (a :class:`ChatResponse`)."""

    name = "scripted"

    def __init__(self, answer):
        self.answer = answer

    def generate(self, requests):
        return [self.answer(r) for r in requests]


def failed(_request):
    return ChatResponse(text="", error="HTTP 500 after 3 retries")


def no_logprobs(_request):
    return ChatResponse(text="yes")


def yes(_request):
    return ChatResponse(text="yes", tokens=(TokenLogprob("yes", -0.1, {"yes": -0.1, "no": -2.5}),))


def kinds(errors):
    assert all(e is None or type(e) is SampleError for e in errors), [type(e) for e in errors]
    return [None if e is None else e.kind for e in errors]


@pytest.fixture(scope="module")
def picture():
    return Image.new("RGB", (32, 32), (200, 30, 30))


def test_clip_scorers_give_typed_errors_with_the_old_texts(tiny_clip_path, picture, tmp_path):
    from capreward import CLIPScore

    scorer = CLIPScore(model=str(tiny_clip_path), device="cpu")
    missing = str(tmp_path / "missing.png")
    r = scorer.score(["a red square.", "", "a red square.", "a red square."],
                     images=[picture, picture, missing, picture],
                     references=[["a red square."], ["a square."], ["a square."], [""]], errors="nan")
    assert kinds(r.errors) == [None, "input", "media", "input"]
    assert r.errors[1] == "empty caption" and r.errors[3] == "references[0]: empty caption"
    assert r.errors[2].message == "file does not exist" and "missing.png" in r.errors[2].item
    assert r.errors[1].index == 1 and r.errors[3].renamed(3, "labels[3] references") == \
        "labels[3] references[0]: empty caption"  # the item travels: a consumer renames it, never re-parses
    assert not math.isnan(float(r.score[0])) and all(math.isnan(float(v)) for v in r.score[1:])


@pytest.mark.parametrize("answer,kind,text", [
    (failed, "judge_unavailable", "claim not verified: HTTP 500 after 3 retries"),
    (no_logprobs, "judge_unreadable", "claim not verified: the backend returned no token log-probabilities"),
])
def test_claims_errors_say_whether_the_judge_failed_or_answered_unreadably(picture, answer, kind, text):
    from capreward.scorers.claims import ClaimScorer

    scorer = ClaimScorer(ScriptedBackend(answer), coverage="lexical")
    r = scorer.score(["A red square sits on the table.", "   "], images=[picture, picture],
                     references=[["a red square."], ["a red square."]])
    assert kinds(r.error) == [kind, "input"]
    assert r.error[0] == text and r.error[1] == "empty caption"


def test_claims_scores_with_an_answering_judge(picture):
    from capreward.scorers.claims import ClaimScorer

    r = ClaimScorer(ScriptedBackend(yes), coverage="lexical").score(["A red square."], images=[picture],
                                                                      references=[["a red square."]])
    assert r.error == [None] and 0 < float(r.score[0]) <= 1


@pytest.mark.parametrize("answer,kind,text", [
    (failed, "judge_unavailable", "question not answered: HTTP 500 after 3 retries"),
    (no_logprobs, "judge_unreadable", "question not answered: the backend returned no token log-probabilities"),
])
def test_qa_utility_errors_are_typed(answer, kind, text):
    from capreward.scorers.qa_utility import QAUtility

    question = {"question": "What colour is the square?", "options": ["red", "blue"], "answer": "A"}
    r = QAUtility(ScriptedBackend(answer)).score(["A red square.", "", "A red square."],
                                                 questions=[[question], [question], []])
    assert kinds(r.error) == [kind, "input", "input"]
    assert r.error == [text, "empty caption",
                       "questions[2]: questions is an empty list (leave it out to have the judge write them)"]


def test_a_reward_keeps_the_scorers_kind(picture):
    """The reward names the completion and keeps the kind the scorer stated (a failed judge request is
    not an unreadable answer, though the reward's default kind for plain text says so)."""
    from capreward.rewards.qa_utility import QAUtilityReward
    from capreward.scorers.qa_utility import QAUtility

    question = {"question": "What colour is the square?", "options": ["red", "blue"], "answer": "A"}
    reward = QAUtilityReward(scorer=QAUtility(ScriptedBackend(failed)))
    out = reward.compute(None, ["A red square."], questions=[[question]])
    assert out.values == [None]
    (e,) = out.reasons
    assert type(e) is SampleError and e.kind == "judge_unavailable"
    assert e == "completions[0]: question not answered: HTTP 500 after 3 retries"
