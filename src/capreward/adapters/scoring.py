"""Score (caption, label) pairs with a capreward reward, for adapters that have no dataset columns.

Turns parsed :class:`~capreward.adapters.labels.Label` objects into the TRL-style columns the reward
reads (``image``/``video``/``references``/visual id, under the reward's own column names) and returns
one value or None per sample with the reason, plus the per-sample sub-scores.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Sequence

from ..caption_budget import caption_problem
from ..errors import SampleError, sample_failure, summarize
from ..rewards.inputs import Columns
from ..media.files import REFUSED
from .labels import Label

logger = logging.getLogger(__name__)


@dataclass
class ScoredBatch:
    """Per sample: ``values`` (None = unscored), ``reasons`` (why a value is None) and sub-score
    ``metrics`` (name -> one float per sample, NaN where undefined)."""

    values: list[float | None]
    reasons: list[str | None]
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def filled(self, fallback: float) -> list[float]:
        """``values`` with ``fallback`` in place of None (RL stacks need a number for every sample)."""
        return [fallback if v is None else v for v in self.values]


def resolve_fallback(reward: Any, fallback: float | None = None) -> float:
    """The number an RL stack gets for a sample the reward cannot score: ``fallback`` when given, else
    the bottom of the reward's range (``reward.value_range()[0]``: -1 for EMScore, 0 for CLIP-S with
    ``use_references=False`` and -1 with references, where RefCLIP-S reaches -1; the sum of the lows
    for a composite), so an unscorable sample (an empty completion, an unreadable file)
    never outranks a scored one. A mid-range value such as 0.0 for EMScore's [-1, 1] would rank an empty
    completion above every wrong caption, and the policy would learn to produce it.

    Raises ValueError when ``fallback`` is not finite, or when it is None and the reward states no range
    (a plain function, a composite with one): pass a number then. An explicit fallback above the bottom
    is allowed (it is logged as a warning)."""
    name = getattr(reward, "__name__", type(reward).__name__)
    value_range = getattr(reward, "value_range", None)
    bounds = value_range() if callable(value_range) else None
    if fallback is None:
        if bounds is None:
            raise ValueError(f"reward {name!r} states no range (value_range() is None), so unscorable samples have no "
                             "bottom to get: pass a fallback number (serve --fallback, CAPREWARD_FALLBACK)")
        fallback = bounds[0]
    value = float(fallback)
    if not math.isfinite(value):
        raise ValueError(f"fallback must be a finite number, got {fallback}")
    if bounds is not None and value > bounds[0]:
        logger.warning("fallback %g is above the bottom %g of %s's range [%g, %g]: an unscorable sample outranks "
                       "scored samples below it", value, bounds[0], name, bounds[0], bounds[1])
    return value


def concat_batches(parts: Sequence[ScoredBatch]) -> ScoredBatch:
    """``parts`` joined in order; a metric some part lacks is NaN for that part's samples."""
    keys = sorted({key for part in parts for key in part.metrics})
    return ScoredBatch(
        [v for part in parts for v in part.values],
        [r for part in parts for r in part.reasons],
        {key: [float(v) for part in parts for v in part.metrics.get(key, [math.nan] * len(part.values))]
         for key in keys},
    )


def label_columns(labels: Sequence[Label], columns: Columns) -> dict[str, list[Any]]:
    """The keyword columns a :class:`~capreward.rewards.CaptionReward` reads, one entry per label: a label
    naming several images gives them in the ``images`` column (scored on each and aggregated, as the
    Python API and the jobs do), the others in ``image``."""
    several = [lab.images is not None and len(lab.images) > 1 for lab in labels]
    out: dict[str, list[Any]] = {
        columns.image: [None if many else lab.image for lab, many in zip(labels, several)],
        columns.video: [lab.video for lab in labels],
        columns.references: [lab.references for lab in labels],
    }
    if any(several):
        out[columns.images] = [list(lab.images or ()) if many else None for lab, many in zip(labels, several)]
    if columns.visual_id is not None:
        out[columns.visual_id] = [lab.visual_id for lab in labels]
    return out


