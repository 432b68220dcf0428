"""Experiment: on a task with ground truth, does re-ranking by a capreward reward pick better captions?

The scenes world (`experiments/scenes_world/world.py`): images of 1-4 coloured shapes, whose generator's
ground truth grades any caption per slot (count, shape, colour, binding), and counts hallucinated and
omitted objects. Two tiny CLIPs are trained offline on compositional captions with hard negatives
(`scenes_world.clips`): model A, the reward model, and model B, trained apart (another
initialisation, other scenes), the held-out judge. Nothing is downloaded.

Per seed, a noisy captioner of the grammar (`scenes_world.world.sample_caption`: the true
description with count, binding, colour and shape errors, missing objects, one to three extra objects,
colour-free mentions, repeated mentions, or "every object plus two to four absent ones") writes 16
candidates for each of 200 held-out scenes. For n in 1, 2, 4, 8, 16 the candidates are split into
groups of n and the top of each group by the reward is judged against the scene
(`scenes_world.evaluation.best_of_n`), for two rewards under A:

- CLIP-S alone;
- the composite: CLIP-S + the hallucination penalty (threshold calibrated on true captions of A's
  training scenes) + the guards (repetition, truncation, over-length), as the demo builds its reward.

and, as negative controls for the reward model, the same two under A-plain (A's recipe without hard
negatives: in-batch negatives only) and under A-partial (no hard negatives, and half the training
captions name only some of the scene's groups, as web alt-text does); ``--no-controls`` leaves them out.

Printed: A's and B's ranking accuracy against each hard-negative kind on held-out scenes; per reward
and n the ground-truth rates of the top caption, B's CLIP-S of it, and the hacking probes (repeated
mentions, objects and words per caption, colour-free captions); means over seeds.

    python experiments/scenes_bestofn.py                      # seeds 0 1 2; trains A and B on the first run
    python experiments/scenes_bestofn.py --json out.json

Needs only the core install (torch, open_clip, PIL). Runs on one torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

COLUMNS = (
    ("exact", "exact", "{:.0%}"), ("count", "count", "{:.0%}"), ("shape", "shape", "{:.0%}"), ("colour", "colour", "{:.0%}"),
    ("binding", "binding", "{:.0%}"), ("halluc.", "hallucination", "{:.1%}"), ("omission", "omission", "{:.1%}"),
    ("B CLIP-S", "held_out", "{:.3f}"), ("repeated", "repeated", "{:.1%}"), ("objects", "objects", "{:.2f}"),
    ("words", "words", "{:.1f}"), ("colour-free", "colour_free", "{:.1%}"),
)


def table(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A markdown table: one row per (label, rates)."""
    head = "| reranker, n | " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for label, r in rows:
        lines.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def mean_over(runs: Sequence[dict[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    return {n: {k: statistics.fmean(run[n][k] for run in runs) for k in runs[0][n]} for n in runs[0]}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="candidate-sampler seeds")
    p.add_argument("--scenes", type=int, default=200, help="held-out scenes")
    p.add_argument("--candidates", type=int, default=16, help="captions sampled per scene (the largest n)")
    p.add_argument("--calibration", type=int, default=200, help="true captions of A's training scenes the penalty is calibrated on")
    p.add_argument("--no-controls", dest="controls", action="store_false",
                   help="leave out the negative controls: the rerankers under A-plain (A's recipe without hard "
                        "negatives) and A-partial (no hard negatives, half the training captions partial)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)

    from capreward import progress
    from scenes_world import world
    from scenes_world.clips import (
        HELD_OUT, MODEL_A, MODEL_A_PARTIAL, MODEL_A_PLAIN, MODEL_B, scene_stream,
    )
    from scenes_world.evaluation import (NS, best_of_n, ranking_accuracy, sample_candidates, scene_rewards, score_candidates,
                                         shared_clip_path)

    progress.enable(False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy-sized ops: threads only add contention
    start = time.perf_counter()
    try:
        log = lambda m: print(f"[train] {m}", flush=True)  # noqa: E731
        path_a, path_b = shared_clip_path(MODEL_A, log=log), shared_clip_path(MODEL_B, log=log)
        rows = scene_stream(HELD_OUT, args.scenes)
        ranking = {"A": ranking_accuracy(path_a, rows), "B": ranking_accuracy(path_b, rows)}
        print("ranking accuracy on held-out scenes (true caption above the negative; chance 50%):")
        for name, acc in ranking.items():
            print(f"  model {name}: " + ", ".join(f"{k} {v:.0%}" for k, v in acc.items()))
        controls = {name: shared_clip_path(recipe, log=log)
                    for name, recipe in (("plain", MODEL_A_PLAIN), ("partial", MODEL_A_PARTIAL)) if args.controls}
        for name, path in controls.items():
            ranking[f"A-{name}"] = ranking_accuracy(path, rows)
            print(f"  model A-{name}: " + ", ".join(f"{k} {v:.0%}" for k, v in ranking[f"A-{name}"].items()))
        rewards = scene_rewards(path_a, path_b, scene_stream(MODEL_A.data, args.calibration), controls=controls)
        print(f"hallucination penalty threshold (A, calibrated): {rewards.threshold:.3f}")
        truth = [r["caption"] for r in rows]
        truth_b = rewards.held_out(None, truth, image=[r["image"] for r in rows])
        reference = {**world.mean_judgement(world.judge(r["scene"], r["caption"]) for r in rows),
                     "held_out": statistics.fmean(truth_b)}
        per_seed: dict[str, list] = {name: [] for name in rewards.rerankers}
        for seed in args.seeds:
            caps = sample_candidates(rows, args.candidates, seed)
            cands = score_candidates(rewards, rows, caps)
            for name in per_seed:
                per_seed[name].append(best_of_n(rows, cands, name, [n for n in NS if n <= args.candidates]))
            print(f"seed {seed}: exact at n=1: {per_seed['clip_s'][-1][1]['exact']:.0%}; at n={args.candidates}: "
                  + ", ".join(f"{name} {runs[-1][max(runs[-1])]['exact']:.0%}" for name, runs in per_seed.items()), flush=True)
    finally:
        torch.set_num_threads(threads)
    means = {name: mean_over(runs) for name, runs in per_seed.items()}
    label = {"clip_s": "CLIP-S (A)", "composite": "composite (A)"}
    label.update({f"{kind}_{name}": f"{'CLIP-S' if kind == 'clip_s' else 'composite'} (A-{name})"
                  for kind in ("clip_s", "composite") for name in ("plain", "partial")})
    table_rows = [("true caption", reference)]
    for name in means:
        table_rows += [(f"{label[name]}, n={n}", r) for n, r in means[name].items()]
    print(f"\nmeans over seeds {args.seeds} ({args.scenes} held-out scenes, {args.candidates} candidates each; "
          f"{time.perf_counter() - start:.0f} s):")
    print(table(table_rows))
    result = {"args": vars(args), "ranking": ranking, "threshold": rewards.threshold, "reference": reference,
              "per_seed": per_seed, "means": means}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
