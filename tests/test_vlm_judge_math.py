"""Pure math of the VLM judges (G-VEval, VisCE²): parsing, renormalised alternatives, expected scores,
the digit-tree distribution, and the released prompts' rendering."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capreward.judges import vlm_prompts as vp
from capreward.metrics.gveval import (
    ACCR_MARKERS,
    NUM_SCORES,
    accr_mean,
    alternatives_after_marker,
    alternatives_distribution,
    digit_tree_distribution,
    expected_score,
    marker_token_index,
    parse_marked_score,
)
from capreward.metrics.visce2 import first_integer, parse_visce2_answer


# ------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, marker, value",
    [
        ("Good caption. The final score is $85$.", "$", 85),
        ("The final score is $ 7$.", "$", 7),
        ("The final score is $100$", "$", 100),
        ("The final score is $101$", "$", None),
        ("no dollar here 85", "$", None),
        ("The final score is $high$", "$", None),
        ("The Accuracy score is α70α. The Completeness score is β60β.", "β", 60),
        ("The Relevance score is δ3δ.", "δ", 3),
    ],
)
def test_parse_marked_score(text, marker, value):
    assert parse_marked_score(text, marker) == value


def test_parse_marked_score_reads_the_first_marker():
    assert parse_marked_score("costs $5$ ... The final score is $90$.") == 5


@pytest.mark.parametrize(
    "text, score, has_error",
    [("85", 85.0, False), (" 7 out of 100", 7.0, False), ("Score: 100.", 100.0, False), ("no idea", 0.0, True),
     ("150", 150.0, True), ("", 0.0, True), ("0", 0.0, False), ("I rate it 250, no, 90", 250.0, True)],
)  # fmt: skip
def test_visce2_first_integer(text, score, has_error):
    value, error = parse_visce2_answer(text)
    assert value == score
    assert (error is not None) == has_error


def release_get_digit_scores(s):
    """The released ``get_digit_scores`` (Silviase/VisCE2 head, ``src/data/capeval_dataset.py``), retyped."""
    import re

    found = re.findall(r"[0-9]+", str(s))
    return float(found[0]) if found else 0


@pytest.mark.parametrize(
    "text",
    ["85", "rated 150 of 100", "٨٥ then 7", "８５ or 42", "Score: ٣ 12", "nothing", "1e3", "-5", "9" * 400],
)
def test_visce2_parsing_matches_the_release(text):
    # ASCII digits only: Arabic-Indic and full-width digits are skipped, as the release's [0-9]+ does;
    # a first integer above 100 is kept as is (here even one too long for a float: inf, as float() gives).
    value, error = parse_visce2_answer(text)
    assert value == release_get_digit_scores(text)
    assert (error is not None) == (value > 100 or not any("0" <= c <= "9" for c in text))


def test_first_integer_offset():
    assert first_integer("rating 42 and 7") == (42, 7)
    assert first_integer("none") is None


# ---------------------------------------------------------------------- renormalised alternatives
def test_alternatives_distribution_hand_computed():
    # p("85") = 0.5, p("90") = 0.2, p("8") = 0.1 (a score too), p(" 85") and "eighty" are not exact scores.
    top = {"85": math.log(0.5), "90": math.log(0.2), "8": math.log(0.1), " 85": math.log(0.1), "eighty": math.log(0.05)}
    p = alternatives_distribution(top)
    assert p.shape == (NUM_SCORES,)
    assert p[85] == pytest.approx(0.5 / 0.8)
    assert p[90] == pytest.approx(0.2 / 0.8)
    assert p[8] == pytest.approx(0.1 / 0.8)
    assert p.sum() == pytest.approx(1.0)
    assert expected_score(p) == pytest.approx((85 * 0.5 + 90 * 0.2 + 8 * 0.1) / 0.8)


def test_alternatives_distribution_strip_merges_spaced_tokens():
    top = {"85": math.log(0.3), " 85": math.log(0.3), "100": math.log(0.4)}
    p = alternatives_distribution(top, strip=True)
    assert p[85] == pytest.approx(0.6)
    assert p[100] == pytest.approx(0.4)
    assert expected_score(p) == pytest.approx(0.6 * 85 + 0.4 * 100)


def test_alternatives_distribution_none_when_no_score():
    # no listed alternative is a score from 0 to 100 (a well-formed list: its probabilities sum to at most 1)
    assert alternatives_distribution({"eighty": math.log(0.5), "101": math.log(0.3), "-5": math.log(0.1)}) is None
    assert alternatives_distribution({}) is None


def test_alternatives_after_marker_reads_the_token_after_the_first_dollar():
    texts = ["The", " final", " score", " is", " $", "85", "$", "."]
    tops = [{} for _ in texts]
    tops[5] = {"85": math.log(0.6), "80": math.log(0.3), "$": math.log(0.1)}
    assert marker_token_index(texts, "$") == 4
    p, why = alternatives_after_marker(texts, tops, "$")
    assert why is None
    assert expected_score(p) == pytest.approx((85 * 0.6 + 80 * 0.3) / 0.9)


@pytest.mark.parametrize(
    "texts, tops, reason",
    [
        (["no", " marker"], [{}, {}], "no '$'"),
        (["ends", " $"], [{}, {}], "ends at"),
        (["$", "x"], [{}, {"x": -0.1}], "no alternative"),
        (["$", "5"], [{}, {}], "no alternatives"),
    ],
)
def test_alternatives_after_marker_reasons(texts, tops, reason):
    p, why = alternatives_after_marker(texts, tops, "$")
    assert p is None and reason in why


def test_expected_score_normalises_and_rejects_zero_mass():
    p = np.zeros(NUM_SCORES)
    p[10], p[20] = 0.2, 0.6  # unnormalised: 0.8 in total
    assert expected_score(p) == pytest.approx((10 * 0.2 + 20 * 0.6) / 0.8)
    with pytest.raises(ValueError, match="sum to 0"):
        expected_score(np.zeros(NUM_SCORES))
    with pytest.raises(ValueError, match="101"):
        expected_score(np.ones(100))


def test_accr_mean():
    assert accr_mean([80, 70, 90, 60]) == 75
    assert math.isnan(accr_mean([80, float("nan"), 90, 60]))
    with pytest.raises(ValueError):
        accr_mean([1, 2, 3])
    assert list(ACCR_MARKERS.values()) == ["α", "β", "ψ", "δ"]


# -------------------------------------------------------------------------------- digit tree
def _random_tree(seed):
    rng = np.random.default_rng(seed)

    def split():  # a distribution over 10 digits + "end" + one other non-digit token
        w = rng.dirichlet(np.ones(12))
        return w[:10], w[10] + w[11]

    first, _ = split()
    end1 = np.zeros(10)
    second = np.zeros((10, 10))
    end2 = np.zeros((10, 10))
    for a in range(10):
        second[a], end1[a] = split()
        for b in range(10):
            _, end2[a, b] = split()
    third = split()
    return first, end1, second, end2, third[0][0], rng.uniform()


def test_digit_tree_hand_computed():
    first = np.zeros(10)
    first[7], first[1] = 0.5, 0.3  # 0.2 elsewhere (not digits)
    end1 = np.full(10, 0.25)
    second = np.zeros((10, 10))
    second[7, 3] = 0.6
    second[1, 0] = 0.5
    end2 = np.full((10, 10), 0.9)
    p = digit_tree_distribution(first, end1, second, end2, third_zero=0.4, end3=0.8)
    assert p[7] == pytest.approx(0.5 * 0.25)
    assert p[1] == pytest.approx(0.3 * 0.25)
    assert p[73] == pytest.approx(0.5 * 0.6 * 0.9)
    assert p[10] == pytest.approx(0.3 * 0.5 * 0.9)
    assert p[100] == pytest.approx(0.3 * 0.5 * 0.4 * 0.8)
    assert p[[i for i in range(101) if i not in (1, 7, 10, 73, 100)]].sum() == 0
    expected = (7 * p[7] + 1 * p[1] + 73 * p[73] + 10 * p[10] + 100 * p[100]) / p.sum()
    assert expected_score(p) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(5))
def test_digit_tree_equals_enumerating_every_digit_string(seed):
    """Independent path: walk every canonical digit string and multiply the step probabilities."""
    first, end1, second, end2, third_zero, end3 = _random_tree(seed)
    p = digit_tree_distribution(first, end1, second, end2, third_zero, end3)
    for n in range(NUM_SCORES):
        digits = [int(c) for c in str(n)]
        prob = first[digits[0]]
        if len(digits) == 1:
            prob *= end1[digits[0]]
        else:
            prob *= second[digits[0], digits[1]]
            prob *= end2[digits[0], digits[1]] if len(digits) == 2 else third_zero * end3
        assert p[n] == pytest.approx(prob, rel=1e-12, abs=1e-15)
    assert 0 < p.sum() <= 1


def test_digit_tree_rejects_bad_shapes():
    with pytest.raises(ValueError):
        digit_tree_distribution(np.ones(9), np.ones(10), np.ones((10, 10)), np.ones((10, 10)), 1, 1)


# ----------------------------------------------------------------------------------------- prompts
def test_visce2_prompt_renders_like_the_release_head():
    text = vp.visce2_prompt("a dog runs", "Object 1: a dog")
    # prompts/visce_2.txt with the head's constants.desc_task and prompter.py's substitutions, by hand
    assert text == (
        "\nOn a precise scale from 0 to 100, rate whether the candidate caption is appropriate for the given image.\n"
        "\nCandidate caption:\nCandidate:\na dog runs\n\n"
        "Use the image and following visual context to evaluate the candidate caption:\n"
        "Visual Context:\nObject 1: a dog\n\n"
        "Your final rating must be a single digit between 0 and 100.\n\n"
        "Appropriateness(0-100): How well the caption matches the image's content, atmosphere, and context.\n"
        "A score of 0 indicates complete inappropriateness, while a score of 100 indicates perfect appropriateness."
    )
    assert text == vp.visce2_prompt("a dog runs", "Object 1: a dog", "visce_2")


def test_visce2_earlier_commit_prompt_is_a_named_variant():
    # prompts/visce.txt ("[task]\n[cand]\n[context]\n[0-100]\n[suffix]") with commit 9533bc7's desc_task
    text = vp.visce2_prompt("a dog runs", "Object 1: a dog", "visce")
    assert text == (
        "\nEvaluate the given candidate caption based on the following information.\n"
        "\nCandidate:\na dog runs\nContext:\nObject 1: a dog\nAnswer on a scale of 0 to 100.\nAnswer:"
    )
    with pytest.raises(ValueError, match="variant"):
        vp.visce2_prompt("a", "b", "visce_3")


def test_gveval_prompts_fill_caption_and_references_like_the_release():
    template = vp.gveval_template("img", "combined")
    text = vp.gveval_prompt(template, "a red car", ["a car", "the red car"])
    assert "Reference captions:\n'a car'; 'the red car\n\nImage is attached\n\nGenerated captions:\na red car\n" in text
    assert "{{Caption}}" not in text and "{{Reference}}" not in text
    assert "The final score is ${{score}}$." in text  # the example line stays as released
    free = vp.gveval_prompt(vp.gveval_template("vid", "ref-free"), "a cat")
    assert "Generated Caption:\na cat\n" in free and "Frame 1, Frame 2, and Frame 3" in free


@pytest.mark.parametrize("mode", vp.GVEVAL_MODES)
def test_gveval_accr_prompts_ask_for_every_greek_marker(mode):
    text = vp.gveval_template("vid", mode, accr=True)
    for name, marker in ACCR_MARKERS.items():
        assert f"{marker}{{{{{name}_score}}}}{marker}" in text
    assert text.endswith("Wrap Relevance score in δ ")  # the release's trailing space
    assert ("{{Reference}}" in text) == (mode != "ref-free")


def test_gveval_template_errors():
    with pytest.raises(ValueError, match="video only"):
        vp.gveval_template("img", "ref-free", accr=True)
    with pytest.raises(ValueError, match="mode"):
        vp.gveval_template("img", "free")
    with pytest.raises(ValueError, match="visual"):
        vp.gveval_template("audio", "ref-free")


def test_every_prompt_is_distinct_and_nonempty():
    texts = list(vp.GVEVAL_TEMPLATES.values())
    assert len(set(texts)) == len(texts) == 9
    assert all("{{Caption}}" in t for t in texts)
