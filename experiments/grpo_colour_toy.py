"""Experiment: does optimising a capreward reward with GRPO actually move it?

A toy captioning task the tiny policy can learn: images of one solid colour (red, green, blue or
yellow, with jitter and noise), the prompt "Describe the image", and the reward CLIP-S
(:class:`capreward.rewards.CLIPScoreReward`, in [0, 2.5]) from the tiny CLIP trained to know colour
words (:mod:`capreward.testing.trained_clip`, cached on disk). A caption naming the right colour scores
about 2.45, a wrong colour 0 to 0.8.

Per seed:

1. Build the seeded tiny LLaVA policy and fine-tune it briefly (SFT) to answer "a <colour> image" with
   a colour drawn at random, *independently of the image*: it then names each colour about equally
   often whatever it sees (chance: 25 % right), which gives GRPO groups with reward variance.
2. Measure the mean reward (and the fraction of captions naming the right colour) of captions sampled
   at temperature 1 on held-out images.
3. Run ``--steps`` GRPO steps through ``capreward.recipes.grpo_captioner`` (TRL ``GRPOTrainer``; full
   fine-tuning by default: LoRA did not move this tiny policy within the step budget) with CLIP-S
   behind capreward's anti-hacking guards (a ``CompositeReward``; empty captions get -1), then measure
   again on the same held-out images.

Prints per-seed figures and mean +- std over seeds::

    python experiments/grpo_colour_toy.py            # 3 seeds x 80 steps, about 1 min per seed

Measured (defaults: 80 steps, 64 completions per step = 16 images x 4, lr 3e-3 cosine, SFT 80 steps;
2 shared CPU cores, ~57 s per seed), held-out mean reward over seeds 0, 1, 2:

    reward        0.821 +- 0.099  ->  0.904 +- 0.149   (per seed 0.76/0.94/0.77 -> 1.08/0.81/0.83)
    right colour  26.8% +- 4.5%   ->  25.0% +- 0.0%    (chance 25%)

(re-measured twice, identical, on the current guards; the first figures, 0.825 -> 1.136 and 30.7 %,
predate the repetition guard's single-word repeats: docs/scenes.md.)

The reward rises for every seed, but only partly by naming the right colour; the rest comes from
elsewhere (not measured separately; samples show fewer malformed captions, which the guards
penalise, and hedged captions naming two colours, which CLIP-S scores partly on several colours). One seed of a run with a gentler
schedule (lr 1.5e-3) learned the colour (24% -> 44% right, reward 0.78 -> 1.46) while the others stayed
flat; an earlier run with a constant lr 2e-3 reached a training reward of 2.44 (nearly every caption
right) around step 45 and then drifted back. With 200 steps (lr 2e-3 cosine) the reward rises
further, 0.825 +- 0.096 -> 1.329 +- 0.141, while the right-colour rate goes 26.8% -> 25.3% +- 25.0%
(per seed 26%, 0%, 50%): seed 1 reaches the highest reward (1.48) naming the right colour *never*, a
live example of CLIP-S being optimised without the captions getting more correct. Learning the image -> colour map by RL alone is fragile
for this tiny policy; the figures above are what the default configuration gives.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from capreward.testing.colour_task import (
    WORDS,
    EmptyIsWorst,
    colour_rows,
    grpo_dataset,
    prompt_text,
    right_colour,
    sft_random_colours,
)


def load_recipe() -> Any:
    """The GRPO recipe module (:mod:`capreward.recipes.grpo_captioner`)."""
    return importlib.import_module("capreward.recipes.grpo_captioner")


# ------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(model: Any, processor: Any, reward: Any, rows: Sequence[dict[str, Any]], samples: int, seed: int) -> dict[str, float]:
    """Mean reward and right-colour rate (captions naming the image's colour and no other) of
    ``samples`` captions per image, sampled at temperature 1 (the policy's expected reward)."""
    torch.manual_seed(seed)
    model.eval()
    prompt = prompt_text(processor)
    images = [r["image"] for r in rows for _ in range(samples)]
    enc = processor(images=images, text=[prompt] * len(images), return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=6)
    captions = processor.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    values = reward(None, captions, image=images)
    scored = [v for v in values if v is not None]
    truth = [r["colour"] for r in rows for _ in range(samples)]
    right = sum(map(right_colour, captions, truth))
    return {
        "reward": sum(scored) / max(1, len(scored)),
        "right_colour": right / len(captions),
        "unscored": len(values) - len(scored),
        "example": captions[0],
    }


def run_seed(args: argparse.Namespace, seed: int, clip_path: Path) -> dict[str, Any]:
    from capreward.rewards import CLIPScoreReward, CompositeReward, Guards
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    recipe = load_recipe()
    start = time.perf_counter()
    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=seed))
    sft_loss = sft_random_colours(model, processor, args.sft_steps, seed)
    clip_s = CLIPScoreReward(model=str(clip_path))
    # Guards against the hacks CLIP-S invites here: listing every colour, repeating words. Captions of
    # this task have no final period, so the truncation guard only checks for dangling words.
    guards = Guards(require_punctuation=False, max_words=3, length_scale=2) if args.guards else None
    reward = EmptyIsWorst(CompositeReward([(clip_s, 1.0)], guards=guards, name="clip_s_guarded"))
    held_out = colour_rows(args.eval_images, seed + 2000)
    before = evaluate(model, processor, reward, held_out, args.eval_samples, seed)

    grpo_args = recipe.parse_args(
        [
            "--tiny", "--quiet", "--out", str(Path(args.out) / f"seed{seed}"), "--seed", str(seed),
            "--steps", str(args.steps), "--lr", str(args.lr), "--lr-scheduler", args.lr_scheduler, "--batch-size", str(args.batch_size),
            "--num-generations", str(args.num_generations), "--max-completion-length", "6",
            "--lora-r", str(args.lora_r), "--lora-alpha", str(2 * args.lora_r),
        ]
    )
    result = recipe.train(
        grpo_args,
        reward_funcs=[reward],
        model_and_processor=(model, processor),
        dataset=grpo_dataset(colour_rows(args.train_images, seed)),
    )
    after = evaluate(result["trainer"].model, processor, reward, held_out, args.eval_samples, seed)
    return {
        "seed": seed,
        "sft_loss": sft_loss,
        "before": before,
        "after": after,
        "trajectory": [r["total"] for r in result["trajectory"]],
        "seconds": time.perf_counter() - start,
    }


