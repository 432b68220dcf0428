"""Experiment: does the dense-captioning recipe (claim precision + claim coverage + the length guard,
normalised apart) move both parts of the claim reward the right way on held-out images?

The claim world (:mod:`capreward.testing.tiny_claim_judge`): noisy images of one background colour with
a patch of another colour in a corner; its ground truth is the pair (background, patch). The reward's
judge is the tiny *trained* claim judge (exact P(yes) from its logits verifies each claim against the
image; the coverage side matches each reference fact, "the background is B" / "there is a P patch",
against the caption's claims, ``coverage="lexical"``). Nothing is downloaded.

Per seed:

1. Build the seeded tiny LLaVA policy and fine-tune it briefly (SFT) on noisy captions of the world:
   one or two claims ("the background is X", "there is a X patch"), each naming the image's colour
   with probability ``--sft-right`` and else a colour absent from the image. The policy starts out
   hallucinating about half its claims and leaving facts out.
2. Measure on held-out images (``--eval-samples`` captions each, temperature 1): the judge's precision
   and recall (the two logged parts of the claim reward), and the ground truth's: precision = share of
   the caption's claims naming a colour that is in the image (the judge's presence reading), bound
   precision = share naming the right colour for its role (background / patch), coverage = share of
   the two facts whose colour the caption names.
3. Run ``--steps`` real GRPO steps (TRL ``GRPOTrainer``, ``multi_objective_aggregation=
   "normalize_then_sum"`` where the installed TRL has it) per arm, from the same SFT policy:

   - ``dense``: :func:`capreward.recipes.dense.dense_rewards` (claims_precision, claims_recall,
     length; weights 1, 1, 0.5);
   - ``control``: the same three rewards scored against *another* row's image and references (a
     reward with the same statistics but no information about the policy's image);
   - ``precision`` (optional): claims_precision + length only (no coverage reward).

   and measure again on the same held-out images.
4. Best-of-n on the held-out images with the SFT policy: of n sampled captions the one with the
   highest claim F-score, against a random one (the reward's ranking alone, no training).

Prints per-seed figures, means over seeds and, with both the dense and control arms, dense minus
control in units of the per-seed (paired) and pooled standard deviations::

    python experiments/dense_claims.py                      # seeds 0 1, 40 steps, arms dense + control
    python experiments/dense_claims.py --seeds 0 1 2 3 4 --steps 160 --json out.json   # docs/claims.md
    python experiments/dense_claims.py --arms dense control precision

The claim rewards are the library's (recall credits a reference fact only as stated by a claim the judge
verified). Runs on one torch thread; trains the claim judge on first use (cached under
$CAPREWARD_CACHE).

Measured (seeds 0-4, 160 GRPO steps, otherwise the defaults: the library's claim reward, precision
count-priced with ``claim_cost=1``, recall from the verified claims only; 2 shared CPU cores, 1,298 s;
figures and what they mean in docs/claims.md): no seed collapses into an image-blind caption, but the
dense arm is **not** separated from the wrong-image control by 2 sd. After GRPO, truth precision dense
0.592 +- 0.183 vs control 0.355 +- 0.096 (+0.91 paired sd, +1.63 pooled sd), bound precision +1.26 /
+1.98 sd, coverage 0.315 +- 0.099 vs 0.258 +- 0.105 (+0.39 / +0.56 sd, not above the SFT 0.316).
Best-of-8 by the claim F-score moves both ground-truth parts up (precision 0.525 -> 0.994, coverage
0.350 -> 0.644). History: with recall from all claims (measured at c251efa), on 3 of 5 seeds in
each arm GRPO ended on one run-on claim listing colours: the judge rejects it, but the lexical recall
credited it with both facts whatever the image, so the control reached it too (truth precision dense
0.335 vs control 0.173, coverage 0.605 vs 0.588: +0.33 / +0.03 paired sd). With the first judge
(one-colour claims only), before ``claim_cost=1``, seed 1 found run-on colour lists read by their last
colour (truth precision 0.539 -> 0.125).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from capreward.testing.colour_task import PROMPT, prompt_text, sft_answers

ARMS = ("dense", "control", "precision")
METRICS = ("judge_precision", "judge_recall", "judge_f", "true_precision", "bound_precision", "true_coverage",
           "claims", "words", "empty")


def world_words() -> tuple[str, ...]:
    from capreward.testing.tiny_claim_judge import COLOURS

    return ("a", "the", "is", "there", "background", "patch", "Describe", "image") + tuple(COLOURS)


# ------------------------------------------------------------------------------------------- data
def world_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` images of the claim world: {"background", "patch", "image", "references"} (the reference is
    the world's own description, "the background is B. there is a P patch.")."""
    from capreward.testing.tiny_claim_judge import COLOURS, claim_image, inventory_answer

    rng = random.Random(f"dense-claims-{seed}")
    rows = []
    for k in range(n):
        background = COLOURS[k % len(COLOURS)]
        patch = rng.choice([c for c in COLOURS if c != background])
        rows.append({"background": background, "patch": patch, "image": claim_image(background, patch, rng),
                     "references": [inventory_answer(background, patch)]})
    return rows


