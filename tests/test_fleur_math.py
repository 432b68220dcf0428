"""FLEUR's pure math and parsing, on hand-made answers and hand-computed distributions."""

from __future__ import annotations

import math

import pytest
import torch

from capreward.judges.prompts import fleur_prompt, llava_v1_conversation
from capreward.metrics.fleur import (
    ONE,
    ONE_DECIMAL,
    TWO_DECIMALS,
    FleurReading,
    char_steps_from_prefixes,
    check_digit_tokens,
    digit_probabilities,
    expected_digit,
    extract_number,
    fleur_from_digit_probs,
    parse_fleur_answer,
    raw_scores,
    release_token_search,
)


def llama_like(answer: str) -> tuple[str, list[int]]:
    """Text and char->step map for ``answer`` written LLaMA-style: a lone "▁" step first (decoded as
    nothing, the decoder strips the leading space), then one step per character."""
    prefixes = [""] + [answer[: k + 1] for k in range(len(answer))]
    return char_steps_from_prefixes(prefixes)


# ------------------------------------------------------------------------------------ char -> step map
def test_char_steps_follow_the_prefix_that_first_shows_each_character():
    text, steps = char_steps_from_prefixes(["", "0", "0.", "0.8", "0.85"])
    assert text == "0.85"
    assert steps == [1, 2, 3, 4]


def test_char_steps_survive_decoders_that_rewrite_earlier_text():
    # A decoder that shows a space for a lone "▁" and strips it once a character follows.
    text, steps = char_steps_from_prefixes([" ", "0", "0.", "0.5"])
    assert text == "0.5" and steps == [1, 2, 3]
    # Byte fallback: a two-byte character appears only after its second byte.
    text, steps = char_steps_from_prefixes(["", "", "é", "é1"])
    assert text == "é1" and steps == [2, 3]
    # A token that writes several characters owns all of them.
    text, steps = char_steps_from_prefixes(["no", "no idea"])
    assert steps == [0, 0, 1, 1, 1, 1, 1]
    assert char_steps_from_prefixes([]) == ("", [])


# ------------------------------------------------------------------------------------- number reading
@pytest.mark.parametrize(
    "text, number, positions",
    [
        ("0.85", "0.85", [0, 1, 2, 3]),
        ("Score: 0.85.", "0.85", [7, 8, 9, 10]),
        ("..0.5..", "0.5", [2, 3, 4]),
        ("no idea", "", []),
        ("0.8 or 0.9", "0.80.9", [0, 1, 2, 7, 8, 9]),
    ],
)
def test_extract_number_keeps_digits_and_dots_like_the_released_code(text, number, positions):
    assert extract_number(text) == (number, positions)


def test_two_decimals_are_read_at_their_own_steps():
    text, steps = llama_like("0.85")
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.value, r.steps, r.digits, r.error) == (TWO_DECIMALS, 0.85, (3, 4), (8, 5), None)


def test_trailing_zero_does_not_make_a_second_decimal():
    # str(float("0.50")) == "0.5": one decimal, as in the released code.
    text, steps = llama_like("0.50")
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.steps, r.digits) == (ONE_DECIMAL, (3,), (5,))


def test_zero_point_zero_reads_the_zero_after_the_dot():
    text, steps = llama_like("0.0")
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.value, r.steps, r.digits) == (ONE_DECIMAL, 0.0, (3,), (0,))


@pytest.mark.parametrize("answer, units_step", [("1.0", 1), ("1", 1), ("1.00", 1), ("01.0", 2)])
def test_one_is_read_at_the_units_digit(answer, units_step):
    text, steps = llama_like(answer)
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.value, r.steps, r.digits) == (ONE, 1.0, (units_step,), (1,))


def test_more_decimals_read_the_first_two():
    text, steps = llama_like("0.123")
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.steps, r.digits) == (TWO_DECIMALS, (3, 4), (1, 2))


def test_zero_without_a_dot_reads_the_units_digit_as_the_released_code_does():
    text, steps = llama_like("0")
    r = parse_fleur_answer(text, steps)
    assert (r.rule, r.value, r.steps, r.digits) == (ONE_DECIMAL, 0.0, (1,), (0,))


