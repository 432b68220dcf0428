"""What the bounds at capreward's doors cost (issue 43 item 5): the caption budget and the claims view.

1. **The largest accepted caption.** For captions of exactly ``max_chars`` characters (16 Ki, the
   default budget) of several kinds (plain words, short sentences, hostile: spaced letters, leet,
   look-alike letters, invisible characters, combining marks), the seconds of: the budget check
   (:func:`capreward.caption_budget.caption_problem`, which counts claims for a caption this long), the
   reading (:func:`capreward.caption_reading.read_caption`, cold cache), the composite's guards
   (:class:`capreward.rewards.Guards`), a CLIP-S reward call and a claims-reward call on the trained tiny
   claim judge (one caption, one image), each against the same call on an ordinary 60-character caption.
   And the cost of refusing a 1 MB caption (the budget check alone: it is never read).
2. **The claims view** of ``capreward report``: seconds to mark n claims whose spans are stale (one claim
   repeated n times, and n distinct claims in caption order) for n = 100 .. 6400, against the span search
   it replaced (:func:`old_locate`, run up to ``--old-up-to`` claims: it is cubic).

Prints one line per figure (``--json`` for one JSON object). Not a test: run it on an idle machine, twice.
"""

from __future__ import annotations

import argparse
import json
import random
import time

SIZES = (100, 200, 400, 800, 1600, 3200, 6400)


