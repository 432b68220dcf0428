"""Experiment (issue 21.4): the reward server as one ASGI app served by uvicorn, to decide whether
``capreward serve`` should move to it (as OpenRLHF's own reward server, a FastAPI app on uvicorn,
and Ray Serve's HTTP proxy, uvicorn in front of the replicas' ASGI apps, do).

It takes ``capreward serve``'s flags and prints the same readiness line, so the subprocess server
tests and ``benchmarks/bench_server.py`` can drive it unchanged:

    CAPREWARD_TEST_SERVE_COMMAND="python experiments/asgi_front.py" .venv/bin/python -m pytest tests/test_serve*.py
    .venv/bin/python benchmarks/bench_server.py --compare-front "python experiments/asgi_front.py"

The app reuses the server's request handling (:class:`~capreward.server.http.RewardService`:
decode, validate, score, answer) and batching (:class:`~capreward.server.batching.DynamicBatcher`,
called from a worker thread) and does in the app every HTTP limit an ASGI app can see: chunked bodies
411, Content-Length missing 411, invalid or conflicting 400, over ``--max-body-bytes`` 413 (all before
reading the body, answered with ``Connection: close``), and the body within ``--read-timeout`` of the
headers (408). What uvicorn offers for the rest, and is used: ``limit_concurrency`` =
``--max-connections`` (503 once that many connections or tasks exist), ``timeout_keep_alive`` =
``--header-timeout`` (idle time after an answer), ``h11_max_incomplete_event_size`` =
``--max-header-bytes`` (the h11 parser only; httptools, picked when installed, has its own limits).

What neither the app nor uvicorn's configuration can do (uvicorn 0.54, and its main branch of
2026-07-21): a deadline on a request's headers (the keep-alive timer is armed only after an answer and
cancelled by any byte received, so a connection that trickles header bytes, or sends nothing at all,
is never closed), a cap per client address (uvicorn's ``connections`` set is not keyed by address;
an app sees a request only once its headers are complete), and capacity kept for other clients (a
slow connection counts against ``limit_concurrency`` like any other). These need a subclass of
uvicorn's private protocol classes (``H11Protocol``/``HttpToolsProtocol``). Under Ray Serve, where
the proxy's uvicorn is started by Ray with only ``keep_alive_timeout_s`` and ``request_timeout_s``
configurable (``http_options.middlewares`` is deprecated), none of it can be added by us at all.
uvicorn also bounds headers only with h11: with httptools (what it picks when installed, as
``uvicorn[standard]`` does) 8 connections each sent 16 MB of headers, unanswered, and the process grew
118 MB.

Measured (2026-11-24, this project's 2-core machine shared with other sessions: load average 8-15, so
only ratios within one run mean anything):

- every limit test, ``CAPREWARD_TEST_SERVE_COMMAND="python experiments/asgi_front.py"`` over
  ``tests/test_serve*.py``: 11 subprocess tests fail on this front and 70 pass; 7 of the 11 passed on
  the threading server before this change. Stalled and trickling clients are never dropped, one
  address takes every slot, headers have no size bound or deadline, and uvicorn's own 400/503 answers
  (invalid or conflicting Content-Length, concurrency limit) are plain text, not JSON naming the
  problem.
- ``bench_server.py --compare-front "python experiments/asgi_front.py"``: requests/s uvicorn/threading
  and p99 (ms, threading -> uvicorn), two runs each. Tiny CLIP (``--repeats 4``: HTTP overhead
  dominates): 8 clients 1.15x / 1.45x (p99 50 -> 32, 92 -> 31), 16 clients 1.08x / 1.09x (106 -> 122,
  90 -> 45), 32 clients 2.21x / 1.04x (249 -> 180, 316 -> 418). ViT-B-32 random weights
  (``--clip-model ViT-B-32/random --repeats 2``: scoring dominates): 8 clients 0.85x / 1.29x (p99 2083 ->
  3288, 2636 -> 3550), 16 clients 1.41x / 1.27x (4499 -> 5137, 4561 -> 5569), 32 clients 1.30x /
  1.23x (8621 -> 8863, 5684 -> 7018). Answers identical (< 1e-6) in every run.
- the noise floor, ``--compare-front "python -m capreward.cli.main serve"`` (the same server on both
  sides), two runs each: tiny CLIP 0.40x / 1.16x, 1.12x / 0.92x, 1.46x / 1.01x (so no tiny-CLIP ratio
  above means anything); ViT-B-32 1.36x / 1.04x, 1.01x / 1.05x, 0.98x / 1.04x.
- so uvicorn's 1.2-1.4x at 16 and 32 clients with ViT-B-32 is above the noise. It comes from batch
  sizes, not from the HTTP stack: the app's blocking calls run in asyncio's default thread pool (6
  threads here), so at most 6 requests (24 samples) are merged, while the threading server merges up
  to ``--max-batch-size`` 64. With ``--max-batch-size 24`` for both, uvicorn/threading was 1.02x at 16
  and 0.81x at 32 clients (p99 2648 -> 3237, 5889 -> 6093 ms), and both fronts served about 10 req/s
  against 5-8 at 64 in the other runs (those are different runs under changing load; whether smaller
  batches pay on an idle machine is not measured here).

Decision: ``capreward serve`` stays a stdlib threading server. One ASGI app on uvicorn would not be
simpler: it would need the app plus subclasses of uvicorn's private protocol classes (for both parsers)
to get back the header deadline, the per-address cap, the reserve and the header bound, and it would
still not carry them to Ray Serve, whose proxy we do not configure. It would also not keep the limit
tests green as it stands (11 fail). It is not faster at equal batch sizes, and its p99 was higher in
every ViT-B-32 row.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from capreward.server.batching import Busy, DynamicBatcher  # noqa: E402
from capreward.server.http import RequestError, RewardService  # noqa: E402

_LENGTH = re.compile(rb"[0-9]{1,18}")


class RewardASGI:
    """``POST /get_reward`` and ``GET /health`` as a plain ASGI 3 app (no framework: the cheapest
    possible app, so that what is measured is uvicorn against the threading server)."""

    def __init__(self, service: RewardService):
        self.service, self.limits = service, service.limits
        self.batcher = DynamicBatcher(service.score, max_batch_size=self.limits.max_batch_size,
                                      max_wait=self.limits.max_wait, workers=self.limits.max_concurrent)

    async def _answer(self, send, status: int, body: dict, close: bool = False) -> None:
        data = RewardService.encode(body)  # as capreward serve writes it (NaN for undefined sub-scores)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _body(self, receive, size: int) -> bytes | None:
        chunks, got = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            got += len(chunks[-1])
            if got > size:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _handle(self, body: bytes) -> tuple[int, dict]:
        service = self.service
        try:
            captions, labels = service.parse(service.decode(body))
            batch = self.batcher.submit(captions, labels, timeout=self.limits.queue_timeout)
            return 200, service.respond(batch)
        except RequestError as exc:
            return exc.status, {"error": exc.message}
        except Busy as exc:
            return 503, {"error": f"server busy: {exc}"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            self.batcher.close(120)
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if method == "GET" and path == "/health":
            await self._answer(send, 200, {"status": "ok", "reward": self.service.name,
                                           "batches": self.batcher.batches, "samples": self.batcher.samples})
            return
        if method != "POST" or path != "/get_reward":
            await self._answer(send, 404, {"error": f"no such endpoint {scope['path']!r}; use POST /get_reward"}, True)
            return
        headers = scope["headers"]
        if any(k == b"transfer-encoding" for k, _ in headers):
            await self._answer(send, 411, {"error": "chunked or encoded bodies are not accepted; send a Content-Length"}, True)
            return
        lengths = {v.strip() for k, v in headers if k == b"content-length"}
        if not lengths:
            await self._answer(send, 411, {"error": "a Content-Length header is required"}, True)
            return
        if len(lengths) > 1 or not _LENGTH.fullmatch(next(iter(lengths))):
            await self._answer(send, 400, {"error": "Content-Length must be one non-negative integer"}, True)
            return
        size = int(next(iter(lengths)))
        if size > self.limits.max_body_bytes:
            await self._answer(send, 413, {"error": f"request body of {size} bytes exceeds the limit of "
                                                    f"{self.limits.max_body_bytes}"}, True)
            return
        try:
            body = await asyncio.wait_for(self._body(receive, size), self.limits.read_timeout)
        except asyncio.TimeoutError:
            await self._answer(send, 408, {"error": f"the request did not arrive within {self.limits.read_timeout} s"}, True)
            return
        if body is None:
            return
        status, answer = await asyncio.to_thread(self._handle, body)
        await self._answer(send, status, answer)


def main() -> int:
    import uvicorn

    from capreward.adapters.factory import DEFAULT_FLEUR, RewardOptions, build_reward
    from capreward.cli.common import media_limit_settings, resolve_device
    from capreward.cli.main import build_parser
    from capreward.cli.serve import server_limits

    args = build_parser().parse_args(["serve", *sys.argv[1:]])  # capreward serve's flags, parsed as it does
    args.device = resolve_device(args.device)
    with media_limit_settings(args):
        return serve(args, server_limits(args), uvicorn, DEFAULT_FLEUR, RewardOptions, build_reward)


def serve(args, limits, uvicorn, DEFAULT_FLEUR, RewardOptions, build_reward) -> int:  # noqa: N803
    options = RewardOptions(clip_model=args.clip_model, fleur_model=args.fleur_model or DEFAULT_FLEUR,
                            device=args.device, precision=None if args.precision == "fp32" else args.precision,
                            dtype=args.dtype, idf=args.idf, frames=None if args.frames == 0 else args.frames,
                            w=args.w, composite=args.composite)
    service = RewardService(build_reward(args.reward, options), fallback=args.fallback, media_root=args.media_root,
                            limits=limits, allow_any_path=args.allow_any_path)
    service.warm_up()
    app = RewardASGI(service)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    config = uvicorn.Config(app, limit_concurrency=limits.max_connections, timeout_keep_alive=int(limits.header_timeout),
                            h11_max_incomplete_event_size=limits.max_header_bytes,
                            backlog=max(128, limits.max_connections), log_level="warning", access_log=False,
                            lifespan="on")
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]

    def announce():
        while not server.started:
            threading.Event().wait(0.05)
        print(f"capreward serve: ready on http://{host}:{port}/get_reward (reward {args.reward}, uvicorn)",
              file=sys.stderr, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    # uvicorn handles SIGTERM/SIGINT itself (graceful shutdown) and raises the signal again afterwards to
    # the handler found before it: a no-op one here, so that a clean stop exits 0 like capreward serve
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    server.run(sockets=[sock])
    print("capreward serve: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