def test_leading_dot_and_surrounding_words():
    # The released code strips leading dots, so ".5" reads as 5: out of range, no score (not 0.5).
    r = parse_fleur_answer(*llama_like(".5"))
    assert (r.rule, r.value) == (None, 5.0) and "outside" in r.error
    text = "Score: 0.05"
    r = parse_fleur_answer(text, list(range(len(text))))
    assert (r.rule, r.steps, r.digits) == (TWO_DECIMALS, (9, 10), (0, 5))


def test_float_printing_decides_the_decimals():
    text = "0.1000000000000000055511"  # float() rounds it to 0.1: one decimal
    r = parse_fleur_answer(text)
    assert (r.rule, r.steps, r.digits) == (ONE_DECIMAL, (2,), (1,))


@pytest.mark.parametrize(
    "answer, fragment, value",
    [
        ("no idea", "contains no number", None),
        ("", "contains no number", None),
        ("1.5", "outside [0, 1]", 1.5),
        ("2", "outside [0, 1]", 2.0),
        ("0.8.5", "does not read as a number", None),
        ("0.00001", "cannot be located", 1e-05),
        ("0.0999999999999999999", "do not match", 0.1),
    ],
)
def test_unreadable_answers_give_no_score_and_a_reason(answer, fragment, value):
    r = parse_fleur_answer(answer)
    assert not r.ok and r.rule is None and r.steps == ()
    assert fragment in r.error
    assert r.value == value


def test_digits_merged_into_one_token_are_refused():
    text = "0.85"
    steps = [0, 1, 2, 2]  # "85" came from one token
    r = parse_fleur_answer(text, steps)
    assert not r.ok and "one token" in r.error


def test_char_steps_must_match_the_text():
    with pytest.raises(ValueError, match="char_steps"):
        parse_fleur_answer("0.5", [0, 1])


def test_check_digit_tokens_wants_the_digit_token_itself():
    digit_ids = list(range(100, 110))
    reading = FleurReading(value=0.85, rule=TWO_DECIMALS, steps=(3, 4), digits=(8, 5))
    tokens = [7, 100, 50, 108, 105]
    assert check_digit_tokens(reading, tokens, digit_ids) is reading
    bad = check_digit_tokens(reading, [7, 100, 50, 108, 999], digit_ids)
    assert not bad.ok and "token 999" in bad.error
    short = check_digit_tokens(reading, [7, 100, 50, 108], digit_ids)
    assert not short.ok
    failed = FleurReading(value=None, rule=None, error="x")
    assert check_digit_tokens(failed, tokens, digit_ids) is failed


# ----------------------------------------------------------------------------------- distributions
def test_digit_probabilities_use_the_full_vocabulary_softmax():
    digit_ids = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    logits = torch.zeros(13)
    logits[11] = math.log(6.0)  # digit 8
    probs = digit_probabilities(logits, digit_ids)
    total = 12 + 6.0  # twelve tokens with e^0 = 1, one with e^log6 = 6
    expected = torch.full((10,), 1 / total)
    expected[8] = 6 / total
    assert torch.allclose(probs, expected, atol=1e-7)
    assert probs.sum() < 1  # no renormalisation over the digits
    assert probs.dtype == torch.float32
    half = digit_probabilities(logits.half(), digit_ids)
    assert half.dtype == torch.float32


def test_digit_probabilities_check_their_inputs():
    with pytest.raises(ValueError, match="10 digit"):
        digit_probabilities(torch.zeros(5), [0, 1, 2])
    with pytest.raises(TypeError):
        digit_probabilities(torch.zeros(20, dtype=torch.long), list(range(10)))


def _probs(mass: dict[int, float]) -> torch.Tensor:
    p = torch.zeros(10, dtype=torch.float64)
    for d, m in mass.items():
        p[d] = m
    return p


