"""The QA-utility reward (:class:`~capreward.scorers.qa_utility.QAUtility`, CapRL's reward) as a caption reward.

The value is the expected accuracy in [0, 1] of a text-only judge answering the sample's multiple-choice
questions from the caption alone. Questions come from a dataset column (``questions_column``, default
``"questions"``: per sample a list of ``{"question", "options", "answer"}``, or JSON text of one), or,
for samples without them, are written once per visual by the scorer's ``question_backend``. Sub-score:
``n_questions``. The injection guard is on by default, as for the other judge rewards.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..scorers.qa_utility import QAUtility
from .base import CaptionReward, GroupScores, RewardOutput


class QAUtilityReward(CaptionReward):
    """Expected QA accuracy from the caption alone, as a reward.

    ``backend``, ``question_backend`` and the other :class:`~capreward.scorers.qa_utility.QAUtility`
    options go to the scorer, or pass a built ``scorer``. Visuals are only needed for samples without
    questions.

    Example::

        >>> from capreward.rewards.qa_utility import QAUtilityReward
        >>> from capreward.testing.tiny_qa_judge import colour_questions, qa_backend
        >>> reward = QAUtilityReward(backend=qa_backend())
        >>> qs = colour_questions("red", "green")
        >>> v = reward(None, ["the background is red. there is a green patch.", "a photo"], questions=[qs, qs])
        >>> v[0] > v[1]
        True
    """

    __name__ = "qa_utility"
    guard_injection = True
    needs_visual = False

    def __init__(self, *, questions_column: str = "questions", **kwargs: Any):
        super().__init__(**kwargs)
        self.questions_column = questions_column
        self._questions: list[Any] | None = None

    def _build(self) -> QAUtility:
        return QAUtility(**self.scorer_kwargs)

    def value_range(self) -> tuple[float, float]:
        return (0.0, 1.0)

    def metric_names(self) -> tuple[str, ...]:
        return ("n_questions", *super().metric_names())

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        questions = kwargs.get(self.questions_column)
        if questions is not None and len(questions) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(questions)} entries in {self.questions_column!r}")
        self._questions = list(questions) if questions is not None else None
        try:
            return super().compute(prompts, completions, **kwargs)
        finally:
            self._questions = None

    def score_group(self, captions, visuals, kind, references, visual_ids) -> GroupScores:
        rows = self._rows(captions)
        questions = [self._questions[r] if self._questions is not None and r is not None else None for r in rows]
        visual_kw = {f"{kind}s": visuals} if kind in ("image", "video") and visuals is not None else {}
        if any(q is None for q in questions) and not visual_kw:
            reason = f"qa_utility needs a {self.questions_column!r} column or a visual to write questions for"
            if all(q is None for q in questions):
                return GroupScores(scores=[None] * len(captions), reasons=[reason] * len(captions))
        result = self.scorer.score(captions, questions=questions, **visual_kw)
        scores = [None if math.isnan(v) else float(v) for v in result.score.tolist()]
        reasons = [None if s is not None else e for s, e in zip(scores, result.error)]
        return GroupScores(scores=scores, reasons=reasons, metrics={"n_questions": [float(v) for v in result.n_questions]})

    def _call_group(self, samples, rows, kind, with_refs) -> GroupScores:
        self._current_rows = list(rows)  # the completions of this group: their questions
        try:
            return super()._call_group(samples, rows, kind, with_refs)
        finally:
            self._current_rows = None

    def _rows(self, captions: list[str]) -> list[int]:
        rows = getattr(self, "_current_rows", None)
        if rows is None or len(rows) != len(captions):
            raise RuntimeError("qa_utility scores groups through compute()")
        return rows
