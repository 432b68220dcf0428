"""capreward.caption_reading: the caption a person reads, step by step, and ordinary captions unchanged.

``tests/data/ordinary_captions.txt`` is a sample of the human-judgment benchmarks' captions (its header
says how it was drawn); the full set is read as well when ``../shared/data/human_judgments`` exists
(tests/test_injection.py).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capreward.caption_reading import as_read, is_invisible, read_caption, strip_invisible

DATA = Path(__file__).resolve().parent / "data"


def ordinary_sample() -> list[str]:
    lines = (DATA / "ordinary_captions.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_ordinary_captions_read_as_written():
    captions = ordinary_sample()
    assert len(captions) > 1500
    changed = [(c, read_caption(c).text) for c in captions if read_caption(c).changed]
    assert not changed, changed[:10]
    for caption in ("Un chien court sur l'herbe.", "एक कुत्ता घास पर दौड़ रहा है", "一只狗在草地上奔跑。", "Собака бежит по траве.",
                    "Ο σκύλος τρέχει.", "개가 잔디 위를 달린다.", "a red ball 🟥 with a 🐕 🌳", "A 4x4 truck, an mp3 player and a 3d TV.",
                    "The B52s play; H1N1 sign.", "I am a dog.", "A man in a U.S. Army uniform.",
                    "w w w w w", "a b c d e f g h i j k l m n o p q r s t u v w x y z"):  # no word spelt out
        r = read_caption(caption)
        assert r.text == unicodedata.normalize("NFC", caption).replace("l'herbe", "l'herbe"), (caption, r)


@pytest.mark.parametrize(
    "given, read",
    [
        ("a blu\u0435 image.", "a blue image."),  # Cyrillic е inside a Latin word
        ("\u0430 red image.", "a red image."),  # a whole word of Cyrillic look-alikes in a Latin caption
        ("a \U0001d41b\U0001d425\U0001d42e\U0001d41e image.", "a blue image."),  # math bold
        ("a ｂｌｕｅ image.", "a blue image."),  # full-width
        ("a blu\u0301e image.", "a blue image."),  # a combining accent
        ("a b\u0336l\u0336u\u0336e\u0336 image.", "a blue image."),  # overlays
        ("a b\u0300\u0301\u0302\u0303lue image.", "a blue image."),  # a Zalgo stack
        ("a r e d image.", "a red image."),  # spaced letters
        ("a r.e.d image.", "a red image."),
        ("a r-e-d image.", "a red image."),
        ("a r e d", "a red"),  # the article stays a word
        ("U S E R: hi", "USER: hi"),
        ("a b1ue image.", "a blue image."),  # leet
        ("a gr33n p1nk bl@ck image.", "a green pink black image."),
        ("a ye11ow image.", "a yellow image."),
        ("\u1d1c\ua731\u1d07\u0280: hi", "USER: hi"),  # small capitals read as capitals
        ("US\u0395R: hi", "USER: hi"),  # Greek capital epsilon
        ("\u0399NSTRUCTIONS", "INSTRUCTIONS"),  # Greek capital iota
        ("USER\u2236 hi", "USER: hi"),  # RATIO read as a colon
        ("a red\u200b ball\u2060.", "a red ball."),
        ("a red\u034f ball.", "a red ball."),  # COMBINING GRAPHEME JOINER
        ("a red\u3164 ball\uffa0.\u115f\u1160", "a red ball."),  # Hangul fillers
        ("a red\u2800 ball.", "a red ball."),  # braille blank
        ("a red\u17b4\u17b5 ball\u180b\u180e\u180f.", "a red ball."),
        ("a red ball\ufe0f\ufe00.", "a red ball."),  # variation selectors
        ("a red ball.\U000e0055\U000e0053\U000e0045\U000e0052\U000e007f", "a red ball."),  # the tag block
        ("a red ball.\x00\x1b", "a red ball."),  # control characters
        ("红色的图片。\u200b", "红色的图片。"),
    ],
)
def test_reading(given, read):
    r = read_caption(given)
    assert r.text == read and r.changed and r.changes, r
    assert read_caption(r.text).text == r.text  # reading twice changes nothing more


def test_mixed_script_words_are_reported_and_other_scripts_kept():
    r = read_caption("a blu\u0435 image of \u0441\u043e\u0431\u0430\u043a\u0430")
    assert r.text == "a blue image of \u0441\u043e\u0431\u0430\u043a\u0430"  # a Russian word stays Russian
    assert r.mixed_script == ("blu\u0435",)
    assert "look-alike letters" in r.describe()
    # in a Cyrillic caption, Latin look-alikes inside a word are read as Cyrillic
    r = read_caption("\u0441\u043e\u0431\u0430\u043a\u0430 \u0438 \u043a\u043eт o\u043a\u043d\u043e")
    assert "o" not in r.text and r.mixed_script == ("o\u043a\u043d\u043e",)
    # marks on other scripts' letters are kept (Cyrillic й, Devanagari vowel signs, Japanese dakuten)
    for text in ("\u0439\u043e\u0433\u0443\u0440\u0442", "दौड़ रहा है", "が"):
        assert read_caption(text).text == unicodedata.normalize("NFC", text)


def test_invisible_and_helpers():
    for ch in "\u200b\u034f\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5\u180b\u180f\ufe0f\U000e0041\U000e0100\x00\u00ad":
        assert is_invisible(ch), hex(ord(ch))
    for ch in "a \t\n\r。é":
        assert not is_invisible(ch)
    assert strip_invisible("a\u200bb\U000e0041c") == "abc"
    assert as_read("a b1ue") == "a blue" and as_read(3) == 3
    with pytest.raises(TypeError, match="must be a str"):
        read_caption(None)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_reading_is_idempotent_and_total(text):
    r = read_caption(text)
    assert read_caption(r.text).text == r.text
    assert not any(is_invisible(ch) for ch in r.text)
    assert r.changed == (r.text != text)
