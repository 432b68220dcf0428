"""The shapes human judgments take once read, whatever the benchmark's file format.

Two kinds: *rated* benchmarks give each (visual, caption) one or more numeric human scores
(:class:`RatedItem`); *pairwise* benchmarks say which of two captions of a visual people prefer
(:class:`PairItem`). Visuals are named by a canonical id plus aliases (file path, file name, stem)
so a scores file can refer to them by any of these.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import CaprewardError


class JudgmentError(CaprewardError, ValueError):
    """A judgments or scores file that cannot be used; the message names the file and item.

    Examples:
        >>> from capreward.metaeval import JudgmentError, read_judgments
        >>> try:
        ...     read_judgments("flickr8k-expert", "no-such-file.json")
        ... except JudgmentError as exc:
        ...     print(isinstance(exc, ValueError))
        True
    """


def normalize_caption(caption: str) -> str:
    """The caption with runs of whitespace collapsed to one space and the ends stripped (the key
    captions are matched on, as the benchmarks' reference scripts do with ``' '.join(c.split())``)."""
    return " ".join(caption.split())


def visual_aliases(*names: object) -> tuple[str, ...]:
    """Every name a visual may be referred to by: each given name as a string, its file name and its
    file name without extension (``a/b/123_x.jpg`` -> ``a/b/123_x.jpg``, ``123_x.jpg``, ``123_x``).
    The first name is the canonical id. ``None`` entries are skipped; order is kept, duplicates dropped."""
    out: list[str] = []
    for name in names:
        if name is None:
            continue
        text = str(name).replace("\\", "/")
        base = posixpath.basename(text)
        stem = base.rsplit(".", 1)[0] if "." in base else base
        for alias in (text, base, stem):
            if alias and alias not in out:
                out.append(alias)
    if not out:
        raise ValueError("a visual needs at least one name")
    return tuple(out)


@dataclass(frozen=True)
class RatedItem:
    """One human-rated caption. ``human`` maps a column (e.g. ``"rating"``, ``"annotator_1"``,
    ``"accuracy"``) to its score; ``where`` says where in the file the item came from.

    ``annotators``: where a benchmark gives several annotators' scores per column (MSVD-Eval), one dict
    per annotator with the same columns (``human`` then holds their means). ``group``: the file entry the
    item came from (Flickr8k: the image's key), for protocols that regroup an entry's ratings.
    """

    visual: tuple[str, ...]
    caption: str
    human: dict[str, float]
    where: str = ""
    annotators: tuple[dict[str, float], ...] = ()
    group: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.visual[0], normalize_caption(self.caption)


@dataclass(frozen=True)
class PairItem:
    """Two captions of one visual; ``preferred`` (0 or 1) is the one people chose (-1: a tie, in
    benchmarks that record ties); ``sources``: the models that wrote them, where the benchmark says."""

    visual: tuple[str, ...]
    captions: tuple[str, str]
    preferred: int
    category: str
    where: str = ""
    sources: tuple[str, str] | None = None

    def key(self, i: int) -> tuple[str, str]:
        return self.visual[0], normalize_caption(self.captions[i])


@dataclass
class Judgments:
    """All items of one benchmark file (:func:`~capreward.metaeval.read_judgments` returns it).

    Args:
        benchmark: the benchmark's name.
        source: the file read.
        rated: the rated items (a caption and its human ratings), or empty.
        pairs: the pairs (a preferred and another caption), or empty; one of ``rated`` and ``pairs`` is empty.

    Examples:
        >>> from capreward.metaeval import Judgments
        >>> Judgments("pascal-50s", "pascal50s.json").items
        []
    """

    benchmark: str
    source: str
    rated: list[RatedItem] = field(default_factory=list)
    pairs: list[PairItem] = field(default_factory=list)

    @property
    def items(self) -> list:
        return self.rated if self.rated else self.pairs

    def __len__(self) -> int:
        return len(self.items)


def as_rating(value: object, where: str) -> float:
    """A human rating as float; NaN passes through (protocols drop it), anything else non-numeric is
    a :class:`JudgmentError` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            return math.nan
        try:
            return float(cast(Any, value))  # numeric strings such as "3" in CSV-derived files
        except (TypeError, ValueError):
            raise JudgmentError(f"{where}: rating {value!r} is not a number") from None
    return float(value)
