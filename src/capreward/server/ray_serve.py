"""The reward server as Ray Serve replicas, for users who outgrow one machine (``pip install
capreward[serve]``).

Each replica holds one reward (built in the replica by a picklable factory) and answers the same
``POST /get_reward`` protocol as ``capreward serve`` (:mod:`capreward.server.http`), with the
same validation, path confinement and answers. Dynamic batching inside a replica is Ray Serve's own
``@serve.batch``: every sample of every request is one item, so ``max_batch_size`` counts samples and
``batch_wait_timeout_s`` is the wait bound, exactly like ``--max-batch-size``/``--max-wait-ms``; the
merged samples are scored in one call in a worker thread, and each request gathers its own samples
back in order. Ray Serve's proxy spreads requests over the replicas; HTTP-level limits (timeouts,
connections) are the proxy's (see Ray Serve's ``http_options``), while the body size, item and JSON
limits are checked here (the same :meth:`~capreward.server.http.RewardService.decode` and
``parse``). Ray's proxy is uvicorn started by Ray with only ``keep_alive_timeout_s`` and
``request_timeout_s`` to set: it has no header deadline, no per-address connection cap and no capacity
kept for other clients (``capreward serve`` has all three), so a deployment open to untrusted clients
needs a reverse proxy in front that has them (nginx ``client_header_timeout`` and ``limit_conn``,
Envoy ``request_headers_timeout`` and per-downstream connection limits).

Example::

    import functools, ray
    from ray import serve
    from capreward.adapters import RewardOptions, build_reward
    from capreward.server import ServerLimits
    from capreward.server.ray_serve import reward_app

    factory = functools.partial(build_reward, "emscore", RewardOptions(clip_model="/models/ViT-B-32.pt"))
    app = reward_app(factory, media_root="/data/media", num_replicas=4,
                     limits=ServerLimits(max_batch_size=64, max_wait=0.005),
                     ray_actor_options={"num_gpus": 1})
    serve.start(http_options={"host": "0.0.0.0", "port": 8000})
    serve.run(app, route_prefix="/")        # OpenRLHF: --reward.remote_url http://HOST:8000/get_reward
"""

from __future__ import annotations

import asyncio
from typing import Any
from collections.abc import Callable

from ..adapters.labels import Label
from ..adapters.scoring import ScoredBatch, concat_batches
from .batching import slice_batch
from .http import RequestError, RewardService, ServerLimits


def reward_app(reward_factory: Callable[[], Any], *, fallback: float | None = None, media_root: str | None = None,
               allow_any_path: bool = False, limits: ServerLimits | None = None, num_replicas: int = 1,
               ray_actor_options: dict[str, Any] | None = None):
    """A Ray Serve application (pass it to ``serve.run``) answering ``/get_reward`` and ``/health``.

    ``reward_factory``: builds the reward inside each replica (e.g. ``functools.partial(build_reward,
    "emscore", options)``); ``limits.max_batch_size`` (samples; 0 is taken as 1, no merging) and
    ``limits.max_wait`` (seconds) configure ``@serve.batch``; the other arguments as for
    :func:`~capreward.server.http.make_server`.
    """
    from .._extras import require

    serve = require("serve", "ray.serve", used_by="capreward.server.ray_serve")
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    served = limits or ServerLimits()
    max_batch_size = max(1, served.max_batch_size)

    @serve.deployment(num_replicas=num_replicas, ray_actor_options=ray_actor_options or {})
    class CaptionRewardReplica:
        def __init__(self) -> None:
            self.service = RewardService(reward_factory(), fallback=fallback, media_root=media_root,
                                         limits=served, allow_any_path=allow_any_path)
            self.service.warm_up()

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=served.max_wait)
        async def score_samples(self, samples: list[tuple[str, Label]]) -> list[ScoredBatch]:
            captions, labels = [c for c, _ in samples], [lab for _, lab in samples]
            # scoring blocks: run it in a thread so the replica keeps receiving requests meanwhile
            batch = await asyncio.to_thread(self.service.score, captions, labels)
            return [slice_batch(batch, i, i + 1) for i in range(len(samples))]

        async def __call__(self, request: Request) -> Response:
            path = request.url.path.rstrip("/")
            if request.method == "GET" and path.endswith("/health"):
                return JSONResponse({"status": "ok", "reward": self.service.name})
            if request.method != "POST" or not path.endswith("/get_reward"):
                return JSONResponse({"error": f"no such endpoint {request.url.path!r}; use POST /get_reward"}, 404)
            body = await request.body()
            if len(body) > served.max_body_bytes:
                return JSONResponse({"error": f"request body of {len(body)} bytes exceeds the limit of "
                                              f"{served.max_body_bytes}"}, 413)
            try:
                payload = self.service.decode(body)
                captions, labels = self.service.parse(payload)
            except RequestError as exc:
                return JSONResponse({"error": exc.message}, exc.status)
            parts = await asyncio.gather(*(self.score_samples((c, lab)) for c, lab in zip(captions, labels)))
            # RewardService.encode: extra_logs carries NaN for undefined sub-scores (JSONResponse refuses NaN)
            answer = self.service.respond(concat_batches(parts), payload)
            return Response(self.service.encode(answer), media_type="application/json")

    return CaptionRewardReplica.bind()  # type: ignore[attr-defined]  # serve.deployment's class has bind()


__all__ = ["reward_app"]