def grpo_dataset(rows: Sequence[dict[str, Any]]) -> Any:
    """TRL's conversational VLM rows; ``other_image`` / ``other_references``: the next row's, for the
    control arm."""
    from datasets import Dataset

    out = []
    for k, r in enumerate(rows):
        other = rows[(k + 1) % len(rows)]
        out.append({"prompt": [{"role": "user", "content": PROMPT}], "image": r["image"], "references": r["references"],
                    "other_image": other["image"], "other_references": other["references"]})
    return Dataset.from_list(out)


def sft_caption(background: str, patch: str, rng: random.Random, right: float) -> str:
    """One or two claims, each naming the true colour of its role with probability ``right``, else a
    colour absent from the image."""
    from capreward.testing.tiny_claim_judge import COLOURS

    absent = [c for c in COLOURS if c not in (background, patch)]
    roles = ["background", "patch"] if rng.random() < 0.5 else [rng.choice(["background", "patch"])]
    claims = []
    for role in roles:
        truth = background if role == "background" else patch
        colour = truth if rng.random() < right else rng.choice(absent)
        claims.append(f"the background is {colour}" if role == "background" else f"there is a {colour} patch")
    return ". ".join(claims) + "."


def sft(model: Any, processor: Any, rows: Sequence[dict[str, Any]], steps: int, seed: int, right: float,
        batch_size: int = 16, lr: float = 3e-3) -> float:
    """Supervised fine-tuning on :func:`sft_caption` targets. Returns the final loss (eval mode after)."""
    return sft_answers(model, processor, rows, lambda b, rng: sft_caption(b["background"], b["patch"], rng, right),
                       steps, seed, batch_size, lr)


# ----------------------------------------------------------------------------------- ground truth
def ground_truth(caption: str, background: str, patch: str) -> dict[str, float]:
    """The world's grading of ``caption``: precision (claims naming only colours in the image; a claim
    naming none counts as unsupported), bound precision (the colour of the claim's role), coverage (share
    of the two facts whose colour is named), the claim count."""
    from capreward.scorers.claims_split import split_claims
    from capreward.testing.tiny_claim_judge import COLOURS

    claims, _ = split_claims(caption, 64)
    present = {background, patch}
    true = bound = 0
    named: set[str] = set()
    for claim in claims:
        words = re.findall(r"[a-z]+", claim.text.lower())
        colours = [w for w in words if w in COLOURS]
        named.update(colours)
        true += bool(colours) and set(colours) <= present
        role = background if "background" in words else patch if "patch" in words else None
        bound += bool(colours) and (set(colours) == {role} if role else set(colours) <= present)
    n = len(claims)
    return {"true_precision": true / n if n else 0.0, "bound_precision": bound / n if n else 0.0,
            "true_coverage": len(named & present) / 2, "claims": float(n)}


