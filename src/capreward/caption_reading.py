"""A caption as a person reads it: what every guard, penalty, encoder and judge of capreward sees.

A policy optimised against a reward finds every way in which the text a model is given differs from the
text a person reads: a Cyrillic "е" inside "blue", an invisible character inside "USER:", math-bold or
small-capital letters, an overlay, a stack of combining marks. None of them changes what a reader sees.
A reader of German, Vietnamese, Turkish or Polish also reads every accent, tone mark and special letter
("Mädchen", "tiếng", "kırmızı", "Łódź"), and a reader of "W3C" or "C3PO" reads its digits: those are
words, and they stay. :func:`read_caption` returns the caption a person reads, and what it had to
change to get there. It folds only what changes no word for a reader of the caption's language:

1. **NFKC** (compatibility forms: full-width "ＵＳＥＲ", math-bold "𝐛𝐥𝐮𝐞", circled, superscript letters).
2. **Invisible characters**: every Default_Ignorable_Code_Point, format (Cf) and control (Cc) character
   except tab, newline and carriage return, and the blank braille pattern U+2800. A combining one (the
   variation selectors, U+034F) or a bidi mark is removed; any other one (U+200B, U+2060, U+00AD, the
   tag block, a Hangul filler, ...) between two letters or digits is read as a **space**, so that the
   guards and a text encoder see the same words: "red\\u2060red" is "red red" to both (removing it
   would give the guards one unknown word "redred" while CLIP's sub-word tokenizer still reads "red"
   twice). The exception is a zero-width (non-)joiner between two letters of a script without case
   (Persian "می‌خواهم", Devanagari conjuncts), where it belongs to the spelling: it is kept there.
3. **Look-alike letters of another script inside a word** (UTS #39 confusables): in a word that mixes
   scripts ("bluе" with a Cyrillic е, "USᎬR" with a Cherokee Ꭼ, "oкно" with a Latin o in a Russian
   word), each letter of the word's minority script becomes the letter of its main script that has the
   same UTS #39 skeleton. A mixed-script word is reported (:attr:`Reading.mixed_script`), and one that
   still mixes scripts once read (a letter with no look-alike: "blվe" with an Armenian վ) is reported as
   :attr:`Reading.unreadable_mixed`, which the injection guard flags. Latin beside Han, kana or Hangul
   ("T恤", "iPhone手机") is ordinary and left alone.
4. **Letters no modern orthography uses** (outside UTS #39's Identifier_Status=Allowed: small capitals,
   "ɇ", "ɑ", "ɡ") are read as the letter they look like ("ᴜꜱᴇʀ" is "USER", "bluɇ" is "blue"); the
   letters of living orthographies (ł, đ, ø, ı, ß, ə, every accented letter) are never touched.
5. **Marks a reader does not read**: combining overlays (canonical combining class 1: "b̶lue") and
   enclosing marks, and a stack of more than three combining marks on a Latin, Greek, Cyrillic or
   Armenian letter (Zalgo text; Vietnamese writes two, polytonic Greek three).

What the text *might* stand for is kept apart, as :attr:`Reading.suspects`: spans of the reading that a
reader may take for another word, each with that other reading. Single letters spelt out with one
separator ("r e d", "U S E R", "b,l,u,e", "A B C D") or between punctuation ("b(l)u(e)", "U.S.A."), leet
digits between letters ("b1ue", "gr33n", but also "W3C" and "C3PO"), and a whole word of another
script's look-alikes ("а" in "а red image", Cyrillic). The text keeps them as written;
:attr:`Reading.decoded` has each replaced by what it may stand for, and a reward that must not be
lifted by such a disguise scores both and keeps the lower (see ``docs/design/caption-reading.md``).

The Unicode data (UTS #39 skeletons, scripts and the Identifier_Status=Allowed set) is read from
``reading_unicode.txt``, written from ICU by ``scripts/make_reading_data.py``; the character classes
(Default_Ignorable_Code_Point, categories, combining classes) come from the ``regex`` module. Reading is
linear in the caption's length. Ordinary captions are left unchanged (checked on every caption of the
human-judgment benchmarks by the tests). Pure functions of the text; no model, no tokenizer. Example::

    >>> from capreward.caption_reading import read_caption
    >>> r = read_caption("a blu\\u0435 image of ein M\\u00e4dchen")
    >>> r.text, r.mixed_script
    ('a blue image of ein Mädchen', ('bluе',))
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import cast
from dataclasses import dataclass
from importlib import resources

import regex

from .bounded_cache import text_memo
from .text import well_formed

# ------------------------------------------------------------------------------------ the Unicode data
_DATA_FILE = "reading_unicode.txt"


@dataclass(frozen=True)
class _UnicodeData:
    version: str
    skeleton: dict[str, str]
    by_skeleton: dict[str, tuple[str, ...]]
    script_starts: tuple[int, ...]
    script_ends: tuple[int, ...]
    script_names: tuple[str, ...]
    allowed_starts: tuple[int, ...]
    allowed_ends: tuple[int, ...]


@functools.cache
def _data() -> _UnicodeData:
    text = resources.files("capreward").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    section = None
    version = ""
    skeleton: dict[str, str] = {}
    scripts: list[tuple[int, int, str]] = []
    allowed: list[tuple[int, int]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            head, _, rest = line.partition(" ")
            section = head[1:]
            if section == "version":
                version = rest
            continue
        fields = line.split()
        if section == "confusables":
            skeleton[chr(int(fields[0], 16))] = "".join(chr(int(f, 16)) for f in fields[1:])
        elif section == "scripts":
            scripts.append((int(fields[0], 16), int(fields[1], 16), fields[2]))
        elif section == "recommended":
            allowed.append((int(fields[0], 16), int(fields[1], 16)))
    by_skeleton: dict[str, list[str]] = {}
    for ch, sk in skeleton.items():
        by_skeleton.setdefault(sk, []).append(ch)
    return _UnicodeData(
        version, skeleton, {k: tuple(v) for k, v in by_skeleton.items()},
        tuple(a for a, _, _ in scripts), tuple(b for _, b, _ in scripts), tuple(s for _, _, s in scripts),
        tuple(a for a, _ in allowed), tuple(b for _, b in allowed),
    )


def unicode_version() -> str:
    """The ICU and Unicode versions the reading's data was taken from (``"icu=77.1 unicode=16.0"``)."""
    return _data().version


