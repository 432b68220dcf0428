"""torchmetrics ``Metric`` classes for the chat-judge metrics: VisCE² and G-VEval.

Both follow :class:`~capreward.torchmetrics.metrics.CaptionMetric`: per-caption rows in list states
(synced with ``dist_reduce_fx="cat"``), the judge backend held by reference (never in ``state_dict``),
empty captions not sent to the judge. Scores are on 0..100; samples the judge could not score (a failed
request, an unreadable visual, an answer without a score) are NaN and left out of the mean, and the
``"scored"`` column (1 or 0) gives the rate of scored samples.
"""

from __future__ import annotations

from typing import Any

import torch

from .metrics import CaptionMetric


def _scored(score: torch.Tensor) -> torch.Tensor:
    return (~torch.isnan(score)).float()


class VisCE2Metric(CaptionMetric):
    """VisCE² as a torchmetrics Metric (images; higher is better, 0..100).

    Columns: ``score`` (the first integer of the judge's answer; 0 when it wrote none, as in the paper;
    NaN when the request failed), ``empty``, ``scored``, and with ``expected=True`` ``expected`` (the
    expected score from the token distribution). Give ``backend`` (any
    `JudgeBackend`; further keyword arguments of
    `VisCE2` go in ``scorer_kwargs``) or a configured ``scorer``.

    Example:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward.callbacks import VisCE2Metric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = VisCE2Metric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    default_name = "visce2"
    judge_text = True
    plot_lower_bound = 0.0
    plot_upper_bound = 100.0

    def __init__(
        self,
        backend: Any = None,
        *,
        scorer: Any = None,
        expected: bool = False,
        scorer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        if (backend is None) == (scorer is None):
            raise ValueError("give either backend= or scorer=")
        if scorer is None:
            from ..scorers.visce2 import VisCE2

            scorer = VisCE2(backend, expected=expected, **(scorer_kwargs or {}))
        self.columns = ("score", "empty", "scored") + (("expected",) if scorer.expected else ())
        super().__init__(scorer, visual="image", **kwargs)

    def _check_mode(self, has_visuals, has_refs):
        if not has_visuals or has_refs:
            raise ValueError(f"{self.name}: VisCE² takes one image per caption and no references")
        super()._check_mode(has_visuals, has_refs)

    def _score_rows(self, candidates, visuals, references, visual_ids):
        res = self.scorer.score(candidates, visuals, image_ids=visual_ids if visual_ids and all(visual_ids) else None)
        score = torch.as_tensor(res.score, dtype=torch.float32)
        self._log_unscored(candidates, score.tolist(), res.error)
        cols = {"score": score, "scored": _scored(score)}
        if res.expected is not None:
            cols["expected"] = torch.as_tensor(res.expected, dtype=torch.float32)
        return self._row_tensor(cols, len(candidates))

    def _parts(self, has_visuals, has_refs):
        return [c for c in ("score", "expected") if c in self.columns]


class GVEvalMetric(CaptionMetric):
    """G-VEval as a torchmetrics Metric (0..100, higher is better).

    ``mode``: "ref-free" (visuals), "ref-only" (references; visuals optional) or "combined" (both);
    ``visual``: "image" or "video" (the three-frame composite); ``accr``: also the four ACCR columns
    (video only). Columns: ``score``, ``empty``, ``scored``, and with ACCR ``accuracy``,
    ``completeness``, ``conciseness``, ``relevance``. Give ``backend`` (plus ``scorer_kwargs`` for
    `GVEval`) or a configured ``scorer``.

    Example:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward.callbacks import GVEvalMetric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = GVEvalMetric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    default_name = "gveval"
    judge_text = True
    plot_lower_bound = 0.0
    plot_upper_bound = 100.0
    _ACCR = ("accuracy", "completeness", "conciseness", "relevance")

    def __init__(
        self,
        backend: Any = None,
        *,
        scorer: Any = None,
        mode: str = "ref-free",
        accr: bool = False,
        visual: str | None = "image",
        scorer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        if (backend is None) == (scorer is None):
            raise ValueError("give either backend= or scorer=")
        if scorer is None:
            from ..scorers.gveval import GVEval

            scorer = GVEval(backend, mode=mode, accr=accr, **(scorer_kwargs or {}))
        if scorer.accr and visual != "video":
            raise ValueError("G-VEval's ACCR prompts are for video: use visual='video'")
        self.columns = ("score", "empty", "scored") + (self._ACCR if scorer.accr else ())
        super().__init__(scorer, visual=visual, **kwargs)

    def _check_mode(self, has_visuals, has_refs):
        mode = self.scorer.mode
        if mode != "ref-only" and not has_visuals:
            raise ValueError(f"{self.name}: G-VEval mode {mode!r} needs a visual for every caption")
        if mode != "ref-free" and not has_refs:
            raise ValueError(f"{self.name}: G-VEval mode {mode!r} needs references for every caption")
        super()._check_mode(has_visuals, has_refs)

    def _score_rows(self, candidates, visuals, references, visual_ids):
        key = "videos" if self.visual == "video" else "images"
        res = self.scorer.score(candidates, references=references, **{key: visuals})
        score = torch.as_tensor(res.score, dtype=torch.float32)
        self._log_unscored(candidates, score.tolist(), res.error)
        cols = {"score": score, "scored": _scored(score)}
        if self.scorer.accr:
            for name in self._ACCR:
                cols[name] = torch.as_tensor(getattr(res, name), dtype=torch.float32)
        return self._row_tensor(cols, len(candidates))

    def _parts(self, has_visuals, has_refs):
        return [c for c in self.columns if c not in ("empty", "scored")]


__all__ = ["GVEvalMetric", "VisCE2Metric"]