# ------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def sample_captions(model: Any, processor: Any, rows: Sequence[dict[str, Any]], samples: int, seed: int,
                    max_new_tokens: int) -> list[str]:
    torch.manual_seed(seed)
    model.eval()
    prompt = prompt_text(processor)
    images = [r["image"] for r in rows for _ in range(samples)]
    enc = processor(images=images, text=[prompt] * len(images), return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)
    return processor.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def grade(scorer: Any, captions: Sequence[str], rows: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per caption (rows repeated in order): the judge's precision / recall / F (0 for an unscorable,
    e.g. empty, caption) and the ground truth."""
    samples = len(captions) // len(rows)
    expanded = [r for r in rows for _ in range(samples)]
    result = scorer.score(list(captions), images=[r["image"] for r in expanded],
                          references=[r["references"] for r in expanded])
    out = []
    for i, (caption, row) in enumerate(zip(captions, expanded)):
        judged = [float(x[i]) if x[i] == x[i] else 0.0 for x in (result.precision, result.recall, result.score)]
        g = ground_truth(caption, row["background"], row["patch"])
        out.append({"judge_precision": judged[0], "judge_recall": judged[1], "judge_f": judged[2], **g,
                    "words": float(len(caption.split())), "empty": float(not caption.strip())})
    return out


def mean_of(graded: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.mean(g[k] for g in graded) for k in METRICS}


def evaluate(model: Any, processor: Any, scorer: Any, rows: Sequence[dict[str, Any]], args: argparse.Namespace,
             seed: int) -> tuple[dict[str, float], list[str]]:
    captions = sample_captions(model, processor, rows, args.eval_samples, seed, args.max_completion_length)
    return mean_of(grade(scorer, captions, rows)), captions


def best_of_n(model: Any, processor: Any, scorer: Any, rows: Sequence[dict[str, Any]], n: int, seed: int,
              max_new_tokens: int) -> dict[str, dict[str, float]]:
    """Ground truth of the caption with the highest claim F-score among ``n`` samples per held-out
    image, and of the first sample (random choice)."""
    captions = sample_captions(model, processor, rows, n, seed + 7, max_new_tokens)
    graded = grade(scorer, captions, rows)
    picked = [max(graded[k * n:(k + 1) * n], key=lambda g: g["judge_f"]) for k in range(len(rows))]
    first = [graded[k * n] for k in range(len(rows))]
    return {"random": mean_of(first), "best": mean_of(picked)}


# ------------------------------------------------------------------------------------------- GRPO
def arm_rewards(arm: str, backend: Any) -> tuple[list[Any], list[float]]:
    """The TRL rewards of an arm (claims rewards floored at 0 for unscorable captions: an empty caption
    is never worth more than a scored one)."""
    from capreward.recipes.dense import LengthGuardReward, dense_rewards
    from capreward.rewards.claims import ClaimsReward
    from capreward.rewards.guards import Guards
    from capreward.scorers.claims import ClaimScorer
    from capreward.testing.colour_task import EmptyIsWorst

    if arm == "control":
        scorer = ClaimScorer(backend, coverage="lexical")
        columns = {"image_column": "other_image", "references_column": "other_references"}
        funcs = [ClaimsReward(scorer=scorer, part="precision", name="claims_precision", **columns),
                 ClaimsReward(scorer=scorer, part="recall", name="claims_recall", **columns),
                 LengthGuardReward(Guards(length_target="references"), references_column="other_references")]
        weights = [1.0, 1.0, 0.5]
    else:
        funcs, weights = dense_rewards(backend, coverage="lexical")
        if arm == "precision":
            funcs, weights = [funcs[0], funcs[2]], [weights[0], weights[2]]
    wrapped = [EmptyIsWorst(f, floor=0.0) if f.__name__.startswith("claims") else f for f in funcs]
    return wrapped, weights


def run_grpo(arm: str, model: Any, processor: Any, backend: Any, rows: Sequence[dict[str, Any]],
             args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from trl import GRPOTrainer

    from capreward.recipes import grpo_captioner as recipe
    from capreward.recipes.dense import aggregation_args

    funcs, weights = arm_rewards(arm, backend)
    grpo_args = recipe.parse_args([
        "--tiny", "--quiet", "--out", str(Path(args.out) / f"{arm}-seed{seed}"), "--seed", str(seed),
        "--steps", str(args.steps), "--lr", str(args.lr), "--lr-scheduler", "cosine",
        "--batch-size", str(args.batch_size), "--num-generations", str(args.num_generations),
        "--max-completion-length", str(args.max_completion_length), "--lora-r", "0",
    ])
    config = recipe.grpo_config(grpo_args, weights)
    for key, value in aggregation_args(type(config)).items():
        setattr(config, key, value)
    columns = recipe.trajectory_columns(funcs)
    for func in funcs:  # the logged parts of each claim reward
        name = func.__name__
        if name.startswith("claims"):
            columns[f"{name}/precision"] = f"rewards/{name}/precision"
            columns[f"{name}/recall"] = f"rewards/{name}/recall"
    trajectory = recipe.RewardTrajectory(columns)
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=config, train_dataset=grpo_dataset(rows),
                          processing_class=processor, callbacks=[trajectory])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return {"trainer": trainer, "trajectory": trajectory.rows, "log_history": trainer.state.log_history,
            "aggregation": getattr(config, "multi_objective_aggregation", None)}


def run_seed(args: argparse.Namespace, seed: int, judge: Any) -> dict[str, Any]:
    import copy

    from capreward.scorers.claims import ClaimScorer
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    start = time.perf_counter()
    model, processor = build_tiny_llava(TinyLlavaSpec(words=world_words(), seed=seed))
    train_rows = world_rows(args.train_images, seed)
    held_out = world_rows(args.eval_images, seed + 1000)
    sft_loss = sft(model, processor, train_rows, args.sft_steps, seed, args.sft_right)
    scorer = ClaimScorer(judge, coverage="lexical")
    before, examples = evaluate(model, processor, scorer, held_out, args, seed)
    out: dict[str, Any] = {"seed": seed, "sft_loss": sft_loss, "before": before, "examples_before": examples[:4],
                           "arms": {}}
    if args.best_of:
        out["best_of_n"] = best_of_n(model, processor, scorer, held_out, args.best_of, seed, args.max_completion_length)
    for arm in args.arms:
        policy = copy.deepcopy(model)
        policy.train()
        t = time.perf_counter()
        result = run_grpo(arm, policy, processor, judge, train_rows, args, seed)
        after, examples = evaluate(result["trainer"].model, processor, scorer, held_out, args, seed)
        out["arms"][arm] = {"after": after, "examples": examples[:4], "trajectory": result["trajectory"],
                            "aggregation": result["aggregation"], "seconds": time.perf_counter() - t}
    out["seconds"] = time.perf_counter() - start
    return out


def mean_std(values: Sequence[float]) -> str:
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def summarise(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> dict[str, dict[str, str]]:
    keys = ("judge_precision", "judge_recall", "true_precision", "bound_precision", "true_coverage", "claims")
    summary = {"before (SFT)": {k: mean_std([r["before"][k] for r in runs]) for k in keys}}
    for arm in arms:
        summary[f"after {arm}"] = {k: mean_std([r["arms"][arm]["after"][k] for r in runs]) for k in keys}
    if runs and "best_of_n" in runs[0]:
        for which in ("random", "best"):
            summary[f"best-of-n: {which}"] = {k: mean_std([r["best_of_n"][which][k] for r in runs]) for k in keys}
    return summary


def separation(runs: Sequence[dict[str, Any]], arm: str = "dense", against: str = "control",
               keys: Sequence[str] = ("true_precision", "bound_precision", "true_coverage")) -> dict[str, dict[str, float]]:
    """Per ground-truth measure, ``arm`` minus ``against`` after GRPO over the seeds: the mean difference,
    the sd of the per-seed (paired) differences and the pooled sd of the two arms (sqrt of the mean of
    their variances), and the difference in units of each (``z_paired``, ``z_pooled``; NaN with one seed;
    +-inf when an sd is 0 and the difference is not)."""
    import math

    def ratio(d: float, sd: float) -> float:
        return math.nan if math.isnan(sd) or (sd == 0 and d == 0) else math.copysign(math.inf, d) if sd == 0 else d / sd

    out = {}
    for k in keys:
        xa = [r["arms"][arm]["after"][k] for r in runs]
        xb = [r["arms"][against]["after"][k] for r in runs]
        diffs = [a - b for a, b in zip(xa, xb)]
        d = statistics.mean(diffs)
        many = len(runs) > 1
        sd_paired = statistics.stdev(diffs) if many else math.nan
        sd_pooled = math.sqrt((statistics.variance(xa) + statistics.variance(xb)) / 2) if many else math.nan
        out[k] = {"difference": d, "sd_paired": sd_paired, "sd_pooled": sd_pooled,
                  "z_paired": ratio(d, sd_paired), "z_pooled": ratio(d, sd_pooled)}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=["dense", "control"])
    p.add_argument("--steps", type=int, default=40, help="GRPO steps per arm")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=32, help="completions per step")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=12)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--sft-right", type=float, default=0.5, help="chance an SFT claim names the right colour")
    p.add_argument("--train-images", type=int, default=32)
    p.add_argument("--eval-images", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=8, help="captions sampled per held-out image")
    p.add_argument("--best-of", type=int, default=8, help="n of the best-of-n check (0: skip)")
    p.add_argument("--judge-dir", default=None, help="a trained claim judge directory (default: the tiny one)")
    p.add_argument("--out", default="runs/dense-claims")
    p.add_argument("--json", default=None, help="also write the results here")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)

    from capreward.judges import LocalChatJudge
    from capreward.testing.tiny_claim_judge import tiny_claim_judge, tiny_claim_judge_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy-sized ops: threads only add contention
    try:
        if args.judge_dir is None:
            tiny_claim_judge_dir(log=lambda m: print(f"[claim judge] {m}", flush=True))
        judge = LocalChatJudge(args.judge_dir or tiny_claim_judge(), batch_size=64)
        runs = []
        for seed in args.seeds:
            r = run_seed(args, seed, judge)
            runs.append(r)
            b = r["before"]
            print(f"seed {seed} (SFT loss {r['sft_loss']:.2f}, {r['seconds']:.0f}s): before judge P {b['judge_precision']:.3f} "
                  f"R {b['judge_recall']:.3f} | truth P {b['true_precision']:.3f} cov {b['true_coverage']:.3f}", flush=True)
            for arm, a in r["arms"].items():
                x = a["after"]
                print(f"  {arm:>9} ({a['aggregation']}): judge P {x['judge_precision']:.3f} R {x['judge_recall']:.3f} | truth P "
                      f"{x['true_precision']:.3f} bound {x['bound_precision']:.3f} cov {x['true_coverage']:.3f} "
                      f"claims {x['claims']:.2f}; e.g. {a['examples'][0]!r}", flush=True)
    finally:
        torch.set_num_threads(threads)
    summary = summarise(runs, args.arms)
    print(f"over {len(runs)} seeds, {args.steps} GRPO steps, {args.eval_images} held-out images x {args.eval_samples} "
          "captions (mean +- std over seeds):")
    keys = list(next(iter(summary.values())))
    print(f"| {'':<18} | " + " | ".join(keys) + " |")
    for label, row in summary.items():
        print(f"| {label:<18} | " + " | ".join(row[k] for k in keys) + " |")
    separated = {}
    if "dense" in args.arms and "control" in args.arms:
        separated = separation(runs)
        print("dense - control after GRPO (mean over seeds; in sd of the per-seed differences / pooled sd of the arms):")
        for k, v in separated.items():
            print(f"  {k:>15}: {v['difference']:+.3f}  sd paired {v['sd_paired']:.3f} -> {v['z_paired']:+.2f} sd; "
                  f"pooled {v['sd_pooled']:.3f} -> {v['z_pooled']:+.2f} sd")
    if args.json:
        slim = [{k: v for k, v in r.items()} for r in runs]
        Path(args.json).write_text(json.dumps({"runs": slim, "summary": summary, "separation": separated,
                                               "args": vars(args)}, indent=2, default=str))
    return {"runs": runs, "summary": summary, "separation": separated}


if __name__ == "__main__":
    main(sys.argv[1:])
