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
:func:`contract_violations` lists what breaks the contract. ``python -m
capreward.testing.reward_contract`` prints the demo reward's matrix and its violations.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .colour_task import FAMILIES, TASK_COLOURS

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


def main(argv: Sequence[str] | None = None) -> int:
    """Print the demo reward's contract matrix on held-out images and its violations."""
    from ..cli.demo import build_reward
    from .colour_task import colour_rows
    from .trained_clip import trained_clip_path

    p = argparse.ArgumentParser(prog="python -m capreward.testing.reward_contract", description=main.__doc__)
    p.add_argument("--seed", type=int, default=0, help="the demo seed (calibration rows seed + 3000, held-out seed + 5000)")
    p.add_argument("--images", type=int, default=32, help="held-out images (a multiple of 4)")
    args = p.parse_args(argv)
    reward = build_reward(str(trained_clip_path()), colour_rows(16, args.seed + 3000))
    m = colour_matrix(reward, colour_rows(args.images, args.seed + 5000))
    print(m.format())
    bad = contract_violations(m)
    print(f"\n{len(bad)} contract violations" + (":\n" + "\n".join(bad) if bad else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
