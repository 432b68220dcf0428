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
from typing import Any, cast
from collections.abc import Mapping

from ..caption_reading import as_decoded, as_read, is_invisible
from ..judges.injection import injection_reason
from ..metrics.token_support import GENERIC_WORDS, STOP_WORDS

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
#: Words a finished English caption never ends with (articles, conjunctions, possessive determiners,
#: "of"): a caption ending with one is cut off, full stop or not.
DANGLING_WORDS = frozenset(
    """a an the and or but nor of than because if his their its my your our""".split()
)
#: Prepositions and determiners a caption cut off mid-phrase ends with ("a man sitting on a sofa with",
#: "a dog jumps into") that a finished sentence ends with only before its full stop ("a baby is being
#: played with."): they mark a cut when no terminal punctuation follows. Particles, object pronouns and
#: verbs that end finished captions without a full stop ("a train passing by", "gets in", "next to her",
#: "what the thing is") are in neither list.
OPEN_WORDS = frozenset("""to with from for into onto at as this these those some""".split())


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


#: The longest phrase (in content words) whose immediate restatement the repetition guard looks for.
MAX_PHRASE = 16
#: A restated phrase wholly in a script written without spaces must be this many characters long:
#: reduplication ("看看", "研究研究") is ordinary there.
MIN_UNSPACED_PHRASE = 3


def _content_word(word: str) -> bool:
    """A word that says something: it has a letter and is neither a function word
    (:data:`~capreward.metrics.token_support.STOP_WORDS`) nor a generic one ("image", "picture":
    :data:`~capreward.metrics.token_support.GENERIC_WORDS`)."""
    return any(ch.isalpha() for ch in word) and word not in STOP_WORDS and word not in GENERIC_WORDS


def _split_at_joins(text: str) -> str:
    """``text`` with every invisible character that joins two word characters made a space: "red⁠red"
    (a word joiner between) is read "redred", one unknown word, but a text encoder's sub-words still see
    "red" twice; for counting repeats it is two words."""
    out = []
    for j, ch in enumerate(text):
        if is_invisible(ch) and 0 < j < len(text) - 1 and text[j - 1].isalnum():
            k = j + 1
            while k < len(text) and is_invisible(text[k]):
                k += 1
            if k < len(text) and text[k].isalnum():
                out.append(" ")
                continue
        out.append(ch)
    return "".join(out)


_SENTENCE_END = re.compile(r"[.!?;\n。！？；।॥؟]+")
#: Prepositions of place, direction and time: they say something new about what they link ("the bicycle
#: is near the road" after "one bicycle and one road"), so a phrase restated with one of them is not
#: a restatement.
RELATION_WORDS = frozenset("""in on at to from by with without into onto upon over under above below between among
    through during before after about against along around across behind beside near off out up down toward
    towards within inside outside beneath underneath beyond past next""".split())
#: Function words that link a word to itself in ordinary idioms ("side by side", "face to face", "hand in
#: hand", "one after one"): a word said on both sides of one of them is not a restatement.
IDIOM_LINKS = frozenset({"by", "to", "in", "after", "upon", "for", "and", "on"})


