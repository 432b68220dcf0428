"""Experiment: the demo's GRPO beside fair control arms, same start, same budget, same held-out images.

Per seed, the demo's weakly supervised start (:func:`capreward.cli.demo.run_grpo`: 80 SFT steps on weak
labels) and from it, each for the demo's budget (80 optimiser steps of 16 images):

- **GRPO** under the demo's reward and settings (:data:`capreward.cli.demo.DEMO_SETTINGS`);
- **weak-label SFT**: 80 more supervised steps on the same weak labels (the demo's control arm);
- **reward as labeller, then SFT**: each of GRPO's 32 training images labelled with the colour whose
  caption "a <colour> image" the same reward scores highest, then 80 supervised steps on those labels;
- **rejection-sampling fine-tuning** (best-of-n distillation, :func:`policy_arms.best_of_n_distillation`):
  each step samples 4 captions for each of 16 of GRPO's training images from the current policy (GRPO's
  group), keeps the one the same reward ranks first and takes one supervised step on the kept captions.

The supervised arms use AdamW: the labeller arm at the demo's SFT learning rate (3e-3), best-of-n at
GRPO's (:data:`capreward.cli.demo.DEMO_SETTINGS`, 1e-3), since it too trains on the policy's own samples
(at 3e-3 it drifted out of the task's form, "red image", "a yellow", then to empty captions, on 8 of 10
seeds). Every arm is graded on the same 32
held-out images, greedy and 4 samples each, counting clean captions only
(:func:`capreward.testing.colour_task.right_colour`). One JSON line per seed goes to ``--out`` as soon as
it ends (a rerun skips the seeds already there with unchanged inputs)::

    python experiments/colour_controls.py --seeds 0-9 --out runs/colour_controls.jsonl
    python experiments/colour_controls.py --table runs/colour_controls.jsonl

With ``--grpo-runs runs/demo_final.jsonl`` the GRPO and weak-label arms are read from the demo's 10-seed
runs (``experiments/demo_seeds.py``, same seeds, steps, settings and code) instead of being run again; the
start is rebuilt here and must caption the held-out images exactly as the recorded start did.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_seeds import parse_seeds, read_rows, source_hash  # noqa: E402

ARMS = ("start", "grpo", "weak_sft", "labeller_sft", "best_of_n")


def label_by_reward(reward: Any, rows: list[dict[str, Any]]) -> list[str]:
    """Per row, the task colour whose caption "a <colour> image" ``reward`` scores highest (first on ties)."""
    from capreward.testing.colour_task import TASK_COLOURS

    captions = [f"a {c} image" for _ in rows for c in TASK_COLOURS]
    images = [r["image"] for r in rows for _ in TASK_COLOURS]
    values = reward(prompts=None, completions=captions, image=images, colour=[r["colour"] for r in rows for _ in TASK_COLOURS])
    k = len(TASK_COLOURS)
    return [TASK_COLOURS[max(range(k), key=lambda j: (values[i * k + j], -j))] for i in range(len(rows))]


def start_policy(seed: int, sft_steps: int) -> tuple[Any, Any]:
    """The demo's weakly supervised start for ``seed``, built as :func:`capreward.cli.demo.run_grpo` builds it."""
    import torch

    from capreward.testing import TinyLlavaSpec, build_tiny_llava
    from capreward.testing.colour_task import WORDS, sft_colours, weak_label

    torch.manual_seed(seed)
    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=seed))
    sft_colours(model, processor, sft_steps, seed, label=weak_label)
    return model, processor


