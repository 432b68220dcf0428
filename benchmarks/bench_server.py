"""The reward server's dynamic batching: requests/s and latency with batching on and off.

Starts ``capreward serve`` as a subprocess on 127.0.0.1 twice — with ``--max-batch-size 0`` (every
request scored alone, at most ``--max-concurrent`` (4) at once: the server as it was before batching) and
with batching on (``--max-batch-size``/``--max-wait-ms``, one batch scored at a time unless
``--on-max-concurrent`` says otherwise) — and drives each with 8..32 concurrent
loopback clients (keep-alive connections), each sending requests of ``--samples`` captions about one
image (a GRPO group's shape), as OpenRLHF's workers do. Printed per client count: requests/s, p50 and
p99 latency of the best of ``--repeats`` interleaved runs, the throughput ratio on/off, and whether
every answer is identical (1e-6) between the two servers.

Also printed: the *ceiling* of batching on this machine, measured in this process without HTTP: the
same requests scored one by one (one request per scorer call, as the unbatched server does) against
merged into calls of ``--max-batch-size`` samples. The ratio of the two is the most any merging of
requests can gain here: the FLOPs are the same, only the matmuls' efficiency at ~50 token rows
against ~900 changes. The server's on/off ratio can exceed it a little only because the unbatched
server overlaps ``--max-concurrent`` calls on the same cores, which costs it.

The default model is the tiny CLIP of ``capreward.testing`` (fast to build, no download); pass
``--clip-model`` (a name/tag or an OpenAI-format ``.pt``) for a real one.

    .venv/bin/python benchmarks/bench_server.py [--clients 8 16 32] [--requests 12] [--reward clip_s]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serve_process import Server  # noqa: E402 - the test suite's subprocess helper

WORDS = "a man woman dog cat runs sits cooks dances on in the kitchen grass stage street with red blue small".split()


def make_images(root: Path, n: int) -> list[str]:
    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        base = rng.integers(0, 256, size=(4, 4, 3)).astype(np.uint8)
        Image.fromarray(np.kron(base, np.ones((56, 56, 1), dtype=np.uint8))).save(root / f"img{i}.png")
        names.append(f"img{i}.png")
    return names


def make_payloads(clients: int, requests: int, samples: int, images: list[str], seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(clients):
        mine = []
        for r in range(requests):
            image = images[(c * requests + r) % len(images)]
            captions = [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 14)))) for _ in range(samples)]
            mine.append({"query": captions, "labels": [{"image": image, "references": ["a picture"]}] * samples})
        out.append(mine)
    return out


def drive(server: Server, payloads: list[list[dict]]) -> tuple[float, list[float], list[list[dict]]]:
    """Every client sends its requests one after another on one keep-alive connection; all clients
    start together. Returns (requests/s, latencies in s, answers per client)."""
    host, port = server.address
    start_gate = threading.Barrier(len(payloads) + 1)

    def client(mine: list[dict]) -> tuple[list[float], list[dict]]:
        conn = http.client.HTTPConnection(host, port, timeout=600)
        conn.connect()
        start_gate.wait()
        times, answers = [], []
        for payload in mine:
            body = json.dumps(payload).encode()
            t0 = time.perf_counter()
            conn.request("POST", "/get_reward", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            times.append(time.perf_counter() - t0)
            if resp.status != 200:
                raise RuntimeError(f"server answered {resp.status}: {answer}")
            answers.append(answer)
        conn.close()
        return times, answers

    with ThreadPoolExecutor(len(payloads)) as pool:
        futures = [pool.submit(client, mine) for mine in payloads]
        start_gate.wait()
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
        elapsed = time.perf_counter() - t0
    latencies = [t for times, _ in results for t in times]
    return len(latencies) / elapsed, latencies, [answers for _, answers in results]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def identical(a: list[list[dict]], b: list[list[dict]], tolerance: float = 1e-6) -> tuple[bool, float]:
    worst, same = 0.0, True
    for ca, cb in zip(a, b):
        for x, y in zip(ca, cb):
            worst = max([worst, *(abs(u - v) for u, v in zip(x["rewards"], y["rewards"]))])
            same &= x["errors"] == y["errors"] and len(x["rewards"]) == len(y["rewards"])
    return same and worst <= tolerance, worst


def batching_ceiling(reward_name: str, model: str, media_root: Path, images: list[str], samples: int,
                     max_batch_size: int, repeats: int, device: str = "cpu", precision: str = "fp32") -> dict:
    """Requests/s of the server's scoring path in this process, without HTTP: 64 requests of ``samples``
    captions scored alone (one call each) and merged (calls of ``max_batch_size`` samples), best of
    ``repeats`` interleaved rounds on new captions each round (answers are compared between the two
    servers, whose caches are separate, not here)."""
    from capreward.adapters.factory import RewardOptions, build_reward
    from capreward.server.http import RewardService

    options = RewardOptions(clip_model=model, device=device, precision=None if precision == "fp32" else precision)
    service = RewardService(build_reward(reward_name, options), media_root=str(media_root))
    service.warm_up()
    per_call = max(1, max_batch_size // samples)

    def parsed(seed: int) -> list[tuple[list[str], list]]:
        return [service.parse(p) for c in make_payloads(16, 4, samples, images, seed) for p in c]

    for captions, labels in parsed(7):  # visual cache and lazy state warm, as in the servers
        service.score(captions, labels)
    alone_best = merged_best = 0.0
    for repeat in range(repeats):
        requests = parsed(500 + repeat)
        start = time.perf_counter()
        for captions, labels in requests:
            service.score(captions, labels)
        alone_best = max(alone_best, len(requests) / (time.perf_counter() - start))
        requests = parsed(600 + repeat)  # new captions: the alone round's would be text-cache hits
        start = time.perf_counter()
        for i in range(0, len(requests), per_call):
            group = requests[i : i + per_call]
            service.score([c for r in group for c in r[0]], [lab for r in group for lab in r[1]])
        merged_best = max(merged_best, len(requests) / (time.perf_counter() - start))
    return {"alone_requests_per_s": alone_best, "merged_requests_per_s": merged_best,
            "ceiling": merged_best / alone_best}


def save_random_clip(arch: str, path: Path) -> str:
    """An open_clip ``arch`` with seeded random weights saved as an OpenAI-format state dict, so that both
    servers (and every run) load the same weights; returns the path."""
    import open_clip
    import torch

    from capreward.testing import openai_state_dict

    torch.manual_seed(0)
    model = open_clip.create_model(arch, pretrained=None, force_quick_gelu=True)
    torch.save(openai_state_dict(model), path)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--requests", type=int, default=12, help="requests per client")
    parser.add_argument("--samples", type=int, default=4, help="captions per request")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--reward", default="clip_s")
    parser.add_argument("--clip-model", help="default: the tiny CLIP of capreward.testing")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-concurrent", type=int, default=4, help="of the server with batching off")
    parser.add_argument("--on-max-concurrent", type=int,
                        help="of the server with batching on (default: the server's, 1 with batching)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (interleaved); the best is shown")
    parser.add_argument("--compare-front", metavar="COMMAND",
                        help="instead of batching off vs on: the batching server (capreward serve) vs COMMAND given the "
                        "same flags, e.g. \"python experiments/asgi_front.py\" (uvicorn); the ratio is COMMAND/serve")
    parser.add_argument("--device", default="cpu",
                        help="of the servers and of the in-process ceiling (cpu, cuda, cuda:N)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                        help="CLIP precision of the servers and of the in-process ceiling")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", help="also write the results to this JSON file")
    args = parser.parse_args()
    # answers of the two servers are compared to this tolerance: fp32 computes the same sums in another
    # batch composition (rounding ~1e-7); fp16/bf16 round each product at ~1e-3
    tolerance = 1e-6 if args.precision == "fp32" else 2e-2

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = args.clip_model
        if model is None:
            from capreward.testing import save_tiny_clip_openai

            model = str(save_tiny_clip_openai(root / "tiny_clip.pt", seed=0))
        elif model.endswith("/random"):
            model = save_random_clip(model.removesuffix("/random"), root / "random_clip.pt")
        (root / "media").mkdir()
        images = make_images(root / "media", args.images)
        common = ["--reward", args.reward, "--clip-model", model, "--media-root", str(root / "media"),
                  "--device", args.device, "--precision", args.precision,
                  "--max-connections", str(max(args.clients) + 8),
                  "--max-connections-per-peer", str(max(args.clients) + 8), "--reserved-connections", "0"]
        on_workers = [] if args.on_max_concurrent is None else ["--max-concurrent", str(args.on_max_concurrent)]
        on_flags = ["--max-batch-size", str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms), *on_workers]
        modes = {"off": ["--max-batch-size", "0", "--max-concurrent", str(args.max_concurrent)], "on": on_flags}
        commands: dict[str, list[str] | None] = {"off": None, "on": None}
        if args.compare_front:  # "off" is the batching capreward serve, "on" the other front with the same flags
            modes["off"] = on_flags
            commands["on"] = [sys.executable if w == "python" else w for w in shlex.split(args.compare_front)]
        rows = []
        answers: dict[tuple[str, int], list] = {}
        servers = {mode: Server(common + flags, command=commands[mode]) for mode, flags in modes.items()}
        try:
            for server in servers.values():
                drive(server, make_payloads(4, 2, args.samples, images, seed=99))  # warm-up
            for clients in args.clients:
                best: dict[str, dict] = {}
                for repeat in range(args.repeats):  # interleaved, so that load drifts hit both modes alike
                    # new captions every round (as a later RL step samples new ones): a repeated caption
                    # would be a text-cache hit; both modes get the same ones, so answers can be compared
                    payloads = make_payloads(clients, args.requests, args.samples, images, seed=1000 * clients + repeat)
                    for mode, server in servers.items():
                        try:
                            rate, lat, got = drive(server, payloads)
                        except Exception:
                            print(f"the {mode} server (exit code {server.proc.poll()}) said:\n" + "".join(server.lines[-40:]),
                                  file=sys.stderr)
                            raise
                        answers[mode, clients] = got
                        if mode not in best or rate > best[mode]["requests_per_s"]:
                            best[mode] = {"mode": mode, "clients": clients, "requests_per_s": rate,
                                          "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * percentile(lat, 99)}
                rows.extend(best.values())
        finally:
            for server in servers.values():
                server.stop()
        ceiling = None if args.compare_front else batching_ceiling(
            args.reward, model, root / "media", images, args.samples, args.max_batch_size, args.repeats,
            args.device, args.precision)
    by = {(r["mode"], r["clients"]): r for r in rows}
    for clients in args.clients:
        same, worst = identical(answers["off", clients], answers["on", clients], tolerance)
        by["on", clients]["speedup"] = by["on", clients]["requests_per_s"] / by["off", clients]["requests_per_s"]
        by["on", clients]["identical"] = same
        by["on", clients]["max_abs_diff"] = worst
    result = {"config": {k: getattr(args, k) for k in ("clients", "requests", "samples", "reward", "clip_model",
                                                       "max_batch_size", "max_wait_ms", "max_concurrent", "repeats",
                                                       "device", "precision")},
              "identity_tolerance": tolerance, "runs": rows, "in_process": ceiling}
    if args.json_out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_common import write_json

        write_json(args.json_out, result)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    batching = (f"--max-batch-size {args.max_batch_size} --max-wait-ms {args.max_wait_ms} "
                f"--max-concurrent {args.on_max_concurrent or '1 (default)'}")
    if args.compare_front:
        modes_text = f"'off' = capreward serve, 'on' = {args.compare_front}, both with batching {batching}"
    else:
        modes_text = (f"batching on = {batching}, batching off = --max-batch-size 0 --max-concurrent "
                      f"{args.max_concurrent}")
    print(f"reward {args.reward}, model {args.clip_model or 'tiny CLIP'} ({args.precision} on {args.device}), "
          f"{args.samples} samples/request, "
          f"{args.requests} requests/client, {modes_text}, best of {args.repeats}")
    print(f"{'clients':>7} {'mode':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'on/off':>7} identical")
    for clients in args.clients:
        for mode in ("off", "on"):
            r = by[mode, clients]
            extra = (f" {r['speedup']:6.2f}x {r['identical']} (max diff {r['max_abs_diff']:.1e}, tolerance {tolerance:.0e})"
                     if mode == "on" else "")
            print(f"{clients:>7} {mode:>4} {r['requests_per_s']:8.1f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f}{extra}")
    if ceiling is None:
        return
    print(f"ceiling of batching here (this process, no HTTP, same scorer): 64 requests of {args.samples} captions "
          f"scored alone {ceiling['alone_requests_per_s']:.1f} req/s, merged into calls of {args.max_batch_size} "
          f"{ceiling['merged_requests_per_s']:.1f} req/s: {ceiling['ceiling']:.2f}x at most (target >= 3x at 16 "
          f"clients)")


if __name__ == "__main__":
    main()
