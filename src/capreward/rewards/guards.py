"""Text-only penalties against the known reward-hacking modes of caption rewards.

Optimising CLIP-S/EMScore alone drives captioners towards (Cho et al. 2022 and others) repeating
high-scoring words and phrases, stopping mid-sentence, and ever longer lists of objects; optimising an
LLM judge drives them towards captions that forge the judge's prompt (a new turn, a score, a master
key; :mod:`capreward.judges.injection`). Each guard below is a pure function of the caption text
returning a penalty in [-1, 0]; words are whitespace/punctuation-split lower-case tokens (not model
tokens), so the guards do not depend on any tokenizer.

Every guard reads the caption as a person does first (:func:`~capreward.caption_reading.read_caption`:
invisible characters, look-alike letters, "r e d" and "b1ue" change nothing), and counts words in any
script: a word is a run of letters, digits and combining marks (Latin, Cyrillic, Greek, Devanagari,
Arabic, Hangul, ...), and in the scripts written without spaces (Han, Hiragana, Katakana, Thai, Lao,
Khmer, Myanmar, Tibetan) every character is a word, so 2,000 CJK characters are 2,000 words to the
length guard. The guards read the whole caption, however long (no model context applies to them).
"""

from __future__ import annotations

import math
import numbers
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping

from ..caption_reading import as_decoded, as_read
from ..judges.injection import injection_reason
from ..metrics.token_support import STOP_WORDS

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
TERMINAL_PUNCTUATION = (
    ".", "!", "?", '."', ".'", '!"', '?"', ".)",
    "。", "。」", "。』", "。”", ".”", "!”", "?”", ".’", "…", "।", "॥", "؟", "۔", "։", "።", "။", "།",
)
#: Scripts written without spaces between words: each of their characters counts as a word.
_UNSPACED = (
    (0x0E00, 0x0EFF), (0x0F00, 0x0FFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3040, 0x30FF), (0x31F0, 0x31FF),
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3FFFF),
)


def _unspaced(ch: str) -> bool:
    o = ord(ch)
    return o >= 0x0E00 and any(a <= o <= b for a, b in _UNSPACED)
#: Words a finished English caption does not end with (articles, conjunctions, most prepositions,
#: possessives, auxiliaries); "sitting down" or "looking up" end fine, so particles are not listed.
DANGLING_WORDS = frozenset(
    """a an the and or but nor of to with from by for into onto at in as than while because if
    his her their its my your our this these those is are was were has have some""".split()
)


def words(text: str) -> list[str]:
    """Lower-case word tokens of the caption as read, with spelt letters, leet and look-alike words
    decoded (:func:`~capreward.caption_reading.as_decoded`: "red r e d r3d" repeats "red"): runs of
    letters, digits and combining marks with an optional apostrophe suffix ("man's"); each character of
    a script written without spaces (Han, kana, Thai, ...) is a word of its own."""
    text = as_decoded(text).lower()
    if text.isascii():
        return _WORD.findall(text)
    out: list[str] = []
    cur: list[str] = []
    apostrophe = False
    for j, ch in enumerate(text):
        if _unspaced(ch) and ch.isalnum():
            if cur:
                out.append("".join(cur))
            cur, apostrophe = [], False
            out.append(ch)
        elif ch.isalnum() or (cur and unicodedata.category(ch)[0] == "M"):
            cur.append(ch)
        elif ch in "'’" and cur and not apostrophe and j + 1 < len(text) and text[j + 1].isalpha():
            cur.append("'")
            apostrophe = True
        else:
            if cur:
                out.append("".join(cur))
            cur, apostrophe = [], False
    if cur:
        out.append("".join(cur))
    return out


#: A word that occurs this many times or more repeats itself from its second occurrence on (content
#: words only; a word said twice, "a dog chases another dog", is free).
KEYWORD_REPEATS = 3


def word_repetition_penalty(text: str) -> float:
    """Minus the fraction of the caption's words that repeat a word: a word equal to the word just
    before it ("image image", "a blue blue"; not in the scripts written without spaces, where doubled
    characters are ordinary), and every occurrence after the first of a content word (not a
    :data:`~capreward.metrics.token_support.STOP_WORDS` function word) that occurs :data:`KEYWORD_REPEATS`
    times or more ("a red dog, red cat, red car, red sky, red sea, red hat.": 5 of 13 words). In
    [-1, 0]; 0 for an empty caption."""
    w = words(text)
    if not w:
        return 0.0
    counts: dict[str, int] = {}
    for word in w:
        counts[word] = counts.get(word, 0) + 1
    seen: set[str] = set()
    repeats = 0
    for j, word in enumerate(w):
        adjacent = j > 0 and w[j - 1] == word and not (len(word) == 1 and _unspaced(word))
        keyword = word in seen and counts[word] >= KEYWORD_REPEATS and word not in STOP_WORDS and not _unspaced(word[0])
        repeats += adjacent or keyword
        seen.add(word)
    return -repeats / len(w)


