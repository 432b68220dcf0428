"""Reading a remote judge's score distribution whatever its tokenizer (capreward.scorers.remote_numbers):
against a synthetic judge whose distribution over the numbers is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capreward.judges.protocol import ChatRequest, ChatResponse, SyncBackendMixin, TokenLogprob, user_turn
from capreward.metrics.gveval import alternatives_after_marker, expected_score
from capreward.scorers.remote_numbers import locate_number, read_node, remote_distributions

DIGITS = [str(d) for d in range(10)]


class DigitJudge(SyncBackendMixin):
    """A judge that writes numbers one digit per token: after "...$" and the digits written so far it
    puts a seeded random probability on each digit, on "$" (the end) and a tiny one on 30 filler words.
    Answers prefilled requests (the last turn an assistant message) with one token and its
    ``top_logprobs`` alternatives."""

    name = "digit-judge"

    def __init__(self, seed: int = 0, filler: int = 30):
        self.seed = seed
        self.filler = filler
        self.sent: list[ChatRequest] = []

    def next_token(self, written: str) -> dict[str, float]:
        rng = np.random.default_rng([self.seed, len(written), int(written or "0"), 7])
        weights = rng.dirichlet(np.ones(11)) + 1e-3
        if len(written) >= 2:
            weights[10] += 5.0  # numbers mostly end after two digits
        weights = weights / weights.sum() * (1 - 1e-6)
        probs = {d: float(w) for d, w in zip(DIGITS, weights)}
        probs["$"] = float(weights[10])
        probs.update({f"w{j}": 1e-6 / self.filler for j in range(self.filler)})
        return probs

    def generate(self, requests):
        out = []
        for request in requests:
            self.sent.append(request)
            assert request.prefilled and request.max_tokens == 1
            text = request.turns[-1].text
            probs = self.next_token(text[text.rindex("$") + 1 :])
            ranked = tuple(sorted(((t, math.log(p)) for t, p in probs.items()), key=lambda kv: -kv[1])[: request.top_logprobs])
            out.append(ChatResponse(ranked[0][0], (TokenLogprob(ranked[0][0], ranked[0][1], dict(ranked), ranked),)))
        return out


def exact_expected(judge: DigitJudge) -> float:
    """Σ n p(n) / Σ p(n) over 0..100 by enumerating each number's spelling: p(digits) p(end | digits),
    the end being any token that is not a digit."""
    q = np.zeros(101)
    for n in range(101):
        spelled, p = str(n), 1.0
        for j, d in enumerate(spelled):
            p *= judge.next_token(spelled[:j])[d]
        after = judge.next_token(spelled)
        q[n] = p * (1.0 - sum(after[d] for d in DIGITS))
    return expected_score(q)


def greedy_response(judge: DigitJudge, answer_digits: str, top: int = 20) -> ChatResponse:
    """The response "The final score is $<digits>$" with the judge's alternatives at each digit."""
    tokens = [TokenLogprob("The", -0.1), TokenLogprob(" final", -0.1), TokenLogprob(" score", -0.1),
              TokenLogprob(" is", -0.1), TokenLogprob(" $", -0.1)]
    for j, d in enumerate(answer_digits):
        probs = judge.next_token(answer_digits[:j])
        ranked = tuple(sorted(((t, math.log(p)) for t, p in probs.items()), key=lambda kv: -kv[1])[:top])
        tokens.append(TokenLogprob(d, math.log(probs[d]), dict(ranked), ranked))
    tokens.append(TokenLogprob("$", -0.01))
    text = "".join(t.token for t in tokens)
    return ChatResponse(text, tuple(tokens), finish_reason="stop")


REQUEST = ChatRequest(turns=(user_turn("rate it"),), top_logprobs=20)


def test_digit_tree_gives_the_exact_expected_score_of_a_digit_by_digit_judge():
    judge = DigitJudge()
    response = greedy_response(judge, "85")
    site = locate_number(response.tokens, "$")
    assert (site.kind, site.prefix, site.lead) == ("split", "The final score is $", "")
    (read,) = remote_distributions(judge, [REQUEST], [response], ["$"])
    assert read.method == "tree" and read.error is None
    assert expected_score(read.probs) == pytest.approx(exact_expected(judge), abs=1e-9)
    assert read.bound == 0.0
    # the released rule on the same response: an expectation over the first digit only
    wrong, _ = alternatives_after_marker([t.token for t in response.tokens], [t.ranked for t in response.tokens], "$")
    assert abs(expected_score(wrong) - exact_expected(judge)) > 5
    # every node request continued the answer: the prefix, then the digits of the node
    texts = {r.turns[-1].text for r in judge.sent}
    assert "The final score is $8" in texts and "The final score is $10" in texts and "The final score is $100" in texts
    assert all(r.turns[:-1] == REQUEST.turns and r.temperature == 0.0 for r in judge.sent)


