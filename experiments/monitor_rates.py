"""Experiment: the Goodhart monitor's false-alarm and missed-alarm rates, replayed on recorded runs.

Every GRPO run of ``experiments/demo_seeds.py`` and ``experiments/scenes_rl.py`` keeps the monitor's
per-step rows (the training reward's mean beside each held-out judge's on the same samples). This script
labels each run from its *held-out* evaluation, which the monitor never sees, and replays the rows
through :class:`capreward.callbacks.GoodhartMonitor` (:meth:`~capreward.callbacks.GoodhartMonitor.record`)
under the default settings and under variants:

- **learning**: the run taught (colour world: the demo's rule, :func:`capreward.cli.demo.taught`; scenes:
  held-out exact accuracy up by at least 5 points and hallucinated objects not up);
- **collapse**: the training reward rose (last quarter of the steps above the first) while held-out
  correctness did not (colour: clean greedy and sampled accuracy at or below the start's; scenes: exact
  accuracy at or below the start's);
- anything else is **mixed** (listed, not counted).

A false alarm is a learning run on which the monitor raised an alarm; a missed alarm is a collapse on
which it raised none. Both are counted twice: over the whole run (:attr:`GoodhartMonitor.fired`, an alarm
at any step) and at the run's end (:meth:`GoodhartMonitor.verdict` after the last step: the first window
against the last; an alarm raised mid-run that the judges caught up with is no longer standing). Rates are
given per judge set: ground truth alone, the held-out CLIP alone, both::

    python experiments/monitor_rates.py runs/demo_seeds2.jsonl runs/scenes_rl.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_seeds import read_rows  # noqa: E402

#: Monitor settings replayed: name -> GoodhartMonitor keyword arguments (judges aside).
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "old test (window 16, follow 0.05, z 0)": {"window": 16, "follow": 0.05, "z": 0.0},
}
JUDGE_SETS = {"truth": ("truth",), "held-out CLIP": ("held_out_clip_s",), "both": ("truth", "held_out_clip_s")}


def colour_label(row: dict[str, Any]) -> str:
    from capreward.cli import demo
    from capreward.testing.colour_task import ColourEval

    r = row["result"]
    before, after = ColourEval(**r["before"]), ColourEval(**r["after"])
    control = ColourEval(**r["control"]) if r.get("control") else None
    if demo.taught(before, after, control):
        return "learning"
    k = max(1, len(r["reward"]) // 4)
    rose = statistics.fmean(r["reward"][-k:]) > statistics.fmean(r["reward"][:k])
    if rose and after.greedy_right <= before.greedy_right and after.sampled_right <= before.sampled_right:
        return "collapse"
    return "mixed"


def scenes_label(row: dict[str, Any], start: dict[str, Any]) -> str:
    g, s = row["result"]["graded"]["greedy"], start["result"]["graded"]["greedy"]
    traj = row["result"]["trajectory"]
    k = max(1, len(traj) // 4)
    rose = statistics.fmean(traj[-k:]) > statistics.fmean(traj[:k])
    if g["exact"] >= s["exact"] + 0.05 and g["hallucination"] <= s["hallucination"]:
        return "learning"
    if rose and g["exact"] <= s["exact"]:
        return "collapse"
    return "mixed"


def runs(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Every recorded GRPO run with its monitor rows: {"name", "label", "rows"}."""
    out = []
    for path in paths:
        rows = read_rows(Path(path))
        starts = {r["seed"]: r for r in rows if r.get("arm") == "start"}
        for row in rows:
            monitor = row["result"].get("monitor")
            if not monitor:
                continue
            if "arm" in row:  # scenes_rl
                if row["seed"] not in starts:
                    continue
                label, name = scenes_label(row, starts[row["seed"]]), f"scenes {row['arm']} seed {row['seed']}"
            else:
                label, name = colour_label(row), f"colour {row['tag']} seed {row['seed']}"
            out.append({"name": name, "label": label, "rows": monitor})
    return out


def replay(rows: list[dict[str, float]], judges: tuple[str, ...], settings: dict[str, Any]) -> tuple[bool, int | None, bool]:
    """Whether the monitor fired on ``rows`` with ``judges`` under ``settings`` (at any step), its first
    alarm's step, and whether an alarm stands at the end (the verdict after the last row)."""
    from capreward.callbacks import GoodhartMonitor

    monitor = GoodhartMonitor({name: (lambda **_: []) for name in judges}, warn=lambda message: None, **settings)
    for row in rows:
        monitor.record({"step": row["step"], "train": row["train"], **{j: row[j] for j in judges}})
    return monitor.fired, (monitor.alarms[0][0] if monitor.alarms else None), monitor.verdict() is not None


def table(all_runs: list[dict[str, Any]]) -> str:
    learning = [r for r in all_runs if r["label"] == "learning"]
    collapse = [r for r in all_runs if r["label"] == "collapse"]
    mixed = [r for r in all_runs if r["label"] == "mixed"]
    lines = [f"{len(learning)} learning runs, {len(collapse)} collapses, {len(mixed)} mixed (not counted)", "",
             "| monitor settings | judges | false alarms: any step | false alarms: standing at the end | "
             "missed alarms: any step | missed alarms: at the end | first alarm on a collapse (median step) |",
             "|---|---|---|---|---|---|---|"]
    for sname, settings in SETTINGS.items():
        for jname, judges in JUDGE_SETS.items():
            if not all(all(j in r["rows"][0] for j in judges) for r in all_runs):
                continue
            quiet = [replay(r["rows"], judges, settings) for r in learning]
            caught = [replay(r["rows"], judges, settings) for r in collapse]
            false = [r["name"] for r, (fired, _, _) in zip(learning, quiet) if fired]
            false_end = [r["name"] for r, (_, _, standing) in zip(learning, quiet) if standing]
            missed = [r["name"] for r, (fired, _, _) in zip(collapse, caught) if not fired]
            missed_end = [r["name"] for r, (_, _, standing) in zip(collapse, caught) if not standing]
            steps = [s for fired, s, _ in caught if fired]
            n, m = len(learning), len(collapse)
            lines.append(f"| {sname} | {jname} | {len(false)}/{n} | {len(false_end)}/{n} | {len(missed)}/{m} | "
                         f"{len(missed_end)}/{m} | {statistics.median(steps) if steps else '-'} |")
            if sname == "defaults":
                lines += [f"|  | | {', '.join(false) or 'none'} | {', '.join(false_end) or 'none'} | "
                          f"{', '.join(missed) or 'none'} | {', '.join(missed_end) or 'none'} | |"]
    lines.append("")
    lines += [f"- {r['name']}: {r['label']}" for r in all_runs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="JSONL files of experiments/demo_seeds.py and experiments/scenes_rl.py")
    args = p.parse_args(argv)
    print(table(runs(args.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
