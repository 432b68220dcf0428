"""``errors="nan"`` for the CLIP scorers: score what can be scored, NaN and a reason for the rest.

A GRPO group with one empty completion (or one unreadable visual) should not lose the other samples'
scores. :func:`score_valid` finds the items that cannot be scored (a caption that is not a non-blank
str, a visual that fails to load, a reference list that is not a non-empty list of non-blank str),
scores the others in one call of the scorer and scatters the results back into full-length results:
NaN in every tensor, None in per-item lists (``False`` for ``truncated``), and the reason in
``errors[i]``, a :class:`~capreward.errors.SampleError` (kind ``"input"`` for the caption or references,
``"media"``/``"refused"`` for the visual; None for scored items). The scored items' values are exactly what scoring them alone
gives, since no score depends on the rest of its batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable, Sequence

import torch

from ..errors import SampleError, exception_kind
from ..media import MediaError
from .results import Alignments, TokenAlignment

ERROR_MODES = ("raise", "nan")


def check_error_mode(errors: str) -> None:
    if errors not in ERROR_MODES:
        raise ValueError(f"errors must be one of {ERROR_MODES}, got {errors!r}")


def caption_problem(caption: Any) -> str | None:
    """Why ``caption`` cannot be scored, or None."""
    if not isinstance(caption, str):
        return f"caption must be str, got {type(caption).__name__}"
    if not caption.strip():
        return "empty caption"
    return None


def references_problem(refs: Any, where: str = "references") -> str | None:
    """Why one candidate's references cannot be used, or None (a single str counts as one reference).

    The one rule of every entry point (scorers, rewards, ``capreward score``): references are a
    non-empty list of non-blank str; ``[]``, ``[""]`` or a non-str entry is an error, never "no
    references". ``where`` names the list in the reason."""
    refs = [refs] if isinstance(refs, str) else refs
    if not isinstance(refs, (list, tuple)) or not refs:
        return f"{where} must be a non-empty list of captions"
    for k, r in enumerate(refs):
        problem = caption_problem(r)
        if problem:
            return f"{where}[{k}]: {problem}"
    return None


def visual_problems(
    visuals: Sequence[Any] | None, ids: Sequence[Any] | None, embed: Callable[[list[Any], list[Any] | None], Any]
) -> list[SampleError | None]:
    """Per visual: the :class:`MediaError` message of loading it alone (``embed([v], [id])``), or None.
    The embeddings land in the backbone's cache, so the batched call that follows reuses them."""
    if visuals is None:
        return []
    out: list[SampleError | None] = []
    for i, visual in enumerate(visuals):
        try:
            embed([visual], None if ids is None else [ids[i]])
            out.append(None)
        except MediaError as exc:  # its text, kind "media" ("refused": a file outside the media root)
            out.append(SampleError(i, exception_kind(exc), exc.item, exc.problem))
    return out


def _widened(alignments: Alignments, position: dict[int, int]) -> Callable[[int], TokenAlignment | None]:
    """The builder of item i of the widened alignments: item ``position[i]`` of ``alignments``, None for
    an item not scored."""
    return lambda i: alignments[position[i]] if i in position else None


def scatter(result: Any, keep: list[int], n: int) -> Any:
    """A copy of ``result`` (a dataclass of per-item tensors, nested dataclasses and lists, for the
    items ``keep``) with every per-item field widened to ``n`` items: NaN / None / False elsewhere."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, Alignments) and len(v) == len(keep):
            values[f.name] = Alignments(n, _widened(v, {i: j for j, i in enumerate(keep)}))
        elif isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == len(keep):
            full = torch.full((n, *v.shape[1:]), float("nan"), dtype=v.dtype if v.is_floating_point() else torch.float32, device=v.device)
            full[torch.tensor(keep, dtype=torch.long, device=v.device)] = v.to(full.dtype)
            values[f.name] = full
        elif dataclasses.is_dataclass(v):
            values[f.name] = scatter(v, keep, n)
        elif isinstance(v, list) and len(v) == len(keep):
            fill = False if f.name == "truncated" else None
            full_list: list[Any] = [fill] * n
            for j, i in enumerate(keep):
                full_list[i] = v[j]
            values[f.name] = full_list
        else:
            values[f.name] = v
    return dataclasses.replace(result, **values)


def score_valid(
    score: Callable[..., Any],
    candidates: Sequence[Any],
    visuals: Sequence[Any] | None,
    visual_arg: str,
    ids: Sequence[Any] | None,
    id_arg: str,
    references: Sequence[Any] | None,
    embed: Callable[[list[Any], list[Any] | None], Any] | None,
    empty: Callable[[int], Any],
) -> Any:
    """Score the scorable items with ``score(candidates, **{visual_arg: ..., "references": ...,
    id_arg: ...})`` (its ``errors="raise"`` path) and return the full-length result with ``errors``
    set. ``empty(n)`` builds the result when no item can be scored."""
    candidates = list(candidates)
    n = len(candidates)
    for what, items in ((visual_arg, visuals), ("references", references), (id_arg, ids)):
        if items is not None and len(items) != n:
            raise ValueError(f"got {len(items)} {what} for {n} candidates; give one per candidate")
    problems: list[SampleError | None] = [SampleError.of(caption_problem(c), i, kind="input")
                                          for i, c in enumerate(candidates)]
    if references is not None:
        problems = [p or (SampleError.naming(i, "input", "references", why) if (why := references_problem(r)) else None)
                    for i, (p, r) in enumerate(zip(problems, references))]
    if visuals is not None and embed is not None:
        problems = [p or v for p, v in zip(problems, visual_problems(visuals, ids, embed))]
    keep = [i for i, p in enumerate(problems) if p is None]
    if not keep:
        result = empty(n)
    else:
        kwargs = {visual_arg: None if visuals is None else [visuals[i] for i in keep]}
        kwargs["references"] = None if references is None else [references[i] for i in keep]
        kwargs[id_arg] = None if ids is None else [ids[i] for i in keep]
        result = scatter(score([candidates[i] for i in keep], **kwargs), keep, n)
    result.errors = problems
    return result
