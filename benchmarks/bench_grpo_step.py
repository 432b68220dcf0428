"""A GRPO step of the tiny captioner policy (TRL ``GRPOTrainer``, LoRA) with each capreward reward, on one
device: seconds per step and the reward's share of the step.

For each reward of ``--rewards`` (alone, weight 1): the recipe ``capreward.recipes.grpo_captioner`` with
``--tiny`` (seeded tiny LLaVA policy, tiny CLIP, tiny FLEUR judge; images only, so no video decoder is
needed), the policy and the reward models on ``--device``. A callback times every optimizer step and a
wrapper times every reward call; the first step is the warm-up and is left out when there are more.

    python benchmarks/bench_grpo_step.py --device cuda --steps 3 --json-out grpo.json

Needs trl, peft and datasets (the ``recipes`` extra); without them the JSON says so and nothing runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import synchronize, write_json  # noqa: E402


class TimedReward:
    """A reward with the same TRL name that records the seconds of each call."""

    def __init__(self, reward, device: str):
        self.reward, self.device = reward, device
        self.__name__ = reward.__name__
        self.seconds: list[float] = []

    def __call__(self, *args, **kwargs):
        synchronize(self.device)
        start = time.perf_counter()
        try:
            return self.reward(*args, **kwargs)
        finally:
            synchronize(self.device)
            self.seconds.append(time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rewards", default="emscore,clip_s,hallucination,fleur")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=12)
    parser.add_argument("--train-judge", action="store_true",
                        help="train the tiny FLEUR judge when it is not cached (about a minute of CPU); without it the "
                             "fleur reward is skipped, with the reason, where the cache lacks the judge for this "
                             "torch/transformers (its cache key includes their versions)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    result: dict = {"config": vars(args).copy()}
    try:
        from transformers import TrainerCallback

        from capreward.recipes import grpo_captioner as recipe
    except ImportError as exc:  # trl/datasets/peft absent: say so in the results
        result["skipped"] = f"the GRPO recipe cannot be imported here: {exc}"
        print(result["skipped"])
        write_json(args.json_out, result)
        return result

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []

        def on_step_begin(self, *a, **k):
            synchronize(args.device)
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            synchronize(args.device)
            self.seconds.append(time.perf_counter() - self.start)

    on_gpu = torch.device(args.device).type == "cuda"
    original_config = recipe.grpo_config

    def grpo_config(a, weights):  # --tiny keeps the policy on the CPU; here it goes where the rewards are
        b = argparse.Namespace(**vars(a))
        b.tiny = not on_gpu
        return original_config(b, weights)

    recipe.grpo_config = grpo_config
    result["rewards"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        manifest = recipe.write_tiny_manifest(Path(tmp) / "data", images=8, videos=0)
        for name in [r for r in args.rewards.split(",") if r]:
            if name == "fleur" and not args.train_judge:
                from capreward.testing.tiny_llava import FLEUR_RECIPE, cache_root

                cached = cache_root() / "tiny_llava" / f"{FLEUR_RECIPE.name}-{FLEUR_RECIPE.key()}" / "config.json"
                if not cached.exists():
                    result["rewards"][name] = {"skipped": f"the trained tiny FLEUR judge is not cached ({cached.parent}); "
                                                          "pass --train-judge to train it first"}
                    print(f"{name}: skipped ({result['rewards'][name]['skipped']})")
                    continue
            run_args = recipe.parse_args([
                "--tiny", "--quiet", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
                "--num-generations", str(args.num_generations), "--max-completion-length", str(args.max_completion_length),
                "--frames", "4", "--lora-r", "4", "--lora-alpha", "8", "--rewards", f"{name}:1", "--combine", "trl",
                "--reward-device", args.device, "--out", os.path.join(tmp, name), "--manifest", str(manifest)])
            start = time.perf_counter()
            try:
                funcs, weights = recipe.build_rewards(run_args)
                timed = [TimedReward(f, args.device) for f in funcs]
                steps = StepTimes()
                out = recipe.train(run_args, reward_funcs=timed, reward_weights=weights, callbacks=[steps], save=False)
            except Exception as exc:  # one reward failing leaves the others' figures
                result["rewards"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name}: {type(exc).__name__}: {exc}")
                continue
            reward_s = timed[0].seconds
            keep = slice(1, None) if len(steps.seconds) > 1 else slice(None)
            step_s = sum(steps.seconds[keep]) / len(steps.seconds[keep])
            rew_s = sum(reward_s[keep]) / max(1, len(reward_s[keep]))
            trainer = out["trainer"]
            result["rewards"][name] = {
                "step_s": step_s, "reward_s_per_step": rew_s, "reward_share": rew_s / step_s,
                "steps": len(steps.seconds), "step_seconds": steps.seconds, "reward_seconds": reward_s,
                "policy_device": str(next(trainer.model.parameters()).device), "wall_s": time.perf_counter() - start,
                "completions_per_step": args.batch_size,
            }
            r = result["rewards"][name]
            print(f"{name:14s} {r['step_s']:.3f} s/step, reward {r['reward_s_per_step']:.3f} s "
                  f"({100 * r['reward_share']:.0f}% of the step); policy on {r['policy_device']}")
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
