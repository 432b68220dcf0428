"""Reading a scoring manifest: JSONL, one candidate per line.

Each row has ``caption`` and ``image`` or ``video`` (a path; a relative path is resolved against the
manifest's folder, and rows record the absolute path they were scored with, so ``capreward report``
finds the visual from any working directory), optionally ``references`` (list of str) and ``id``. Rows
without an id get ``"line-N"`` (1-based line number), which is stable across reruns of the same manifest.
``image`` may also be a list of paths: the row is scored on every image, each metric's value aggregated
over them (``capreward score --image-aggregation``: mean, min or max, as the rewards'
``image_aggregation``) and the per-image values written beside it (:mod:`capreward.jobs.runners`).

Other keys are carried to the results untouched (a dataset's own fields: a source URL, a split, ...),
except a near miss of a key above (``"refrences"``, ``"imgae"``, ``"captoin"``: see :func:`near_miss`),
which is refused with "did you mean ...", and a key that is one of the fields a job writes (``errors``,
a metric's name, ...), which would be overwritten. A line that is not a JSON object (invalid UTF-8 or
JSON, nesting too deep, an integer over Python's 4300-digit limit) is refused naming the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import registry
from ..errors import CaprewardError
from ..jsonl import json_lines
from ..text import capped

#: The keys a manifest row may have that capreward reads.
KNOWN_KEYS = ("id", "caption", "image", "video", "references")
#: Fields the jobs write besides the metrics' own (:func:`written_fields`).
JOB_FIELDS = ("errors", "alignment", "metric", "explanation", "visual_hash")


def written_fields() -> tuple[str, ...]:
    """Fields the jobs write (with every ``<field>/``- or ``<field>.``-prefixed sub-score): a carried key
    may not be one. The metrics' fields are read from :mod:`capreward.registry`."""
    return (*JOB_FIELDS[:4], *registry.result_fields(), *JOB_FIELDS[4:])


def __getattr__(name: str):
    if name == "WRITTEN_FIELDS":  # the tuple this module exported before the registry
        return written_fields()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The deepest nesting of lists and objects a manifest row may have (a carried value is written back out).
MAX_DEPTH = 64


class ManifestError(CaprewardError, ValueError):
    """A manifest row that cannot be used; the message names the file and line."""


@dataclass
class ManifestRow:
    id: str
    caption: str
    kind: str  # "image" or "video"
    path: str
    references: list[str] | None = None
    extra: dict = field(default_factory=dict)  # other keys of the row, carried to the results as they are
    paths: list[str] | None = None  # a row with several images: all of them (``path`` is the first)

    @property
    def visual(self) -> str | list[str]:
        """The row's visual as the manifest gives it: a path, or the list of a several-image row's paths."""
        return list(self.paths) if self.paths else self.path


def edit_distance(a: str, b: str) -> int:
    """The optimal-string-alignment distance of ``a`` and ``b``: insertions, deletions, substitutions
    and swaps of two adjacent characters each count 1 (``"imgae"`` is 1 from ``"image"``)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def near_miss(key: str, row: dict) -> str | None:
    """The known key that ``key`` (an unknown key of ``row``) is a misspelling of, or None: one the row
    lacks (a row with an image or a video lacks neither), at edit distance at most 2 (letter case ignored)
    and less than half its length. So ``"refrences"``, ``"imgae"``, ``"captoin"``, ``"Caption"`` and
    ``"ID"`` are near misses, but ``"uid"``, or ``"vid"`` in a row with an image or a video, are a
    dataset's own fields."""
    if len(key) > 2 * max(map(len, KNOWN_KEYS)):
        return None
    best = None
    has_visual = "image" in row or "video" in row  # a row gives one of them: it lacks the other by design
    for known in KNOWN_KEYS:
        if known in row or (has_visual and known in ("image", "video")):
            continue
        d = edit_distance(key.lower(), known)
        if d <= 2 and d < len(known) / 2 and (best is None or d < best[0]):
            best = (d, known)
    return None if best is None else best[1]


def _carried(obj: dict, where: str) -> dict:
    extra = {}
    for key, value in obj.items():
        if key in KNOWN_KEYS:
            continue
        if (known := near_miss(key, obj)) is not None:
            raise ManifestError(f"{where}: unknown key {capped(key)}; did you mean {known!r}? (known keys: "
                                f"{', '.join(KNOWN_KEYS)}; other keys are carried to the results as they are)")
        written = written_fields()
        if key in written or any(key.startswith(f + ".") or key.startswith(f + "/") for f in written):
            raise ManifestError(f"{where}: key {capped(key)} is a field the results hold (it would be overwritten); "
                                "rename it")
        extra[key] = value
    return extra


def nesting_depth(value: object) -> int:
    """How deeply lists and objects nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_row(obj: object, where: str, base: Path) -> ManifestRow:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if nesting_depth(obj) > MAX_DEPTH:
        raise ManifestError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    extra = _carried(obj, where)
    caption = obj.get("caption")
    if not isinstance(caption, str):
        raise ManifestError(f"{where}: 'caption' must be a string")
    kinds = [k for k in ("image", "video") if obj.get(k) is not None]
    if len(kinds) != 1:
        raise ManifestError(f"{where}: give exactly one of 'image' or 'video'")
    kind = kinds[0]
    value = obj[kind]
    if kind == "image" and isinstance(value, list):  # several images: all scored, values aggregated
        if not value or not all(isinstance(v, str) and v for v in value):
            raise ManifestError(f"{where}: 'image' must be a path or a non-empty list of paths (non-empty strings)")
        paths = [v if Path(v).is_absolute() else str(base / v) for v in value]
    elif not isinstance(value, str) or not value:
        hint = " (one video per row)" if kind == "video" and isinstance(value, list) else ""
        raise ManifestError(f"{where}: {kind!r} must be a path (a non-empty string){hint}")
    else:
        paths = [value if Path(value).is_absolute() else str(base / value)]
    path = paths[0]
    refs = obj.get("references")
    if refs is not None:
        if isinstance(refs, str):
            refs = [refs]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ManifestError(f"{where}: 'references' must be a list of strings")
    return ManifestRow(id="", caption=caption, kind=kind, path=path, references=refs, extra=extra,
                       paths=paths if len(paths) > 1 else None)


def read_manifest(path: str | Path) -> list[ManifestRow]:
    """All rows of a JSONL manifest, validated; raises ``ManifestError`` naming the line."""
    path = Path(path)
    rows: list[ManifestRow] = []
    seen: dict[str, int] = {}
    base = path.parent.absolute()  # rows record the paths scored, valid from any working directory
    for lineno, where, obj in json_lines(path, ManifestError):
        row = parse_row(obj, where, base)
        row.id = str(obj["id"]) if obj.get("id") is not None else f"line-{lineno}"
        if row.id in seen:
            raise ManifestError(f"{where}: duplicate id {capped(row.id)} (first on line {seen[row.id]})")
        seen[row.id] = lineno
        rows.append(row)
    if not rows:
        raise ManifestError(f"{path}: the manifest has no rows")
    return rows
