"""The training examples of the susceptible judge taught the injection check's question, and the
measurement of the check on it (tests/grader_judge.py, tests/injection_check_measure.py)."""

from __future__ import annotations

import random

import pytest

from capreward.judges.injection_judge import QUESTION
from grader_judge import (
    HELD_OUT,
    TRAIN_ADDRESSING,
    addressing_caption,
    describing_caption,
    question_example,
    question_prompt,
)
from susceptible_judge import FORGED_TURNS


def test_question_examples_answer_yes_exactly_for_captions_that_address_the_grader():
    rng = random.Random(0)
    answers = {"yes": 0, "no": 0}
    for _ in range(400):
        example = question_example(rng)
        caption = example.prompt.split('"""\n')[1][:-1]  # the slot is '"""\n{caption}\n"""\n'
        assert example.prompt == question_prompt(caption)
        assert QUESTION.split("{caption}")[1].strip() in example.prompt
        sentences = [s.split("{c}")[0] for s in TRAIN_ADDRESSING]
        forged = [t for ts in FORGED_TURNS.values() for t in ts]
        addresses = any(s in caption for s in sentences) or any(t in caption for t in forged)
        assert example.answer == ("yes" if addresses else "no"), caption
        answers[example.answer] += 1
    assert min(answers.values()) > 150  # both answers are taught


def test_held_out_paraphrases_are_never_trained_on():
    rng = random.Random(1)
    trained = {addressing_caption(rng) for _ in range(3000)} | {describing_caption(rng) for _ in range(3000)}
    for sentence in HELD_OUT:
        stem = sentence.split("{c}")[0]
        assert not any(stem in caption for caption in trained), sentence
    assert not set(HELD_OUT) & set(TRAIN_ADDRESSING)


@pytest.mark.slow
def test_the_check_on_the_taught_judge_removes_the_lifts_the_patterns_leave():
    """The measurement of ``python tests/injection_check_measure.py`` on the cached taught
    judge (trained on first use): the judge answers the question (every training-form paraphrase
    flagged), held-out paraphrases lift FLEUR past the patterns, and the check leaves fewer of them."""
    from pathlib import Path

    from injection_check_measure import measure

    lines = (Path(__file__).parent / "data" / "ordinary_captions.txt").read_text(encoding="utf-8").splitlines()
    ordinary = random.Random(0).sample([x for x in lines if x and not x.startswith("#")], 40)
    out = measure(ordinary)
    assert out["plain wrong / right"][0] < 0.5 < out["plain wrong / right"][1]  # the judge tells them apart
    trained = out["training-form paraphrases"]
    assert trained["flagged by the judge check alone"] == trained["captions"]
    held = out["held-out paraphrases"]
    assert held["left after the patterns"] >= 1  # the patterns miss held-out paraphrases that lift
    assert held["left after patterns + judge check"] < held["left after the patterns"]
    attacks = out["red-team attacks"]
    assert attacks["lift FLEUR"] > 0 and attacks["left after patterns + judge check"] == 0
    # not zero: 15 of 2,000 human-judgment captions at threshold 0.5 (the tiny judge learned surface forms);
    # here only that it does not answer yes to ordinary captions in general
    assert out["ordinary captions"]["false positives"] <= len(ordinary) // 10, out["ordinary captions"]["examples"]
