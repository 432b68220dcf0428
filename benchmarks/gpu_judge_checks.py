"""The local judge's GPU-only behaviour (issue #44 item 2), checked on the device: a step of the GPU command.

On a tiny random LLaVA built on the device in fp32 (TF32 off), 2 images x 3 captions:

- batched greedy decoding (the shared prefix held once per image, decoding on the device) with the
  decode steps as CUDA graphs and without, each against a plain per-sample ``generate`` on the same GPU:
  tokens identical, largest logit difference, steps replayed as graphs, whether the first graph's
  self-check passed (``judge._graphs_ok``);
- no host synchronisation inside a decode step: every eager step and every graph replay runs under
  ``torch.cuda.set_sync_debug_mode("error")`` (a ``.item()``, a ``nonzero`` or a blocking copy raises);
- the cache's bytes against the copying design and ``generate``.

On the CPU (the dry run) the graph and synchronisation checks are reported as not run.

    python benchmarks/gpu_judge_checks.py --device cuda --json-out judge.json
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import write_json  # noqa: E402

from capreward.judges import LocalJudge
from capreward.judges.caller_text import render
from capreward.judges.images import mean_background, pad_to_square
from capreward.judges.prompts import fleur_prompt
from capreward.testing import TinyLlavaSpec, build_tiny_llava, fleur_task_image

CAPTIONS = ["a red ball", "a blue box on the wall", "the kite"]


def per_sample(judge: LocalJudge, parts, image, steps: int):
    processor = judge.processor
    square = pad_to_square(image, mean_background(processor.image_processor.image_mean))
    inputs = processor(images=square, text=render(parts), return_tensors="pt").to(judge.device)
    with torch.inference_mode():
        out = judge.model.generate(**inputs, do_sample=False, max_new_tokens=steps, output_logits=True,
                                   return_dict_in_generate=True)
    new = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    cut = next((k for k, t in enumerate(new) if t in judge.eos_token_ids), len(new))
    return new[:cut], [s[0].float() for s in out.logits]


def run(judge: LocalJudge, images, steps: int, graphs: bool, guard: bool) -> dict:
    from capreward.judges import decoding

    judge.decode_graphs = graphs
    rows = [(c, i) for i in range(len(images)) for c in CAPTIONS]
    parts = [judge.conversation_parts([(fleur_prompt(c), None)]) for c, _ in rows]
    with torch.inference_mode():
        features = judge.image_features(judge.preprocess(images))
    ids = judge.encode_prompts(parts, int(features.shape[1]))
    state = judge.start(ids, features, [i for _, i in rows])
    sizes = judge.cache_bytes(state)
    failures: list[str] = []
    originals = (LocalJudge._step_in_place, decoding.DecodeGraph.run)

    def guarded(fn):
        def inner(*args, **kwargs):
            if torch.cuda.is_current_stream_capturing():  # the graph's capture: nothing may synchronise there anyway
                return fn(*args, **kwargs)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args, **kwargs)
            except RuntimeError as exc:
                failures.append(str(exc)[:300])
                raise
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return inner

    if guard:
        LocalJudge._step_in_place = guarded(originals[0])
        decoding.DecodeGraph.run = guarded(originals[1])
    try:
        out = judge.generate_from(state, steps, keep_logits=True)
    except RuntimeError as exc:  # a synchronisation inside a step (or anything else): reported, not raised
        return {"error": str(exc)[:500], "sync_in_step_errors": failures, "graphs_ok": judge._graphs_ok}
    finally:
        LocalJudge._step_in_place, decoding.DecodeGraph.run = originals
    same, worst = 0, 0.0
    for r, (caption, i) in enumerate(rows):
        tokens, logits = per_sample(judge, parts[r], images[i], steps)
        same += out.tokens[r] == tokens
        for step, value in out.logits[r].items():
            if step < len(logits):
                worst = max(worst, float((value - logits[step]).abs().max()))
    return {"rows": len(rows), "tokens_identical": same, "max_logit_difference": worst, "graph_steps": out.graph_steps,
            "host_syncs": out.syncs, "graphs_ok": judge._graphs_ok, "sync_in_step_errors": failures,
            "cache_bytes": sizes}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model, processor = build_tiny_llava(TinyLlavaSpec(seed=3, max_positions=1024), device=args.device)
    judge = LocalJudge((model, processor))
    images = [fleur_task_image(c, random.Random(f"gpu-{c}"), size=(40, 28)) for c in ("red", "blue")]
    result: dict = {"device": args.device, "eager": run(judge, images, args.steps, graphs=False, guard=cuda)}
    if cuda:
        result["graphs"] = run(judge, images, args.steps, graphs=True, guard=True)
    else:
        result["graphs"] = "not run: CUDA graphs need a GPU"
    for name in ("eager", "graphs"):
        r = result[name]
        if isinstance(r, dict) and "error" in r:
            print(f"{name}: FAILED: {r['error']}")
        elif isinstance(r, dict):
            print(f"{name}: tokens identical {r['tokens_identical']}/{r['rows']}, max logit difference "
                  f"{r['max_logit_difference']:.2e}, graph steps {r['graph_steps']}, graphs ok {r['graphs_ok']}, "
                  f"host looks {r['host_syncs']}, synchronisations inside a step: {len(r['sync_in_step_errors'])}")
        else:
            print(f"{name}: {r}")
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
