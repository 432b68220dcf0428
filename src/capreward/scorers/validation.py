"""Argument checks shared by the scorers; each error names the offending item."""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence


def caption_list(captions: Any, what: str = "candidates") -> list[str]:
    """``captions`` as a list of str (possibly empty, blank captions allowed); raises TypeError for a
    single str or naming the first item that is not a str."""
    if isinstance(captions, str):
        raise TypeError(f"{what} must be a list of captions, got a single str")
    captions = list(captions)
    for i, c in enumerate(captions):
        if not isinstance(c, str):
            raise TypeError(f"{what}[{i}] must be str, got {type(c).__name__}")
    return captions


def check_captions(captions: Any, what: str = "candidates") -> list[str]:
    """Return ``captions`` as a non-empty list of non-blank str, or raise naming the first bad item."""
    captions = caption_list(captions, what)
    if not captions:
        raise ValueError(f"{what} is empty")
    for i, c in enumerate(captions):
        if not c.strip():
            raise ValueError(f"{what}[{i}] is an empty caption")
    return captions


def check_same_length(n: int, items: Sequence[Any] | None, what: str) -> None:
    if items is not None and len(items) != n:
        raise ValueError(f"got {len(items)} {what} for {n} candidates; give one per candidate")


def check_references(references: Any, n: int) -> list[list[str]] | None:
    """Each candidate's references as a non-empty list of captions (a single str becomes [str])."""
    if references is None:
        return None
    references = list(references)
    check_same_length(n, references, "reference lists")
    out = []
    for i, refs in enumerate(references):
        refs = [refs] if isinstance(refs, str) else refs
        out.append(check_captions(refs, what=f"references[{i}]"))
    return out
