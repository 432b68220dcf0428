"""The claim-level reward (:class:`~capreward.scorers.claims.ClaimScorer`) as a caption reward.

Images or videos (videos are judged on the three-frame composite). The value is the scorer's F-beta of
claim precision and reference-claim recall (precision alone when a sample has no references and the
inventory is off), in [0, 1]; both parts and the claim count are logged as sub-scores
(``precision``, ``recall``, ``n_claims``). The injection guard is on by default, as for the other judge
rewards. Per-claim verdicts with their caption spans are logged at DEBUG and kept on
:attr:`ClaimsReward.last_result` for a report's flag view.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import SampleError
from ..scorers.claims import ClaimsResult
from .base import GroupScores
from .hooks import RewardHooks
from .metric_reward import MetricReward

log = logging.getLogger(__name__)


#: What a claims reward's value is: the F-score, or one side of it.
PARTS = ("f", "precision", "recall")


class ClaimsHooks(RewardHooks):
    """The claims reward: the ``part`` (F-score, precision or recall) of the
    :class:`~capreward.scorers.claims.ClaimScorer` result; sub-scores ``precision``, ``recall`` and
    ``n_claims``, ``false_claims`` (the claims the judge does not verify: with ``n_claims`` the verdict a
    composite's verifier reads); the last result is kept on the reward's ``last_result``."""

    verdict_metrics = ("n_claims", "false_claims")

    def options(self, *, part: str = "f") -> dict[str, Any]:
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        return {"part": part}

    def configure(self, reward) -> None:
        reward.last_result = None

    def metric_names(self, reward) -> tuple[str, ...]:
        """``precision``, ``recall`` (NaN without reference claims), ``n_claims`` and ``false_claims``."""
        return ("precision", "recall", "n_claims", "false_claims")

    def score_group(self, reward, captions, visuals, kind, references, visual_ids) -> GroupScores:
        if kind not in ("image", "video"):
            reason = SampleError(None, "input", "", f"claims scores images or videos, got a {kind or 'sample without visual'}")
            return GroupScores(scores=[None] * len(captions), reasons=[reason] * len(captions))
        ids = visual_ids if kind == "image" and visual_ids and all(visual_ids) else None
        result = reward.scorer.score(captions, **{f"{kind}s": visuals}, references=references, image_ids=ids)
        reward.last_result = result
        for i, verdicts in enumerate(result.claims):
            for v in verdicts:
                log.debug("claims sample %d: [%d, %d) %r p=%.3f", i, v.start, v.end, v.text, v.p)
        values = {"f": result.score, "precision": result.precision, "recall": result.recall}[reward.part]
        scores = [None if math.isnan(v) else float(v) for v in values.tolist()]
        if reward.part == "recall":
            result.error = [e or (None if s is not None else SampleError(i, "input", "", "no reference claims for the recall side"))
                            for i, (e, s) in enumerate(zip(result.error, scores))]
        metrics = {
            "precision": [float(v) for v in result.precision],
            "recall": [float(v) for v in result.recall],
            "n_claims": [float(v) for v in result.n_claims],
            "false_claims": [float(v) for v in result.false_claims] if result.false_claims is not None
            else [math.nan] * len(captions),
        }
        reasons = [None if s is not None else e for s, e in zip(scores, result.error)]
        return GroupScores(scores=scores, reasons=reasons, metrics=metrics)


class ClaimsReward(MetricReward):
    """Claim precision / coverage F-score as a reward.

    ``backend`` and the other :class:`~capreward.scorers.claims.ClaimScorer` options (``beta``,
    ``max_claims``, ``inventory``, ``splitter``, ...) go to the scorer, or pass a built ``scorer``.
    References (the ``references`` column) give the recall side; without them, ``inventory=True`` uses
    the judge's own inventory of the visual. ``part``: the value is the F-score (``"f"``, default),
    ``"precision"`` or ``"recall"`` alone, so the two sides can be separate TRL rewards, normalised apart
    (GDPO; :mod:`capreward.recipes.dense`); rewards sharing one ``scorer`` ask the judge once (its
    verdict cache answers the second).

    Examples:
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.rewards.claims import ClaimsReward
        >>> from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge
        >>> reward = ClaimsReward(backend=LocalChatJudge(tiny_claim_judge()))
        >>> image = claim_image("red", "green")
        >>> values = reward(None, ["the background is red.", "the background is blue."], image=[image, image])
        >>> values[0] > values[1]
        True
    """

    __name__ = "claims"
    metric = "claims"
    PARTS = PARTS
    last_result: ClaimsResult | None = None
