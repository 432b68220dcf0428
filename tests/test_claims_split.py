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
    claims, _ = split_claims("the background\u200b is red. there is a gr\u0435en patch")  # ZWSP, Cyrillic е
    assert [c.text for c in claims] == ["the background is red", "there is a green patch"]
    assert all(c.read for c in claims)
    # an invisible separator between letters reads as a space (as the guards and a text encoder see it)
    assert texts("the back\u200bground is red") == ["the back ground is red"]


@pytest.mark.parametrize("caption, claims", [
    ("the background is red. 背景是蓝色的.", ["the background is red", "背景是蓝色的"]),  # round 4: one claim before
    ("背景是红色的。背景是蓝色的。", ["背景是红色的", "背景是蓝色的"]),  # no space after "。"
    ("背景是红色的！背景是蓝色的？对", ["背景是红色的", "背景是蓝色的", "对"]),  # full-width ! ? (read as ! ?)
    ("背景は赤です。緑の斑点があります。", ["背景は赤です", "緑の斑点があります"]),
    ("Фон красный. Есть зелёное пятно.", ["Фон красный", "Есть зелёное пятно"]),
    ("الخلفية حمراء. هل هناك بقعة خضراء؟ نعم", ["الخلفية حمراء", "هل هناك بقعة خضراء", "نعم"]),
    ("الخلفية حمراء؛ الكرة زرقاء", ["الخلفية حمراء", "الكرة زرقاء"]),  # the Arabic semicolon
    ("पृष्ठभूमि लाल है। एक हरा धब्बा है॥", ["पृष्ठभूमि लाल है", "एक हरा धब्बा है"]),  # a vowel sign ends a word
    ("Ein Mädchen läuft; ein Hund bellt.", ["Ein Mädchen läuft", "ein Hund bellt"]),
    ("Một cô gái. Chiếc xe màu đỏ.", ["Một cô gái", "Chiếc xe màu đỏ"]),
    ("A 3.5 kg ball.A dog", ["A 3.5 kg ball.A dog"]),  # an ASCII stop before a letter or digit is no end
])
def test_every_script_is_split(caption, claims):
    assert texts(caption) == claims


def test_claims_in_every_script_are_deduplicated_on_their_words():
    claims, total = split_claims("背景是红色的。背景是红色的。 背景 是红色的！")
    assert total == 1 and [c.text for c in claims] == ["背景是红色的"]
    assert claim_key("背景是蓝色的") == "背 景 是 蓝 色 的"  # each Han character a word
    assert claim_key("Фон  КРАСНЫЙ!") == "фон красный" and claim_key("A man's dog") == "a man's dog"
    assert split_claims("Фон красный. фон красный!")[1] == 1


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


# ------------------------------------------------------------------ the scorer on a scripted judge
from capreward.judges.protocol import SyncBackendMixin  # noqa: E402
from capreward.scorers.claims import ClaimScorer  # noqa: E402
from capreward.scorers.claims_split import lexical_coverage  # noqa: E402


class Oracle(SyncBackendMixin):
    """A server-like judge that lists yes/no alternatives: a claim naming red or green is true (P(yes) 0.9),
    any other 0.2; coverage is true (0.8) when the description holds the fact's colour, else 0.1; the
    inventory lists two facts; the splitter request gets two facts back."""

    name = "oracle"

    def __init__(self):
        self.requests = []

    def generate(self, requests):
        import math

        self.requests += list(requests)
        out = []
        for r in requests:
            text = r.turns[0].text
            if text.startswith("List the facts"):
                out.append(ChatResponse("- the background is red\n- there is a green patch", finish_reason="stop"))
                continue
            if text.startswith("Rewrite the description"):
                out.append(ChatResponse("1. the thing is red\n2. it is big", finish_reason="stop"))
                continue
            if "Fact:" in text:
                description, fact = text.split("Description: ")[1].split("\nFact: ")
                colour = next(w for w in ("red", "green", "blue", "yellow") if w in fact)
                p = 0.8 if colour in description else 0.1
            else:
                claim = text.split("Statement: ")[1]
                p = 0.9 if ("red" in claim or "green" in claim) else 0.2
            alts = ((" yes", math.log(p * 0.99)), (" no", math.log((1 - p) * 0.99)), ("maybe", math.log(0.01)))
            out.append(_response(alts))
        return out


def _image():
    from PIL import Image

    return Image.new("RGB", (16, 16), (200, 30, 30))


def test_precision_recall_and_f1_by_hand_on_a_scripted_judge():
    image = _image()
    refs = [["the background is red and there is a green patch."]] * 3
    captions = ["the background is red. there is a green patch.", "the background is red.",
                "the background is red. there is a green patch. a blue ball."]
    r = ClaimScorer(Oracle()).score(captions, images=[image] * 3, references=refs)
    # priced: 1 - the doubt of each claim below 0.5 (the ball's 0.2: 0.8)
    assert r.precision.tolist() == pytest.approx([1.0, 1.0, 0.2]) and r.false_claims.tolist() == [0.0, 0.0, 1.0]
    average = ClaimScorer(Oracle(), claim_cost=None).score(captions, images=[image] * 3, references=refs)
    assert average.precision.tolist() == pytest.approx([0.9, 0.9, (0.9 + 0.9 + 0.2) / 3])
    assert r.recall.tolist() == pytest.approx([0.8, (0.8 + 0.1) / 2, 0.8])
    for i in range(3):
        p, q = r.precision[i], r.recall[i]
        assert r.score[i] == pytest.approx(2 * p * q / (p + q))
    assert r.score[1] < r.score[0] and r.score[2] < r.score[0]  # missing claim / hallucinated claim
    assert [v.claim for v in r.coverage[0]] == ["the background is red", "there is a green patch"]


