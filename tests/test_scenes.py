"""The synthetic scenes world (experiments/scenes_world/world.py): generator determinism, the ground-truth judge on
hand-made scenes, and hard negatives that differ from the truth in exactly the intended slot."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scenes_world.world import (
    NEGATIVE_KINDS,
    Mention,
    Scene,
    SceneObject,
    hard_negative,
    judge,
    mean_judgement,
    parse_caption,
    random_scene,
    render_scene,
    sample_caption,
    scene_rows,
    true_caption,
)

O = SceneObject


def test_generator_is_deterministic_and_seeds_differ():
    a, b, c = scene_rows(12, 3), scene_rows(12, 3), scene_rows(12, 4)
    assert [r["scene"] for r in a] == [r["scene"] for r in b]
    assert all(np.array_equal(np.asarray(x["image"]), np.asarray(y["image"])) for x, y in zip(a, b))
    assert [r["scene"] for r in a] != [r["scene"] for r in c]
    rng1, rng2 = random.Random(5), random.Random(5)
    s = random_scene(rng1)
    assert s == random_scene(rng2)
    assert [sample_caption(s, rng1) for _ in range(5)] == [sample_caption(s, rng2) for _ in range(5)]


def test_scenes_cover_the_world():
    rows = scene_rows(300, 0)
    counts = {len(r["scene"].objects) for r in rows}
    assert counts == {1, 2, 3, 4}
    assert any(max(r["scene"].groups().values()) >= 2 for r in rows)  # counts above one occur
    for r in rows[:20]:
        assert r["image"].size == (64, 64) and r["image"].mode == "RGB"
        assert judge(r["scene"], r["caption"]).exact


def test_render_puts_the_colour_in_the_objects_cell():
    scene = Scene((O("square", "red", 0), O("circle", "blue", 3)))
    img = np.asarray(render_scene(scene, random.Random(0))).astype(int)
    top_left, bottom_right, top_right = img[8:24, 8:24], img[40:56, 40:56], img[:32, 32:]
    assert top_left[..., 0].mean() > 150 and top_left[..., 2].mean() < 100
    assert bottom_right[..., 2].mean() > 150 and bottom_right[..., 0].mean() < 100
    assert top_right.mean() < 80  # the empty cell is background


def test_invalid_scenes_are_refused():
    with pytest.raises(ValueError, match="share a cell"):
        Scene((O("square", "red", 0), O("circle", "blue", 0)))
    with pytest.raises(ValueError, match="1-4 objects"):
        Scene(())
    with pytest.raises(ValueError, match="unknown colour"):
        O("square", "mauve", 0)


def test_parse_reads_the_grammar_and_lists_the_rest():
    p = parse_caption("A photo depicts two red circles, a blue cross and squares on grass")
    assert p.mentions == (Mention(2, "red", "circle"), Mention(1, "blue", "cross"), Mention(2, None, "square"))
    assert p.unread == ("on", "grass")


def test_judge_on_hand_made_scenes():
    scene = Scene((O("circle", "red", 0), O("circle", "red", 1), O("cross", "blue", 3)))
    assert true_caption(scene) == "two red circles and a blue cross"
    right = judge(scene, "a blue cross and two red circles.")
    assert (right.count, right.shape, right.colour, right.binding, right.exact) == (True,) * 5
    assert (right.hallucinated, right.omitted, right.mentioned, right.present) == (0, 0, 3, 3)

    one_short = judge(scene, "a red circle and a blue cross")
    assert not one_short.count and one_short.shape and one_short.colour and one_short.binding and not one_short.exact
    assert (one_short.hallucinated, one_short.omitted) == (0, 1)

    swapped = judge(scene, "two blue circles and a red cross")  # binding swap
    assert swapped.count and swapped.shape and swapped.colour and not swapped.binding
    assert (swapped.hallucinated, swapped.omitted) == (3, 3)

    listed = judge(scene, "two red circles, a blue cross, a green square and a yellow circle")
    assert not listed.count and not listed.shape and not listed.colour
    assert (listed.hallucinated, listed.omitted, listed.mentioned) == (2, 0, 5)

    free = judge(scene, "two circles and a cross")  # colour-free: matches by shape, colour slot wrong
    assert free.count and free.shape and not free.colour and not free.binding and free.colour_free
    assert (free.hallucinated, free.omitted) == (0, 0)

    repeated = judge(scene, "two red circles and a blue cross and a blue cross")
    assert repeated.repeated and repeated.hallucinated == 1 and not repeated.count

    for empty in ("", "a photo of nothing"):
        j = judge(scene, empty)
        assert not any((j.count, j.shape, j.colour, j.binding, j.exact)) and j.omitted == 3 and j.mentioned == 0


@pytest.mark.parametrize("seed", range(4))
def test_hard_negatives_change_exactly_the_intended_slot(seed):
    rng = random.Random(seed)
    made = {k: 0 for k in NEGATIVE_KINDS}
    for r in scene_rows(150, seed):
        scene = r["scene"]
        truth = judge(scene, r["caption"])
        assert truth.exact
        for kind in NEGATIVE_KINDS:
            neg = hard_negative(scene, kind, rng)
            if neg is None:
                continue
            made[kind] += 1
            j = judge(scene, neg)
            assert not j.exact, (kind, neg)
            if kind == "count":
                assert j.shape and j.colour and j.binding and not j.count, neg
                assert (j.hallucinated > 0) != (j.omitted > 0), neg
            elif kind == "binding":
                assert j.count and j.shape and j.colour and not j.binding, neg
            elif kind == "missing":
                assert j.hallucinated == 0 and j.omitted > 0 and not j.count, neg
            elif kind == "extra":
                assert j.hallucinated == 1 and j.omitted == 0 and not j.count, neg
            elif kind == "colour":
                assert j.count and j.shape and not j.colour and not j.binding, neg
                assert j.hallucinated == j.omitted > 0, neg
            elif kind == "shape":
                assert j.count and j.colour and not j.shape and not j.binding, neg
                assert j.hallucinated == j.omitted > 0, neg
    assert all(v > 10 for v in made.values()), made


def test_mean_judgement_pools_objects():
    scene = Scene((O("circle", "red", 0), O("cross", "blue", 3)))
    m = mean_judgement([judge(scene, "a red circle and a blue cross"), judge(scene, "a red circle, a green square and a blue cross")])
    assert m["exact"] == 0.5 and m["hallucination"] == pytest.approx(1 / 5) and m["omission"] == 0.0
    assert m["objects"] == 2.5 and m["any_hallucination"] == 0.5


def test_best_of_n_takes_the_top_of_each_group_and_judges_it():
    from scenes_world.evaluation import Candidates, best_of_n

    scene = Scene((O("circle", "red", 0), O("cross", "blue", 3)))
    rows = [{"scene": scene}]
    right, extra, short, wrong = ("a red circle and a blue cross", "a red circle, a blue cross and a green square",
                                  "a red circle", "a red square and a blue cross")
    caps = [[extra, right, short, wrong]]
    cands = Candidates(captions=caps, values={"r": [[3.0, 2.0, 1.0, 0.0]]}, held_out=[[0.1, 0.2, 0.3, 0.4]])
    out = best_of_n(rows, cands, "r", ns=(1, 2, 4))
    assert out[1] == {**mean_judgement(judge(scene, c) for c in caps[0]), "held_out": 0.25, "reward": 1.5}
    assert out[2]["reward"] == 2.0 and out[2]["held_out"] == pytest.approx(0.2)  # extra (3.0) and short (1.0)
    assert out[4]["objects"] == 3 and out[4]["hallucination"] == pytest.approx(1 / 3) and out[4]["exact"] == 0
    with pytest.raises(ValueError, match="does not divide"):
        best_of_n(rows, cands, "r", ns=(3,))