@functools.lru_cache(maxsize=8192)
def script_of(ch: str) -> str | None:
    """The Unicode Script of a character as its ISO 15924 code ("Latn", "Cyrl", "Grek", "Hani", ...),
    None for Common, Inherited and unassigned characters (digits, punctuation, combining marks)."""
    d = _data()
    cp = ord(ch)
    i = bisect.bisect_right(d.script_starts, cp) - 1
    return d.script_names[i] if i >= 0 and cp <= d.script_ends[i] else None


@functools.lru_cache(maxsize=8192)
def _allowed(ch: str) -> bool:
    """Whether UTS #39 allows ``ch`` in identifiers (Identifier_Status=Allowed): a letter of a modern
    orthography."""
    d = _data()
    cp = ord(ch)
    i = bisect.bisect_right(d.allowed_starts, cp) - 1
    return i >= 0 and cp <= d.allowed_ends[i]


def skeleton(text: str) -> str:
    """The UTS #39 skeleton of ``text``: NFD, each code point replaced by its prototype, NFD again.
    Two strings a reader cannot tell apart have the same skeleton ("bluе" with a Cyrillic е and "blue")."""
    d = _data()
    return unicodedata.normalize(
        "NFD", "".join(d.skeleton.get(c, c) for c in unicodedata.normalize("NFD", text)))


