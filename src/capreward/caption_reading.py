"""A caption as a person reads it: what every guard, penalty, encoder and judge of capreward sees.

A policy optimised against a reward finds every way in which the text a model is given differs from the
text a person reads: a Cyrillic "е" inside "blue", an invisible character inside "USER:", math-bold or
small-capital letters, a combining accent or overlay, "r e d" spelt out, "b1ue" in leet. None of them
changes what a reader sees, and each changed what a CLIP tokenizer or a pattern saw. :func:`read_caption`
returns the caption a person reads, and what it had to change to get there:

1. **NFKC** (compatibility forms: full-width "ＵＳＥＲ", math-bold "𝐛𝐥𝐮𝐞", circled, superscript letters).
2. **Invisible code points removed**: every Unicode default-ignorable code point (U+00AD, U+034F, the
   Hangul fillers U+115F/U+1160/U+3164/U+FFA0, U+17B4/U+17B5, U+180B-U+180F, U+200B-U+200F, U+2060-U+206F,
   the variation selectors U+FE00-U+FE0F and U+E0100-U+E01EF, U+FEFF, the tag block U+E0000-U+E007F, ...),
   the blank braille pattern U+2800, and every other format (Cf) or control (Cc) character except tab,
   newline and carriage return.
3. **Confusables mapped to the caption's script** (a subset of Unicode TR39's confusables for the Latin,
   Cyrillic and Greek scripts, and Latin small capitals read as capitals): inside a word that mixes
   scripts ("bluе" with a Cyrillic е), or a word written entirely in look-alikes of the caption's main
   script ("а" in an English caption), each letter becomes the letter of the caption's script it looks
   like. A mixed-script word is a signal in itself: it is reported (:attr:`Reading.mixed_script`), and
   a word that still mixes scripts once read (a letter no table maps: "blцe", a Cherokee "Ꭼ" in "rᎬd")
   is reported as :attr:`Reading.unreadable_mixed`, which the injection guard flags
   (:func:`mixed_after_reading`).
4. **Marks a reader does not read as letters**: combining overlays and enclosing marks (U+0334-U+0338,
   U+20D0-U+20F0) on any letter, and every combining mark on a Latin letter ("blúe", "b̶lue", Zalgo
   stacks are read "blue"; accents of Latin-script languages are folded too, "café" is read "cafe").
   Marks on the letters of other scripts (Cyrillic й, Devanagari vowel signs, Arabic harakat) are kept.
5. **Spaced or interleaved letters** joined: three or more single letters separated each time by the
   same separator ("r e d", "U S E R", "r.e.d", "r-e-d") are read as one word; a run that starts with the
   article "a" or "I" followed by at least three letters keeps it apart ("a r e d" is "a red"); a run of
   one letter repeated ("w w w") or of more than 16 letters is left as it is.
6. **Obvious leet**: digits 0, 1, 3, 4, 5, 7 (and "@", "$") between Latin letters are read as the letters
   they stand for ("b1ue", "r3d", "gr33n", "p1nk", "bl@ck"); "1" is "i" between two consonants and "l"
   otherwise. Digits at a word's edge ("3d", "mp3", "2nd") are left alone.

Ordinary captions are left unchanged (checked on every caption of the human-judgment benchmarks by the
tests); on printable ASCII text only steps 5 and 6 can change anything. Pure functions of the text;
no model, no tokenizer. Example::

    >>> from capreward.caption_reading import read_caption
    >>> r = read_caption("a blu\\u0435 ima\\u200bge")
    >>> r.text, r.mixed_script
    ('a blue image', ('bluе',))
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from .bounded_cache import text_memo
from .text import well_formed

# ------------------------------------------------------------------------------- invisible characters
_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x2800, 0x2800), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_INVISIBLE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" if a != b else re.escape(chr(a)) for a, b in _IGNORABLE_RANGES) + "]")


def is_invisible(ch: str) -> bool:
    """Whether a reader sees nothing of ``ch``: a default-ignorable code point (the tag block, variation
    selectors, Hangul fillers, U+034F, ...), U+2800, or a format (Cf) or control (Cc) character other than
    tab, newline and carriage return."""
    if _INVISIBLE.match(ch):
        return True
    category = unicodedata.category(ch)
    return category == "Cf" or (category == "Cc" and ch not in "\t\n\r")


def strip_invisible(text: str) -> str:
    """``text`` without the characters :func:`is_invisible` names."""
    return "".join(ch for ch in text if not is_invisible(ch))


# ------------------------------------------------------------------------------------- confusables
#: Cyrillic and Greek letters that look like Latin ones (from Unicode TR39's confusables.txt), and Latin
#: letters that read as others (small capitals as capitals, dotless i, script a and g).
_LATIN_VARIANTS = dict(zip("ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢıɑɡ", "ABCDEFGHIJKLMNOPRSTUVWYZiag"))
_TO_LATIN = {
    **dict(zip("аеорсухѕіјԁԛԝһӏ", "aeopcyxsijdqwhl")),
    **dict(zip("АВЕКМНОРСТХЅІЈҮԚԜӀ", "ABEKMHOPCTXSIJYQWI")),
    **dict(zip("αοινρυχγκτ", "aoivpuxykt")),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEZHIKMNOPTYX")),
    **dict(zip("օսոհ", "ounh")),  # Armenian
}
#: The Latin look-alikes of Cyrillic and Greek letters (for words in a Cyrillic or Greek caption).
_TO_CYRILLIC = dict(zip("aeopcyxsijhABEKMHOPCTXSIJY", "аеорсухѕіјһАВЕКМНОРСТХЅІЈҮ"))
_TO_GREEK = dict(zip("aoivpuxkABEZHIKMNOPTYX", "αοινρυχκΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"))
_TARGET_MAPS = {"LATIN": _TO_LATIN, "CYRILLIC": _TO_CYRILLIC, "GREEK": _TO_GREEK}
#: Punctuation that reads as a colon (TR39 maps each to ":"); NFKC already maps the full-width and small forms.
_COLONS = str.maketrans({c: ":" for c in "\u2236\u02f8\ua789\u05c3\u0589\u1361\u1804\u205a\u02d0\ufe30"})

_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK")
_OVERLAY = re.compile("[\u0334-\u0338\u20d0-\u20f0]")


@functools.lru_cache(maxsize=4096)
def script_of(ch: str) -> str | None:
    """The script of a letter as the first word of its Unicode name for Latin, Cyrillic and Greek
    letters ("LATIN", ...), "OTHER" for the letters of other scripts, None for anything else."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    for script in _SCRIPTS:
        if name.startswith(script) or (script == "LATIN" and ch.isascii()):
            return script
    if name.startswith("MODIFIER LETTER SMALL CAPITAL") or name.startswith("MODIFIER LETTER CAPITAL"):
        return "LATIN"
    return "OTHER"


