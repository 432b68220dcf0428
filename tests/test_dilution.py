"""Every false claim priced, whatever the caption's length (#41 item 1): one hallucinated sentence after
80 honest ones costs at least 80 % of what it costs after 4, for each reward recommended for dense
captions (the hallucination penalty, the gated composite, the claims reward's precision and F-score),
and restating a claim already made, in other words, earns nothing. The published averages (CLIP-S,
EMScore) and the rewards' average modes (``claim_cost=None``) are measured beside them: they dilute, as
docs/design/reward-contract.md says. On 5b8107d the penalty's cost fell from 0.50 (n = 4) to 0.11
(n = 40) and the claim precision of 40 true claims and one false was 0.976."""

from __future__ import annotations

import random

import pytest

from capreward.rewards import CLIPScoreReward, CompositeReward, EMScoreReward, Guards, HallucinationPenalty
from capreward.testing import colour_image
from capreward.testing.trained_clip import trained_clip_path

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

#: Honest sentences about a red image, in the forms the colour CLIP knows (the colour word first).
RED = ("a red image.", "a red picture.", "red.", "a red photo.", "the image is red.")
FALSE = "a blue image."


def honest(n: int) -> str:
    return " ".join(RED[k % len(RED)] for k in range(n))


def costs(reward, image, ns=(4, 80)) -> dict[int, float]:
    """Per n, the reward of n honest sentences minus that of the same caption with one false sentence."""
    captions = [c for n in ns for c in (honest(n), honest(n) + " " + FALSE)]
    values = reward(None, captions, image=[image] * len(captions))
    assert None not in values, values
    return {n: values[2 * k] - values[2 * k + 1] for k, n in enumerate(ns)}


@pytest.fixture(scope="module")
def clip():
    return str(trained_clip_path())


@pytest.fixture(scope="module")
def red():
    return colour_image("red", random.Random("dilution"))


def test_penalty_and_gated_composite_price_a_false_sentence_whatever_the_length(clip, red):
    penalty = HallucinationPenalty(model=clip)
    p = costs(penalty, red)
    assert p[4] == p[80] == 0.5, p  # claim_cost: one false word, priced alone
    average = costs(HallucinationPenalty(model=clip, claim_cost=None), red)
    assert average[80] < 0.2 * average[4], average  # the fraction dilutes: 1/5 vs 1/81

    composite = CompositeReward([(EMScoreReward(model=clip), 1.0), (CLIPScoreReward(model=clip), 0.5),
                                 (HallucinationPenalty(model=clip), 0.5)], guards=Guards())
    c = costs(composite, red)
    assert c[80] >= 0.8 * c[4] > 0, c
    # the published averages the composite gates: CLIP-S alone dilutes
    s = costs(CLIPScoreReward(model=clip), red)
    assert s[80] < 0.5 * s[4], s
    print(f"cost of one false sentence after 4 / 80 honest ones: penalty {p[4]:.3f} / {p[80]:.3f}; "
          f"penalty as a fraction {average[4]:.3f} / {average[80]:.3f}; composite {c[4]:.3f} / {c[80]:.3f}; "
          f"CLIP-S {s[4]:.4f} / {s[80]:.4f}")


# ------------------------------------------------------------------------------ the claims reward
#: Claims the tiny claim judge verifies about a red background with a green patch (other wordings it
#: does not know and answers "no" to).
TRUE_CLAIMS = ("the background is red", "a red background", "there is a red background", "the whole background is red",
               "the background appears red", "there is a green patch", "the patch is green", "a green patch",
               "there is one green patch", "the patch appears green")


@pytest.fixture(scope="module")
def claims_setup():
    from capreward.judges import LocalChatJudge
    from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge

    backend = LocalChatJudge(tiny_claim_judge(), batch_size=32)
    return backend, claim_image("red", "green", random.Random("dilution-claims"))


def claim_caption(n: int, false: bool) -> str:
    sentences = [TRUE_CLAIMS[k % len(TRUE_CLAIMS)] for k in range(n)] + (["there is a blue ball"] if false else [])
    return ". ".join(sentences) + "."


@pytest.mark.parametrize("part", ["precision", "f"])
def test_claims_reward_prices_a_false_claim_whatever_the_length(claims_setup, part):
    from capreward.rewards.claims import ClaimsReward
    from capreward.scorers.claims import ClaimScorer

    backend, image = claims_setup
    refs = {"references": [["the background is red. there is a green patch."]] * 4} if part == "f" else {}
    out = {}
    for cost in (0.5, None):
        reward = ClaimsReward(scorer=ClaimScorer(backend, max_claims=128, coverage="lexical", claim_cost=cost), part=part)
        captions = [claim_caption(n, f) for n in (4, 80) for f in (False, True)]
        values = reward(None, captions, image=[image] * 4, **refs)
        verdicts = reward.last_result.claims
        assert all(v.p > 0.5 for v in verdicts[0] + verdicts[2]), "the honest claims are verified"
        out[cost] = {4: values[0] - values[1], 80: values[2] - values[3]}
    assert out[0.5][80] >= 0.8 * out[0.5][4] > 0, out
    if part == "precision":
        assert out[None][80] < 0.8 * out[None][4], out  # the average dilutes (80 sentences: 10 distinct claims)
    print(f"claims {part}: cost after 4 / 80 honest sentences: priced {out[0.5][4]:.3f} / {out[0.5][80]:.3f}, "
          f"average {out[None][4]:.3f} / {out[None][80]:.3f}")


def test_restating_a_true_claim_in_other_words_earns_nothing(claims_setup):
    """A false claim alone, then with 1 to 4 restatements of one true fact in other words: the priced
    precision does not move (on 5b8107d the average rose 0.05 -> 0.87 with restatements)."""
    from capreward.rewards.claims import ClaimsReward
    from capreward.scorers.claims import ClaimScorer

    backend, image = claims_setup
    restated = TRUE_CLAIMS[:5]  # five wordings of "the background is red"
    captions = [". ".join(["the background is blue", *restated[:k]]) + "." for k in range(5)]
    priced = ClaimsReward(scorer=ClaimScorer(backend), part="precision")(None, captions, image=[image] * 5)
    average = ClaimsReward(scorer=ClaimScorer(backend, claim_cost=None), part="precision")(None, captions, image=[image] * 5)
    assert priced == [0.5] * 5, priced
    assert average[4] > average[0] + 0.5, average  # what the average paid for restating
    print("precision with 0-4 restatements: priced", priced, "average", [round(v, 3) for v in average])
