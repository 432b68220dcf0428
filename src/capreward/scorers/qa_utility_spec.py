"""The QA-utility reward's spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.qa_utility`."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, JobFlag, MetricSpec, Option, register


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``n_questions`` (questions asked) and ``answers`` (P(correct option) per question)."""
    return ("n_questions", "answers")


def scores_questions_alone(config: Mapping[str, Any]) -> bool:
    """A sample that brings its questions needs no visual (one is needed only to write questions)."""
    return False


SPEC = register(MetricSpec(
    name="qa_utility",
    aliases=("qa", "caprl"),
    title="QA utility",
    summary="A text-only judge answers multiple-choice questions about the visual from the caption alone; "
            "the score is its expected accuracy.",
    paper="Xing et al., CapRL: Stimulating Dense Image Caption Capabilities via Reinforcement Learning, 2025",
    released_code="https://github.com/InternLM/CapRL",
    scorer="capreward.scorers.qa_utility:QAUtility",
    sub_scores=sub_scores,
    value_range=(0.0, 1.0),
    higher_is_better=True,
    visuals=("image", "video"),  # only to write questions for samples that bring none
    references="none",
    shares=None,
    uses_idf=False,
    backbone=None,
    judge_backend=True,  # its text judge may be the judge server
    text_judge=True,
    needs_visual=scores_questions_alone,
    options=(
        Option("normalise", True, "P(correct letter) over the option letters' total (False: over the vocabulary)"),
        Option("max_questions", 16, "questions asked per sample"),
        Option("question_backend", None, "a VLM that writes questions for samples without them (cached per visual)"),
    ),
    deviations=(
        Deviation("the expected accuracy from the answer distribution, where CapRL samples answers and averages",
                  None),
    ),
    position=90,
    sub_score_kinds={"n_questions": "number", "answers": "data"},
    job_flags=(JobFlag("qa_model", ("--qa-model",), "qa_utility's text-only judge: a causal LM name or directory "
                       "(default: the judge server); questions come from each row's 'questions', else the chat "
                       "judge writes them",
                       record="model", adapters=True),),
    row_inputs=("questions",),
))
