"""How long reading a long caption takes (capreward.caption_reading.read_caption), per kind of text.

Every door reads a caption before anything else (rewards, guards, the injection detector, the claim
splitter), so a caption as long as a door accepts must read in linear time. Prints the seconds per
caption of ``--chars`` characters for: plain ASCII prose, CJK, one letter and a space repeated (the worst
case of the spelt-letter search), and a hostile mix (look-alike letters, accents, spelt letters, leet,
zero-width spaces, Cyrillic, CJK words); with ``--compare REV`` the same captions read by the
``caption_reading.py`` of git revision REV (imported from ``git show``), and the ratio.

    .venv/bin/python benchmarks/bench_reading.py [--chars 1000000] [--repeats 2] [--compare 5b8107d] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def captions(chars: int) -> dict[str, str]:
    rng = random.Random(0)
    words = ["a", "red", "ball", "on", "the", "grass", "Mädchen", "blu\u0435", "r e d", "b1ue", "ima\u200bge",
             "красный", "红色", "tiếng", "W3C", "b(l)u(e)"]
    return {
        "ascii prose": ("a red ball on the grass. " * (chars // 25 + 1))[:chars],
        "cjk": ("红色的图片。" * (chars // 6 + 1))[:chars],
        "one letter spaced": ("a " * (chars // 2 + 1))[:chars],
        "hostile mix": " ".join(rng.choice(words) for _ in range(chars // 3))[:chars],
    }


def old_reader(rev: str):
    """``read_caption`` of ``caption_reading.py`` at git revision ``rev`` (its package imports resolve
    to the current tree)."""
    source = subprocess.run(["git", "show", f"{rev}:src/capreward/caption_reading.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "caption_reading_old.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("capreward._caption_reading_old", path,
                                                  submodule_search_locations=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "capreward"
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.read_caption


def best_seconds(read, text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        getattr(read, "cache_clear", lambda: None)()
        start = time.perf_counter()
        read(text)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compare", metavar="REV", help="also time caption_reading.py of this git revision")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from capreward.caption_reading import read_caption

    old = old_reader(args.compare) if args.compare else None
    rows = []
    for name, text in captions(args.chars).items():
        row = {"caption": name, "chars": len(text), "seconds": best_seconds(read_caption, text, args.repeats)}
        if old is not None:
            row["seconds_old"] = best_seconds(old, text, args.repeats)
            row["speed_up"] = row["seconds_old"] / row["seconds"]
        rows.append(row)
        if not args.json:
            extra = f", {args.compare}: {row['seconds_old']:.2f} s ({row['speed_up']:.1f}x)" if old else ""
            print(f"{name:18s} {len(text):>9,d} chars: {row['seconds']:.2f} s{extra}", flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