def _main_script(text: str) -> str | None:
    counts: dict[str, int] = {}
    for ch in text:
        s = script_of(ch)
        if s is not None:
            counts[s] = counts.get(s, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda s: (counts[s], s == "LATIN"))


_WORD_CHARS = re.compile(r"[^\W_]+", re.UNICODE)


def _map_confusables(word: str, target: str, mixed: list[str]) -> str:
    given = word
    word = "".join(_LATIN_VARIANTS.get(ch, ch) for ch in word)  # small capitals read as capitals
    scripts = {s for s in map(script_of, word) if s is not None}
    table = _TARGET_MAPS.get(target)
    if len(scripts) > 1:
        mixed.append(given)
    elif (
        not scripts or target in scripts or table is None or any(ch.isdigit() for ch in word)
        or not all(ch in table for ch in word if ch.isalpha())
    ):
        return word  # one script: the caption's own, or a word (or a code, "α100α") a reader does not take for it
    if table is None:
        return word
    return "".join(table.get(ch, ch) if script_of(ch) != target else ch for ch in word)


def _fold_marks(text: str) -> str:
    """Remove overlays and enclosing marks on anything, and every combining mark on a Latin letter or on a
    character that is not a letter (NFD, then NFC)."""
    out: list[str] = []
    base: str | None = None
    for ch in unicodedata.normalize("NFD", text):
        if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me"):
            if _OVERLAY.match(ch) or unicodedata.category(ch) == "Me":
                continue
            if base is None or script_of(base) in ("LATIN", None):
                continue
            out.append(ch)
            continue
        base = ch
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


