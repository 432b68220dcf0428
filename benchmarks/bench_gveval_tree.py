"""Exact score distribution over 0..100: the tree of cached decode steps against brute force.

G-VEval's expected score on a local judge needs p(k) for every k in 0..100 at the score position. The
tree (:meth:`capreward.judges.local_chat.LocalChatJudge.integer_distributions`) prefills the prompt
once and then runs 10 + 90 + 1 single-token steps per sample on copies of the cached prefix; brute force
teacher-forces each of the 101 candidate answers through the whole prompt. Both run on a LLaVA-shaped
model with random weights (nothing is downloaded) on a G-VEval-length prompt; the script checks that
they agree and prints the time of each per sample.

    python benchmarks/bench_gveval_tree.py                     # CPU, small model
    python benchmarks/bench_gveval_tree.py --hidden 256 --layers 4 --samples 4
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from capreward.judges.local_chat import LocalChatJudge
    from capreward.judges.protocol import ChatRequest, user_turn
    from capreward.judges.vlm_prompts import gveval_prompt, gveval_template, prompt_words
    from capreward.testing.tiny_llava import TinyLlavaSpec, build_tiny_llava, fleur_task_image

    spec = TinyLlavaSpec(
        text_hidden=args.hidden,
        text_layers=args.layers,
        text_intermediate=3 * args.hidden,
        max_positions=2048,
        words=tuple(prompt_words()),
    )
    chat = LocalChatJudge(build_tiny_llava(spec), batch_size=args.samples)
    judge = chat.judge
    text = gveval_prompt(gveval_template("img", "combined"), "a dog runs on the grass", ["a dog", "a brown dog runs"])
    images = [fleur_task_image("red", random.Random(i)) for i in range(args.samples)]
    requests = [ChatRequest(turns=(user_turn(text, [im]),)) for im in images]
    prefix = judge.tokenizer.encode("The final score is $", add_special_tokens=False)

    chat.integer_distributions(requests[:1], [prefix])  # warm-up (first-call allocations, lazy imports)
    start = time.perf_counter()
    exact = chat.integer_distributions(requests, [prefix] * args.samples)
    tree_s = (time.perf_counter() - start) / args.samples

    features = judge.image_features(judge.preprocess(images))
    start = time.perf_counter()
    brute = np.zeros_like(exact)
    digits = judge.digit_token_ids()
    for i, request in enumerate(requests):
        prompt = judge.encode_prompts([chat.render(request)], features.shape[1])[0] + prefix
        answers = [[digits[int(c)] for c in str(k)] for k in range(101)]
        inputs = judge.teacher_forcing_inputs([prompt] * 101, answers, [list(range(len(a) + 1)) for a in answers])
        with torch.inference_mode():
            probs = torch.softmax(judge.logits_at(inputs, features, [i] * 101).double(), -1)
        for k, a in enumerate(answers):
            p = float(np.prod([float(probs[k, t, tok]) for t, tok in enumerate(a)]))
            brute[i, k] = p * (1 - float(probs[k, len(a), digits].sum()))
    brute_s = (time.perf_counter() - start) / args.samples

    print(f"prompt tokens: {len(prompt)}  model: hidden {args.hidden} x {args.layers} layers")
    print(f"tree:        {tree_s * 1000:8.1f} ms/sample")
    print(f"brute force: {brute_s * 1000:8.1f} ms/sample  ({brute_s / tree_s:.1f}x slower)")
    print(f"max |tree - brute| = {np.abs(exact - brute).max():.3e}")


if __name__ == "__main__":
    main()
