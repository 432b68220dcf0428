"""The claim-level reward (:class:`~capreward.scorers.claims.ClaimScorer`) as a caption reward.

Images or videos (videos are judged on the three-frame composite). The value is the scorer's F-beta of
claim precision and reference-claim recall (the reference claims stated by the claims the judge
verifies; precision alone when a sample has no references and the inventory is off), in [0, 1]; both
parts and the claim count are logged as sub-scores (``precision``, ``recall``, ``n_claims``). The injection guard is on by default, as for the other judge
rewards. Per-claim verdicts with their caption spans are logged at DEBUG and kept on
:attr:`ClaimsReward.last_result` for a report's flag view.
"""

from __future__ import annotations

from ..scorers.claims_spec import PARTS  # noqa: F401  (what the value may be: ``part``)
from .metric_reward import MetricReward


class ClaimsReward(MetricReward):
    """Claim precision / coverage F-score as a reward. The last group's
    :class:`~capreward.scorers.claims.ClaimsResult` (per-claim verdicts with their spans) is
    :attr:`last_result`.

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
