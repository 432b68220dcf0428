"""The rule-based claim splitter: sentences and clauses, spans into the caption, dedup, the bound."""

from __future__ import annotations

import pytest

from capreward.scorers.claims import f_beta, parse_fact_list, read_alternatives
from capreward.scorers.claims_split import claim_key, claims_of_references, split_claims
from capreward.judges.protocol import ChatResponse, TokenLogprob


def texts(caption, **kw):
    return [c.text for c in split_claims(caption, **kw)[0]]


def test_sentences_and_clauses_with_spans():
    caption = "A man in black and white stripes, a dog runs; it is sunny!\nTwo cars and there is a bus."
    claims, total = split_claims(caption)
    assert [c.text for c in claims] == ["A man in black and white stripes", "a dog runs", "it is sunny", "Two cars",
                                        "there is a bus"]
    assert total == 5
    for c in claims:  # spans index the caption as given (an ordinary caption reads as written)
        assert caption[c.start:c.end] == c.text and not c.read


def test_a_conjunction_between_adjectives_is_not_a_clause():
    assert texts("black and white stripes") == ["black and white stripes"]
    assert texts("a red car and a blue bus") == ["a red car", "a blue bus"]


def test_repeated_claims_count_once():
    claims, total = split_claims("a red ball. a red ball. A  red ball!")
    assert total == 1 and [c.text for c in claims] == ["a red ball"]
    assert claim_key("A  red, ball!") == "a red ball"


def test_the_bound_keeps_the_first_claims_and_reports_the_total():
    caption = ". ".join(f"there is a thing number {w}" for w in "one two three four five".split())
    claims, total = split_claims(caption, max_claims=2)
    assert total == 5 and [c.text for c in claims] == ["there is a thing number one", "there is a thing number two"]
    with pytest.raises(ValueError):
        split_claims(caption, max_claims=0)


def test_claims_are_split_from_the_caption_as_read():
    claims, _ = split_claims("the back\u200bground is red. there is a gr\u0435en patch")  # ZWSP, Cyrillic е
    assert [c.text for c in claims] == ["the background is red", "there is a green patch"]
    assert all(c.read for c in claims)


def test_empty_and_punctuation_only_captions_hold_no_claim():
    assert split_claims("") == ([], 0)
    assert split_claims(" ... ; !") == ([], 0)


def test_reference_claims_are_pooled_and_deduplicated():
    refs = ["the background is red. there is a green patch.", "The background is red and a ball"]
    assert claims_of_references(refs) == ["the background is red", "there is a green patch", "a ball"]
    assert claims_of_references(refs, max_claims=1) == ["the background is red"]


def test_judge_fact_lists_are_parsed_line_by_line():
    text = "- the background is red\n2. there is a green patch\n\n* the background is red"
    assert parse_fact_list(text, 10) == ["the background is red", "there is a green patch"]


def test_f_beta_by_hand():
    assert f_beta(0.5, 1.0, 1.0) == pytest.approx(2 * 0.5 / 1.5)
    assert f_beta(0.5, 1.0, 2.0) == pytest.approx(5 * 0.5 / (4 * 0.5 + 1))
    assert f_beta(0.0, 0.0, 1.0) == 0.0


def _response(alternatives):
    ranked = tuple(alternatives)
    return ChatResponse(ranked[0][0], (TokenLogprob(ranked[0][0], ranked[0][1], dict(ranked), ranked),))


def test_remote_yes_no_reading_sums_the_listed_alternatives():
    import math

    r = read_alternatives(_response([(" Yes", math.log(0.5)), ("yes", math.log(0.2)), (" no", math.log(0.1)),
                                     ("maybe", math.log(0.1))]))
    assert r.p_yes == pytest.approx(0.7) and r.p_no == pytest.approx(0.1)
    assert r.probability(True, 0.05) == (pytest.approx(0.875), None)
    assert r.probability(False, 0.05) == (pytest.approx(0.7), None)
    low = read_alternatives(_response([("yes", math.log(0.01)), ("maybe", math.log(0.9))]))
    p, why = low.probability(True, 0.05)
    assert p == 0.0 and "counted as no" in why  # unreadable is never worth more than a scored no
    none = read_alternatives(_response([("maybe", 0.0)]))
    assert none.error is not None and none.probability(True, 0.05)[0] != none.probability(True, 0.05)[0]  # NaN
    failed = read_alternatives(ChatResponse("", error="timeout"))
    assert failed.error == "timeout"
