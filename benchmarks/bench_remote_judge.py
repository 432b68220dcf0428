"""OpenAIJudge throughput against a local chat-completions server with a fixed per-request latency.

The ``echo`` test server (no model) answers every request after ``--latency`` seconds, standing in for a
model server whose answers take that long. Printed: requests/s and the speed-up over one request at a
time, per ``max_concurrency``; then the same with injected faults (a share of 500s and 429s), where
every answer is also checked to belong to its request.

    .venv/bin/python benchmarks/bench_remote_judge.py [--requests 200] [--latency 0.05] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from capreward.judges.protocol import ChatRequest, user_turn
from capreward.judges.remote import OpenAIJudge
from capreward.testing.chat_server import ChatServer


def run(server: ChatServer, n: int, concurrency: int) -> tuple[float, int]:
    judge = OpenAIJudge(
        server.base_url, "bench", api_key_env=None, max_concurrency=concurrency
    )
    requests = [ChatRequest((user_turn(f"sample {i}"),), max_tokens=16, top_logprobs=5) for i in range(n)]
    start = time.perf_counter()
    responses = judge.generate(requests)
    elapsed = time.perf_counter() - start
    wrong = sum(r.text != f"echo: sample {i}" for i, r in enumerate(responses))
    return n / elapsed, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.05, help="server seconds per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--fault-share", type=float, default=0.1, help="share of requests answered 500 or 429")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("capreward.judges.remote").setLevel(logging.ERROR)  # retries are expected here
    rows = []
    with ChatServer("echo", model="bench") as server:
        server.control(latency=args.latency)
        run(server, 8, 4)  # warm-up: imports, first connections
        base = None
        for c in args.concurrency:
            rate, wrong = run(server, args.requests, c)
            base = base or rate
            rows.append({"concurrency": c, "faults": 0, "req_per_s": rate, "speedup": rate / base, "misaligned": wrong})
        k = int(args.requests * args.fault_share / 2)
        for c in args.concurrency[-2:]:
            server.control(status=500, count=k)
            server.control(status=429, count=k)
            rate, wrong = run(server, args.requests, c)
            rows.append({"concurrency": c, "faults": 2 * k, "req_per_s": rate, "speedup": rate / base, "misaligned": wrong})
    if args.json:
        print(json.dumps({"latency_s": args.latency, "requests": args.requests, "rows": rows}, indent=2))
        return
    print(f"OpenAIJudge vs echo server, {args.requests} requests, {args.latency * 1000:.0f} ms per request")
    print(f"{'concurrency':>11} {'faults':>6} {'req/s':>8} {'speed-up':>8} {'misaligned':>10}")
    for r in rows:
        print(f"{r['concurrency']:>11} {r['faults']:>6} {r['req_per_s']:>8.1f} {r['speedup']:>8.1f} {r['misaligned']:>10}")


if __name__ == "__main__":
    main()
