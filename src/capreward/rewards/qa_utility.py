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

from ..errors import NO_SCORE, SampleError
from .base import GroupScores, RewardOutput, clip_to_range
from .hooks import RewardHooks
from .metric_reward import MetricReward


class QAUtilityHooks(RewardHooks):
    """The QA-utility reward: reads the questions column (``questions_column``) beside the captions; the
    value is the scorer's expected accuracy; sub-score ``n_questions``. Samples that all bring questions
    need no visual (one scorer call for the batch)."""

    def options(self, *, questions_column: str = "questions") -> dict[str, Any]:
        return {"questions_column": questions_column}

    def configure(self, reward) -> None:
        pass

    # one call's questions and rows live per thread (the reward's ``_calls``): veRL's naive manager and
    # the server call one reward from several threads at once, and one call's questions must never
    # answer another's captions
    @staticmethod
    def _questions(reward) -> list[Any] | None:
        return getattr(reward._calls, "questions", None)

    def metric_names(self, reward) -> tuple[str, ...]:
        return ("n_questions",)

    def compute(self, reward, prompts: Sequence[Any] | None, completions: Sequence[Any], kwargs) -> RewardOutput:
        questions = kwargs.get(reward.questions_column)
        if questions is not None and len(questions) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(questions)} entries in {reward.questions_column!r}")
        reward._calls.questions = list(questions) if questions is not None else None
        try:
            return super().compute(reward, prompts, completions, kwargs)
        finally:
            reward._calls.questions = None

    def score_group(self, reward, captions, visuals, kind, references, visual_ids) -> GroupScores:
        rows = self._rows(reward, captions)
        questions = [self._questions(reward)[r] if self._questions(reward) is not None and r is not None else None for r in rows]
        visual_kw = {f"{kind}s": visuals} if kind in ("image", "video") and visuals is not None else {}
        if any(q is None for q in questions) and not visual_kw:
            reason = SampleError(None, "input", "",
                                 f"qa_utility needs a {reward.questions_column!r} column or a visual to write questions for")
            if all(q is None for q in questions):
                return GroupScores(scores=[None] * len(captions), reasons=[reason] * len(captions))
        result = reward.scorer.score(captions, questions=questions, **visual_kw)
        scores = [None if math.isnan(v) else float(v) for v in result.score.tolist()]
        reasons = [None if s is not None else e for s, e in zip(scores, result.error)]
        return GroupScores(scores=scores, reasons=reasons, metrics={"n_questions": [float(v) for v in result.n_questions]})

    def score_inputs(self, reward, inputs) -> RewardOutput:
        """Samples that all bring questions need no visual: one scorer call for the batch (with the
        injection guard and the caption reading of the base class); otherwise the base class's grouping
        by visual, questions written for the samples without them."""
        if self._questions(reward) is None or any(q is None for q in self._questions(reward)):
            return super().score_inputs(reward, inputs)
        n = len(inputs)
        injection = reward._injection_guard(inputs.samples)
        inputs, reading = reward._read(inputs)
        values: list[float | None] = [None] * n
        reasons: list[str | None] = [s.error for s in inputs.samples]
        rows = []
        for i, s in enumerate(inputs.samples):
            if s.error is None and injection[i] is not None:
                values[i] = reward.value_range()[0]
            elif s.error is None:
                rows.append(i)
        metrics: dict[str, list[float]] = {"n_questions": [math.nan] * n}
        if rows:
            with reward._lock:
                result = reward.scorer.score([inputs.samples[i].caption for i in rows],
                                             questions=[self._questions(reward)[i] for i in rows])
            for j, i in enumerate(rows):
                v = float(result.score[j])
                metrics["n_questions"][i] = float(result.n_questions[j])
                if math.isnan(v):
                    reasons[i] = SampleError.of(result.error[j] or SampleError(i, "scorer", "", NO_SCORE), i,
                                                f"completions[{i}]")
                else:
                    values[i] = v
        if reward.injection_guard:
            metrics["injection"] = [math.nan if s.error is not None else float(r is not None)
                                    for s, r in zip(inputs.samples, injection)]
        out = RewardOutput(values, reasons, metrics, injection=injection if reward.injection_guard else [], reading=reading)
        return reward.with_metric_names(clip_to_range(out, reward.value_range()))

    def call_group(self, reward, samples, rows, kind, with_refs) -> GroupScores:
        reward._calls.rows = list(rows)  # the completions of this group: their questions
        try:
            return super().call_group(reward, samples, rows, kind, with_refs)
        finally:
            reward._calls.rows = None

    @staticmethod
    def _rows(reward, captions: list[str]) -> list[int]:
        rows = getattr(reward._calls, "rows", None)
        if rows is None or len(rows) != len(captions):
            raise RuntimeError("qa_utility scores groups through compute()")
        return rows


class QAUtilityReward(MetricReward):
    """Expected QA accuracy from the caption alone, as a reward.

    ``backend``, ``question_backend`` and the other :class:`~capreward.scorers.qa_utility.QAUtility`
    options go to the scorer, or pass a built ``scorer``. Visuals are only needed for samples without
    questions.

    Examples:
        >>> from capreward.rewards.qa_utility import QAUtilityReward
        >>> from capreward.testing.tiny_qa_judge import colour_questions, qa_backend
        >>> reward = QAUtilityReward(backend=qa_backend())
        >>> qs = colour_questions("red")
        >>> v = reward(None, ["a red ball.", "a photo"], questions=[qs, qs])
        >>> v[0] > v[1]
        True
    """

    __name__ = "qa_utility"
    metric = "qa_utility"
