"""Specificity: a caption's score on its own visual against the other visuals of its batch.

Discriminative (contrastive) captioning rewards a caption for fitting *its* image better than the others
it could be confused with. Reference-free CLIP rewards alone pay a caption for what it shares with many
visuals: a generic caption ("an image") or a hedge naming two candidates ("green blue") earns a fair score
on every image, and an image-blind policy can live on that. Specificity is

    specificity_i = r(c_i, v_i) - mean_{j != i} r(c_i, v_j)

over the *distinct* visuals v_j of the call (a GRPO group's repeated visual counts once; ``contrast="max"``
takes the closest other visual instead of the mean), for a base reward r (CLIP-S by default). Its property:
a caption that ignores the image (the same caption for every visual of a batch whose visuals are
distinct) sums to exactly zero over the batch with ``contrast="mean"``, so no image-blind policy earns
anything from it, however well its caption scores everywhere.

Use it beside the base reward in a :class:`~capreward.rewards.CompositeReward`; it needs at least two
distinct visuals per call (a sample whose call has one gets None, with the reason).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any
from collections.abc import Sequence

from ..errors import SampleError
from .base import RewardFunction, RewardOutput

CONTRASTS = ("mean", "max")


def visual_key(visual: Any) -> Any:
    """A key telling visuals apart: a path as itself; an image or array by its shape, mode or dtype and a
    hash of its content (two equal copies are the same visual)."""
    if isinstance(visual, (str, bytes)) or hasattr(visual, "__fspath__"):
        return ("path", str(visual))
    if hasattr(visual, "tobytes") and hasattr(visual, "size") and hasattr(visual, "mode"):  # PIL
        return ("pil", visual.mode, visual.size, hashlib.blake2b(visual.tobytes(), digest_size=16).hexdigest())
    if hasattr(visual, "detach"):  # torch
        visual = visual.detach().cpu().numpy()
    if hasattr(visual, "tobytes") and hasattr(visual, "shape"):  # numpy
        return ("array", str(visual.dtype), tuple(visual.shape), hashlib.blake2b(visual.tobytes(), digest_size=16).hexdigest())
    return ("object", id(visual))


class SpecificityReward(RewardFunction):
    """The base reward on a caption's own visual minus its mean (or max) on the batch's other distinct
    visuals; see the module docstring.

    Args:
        base: the reward scoring one caption against one visual (a `RewardFunction` with a
            ``compute`` taking ``image=`` or ``video=``); default ``CLIPScoreReward(**clip_kwargs)``.
        contrast: ``"mean"`` (the other visuals' mean: an image-blind caption sums to zero over a batch)
            or ``"max"`` (the closest other visual: the caption must beat every other visual).
        name: the TRL name (default ``"specificity"``).
        clip_kwargs: passed to `CLIPScoreReward` when ``base`` is not given
            (``model=...``, ``device=...``).

    Raises:
        ValueError: for an unknown ``contrast`` or both ``base`` and ``clip_kwargs``.

    Examples:
        >>> from capreward.rewards import CLIPScoreReward, CompositeReward, SpecificityReward
        >>> from capreward.testing.trained_clip import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())
        >>> spec = SpecificityReward(model=clip)
        >>> images = [colour_image(c) for c in ("red", "green", "blue", "yellow")]
        >>> right = spec(None, ["a red image", "a green image", "a blue image", "a yellow image"], image=images)
        >>> blind = spec(None, ["green blue"] * 4, image=images)
        >>> min(right) > 0.5 and abs(sum(blind)) < 1e-6
        True
        >>> reward = CompositeReward([(CLIPScoreReward(model=clip), 1.0), (spec, 0.5)])
    """

    __name__ = "specificity"

    def __init__(self, base: RewardFunction | None = None, *, contrast: str = "mean", name: str | None = None,
                 log_subscores: bool = True, **clip_kwargs: Any):
        if contrast not in CONTRASTS:
            raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
        if base is not None and clip_kwargs:
            raise ValueError(f"pass either base or CLIP-S arguments, not both (got {sorted(clip_kwargs)})")
        if base is None:
            from .clip_family import CLIPScoreReward

            base = CLIPScoreReward(**clip_kwargs)
        if not hasattr(base, "compute"):
            raise ValueError(f"base must be a capreward RewardFunction, got {type(base).__name__}")
        self.base, self.contrast = base, contrast
        super().__init__(name=name, log_subscores=log_subscores)

    def value_range(self) -> tuple[float, float] | None:
        """[lo - hi, hi - lo] for a base reward in [lo, hi]; None when the base promises no range."""
        r = self.base.value_range()
        return None if r is None else (r[0] - r[1], r[1] - r[0])

    def metric_names(self) -> tuple[str, ...]:
        """``own`` (the base reward on the caption's visual), ``others`` (its mean or max on the other
        distinct visuals) and ``clipped``."""
        return ("own", "others", *super().metric_names())

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        n = len(completions)
        kind = "image" if kwargs.get("image") is not None else "video" if kwargs.get("video") is not None else None
        if kind is None:
            reason = "specificity needs an image or video column"
            return self.with_metric_names(RewardOutput([None] * n, [SampleError(i, "no_visual", "", reason) for i in range(n)]))
        visuals = list(kwargs[kind])
        if len(visuals) != n:
            raise ValueError(f"{self.name}: {len(visuals)} {kind}s for {n} completions")
        ids = kwargs.get("visual_id")
        keys = [("id", ids[i]) if ids is not None and ids[i] is not None else visual_key(v) for i, v in enumerate(visuals)]
        distinct = list(dict.fromkeys(keys))
        first = {k: keys.index(k) for k in distinct}
        if len(distinct) < 2:
            reason = f"specificity needs at least two different {kind}s in the call, got {len(distinct)}"
            return self.with_metric_names(RewardOutput([None] * n, [SampleError(i, "input", "", reason) for i in range(n)]))
        m = len(distinct)
        # every caption against every distinct visual, in one call of the base reward
        flat_completions = [completions[i] for i in range(n) for _ in range(m)]
        flat_visuals = [visuals[first[k]] for _ in range(n) for k in distinct]
        flat_prompts = None if prompts is None else [prompts[i] for i in range(n) for _ in range(m)]
        out = self.base.compute(flat_prompts, flat_completions, **{kind: flat_visuals})
        values: list[float | None] = []
        reasons: list[str | None] = []
        own_col, others_col = [], []
        for i in range(n):
            row = out.values[i * m:(i + 1) * m]
            j = distinct.index(keys[i])
            own = row[j]
            rest = [v for k, v in enumerate(row) if k != j and v is not None]
            if own is None or not rest:
                values.append(None)
                reasons.append(out.reasons[i * m + j] or "the base reward scored none of the other visuals")
                own_col.append(math.nan if own is None else own)
                others_col.append(math.nan)
                continue
            other = sum(rest) / len(rest) if self.contrast == "mean" else max(rest)
            values.append(own - other)
            reasons.append(None)
            own_col.append(own)
            others_col.append(other)
        return self.with_metric_names(RewardOutput(values, reasons, metrics={"own": own_col, "others": others_col}))
