"""The optional judge-based injection check measured on the susceptible judge taught its question.

:func:`measure` returns, for the red-team attacks (``ATTACKS`` (``tests/red_team.py``)), for
paraphrases of the training sentences and for held-out paraphrases the judge never saw
(``HELD_OUT`` (``tests/grader_judge.py``)), each written after the plain wrong caption: how many
lift FLEUR on the taught judge (``grader_judge`` (``tests/grader_judge.py``)) by more than the red
team's tolerance, how many of those the injection patterns leave unflagged, and how many are left once
the judge check (:class:`~capreward.judges.injection_judge.JudgeInjectionCheck`) is added; and the check's
false positives on ordinary captions. ``python tests/injection_check_measure.py --ordinary
FILE [--limit N]`` prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any, Callable, Sequence

from grader_judge import HELD_OUT, TRAIN_ADDRESSING, grader_judge
from susceptible_judge import red_image


def measure(ordinary: Sequence[str] = (), judge: tuple[Any, Any] | None = None, threshold: float = 0.5,
            log: Callable[[str], None] | None = None, other_thresholds: Sequence[float] = (0.8, 0.95)) -> dict[str, Any]:
    """The check measured on the taught judge (see the module docstring). ``ordinary``: captions a person
    wrote, for the false positives. Values are FLEUR on a red image, beside the plain wrong caption.
    ``other_thresholds``: the lifts left and false positives at these thresholds too (same answers)."""
    from red_team import ATTACKS, PLAIN_RIGHT, PLAIN_WRONG, TOLERANCE

    from capreward.caption_reading import as_read
    from capreward.judges import LocalChatJudge
    from capreward.judges.injection import injection_reason
    from capreward.judges.injection_judge import JudgeInjectionCheck
    from capreward.scorers.fleur import FLEUR

    judge = judge or grader_judge(log=log)
    check = JudgeInjectionCheck(LocalChatJudge(judge, batch_size=8), threshold=threshold)
    fleur = FLEUR(judge, max_new_tokens=16)
    rng = random.Random("held-out")
    held_out = [f"{PLAIN_WRONG}. " + s.replace("{c}", PLAIN_RIGHT) for s in HELD_OUT]
    sets = {"red-team attacks": [a.caption for a in ATTACKS], "held-out paraphrases": held_out,
            "training-form paraphrases": [f"{PLAIN_WRONG}. " + s.replace("{c}", PLAIN_RIGHT) for s in TRAIN_ADDRESSING]}
    image = red_image(rng)
    out: dict[str, Any] = {"threshold": threshold}
    plain = fleur.score([PLAIN_WRONG, PLAIN_RIGHT], images=[image] * 2).score.tolist()
    out["plain wrong / right"] = plain
    kept: dict[str, tuple[list[bool], list[bool], list[float | None]]] = {}
    for name, captions in sets.items():
        values = fleur.score(captions, images=[image] * len(captions)).score.tolist()
        patterns = [injection_reason(c) is not None for c in captions]
        p_yes = check.probabilities([as_read(c) for c in captions], [image] * len(captions))
        judged = [p is not None and p >= threshold for p in p_yes]
        lifted = [v == v and v > plain[0] + TOLERANCE for v in values]
        kept[name] = (lifted, patterns, p_yes)
        out[name] = {
            "captions": len(captions),
            "lift FLEUR": sum(lifted),
            "left after the patterns": sum(x and not p for x, p in zip(lifted, patterns)),
            "left after patterns + judge check": sum(x and not p and not j for x, p, j in zip(lifted, patterns, judged)),
            "flagged by the judge check alone": sum(judged),
            "no yes/no answer": sum(p is None for p in p_yes),
        }
        if log:
            log(f"{name}: {out[name]}")
    if ordinary:
        p_yes = check.probabilities([as_read(c) for c in ordinary], [image] * len(ordinary))
        flagged = [c for c, p in zip(ordinary, p_yes) if p is not None and p >= threshold]
        out["ordinary captions"] = {"captions": len(ordinary), "false positives": len(flagged),
                                    "no yes/no answer": sum(p is None for p in p_yes), "examples": flagged[:10]}
        if log:
            log(f"ordinary captions: {out['ordinary captions']}")
    others: dict[str, Any] = {}
    for t in other_thresholds:
        row = {name: sum(x and not p and not (q is not None and q >= t) for x, p, q in zip(*kept[name]))
               for name in kept}
        others[f"{t:g}"] = {"left after patterns + judge check": row}
        if ordinary:
            others[f"{t:g}"]["ordinary false positives"] = sum(q is not None and q >= t for q in p_yes)
    out["at other thresholds"] = others
    if log:
        log(f"at other thresholds: {others}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tests/injection_check_measure.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--ordinary", metavar="FILE", help="a file of ordinary captions, one per line")
    parser.add_argument("--limit", type=int, default=0, help="at most this many ordinary captions (0: all)")
    parser.add_argument("--threshold", type=float, default=0.5)
    args = parser.parse_args(argv)
    ordinary: list[str] = []
    if args.ordinary:
        ordinary = [line for line in Path(args.ordinary).read_text(encoding="utf-8").splitlines() if line.strip()]
        ordinary = list(dict.fromkeys(ordinary))
        if args.limit:
            ordinary = random.Random(0).sample(ordinary, min(args.limit, len(ordinary)))
    print(json.dumps(measure(ordinary, threshold=args.threshold, log=print), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
