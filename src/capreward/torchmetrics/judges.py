"""torchmetrics ``Metric`` classes for the chat-judge metrics: VisCE² and G-VEval, the generic
:class:`~capreward.torchmetrics.RegisteredMetric` fixed to each.

Both follow :class:`~capreward.torchmetrics.metrics.CaptionMetric`: per-caption rows in list states
(synced with ``dist_reduce_fx="cat"``), the judge backend held by reference (never in ``state_dict``),
empty captions not sent to the judge. Scores are on 0..100; samples the judge could not score (a failed
request, an unreadable visual, an answer without a score) are NaN and left out of the mean, and the
``"scored"`` column (1 or 0) gives the rate of scored samples.
"""

from __future__ import annotations

from .metrics import RegisteredMetric


class VisCE2Metric(RegisteredMetric):
    """VisCE² as a torchmetrics Metric (images; higher is better, 0..100).

    Columns: ``score`` (the first integer of the judge's answer; 0 when it wrote none, as in the paper;
    NaN when the request failed or the integer is above 100), ``empty``, ``scored``, ``parsed`` (the
    integer written, NaN when none) and with ``expected=True`` ``expected`` (the expected score from the
    token distribution). Give ``backend`` (any
    `JudgeBackend`) and any other `VisCE2` option as a keyword (``max_tokens=``; ``scorer_kwargs=``, a
    dict of them, still works), or a configured ``scorer``.

    Examples:
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red")                # a fixed synthetic image
        >>> from capreward.torchmetrics import VisCE2Metric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = VisCE2Metric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    metric = "visce2"


class GVEvalMetric(RegisteredMetric):
    """G-VEval as a torchmetrics Metric (0..100, higher is better).

    ``mode``: "ref-free" (visuals), "ref-only" (references; visuals optional) or "combined" (both);
    ``visual``: "image" or "video" (the three-frame composite); ``accr``: also the four ACCR columns
    (video only). Columns: ``score``, ``empty``, ``scored``, ``parsed`` (the integer written after the
    score marker), and with ACCR ``accuracy``,
    ``completeness``, ``conciseness``, ``relevance``. Give ``backend`` and any other `GVEval` option as a
    keyword (``scorer_kwargs=``, a dict of them, still works), or a configured ``scorer``.

    Examples:
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red")                # a fixed synthetic image
        >>> from capreward.torchmetrics import GVEvalMetric
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> metric = GVEvalMetric(LocalChatJudge(tiny_vlm_judge()))
        >>> metric.update(["a red square"], [red])
        >>> bool(0 <= metric.compute() <= 100)
        True
    """

    metric = "gveval"


__all__ = ["GVEvalMetric", "VisCE2Metric"]