# ------------------------------------------------------------------------------- invisible characters
_INVISIBLE_CLASS = r"[\p{Default_Ignorable_Code_Point}\p{Cf}\u2800\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
_INVISIBLE = regex.compile(_INVISIBLE_CLASS)
_INVISIBLE_RUN = regex.compile(_INVISIBLE_CLASS + "+")
#: Invisible characters that attach to the character before them (variation selectors, U+034F) or only
#: order text (bidi marks and controls): never a word separator.
_NOT_SEPARATOR = regex.compile(r"[\p{Mn}\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_JOINERS = frozenset("\u200c\u200d")
#: Where an invisible separator was read as a space, until the reading ends (a noncharacter: no text
#: holds one; a caption's own is read as U+FFFD).
_SPLIT = "\ufdd0"


def spelling_joiner(text: str, i: int) -> bool:
    """Whether ``text[i]`` is a zero-width (non-)joiner that the reading keeps: one of a run of them
    between two letters (or marks) of scripts without case, where it belongs to the spelling (Persian
    "می‌خواهم", Devanagari conjuncts)."""
    if text[i] not in _JOINERS:
        return False
    a, b = i, i
    while a > 0 and text[a - 1] in _JOINERS:
        a -= 1
    while b + 1 < len(text) and text[b + 1] in _JOINERS:
        b += 1
    if a == 0 or b + 1 >= len(text):
        return False
    before, after = text[a - 1], text[b + 1]
    return _caseless_letter(before) and _caseless_letter(after)


def is_invisible(ch: str) -> bool:
    """Whether a reader sees nothing of ``ch``: a Default_Ignorable_Code_Point (the tag block, variation
    selectors, Hangul fillers, U+034F, ...), a format (Cf) or control (Cc) character other than tab,
    newline and carriage return, or U+2800."""
    return _INVISIBLE.fullmatch(ch) is not None


def strip_invisible(text: str) -> str:
    """``text`` without the characters :func:`is_invisible` names."""
    return _INVISIBLE.sub("", text)


def _word_char(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


def _caseless_letter(ch: str) -> bool:
    """A letter or mark of a script without case (Arabic, Devanagari, Han, ...)."""
    return (ch.isalpha() or unicodedata.category(ch)[0] == "M") and not ch.isupper() and not ch.islower()


def _read_invisible(text: str, seen: list[str], spaced: list[str]) -> str:
    """Remove invisible characters, reading a separator between two word characters as a space."""

    def one(m: regex.Match) -> str:
        run = m.group(0)
        start, end = m.span()
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        if set(run) <= _JOINERS and before and after and _caseless_letter(before) and _caseless_letter(after):
            return run  # part of the spelling of a script without case (Persian, Indic): kept
        seen.append(run)
        if not (before and after and _word_char(before) and _word_char(after)):
            return ""
        separators = [c for c in run if not _NOT_SEPARATOR.match(c)]
        if not separators:
            return ""
        spaced.append(run)
        return _SPLIT

    return _INVISIBLE_RUN.sub(one, text)


# ------------------------------------------------------------------------------------- look-alikes
#: Scripts written beside Latin inside one word in ordinary text ("T恤", "iPhone手机", "Tシャツ", "K팝").
_SIDE_BY_SIDE = frozenset({"Hani", "Hira", "Kana", "Hang", "Bopo"})
#: Letters of another script that measurements write inside Latin words ("5 μm", "10 kΩ").
_UNIT_LETTERS = frozenset("μΩ")
_SMALL_CAPITAL = regex.compile(r"^(LATIN|GREEK|CYRILLIC) LETTER SMALL CAPITAL ([A-Z]+)$")
_OVERLAY_MARK = regex.compile(r"\p{ccc=1}")


@functools.lru_cache(maxsize=8192)
def _lookalike(ch: str, target: str) -> str | None:
    """The letter of script ``target`` with the same UTS #39 skeleton as ``ch`` (of the same case when
    there is one), or None."""
    d = _data()
    sk = skeleton(ch)
    candidates = list(d.by_skeleton.get(sk, ()))
    if len(sk) == 1:
        candidates.append(sk)
    fits = [c for c in candidates if c.isalpha() and script_of(c) == target and _allowed(c)]
    if not fits:
        return None
    same_case = [c for c in fits if c.isupper() == ch.isupper()]
    return min(same_case or fits, key=ord)


@functools.lru_cache(maxsize=8192)
def _unused_letter_reading(ch: str) -> str | None:
    """What a letter no modern orthography uses reads as: a small capital as its capital, another such
    letter as the allowed letters of its own script that UTS #39 says it looks like (overlays dropped:
    "ɇ" is "e"); None for an allowed letter or one without such a reading."""
    if not ch.isalpha() or _allowed(ch):
        return None
    m = _SMALL_CAPITAL.match(unicodedata.name(ch, ""))
    if m:
        try:
            return unicodedata.lookup(f"{m.group(1)} CAPITAL LETTER {m.group(2)}")
        except KeyError:
            return None
    read = unicodedata.normalize("NFC", _OVERLAY_MARK.sub("", skeleton(ch)))
    own = script_of(ch)
    if read and read != ch and all(c.isalpha() and _allowed(c) and script_of(c) == own for c in read):
        return read
    return None


def _letter_scripts(word: str) -> Counter:
    """How many letters of each script ``word`` has (Common, Inherited and the scripts written beside
    Latin left out)."""
    found = set(map(script_of, word))
    found.discard(None)
    if len(found) <= 1 and not (found & _SIDE_BY_SIDE):
        return Counter(dict.fromkeys(found, 1))  # one script: its count does not matter
    return Counter(s for s in map(script_of, word) if s is not None and s not in _SIDE_BY_SIDE)


def _read_word(word: str, target: str | None, mixed: list[str], suspects: list[tuple[int, int, str]],
               at: int) -> str:
    """A word with its unused letters read and, when it mixes scripts, its minority letters read in its
    main script. A whole word of another script's look-alikes is left as written and recorded in
    ``suspects`` (its start ``at`` in the reading)."""
    read, was_mixed, alternative = _word_reading(word, target)
    if was_mixed:
        mixed.append(word)
    if alternative is not None:
        suspects.append((at, at + len(read), alternative))
    return read


@functools.lru_cache(maxsize=8192)
def _word_reading(word: str, target: str | None) -> tuple[str, bool, str | None]:
    """(the word as read, whether it mixed scripts, what a whole look-alike word may stand for)."""
    out = [_unused_letter_reading(c) or c for c in word]
    word_read = "".join(out)
    scripts = _letter_scripts("".join(c for c in word_read if c not in _UNIT_LETTERS))
    if len(scripts) > 1:
        top = scripts.most_common()
        main = target if target in scripts and top[0][1] == top[1][1] else top[0][0]
        out = [(_lookalike(c, main) or c) if script_of(c) not in (None, main) and c not in _UNIT_LETTERS else c
               for c in word_read]
        return "".join(out), True, None
    if (len(scripts) == 1 and target is not None and target not in scripts and target not in _SIDE_BY_SIDE
            and not any(c.isdigit() for c in word_read)):
        mapped = [_lookalike(c, target) if c.isalpha() else c for c in word_read]
        if all(m is not None for m in mapped):
            return word_read, False, "".join(cast(list[str], mapped))
    return word_read, False, None


_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+")


def _main_script(text: str) -> str | None:
    tally: Counter = Counter()
    for ch, n in Counter(text).items():
        if ch.isalpha():
            s = script_of(ch)
            if s is not None:
                tally[s] += n
    if not tally:
        return None
    return max(tally, key=lambda s: (tally[s], s == "Latn"))


def _read_letters(text: str, mixed: list[str], suspects: list[tuple[int, int, str]]) -> str:
    target = _main_script(text)
    distinct = {c for c in set(text) if c.isalpha()}
    interesting = {c for c in distinct if script_of(c) not in (None, target) or _unused_letter_reading(c)}
    if not interesting:
        return text
    pieces: list[str] = []
    last = 0
    length = 0  # of the pieces so far: where the next word starts in the reading
    wanted = re.compile("[" + "".join(re.escape(c) for c in interesting) + "]")
    for m in _WORD.finditer(text):
        word = m.group(0)
        if not wanted.search(word):
            continue
        between = text[last:m.start()]
        pieces.append(between)
        length += len(between)
        read = _read_word(word, target, mixed, suspects, length)
        pieces.append(read)
        length += len(read)
        last = m.end()
    pieces.append(text[last:])
    return "".join(pieces)


# ----------------------------------------------------------------------------------------------- marks
_DROPPED_MARKS = regex.compile(r"[\p{Me}\p{ccc=1}]")
#: More combining marks on one letter than any orthography of these scripts writes (Zalgo text).
_MARK_STACK = regex.compile(r"([\p{sc=Latin}\p{sc=Greek}\p{sc=Cyrillic}\p{sc=Armenian}])\p{Mn}{4,}")
_ANY_MARK = regex.compile(r"\p{M}")


def _read_marks(text: str) -> str:
    if not _ANY_MARK.search(text):
        return text
    nfd = unicodedata.normalize("NFD", text)
    out = _MARK_STACK.sub(r"\1", _DROPPED_MARKS.sub("", nfd))
    return text if out == nfd else unicodedata.normalize("NFC", out)


# ------------------------------------------------------------------------------------------- suspects
_W = r"\p{L}\p{M}\p{N}"
#: Single letters with one separator (1-3 spaces or punctuation marks, the same each time): "r e d".
_SPELT = regex.compile(rf"(?<![{_W}])(\p{{L}})([^{_W}\n]{{1,3}})((?:\p{{L}}\2)+\p{{L}})(?![{_W}])")
#: Single letters between punctuation, without spaces: "b(l)u(e)", "b,l,u,e", "U.S.A.".
_GAPPED = regex.compile(rf"(?<![{_W}])\p{{Ps}}?\p{{L}}(?:[\p{{P}}\p{{S}}]{{1,2}}\p{{L}}){{2,}}\p{{Pe}}?(?![{_W}])")
#: The same three patterns for ASCII text, with the standard library's ``re`` (two to three times faster;
#: an ASCII text has no combining mark).
_SPELT_ASCII = re.compile(r"(?<![A-Za-z0-9])([A-Za-z])([^A-Za-z0-9\n]{1,3})((?:[A-Za-z]\2)+[A-Za-z])(?![A-Za-z0-9])")
_GAPPED_ASCII = re.compile(r"(?<![A-Za-z0-9])[(\[{]?[A-Za-z](?:[^A-Za-z0-9\s]{1,2}[A-Za-z]){2,}[)\]}]?(?![A-Za-z0-9])")
_LEET_ASCII = re.compile(r"(?<![A-Za-z0-9@$])[A-Za-z]+(?:[013457@$]+[A-Za-z]+)+(?![A-Za-z0-9@$])")
#: Runs of more single letters than this are not read as one word.
_LONGEST_SPELT = 16
_LEET = {"0": "o", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"}
_LEET_WORD = regex.compile(r"(?<![\p{L}\p{M}\p{N}@$])[A-Za-z]+(?:[013457@$]+[A-Za-z]+)+(?![\p{L}\p{M}\p{N}@$])")
_VOWELS = frozenset("aeiouyAEIOUY")


def _spelt(m: re.Match | regex.Match) -> str | None:
    letters = m.group(1) + m.group(3).replace(m.group(2), "")
    if len(letters) > _LONGEST_SPELT or len(set(letters.lower())) == 1:
        return None  # not a word spelt out: a row of letters ("w w w w", an alphabet)
    if letters[0] in "aAI" and len(letters) >= 4 and m.group(2) == " " and letters[1:].islower():
        return letters[0] + " " + letters[1:]  # "a r e d" is "a red"
    return letters


def _gapped(m: re.Match | regex.Match) -> str | None:
    letters = "".join(c for c in m.group(0) if c.isalpha())
    if len(letters) > _LONGEST_SPELT or len(set(letters.lower())) == 1:
        return None
    return letters


def _leet(m: re.Match | regex.Match) -> str:
    word = m.group(0)
    out = []
    letters = [c for c in word if c.isalpha()]
    upper = all(c.isupper() for c in letters)
    for j, ch in enumerate(word):
        if ch == "1":
            before = next((c for c in reversed(word[:j]) if c.isalpha()), "")
            after = next((c for c in word[j + 1:] if c.isalpha()), "")
            letter = "i" if before and after and before not in _VOWELS and after not in _VOWELS else "l"
        elif ch in _LEET:
            letter = _LEET[ch]
        else:
            out.append(ch)
            continue
        out.append(letter.upper() if upper else letter)
    return "".join(out)


@dataclass(frozen=True)
class Suspect:
    """A span of a reading that a reader may take for another word (:attr:`Reading.suspects`).

    Args:
        start: where the span starts in :attr:`Reading.text`.
        end: where it ends (exclusive).
        kind: ``"spelt"`` (single letters with a separator: "r e d", "b(l)u(e)"), ``"leet"`` (digits
            between letters: "b1ue"), ``"lookalike"`` (a whole word of another script's look-alikes), or
            ``"split"`` (the space an invisible separator was read as: "bl\u200bue" is "bl ue", and may
            stand for "blue").
        alternative: what the span may stand for ("red", "blue"; "" for a split).

    Examples:
        >>> from capreward.caption_reading import read_caption
        >>> read_caption("a b,l,u,e ball").suspects
        (Suspect(start=2, end=9, kind='spelt', alternative='blue'),)
    """

    start: int
    end: int
    kind: str
    alternative: str


def _suspects(text: str, lookalikes: list[tuple[int, int, str]],
              splits: Sequence[tuple[int, int, str]] = ()) -> tuple[Suspect, ...]:
    found: list[Suspect] = [Suspect(a, b, "lookalike", alt) for a, b, alt in lookalikes]
    found += [Suspect(a, b, "split", alt) for a, b, alt in splits]
    if text.isascii() and text.isalnum():
        return tuple(found)
    ascii_text = text.isascii()
    patterns = ((_SPELT_ASCII if ascii_text else _SPELT, _spelt, "spelt"),
                (_GAPPED_ASCII if ascii_text else _GAPPED, _gapped, "spelt"),
                (_LEET_ASCII if ascii_text else _LEET_WORD, _leet, "leet"))
    for pattern, read, kind in patterns:
        for m in pattern.finditer(text):
            alternative = read(m)
            if alternative is None or alternative == m.group(0):
                continue
            found.append(Suspect(m.start(), m.end(), kind, alternative))
    found.sort(key=lambda s: (s.start, -s.end))
    kept: list[Suspect] = []
    for s in found:  # the first of overlapping spans
        if not kept or s.start >= kept[-1].end:
            kept.append(s)
    return tuple(kept)


# ------------------------------------------------------------------------ words still mixed once read
def mixed_after_reading(text: str) -> tuple[str, ...]:
    """The words of ``text`` (a caption as read) that mix letters of several scripts: a word a reader
    cannot read as one script. Latin beside Han, kana or Hangul ("T恤") is ordinary, and so are the unit
    letters μ and Ω ("μm", "kΩ"). Pure; ``()`` for ordinary captions."""
    if text.isascii():
        return ()
    by_script: dict[str, set[str]] = {}
    for c in set(text):
        s = script_of(c) if c.isalpha() and c not in _UNIT_LETTERS else None
        if s is not None and s not in _SIDE_BY_SIDE:
            by_script.setdefault(s, set()).add(c)
    if len(by_script) < 2:
        return ()
    main = max(by_script, key=lambda s: len(by_script[s]))
    others = re.compile("[" + "".join(re.escape(c) for s, cs in by_script.items() if s != main for c in cs) + "]")
    out = []
    for m in _WORD.finditer(text):
        word = m.group(0)
        if others.search(word) and len(_letter_scripts("".join(c for c in word if c not in _UNIT_LETTERS))) > 1:
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
        suspects: spans of ``text`` a reader may take for another word, each with that word
            (:class:`Suspect`); :attr:`decoded` has them replaced.

    Examples:
        >>> from capreward.caption_reading import read_caption
        >>> r = read_caption("a red\\u200b ball, Ti\\u1ebfng Vi\\u1ec7t")   # a zero-width space
        >>> r.text, r.changed
        ('a red ball, Tiếng Việt', True)
        >>> read_caption("a r e d ball").decoded
        'a red ball'
    """

    text: str
    given: str
    changes: tuple[str, ...] = ()
    mixed_script: tuple[str, ...] = ()
    unreadable_mixed: tuple[str, ...] = ()
    suspects: tuple[Suspect, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the text read differs from the text given."""
        return self.text != self.given

    @property
    def decoded(self) -> str:
        """:attr:`text` with every suspect span replaced by what it may stand for ("r e d" by "red",
        "b1ue" by "blue", "bl ue" read from "bl\u200bue" by "blue"); :attr:`text` itself when there is
        none."""
        return self.decode()

    def decode(self, kinds: tuple[str, ...] | None = None) -> str:
        """:attr:`text` with the suspect spans of the given kinds replaced (None: every kind).

        Args:
            kinds: the :attr:`Suspect.kind` values to replace.

        Returns:
            the text; :attr:`text` itself when no suspect is of those kinds.
        """
        chosen = [s for s in self.suspects if kinds is None or s.kind in kinds]
        if not chosen:
            return self.text
        pieces, at = [], 0
        for s in chosen:
            pieces += [self.text[at:s.start], s.alternative]
            at = s.end
        pieces.append(self.text[at:])
        return "".join(pieces)

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
    return _read(text)


def _read(text: str) -> Reading:
    given = text
    if text.isascii() and text.isprintable():
        return Reading(text, given, suspects=_suspects(text, []))
    changes: list[str] = []
    text = well_formed(text).replace(_SPLIT, "\ufffd")
    nfkc = unicodedata.normalize("NFKC", text)
    if nfkc != unicodedata.normalize("NFC", text):
        changes.append("compatibility forms (NFKC)")
    text = nfkc
    seen: list[str] = []
    spaced: list[str] = []
    text = _read_invisible(text, seen, spaced)
    if seen:
        changes.append(f"invisible characters removed ({_codes(''.join(seen))})")
    if spaced:
        changes.append(f"invisible separators between letters read as spaces ({_codes(''.join(spaced))})")
    marks = _read_marks(text)
    if marks != text:
        changes.append("combining overlays and mark stacks removed")
        text = marks
    mixed: list[str] = []
    lookalikes: list[tuple[int, int, str]] = []
    letters = _read_letters(text, mixed, lookalikes)
    if letters != text:
        changes.append("look-alike letters read as the letters of the word's script")
        text = letters
    splits = []
    if spaced:
        splits = [(m.start(), m.start() + 1, "") for m in re.finditer(_SPLIT, text)]
        text = text.replace(_SPLIT, " ")
    if text != given and not changes:  # only NFC composition or a surrogate
        changes.append("normalised (NFC)")
    return Reading(text, given, tuple(changes), tuple(dict.fromkeys(mixed)), mixed_after_reading(text),
                   _suspects(text, lookalikes, splits))


def as_read(text: str) -> str:
    """The text of :func:`read_caption` (``text`` itself when it is not a str)."""
    return read_caption(text).text if isinstance(text, str) else text


#: What a guard that counts words decodes: spelt letters, leet and look-alike words, so that "red r e d
#: r3d" repeats "red"; an invisible separator stays the space it was read as ("red\u2060red" is two
#: words, as a text encoder's tokenizer reads it).
WORD_COUNT_KINDS = ("spelt", "leet", "lookalike")


def as_decoded(text: str) -> str:
    """The text of :func:`read_caption` with its spelt, leet and look-alike suspects decoded
    (:data:`WORD_COUNT_KINDS`; ``text`` itself when it is not a str): what a guard that counts words
    reads."""
    return read_caption(text).decode(WORD_COUNT_KINDS) if isinstance(text, str) else text


#: Documented in the API reference (docs/api/caption_reading.md); the helpers above are internal.
__all__ = ["Reading", "Suspect", "read_caption"]
