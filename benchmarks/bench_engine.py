"""An in-process inference engine (vLLM's offline ``LLM``, SGLang's ``Engine``) against capreward's own batched
local judge, on the same model: answers, the exact score distributions, and seconds.

Records which engines the machine has (``pip list`` filtered for vllm, sglang, flash), then, for each
engine installed: a LLaVA-architecture judge with random weights (``--arch small``: ~110M parameters, 576
image tokens; saved to a temporary directory for the engine to load), ``--requests`` VisCE²-style
requests (``--images`` images), answered by :class:`~capreward.judges.engines.EngineJudge` and by
:class:`~capreward.judges.local_chat.LocalChatJudge`: requests/s of each, tokens identical, the largest
log-probability difference, and the exact digit-tree distributions of both (largest difference; seconds).
Without an engine it writes the record and says so.

    python benchmarks/bench_engine.py --device cuda --dtype float16 --json-out engine.json
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import synchronize, write_json  # noqa: E402

ENGINES = ("vllm", "sglang")


def installed() -> dict:
    """Which engines import here, and ``pip list`` filtered for vllm, sglang and flash (as text)."""
    found = {name: importlib.util.find_spec(name) is not None for name in ENGINES}
    try:
        listing = subprocess.run([sys.executable, "-m", "pip", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        listing = f"pip list failed: {exc}"
    lines = [line for line in listing.splitlines() if any(k in line.lower() for k in ("vllm", "sglang", "flash"))]
    return {"importable": found, "pip_list": lines}


def build_engine(name: str, directory: str, dtype: str):
    if name == "vllm":
        from vllm import LLM

        return LLM(model=directory, dtype=dtype, max_logprobs=20, enable_prefix_caching=True, gpu_memory_utilization=0.5)
    import sglang

    return sglang.Engine(model_path=directory, dtype=dtype, mem_fraction_static=0.5)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="small", choices=("tiny", "small"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    result: dict = {"engines": installed()}
    print("engines importable: " + ", ".join(f"{k} {v}" for k, v in result["engines"]["importable"].items()))
    print("pip list (vllm|sglang|flash): " + ("; ".join(result["engines"]["pip_list"]) or "none"))
    present = [n for n, ok in result["engines"]["importable"].items() if ok]
    if not present or torch.device(args.device).type != "cuda":
        result["skipped"] = "no vllm or sglang on this machine" if not present else "the engines need a GPU"
        print(result["skipped"])
        write_json(args.json_out, result)
        return result

    from bench_fleur import ARCHS, COMMON

    from capreward.judges import ChatRequest, LocalChatJudge, user_turn
    from capreward.judges.engines import EngineJudge
    from capreward.testing import TinyLlavaSpec, build_tiny_llava, fleur_task_image

    dims = dict(COMMON, **ARCHS[args.arch])
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model, processor = build_tiny_llava(TinyLlavaSpec(**dims), dtype=dtype, device=args.device)
    local = LocalChatJudge((model, processor), batch_size=args.requests)
    colours = ["red", "blue", "green", "yellow", "purple", "orange"]
    images = [fleur_task_image(colours[i % len(colours)], random.Random(i), size=(400, 300)) for i in range(args.images)]
    requests = [ChatRequest(turns=(user_turn(f"Rate the caption from 0 to 100. Caption: a {colours[k % 6]} square {k}",
                                             [images[k % args.images]]),), max_tokens=args.max_tokens, top_logprobs=5)
                for k in range(args.requests)]

    def timed(fn):
        synchronize(args.device)
        start = time.perf_counter()
        out = fn()
        synchronize(args.device)
        return time.perf_counter() - start, out

    local.generate(requests[:2])
    t_local, ours = timed(lambda: local.generate(requests))
    prefixes = [[] for _ in requests]
    t_local_tree, tree_local = timed(lambda: local.integer_distributions(requests, prefixes))
    result["local"] = {"generate_s": t_local, "requests_per_s": len(requests) / t_local, "tree_s": t_local_tree}
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        processor.save_pretrained(directory)
        for name in present:
            row: dict = {}
            try:
                engine = build_engine(name, directory, args.dtype)
                judge = EngineJudge(engine, local.judge, batch_size=1024)
                judge.generate(requests[:2])
                t, theirs = timed(lambda: judge.generate(requests))
                same = sum(a.token_ids == b.token_ids for a, b in zip(ours, theirs))
                diff = max((abs(x.logprob - y.logprob) for a, b in zip(ours, theirs) for x, y in zip(a.tokens, b.tokens)),
                           default=0.0)
                t_tree, tree = timed(lambda: judge.integer_distributions(requests, prefixes))
                row = {"generate_s": t, "requests_per_s": len(requests) / t, "tokens_identical": same,
                       "requests": len(requests), "max_logprob_difference": diff, "tree_s": t_tree,
                       "tree_max_difference": float(np.abs(tree - tree_local).max()),
                       "speed_vs_local": t_local / t}
            except Exception as exc:  # noqa: BLE001 - one engine's failure is a figure, not the end of the step
                row = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            result[name] = row
            print(f"{name}: {row}")
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
