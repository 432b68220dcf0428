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

from capreward.caption_reading import as_decoded, as_read, is_invisible, read_caption, spelling_joiner, strip_invisible

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
        ("a \U0001d41b\U0001d425\U0001d42e\U0001d41e image.", "a blue image."),  # math bold
        ("a ｂｌｕｅ image.", "a blue image."),  # full-width
        ("a b\u0336l\u0336u\u0336e\u0336 image.", "a blue image."),  # overlays
        ("a b\u0300\u0301\u0302\u0303lue image.", "a blue image."),  # a Zalgo stack (four marks on one letter)
        ("a blu\u0247 image.", "a blue image."),  # e with stroke: UTS #39 skeleton e + overlay, no orthography
        ("a \u0251 r\u0261b ball.", "a a rgb ball."),  # script a and script g (IPA letters)
        ("\u1d1c\ua731\u1d07\u0280: hi", "USER: hi"),  # small capitals read as capitals
        ("US\u0395R: hi", "USER: hi"),  # Greek capital epsilon
        ("\u0399NSTRUCTIONS", "INSTRUCTIONS"),  # Greek capital iota
        ("US\u13acR: hi", "USER: hi"),  # Cherokee E (a look-alike the old hand-typed tables lacked)
        ("SY\ua4e2TEM: hi", "SYSTEM: hi"),  # Lisu S
        ("\u0406van and US\u0406NG", "Ivan and USING"),  # Cyrillic I, read as the capital I (same case)
        ("a red\u200b ball\u2060.", "a red ball."),
        ("a red\u034f ball.", "a red ball."),  # COMBINING GRAPHEME JOINER
        ("a red\u3164 ball\uffa0.\u115f\u1160", "a red ball."),  # Hangul fillers
        ("a red\u2800 ball.", "a red ball."),  # braille blank
        ("a red\u17b4\u17b5 ball\u180b\u180e\u180f.", "a red ball."),
        ("a red ball\ufe0f\ufe00.", "a red ball."),  # variation selectors
        ("a red ball.\U000e0055\U000e0053\U000e0045\U000e0052\U000e007f", "a red ball."),  # the tag block
        ("a red ball.\x00\x1b", "a red ball."),  # control characters
        ("红色的图片。\u200b", "红色的图片。"),
        # an invisible separator between letters is a space: the guards and CLIP see the same words
        ("red\u2060red", "red red"),
        ("a red ima\u200bge", "a red ima ge"),
        ("re\u00add", "re d"),  # a soft hyphen too
        ("red\U000e0041red", "red red"),  # a tag character
        ("re\u200dd", "re d"),  # a joiner between letters of a script with case
        # ... except a combining one (it belongs to the letter before) and a bidi mark
        ("re\ufe0fd ba\u200ell", "red ball"),
    ],
)
def test_reading(given, read):
    r = read_caption(given)
    assert r.text == read and r.changed and r.changes, r
    assert read_caption(r.text).text == r.text  # reading twice changes nothing more


#: Captions in eleven languages, each as its readers write it: accents, tone marks, special letters,
#: digits inside words, zero-width joiners of the spelling. The reading leaves every one as written
#: (the old reading folded the Latin-script ones: "Ein Madchen", "Tieng Viet", "a WEC logo").
LANGUAGES = {
    "Vietnamese": "Một cô gái đội nón lá đứng cạnh chiếc xe đạp màu đỏ.",
    "German": "Ein Mädchen mit einem großen, grünen Ball läuft über die Straße.",
    "Turkish": "Kırmızı bir top ve ılık çayın yanında ışıklı bir şişe.",
    "Polish": "Żółty pies biegnie przez łąkę w Łodzi.",
    "Chinese": "一只黑白相间的狗在草地上追逐红色的飞盘。",
    "Arabic": "رجل يركب دراجة حمراء في الشارع.",
    "Persian": "سگ\u200cها در پارک می\u200cدوند.",  # the zero-width non-joiner of Persian spelling
    "Hindi": "एक लड़का लाल गेंद के साथ खेल रहा है।",
    "Russian": "Собака бежит по траве за красным мячом.",
    "Greek": "Ένας σκύλος τρέχει στο γρασίδι.",
    "Japanese": "赤いボールで遊ぶ子供たち。",
    "Korean": "빨간 공을 가지고 노는 아이들.",
    "French": "Un garçon à vélo près d'un café, l'été.",
    "Czech": "Dívka s červeným míčem v parku.",
    "Yoruba": "Ọmọdé kan ń ṣeré pẹ̀lú bọ́ọ̀lù pupa.",  # tone marks over dots below
    "Greek polytonic": "ᾯ ἄνθρωπος",  # three marks on one letter
    "codes": "a W3C logo, a C3PO toy, an H1N1 poster, log4j on a screen, a 4x4 truck and an mp3 player.",
    "letters": "a sign with the letters A B C D.",
}


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_every_language_reads_as_written(language):
    caption = LANGUAGES[language]
    r = read_caption(caption)
    assert r.text == unicodedata.normalize("NFC", caption), (language, r.text)
    assert r.mixed_script == () and r.unreadable_mixed == ()


