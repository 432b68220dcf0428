"""Splitting a caption into atomic claims, with the span of each claim in the caption.

:func:`split_claims` is the default, rule-based splitter of the claim reward: deterministic, no model.
It cuts the caption (as a person reads it, :func:`~capreward.caption_reading.read_caption`) into
sentences, in every script: after a sentence terminal (Unicode Sentence_Terminal: ``.``, ``!``, ``?``,
``。``, ``।``, ``॥``, ``؟``, ``።`` ...) or a semicolon (``;``, ``؛``), and at line breaks; an ASCII terminal
ends a sentence before a space or the end (so "3.5 kg" and "U.S" stay whole), any terminal before a
character that is not an ASCII letter or digit ("背景是红色的。背景是蓝色的。" is two sentences). Then each
English sentence into clauses at commas and at the coordinating conjunctions ``and``, ``but``, ``while``,
``whereas``, ``as well as`` when what follows reads as a new clause (it starts with a determiner, a
pronoun or "there"): "a red car and a blue bus" gives two claims, "black and white stripes" one. It is
a cheap stand-in for the LLM decomposition of DCScore / FaithScore (their "primitive information
units" / "atomic facts" are written by GPT-4); a judge-based splitter is :class:`JudgeSplitter`
(:mod:`capreward.scorers.claims`).

Claims are deduplicated on their words (:func:`claim_key`: Unicode words, lower-cased; each character
of a script written without spaces, such as Han, kana or Thai, a word of its own; case, spacing and
punctuation folded): a caption that repeats one true claim ten times states one claim.
:class:`Claim` keeps the span ``[start, end)`` of the claim in the caption *as given* when the reading
left the caption unchanged, and in the read caption otherwise (``Claim.read`` says which).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from collections.abc import Sequence

import regex

from ..caption_reading import read_caption

#: Where a sentence ends: a terminal (Unicode Sentence_Terminal, or a semicolon) before a space or the
#: end; a terminal before a character that is not an ASCII letter or digit; a line break.
_SENTENCE_END = regex.compile(
    r"(?<=[\p{Sentence_Terminal};\u061b])(?:\s+|$)"
    r"|(?<=[\p{Sentence_Terminal};\u061b])(?=[^\sA-Za-z0-9\p{Sentence_Terminal};\u061b\p{Pe}\p{Pf}\"'])"
    r"|\n+"
)
#: Clause boundaries inside a sentence: a comma, or a conjunction.
_CLAUSE = re.compile(r",\s*(?:and\s+|but\s+)?|\s+(?:and|but|while|whereas|as well as)\s+", re.IGNORECASE)
#: Words that open a new clause (so "black and white stripes" stays one claim).
_OPENERS = frozenset(
    "a an the this that these those there it its he she they his her their some several many two three four five "
    "one another each every all most few other its its".split()
)
#: A word: each character of a script written without spaces alone, else a run of letters, marks,
#: digits and apostrophes.
_UNSPACED = r"\p{sc=Han}\p{sc=Hiragana}\p{sc=Katakana}\p{sc=Thai}\p{sc=Lao}\p{sc=Khmer}\p{sc=Myanmar}\p{sc=Tibetan}"
_WORD = regex.compile(rf"[{_UNSPACED}]|(?:(?![{_UNSPACED}])[\p{{L}}\p{{M}}\p{{N}}'])+")


@dataclass(frozen=True)
class Claim:
    """One atomic claim: ``text`` (stripped of outer punctuation), ``start``/``end`` its character span in
    the caption (as given, or as read when ``read`` is True)."""

    text: str
    start: int
    end: int
    read: bool = False


def claim_key(text: str) -> str:
    """The text a claim is compared and cached by: its words (any script; a Han, kana or Thai character
    is a word) lower-cased, joined by single spaces."""
    return " ".join(w.lower() for w in _WORD.findall(text))


#: Words that carry no content for lexical coverage.
STOP_WORDS = frozenset(
    "a an the is are was were be been being there here it its this that these those of in on at to by for with "
    "and or but as from into onto over under near has have had do does some any".split()
)


def content_words(text: str) -> frozenset[str]:
    """The lower-cased words of ``text`` that are not :data:`STOP_WORDS`."""
    return frozenset(w for w in claim_key(text).split() if w not in STOP_WORDS)


def lexical_coverage(reference_claim: str, claims: Sequence[str]) -> float:
    """How much of ``reference_claim`` the best of ``claims`` states: the share of its content words found
    in that claim (CAPTURE's exact-match stage, per claim; 0 when it has no content word)."""
    wanted = content_words(reference_claim)
    if not wanted:
        return 0.0
    return max((len(wanted & content_words(c)) / len(wanted) for c in claims), default=0.0)


def _word_char(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"  # a vowel sign ends a Hindi word


def _trim(caption: str, start: int, end: int) -> tuple[int, int]:
    while start < end and not _word_char(caption[start]):
        start += 1
    while end > start and not _word_char(caption[end - 1]):
        end -= 1
    return start, end


def _clauses(caption: str, start: int, end: int) -> list[tuple[int, int]]:
    """Clause spans of the sentence ``caption[start:end]``."""
    text = caption[start:end]
    cuts = [0]
    for m in _CLAUSE.finditer(text):
        following = _WORD.match(text, m.end())
        if following is None or following.group(0).lower() not in _OPENERS:
            continue
        cuts.extend([m.start(), m.end()])
    cuts.append(len(text))
    return [(start + cuts[i], start + cuts[i + 1]) for i in range(0, len(cuts), 2)]


def split_claims(caption: str, max_claims: int | None = None) -> tuple[list[Claim], int]:
    """The atomic claims of ``caption`` in order, deduplicated, and how many distinct claims it has.

    Args:
        caption: the caption (read as a person reads it first).
        max_claims: keep at most this many claims (None: all); the count returned is the total, so a
            caller can treat the claims past the bound as unverified.

    Returns:
        ``(claims, total)``: the first ``max_claims`` claims and the number of distinct claims.

    Raises:
        TypeError: ``caption`` is not a str.
        ValueError: ``max_claims`` is below 1.
    """
    if max_claims is not None and max_claims < 1:
        raise ValueError(f"max_claims must be at least 1, got {max_claims}")
    reading = read_caption(caption)
    text = reading.text
    claims: list[Claim] = []
    seen: set[str] = set()
    at = 0
    bounds = [m for m in _SENTENCE_END.finditer(text)]
    sentences = []
    for m in bounds:
        sentences.append((at, m.start()))
        at = m.end()
    if at < len(text):
        sentences.append((at, len(text)))
    for s_start, s_end in sentences:
        for c_start, c_end in _clauses(text, s_start, s_end):
            c_start, c_end = _trim(text, c_start, c_end)
            if c_end <= c_start:
                continue
            key = claim_key(text[c_start:c_end])
            if not key or key in seen:
                continue
            seen.add(key)
            claims.append(Claim(text[c_start:c_end], c_start, c_end, read=reading.changed))
    total = len(claims)
    return (claims if max_claims is None else claims[:max_claims]), total


def claims_of_references(references: Sequence[str], max_claims: int | None = None) -> list[str]:
    """The distinct claims of several references (each split by :func:`split_claims`), in order, at most
    ``max_claims`` of them."""
    out: list[str] = []
    seen: set[str] = set()
    for ref in references:
        for claim in split_claims(ref)[0]:
            key = claim_key(claim.text)
            if key not in seen:
                seen.add(key)
                out.append(claim.text)
    return out if max_claims is None else out[:max_claims]