def test_missing_digits_are_bounded_then_refused_beyond_the_tolerance():
    judge = DigitJudge(1)
    response = greedy_response(judge, "7", top=4)
    few = remote_distributions(judge, [REQUEST], [response], ["$"], top_logprobs=4)[0]
    assert few.probs is None and "uncertain by up to" in few.error and few.bound > 1e-4
    loose = remote_distributions(judge, [REQUEST], [response], ["$"], top_logprobs=4, tolerance=math.inf)[0]
    assert loose.probs is not None and abs(expected_score(loose.probs) - exact_expected(judge)) <= loose.bound
    # the root's five alternatives miss digits: it is asked again with 20 alternatives, and the tree is exact
    full = remote_distributions(judge, [REQUEST], [greedy_response(judge, "7", top=5)], ["$"])[0]
    assert full.bound == 0.0 and expected_score(full.probs) == pytest.approx(exact_expected(judge), abs=1e-9)


def test_whole_number_tokens_keep_the_released_rule():
    top = (("85", math.log(0.6)), ("90", math.log(0.3)), ("8", math.log(0.05)))
    tokens = (TokenLogprob("$", -0.1), TokenLogprob("85", math.log(0.6), dict(top), top), TokenLogprob("$", -0.1))
    response = ChatResponse("$85$", tokens)
    assert locate_number(tokens, "$").kind == "whole"
    (read,) = remote_distributions(None, [REQUEST], [response], ["$"])
    assert read.method == "alternatives"
    assert expected_score(read.probs) == pytest.approx((85 * 0.6 + 90 * 0.3 + 8 * 0.05) / 0.95)
    one = (TokenLogprob("$", -0.1), TokenLogprob("8", 0.0, {"8": -0.1, "10": -3.0}, (("8", -0.1), ("10", -3.0))))
    assert locate_number(one, "$").kind == "whole"  # a multi-digit alternative: whole-number tokens


def test_unreadable_tokenisations_give_a_reason():
    chunks = (TokenLogprob("$", 0.0), TokenLogprob("10", 0.0), TokenLogprob("0", 0.0))
    assert "multi-digit tokens" in locate_number(chunks, "$").error
    merged = (TokenLogprob("is", 0.0), TokenLogprob(" $85", 0.0))
    assert "shares the token" in locate_number(merged, "$").error
    assert "no '$'" in locate_number((TokenLogprob("85", 0.0),), "$").error
    assert locate_number((TokenLogprob("a", 0.0), TokenLogprob(" 7", 0.0)), None).lead == " "
    bad = read_node((("8", -0.5), ("85", -2.0)))
    assert bad.error and "more than one digit" in bad.error


def test_a_server_that_refuses_prefill_gives_none_with_its_reason():
    class Refusing(SyncBackendMixin):
        name = "no-prefill"

        def generate(self, requests):
            return [ChatResponse("", error="HTTP 400 (unknown field continue_final_message)") for _ in requests]

    response = greedy_response(DigitJudge(), "85")
    (read,) = remote_distributions(Refusing(), [REQUEST], [response], ["$"])
    assert read.probs is None and "continue_final_message" in read.error and "prefilled request failed" in read.error


def test_lossy_token_strings_take_the_prefix_from_the_answer_text():
    # "α" closing a score is written as two byte tokens, each read "\ufffd"; the next score's prefix
    # must be the real text, or the server would be asked to continue from replacement characters
    pieces = [" is", " α", "8", "\ufffd", "\ufffd", ".", " is", " β", "7", "8"]
    tokens = tuple(TokenLogprob(p, 0.0, {p: 0.0}, ((p, 0.0),)) for p in pieces)
    site = locate_number(tokens, "β", text="is α8α. is β78")
    assert site.kind == "split" and site.prefix == " is α8α. is β"
    assert locate_number(tokens, "α", text="is α8α. is β78").prefix == " is α"
