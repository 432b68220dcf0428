"""Experiment: does SCST (or the differentiable reward) make a classic captioner more *correct*, or only
more rewarded?

A toy task a tiny encoder-decoder captioner can learn: images of one colour (six colours, with jitter and
noise; :func:`capreward.testing.trained_clip.colour_image`). The reward is CLIP-S from the tiny CLIP trained
on colour words (:mod:`capreward.testing.trained_clip`); "correct" means the greedy caption names the
image's colour and no other colour.

Per seed:

1. Build the seeded tiny ViT-GPT2 captioner (:func:`capreward.testing.tiny_captioner.build_tiny_captioner`)
   and train it with cross-entropy for ``--ce-steps`` steps on targets of which ``--hedge`` (default half)
   are colour-free ("an image", "a picture", ...): the common first stage, leaving a captioner that
   often hedges.
2. Measure held-out greedy captions: mean CLIP-S and the right-colour rate.
3. From that same starting point, train ``--steps`` more steps with each of

   - ``ce``: more cross-entropy on the same targets;
   - ``scst``: SCST on CLIP-S (4 samples per image, greedy baseline);
   - ``scst-mean``: the same with the mean-of-other-samples baseline ("new SCST");
   - ``scst-mean+guards``: that, on CLIP-S plus capreward's repetition and dangling-word guards;
   - ``scst+halluc``: SCST on CLIP-S + 0.5 × the hallucination penalty (calibrated on reference captions);
   - ``differentiable``: minus CLIP-S of straight-through Gumbel-softmax captions, backpropagated;

   and measure again on the same held-out images.

Prints per-seed figures and mean ± std over seeds, and a JSON summary with ``--json``::

    bash scripts/bootstrap.sh --test                      # it needs the `callbacks` extra (Lightning)
    .venv/bin/python experiments/scst_colour_toy.py       # 3 seeds, about 2 min in all on 2 idle cores

It runs torch on one thread (``--threads``): on 2 loaded cores the default thread count made it run past
15 minutes, one thread under 6.5.

Measured (defaults; seeds 0, 1, 2), held-out greedy captions, mean ± std over seeds:

    objective           CLIP-S           right colour    repeated words
    start (CE stage)    1.593 ± 0.180    0.597 ± 0.079   0.000 ± 0.000
    ce                  1.372 ± 0.265    0.444 ± 0.087   0.000 ± 0.000
    scst                0.799 ± 0.714    0.160 ± 0.156   0.394 ± 0.417
    scst-mean           2.397 ± 0.015    0.986 ± 0.012   0.597 ± 0.118
    scst-mean+guards    2.391 ± 0.002    0.993 ± 0.012   0.216 ± 0.035
    scst+halluc         0.597 ± 0.628    0.174 ± 0.301   0.152 ± 0.263
    differentiable      2.238 ± 0.158    0.903 ± 0.084   0.278 ± 0.481

CLIP-S alone is hacked by repetition (the right colour word, repeated); the repetition guard keeps the
correctness and cuts the repetition. The greedy baseline collapses this tiny captioner (seed 1 to empty
captions, which get no advantage unless ``unscored_reward`` is set). See the README for the discussion.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
CONDITIONS = ("ce", "scst", "scst-mean", "scst-mean+guards", "scst+halluc", "differentiable")


def _recipe():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scst_captioner", REPO / "recipes" / "scst_captioner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scst_captioner"] = module
    spec.loader.exec_module(module)
    return module


def repetition_penalty(caption: str, n: int) -> float:
    from capreward.rewards.guards import repetition_penalty as penalty

    return penalty(caption, n)


def colour_correct(caption: str, colour: str, colours: Sequence[str]) -> bool:
    """The caption names ``colour`` and no other colour of ``colours``."""
    words = set(caption.lower().split())
    return colour in words and not (words & (set(colours) - {colour}))


def evaluate(model, tokenizer, pixels, items, clip_scorer, colours, max_new_tokens: int) -> dict[str, float]:
    """Greedy captions of the held-out images: mean CLIP-S (0 for an empty caption), right-colour rate, and
    the mean fraction of each caption's words that repeat an earlier word (degenerate text)."""
    from capreward.training import greedy_captions

    special_ids = sys.modules["scst_captioner"].special_ids
    captions = greedy_captions(model, tokenizer, {"pixel_values": pixels}, max_new_tokens, suppress_tokens=special_ids(tokenizer))
    keep = [i for i, c in enumerate(captions) if c.strip()]
    rewards = [0.0] * len(captions)
    if keep:
        scores = clip_scorer.score([captions[i] for i in keep], images=[items[i]["image"] for i in keep]).clip_s
        for i, s in zip(keep, scores.tolist()):
            rewards[i] = s
    correct = [colour_correct(c, it["colour"], colours) for c, it in zip(captions, items)]
    repeated = [-repetition_penalty(c, n=1) for c in captions]
    return {"reward": sum(rewards) / len(rewards), "correct": sum(correct) / len(correct),
            "repeated": sum(repeated) / len(repeated), "examples": captions[:4]}


def batches(n: int, size: int, rng: random.Random):
    """Endless shuffled index batches."""
    order: list[int] = []
    while True:
        if len(order) < size:
            more = list(range(n))
            rng.shuffle(more)
            order += more
        yield order[:size]
        order = order[size:]