def test_recall_reads_only_the_verified_claims_by_hand():
    """One verified claim (red, P(yes) 0.9) and one rejected claim (blue, 0.2), both stating a reference
    fact: only the verified one covers. Judge-read coverage: the judge reads "the background is red." (the
    verified claims), so the red fact gets 0.8 and the blue fact 0.1 (its colour is not in what it reads;
    read against the whole caption it got 0.8): recall (0.8 + 0.1) / 2 = 0.45; precision 1 - (1 - 0.2) =
    0.2; F1 = 2 x 0.2 x 0.45 / 0.65 = 0.18 / 0.65. Lexical: {background, red} matched by the verified claim
    (1), {blue, patch} by no verified claim (0): recall 0.5, F1 = 2 x 0.2 x 0.5 / 0.7."""
    image = _image()
    caption = "the background is red. there is a blue patch."
    refs = [["the background is red. there is a blue patch."]]
    oracle = Oracle()
    r = ClaimScorer(oracle).score([caption], images=[image], references=refs)
    assert [round(v.p, 6) for v in r.claims[0]] == [0.9, 0.2]
    assert r.precision[0] == pytest.approx(0.2)
    assert [v.p for v in r.coverage[0]] == pytest.approx([0.8, 0.1])
    assert r.recall[0] == pytest.approx(0.45) and r.score[0] == pytest.approx(0.18 / 0.65)
    read = [q.turns[0].text.split("Description: ")[1].split("\nFact: ")[0] for q in oracle.requests if "Fact:" in q.turns[0].text]
    assert read == ["the background is red.", "the background is red."]  # the rejected claim is never read
    lexical = ClaimScorer(Oracle(), coverage="lexical").score([caption], images=[image], references=refs)
    assert [v.p for v in lexical.coverage[0]] == [1.0, 0.0]
    assert lexical.recall[0] == 0.5 and lexical.score[0] == pytest.approx(0.2 / 0.7)


@pytest.mark.parametrize("coverage", ["judge", "lexical"])
def test_a_caption_with_no_verified_claim_has_recall_zero(coverage):
    """Every claim rejected: nothing is stated, recall 0 (a number, not NaN), F 0, and no coverage question
    is asked; an unscorable caption stays unscored."""
    oracle = Oracle()
    s = ClaimScorer(oracle, coverage=coverage)
    r = s.score(["there is a blue patch.", ""], images=[_image()] * 2,
                references=[["there is a blue patch."]] * 2)
    assert r.recall[0] == 0.0 and r.score[0] == 0.0 and r.precision[0] == pytest.approx(0.2)
    assert [v.p for v in r.coverage[0]] == [0.0] and r.error[0] is None
    assert s.judge_calls == 1 and not any("Fact:" in q.turns[0].text for q in oracle.requests)  # one verification
    assert math.isnan(r.recall[1]) and r.error[1] == "empty caption"


def test_each_distinct_question_is_asked_once_and_cached():
    oracle = Oracle()
    s = ClaimScorer(oracle, coverage="lexical")
    image = _image()
    captions = ["a red car. a blue bus.", "a blue bus. a red car.", "a red car."]
    s.score(captions, images=[image] * 3)
    assert len(oracle.requests) == 2 and s.judge_calls == 2  # two distinct claims on one visual
    s.score(captions, images=[image] * 3)
    assert len(oracle.requests) == 2  # cached by content
    other = Image_of((10, 200, 10))
    s.score(["a red car."], images=[other])
    assert len(oracle.requests) == 3  # another visual: asked again


def Image_of(rgb):
    from PIL import Image

    return Image.new("RGB", (16, 16), rgb)


def test_lexical_coverage_by_hand():
    assert lexical_coverage("there is a green patch", ["the background is red", "a green patch in the corner"]) == 1.0
    assert lexical_coverage("there is a green patch", ["a green ball"]) == 0.5
    assert lexical_coverage("the", ["the"]) == 0.0
    r = ClaimScorer(Oracle(), coverage="lexical").score(
        ["the background is red.", "the background is red. there is a green patch."], images=[_image()] * 2,
        references=[["the background is red. there is a green patch."]] * 2)
    assert r.recall.tolist() == [0.5, 1.0]


def test_inventory_and_judge_splitter_on_the_scripted_judge():
    oracle = Oracle()
    image = _image()
    r = ClaimScorer(oracle, inventory=True).score(["the background is red.", "the background is red."],
                                                  images=[image, image])
    assert [v.claim for v in r.coverage[0]] == ["the background is red", "there is a green patch"]
    assert sum(q.turns[0].text.startswith("List the facts") for q in oracle.requests) == 1  # once per visual
    caption = "The thing is red, and it is big"
    j = ClaimScorer(Oracle(), splitter="judge").score([caption], images=[image])
    assert [(v.text, v.start, v.end) for v in j.claims[0]] == [("the thing is red", 0, 16), ("it is big", 22, 31)]
    assert j.precision[0] == pytest.approx(0.2)  # one of the two facts below 0.5 (0.2): its doubt, 0.8


def test_failed_requests_leave_the_sample_unscored_with_the_reason():
    class Failing(Oracle):
        def generate(self, requests):
            return [ChatResponse("", error="HTTP 500") for _ in requests]

    r = ClaimScorer(Failing()).score(["a red car"], images=[_image()])
    assert math.isnan(r.score[0]) and "HTTP 500" in r.error[0]
    empty = ClaimScorer(Oracle()).score(["", "..."], images=[_image()] * 2)
    assert empty.error == ["empty caption", "the caption holds no claim"]


import math  # noqa: E402
