"""Rewards score the caption a person reads: a disguised wrong word scores as the wrong word, with the
tiny CLIP trained on colour words (capreward.testing.trained_clip) on a red image; the text as given
stays available (``as_given=True``) for parity with the released metrics; the hallucination penalty
ignores generic words, tells a wrong attribute from an absent one, gives content-free captions less
than supported ones and flags a wrong word wherever it stands."""

from __future__ import annotations

import pytest

from capreward.rewards import CLIPScoreReward, EMScoreReward, HallucinationPenalty

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

WRONG = "a blue image."
DISGUISED = {
    "cyrillic e": "a blu\u0435 image.",
    "math bold": "a \U0001d41b\U0001d425\U0001d42e\U0001d41e image.",
    "combining accent": "a blu\u0301e image.",
    "overlay": "a b\u0336lue image.",
    "spaced": "a b l u e image.",
    "leet": "a b1ue image.",
    "zero-width": "a bl\u200bue image.",
    "full-width": "a ｂｌｕｅ image.",
}


@pytest.fixture(scope="module")
def clip_path():
    from capreward.testing.trained_clip import trained_clip_path

    return str(trained_clip_path())


@pytest.fixture(scope="module")
def red():
    from capreward.testing.trained_clip import colour_image

    return colour_image("red")


@pytest.mark.parametrize("reward_class", [CLIPScoreReward, EMScoreReward])
def test_a_disguised_wrong_word_scores_exactly_as_the_wrong_word(reward_class, clip_path, red):
    reward = reward_class(model=clip_path)
    captions = [WRONG, "a red image.", *DISGUISED.values()]
    values = reward(None, captions, image=[red] * len(captions))
    assert values[1] > values[0] + 0.5  # the CLIP tells red from blue
    for (name, _), v in zip(DISGUISED.items(), values[2:]):
        assert v == values[0], name  # exactly: the same text reaches the encoder
    # the metric on the text as given (released-code parity) is still there, and some disguises lift it
    given = reward_class(model=clip_path, as_given=True)(None, captions, image=[red] * len(captions))
    # ordinary captions: the same either way (up to float noise of another batch's padding)
    assert given[:2] == pytest.approx(values[:2], abs=1e-6)
    assert max(given[2:]) > given[0] + 0.1


def test_what_the_reading_changed_is_logged(clip_path, red, caplog):
    reward = CLIPScoreReward(model=clip_path)
    extra = {}
    with caplog.at_level("INFO", logger="capreward.rewards.base"):
        reward(None, [DISGUISED["cyrillic e"], "a red image."], image=[red] * 2, log_extra=extra.__setitem__)
    column = extra["clip_s/reading"]
    assert column[1] is None and "look-alike letters" in column[0] and "mixed-script words: 'bluе'" in column[0]
    assert "1/2 captions scored as read" in caplog.text
    out = reward.compute(None, ["\u200b\u2060\U000e0041"], image=[red])
    assert out.values == [None] and "empty once read" in out.reasons[0]


def test_hallucination_penalty_on_disguises_generic_words_and_position(clip_path, red):
    penalty = HallucinationPenalty(model=clip_path)
    captions = [
        "a red image.",  # 0: right
        WRONG,  # 1: wrong attribute
        "image.",  # 2: content-free (attribute absent)
        "a",  # 3
        "a picture of something.",  # 4: generic words only
        "a red red red red red blue image.",  # 5: the wrong word after right ones
        DISGUISED["cyrillic e"],  # 6
        "a red picture.",  # 7: "picture" is not content
    ]
    v = penalty(None, captions, image=[red] * len(captions))
    assert v[0] == 0.0 and v[7] == 0.0  # generic words are never flagged in a right caption
    assert v[1] == -0.5 and v[6] == -0.5  # the disguise gets the wrong word's price (claim_cost)
    assert v[2] == v[3] == v[4] == -1.0  # content-free: no more than a wrong caption (the reward contract)
    assert v[2] < v[1] < v[0]  # saying nothing never earns more than a wrong guess
    assert v[5] == -0.5  # blue flagged although five reds came before it, and priced as if alone
    assert penalty.reports([captions[5]], [red], kind="image")[0].flagged == ["blue"]
    # with the context-free check off, earlier words carry the wrong one (the causal text tower)
    assert HallucinationPenalty(model=clip_path, context_free=False)(None, [captions[5]], image=[red]) == [0.0]
    with pytest.raises(ValueError, match="empty_penalty"):
        HallucinationPenalty(empty_penalty=0.5)