# ---------------------------------------------------------------------------------- layout tricks
_LETTER = r"[^\W\d_]"
_SPACED = re.compile(rf"(?<![^\W_])({_LETTER})([ .\-_*·•~+/|]{{1,3}})((?:{_LETTER}\2){{1,}}{_LETTER})(?![^\W_])")
#: Runs of more single letters than this are not read as one word.
_LONGEST_SPELT = 16
_LEET = {"0": "o", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"}
_LEET_WORD = re.compile(r"(?<![\w@$])[A-Za-z]+(?:[013457@$]+[A-Za-z]+)+(?![\w@$])")
_VOWELS = frozenset("aeiouyAEIOUY")


def _join_spaced(m: re.Match) -> str:
    letters = m.group(1) + m.group(3).replace(m.group(2), "")
    if len(letters) > _LONGEST_SPELT or len(set(letters.lower())) == 1:
        return m.group(0)  # not a word spelt out: a row of letters ("w w w w", an alphabet)
    if letters[0] in "aAI" and len(letters) >= 4 and m.group(2) == " ":
        return letters[0] + " " + letters[1:]
    return letters


def _leet(m: re.Match) -> str:
    word = m.group(0)
    out = []
    for j, ch in enumerate(word):
        if ch == "1":
            before = next((c for c in reversed(word[:j]) if c.isalpha()), "")
            after = next((c for c in word[j + 1 :] if c.isalpha()), "")
            consonants = before and after and before not in _VOWELS and after not in _VOWELS
            letter = "i" if consonants else "l"
        elif ch in _LEET:
            letter = _LEET[ch]
        else:
            out.append(ch)
            continue
        neighbours = [c for c in word if c.isalpha()]
        out.append(letter.upper() if neighbours and all(c.isupper() for c in neighbours) else letter)
    return "".join(out)


# ------------------------------------------------------------------------ words still mixed once read
#: Scripts whose words are written next to Latin ones inside one word in ordinary text ("T恤", "iPhone手机",
#: "Tシャツ", "K팝"): a Latin letter beside them is not suspect.
_SIDE_BY_SIDE = ("CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "HANGUL", "IDEOGRAPHIC")
#: Letters of another script that measurements write inside Latin words ("5 μm", "10 kΩ").
_UNIT_LETTERS = frozenset("μΩ")


def _mix_class(ch: str) -> str | None:
    script = script_of(ch)
    if script != "OTHER":
        return script
    name = unicodedata.name(ch, "")
    return None if name.startswith(_SIDE_BY_SIDE) else name.split(" ")[0]


def mixed_after_reading(text: str) -> tuple[str, ...]:
    """The words of ``text`` (a caption as read) that mix letters of several scripts where a reader
    cannot tell them apart: two of Latin, Cyrillic and Greek, or one of them with an alphabet of another
    script (Armenian, Cherokee, ...). Latin beside CJK, kana or Hangul ("T恤") is ordinary, and so are
    the unit letters μ and Ω ("μm", "kΩ"). Pure; ``()`` for ordinary captions."""
    if text.isascii():
        return ()
    out = []
    for m in _WORD_CHARS.finditer(text):
        word = m.group(0)
        classes = {_mix_class(ch) for ch in word if ch not in _UNIT_LETTERS} - {None}
        if len(classes) > 1:
            out.append(word)
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------------------- the reading
@dataclass(frozen=True)
class Reading:
    """A caption as read (:func:`read_caption` returns it).

    Args:
        text: what a person reads.
        given: the caption as given.
        changes: one short line per kind of change made (empty when the text is unchanged).
        mixed_script: the words of the caption that mixed letters of several scripts, as given.
        unreadable_mixed: the words of ``text`` that still mix scripts once read (`mixed_after_reading()`).

    Examples:
        >>> from capreward.caption_reading import read_caption
        >>> r = read_caption("a red ima\\u200bge")         # a zero-width space
        >>> r.text, r.given == "a red ima\\u200bge", r.changed
        ('a red image', True, True)
    """

    text: str
    given: str
    changes: tuple[str, ...] = ()
    mixed_script: tuple[str, ...] = ()
    unreadable_mixed: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.text != self.given

    def describe(self) -> str | None:
        """The changes as one line.

        Returns:
            ``"invisible characters removed (U+200B); ..."``, or None when the text is unchanged.
        """
        return "; ".join(self.changes) if self.changes else None


def _codes(chars) -> str:
    found = sorted({f"U+{ord(c):04X}" for c in chars})
    return ", ".join(found[:6]) + (f", ... {len(found) - 6} more" if len(found) > 6 else "")


@text_memo(max_entries=16384, max_chars=1 << 25)  # at most 32 Mi characters of readings kept, not 16,384 of any length
def read_caption(text: str) -> Reading:
    """The caption a person reads, with what had to change (see the module docstring for the steps).

    Args:
        text: the caption as given (a lone surrogate is read as U+FFFD).

    Returns:
        a `Reading`; ``read_caption(r.text).text == r.text`` (reading twice changes nothing more).

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"a caption must be a str, got {type(text).__name__}")
    given = text
    changes: list[str] = []
    if text.isascii() and text.isprintable() and not _SPACED.search(text) and not _LEET_WORD.search(text):
        return Reading(text, given)
    text = well_formed(text)
    nfkc = unicodedata.normalize("NFKC", text)
    if nfkc != unicodedata.normalize("NFC", text):
        changes.append("compatibility forms (NFKC)")
    text = nfkc
    hidden = [ch for ch in text if is_invisible(ch)]
    if hidden:
        text = "".join(ch for ch in text if not is_invisible(ch))
        changes.append(f"invisible characters removed ({_codes(hidden)})")
    colons = text.translate(_COLONS)
    if colons != text:
        changes.append("look-alike colons read as ':'")
        text = colons
    target = _main_script(text)
    mixed: list[str] = []
    if target is not None:
        mapped = _WORD_CHARS.sub(lambda m: _map_confusables(m.group(0), target, mixed), text)
        if mapped != text:
            changes.append(f"look-alike letters read in the {target.lower()} script")
            text = mapped
    folded = _fold_marks(text)
    if folded != unicodedata.normalize("NFC", text):
        changes.append("combining marks on latin letters and overlays removed")
    text = folded
    joined = text
    for _ in range(3):  # nested separators ("U . S . E . R")
        joined = _SPACED.sub(_join_spaced, joined)
    if joined != text:
        changes.append("spaced letters joined")
        text = joined
    leet = _LEET_WORD.sub(_leet, text)
    if leet != text:
        changes.append("leet digits read as letters")
        text = leet
    if text != given and not changes:  # only NFC composition or a surrogate
        changes.append("normalised (NFC)")
    return Reading(text, given, tuple(changes), tuple(dict.fromkeys(mixed)), mixed_after_reading(text))


def as_read(text: str) -> str:
    """The text of :func:`read_caption` (``text`` itself when it is not a str)."""
    return read_caption(text).text if isinstance(text, str) else text


#: Documented in the API reference (docs/api/caption_reading.md); the helpers above are internal.
__all__ = ["Reading", "read_caption"]
