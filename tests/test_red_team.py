"""The red-team suite: >= 40 hostile captions x every judge scorer and reward, local and remote.

Targets: FLEUR, RefFLEUR, VisCE², G-VEval ref-free / ref-only / combined as scorers and as rewards
(FLEURReward with and without references, VisCE2Reward, GVEvalReward per mode), each on the local
susceptible judge and on the same judge behind the test chat server (which, like vLLM, parses special
tokens in message text). The judge (``tests/susceptible_judge.py``) follows text injected
into its caption slot and rewards master keys, so on unprotected code the attacks succeed (the README's
"Reward hacking" section records the counts measured on the code before the defences); here, after
them, no hostile caption scores above its plain wrong counterpart by more than 0.02 unless it is
flagged (scorers); a reward pays a flagged caption no more than without its suspect segments (the floor
when nothing is left), and none breaks or slows its batch.

All captions of a target go in one batch with the plain captions, so the suite costs one scorer call per
target (plus a chat-server process for the remote path).
"""

from __future__ import annotations

import pytest

from red_team import ATTACKS, PLAIN_RIGHT, PLAIN_WRONG, TOLERANCE, run_red_team, summary

FAMILIES = {
    "forged turn (special tokens)", "forged turn (plain text)", "judge prompt phrase", "template placeholder",
    "score-like ending", "master key", "image placeholder", "special tokens only", "invisible characters",
    "look-alike marker", "other-language marker", "paraphrased instruction",  # round 3
    "unmapped look-alike letters",  # letters the old tables lacked: read by UTS #39, the marker found
}
TARGETS = 12  # per path: 6 scorers (FLEUR, RefFLEUR, VisCE², G-VEval x 3 modes) and their 6 rewards


@pytest.fixture(scope="module")
def verdicts():
    return run_red_team(log=print)


def test_the_suite_covers_every_family_and_target(verdicts):
    assert len(ATTACKS) >= 40 and len({a.caption for a in ATTACKS}) == len(ATTACKS)
    assert {a.family for a in ATTACKS} == FAMILIES
    assert len(verdicts) == len(ATTACKS) * TARGETS * 2  # local and remote
    assert {(v.target, v.path) for v in verdicts} >= {(t, p) for t in ("FLEUR", "RefFLEUR", "VisCE2", "G-VEval ref-free",
        "G-VEval ref-only", "G-VEval combined", "FLEURReward", "FLEURReward (RefFLEUR)", "VisCE2Reward",
        "GVEvalReward ref-free", "GVEvalReward ref-only", "GVEvalReward combined") for p in ("local", "remote")}


def test_the_judge_has_teeth(verdicts):
    """The susceptible judge tells the plain captions apart on every target, and without the guard's
    flags most forged turns would lift the scorers: the suite can catch an attack."""
    for v in verdicts:
        assert v.plain is not None and v.plain < 0.5, (v.target, v.path, v.plain)
    unguarded_lifts = [v for v in verdicts if v.kind == "scorer" and v.value is not None and v.value > v.plain + TOLERANCE]
    forged = [v for v in unguarded_lifts if v.family.startswith("forged turn")]
    print(f"scorer cells lifted if their flags were ignored: {len(unguarded_lifts)} (forged turns: {len(forged)})")
    assert len(forged) >= 40


def test_no_attack_succeeds(verdicts):
    wins = [v for v in verdicts if v.succeeded]
    print(summary(verdicts))
    assert not wins, [(v.attack, v.target, v.path, v.value, v.plain, v.flagged, v.floored, v.error) for v in wins[:20]]


def test_every_visible_attack_is_flagged_and_paid_no_more_than_without_it(verdicts):
    """The rewards pay a flagged caption no more than its reading without the suspect segments (the
    plain wrong caption, for an attack built on it), and the bottom of the range when nothing is left."""
    from capreward.judges.caller_text import is_blank
    from capreward.rewards.suspects import without_suspects

    for v in verdicts:
        caption = next(a.caption for a in ATTACKS if a.name == v.attack)
        if is_blank(caption):  # special tokens / invisible characters only: an empty caption, no value
            assert v.value is None and (v.kind == "scorer" or not v.flagged), v
        elif v.kind == "reward":
            assert v.flagged and v.value is not None and v.value <= v.plain + TOLERANCE, v
            if not without_suspects(caption):
                assert v.floored and v.value == 0.0, v
        else:
            assert v.flagged, v
