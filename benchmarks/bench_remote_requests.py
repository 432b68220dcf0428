"""Requests per caption for exact remote judge scores: the digit tree of one-token requests against one
scoring request per caption (SGLang's ``/generate`` with ``token_ids_logprob``, vLLM's batched chat with
``logprob_token_ids``).

Each judge is the project's tiny trained one behind the test chat server (a real HTTP server on 127.0.0.1
that speaks the chat completions, SGLang and vLLM protocols); every request is counted by the server
itself (``GET /stats``). Printed per metric and backend: requests, requests per caption, seconds, and the
largest distance of a score to the local judge's exact one (the same model in process).

- ``openai``: :class:`~capreward.judges.remote.OpenAIJudge` on a server that lists 1000 alternatives per
  token (``--max-logprobs 1000``): the exact digit tree of one-token requests (G-VEval, VisCE²), one
  request per claim or question (claims, QA utility) - what main did;
- ``sglang`` / ``vllm``: :class:`~capreward.judges.sglang.SGLangJudge` /
  :class:`~capreward.judges.vllm.VLLMJudge`.

    .venv/bin/python benchmarks/bench_remote_requests.py [--captions 4] [--metrics gveval visce2 claims qa] [--json]

Trains the tiny judges on first use (minutes on a CPU; cached in ~/.cache/capreward).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time

import numpy as np

COLOURS = ("green", "blue", "red", "yellow")
WIDE = 1000


def backends(server, judge_dir, model):
    from capreward.judges import OpenAIJudge, SGLangJudge, VLLMJudge
    from capreward.judges.prompts import LLAVA_V1_CHAT_TEMPLATE

    template = None if model == "tiny-qa" else LLAVA_V1_CHAT_TEMPLATE
    return {
        "openai": OpenAIJudge(server.base_url, model, api_key_env=None, timeout=600, top_logprobs_cap=WIDE),
        "sglang": SGLangJudge(server.base_url.removesuffix("/v1"), judge_dir, chat_template=template, timeout=600),
        "vllm": VLLMJudge(server.base_url, model, judge_dir, timeout=600),
    }


def sent(server) -> int:
    stats = server.stats()
    return stats["chat_requests"] + stats["batch_requests"] + stats["generate_requests"]


def measure(server, name, backend_name, run, reference, n):
    server.control(reset=True)
    start = time.perf_counter()
    values = np.asarray(run(), dtype=np.float64)
    seconds = time.perf_counter() - start
    requests = sent(server)
    gap = np.abs(values - reference)
    return {"metric": name, "backend": backend_name, "captions": n, "requests": requests,
            "per_caption": requests / n, "seconds": seconds,
            "max_gap": float(np.nanmax(gap)) if np.isfinite(gap).any() else float("nan"),
            "scored": int(np.isfinite(values).sum())}


def vlm_rows(metrics, n):
    from capreward import GVEval, VisCE2
    from capreward.judges import LocalChatJudge
    from capreward.testing.chat_server import ChatServer
    from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge, tiny_vlm_judge_dir

    judge_dir = tiny_vlm_judge_dir()
    local = LocalChatJudge(tiny_vlm_judge(), batch_size=8)
    captions = [f"a {COLOURS[i % 4]} {('ball', 'kite', 'car', 'box')[i % 4]}" for i in range(n)]
    rows = []
    with ChatServer("local", judge_dir=judge_dir, model="tiny-vlm", max_logprobs=WIDE,
                    log_path=tempfile.mktemp(suffix=".log")) as server:
        judges = backends(server, judge_dir, "tiny-vlm")
        if "gveval" in metrics:
            images = [probe_image("gveval", COLOURS[i % 4]) for i in range(n)]
            want = GVEval(local, max_tokens=120, requery=0).score(captions, images=images).score
            for name, judge in judges.items():
                def run(judge=judge):
                    return GVEval(judge, max_tokens=120, requery=0, tree_top_logprobs=WIDE).score(captions, images=images).score
                rows.append(measure(server, "G-VEval", name, run, want, n))
        if "visce2" in metrics:
            images = [probe_image("visce2", COLOURS[i % 4]) for i in range(n)]
            want = VisCE2(local, expected=True).score(captions, images).expected
            for name, judge in judges.items():
                def run(judge=judge):
                    with tempfile.TemporaryDirectory() as cache:
                        return VisCE2(judge, expected=True, cache_dir=cache, tree_top_logprobs=WIDE).score(captions, images).expected
                rows.append(measure(server, "VisCE2", name, run, want, n))
    return rows


def claim_rows(n):
    from capreward.judges import LocalChatJudge
    from capreward.scorers.claims import ClaimScorer
    from capreward.testing.chat_server import ChatServer
    from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge, tiny_claim_judge_dir

    pairs = [("red", "green"), ("green", "yellow"), ("blue", "red"), ("yellow", "blue")]
    images = [claim_image(*pairs[i % 4]) for i in range(n)]
    captions = [f"the background is {pairs[i % 4][0]}. there is a {pairs[(i + 1) % 4][1]} patch. a small square."
                for i in range(n)]
    want = ClaimScorer(LocalChatJudge(tiny_claim_judge()), cache_size=0).score(captions, images).precision
    judge_dir = tiny_claim_judge_dir()
    rows = []
    with ChatServer("local", judge_dir=judge_dir, model="tiny-claims", max_logprobs=WIDE,
                    log_path=tempfile.mktemp(suffix=".log")) as server:
        for name, judge in backends(server, judge_dir, "tiny-claims").items():
            def run(judge=judge):
                return ClaimScorer(judge, cache_size=0).score(captions, images).precision
            rows.append(measure(server, "claims", name, run, want, n))
    return rows


def qa_rows(n):
    from capreward.scorers.qa_utility import QAUtility
    from capreward.testing.chat_server import ChatServer
    from capreward.testing.tiny_qa_judge import colour_questions, qa_backend, tiny_qa_judge_dir

    captions = [f"a {COLOURS[i % 4]} ball on the grass." for i in range(n)]
    questions = []  # three questions per caption: the colour question with its options in three orders
    for i in range(n):
        (question,) = colour_questions(COLOURS[i % 4])
        options = question["options"]
        questions.append([{"question": question["question"], "options": options[r:] + options[:r],
                           "answer": (question["answer"] - r) % len(options)} for r in range(3)])
    want = QAUtility(qa_backend(), cache_size=0).score(captions, questions=questions).score
    judge_dir = tiny_qa_judge_dir()
    rows = []
    with ChatServer("text", judge_dir=judge_dir, model="tiny-qa", max_logprobs=WIDE,
                    log_path=tempfile.mktemp(suffix=".log")) as server:
        for name, judge in backends(server, judge_dir, "tiny-qa").items():
            def run(judge=judge):
                return QAUtility(judge, cache_size=0).score(captions, questions=questions).score
            rows.append(measure(server, "QA utility", name, run, want, n))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captions", type=int, default=4)
    parser.add_argument("--metrics", nargs="+", default=["gveval", "visce2", "claims", "qa"],
                        choices=["gveval", "visce2", "claims", "qa"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("capreward").setLevel(logging.WARNING)
    rows = vlm_rows(args.metrics, args.captions) if {"gveval", "visce2"} & set(args.metrics) else []
    if "claims" in args.metrics:
        rows += claim_rows(args.captions)
    if "qa" in args.metrics:
        rows += qa_rows(args.captions)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"exact remote scores, {args.captions} captions, requests counted by the test chat server")
    print(f"{'metric':>10} {'backend':>7} {'requests':>8} {'per caption':>11} {'seconds':>8} {'max |score - local|':>20} {'scored':>6}")
    base = {}
    for r in rows:
        base.setdefault(r["metric"], r["requests"])
        print(f"{r['metric']:>10} {r['backend']:>7} {r['requests']:>8} {r['per_caption']:>11.1f} {r['seconds']:>8.1f} "
              f"{r['max_gap']:>20.2e} {r['scored']:>6}")
    for r in rows:
        if r["backend"] != "openai":
            print(f"{r['metric']} on {r['backend']}: {base[r['metric']] / max(1, r['requests']):.1f}x fewer requests than the one-token path")


if __name__ == "__main__":
    main()
