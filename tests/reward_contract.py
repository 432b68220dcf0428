"""The reward contract checked on the colour world: how a right caption, a hedge, a wrong guess and a
caption that says nothing rank under a reward (docs/design/reward-contract.md).

A policy unsure between two colours can name one (an honest guess, right half the time), name both (a
hedge) or name none (vague). The contract, per image, on the reward's mean over images of its colour:

1. the right caption earns more than every other caption;
2. a guess between two colours (the mean of the right caption and the other one) earns more than the
   hedge naming both: hedging never beats committing;
3. every wrong single colour earns the same (within ``tolerance`` of the right-wrong gap): no graded
   credit for a wrong colour, so no wrong answer is a step towards an image-blind attractor;
4. a caption that names no colour ("image", "a picture") earns no more than the lowest wrong guess:
   saying nothing never beats an honest attempt.

:func:`colour_matrix` scores the candidate captions (:func:`contract_captions`) on held-out images;
:func:`contract_violations` lists what breaks the contract. ``python
tests/reward_contract.py`` prints the demo reward's matrix and its violations; ``--world
scenes`` measures the same classes on the scenes world (:func:`scene_contract`), where a mention without
its colour is a class of its own (a decision: docs/design/reward-contract.md).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from capreward.testing.colour_task import FAMILIES, TASK_COLOURS

#: Captions that name no colour (the contract's "vague" class).
VAGUE = ("image", "a image", "an image.", "a picture", "a picture.")


def contract_captions(colours: Sequence[str] = TASK_COLOURS) -> dict[str, str]:
    """Candidate captions by name: ``right:<c>`` ("a <c> image" for each colour c; on an image of another
    colour it is a wrong guess), ``vague:<k>`` (:data:`VAGUE`), ``hedge:<c>+<d>`` ("<c> <d>" and
    "a <c> <d> image" for each pair of colours, both orders once)."""
    out = {f"single:{c}": f"a {c} image" for c in colours}
    out.update({f"vague:{k}": v for k, v in enumerate(VAGUE)})
    for i, c in enumerate(colours):
        for d in colours[i + 1:]:
            out[f"hedge:{c}+{d}"] = f"{c} {d}"
            out[f"hedge:{c}+{d}:a"] = f"a {c} {d} image"
    return out


@dataclass
class ColourMatrix:
    """``values[caption name][colour]``: the reward's mean over the held-out images of that colour
    (``captions`` maps names to texts)."""

    captions: dict[str, str]
    values: dict[str, dict[str, float]]

    def format(self) -> str:
        """The matrix as a text table, one caption a row."""
        colours = list(next(iter(self.values.values())))
        head = f"{'caption':24}" + "".join(f"{c:>9}" for c in colours)
        rows = [head, "-" * len(head)]
        for name, text in self.captions.items():
            rows.append(f"{text:24}" + "".join(f"{self.values[name][c]:9.3f}" for c in colours))
        return "\n".join(rows)


def colour_matrix(reward: Callable, rows: Sequence[dict[str, Any]], captions: dict[str, str] | None = None) -> ColourMatrix:
    """Every caption of ``captions`` (default :func:`contract_captions`) scored by ``reward`` (a TRL reward
    taking ``image=``) on every image of ``rows`` (:func:`~capreward.testing.colour_task.colour_rows`), in
    one call; per caption and colour the mean value (None values count as the reward's floor: they
    should not occur)."""
    captions = captions if captions is not None else contract_captions()
    names = list(captions)
    flat = reward(None, [captions[n] for n in names for _ in rows], image=[r["image"] for _ in names for r in rows])
    colours = list(dict.fromkeys(r["colour"] for r in rows))
    values: dict[str, dict[str, float]] = {}
    for k, name in enumerate(names):
        part = flat[k * len(rows):(k + 1) * len(rows)]
        if any(v is None for v in part):
            raise ValueError(f"the reward gave None for {captions[name]!r}")
        values[name] = {c: statistics.fmean(v for v, r in zip(part, rows) if r["colour"] == c) for c in colours}
    return ColourMatrix(captions, values)


def contract_violations(m: ColourMatrix, tolerance: float = 0.05) -> list[str]:
    """What in ``m`` breaks the contract (module docstring), one line each; empty when it holds."""
    out: list[str] = []
    v = m.values
    for c in next(iter(v.values())):
        right = v[f"single:{c}"][c]
        partner = next(d for d in FAMILIES[c] if d != c)
        wrong = {d: v[f"single:{d}"][c] for d in FAMILIES if d != c}
        others = {m.captions[n]: row[c] for n, row in v.items() if n != f"single:{c}"}
        for text, value in others.items():
            if value >= right:
                out.append(f"{c}: {text!r} earns {value:.3f} >= the right caption's {right:.3f}")
        guess = (right + wrong[partner]) / 2
        for n, row in v.items():
            if n.startswith("hedge:") and c in n.split(":")[1].split("+") and partner in n.split(":")[1].split("+"):
                if row[c] >= guess:
                    out.append(f"{c}: the hedge {m.captions[n]!r} earns {row[c]:.3f} >= a guess between {c} and "
                               f"{partner} ({guess:.3f})")
        gap = right - min(wrong.values())
        spread = max(wrong.values()) - min(wrong.values())
        if spread > tolerance * max(gap, 1e-9):
            shown = ", ".join(f"{d} {x:.3f}" for d, x in wrong.items())
            out.append(f"{c}: wrong colours are paid unalike ({shown}; spread {spread:.3f} > {tolerance:.0%} of {gap:.3f})")
        for n, row in v.items():
            if n.startswith("vague:") and row[c] > min(wrong.values()) + 1e-9:
                out.append(f"{c}: the vague {m.captions[n]!r} earns {row[c]:.3f} > the lowest wrong guess's "
                           f"{min(wrong.values()):.3f}")
    return out


#: The scenes world's contract classes (:func:`scene_cases`).
SCENE_CLASSES = ("right", "wrong", "hedge", "vague", "omitted")


def scene_cases(scene: Any, k: int) -> dict[str, str]:
    """For one scene of the scenes world (``experiments/scenes_world``): its true caption (``right``), the first mention's
    colour swapped for another colour not in the scene with that shape (``wrong``; the ``k``-th such
    colour, cycling), that mention naming both colours (``hedge``: "two blue red circles"), nothing said
    (``vague``: "a picture.") and that mention without its colour (``omitted``)."""
    from scenes_world import world

    mentions = world.true_mentions(scene)
    first = mentions[0]
    taken = {(m.colour, m.shape) for m in mentions}
    others = [c for c in world.SCENE_COLOURS if c != first.colour and (c, first.shape) not in taken]
    wrong = others[k % len(others)]
    noun = first.shape if first.count == 1 else world.SHAPES[first.shape]
    count = world.COUNT_WORDS.get(first.count, str(first.count))

    def caption(first_text: str) -> str:
        parts = [first_text, *(m.text() for m in mentions[1:])]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]

    return {
        "right": world.write_caption(mentions),
        "wrong": caption(world.Mention(first.count, wrong, first.shape).text()),
        "hedge": caption(f"{count} {first.colour} {wrong} {noun}"),
        "vague": "a picture.",
        "omitted": caption(world.Mention(first.count, None, first.shape).text()),
    }


@dataclass
class SceneContract:
    """Per scene (rows) and class (:data:`SCENE_CLASSES`) the reward's value, and what the contract
    says of them: :meth:`means` and :meth:`violations` (scenes where an order breaks)."""

    values: list[dict[str, float]]

    def means(self) -> dict[str, float]:
        """Per class the mean value, and ``guess``: the mean of (right + wrong) / 2."""
        out = {k: statistics.fmean(v[k] for v in self.values) for k in SCENE_CLASSES}
        out["guess"] = statistics.fmean((v["right"] + v["wrong"]) / 2 for v in self.values)
        return out

    def violations(self) -> dict[str, int]:
        """Scenes where the wrong caption earns at least the right one, the hedge at least a guess, the
        vague caption more than the wrong one; and (reported, decided otherwise: the docs) the omitted
        colour above the wrong one and at least a guess."""
        v = self.values
        return {
            "wrong >= right": sum(x["wrong"] >= x["right"] for x in v),
            "hedge >= guess": sum(x["hedge"] >= (x["right"] + x["wrong"]) / 2 for x in v),
            "vague > wrong": sum(x["vague"] > x["wrong"] + 1e-9 for x in v),
            "omitted > wrong": sum(x["omitted"] > x["wrong"] + 1e-9 for x in v),
            "omitted >= guess": sum(x["omitted"] >= (x["right"] + x["wrong"]) / 2 for x in v),
        }


def scene_contract(reward: Callable, rows: Sequence[dict[str, Any]]) -> SceneContract:
    """Every class of :func:`scene_cases` for every scene of ``rows`` ({"scene", "image"}) scored by
    ``reward`` in one call (None counts as the value it never is: a ValueError)."""
    cases = [scene_cases(r["scene"], k) for k, r in enumerate(rows)]
    flat = reward(None, [c[k] for c in cases for k in SCENE_CLASSES],
                  image=[r["image"] for r in rows for _ in SCENE_CLASSES])
    if any(v is None for v in flat):
        raise ValueError("the reward gave None for a scene caption")
    m = len(SCENE_CLASSES)
    return SceneContract([dict(zip(SCENE_CLASSES, flat[i * m:(i + 1) * m])) for i in range(len(rows))])


def main(argv: Sequence[str] | None = None) -> int:
    """Print the demo reward's contract matrix on held-out images and its violations (``--world
    colours``), or the scenes composite's contract classes on held-out scenes (``--world scenes``)."""
    from capreward.cli.demo import build_reward
    from capreward.testing.colour_task import colour_rows
    from capreward.testing.trained_clip import trained_clip_path

    p = argparse.ArgumentParser(prog="python -m capreward.testing.reward_contract", description=main.__doc__)
    p.add_argument("--world", choices=("colours", "scenes"), default="colours")
    p.add_argument("--seed", type=int, default=0, help="the demo seed (calibration rows seed + 3000, held-out seed + 5000)")
    p.add_argument("--images", type=int, default=32, help="held-out images (a multiple of 4) or scenes")
    args = p.parse_args(argv)
    if args.world == "scenes":
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the scenes world
        from scenes_world.clips import HELD_OUT, MODEL_A, scene_stream
        from scenes_world.evaluation import composite_reward, shared_clip_path

        composite, penalty = composite_reward(str(shared_clip_path(MODEL_A)), scene_stream(MODEL_A.data, 200))
        rows = scene_stream(HELD_OUT, args.images)
        for name, reward in (("composite", composite), ("penalty", penalty)):
            c = scene_contract(reward, rows)
            print(name, {k: round(v, 3) for k, v in c.means().items()}, c.violations())
        return 0
    reward = build_reward(str(trained_clip_path()), colour_rows(16, args.seed + 3000))
    m = colour_matrix(reward, colour_rows(args.images, args.seed + 5000))
    print(m.format())
    bad = contract_violations(m)
    print(f"\n{len(bad)} contract violations" + (":\n" + "\n".join(bad) if bad else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
