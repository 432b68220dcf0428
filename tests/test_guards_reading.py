"""The guards on every script and on the caption as read; single-word and interleaved repetition; the
length guard conditioned on a target (dense captioning). Values by hand."""

from __future__ import annotations

import pytest

from capreward.rewards import CompositeReward, Guards, length_penalty, repetition_penalty, truncation_penalty
from capreward.rewards.guards import word_repetition_penalty, words


def test_words_in_every_script():
    assert words("A man's dog, running!") == ["a", "man's", "dog", "running"]  # ASCII: as before
    assert words("红色的图片。") == ["红", "色", "的", "图", "片"]  # each Han character a word
    assert words("Привет, мир!") == ["привет", "мир"]
    assert words("एक कुत्ता घास पर दौड़ रहा है।") == ["एक", "कुत्ता", "घास", "पर", "दौड़", "रहा", "है"]  # vowel signs kept
    assert words("犬が走るdog") == ["犬", "が", "走", "る", "dog"]
    assert words("a r e d b1ue ba\u200bll") == ["a", "red", "blue", "ball"]  # as read


def test_length_counts_every_script():
    assert length_penalty("红" * 2000, 40) == -1.0  # 2,000 CJK characters are 2,000 words
    assert length_penalty("红色的图片" * 12, 40) == pytest.approx(-20 / 40)
    assert length_penalty(" ".join(["собака"] * 300), 40) == -1.0
    assert length_penalty("\u3000".join(["dog"] * 50), 40) == pytest.approx(-10 / 40)  # ideographic spaces
    assert words("\u200b".join(["dog"] * 3)) == ["dogdogdog"]  # what a reader sees: no space


def test_repetition_catches_single_words_and_restated_phrases():
    # single-word repeats
    assert repetition_penalty("image image", 2) == pytest.approx(-1 / 2)
    assert repetition_penalty("a blue blue", 2) == pytest.approx(-1 / 3)
    assert repetition_penalty("a blue", 2) == 0.0
    # an attribute said of six things is six claims, not a repeat (the verifier prices the false ones)
    assert repetition_penalty("a red dog, red cat, red car, red sky, red sea, red hat.", 2) == 0.0
    assert word_repetition_penalty("a dog chases another dog.") == 0.0  # a word said twice is free
    assert word_repetition_penalty("a dog and a cat and a bird and a fish.") == 0.0  # function words
    # every script: a five-character phrase said 12 times (60 words, 55 in restatements)
    assert repetition_penalty("红色的图片" * 12) == pytest.approx(-55 / 60)  # phrases up to 16 words (the default)
    assert repetition_penalty(" ".join(["красный"] * 4), 2) == pytest.approx(-3 / 4)
    assert word_repetition_penalty("人人都看看。") == 0.0  # doubled characters are ordinary in Chinese
    # disguised repeats are repeats
    assert repetition_penalty("red r e d re\u200bd", 2) == repetition_penalty("red red red", 2)


def test_truncation_accepts_every_scripts_full_stop():
    assert truncation_penalty("一只狗在草地上奔跑。") == 0.0
    assert truncation_penalty("A dog runs.\u200b") == 0.0  # a trailing zero-width space
    assert truncation_penalty("A dog runs.\u200b\u2060 ") == 0.0
    assert truncation_penalty("कुत्ता दौड़ रहा है।") == 0.0
    assert truncation_penalty("هل هذا كلب؟") == 0.0
    assert truncation_penalty("「犬が走る。」") == 0.0
    assert truncation_penalty("一只狗在草地上奔跑", require_punctuation=True) == -1.0
    assert truncation_penalty("一只狗在草地上奔跑") == 0.0  # a finished caption without a full stop
    assert truncation_penalty("a man and the\u200b.") == -1.0  # dangling, as read


def test_generic_and_content_free_captions_never_earn_more_from_the_guards():
    g = Guards()
    informative = sum(g.terms("A red ball on the grass.").values())
    for generic in ("image image", "a", "a blue blue", "image image image."):
        assert sum(g.terms(generic).values()) < informative, generic
    # a caption that says nothing is the reward contract's business (the penalty's -1 and the composite's
    # gate, tests/test_reward_contract.py), not the guards': they never pay it more than an informative one
    for generic in ("image", "image.", "a a a a."):
        assert sum(g.terms(generic).values()) <= informative, generic