def train(condition: str, model, tokenizer, train_set, objective_for, steps: int, batch_size: int, lr: float, seed: int) -> None:
    """``steps`` optimiser steps of ``condition`` on ``train_set`` (an ``ImageCaptions``)."""
    recipe = sys.modules["scst_captioner"]
    objective = objective_for(condition)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    order = batches(len(train_set), batch_size, random.Random(seed))
    torch.manual_seed(seed)
    for _ in range(steps):
        batch = recipe.collate([train_set[i] for i in next(order)])
        opt.zero_grad()
        if objective is None:
            loss = model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss
        else:
            loss = objective(model, {"pixel_values": batch["pixel_values"]}, batch["image"]).loss
        loss.backward()
        opt.step()


def run_seed(args: argparse.Namespace, seed: int, backbone, clip_scorer) -> dict[str, Any]:
    recipe = _recipe()
    from capreward.testing.trained_clip import COLOURS

    colours = list(COLOURS)
    model, processor, tokenizer = recipe.load_captioner("tiny", seed)
    train_items = recipe.synthetic_images(args.train_size, seed, hedge=args.hedge)
    held_out = recipe.synthetic_images(args.val_size, seed + 10_000)
    train_set = recipe.ImageCaptions(train_items, processor, tokenizer)
    val_pixels = recipe.ImageCaptions(held_out, processor, tokenizer).pixels

    train("ce", model, tokenizer, train_set, lambda c: None, args.ce_steps, args.batch_size, args.ce_lr, seed)
    start_state = {k: v.clone() for k, v in model.state_dict().items()}
    before = evaluate(model, tokenizer, val_pixels, held_out, clip_scorer, colours, args.max_new_tokens)

    def objective_for(condition: str):
        if condition == "ce":
            return None
        ns = argparse.Namespace(
            objective="differentiable" if condition == "differentiable" else "scst", reward="clip-s",
            hallucination=0.5 if condition == "scst+halluc" else 0.0, samples=args.samples,
            baseline="mean" if condition.startswith("scst-mean") else "greedy", guards=condition.endswith("+guards"),
            max_new_tokens=args.max_new_tokens, tau=args.tau,
        )
        return recipe.build_objective(ns, backbone, tokenizer, train_items[:32])

    after = {}
    for condition in CONDITIONS:
        model.load_state_dict(start_state)
        lr = args.ce_lr if condition == "ce" else args.lr
        started = time.process_time()
        train(condition, model, tokenizer, train_set, objective_for, args.steps, args.batch_size, lr, seed + 1)
        after[condition] = evaluate(model, tokenizer, val_pixels, held_out, clip_scorer, colours, args.max_new_tokens)
        after[condition]["cpu_s"] = time.process_time() - started
    return {"seed": seed, "before": before, "after": after}


def mean_std(values: Sequence[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--ce-steps", type=int, default=100, help="cross-entropy steps of the first stage")
    p.add_argument("--steps", type=int, default=60, help="steps of each condition after the first stage")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=4, help="SCST samples per image")
    p.add_argument("--tau", type=float, default=1.0, help="Gumbel-softmax temperature")
    p.add_argument("--ce-lr", type=float, default=3e-3)
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate of the reward objectives")
    p.add_argument("--hedge", type=float, default=0.5, help="fraction of colour-free training targets")
    p.add_argument("--train-size", type=int, default=96)
    p.add_argument("--val-size", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--json", help="also write the per-seed results and summary to this file")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (toy-sized ops: more threads only add contention on a shared machine)")
    args = p.parse_args(argv)

    # the recipe it runs is a Lightning module: fail here, naming what installs it, not deep in an import
    from capreward._extras import require

    require("callbacks", "lightning.pytorch", used_by="experiments/scst_colour_toy.py (install it with "
            "`bash scripts/bootstrap.sh --test`, or `pip install -e '.[callbacks]'`)")
    from capreward import CLIPScore
    from capreward.backbones import CLIPBackbone
    from capreward.testing.trained_clip import TrainedClipFactory

    backbone = CLIPBackbone(TrainedClipFactory())
    clip_scorer = CLIPScore(backbone=backbone)
    runs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        for seed in range(args.seeds):
            run = run_seed(args, seed, backbone, clip_scorer)
            runs.append(run)
            b = run["before"]
            print(f"seed {seed}: start reward {b['reward']:.3f} correct {b['correct']:.1%} repeated {b['repeated']:.1%}  e.g. {b['examples'][:2]}")
            for c, a in run["after"].items():
                print(f"    {c:17s} reward {a['reward']:.3f} correct {a['correct']:.1%} repeated {a['repeated']:.1%}"
                      f"  ({a['cpu_s']:.0f} CPU s)  e.g. {a['examples'][:2]}")
    finally:
        torch.set_num_threads(threads)
    keys = ("reward", "correct", "repeated")
    summary = {"start": {k: mean_std([r["before"][k] for r in runs]) for k in keys}}
    for c in CONDITIONS:
        summary[c] = {k: mean_std([r["after"][c][k] for r in runs]) for k in keys}
    print(f"\nover {args.seeds} seeds (held-out greedy captions, {args.val_size} images):")
    print(f"{'':18s}{'CLIP-S':>16s}{'right colour':>16s}{'repeated words':>16s}")
    for name, row in summary.items():
        label = "start (CE stage)" if name == "start" else name
        print(f"{label:18s}" + "".join(f"{row[k]:>16s}" for k in keys))
    result = {"args": vars(args), "runs": runs, "summary": summary}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