def _spread(column: Sequence[float], at: Sequence[int], n: int) -> list[float]:
    out = [math.nan] * n
    for j, i in enumerate(at):
        out[i] = float(column[j])
    return out


def score_labelled(reward: Any, captions: Sequence[str], labels: Sequence[Label]) -> ScoredBatch:
    """Score ``captions[i]`` against ``labels[i]`` with ``reward`` (a capreward reward, or any TRL-style
    callable returning one float or None per completion).

    Returns a :class:`ScoredBatch`; samples the reward cannot score get None and a reason, which is
    also logged. Labels with an ``error`` (a refused path) and captions over the caption budget
    (:mod:`capreward.caption_budget`: the one door of the server and the veRL adapter) are not passed to
    the reward and get None with that error; a file refused when it is opened gets the same text. Raises
    ValueError when the lengths differ.
    """
    if len(captions) != len(labels):
        raise ValueError(f"got {len(labels)} labels for {len(captions)} completions")
    blocked: dict[int, SampleError] = {}
    for i, (caption, lab) in enumerate(zip(captions, labels)):
        if lab.error is not None:
            blocked[i] = SampleError.of(lab.error, i, kind="refused")
        elif (over := caption_problem(caption)) is not None:
            blocked[i] = SampleError(i, "input", f"completions[{i}]", over, " ")
    if blocked:
        keep = [i for i in range(len(labels)) if i not in blocked]
        part = score_labelled(reward, [captions[i] for i in keep], [labels[i] for i in keep])
        values: list[float | None] = [None] * len(labels)
        reasons: list[str | None] = [blocked.get(i) for i in range(len(labels))]
        for j, i in enumerate(keep):
            values[i], reasons[i] = part.values[j], part.reasons[j]
        metrics = {key: _spread(column, keep, len(labels)) for key, column in part.metrics.items()}
        logger.warning("%d/%d samples not scored: %s", len(blocked), len(labels),
                       summarize(list(blocked.values()), more=False))
        return ScoredBatch(values, reasons, metrics)
    if not captions:
        return ScoredBatch([], [])
    # rewards without their own column names (a composite, a plain TRL function) get ids as "visual_id"
    columns = getattr(reward, "columns", None) or Columns(visual_id="visual_id")
    kwargs = label_columns(labels, columns)
    if any(lab.questions is not None for lab in labels):  # qa_utility's column (other rewards ignore it)
        kwargs[getattr(reward, "questions_column", "questions")] = [lab.questions for lab in labels]
    if hasattr(reward, "compute"):
        out = reward.compute(None, list(captions), **kwargs)
        values, reasons, metrics = list(out.values), list(out.reasons), dict(out.metrics)
    else:
        values = list(reward(None, list(captions), **kwargs))
        reasons = [None if v is not None else SampleError(i, "scorer", "", "the reward returned None")
                   for i, v in enumerate(values)]
        metrics = {}
    if len(values) != len(captions):
        raise RuntimeError(f"the reward returned {len(values)} values for {len(captions)} completions")
    for i, v in enumerate(values):
        if v is not None and not math.isfinite(float(v)):
            values[i], reasons[i] = None, sample_failure(i, v, None, non_finite="the reward returned {value}")
        elif v is None and getattr(reasons[i], "kind", None) == "refused":
            # refused when opened (swapped since the check): the text of a refusal at the check
            reasons[i] = SampleError(i, "refused", "image" if labels[i].image is not None else "video", REFUSED)
    bad = [i for i, v in enumerate(values) if v is None]
    if bad:
        logger.warning("%d/%d samples unscored: %s", len(bad), len(values),
                       summarize([sample_failure(i, None, reasons[i]) for i in bad], more=False))
    return ScoredBatch([None if v is None else float(v) for v in values], reasons, metrics)