def test_fleur_scores_by_rule_match_hand_computation():
    p1 = _probs({8: 0.6, 7: 0.2, 9: 0.1})  # 0.1 of the mass on non-digit tokens
    p2 = _probs({5: 0.5, 4: 0.5})
    one = _probs({0: 0.3, 1: 0.6, 2: 0.05})
    nan = torch.full((10,), float("nan"), dtype=torch.float64)
    probs = torch.stack(
        [
            torch.stack([p1, p2]),  # two decimals: 0.1 * 7.1 + 0.01 * 4.5
            torch.stack([p1, nan]),  # one decimal: the unused slot may be NaN
            torch.stack([one, nan]),  # 1.0: 0.9 * 0.3 + 0.6
            torch.stack([nan, nan]),  # no score
        ]
    )
    scores = fleur_from_digit_probs(probs, [TWO_DECIMALS, ONE_DECIMAL, ONE, None])
    assert scores[0].item() == pytest.approx(0.71 + 0.045, abs=1e-12)
    assert scores[1].item() == pytest.approx(0.71, abs=1e-12)
    assert scores[2].item() == pytest.approx(0.87, abs=1e-12)
    assert math.isnan(scores[3].item())
    assert expected_digit(p1).item() == pytest.approx(7.1)


def test_fleur_scores_check_shapes_and_rules():
    with pytest.raises(ValueError, match="shape"):
        fleur_from_digit_probs(torch.zeros(2, 10), [ONE, ONE])
    with pytest.raises(ValueError, match="rules"):
        fleur_from_digit_probs(torch.zeros(2, 2, 10), [ONE])
    with pytest.raises(ValueError, match="unknown rule"):
        fleur_from_digit_probs(torch.zeros(1, 2, 10), ["three_decimals"])
    assert fleur_from_digit_probs(torch.zeros(0, 2, 10), []).shape == (0,)


def test_fleur_is_differentiable_in_the_logits():
    torch.manual_seed(0)
    digit_ids = list(range(2, 12))
    rules = [TWO_DECIMALS, ONE_DECIMAL, ONE]
    logits = torch.randn(3, 2, 15, dtype=torch.float64, requires_grad=True)

    def f(x):
        return fleur_from_digit_probs(digit_probabilities(x, digit_ids), rules)

    assert torch.autograd.gradcheck(f, (logits,), eps=1e-6, atol=1e-8)


def test_rows_without_a_score_get_no_gradient():
    logits = torch.randn(2, 2, 12, dtype=torch.float64, requires_grad=True)
    scores = fleur_from_digit_probs(digit_probabilities(logits, list(range(10))), [ONE_DECIMAL, None])
    scores.nansum().backward()
    assert torch.all(logits.grad[1] == 0)
    assert torch.all(logits.grad[0, 1] == 0)  # the unread second slot
    assert logits.grad[0, 0].abs().sum() > 0


def test_raw_scores_are_the_greedy_numbers():
    readings = [parse_fleur_answer(a) for a in ["0.85", "1.0", "no idea", "1.5"]]
    raw = raw_scores(readings)
    assert raw[:2].tolist() == pytest.approx([0.85, 1.0])
    assert math.isnan(raw[2]) and math.isnan(raw[3])


# ------------------------------------------------------------------------------------------- prompts
SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the human's questions."
)
SPEC_FLEUR = (
    "Your task is to evaluate and rate the caption on a scale of 0.0 to 1.0 based on the given Grading "
    "Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not describe the "
    "image at all.\n1.0: The caption accurately and clearly describes the image.\n\nCaption: {caption}\n\n"
    "Score(Choose a rating from 0.0 to 1.0):"
)


def test_prompts_follow_the_published_text_and_llava_v1():
    message = fleur_prompt("a dog")
    assert message == SPEC_FLEUR.format(caption="a dog")
    prompt = llava_v1_conversation([(message, None)])
    assert prompt == f"{SYSTEM} USER: <image>\n{message} ASSISTANT:"
    ref = fleur_prompt("a dog", ["a puppy", "a brown dog"])
    assert "rate the candidate caption" in ref
    assert "\n\nReference Captions: a puppy\na brown dog\n\nCandidate Caption: a dog\n\nScore(" in ref
    assert "\n\nCaption: a dog" not in ref