def timed(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def captions_of_budget(n: int) -> dict[str, str]:
    rng = random.Random(0)
    words = "a red ball on the green grass near a blue car with white stripes and a small dog".split()
    cases = {
        "plain words": " ".join(rng.choice(words) for _ in range(n)),
        "short sentences": " ".join(f"the {rng.choice(words)} is {rng.choice(words)}." for _ in range(n)),
        "spaced letters": "r e d " * n,
        "leet": "b1ue r3d " * n,
        "look-alike letters": "bluе rеd " * n,  # Cyrillic е
        "invisible characters": "a\u200bb " * n,
        "combining marks": "e\u0301" * n,
    }
    return {k: v[:n] for k, v in cases.items()}


def old_locate(caption: str, text: str, start: int, end: int, taken: list[tuple[int, int]]) -> tuple[int, int]:
    """The span search of the claims view before issue 43 (each claim: the caption lowered again, every
    occurrence tested against every span already taken)."""
    if 0 <= start < end <= len(caption) and caption[start:end].lower() == text.lower():
        return start, end
    lower, needle, at = caption.lower(), text.lower(), 0
    while needle:
        at = lower.find(needle, at)
        if at < 0:
            break
        if not any(at < e and at + len(needle) > s for s, e in taken):
            return at, at + len(needle)
        at += 1
    return -1, -1


def old_view(row: dict) -> None:
    taken: list[tuple[int, int]] = []
    for item in row["claims/claims"]:
        s, e = old_locate(row["caption"], item["text"], item["start"], item["end"], taken)
        if s >= 0:
            taken.append((s, e))


def claim_rows(n: int) -> dict[str, dict]:
    repeated = ". ".join(["A red ball"] * n) + "."
    parts = [f"object {k} is red" for k in range(n)]
    return {
        "repeated, stale spans": {"caption": repeated,
                                  "claims/claims": [{"text": "a red ball", "start": -1, "end": -1, "p": 0.9}] * n},
        "distinct, stale spans": {"caption": ". ".join(parts) + ".",
                                  "claims/claims": [{"text": p, "start": 5, "end": 3, "p": 0.2} for p in parts]},
    }


def bench_claims_view(old_up_to: int, out: dict) -> None:
    from capreward.report.claims_view import claims_section

    for n in SIZES:
        for kind, row in claim_rows(n).items():
            new = timed(lambda: claims_section(row), 3)
            line = {"claims": n, "kind": kind, "seconds": round(new, 5)}
            if n <= old_up_to:
                line["before_seconds"] = round(timed(lambda: old_view(row)), 4)
            out.setdefault("claims_view", []).append(line)
            print(f"claims view, {kind:22s} {n:5d} claims: {new:8.4f} s"
                  + (f"  (before: {line['before_seconds']:.3f} s)" if "before_seconds" in line else ""))


def bench_budget(out: dict, with_claims: bool) -> None:
    from capreward.caption_budget import caption_problem, get_caption_budget
    from capreward.caption_reading import read_caption
    from capreward.rewards import CLIPScoreReward, Guards
    from capreward.testing import save_tiny_clip_openai
    from capreward.testing.tiny_claim_judge import claim_image

    import tempfile
    from pathlib import Path

    n = get_caption_budget().max_chars
    image = claim_image("red", "green", random.Random(1))
    clip = CLIPScoreReward(model=str(save_tiny_clip_openai(Path(tempfile.mkdtemp()) / "clip.pt", seed=0)))
    guards = Guards()
    claims = None
    if with_claims:
        from capreward.judges import LocalChatJudge
        from capreward.rewards.claims import ClaimsReward
        from capreward.testing.tiny_claim_judge import tiny_claim_judge

        claims = ClaimsReward(backend=LocalChatJudge(tiny_claim_judge()))
    ordinary = "the background is red. there is a green patch in a corner."
    clip(None, [ordinary], image=[image])  # models loaded before anything is timed
    if claims is not None:
        claims(None, [ordinary], image=[image])
    cases = {"ordinary (60 chars)": ordinary, **captions_of_budget(n)}
    for kind, caption in cases.items():
        read_caption.cache_clear()
        row = {"kind": kind, "chars": len(caption),
               "budget_check_s": timed(lambda: caption_problem(caption)),
               "read_s": None, "guards_s": None, "clip_s_reward_s": None}
        assert caption_problem(caption) is None, (kind, caption_problem(caption))
        read_caption.cache_clear()
        row["read_s"] = timed(lambda: read_caption(caption))
        row["guards_s"] = timed(lambda: guards.terms(caption))
        read_caption.cache_clear()
        row["clip_s_reward_s"] = timed(lambda: clip(None, [caption], image=[image]))
        if claims is not None:
            read_caption.cache_clear()
            row["claims_reward_s"] = timed(lambda: claims(None, [caption], image=[image]))
        out.setdefault("largest_accepted", []).append({k: (round(v, 4) if isinstance(v, float) else v)
                                                      for k, v in row.items()})
        print(f"{kind:22s} {len(caption):6d} chars: budget check {row['budget_check_s']:.4f} s, reading "
              f"{row['read_s']:.4f} s, guards {row['guards_s']:.4f} s, CLIP-S reward {row['clip_s_reward_s']:.4f} s"
              + (f", claims reward {row['claims_reward_s']:.3f} s" if "claims_reward_s" in row else ""))
    huge = "a red ball on the grass. " * 42_000  # 1 MB
    refused = timed(lambda: caption_problem(huge), 3)
    t = timed(lambda: clip(None, [huge], image=[image]))
    out["refused_1mb"] = {"chars": len(huge), "budget_check_s": round(refused, 6), "clip_s_reward_s": round(t, 4)}
    print(f"a 1 MB caption ({len(huge)} chars): refused by the budget check in {refused:.6f} s; the CLIP-S reward "
          f"call that refuses it: {t:.4f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-up-to", type=int, default=400, help="largest n the replaced span search is run at")
    parser.add_argument("--no-claims-reward", action="store_true", help="skip the claims reward (loads the tiny judge)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()
    import logging
    import warnings

    import torch

    logging.disable(logging.WARNING)  # the rewards log every unscored sample (the tiny judge's context is 512)
    warnings.simplefilter("ignore")

    torch.set_num_threads(args.threads)
    out: dict = {}
    bench_claims_view(args.old_up_to, out)
    bench_budget(out, with_claims=not args.no_claims_reward)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
