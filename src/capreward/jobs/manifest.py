"""Reading a scoring manifest: JSONL, one candidate per line.

Each row has ``caption`` and ``image`` or ``video`` (a path, relative paths resolved against the
manifest's folder), optionally ``references`` (list of str) and ``id``. Rows without an id get
``"line-N"`` (1-based line number), which is stable across reruns of the same manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..jsonl import json_lines


class ManifestError(ValueError):
    """A manifest row that cannot be used; the message names the file and line."""


@dataclass
class ManifestRow:
    id: str
    caption: str
    kind: str  # "image" or "video"
    path: str
    references: list[str] | None = None
    extra: dict = field(default_factory=dict)


def parse_row(obj: object, where: str, base: Path) -> ManifestRow:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    caption = obj.get("caption")
    if not isinstance(caption, str):
        raise ManifestError(f"{where}: 'caption' must be a string")
    kinds = [k for k in ("image", "video") if obj.get(k) is not None]
    if len(kinds) != 1:
        raise ManifestError(f"{where}: give exactly one of 'image' or 'video'")
    kind = kinds[0]
    path = str(obj[kind])
    if not Path(path).is_absolute():
        path = str(base / path)
    refs = obj.get("references")
    if refs is not None:
        if isinstance(refs, str):
            refs = [refs]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ManifestError(f"{where}: 'references' must be a list of strings")
    extra = {k: v for k, v in obj.items() if k not in ("id", "caption", "image", "video", "references")}
    return ManifestRow(id="", caption=caption, kind=kind, path=path, references=refs, extra=extra)


def read_manifest(path: str | Path) -> list[ManifestRow]:
    """All rows of a JSONL manifest, validated; raises ``ManifestError`` naming the line."""
    path = Path(path)
    rows: list[ManifestRow] = []
    seen: dict[str, int] = {}
    for lineno, where, obj in json_lines(path, ManifestError):
        row = parse_row(obj, where, path.parent)
        row.id = str(obj["id"]) if obj.get("id") is not None else f"line-{lineno}"
        if row.id in seen:
            raise ManifestError(f"{where}: duplicate id {row.id!r} (first on line {seen[row.id]})")
        seen[row.id] = lineno
        rows.append(row)
    if not rows:
        raise ManifestError(f"{path}: the manifest has no rows")
    return rows
