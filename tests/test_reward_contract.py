"""The reward contract (docs/design/reward-contract.md): a right caption above a guess, a guess above a
hedge, every wrong colour paid alike and a caption that says nothing no more than a wrong guess, on the
demo's reward and the penalty alone, measured on held-out images of the colour world with the trained
colour CLIP. On 5b8107d the demo's reward broke it 26 times ("image" 0.54 on red against -1.38 for "a
yellow image"; "green blue" 1.89 on green against a guess's 1.19; wrong colours 1.2 apart on red)."""

from __future__ import annotations

import pytest

from capreward.cli import demo
from capreward.rewards import CLIPScoreReward, CompositeReward, Guards, HallucinationPenalty
from capreward.testing.colour_task import TASK_COLOURS, colour_rows
from reward_contract import VAGUE, colour_matrix, contract_captions, contract_violations
from capreward.testing.trained_clip import trained_clip_path

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)


@pytest.fixture(scope="module")
def clip():
    return str(trained_clip_path())


@pytest.fixture(scope="module")
def held_out():
    return colour_rows(16, 5000)  # four images of each colour, never calibrated on


def test_contract_checker_finds_each_kind_of_violation():
    """The checker itself, on a hand-written matrix: graded wrong colours, a paid hedge, a paid vague caption."""
    from reward_contract import ColourMatrix

    captions = contract_captions()
    values = {n: {c: -1.0 for c in TASK_COLOURS} for n in captions}
    for c in TASK_COLOURS:
        values[f"single:{c}"][c] = 1.0
    assert contract_violations(ColourMatrix(captions, values)) == []
    values["single:green"]["red"] = -0.5  # a wrong colour paid more than the others
    values["hedge:green+blue"]["green"] = 0.2  # above a guess's (1 - 1) / 2 = 0
    values["vague:0"]["blue"] = -0.9  # "image" above the wrong guesses
    bad = contract_violations(ColourMatrix(captions, values))
    assert len(bad) == 3, bad
    assert any(b.startswith("red: wrong colours are paid unalike") for b in bad)
    assert any(b.startswith("green: the hedge 'green blue'") for b in bad)
    assert any(b.startswith("blue: the vague 'image'") for b in bad)


def test_demo_reward_follows_the_contract(clip, held_out):
    reward = demo.build_reward(clip, colour_rows(16, 3000))
    m = colour_matrix(reward, held_out)
    assert contract_violations(m) == [], m.format()
    # and so no image-blind caption is an attractor: the best caption said on every image earns less
    # than guessing within the image's colour family
    blind = max(sum(row.values()) / 4 for row in m.values.values())
    family = sum((m.values[f"single:{c}"][c] + m.values[f"single:{d}"][c]) / 2
                 for c, d in (("red", "yellow"), ("yellow", "red"), ("green", "blue"), ("blue", "green"))) / 4
    assert blind < family, (blind, family)


def test_penalty_alone_follows_the_contract(clip, held_out):
    """The penalty alone: 0 right, -claim_cost for a hedge or a wrong colour, -1 for nothing said."""
    penalty = HallucinationPenalty(model=clip)
    rows = colour_rows(32, 3000)
    penalty.calibrate([f"a {r['colour']} image" for r in rows], [r["image"] for r in rows], kind="image")
    m = colour_matrix(penalty, held_out)
    assert contract_violations(m) == [], m.format()
    for k in range(len(VAGUE)):
        assert all(v == -1.0 for v in m.values[f"vague:{k}"].values())
    assert m.values["single:red"]["green"] == m.values["single:yellow"]["green"] == -0.5


