"""Experiment: the demo's GRPO run (``capreward demo``'s part 2) over seeds and optimiser settings.

Each run is :func:`capreward.cli.demo.run_grpo` (weak SFT start, GRPO through the recipe, the control arm)
with the settings given on the command line; every held-out caption (greedy and sampled, start, after
GRPO, control) is kept, so any accuracy can be recomputed later. One JSON line per (settings, seed) is
appended to ``--out`` as soon as the run ends; a rerun skips the rows already there whose inputs (the
settings, the seed, the steps and the source of the demo, the task, the recipe and the rewards) are
unchanged, and drops the others.

    python experiments/demo_seeds.py --seeds 0-9 --out runs/demo_seeds.jsonl            # the demo's settings
    python experiments/demo_seeds.py --seeds 1,3,7 --lr 5e-4 --beta 0.04 --tag kl        # a variant
    python experiments/demo_seeds.py --table runs/demo_seeds.jsonl                       # the table only

The table: per tag and seed, clean held-out greedy and sampled accuracy (start -> after GRPO, control),
the malformed share, and whether the run taught (the demo's closing line's rule,
:func:`capreward.cli.demo.taught`).
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

SOURCES = ("testing/colour_task.py", "recipes/grpo_captioner.py", "rewards", "metrics/token_support.py", "scorers")


def source_hash() -> str:
    """A hash of the code a run's result depends on: the task, the recipe, the rewards and scorers, and
    the demo's functions that build the run (:func:`~capreward.cli.demo.build_reward`,
    :func:`~capreward.cli.demo.run_grpo`, :func:`~capreward.cli.demo.guards_for_the_task`; not its
    printing, nor its default settings, which each row records)."""
    import inspect

    import capreward
    from capreward.cli import demo

    root = Path(capreward.__file__).parent
    h = hashlib.sha256()
    for rel in SOURCES:
        path = root / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    for func in (demo.build_reward, demo.run_grpo, demo.guards_for_the_task, demo.reference_levels):
        h.update(inspect.getsource(func).encode())
    return h.hexdigest()[:16]


def parse_seeds(text: str) -> list[int]:
    """"0-9" or "1,3,7" (or both, "0-2,7") -> the list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluation(e: Any) -> dict[str, Any]:
    return None if e is None else dataclasses.asdict(e)


def monitor_judges() -> dict[str, Any]:
    """The held-out judges recorded at every step (for the Goodhart monitor's alarm rates): ground truth
    (a clean caption of the image's colour) and CLIP-S under a second colour CLIP trained apart (seed 1)."""
    from capreward.rewards import CLIPScoreReward
    from capreward.testing.colour_task import TruthReward
    from capreward.testing.trained_clip import ColourClipRecipe, TrainedClipFactory, trained_clip_path

    held = ColourClipRecipe(seed=1)
    trained_clip_path(held, log=None)
    clip_s = CLIPScoreReward(model=TrainedClipFactory(held))

    def held_out_clip_s(prompts, completions, image, **kwargs):
        return clip_s(prompts, completions, image=image)

    truth = TruthReward()
    return {"truth": lambda prompts, completions, **kw: truth(prompts, completions, **kw), "held_out_clip_s": held_out_clip_s}


def run_one(clip: Any, seed: int, steps: int, settings: Any, sft_steps: int, reward_name: str,
            start: str = "weak") -> dict[str, Any]:
    from capreward.callbacks import GoodhartCallback, GoodhartMonitor
    from capreward.cli import demo
    from capreward.testing.colour_task import EmptyIsWorst, TruthReward, colour_rows

    if reward_name == "truth":
        reward = EmptyIsWorst(TruthReward())
    else:
        reward = demo.build_reward(clip, colour_rows(demo.CALIBRATION_ROWS, seed + 3000))
    # every step's training reward beside the held-out judges, kept for replaying the monitor offline
    monitor = GoodhartMonitor(monitor_judges(), warn=lambda message: None)
    with tempfile.TemporaryDirectory(prefix="demo-seeds-") as out:
        r = demo.run_grpo(clip, steps, out, seed=seed, sft_steps=sft_steps, settings=settings, levels=False,
                          reward=monitor.watch(reward), callbacks=[GoodhartCallback(monitor)], start_labels=start)
    return {"reward": r.reward, "right": r.right, "words": r.words, "components": r.components, "seconds": r.seconds,
            "before": evaluation(r.before), "after": evaluation(r.after), "control": evaluation(r.control),
            "verdict": demo.grpo_summary(r), "monitor": monitor.rows}


