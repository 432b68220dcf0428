"""Reading metric scores (a JSONL file) and pairing them with judgment items.

A scores row names its visual by ``image`` or ``video`` (or ``image_id`` / ``video_id``): a path or
an id as the judgments file writes it; its file name or stem also match. Its caption is matched after
whitespace normalisation. The score is ``score`` unless another field is chosen: a top-level key such
as ``clip_s`` or ``emscore/video/full_f`` (``capreward score`` writes flat keys), or a dotted path into
nested objects (``metrics.clip_s``). For benchmarks with human dimensions (MSVD-Eval's ACCR) a row may also
carry one score per dimension as ``<field>/<dimension>`` (``gveval/accuracy`` …, as ``capreward score
--gveval-accr`` writes them; ``<field>.<dimension>`` in files written before capreward named sub-scores
with ``/``); the protocol then correlates each with the matching human dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ..names import sub_score
from .judgments import JudgmentError, Judgments, normalize_caption, visual_aliases
from .readers import read_jsonl_objects

VISUAL_FIELDS = ("image", "video", "image_id", "video_id")


def known_metrics() -> tuple[str, ...]:
    """Fields ``capreward score`` writes for the metrics (:func:`capreward.registry.result_fields`), tried
    when the row has no ``score``."""
    from .. import registry

    return registry.result_fields()


def __getattr__(name: str):
    if name == "KNOWN_METRICS":  # the tuple this module exported before the registry
        return known_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ScoreRow:
    where: str
    visual: str
    caption: str
    score: float | None  # None: the row has no usable score (``reason`` says why)
    reason: str | None = None
    parts: dict[str, float] = field(default_factory=dict)  # dimension -> score, from ``<field>/<dimension>``


def field_value(row: dict, name: str) -> object:
    """``row[name]`` if present, else the dotted path ``a.b.c`` through nested objects; KeyError if absent."""
    if name in row:
        return row[name]
    node: object = row
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(name)
        node = node[part]
    return node


def pick_field(row: dict, where: str) -> str:
    """The default score field of a row: ``score``, else the single metric ``capreward score`` wrote."""
    if "score" in row:
        return "score"
    present = [m for m in known_metrics() if m in row]
    if len(present) == 1:
        return present[0]
    numeric = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    raise JudgmentError(f"{where}: no 'score' field; choose one with --score-field (numeric fields: {numeric})")


def _number(value: object) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def read_scores(path: str | Path, score_field: str | None = None, parts: tuple[str, ...] = ()) -> list[ScoreRow]:
    """Every row of a scores JSONL (a ``capreward score`` results file, or any JSONL with a visual, a
    caption and a score).

    Args:
        path: the JSONL file.
        score_field: the field holding the score (None: picked from the row).
        parts: dimension names whose per-dimension scores ``<field>/<dimension>`` (or
            ``<field>.<dimension>``) are read into ``ScoreRow.parts`` where the row has them as numbers.

    Returns:
        One ``ScoreRow`` per line; rows whose score is missing, null or NaN are kept with ``score=None``
        and a reason (they count as unmatched).

    Raises:
        JudgmentError: a row without a visual or caption."""
    path = Path(path)
    rows: list[ScoreRow] = []
    for where, obj in read_jsonl_objects(path, "scores"):
        visual = next((obj[k] for k in VISUAL_FIELDS if obj.get(k) is not None), None)
        if visual is None:
            raise JudgmentError(f"{where}: needs one of {list(VISUAL_FIELDS)}")
        if not isinstance(obj.get("caption"), str):
            raise JudgmentError(f"{where}: 'caption' must be a string")
        name = score_field or pick_field(obj, where)
        score, reason = None, None
        try:
            value = field_value(obj, name)
        except KeyError:
            reason = f"no field {name!r}"
        else:
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                errors = obj.get("errors")
                reason = f"{name} is {value!r}" + (f" ({errors})" if errors else "")
            elif math.isnan(value):
                reason = f"{name} is NaN"
            else:
                score = float(value)
        found = {}
        for part in parts:
            try:
                value = _number(field_value(obj, sub_score(name, part)))
            except KeyError:
                try:
                    value = _number(field_value(obj, f"{name}.{part}"))
                except KeyError:
                    continue
            if value is not None:
                found[part] = value
        rows.append(ScoreRow(where, str(visual), obj["caption"], score, reason, found))
    return rows


@dataclass
class ScoreIndex:
    """Scores keyed by (canonical visual id, normalised caption) of one judgments file.

    ``unused`` lists score rows that name no visual of the judgments; ``missing`` maps keys whose only
    rows had no usable score to the reason; ``parts`` holds a key's per-dimension scores, if any.
    """

    scores: dict[tuple[str, str], float] = field(default_factory=dict)
    parts: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    missing: dict[tuple[str, str], str] = field(default_factory=dict)
    unused: list[ScoreRow] = field(default_factory=list)

    def get(self, key: tuple[str, str]) -> float | None:
        return self.scores.get(key)

    def why_missing(self, key: tuple[str, str]) -> str:
        return self.missing.get(key, "no score row for this image and caption")


def alias_map(judgments: Judgments) -> dict[str, str | None]:
    """Alias -> canonical visual id; an alias shared by two different visuals maps to None (ambiguous)."""
    out: dict[str, str | None] = {}
    for item in judgments.items:
        canonical = item.visual[0]
        for alias in item.visual:
            if out.get(alias, canonical) != canonical:
                out[alias] = None
            else:
                out[alias] = canonical
    return out


def resolve(visual: str, aliases: dict[str, str | None]) -> str | None:
    """The canonical id a scores row's visual refers to: the exact name, else its file name, else its stem."""
    for name in visual_aliases(visual):
        canonical = aliases.get(name)
        if canonical is not None:
            return canonical
    return None


def index_scores(rows: list[ScoreRow], judgments: Judgments, tolerance: float = 1e-6) -> ScoreIndex:
    """Index ``rows`` by the judgments' keys. Two rows for the same key with scores that differ by more
    than ``tolerance`` (relative) raise :class:`JudgmentError` naming both rows."""
    aliases = alias_map(judgments)
    index = ScoreIndex()
    first: dict[tuple[str, str], ScoreRow] = {}
    for row in rows:
        canonical = resolve(row.visual, aliases)
        if canonical is None:
            index.unused.append(row)
            continue
        key = (canonical, normalize_caption(row.caption))
        if row.score is None:
            index.missing.setdefault(key, row.reason or "no score")
            continue
        if key in first:
            prev = cast(float, first[key].score)  # only scored rows are kept in first
            if abs(prev - row.score) > tolerance * max(1.0, abs(prev)):
                raise JudgmentError(
                    f"{row.where}: score {row.score} for image {canonical!r} and caption {row.caption!r} "
                    f"conflicts with {prev} at {first[key].where}"
                )
            continue
        first[key] = row
        index.scores[key] = row.score
        if row.parts:
            index.parts[key] = row.parts
        index.missing.pop(key, None)
    return index