def repetition_penalty(text: str, n: int = 2) -> float:
    """The repetition guard, in [-1, 0]: the lower of minus the fraction of the caption's word n-grams
    that repeat an earlier n-gram and :func:`word_repetition_penalty` (single words repeated: adjacent
    duplicates, a keyword interleaved through the caption).

    "a dog and a dog and a dog" (n=2): 7 bigrams, 3 distinct, so 4 repeats -> -4/7; "image image": no
    bigram repeats, one word of two repeats the one before it -> -1/2. Captions shorter than n words
    have no n-gram.

    Args:
        text: the caption.
        n: the n-gram length (>= 1).

    Returns:
        The penalty, in [-1, 0].

    Raises:
        ValueError: ``n`` is below 1.

    Examples:
        >>> repetition_penalty("a dog and a dog and a dog")
        -0.5714285714285714
        >>> repetition_penalty("a dog runs on the grass.")
        0.0
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    w = words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    ngram = -(len(grams) - len(set(grams))) / len(grams) if grams else 0.0
    return min(ngram, word_repetition_penalty(text))


def truncation_penalty(text: str, require_punctuation: bool = True) -> float:
    """-1 if the caption looks cut off, else 0: its last word is one of :data:`DANGLING_WORDS` ("a man
    and the", with or without a period), or (with ``require_punctuation``) it does not end with
    terminal punctuation (any script's: ".", "。", "।", "؟", ...). Empty text is -1.

    Args:
        text: the caption.
        require_punctuation: also fire on a caption without terminal punctuation.

    Returns:
        -1.0 or 0.0.

    Examples:
        >>> truncation_penalty("a man and the"), truncation_penalty("a man walks a dog.")
        (-1.0, 0.0)
    """
    stripped = as_read(text).strip()
    w = words(stripped)
    if not w:
        return -1.0
    ends_with_terminal = stripped.endswith(TERMINAL_PUNCTUATION)
    if w[-1] in DANGLING_WORDS:
        return -1.0
    if require_punctuation and not ends_with_terminal:
        return -1.0
    return 0.0


def injection_penalty(text: str) -> float:
    """-1 if the caption forges judge-prompt structure (:func:`~capreward.judges.injection.injection_reason`
    names a pattern), else 0.

    Args:
        text: the caption.

    Returns:
        -1.0 or 0.0.

    Examples:
        >>> injection_penalty("a dog runs on the grass.")
        0.0
    """
    return -1.0 if injection_reason(text) is not None else 0.0


def length_penalty(text: str, max_words: int, scale: int | None = None) -> float:
    """Minus the number of words (:func:`words`, any script) beyond ``max_words`` divided by ``scale``
    (default ``max_words``), clipped to [-1, 0]: 0 up to max_words, -1 at max_words + scale words and
    beyond.

    Args:
        text: the caption.
        max_words: the number of words allowed (>= 1).
        scale: the number of words past ``max_words`` at which the penalty reaches -1 (>= 1; default
            ``max_words``).

    Returns:
        The penalty, in [-1, 0].

    Raises:
        ValueError: ``max_words`` or ``scale`` is below 1.

    Examples:
        >>> length_penalty("one two three four five six", max_words=4)
        -0.5
    """
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    scale = max_words if scale is None else scale
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    excess = len(words(text)) - max_words
    return -min(1.0, max(0, excess) / scale)


#: The default ratio of the target-conditioned length guard: up to 1.5 times the target length is free.
LENGTH_RATIO = 1.5


@dataclass(frozen=True)
class Guards:
    """Which guard terms a `CompositeReward` adds, and their weights
    (each term is ``weight * penalty`` with the penalty in [-1, 0]; weight 0 disables a term).

    ``ngram``: n of the repetition guard (`repetition_penalty()`, which also counts repeated single
    words). ``require_punctuation``: the truncation guard also fires on captions without terminal
    punctuation (turn off for captioners trained to omit the final period).
    ``max_words``/``length_scale``: the over-length guard's limit and ramp (see `length_penalty()`).
    ``length_target``/``length_ratio``: a length guard conditioned on a target, for dense captioning:
    None (default) uses the fixed ``max_words``; ``"references"`` allows ``ceil(length_ratio * L)`` words
    with L the word count of the sample's longest reference (the composite's ``references`` column);
    any other string names a dataset column holding each sample's target length in words (allowed:
    ``ceil(length_ratio * target)``). A sample without a target (no references, None in the column)
    falls back to ``max_words``; the ramp is ``length_scale`` or the allowed length.
    ``injection``: the injection guard (`injection_penalty()`): a caption that forges judge-prompt
    structure gets ``-injection``.

    Args:
        repetition: weight of the repetition guard.
        ngram: n of the repetition guard.
        truncation: weight of the truncation guard.
        require_punctuation: the truncation guard also fires without terminal punctuation.
        length: weight of the over-length guard.
        max_words: the over-length guard's fixed limit.
        length_scale: the over-length guard's ramp (None: the allowed length).
        injection: weight of the injection guard.
        length_target: None, ``"references"`` or a column of target lengths (see above).
        length_ratio: the allowed multiple of a target length.

    Raises:
        ValueError: a weight or ``length_ratio`` that is not a finite number >= 0 (``length_ratio`` > 0),
            or an empty ``length_target``.

    Examples:
        >>> g = Guards(length_target="references")
        >>> g.max_words_for({"references": [["a dog runs on the grass"]]}, 0)  # 6 words x 1.5
        9
        >>> g.terms(" ".join(["dog"] * 12) + ".", max_words=9)["length"]
        -0.3333333333333333
    """

    repetition: float = 1.0
    ngram: int = 2
    truncation: float = 1.0
    require_punctuation: bool = True
    length: float = 1.0
    max_words: int = 40
    length_scale: int | None = None
    injection: float = 1.0
    length_target: str | None = None
    length_ratio: float = LENGTH_RATIO

    def __post_init__(self) -> None:
        for name in ("repetition", "truncation", "length", "injection", "length_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Guards.{name} must be a finite number >= 0, got {value!r}")
        if self.length_ratio <= 0:
            raise ValueError(f"Guards.length_ratio must be > 0, got {self.length_ratio!r}")
        if self.length_target is not None and (not isinstance(self.length_target, str) or not self.length_target):
            raise ValueError(f"Guards.length_target must be None, 'references' or a column name, got {self.length_target!r}")

    def weights(self) -> dict[str, float]:
        """The weight of each enabled guard term (each term lies in [-weight, 0] for weight >= 0)."""
        pairs = (
            ("repetition", self.repetition), ("truncation", self.truncation), ("length", self.length), ("injection", self.injection)
        )
        return {k: float(w) for k, w in pairs if w}

    def max_words_for(self, columns: Mapping[str, Any], index: int, references_column: str = "references") -> int:
        """The length limit of sample ``index`` given the dataset ``columns`` (lists, one entry per
        sample, as TRL passes them): ``max_words`` without a `length_target`, else
        ``ceil(length_ratio * target)`` (see the class docstring).

        Raises:
            ValueError: the target column is absent, or a sample's target is not a positive number
                (naming the column and sample).
        """
        if self.length_target is None:
            return self.max_words
        column = references_column if self.length_target == "references" else self.length_target
        if column not in columns or columns[column] is None:
            if self.length_target == "references":
                return self.max_words
            raise ValueError(f"Guards(length_target={self.length_target!r}): no column {column!r} in the batch")
        value = list(columns[column])[index]
        if value is None:
            return self.max_words
        if self.length_target == "references":
            refs = [value] if isinstance(value, str) else list(value)
            lengths = [len(words(r)) for r in refs if isinstance(r, str)]
            if not lengths or max(lengths) == 0:
                return self.max_words
            target = max(lengths)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{column}[{index}] must be a positive number of words, got {value!r}")
            target = value
        return max(1, math.ceil(self.length_ratio * target))

    def terms(self, text: str, max_words: int | None = None) -> dict[str, float]:
        """The enabled weighted guard terms of one caption, e.g. ``{"repetition": -0.25, ...}``;
        ``max_words`` overrides the length limit (a sample's `max_words_for()`).

        Args:
            text: the caption.
            max_words: the length limit (None: :attr:`max_words`).

        Returns:
            Term name -> weighted penalty, for each enabled term.
        """
        out = {}
        if self.repetition:
            out["repetition"] = self.repetition * repetition_penalty(text, self.ngram)
        if self.truncation:
            out["truncation"] = self.truncation * truncation_penalty(text, self.require_punctuation)
        if self.length:
            out["length"] = self.length * length_penalty(text, max_words or self.max_words, self.length_scale)
        if self.injection:
            out["injection"] = self.injection * injection_penalty(text)
        return out
