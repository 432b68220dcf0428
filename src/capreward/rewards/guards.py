"""Text-only penalties against the known reward-hacking modes of caption rewards.

Optimising CLIP-S/EMScore alone drives captioners towards (Cho et al. 2022 and others) repeating
high-scoring words and phrases, stopping mid-sentence, and ever longer lists of objects; optimising an
LLM judge drives them towards captions that forge the judge's prompt (a new turn, a score, a master
key; :mod:`capreward.judges.injection`). Each guard below is a pure function of the caption text
returning a penalty in [-1, 0]; words are whitespace/punctuation-split lower-case tokens (not model
tokens), so the guards do not depend on any tokenizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..judges.injection import injection_reason

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
TERMINAL_PUNCTUATION = (".", "!", "?", '."', ".'", '!"', '?"', ".)")
#: Words a finished English caption does not end with (articles, conjunctions, most prepositions,
#: possessives, auxiliaries); "sitting down" or "looking up" end fine, so particles are not listed.
DANGLING_WORDS = frozenset(
    """a an the and or but nor of to with from by for into onto at in as than while because if
    his her their its my your our this these those is are was were has have some""".split()
)


def words(text: str) -> list[str]:
    """Lower-case word tokens of ``text`` (letters/digits, with an optional apostrophe suffix)."""
    return _WORD.findall(text.lower())


def repetition_penalty(text: str, n: int = 2) -> float:
    """Minus the fraction of the caption's word n-grams that repeat an earlier n-gram, in [-1, 0).

    "a dog and a dog and a dog" (n=2): 7 bigrams, 3 distinct, so 4 repeats -> -4/7. Captions shorter
    than n words get 0.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    w = words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    if not grams:
        return 0.0
    return -(len(grams) - len(set(grams))) / len(grams)


def truncation_penalty(text: str, require_punctuation: bool = True) -> float:
    """-1 if the caption looks cut off, else 0: its last word is one of :data:`DANGLING_WORDS` ("a man
    and the", with or without a period), or (with ``require_punctuation``) it does not end with
    terminal punctuation. Empty text is -1."""
    stripped = text.strip()
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
    names a pattern), else 0."""
    return -1.0 if injection_reason(text) is not None else 0.0


def length_penalty(text: str, max_words: int, scale: int | None = None) -> float:
    """Minus the number of words beyond ``max_words`` divided by ``scale`` (default ``max_words``),
    clipped to [-1, 0]: 0 up to max_words, -1 at max_words + scale words and beyond."""
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    scale = max_words if scale is None else scale
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    excess = len(words(text)) - max_words
    return -min(1.0, max(0, excess) / scale)


@dataclass(frozen=True)
class Guards:
    """Which guard terms a :class:`~capreward.rewards.CompositeReward` adds, and their weights
    (each term is ``weight * penalty`` with the penalty in [-1, 0]; weight 0 disables a term).

    ``ngram``: n of the repetition guard. ``require_punctuation``: the truncation guard also fires on
    captions without terminal punctuation (turn off for captioners trained to omit the final period).
    ``max_words``/``length_scale``: the over-length guard's limit and ramp (see :func:`length_penalty`).
    ``injection``: the injection guard (:func:`injection_penalty`): a caption that forges judge-prompt
    structure gets ``-injection``.
    """

    repetition: float = 1.0
    ngram: int = 2
    truncation: float = 1.0
    require_punctuation: bool = True
    length: float = 1.0
    max_words: int = 40
    length_scale: int | None = None
    injection: float = 1.0

    def weights(self) -> dict[str, float]:
        """The weight of each enabled guard term (each term lies in [-weight, 0] for weight >= 0)."""
        pairs = (
            ("repetition", self.repetition), ("truncation", self.truncation), ("length", self.length), ("injection", self.injection)
        )
        return {k: float(w) for k, w in pairs if w}

    def terms(self, text: str) -> dict[str, float]:
        """The enabled weighted guard terms of one caption, e.g. ``{"repetition": -0.25, ...}``."""
        out = {}
        if self.repetition:
            out["repetition"] = self.repetition * repetition_penalty(text, self.ngram)
        if self.truncation:
            out["truncation"] = self.truncation * truncation_penalty(text, self.require_punctuation)
        if self.length:
            out["length"] = self.length * length_penalty(text, self.max_words, self.length_scale)
        if self.injection:
            out["injection"] = self.injection * injection_penalty(text)
        return out
