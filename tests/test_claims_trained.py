"""Both sides of the claim reward on the tiny *trained* claim judge (no scripted judge), through
:class:`~capreward.rewards.claims.ClaimsReward` on held-out images of the claim world:

- precision (the hallucination side): a caption with one hallucinated claim scores below the same
  caption without it; the judge's exact P(yes) verifies each claim against the image;
- coverage (the recall side): a caption missing a reference claim scores below the complete one, with
  the reference claims either given (``references``) or listed by the judge itself from the image
  (``inventory=True``: the judge writes "the background is B. there is a P patch." and each listed fact
  is matched against the caption, ``coverage="lexical"``).

The numbers go into the assertion messages (``-s`` prints them too)."""

from __future__ import annotations

import random

import pytest

from capreward.judges import LocalChatJudge
from capreward.rewards.claims import ClaimsReward
from capreward.scorers.claims import ClaimScorer
from capreward.testing.tiny_claim_judge import COLOURS, claim_image, inventory_answer, tiny_claim_judge
from fixtures_llava import one_torch_thread  # noqa: F401

N_IMAGES = 4


@pytest.fixture(scope="module")
def backend():
    return LocalChatJudge(tiny_claim_judge(), batch_size=32)


def held_out(n: int = N_IMAGES) -> list[tuple[str, str, object]]:
    """``n`` (background, patch, image) triples the judge never trained on (its own seeds differ)."""
    rng = random.Random("claims-trained-held-out")
    out = []
    for _ in range(n):
        background = rng.choice(COLOURS)
        patch = rng.choice([c for c in COLOURS if c != background])
        out.append((background, patch, claim_image(background, patch, rng)))
    return out


def absent(background: str, patch: str) -> str:
    return next(c for c in COLOURS if c not in (background, patch))


def parts(out, i: int) -> str:
    return (f"reward {out.values[i]:.4f} (precision {out.metrics['precision'][i]:.4f}, "
            f"recall {out.metrics['recall'][i]:.4f})")


def test_a_hallucinated_claim_scores_below_the_same_caption_without_it(backend):
    reward = ClaimsReward(scorer=ClaimScorer(backend))  # no references: the value is the precision
    lines = []
    for background, patch, image in held_out():
        complete = inventory_answer(background, patch)
        hallucinated = f"{complete} a {absent(background, patch)} ball."
        out = reward.compute(None, [complete, hallucinated], image=[image, image])
        verdicts = reward.last_result.claims
        line = (f"{background}/{patch}: complete {parts(out, 0)}; + hallucinated claim {parts(out, 1)}; "
                f"P(yes) of the hallucinated claim {verdicts[1][2].p:.2e}")
        lines.append(line)
        assert out.values[1] < out.values[0], line
        assert verdicts[1][2].p < min(v.p for v in verdicts[0]), line  # the judge doubts that claim most
        assert [v.p for v in verdicts[1][:2]] == pytest.approx([v.p for v in verdicts[0]], abs=1e-6), line
    print("\n".join(lines))


@pytest.mark.parametrize("source", ["references", "inventory"])
def test_a_caption_missing_a_reference_claim_scores_below_a_complete_one(backend, source):
    options = {"coverage": "lexical", "inventory": source == "inventory"}
    reward = ClaimsReward(scorer=ClaimScorer(backend, **options))
    lines = []
    for background, patch, image in held_out():
        complete = inventory_answer(background, patch)
        partial = f"the background is {background}."
        refs = {"references": [[complete]] * 2} if source == "references" else {}
        out = reward.compute(None, [complete, partial], image=[image, image], **refs)
        line = f"{source} {background}/{patch}: complete {parts(out, 0)}; missing the patch {parts(out, 1)}"
        lines.append(line)
        assert out.metrics["recall"] == [1.0, 0.5], line  # two reference facts, the partial caption states one
        assert [v.claim for v in reward.last_result.coverage[0]] == [f"the background is {background}",
                                                                     f"there is a {patch} patch"], line
        assert out.values[1] < out.values[0], line
    print("\n".join(lines))


def hack_captions(background: str, patch: str) -> list[str]:
    """Run-on colour lists for one thing whose *last* colour is right (the hack GRPO found against the
    judge trained on one-colour claims only, which read a claim by its last colour): the exact seed-1
    pattern "the background is X Y X Y Z patch." and shorter lists, each one claim for the splitter."""
    a = absent(background, patch)
    return [f"the background is {a} {patch} {a} {patch} {background} patch.",
            f"the background is {a} {patch} {background}.",
            f"there is a {a} {background} {patch} patch.",
            f"there is a {background} {patch} patch.",
            f"the background is {patch} {background}."]


def test_run_on_colour_lists_score_as_unverified(backend):
    reward = ClaimsReward(scorer=ClaimScorer(backend))  # the value is the precision
    lines = []
    images = held_out() + [("yellow", "red", claim_image("yellow", "red", random.Random("claims-seed1-hack")))]
    for background, patch, image in images:
        honest = inventory_answer(background, patch)
        hacks = hack_captions(background, patch)
        if (background, patch) == ("yellow", "red"):  # the exact caption GRPO wrote on seed 1
            hacks.append("the background is blue red blue red yellow patch.")
        out = reward.compute(None, [honest, *hacks], image=[image] * (1 + len(hacks)))
        claims = reward.last_result.claims
        line = (f"{background}/{patch}: honest {out.values[0]:.4f}; "
                + "; ".join(f"{h!r} {v:.2e} ({len(c)} claim(s))" for h, v, c in zip(hacks, out.values[1:], claims[1:])))
        lines.append(line)
        assert out.values[0] > 0.99, line
        for value, verdicts in zip(out.values[1:], claims[1:]):
            assert len(verdicts) == 1, line  # one claim for the rule splitter: the judge must see through it
            assert verdicts[0].p < 0.05, line
            assert value == 0.5, line  # one false claim: the price of one (claim_cost 0.5)
    print("\n".join(lines))