def test_length_guard_conditioned_on_a_target():
    g = Guards(length_target="references", repetition=0, truncation=0, injection=0)
    refs = {"references": [["a dog runs on the grass in a park"], None, "a cat"]}
    assert g.max_words_for(refs, 0) == 14  # ceil(1.5 * 9)
    with pytest.raises(ValueError, match=r"references\[1\] gives no target length"):
        g.max_words_for(refs, 1)  # no references: an error, never a silent fixed limit
    assert g.max_words_for(refs, 2) == 3
    with pytest.raises(ValueError, match="no column 'references'"):
        g.max_words_for({}, 0)
    fallback = Guards(length_target="references", length_fallback=40)
    assert fallback.max_words_for(refs, 1) == 40 and fallback.max_words_for({}, 0) == 40  # asked for
    # the median reference sets the target: one long reference does not raise the allowance
    assert g.max_words_for({"references": [["a dog runs", "a dog runs on grass", " ".join(["word"] * 90)]]}, 0) == 8
    assert g.max_words_for({"references": [["a dog runs", "a brown dog runs on the grass"]]}, 0) == 8  # (3 + 7) / 2
    paragraph = " ".join(f"w{k}" for k in range(60)) + "."
    assert g.terms(paragraph, max_words=90) == {"length": 0.0}
    assert Guards().terms(paragraph)["length"] == pytest.approx(-20 / 40)  # the fixed 40 words
    # a column of target lengths
    col = Guards(length_target="target_words", length_ratio=1.0)
    assert col.max_words_for({"target_words": [120, None]}, 0) == 120
    with pytest.raises(ValueError, match=r"target_words\[1\] gives no target length"):
        col.max_words_for({"target_words": [120, None]}, 1)
    with pytest.raises(ValueError, match=r"target_words\[0\] must be a positive number"):
        col.max_words_for({"target_words": [-3]}, 0)
    with pytest.raises(ValueError, match="no column 'target_words'"):
        col.max_words_for({}, 0)
    for bad in ({"length_ratio": 0}, {"length": float("nan")}, {"repetition": -1}, {"length_target": ""},
                {"length_fallback": 0}, {"length_fallback": 2.5}):
        with pytest.raises(ValueError):
            Guards(**bad)


def _fixed(values):
    def reward(prompts, completions, **kwargs):
        return list(values)

    reward.__name__ = "fixed"
    return reward


def test_composite_uses_each_samples_target():
    long_caption = " ".join(f"w{k}" for k in range(60)) + "."
    refs = [[" ".join(["word"] * 50)], ["a short reference"], None]
    comp = CompositeReward([_fixed([1.0, 1.0, 1.0])], guards=Guards(length_target="references", repetition=0, truncation=0, injection=0))
    out = comp.compute(None, [long_caption] * 3, references=refs)
    # 75 words allowed: free; ceil(1.5 * 3) = 5 allowed, 55 over with scale 5: -1; no references: no
    # target, so no value (the reason says how to allow a fixed length)
    assert out.values == [pytest.approx(1.0), pytest.approx(0.0), None]
    assert "references[2] gives no target length" in str(out.reasons[2])
    fallback = Guards(length_target="references", length_fallback=40, repetition=0, truncation=0, injection=0)
    out = CompositeReward([_fixed([1.0, 1.0, 1.0])], guards=fallback).compute(None, [long_caption] * 3, references=refs)
    assert out.values[2] == pytest.approx(0.5)  # 40 words, -20/40, as asked
    bad = CompositeReward([_fixed([1.0])], guards=Guards(length_target="target_words"))
    out = bad.compute(None, ["a dog."], target_words=["many"])
    assert out.values == [None] and "target_words[0] must be a positive number" in out.reasons[0]


def test_the_guards_read_the_whole_caption():
    head = " ".join(f"w{k}" for k in range(100))  # far past any text encoder's 77 tokens
    assert repetition_penalty(head + " red red", 2) < 0
    assert truncation_penalty(head + " and the") == -1.0
