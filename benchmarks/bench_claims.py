"""The claim reward on a GRPO group: batched verification against one judge request per claim.

One image, 16 captions of 8-12 distinct claims each (about 160 claims), verified on the same local
LLaVA-architecture judge with random weights (nothing is downloaded; ``--arch tiny`` is the 16-image-token
toy, ``small`` a ~100M-parameter judge with 576 image tokens as in the FLEUR benchmark, ``llava-7b``
LLaVA-1.5-7B's shapes for a GPU: ``--device cuda --dtype float16``):

- **batched**: :class:`~capreward.scorers.claims.ClaimScorer` as a reward calls it: every claim of the
  group in prefills of ``--batch-size`` rows, the shared prefix (system text, image, question up to the
  claim) run once per chunk, no cache (cold);
- **per claim**: the same exact reading with one judge request per claim (:class:`OneRequestPerClaim`:
  each claim's request read alone, as a server answers one request: its prompt encoded, its image
  preprocessed and encoded, and a prefill of the full prompt, image included).

The two paths run interleaved (batched, per claim, batched, ...: ``--repeats`` rounds) so that a load
change on a shared machine hits both alike. Prints wall seconds of each (the best round, and the median),
the speed-up (best against best, and the median of the rounds' own ratios), the prefills each ran, and
the largest difference between the two paths' raw P(yes) (they must agree: same model, same reading).
``--threads 1`` (the default) keeps torch's intra-op threads from spinning against other processes on a
busy machine; on an idle one ``--threads`` = the cores is fair to both. Run twice; quote both runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_common import synchronize, write_json  # noqa: E402

from capreward.judges import LocalChatJudge
from capreward.scorers.claims import ClaimScorer, YesNoReader
from capreward.testing import TinyLlavaSpec, build_tiny_llava
from capreward.testing.tiny_claim_judge import claim_image

ARCHS = {
    "tiny": dict(),
    "small": dict(text_hidden=768, text_layers=8, text_heads=12, text_kv_heads=12, text_intermediate=2048,
                  vision_hidden=256, vision_layers=4, vision_heads=4, vision_intermediate=1024, image_size=336,
                  patch_size=14, max_positions=4096),
    # LLaVA-1.5-7B's shapes (CLIP ViT-L/14-336 + LLaMA-7B, 576 image tokens), random weights: a GPU in fp16
    "llava-7b": dict(text_hidden=4096, text_layers=32, text_heads=32, text_kv_heads=32, text_intermediate=11008,
                     vision_hidden=1024, vision_layers=24, vision_heads=16, vision_intermediate=4096, image_size=336,
                     patch_size=14, max_positions=4096, vocab_size=32064),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NOUNS = "man woman child dog cat bicycle street park beach ball shirt hat car bus train table tree sky grass water".split()
ADJECTIVES = "red blue green white black small large young old wooden bright dark tall short striped".split()
VERBS = "sits stands runs holds wears walks lies rides leans waits".split()


class OneRequestPerClaim(YesNoReader):
    """The baseline: every request read on its own (one judge call per claim)."""

    def read(self, requests, groups=None):
        groups = list(groups) if groups is not None else [None] * len(requests)
        return [answer for request, group in zip(requests, groups) for answer in YesNoReader.read(self, [request], [group])]


def make_captions(rng: random.Random, n: int) -> list[str]:
    """``n`` captions of 8-12 sentences, each sentence one claim ("a red car sits near the tree.")."""
    out = []
    for _ in range(n):
        claims = []
        while len(claims) < rng.randint(8, 12):
            claim = f"a {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} near the {rng.choice(NOUNS)}"
            if claim not in claims:
                claims.append(claim)
        out.append(". ".join(claims) + ".")
    return out


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    words = tuple(dict.fromkeys(NOUNS + ADJECTIVES + VERBS + ["yes", "no", "near", "the"]))
    device = getattr(args, "device", "cpu")
    dtype = DTYPES[getattr(args, "dtype", "float32")]
    model, processor = build_tiny_llava(TinyLlavaSpec(words=words, **ARCHS[args.arch]), dtype=dtype, device=device)
    judge = LocalChatJudge((model, processor))
    image = claim_image("red", "green", random.Random(0))
    captions = make_captions(random.Random(1), args.captions)
    images = [image] * len(captions)

    # raw P(yes) (normalise=False): the agreement check compares the probabilities themselves
    batched = ClaimScorer(judge, batch_size=args.batch_size, cache_size=0, normalise=False)
    per_claim = ClaimScorer(judge, batch_size=1, cache_size=0, normalise=False)
    per_claim.reader = OneRequestPerClaim(judge, batch_size=1)
    batched.score(captions[:1], images=images[:1])  # warm-up (tokenizer scan, first allocations)
    rounds: dict[str, list[float]] = {"batched": [], "per_claim": []}
    results = {}
    for _ in range(args.repeats):  # interleaved: a load change hits both paths alike
        for name, scorer in (("batched", batched), ("per_claim", per_claim)):
            synchronize(device)
            start = time.perf_counter()
            results[name] = scorer.score(captions, images=images)
            synchronize(device)
            rounds[name].append(time.perf_counter() - start)
    timings = {name: min(values) for name, values in rounds.items()}
    ratios = sorted(p / b for p, b in zip(rounds["per_claim"], rounds["batched"]))
    n_claims = sum(len(c) for c in results["batched"].claims)
    diff = max(abs(a.p - b.p) for ca, cb in zip(results["batched"].claims, results["per_claim"].claims)
               for a, b in zip(ca, cb))
    return {
        "arch": args.arch, "device": str(device), "dtype": str(dtype).removeprefix("torch."), "captions": len(captions), "claims": n_claims, "batch_size": args.batch_size,
        "threads": args.threads, "batched_s": round(timings["batched"], 3), "per_claim_s": round(timings["per_claim"], 3),
        "batched_median_s": round(statistics.median(rounds["batched"]), 3),
        "per_claim_median_s": round(statistics.median(rounds["per_claim"]), 3),
        "speedup": round(timings["per_claim"] / timings["batched"], 2),
        "speedup_median_of_rounds": round(statistics.median(ratios), 2),
        "rounds": args.repeats,
        "claims_per_s_batched": round(n_claims / timings["batched"], 1),
        "claims_per_s_per_claim": round(n_claims / timings["per_claim"], 1),
        "prefills_batched": -(-n_claims // args.batch_size), "prefills_per_claim": n_claims,
        "max_abs_p_yes_difference": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    parser.add_argument("--captions", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--json-out", help="also write the results to this JSON file")
    args = parser.parse_args()
    out = run(args)
    write_json(args.json_out, out)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24s} {v}")


if __name__ == "__main__":
    main()