def summary(row: dict[str, Any]) -> dict[str, Any]:
    from capreward.cli import demo
    from capreward.testing.colour_task import ColourEval

    res = row["result"]
    e = {k: ColourEval(**res[k]) for k in ("before", "after", "control") if res.get(k)}
    return {"greedy": (e["before"].greedy_right, e["after"].greedy_right),
            "sampled": (e["before"].sampled_right, e["after"].sampled_right),
            "control": (e["control"].greedy_right, e["control"].sampled_right) if "control" in e else None,
            "malformed": (e["after"].greedy_malformed, e["after"].sampled_malformed),
            "taught": demo.taught(e["before"], e["after"], e.get("control"))}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'tag':<16}{'seed':>5}  {'greedy':>11}  {'sampled':>11}  {'control':>9}  {'junk g/s':>9}  {'s':>5}  taught"]
    by_tag: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_tag.setdefault(row["tag"], []).append(row)
    for tag, runs in by_tag.items():
        taught = 0
        for row in sorted(runs, key=lambda r: r["seed"]):
            s = summary(row)
            taught += s["taught"]
            c = f"{s['control'][0]:.0%}/{s['control'][1]:.0%}" if s["control"] else "-"
            lines.append(f"{tag:<16}{row['seed']:>5}  {s['greedy'][0]:>4.0%}->{s['greedy'][1]:>4.0%}  "
                         f"{s['sampled'][0]:>4.0%}->{s['sampled'][1]:>4.0%}  {c:>9}  "
                         f"{s['malformed'][0]:>4.0%}/{s['malformed'][1]:<4.0%}  {row['result']['seconds']:>5.0f}  "
                         f"{'yes' if s['taught'] else 'no'}")
        greedy = [summary(r)["greedy"][1] for r in runs]
        lines.append(f"{tag:<16}{'all':>5}  taught {taught}/{len(runs)}; clean greedy after "
                     f"{statistics.fmean(greedy):.0%} (min {min(greedy):.0%}); "
                     f"{statistics.fmean(r['result']['seconds'] for r in runs):.0f} s per seed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--sft-steps", type=int, default=80)
    p.add_argument("--tag", default="demo", help="the name of these settings in the table")
    p.add_argument("--start", choices=("weak", "random"), default="weak",
                   help="the start's labels: weak (the demo's) or random colours (an image-blind start)")
    p.add_argument("--reward", choices=("composite", "truth"), default="composite",
                   help="the demo's reward, or ground truth (1 for a clean right caption, else 0)")
    for f in dataclasses.fields(__import__("capreward.cli.demo", fromlist=["GRPOSettings"]).GRPOSettings):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    p.add_argument("--out", default="runs/demo_seeds.jsonl")
    p.add_argument("--table", default=None, help="print the table of this file and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_rows(Path(args.table))))
        return 0

    from capreward.cli import demo
    from capreward.testing.trained_clip import TrainedClipFactory, trained_clip_path

    base = demo.DEMO_SETTINGS
    settings = dataclasses.replace(base, **{f.name: getattr(args, f.name) for f in dataclasses.fields(base)
                                            if getattr(args, f.name) is not None})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    code = source_hash()
    inputs = {"settings": dataclasses.asdict(settings), "steps": args.steps, "sft_steps": args.sft_steps,
              "reward": args.reward, "start": args.start, "code": code}
    rows = read_rows(out)
    keep = [r for r in rows if r["tag"] != args.tag or r["inputs"] == inputs]
    if len(keep) != len(rows):  # rows of this tag whose inputs changed are dropped
        out.write_text("".join(json.dumps(r) + "\n" for r in keep))
    done = {r["seed"] for r in keep if r["tag"] == args.tag}
    trained_clip_path(log=None)
    clip = TrainedClipFactory()
    with demo.quiet_third_parties(), demo.one_thread():
        for seed in parse_seeds(args.seeds):
            if seed in done:
                continue
            start, cpu = time.perf_counter(), time.process_time()
            result = run_one(clip, seed, args.steps, settings, args.sft_steps, args.reward, args.start)
            result["cpu_seconds"] = time.process_time() - cpu
            row = {"tag": args.tag, "seed": seed, "inputs": inputs, "result": result}
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            s = summary(row)
            print(f"{args.tag} seed {seed}: greedy {s['greedy'][0]:.0%} -> {s['greedy'][1]:.0%}, sampled "
                  f"{s['sampled'][0]:.0%} -> {s['sampled'][1]:.0%}, taught {s['taught']} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    print(table([r for r in read_rows(out) if r["tag"] == args.tag]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