def mean_std(values: Sequence[float]) -> str:
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=80, help="GRPO steps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-scheduler", default="cosine")
    p.add_argument("--batch-size", type=int, default=64, help="completions per step")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank; 0 = full fine-tuning (the default here)")
    p.add_argument("--sft-steps", type=int, default=80)
    p.add_argument("--train-images", type=int, default=32)
    p.add_argument("--eval-images", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=8, help="captions sampled per held-out image")
    p.add_argument("--no-guards", dest="guards", action="store_false", help="CLIP-S alone, without the anti-hacking guards")
    p.add_argument("--out", default="runs/grpo-colour-toy")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)

    from capreward.testing.trained_clip import trained_clip_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy-sized ops: threads only add contention
    try:
        clip_path = trained_clip_path(log=lambda m: print(f"[trained CLIP] {m}", flush=True))
        runs = []
        for seed in args.seeds:
            r = run_seed(args, seed, clip_path)
            runs.append(r)
            print(
                f"seed {seed}: reward {r['before']['reward']:.3f} -> {r['after']['reward']:.3f}, right colour "
                f"{r['before']['right_colour']:.0%} -> {r['after']['right_colour']:.0%} "
                f"(SFT loss {r['sft_loss']:.2f}, e.g. {r['after']['example']!r}, {r['seconds']:.0f}s)",
                flush=True,
            )
            print("  per-step mean reward: " + " ".join(f"{v:.2f}" for v in r["trajectory"]), flush=True)
    finally:
        torch.set_num_threads(threads)
    summary = {
        "reward_before": mean_std([r["before"]["reward"] for r in runs]),
        "reward_after": mean_std([r["after"]["reward"] for r in runs]),
        "right_colour_before": mean_std([r["before"]["right_colour"] for r in runs]),
        "right_colour_after": mean_std([r["after"]["right_colour"] for r in runs]),
    }
    print(f"over {len(runs)} seeds, {args.steps} GRPO steps (mean +- std):")
    for k, v in summary.items():
        print(f"  {k:<22} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary, "args": vars(args)}, indent=2, default=str))
    return {"runs": runs, "summary": summary}


if __name__ == "__main__":
    main(sys.argv[1:])