def run_seed(clip: Any, seed: int, steps: int, sft_steps: int, grpo_row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The four arms of ``seed``; the GRPO and weak-label arms are read from ``grpo_row`` (a row of
    ``experiments/demo_seeds.py`` for the same seed and settings) when given, after checking that the start
    built here captions the held-out images exactly as that run's start did."""
    from policy_arms import best_of_n_distillation, supervise

    from capreward.cli import demo
    from capreward.testing.colour_task import PROMPT, ColourEval, caption_colours, colour_rows

    start = time.perf_counter()
    held_out = colour_rows(demo.EVAL_IMAGES, seed + 5000)
    if grpo_row is None:
        with tempfile.TemporaryDirectory(prefix="colour-controls-") as out:
            r = demo.run_grpo(clip, steps, out, seed=seed, sft_steps=sft_steps, levels=False)
        evals = {"start": r.before, "grpo": r.after, "weak_sft": r.control}
    else:
        evals = {"start": ColourEval(**grpo_row["before"]), "grpo": ColourEval(**grpo_row["after"]),
                 "weak_sft": ColourEval(**grpo_row["control"])}
        model, processor = start_policy(seed, sft_steps)
        if caption_colours(model, processor, held_out, demo.EVAL_SAMPLES, seed) != evals["start"]:
            raise RuntimeError(f"seed {seed}: the start built here is not the recorded run's start")
    train_rows = colour_rows(32, seed)  # GRPO's training images
    reward = demo.build_reward(clip, colour_rows(demo.CALIBRATION_ROWS, seed + 3000))

    labels = label_by_reward(reward, train_rows)
    model, processor = start_policy(seed, sft_steps)
    supervise(model, processor, PROMPT, lambda rng: _batch(rng, train_rows, labels), steps, seed)
    evals["labeller_sft"] = caption_colours(model, processor, held_out, demo.EVAL_SAMPLES, seed)

    model, processor = start_policy(seed, sft_steps)
    log = best_of_n_distillation(model, processor, PROMPT, train_rows, reward, steps, seed, k=4, images_per_step=16,
                                 lr=demo.DEMO_SETTINGS.lr,
                                 max_new_tokens=demo.DEMO_SETTINGS.max_completion_length, columns=("colour",))
    evals["best_of_n"] = caption_colours(model, processor, held_out, demo.EVAL_SAMPLES, seed)
    return {"evals": {k: dataclasses.asdict(v) for k, v in evals.items()},
            "labels_right": sum(lab == row["colour"] for lab, row in zip(labels, train_rows)) / len(train_rows),
            "best_of_n_reward": log["reward"], "seconds": time.perf_counter() - start,
            "grpo_from": "recorded" if grpo_row is not None else "run"}


def _batch(rng, rows, labels, size: int = 16):
    idx = [rng.randrange(len(rows)) for _ in range(size)]
    return [rows[i]["image"] for i in idx], [f"a {labels[i]} image" for i in idx]


def accuracy(row: dict[str, Any]) -> dict[str, tuple[float, float]]:
    from capreward.testing.colour_task import ColourEval

    return {arm: (ColourEval(**e).greedy_right, ColourEval(**e).sampled_right) for arm, e in row["result"]["evals"].items()}


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'seed':>5}" + "".join(f"{a:>16}" for a in ARMS) + f"{'labels right':>14}"
    lines = ["clean held-out accuracy, greedy / sampled", head]
    for row in sorted(rows, key=lambda r: r["seed"]):
        acc = accuracy(row)
        lines.append(f"{row['seed']:>5}" + "".join(f"{acc[a][0]:>9.0%} /{acc[a][1]:>4.0%}" for a in ARMS)
                     + f"{row['result']['labels_right']:>14.0%}")
    if rows:
        accs = [accuracy(r) for r in rows]
        cells = ""
        for a in ARMS:
            g = [x[a][0] for x in accs]
            s = [x[a][1] for x in accs]
            cells += f"{statistics.fmean(g):>9.0%} /{statistics.fmean(s):>4.0%}"
        lines.append(f"{'mean':>5}" + cells)
        lines.append(f"{'>=75%':>5}" + "".join(f"{sum(x[a][0] >= 0.75 for x in accs):>10}/{len(accs):<5}" for a in ARMS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--sft-steps", type=int, default=80)
    p.add_argument("--out", default="runs/colour_controls.jsonl")
    p.add_argument("--grpo-runs", default=None,
                   help="a JSONL file of experiments/demo_seeds.py (tag --grpo-tag) to take the GRPO and weak-label arms "
                        "from (the same seeds, steps and settings); without it they are run here")
    p.add_argument("--grpo-tag", default="demo")
    p.add_argument("--table", default=None, help="print the table of this file and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_rows(Path(args.table))))
        return 0
    from capreward.cli import demo
    from capreward.testing.trained_clip import TrainedClipFactory, trained_clip_path

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    inputs = {"steps": args.steps, "sft_steps": args.sft_steps, "code": source_hash(),
              "settings": dataclasses.asdict(demo.DEMO_SETTINGS),
              "arms": hashlib.sha256((Path(__file__).parent / "policy_arms.py").read_bytes()
                                     + Path(__file__).read_bytes()).hexdigest()[:16]}
    rows = read_rows(out)
    keep = [r for r in rows if r["inputs"] == inputs]
    if len(keep) != len(rows):
        out.write_text("".join(json.dumps(r) + "\n" for r in keep))
    done = {r["seed"] for r in keep}
    grpo = {}
    if args.grpo_runs:
        for r in read_rows(Path(args.grpo_runs)):
            ok = (r["tag"] == args.grpo_tag and r["inputs"]["steps"] == args.steps and r["inputs"]["sft_steps"] == args.sft_steps
                  and r["inputs"]["settings"] == dataclasses.asdict(demo.DEMO_SETTINGS) and r["inputs"]["start"] == "weak"
                  and r["inputs"]["reward"] == "composite" and r["inputs"]["code"] == source_hash())
            if ok:
                grpo[r["seed"]] = r["result"]
    trained_clip_path(log=None)
    clip = TrainedClipFactory()
    with demo.quiet_third_parties(), demo.one_thread():
        for seed in parse_seeds(args.seeds):
            if seed in done:
                continue
            recorded = grpo.get(seed)
            if args.grpo_runs and recorded is None:
                print(f"seed {seed}: no recorded GRPO run in {args.grpo_runs}; skipped", flush=True)
                continue
            row = {"seed": seed, "inputs": inputs, "result": run_seed(clip, seed, args.steps, args.sft_steps, recorded)}
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            acc = accuracy(row)
            print(f"seed {seed}: " + ", ".join(f"{a} {g:.0%}/{s:.0%}" for a, (g, s) in acc.items())
                  + f" ({row['result']['seconds']:.0f} s)", flush=True)
    print(table(read_rows(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