def _runs(seq: list[str], max_block: int, min_unspaced: int) -> list[tuple[int, int, int]]:
    """Every maximal run of a block repeated back to back in ``seq``: ``(start, block length, copies)``
    with copies >= 2, blocks of 1 to ``max_block`` items (a block of single unspaced-script characters
    shorter than ``min_unspaced`` is not looked for: reduplication is ordinary there)."""
    out = []
    for length in range(1, min(max_block, len(seq) // 2) + 1):
        i = 0
        while i + 2 * length <= len(seq):
            block = seq[i:i + length]
            if block != seq[i + length:i + 2 * length] or (
                    length < min_unspaced and all(len(x) == 1 and _unspaced(x) for x in block)):
                i += 1
                continue
            k = 2
            while seq[i + k * length:i + (k + 1) * length] == block:
                k += 1
            out.append((i, length, k))
            i += (k - 1) * length + 1
    return out


def repeated_words(w: list[str], max_phrase: int = MAX_PHRASE, sentence: list[int] | None = None) -> list[bool]:
    """For each word of ``w`` (:func:`words`), whether it restates what the caption has just said. Two
    sequences are read: the words that are not function words (:data:`~capreward.metrics.token_support.
    STOP_WORDS`), where a word doubled is a restatement ("image image", "a blue blue"), and the content
    words with the relation words (:data:`RELATION_WORDS`: "near", "on") but no generic word ("image",
    "picture"), where a phrase of 1 to ``max_phrase`` words
    followed by itself is one ("a red image red": red | red; "a dog and a dog and a dog": dog | dog | dog;
    "a red car, a red car": red car | red car). A restatement said three times or more always counts; said
    twice, it counts when nothing new is said after it (a second copy followed by a new content word names
    something new: "a hummingbird at a hummingbird feeder", "all black and a black hat") and the two copies
    are not one word around a linking function word ("side by side", "hand in hand"), and (with
    ``sentence``) within one sentence: a new sentence may restate what the last one said about something
    ("The bicycle is by the person, and by the plant. The person is by the plant."), three times is a loop.

    A word said again about something new is never a repeat: "a red square and a red circle", "a man in
    a red shirt holds a red cup next to a red car".

    Args:
        w: the caption's words.
        max_phrase: the longest restated phrase looked for (content words).
        sentence: per word, the index of its sentence (None: one sentence).

    Returns:
        One flag per word.
    """
    sentence = sentence if sentence is not None else [0] * len(w)
    marks = [False] * len(w)
    content_after = [False] * (len(w) + 1)  # whether a content word occurs at or after position j
    for j in range(len(w) - 1, -1, -1):
        content_after[j] = content_after[j + 1] or _content_word(w[j])
    for positions, max_block in (
        ([j for j, x in enumerate(w) if x not in STOP_WORDS and any(ch.isalpha() for ch in x)], 1),
        ([j for j, x in enumerate(w) if _content_word(x) or x in RELATION_WORDS], max_phrase),
    ):
        seq = [w[j] for j in positions]
        for start, length, copies in _runs(seq, max_block, MIN_UNSPACED_PHRASE):
            if max_block == 1 and any(positions[start + k + 1] != positions[start + k] + 1 for k in range(copies - 1)):
                continue  # the doubled-word sequence counts only adjacent words
            if copies == 2:
                last = positions[start + 2 * length - 1]
                if sentence[positions[start]] != sentence[last]:
                    continue
                between = w[positions[start + length - 1] + 1:positions[start + length]]
                if content_after[last + 1] or (length == 1 and len(between) == 1 and between[0] in IDIOM_LINKS):
                    continue
            for k in range(start + length, start + copies * length):
                marks[positions[k]] = True
    return marks


def word_repetition_penalty(text: str, max_phrase: int = MAX_PHRASE) -> float:
    """Minus the fraction of the caption's words that repeat what it has just said
    (:func:`repeated_words`), on the caption as read and on the caption with its invisible joins read
    as spaces ("red⁠red"), whichever finds more. In [-1, 0]; 0 for an empty caption.

    Args:
        text: the caption.
        max_phrase: the longest restated block looked for (content words).

    Returns:
        The penalty, in [-1, 0].

    Examples:
        >>> word_repetition_penalty("a red image red.")        # red | red, "image" says nothing new
        -0.25
        >>> word_repetition_penalty("a red square and a red circle.")
        0.0
    """
    worst = 0.0
    for version in {text, _split_at_joins(text)}:
        parts = [words(part) for part in _SENTENCE_END.split(as_read(version))]
        w = [x for part in parts for x in part]
        if w:
            sentence = [k for k, part in enumerate(parts) for _ in part]
            worst = min(worst, -sum(repeated_words(w, max_phrase, sentence)) / len(w))
    return worst


def repetition_penalty(text: str, n: int = MAX_PHRASE) -> float:
    """The repetition guard, in [-1, 0]: minus the fraction of the caption's words that repeat what it has
    just said (:func:`word_repetition_penalty`): a word doubled ("image image"), or a content word or
    phrase restated with nothing new said in between ("a red image red", "a dog and a dog and a dog",
    "a red car, a red car"), also when an invisible join hides the second copy ("red⁠red").

    A word or phrase said again about something new is not a repeat ("a red square and a red circle",
    "a girl with a bucket of water is chased by a boy with a bucket of water"): 0 of the scenes world's
    true captions and 0 of the human-judgment corpora's captions are fined (docs/design/reward-contract.md).

    Args:
        text: the caption.
        n: the longest restated phrase looked for, in content words (>= 1).

    Returns:
        The penalty, in [-1, 0].

    Raises:
        ValueError: ``n`` is below 1.

    Examples:
        >>> repetition_penalty("a dog and a dog and a dog")   # dog | dog | dog: 2 of 8 words
        -0.25
        >>> repetition_penalty("a dog runs on the grass.")
        0.0
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return word_repetition_penalty(text, n)


def truncation_penalty(text: str, require_punctuation: bool = False) -> float:
    """-1 if the caption looks cut off, else 0: its last word is one of :data:`DANGLING_WORDS` ("a man
    and the", with or without a period), or one of :data:`OPEN_WORDS` with no terminal punctuation after
    it ("a man sitting on a sofa with"; "a baby is being played with." is finished), or (with
    ``require_punctuation``) it does not end with terminal punctuation (any script's: ".", "。", "।",
    "؟", ...). Empty text is -1.

    A finished caption without a full stop is not cut off (10 % of Flickr8k-Expert's and 21 % of
    Pascal-50S's human captions have none), so ``require_punctuation`` is off by default.

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
    if w[-1] in DANGLING_WORDS or (w[-1] in OPEN_WORDS and not ends_with_terminal):
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

    ``ngram``: the longest restated phrase the repetition guard (`repetition_penalty()`) looks for, in
    content words (default 16). ``require_punctuation``: the truncation guard also fires on captions without terminal
    punctuation (off by default: many finished captions have no final period; turn on for captioners
    trained to write one).
    ``max_words``/``length_scale``: the over-length guard's limit and ramp (see `length_penalty()`).
    ``length_target``/``length_ratio``: a length guard conditioned on a target, for dense captioning:
    None (default) uses the fixed ``max_words``; ``"references"`` allows ``ceil(length_ratio * L)`` words
    with L the median word count of the sample's references (the composite's ``references`` column; the
    median, so one long reference does not raise the allowance); any other string names a dataset column
    holding each sample's target length in words (allowed: ``ceil(length_ratio * target)``). A sample
    without a target (no references, None in the column) is an error for that sample (the composite
    gives it None with the reason) unless ``length_fallback`` names the words it is then allowed; the
    ramp is ``length_scale`` or the allowed length.
    ``injection``: the injection guard: a caption the detector flags (`injection_penalty()`) is paid no
    more than without its suspect segments (:mod:`capreward.rewards.suspects`): a `CompositeReward`
    scores it both ways through every component and keeps the lower total; the guards alone
    (`terms()`) take off what the other terms lose on the stripped caption; with nothing left, ``-injection``
    (any weight > 0 turns the principle on; the weight is the term when nothing is left).

    Args:
        repetition: weight of the repetition guard.
        ngram: the longest restated phrase the repetition guard looks for (content words).
        truncation: weight of the truncation guard.
        require_punctuation: the truncation guard also fires without terminal punctuation.
        length: weight of the over-length guard.
        max_words: the over-length guard's fixed limit.
        length_scale: the over-length guard's ramp (None: the allowed length).
        injection: weight of the injection guard (> 0: on; the term of a caption with nothing left once its
            suspect segments are removed).
        length_target: None, ``"references"`` or a column of target lengths (see above).
        length_ratio: the allowed multiple of a target length.
        length_fallback: the words allowed to a sample without a target (None: such a sample is an error).

    Raises:
        ValueError: a weight or ``length_ratio`` that is not a finite number >= 0 (``length_ratio`` > 0),
            or an empty ``length_target``.

    Examples:
        >>> g = Guards(length_target="references")
        >>> g.max_words_for({"references": [["a dog runs on the grass"]]}, 0)  # 6 words x 1.5
        9
        >>> g.max_words_for({"references": [["a dog runs", "a dog runs on grass", " ".join(["word"] * 90)]]}, 0)
        8
        >>> g.terms(" ".join(["dog"] * 12) + ".", max_words=9)["length"]
        -0.3333333333333333
    """

    repetition: float = 1.0
    ngram: int = MAX_PHRASE
    truncation: float = 1.0
    require_punctuation: bool = False
    length: float = 1.0
    max_words: int = 40
    length_scale: int | None = None
    injection: float = 1.0
    length_target: str | None = None
    length_ratio: float = LENGTH_RATIO
    length_fallback: int | None = None

    def __post_init__(self) -> None:
        for name in ("repetition", "truncation", "length", "injection", "length_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Guards.{name} must be a finite number >= 0, got {value!r}")
        if self.length_ratio <= 0:
            raise ValueError(f"Guards.length_ratio must be > 0, got {self.length_ratio!r}")
        if self.length_target is not None and (not isinstance(self.length_target, str) or not self.length_target):
            raise ValueError(f"Guards.length_target must be None, 'references' or a column name, got {self.length_target!r}")
        if self.length_fallback is not None and (isinstance(self.length_fallback, bool) or not isinstance(self.length_fallback, int)
                                                 or self.length_fallback < 1):
            raise ValueError(f"Guards.length_fallback must be None or a positive number of words, got {self.length_fallback!r}")

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
            ValueError: the target column is absent, a sample has no target (without ``length_fallback``),
                or a sample's target is not a positive number (naming the column and sample).
        """
        if self.length_target is None:
            return self.max_words
        column = references_column if self.length_target == "references" else self.length_target
        if column not in columns or columns[column] is None:
            if self.length_fallback is not None:
                return self.length_fallback
            raise ValueError(f"Guards(length_target={self.length_target!r}): no column {column!r} in the batch "
                             "(pass length_fallback=<words> to allow a fixed length without a target)")
        value = list(columns[column])[index]
        lengths = []
        if value is not None and self.length_target == "references":
            refs = [value] if isinstance(value, str) else list(value)
            lengths = sorted(n for n in (len(words(r)) for r in refs if isinstance(r, str)) if n > 0)
        if value is None or (self.length_target == "references" and not lengths):
            if self.length_fallback is not None:
                return self.length_fallback
            raise ValueError(f"{column}[{index}] gives no target length (pass length_fallback=<words> to allow a fixed "
                             "length without one)")
        if self.length_target == "references":
            mid = len(lengths) // 2
            target = lengths[mid] if len(lengths) % 2 else (lengths[mid - 1] + lengths[mid]) / 2
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{column}[{index}] must be a positive number of words, got {value!r}")
            target = cast(float, value)  # a finite positive Real, checked
        return max(1, math.ceil(self.length_ratio * target))

    def terms(self, text: str, max_words: int | None = None, injection: bool = True) -> dict[str, float]:
        """The enabled weighted guard terms of one caption, e.g. ``{"repetition": -0.25, ...}``;
        ``max_words`` overrides the length limit (a sample's `max_words_for()`).

        Args:
            text: the caption.
            max_words: the length limit (None: :attr:`max_words`).
            injection: also the injection term (a composite computes it itself, through its components).

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
        if self.injection and injection:
            out["injection"] = self._injection_term(text, sum(out.values()), max_words)
        return out

    def _injection_term(self, text: str, total: float, max_words: int | None) -> float:
        """The injection term of a caption whose other terms sum to ``total``: what scoring it without its
        suspect segments (:func:`~capreward.rewards.suspects.without_suspects`) takes off (``-injection``
        when nothing is left), so the guards pay a flagged caption no more than without them."""
        from .suspects import without_suspects

        left = without_suspects(text)
        if left is None:
            return 0.0
        if not left.strip():
            return -float(self.injection)
        return min(0.0, sum(self.terms(left, max_words, injection=False).values()) - total)
