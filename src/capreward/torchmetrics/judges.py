"""torchmetrics ``Metric`` classes for the chat-judge metrics: VisCE² and G-VEval.

Both follow :class:`~capreward.torchmetrics.metrics.CaptionMetric`: per-caption rows in list states
(synced with ``dist_reduce_fx="cat"``), the judge backend held by reference (never in ``state_dict``),
empty captions not sent to the judge. Scores are on 0..100; samples the judge could not score (a failed
request, an unreadable visual, an answer without a score) are NaN and left out of the mean, and the
``"scored"`` column (1 or 0) gives the rate of scored samples.
"""

from __future__ import annotations

import torch

from ..scorers.gveval_spec import ACCR
from .hooks import MetricHooks
from .metrics import RegisteredMetric


def _scored(score: torch.Tensor) -> torch.Tensor:
    return (~torch.isnan(score)).float()


class VisCE2Hooks(MetricHooks):
    """VisCE²'s columns: ``score``, ``empty``, ``scored`` and, when the scorer computes it, ``expected``;
    images only, no references."""

    required = "backend"
    fixed_visual = "image"

    def columns(self, metric, scorer) -> tuple[str, ...]:
        return ("score", "empty", "scored") + (("expected",) if scorer.expected else ())

    def check_mode(self, metric, has_visuals, has_refs) -> None:
        if not has_visuals or has_refs:
            raise ValueError(f"{metric.name}: VisCE² takes one image per caption and no references")

    def score_rows(self, metric, candidates, visuals, references, visual_ids):
        res = metric.scorer.score(candidates, visuals, image_ids=visual_ids if visual_ids and all(visual_ids) else None)
        score = torch.as_tensor(res.score, dtype=torch.float32)
        metric._log_unscored(candidates, score.tolist(), res.error)
        cols = {"score": score, "scored": _scored(score)}
        if res.expected is not None:
            cols["expected"] = torch.as_tensor(res.expected, dtype=torch.float32)
        return metric._row_tensor(cols, len(candidates))

    def parts(self, metric, has_visuals, has_refs):
        return [c for c in ("score", "expected") if c in metric.columns]


class GVEvalHooks(MetricHooks):
    """G-VEval's columns: ``score``, ``empty``, ``scored`` and with ACCR the four dimensions (videos only)."""

    required = "backend"

    def check(self, metric, scorer, visual) -> None:
        if scorer.accr and visual != "video":
            raise ValueError("G-VEval's ACCR prompts are for video: use visual='video'")

    def columns(self, metric, scorer) -> tuple[str, ...]:
        return ("score", "empty", "scored") + (ACCR if scorer.accr else ())

    def check_mode(self, metric, has_visuals, has_refs) -> None:
        mode = metric.scorer.mode
        if mode != "ref-only" and not has_visuals:
            raise ValueError(f"{metric.name}: G-VEval mode {mode!r} needs a visual for every caption")
        if mode != "ref-free" and not has_refs:
            raise ValueError(f"{metric.name}: G-VEval mode {mode!r} needs references for every caption")

    def score_rows(self, metric, candidates, visuals, references, visual_ids):
        key = "videos" if metric.visual == "video" else "images"
        res = metric.scorer.score(candidates, references=references, **{key: visuals})
        score = torch.as_tensor(res.score, dtype=torch.float32)
        metric._log_unscored(candidates, score.tolist(), res.error)
        cols = {"score": score, "scored": _scored(score)}
        if metric.scorer.accr:
            for name in ACCR:
                cols[name] = torch.as_tensor(getattr(res, name), dtype=torch.float32)
        return metric._row_tensor(cols, len(candidates))

    def parts(self, metric, has_visuals, has_refs):
        return [c for c in metric.columns if c not in ("empty", "scored")]


class VisCE2Metric(RegisteredMetric):
    """VisCE² as a torchmetrics Metric (images; higher is better, 0..100).

    Columns: ``score`` (the first integer of the judge's answer; 0 when it wrote none, as in the paper;
    NaN when the request failed), ``empty``, ``scored``, and with ``expected=True`` ``expected`` (the
    expected score from the token distribution). Give ``backend`` (any
    `JudgeBackend`) and any other `VisCE2` option as a keyword (``max_tokens=``; ``scorer_kwargs=``, a
    dict of them, still works), or a configured ``scorer``.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward.torchmetrics import VisCE2Metric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = VisCE2Metric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    metric = "visce2"
    default_name = "visce2"


class GVEvalMetric(RegisteredMetric):
    """G-VEval as a torchmetrics Metric (0..100, higher is better).

    ``mode``: "ref-free" (visuals), "ref-only" (references; visuals optional) or "combined" (both);
    ``visual``: "image" or "video" (the three-frame composite); ``accr``: also the four ACCR columns
    (video only). Columns: ``score``, ``empty``, ``scored``, and with ACCR ``accuracy``,
    ``completeness``, ``conciseness``, ``relevance``. Give ``backend`` and any other `GVEval` option as a
    keyword (``scorer_kwargs=``, a dict of them, still works), or a configured ``scorer``.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward.torchmetrics import GVEvalMetric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = GVEvalMetric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    metric = "gveval"
    default_name = "gveval"
    _ACCR = ACCR


__all__ = ["GVEvalMetric", "VisCE2Metric"]