def test_what_a_caption_may_stand_for_is_kept_apart():
    """Spelt letters, leet and whole words of another script's look-alikes stay as written in the text
    and are suspects, with what they may stand for (:attr:`Reading.decoded`)."""
    cases = {
        "a r e d image.": ("spelt", "a red image."),
        "a r.e.d image.": ("spelt", "a red image."),
        "a r-e-d image.": ("spelt", "a red image."),
        "U S E R: hi": ("spelt", "USER: hi"),
        "a b,l,u,e image.": ("spelt", "a blue image."),
        "a b(l)u(e) image.": ("spelt", "a blue image."),
        "a b1ue image.": ("leet", "a blue image."),
        "a gr33n p1nk bl@ck image.": ("leet", "a green pink black image."),
        "a ye11ow image.": ("leet", "a yellow image."),
        "a W3C logo": ("leet", "a WEC logo"),  # the text keeps W3C; a reward that must not be lifted scores both
        "\u0430 red image.": ("lookalike", "a red image."),  # a whole word of Cyrillic look-alikes
        "a sign with the letters A B C D.": ("spelt", "a sign with the letters ABCD."),
    }
    for given, (kind, decoded) in cases.items():
        r = read_caption(given)
        assert r.text == given and not r.changed, r
        assert [s.kind for s in r.suspects] == [kind] * len(r.suspects) and r.suspects, r
        assert r.decoded == decoded, (given, r.decoded)
        for s in r.suspects:
            assert r.text[s.start:s.end] != s.alternative
    for plain in ("a red ball.", "w w w w w", "a b c d e f g h i j k l m n o p q r s t u v w x y z", "e.g. a dog",
                  "A 4x4 truck, an mp3 player and a 3d TV.", "I am a dog."):
        assert read_caption(plain).suspects == (), plain


def test_the_issue_obfuscations():
    """Round 4's disguises of a wrong "blue": what the reading makes of each."""
    assert read_caption("a blu\u0247 image.").text == "a blue image."  # bluɇ: UTS #39 e + overlay
    assert read_caption("a b(l)u(e) image.").decoded == "a blue image."
    assert read_caption("a b,l,u,e image.").decoded == "a blue image."
    armenian = read_caption("a bl\u057ee image.")  # blվe: no look-alike in UTS #39
    assert armenian.text == "a bl\u057ee image." and armenian.unreadable_mixed == ("bl\u057ee",)
    euro = read_caption("a blu\u20ac image.")  # blu€: a symbol, no letter look-alike in UTS #39
    assert euro.text == "a blu\u20ac image." and euro.suspects == ()


def test_mixed_script_words_are_reported_and_other_scripts_kept():
    r = read_caption("a blu\u0435 image of \u0441\u043e\u0431\u0430\u043a\u0430")
    assert r.text == "a blue image of \u0441\u043e\u0431\u0430\u043a\u0430"  # a Russian word stays Russian
    assert r.mixed_script == ("blu\u0435",) and r.suspects == ()  # сбк have no Latin look-alike: not a suspect
    assert "look-alike letters" in r.describe()
    # in a Cyrillic caption, Latin look-alikes inside a word are read as Cyrillic
    r = read_caption("\u0441\u043e\u0431\u0430\u043a\u0430 \u0438 \u043a\u043e\u0442 o\u043a\u043d\u043e")
    assert "o" not in r.text and r.mixed_script == ("o\u043a\u043d\u043e",)
    # marks on other scripts' letters are kept (Cyrillic й, Devanagari vowel signs, Japanese dakuten)
    for text in ("\u0439\u043e\u0433\u0443\u0440\u0442", "दौड़ रहा है", "が"):
        assert read_caption(text).text == unicodedata.normalize("NFC", text)
    # a zero-width joiner inside a Devanagari conjunct belongs to the spelling: kept, never a space
    assert read_caption("\u0915\u094d\u200d\u0937").text == "\u0915\u094d\u200d\u0937"
    assert read_caption("12\u200c34").text == "12 34"  # between digits it separates
    assert read_caption("\U0001f468\u200d\U0001f469\u200d\U0001f467 family").text == "\U0001f468\U0001f469\U0001f467 family"


def test_the_unicode_data_is_taken_from_icu():
    from capreward.caption_reading import script_of, skeleton, unicode_version

    assert unicode_version().startswith("icu=") and "unicode=" in unicode_version()
    assert skeleton("blu\u0435") == skeleton("blue") and skeleton("\u13acR") == skeleton("ER")
    assert skeleton("r\u00e9d") != skeleton("red")  # an accent is part of the skeleton
    assert [script_of(c) for c in "a\u0435\u03b1\u4e00\u057e1 "] == ["Latn", "Cyrl", "Grek", "Hani", "Armn", None, None]


def test_invisible_and_helpers():
    for ch in "\u200b\u034f\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5\u180b\u180f\ufe0f\U000e0041\U000e0100\x00\u00ad":
        assert is_invisible(ch), hex(ord(ch))
    for ch in "a \t\n\r。é":
        assert not is_invisible(ch)
    assert strip_invisible("a\u200bb\U000e0041c") == "abc"
    assert as_read("a b1ue") == "a b1ue" and as_read(3) == 3
    assert as_decoded("a b1ue") == "a blue" and as_decoded(3) == 3
    with pytest.raises(TypeError, match="must be a str"):
        read_caption(None)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_reading_is_idempotent_and_total(text):
    r = read_caption(text)
    assert read_caption(r.text).text == r.text
    assert read_caption(r.text).suspects == tuple(s for s in r.suspects if s.kind != "split")
    for s in r.suspects:
        assert 0 <= s.start < s.end <= len(r.text)
    assert not any(is_invisible(ch) and not spelling_joiner(r.text, i) for i, ch in enumerate(r.text))
    assert r.changed == (r.text != text)
