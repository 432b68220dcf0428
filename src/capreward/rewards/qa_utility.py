"""The QA-utility reward (:class:`~capreward.scorers.qa_utility.QAUtility`, CapRL's reward) as a caption reward.

The value is the expected accuracy in [0, 1] of a text-only judge answering the sample's multiple-choice
questions from the caption alone. Questions come from a dataset column (``questions_column``, default
``"questions"``: per sample a list of ``{"question", "options", "answer"}``, or JSON text of one), or,
for samples without them, are written once per visual by the scorer's ``question_backend``. Sub-score:
``n_questions``. The injection guard is on by default, as for the other judge rewards.
"""

from __future__ import annotations

from .metric_reward import MetricReward


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