def test_composite_gate_floors_every_other_component_for_an_unverified_caption(clip):
    """By hand: an unverified caption (a flagged word, or none) gets CLIP-S's floor (0) plus its penalty;
    a verified one CLIP-S's value plus 0; ``verifier=None`` is the plain weighted sum."""
    from capreward.testing import colour_image

    red = colour_image("red")
    clip_s = CLIPScoreReward(model=clip)
    penalty = HallucinationPenalty(model=clip)
    captions = ["a red image.", "a blue image.", "an image.", "a red blue image."]
    c = clip_s(None, captions, image=[red] * 4)
    out = penalty.compute(None, captions, image=[red] * 4)
    assert out.metrics["unsupported_tokens"] == [0.0, 1.0, 0.0, 1.0] and out.metrics["content_tokens"] == [1.0, 1.0, 0.0, 2.0]
    gated = CompositeReward([(clip_s, 1.0), (penalty, 0.5)], guards=None)
    assert gated.verifier == 1 and "verified" in gated.metric_names()
    lo = clip_s.value_range()[0]
    expected = [c[0], lo - 0.25, lo - 0.5, lo - 0.25]
    assert gated(None, captions, image=[red] * 4) == pytest.approx(expected)
    plain = CompositeReward([(clip_s, 1.0), (penalty, 0.5)], guards=None, verifier=None)
    assert plain(None, captions, image=[red] * 4) == pytest.approx([v + 0.5 * p for v, p in zip(c, out.values)])
    named = CompositeReward([(clip_s, 1.0), (penalty, 0.5)], guards=None, verifier="hallucination")
    assert named.verifier == 1
    with pytest.raises(ValueError, match="no verdict"):
        CompositeReward([(clip_s, 1.0), (penalty, 0.5)], verifier="clip_s")
    with pytest.raises(ValueError, match="not a component label"):
        CompositeReward([(clip_s, 1.0), (penalty, 0.5)], verifier="nope")
    # a plain function without a range cannot be floored: auto leaves the gate off, naming it is an error
    assert CompositeReward([(lambda prompts, completions, **kw: [0.0] * len(completions), 1.0), (penalty, 0.5)]).verifier is None
    with pytest.raises(ValueError, match="cannot gate"):
        CompositeReward([(lambda prompts, completions, **kw: [0.0] * len(completions), 1.0), (penalty, 0.5)],
                        verifier="hallucination")


def test_a_missing_verdict_closes_the_gate(clip, tmp_path):
    """A caption the verifier cannot score earns no more than one it scored and found false."""
    from capreward.testing import colour_image

    clip_s = CLIPScoreReward(model=clip)

    def broken(prompts, completions, **kwargs):
        return [None] * len(completions)

    broken.verdict_metrics = ("claims", "false_claims")
    comp = CompositeReward([(clip_s, 1.0), (broken, 0.5, (-1.0, 0.0))], guards=None)
    assert comp.verifier == 1
    value = comp(None, ["a red image."], image=[colour_image("red")])[0]
    assert value == pytest.approx(clip_s.value_range()[0] - 0.5)


@pytest.mark.slow
def test_scenes_composite_follows_the_contract():
    """The scenes composite (CLIP-S + penalty under model A, guards) on 100 held-out scenes: no wrong
    colour and no caption that says nothing earns what the right one or a wrong one does, and on average
    a hedge earns less than a guess (on 5b8107d "a picture." beat the wrong colour in 36 scenes). A
    mention without its colour ranks between right and wrong, a decision the docs show the cost of."""
    from reward_contract import scene_contract
    from scenes_world.clips import HELD_OUT, MODEL_A, scene_stream
    from scenes_world.evaluation import composite_reward, shared_clip_path

    composite, penalty = composite_reward(str(shared_clip_path(MODEL_A)), scene_stream(MODEL_A.data, 200))
    c = scene_contract(composite, scene_stream(HELD_OUT, 100))
    means, bad = c.means(), c.violations()
    assert bad["wrong >= right"] == 0 and bad["vague > wrong"] == 0, bad
    assert means["right"] > means["guess"] > means["hedge"] and means["wrong"] >= means["vague"], means
    assert means["right"] > means["omitted"] > means["wrong"], means  # the decided place of an omission
    p = scene_contract(penalty, scene_stream(HELD_OUT, 100))
    assert p.violations()["vague > wrong"] == 0 and p.means()["guess"] > p.means()["hedge"]
