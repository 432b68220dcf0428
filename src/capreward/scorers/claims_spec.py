"""The claim reward's spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.claims`."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, MetricSpec, Option, RewardPolicy, register

#: What a claims reward's value is: the F-score, or one side of it.
PARTS = ("f", "precision", "recall")


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``precision`` (1 - claim_cost x the doubt of the claims not verified; with ``claim_cost=None`` the mean
    verification probability), ``n_claims``, ``false_claims`` (the claims not verified), ``claims``
    (per-claim verdicts with spans); ``recall`` (the reference claims stated by the verified claims) with
    references or ``inventory=True``."""
    recall = bool(config.get("references")) or bool(config.get("inventory"))
    return ("precision",) + (("recall",) if recall else ()) + ("n_claims", "false_claims", "claims")


def value(config: Mapping[str, Any]) -> str:
    """A reward's value: the F-score (the headline), or with ``part`` one side of it."""
    return {"f": "score", "precision": "precision", "recall": "recall"}[config.get("part", "f")]


SPEC = register(MetricSpec(
    name="claims",
    aliases=("claim",),
    title="Claims",
    summary="A judge verifies each atomic claim of the caption against the visual (precision) and checks "
            "each reference claim for coverage (recall); the reward is their F-score.",
    paper="Ye et al., Painting with Words: Elevating Detailed Image Captioning with Benchmark and Alignment "
          "Learning (DCScore), ICLR 2025; Jing et al., FaithScore, 2023",
    released_code=None,
    scorer="capreward.scorers.claims:ClaimScorer",
    sub_scores=sub_scores,
    value_range=(0.0, 1.0),
    higher_is_better=True,
    visuals=("image", "video"),  # videos: the three-frame composite
    references="optional",
    shares="chat_judge",
    uses_idf=False,
    backbone="chat_judge",
    judge_backend=True,
    options=(
        Option("beta", 1.0, "weight of recall in the F-score"),
        Option("max_claims", 32, "claims verified per caption (claims past it count as unverified)"),
        Option("max_reference_claims", 32, "reference claims checked per sample"),
        Option("inventory", False, "without references, use the judge's own inventory of the visual for recall"),
        Option("splitter", "rules", "'rules' (deterministic splitter) or 'judge' (the judge lists the facts)"),
        Option("coverage", "judge", "'judge' (P(yes) that the caption's verified claims state a reference claim) "
                                    "or 'lexical' (content words matched against the verified claims, no judge "
                                    "call); a rejected claim covers nothing"),
        Option("normalise", True, "P(yes) normalised over yes+no (False: raw P(yes), VQAScore's reading)"),
        Option("claim_cost", 1.0, "precision = 1 - min(1, claim_cost * doubt of the claims not verified), whatever "
                                  "the length; None: the mean P(yes) over the claims (an average a long caption dilutes)"),
    ),
    deviations=(
        Deviation("claims come from a rule-based splitter, where DCScore and FaithScore have GPT-4 write them",
                  "splitter='judge'"),
        Deviation("verdicts are the judge's probability of yes, not a sampled yes/no answer", None),
        Deviation("recall asks the judge per reference claim whether the caption's verified claims state it "
                  "(a claim the judge rejects covers no reference fact); DCScore matches unit lists with GPT-4",
                  None),
    ),
    position=80,
    sub_score_kinds={"n_claims": "number", "false_claims": "number", "claims": "data"},
    value=value,
    reward_policy=RewardPolicy(
        options=(Option("part", "f", "the reward: 'f' (the F-score), 'precision' or 'recall' alone", PARTS),),
        verdict=("n_claims", "false_claims"),
    ),
))