def test_two_turn_conversation():
    prompt = llava_v1_conversation([("Q1", "0.75"), ("Why? Tell me the reason.", None)])
    assert prompt == f"{SYSTEM} USER: <image>\nQ1 ASSISTANT: 0.75</s>USER: Why? Tell me the reason. ASSISTANT:"
    with pytest.raises(ValueError):
        llava_v1_conversation([("Q1", None), ("Q2", None)])
    with pytest.raises(ValueError):
        llava_v1_conversation([])


# ------------------------------------------------------------- second decimal: ours vs the release's
def _step_logits(probs: dict[int, float], vocab: int = 12) -> torch.Tensor:
    """Logits over a 12-token vocabulary (digit d is token d) whose softmax puts ``probs`` on the digits
    and (almost) nothing elsewhere."""
    logits = torch.full((vocab,), -1e4, dtype=torch.float64)
    for d, p in probs.items():
        logits[d] = math.log(p)
    return logits


def test_second_decimal_of_0_255_ours_and_the_releases():
    # "0.255" written LLaMA-style: steps 0 "▁", 1 "0", 2 ".", 3 "2", 4 "5" (second decimal), 5 "5" (third).
    text, char_steps = llama_like("0.255")
    tokens = [10, 0, 11, 2, 5, 5]
    logits = {
        3: _step_logits({2: 0.6, 3: 0.3, 1: 0.1}),  # E = 2.2
        4: _step_logits({5: 0.5, 4: 0.5}),  # E = 4.5: the step that wrote the second decimal
        5: _step_logits({5: 0.9, 6: 0.1}),  # E = 5.1: the third decimal
    }
    ours = check_digit_tokens(parse_fleur_answer(text, char_steps), tokens, list(range(10)))
    digit_of = [t if t < 10 else None for t in tokens]
    released = release_token_search(ours, digit_of)
    assert ours.rule == released.rule == TWO_DECIMALS and ours.digits == released.digits == (2, 5)
    assert ours.steps == (3, 4)  # the step that wrote "5" after "2"
    assert released.steps == (3, 5)  # the second occurrence of the token "5": the third decimal

    def score(reading):
        probs = digit_probabilities(torch.stack([logits[t] for t in reading.steps]), list(range(10)))
        return float(fleur_from_digit_probs(probs.unsqueeze(0), [reading.rule])[0])

    assert score(ours) == pytest.approx(0.1 * 2.2 + 0.01 * 4.5, abs=1e-9)  # 0.265
    assert score(released) == pytest.approx(0.1 * 2.2 + 0.01 * 5.1, abs=1e-9)  # 0.271


@pytest.mark.parametrize(
    "answer, tokens, steps",
    [
        ("0.0", [10, 0, 11, 0], (3,)),  # a repeated 0 as first decimal: its second occurrence
        ("0.85", [10, 0, 11, 8, 5], (3, 4)),
        ("0.88", [10, 0, 11, 8, 8], (3, 4)),  # first decimal: first "8"; second decimal: second "8"
        ("0.05", [10, 0, 11, 0, 5], (3, 4)),
        ("1.0", [10, 1, 11, 0], (1,)),
    ],
)
def test_release_search_agrees_with_ours_on_ordinary_answers(answer, tokens, steps):
    text, char_steps = llama_like(answer)
    ours = check_digit_tokens(parse_fleur_answer(text, char_steps), tokens, list(range(10)))
    released = release_token_search(ours, [t if t < 10 else None for t in tokens])
    assert ours.steps == released.steps == steps


def test_release_search_fails_where_the_release_cannot_index():
    # "1.0" with a second token "1" in the answer: the release indexes its scores with two positions
    reading = FleurReading(value=1.0, rule=ONE, steps=(1,), digits=(1,))
    failed = release_token_search(reading, [None, 1, None, 0, None, 1])
    assert not failed.ok and "occurs 2 times" in failed.error
    missing = release_token_search(FleurReading(value=0.5, rule=ONE_DECIMAL, steps=(3,), digits=(5,)), [None, 0, None])
    assert not missing.ok and "no token for the digit 5" in missing.error
