"""An OpenRLHF-compatible HTTP reward server (``--remote_rm_url http://host:port/get_reward``).

Protocol (OpenRLHF's remote reward model): ``POST /get_reward`` with the JSON body
``{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [label, ...]}``; the answer
is ``{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}`` with one number per query.
``rewards`` drive the advantage, ``scores`` (the same values here) OpenRLHF's dynamic filtering, and
``extra_logs`` are per-sample sub-scores that OpenRLHF logs (plus ``unscored``: 1.0 where a sample got
the fallback). The answer also has ``errors`` (per sample, None or why it got the fallback), which
OpenRLHF ignores.

The completion is the part of the query after its prompt; trailing end-of-text markers
(:data:`END_MARKERS`) are removed. Labels (JSON strings or objects) name the visual and references:
see :mod:`capreward.adapters.labels`.

Errors: a malformed request (not JSON, missing ``query``/``labels``, lengths that differ, a label that
is not a valid label object, a query that does not contain its prompt) is answered 400 with a message
naming the offending item, e.g. ``labels[3] has unknown keys ['vidoe']``; such requests are pipeline
bugs that would fail identically at every step. A well-formed sample that cannot be scored (missing or
unreadable file, empty completion) gets ``fallback`` with its reason in ``errors`` and the log, and the
rest of the batch is scored. Bodies over ``max_body_bytes`` and requests with more than ``max_items``
queries get 413; when ``max_concurrent`` requests are already being served, a new one waits up to
``queue_timeout`` seconds for a slot and then gets 503. ``GET /health`` answers once the model is loaded.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from .labels import Label, LabelError, parse_label
from .scoring import score_labelled

logger = logging.getLogger(__name__)

END_MARKERS = ("</s>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<pad>", "<eos>")


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and a message naming the problem."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ServerLimits:
    """Bounds on what one server accepts."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_items: int = 4096
    max_concurrent: int = 4
    queue_timeout: float = 120.0


def completion_of(query: str, prompt: str | None, where: str) -> str:
    """The response part of ``query``: the text after ``prompt`` (its last occurrence when the query
    does not start with it), with trailing end markers and whitespace removed. RequestError(400)
    naming ``where`` when the prompt is not in the query."""
    if prompt:
        if query.startswith(prompt):
            text = query[len(prompt):]
        else:
            at = query.rfind(prompt)
            if at < 0:
                raise RequestError(400, f"{where}: the query does not contain its prompt")
            text = query[at + len(prompt):]
    else:
        text = query
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for marker in END_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                changed = True
    return text


def _string_list(payload: dict, key: str, n: int | None) -> list[Any] | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(400, f"'{key}' must be a list, got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise RequestError(400, f"'{key}' has {len(value)} entries for {n} queries")
    return value


def parse_request(payload: Any, limits: ServerLimits, media_root: str | None = None) -> tuple[list[str], list[Label]]:
    """Captions and labels of a ``/get_reward`` body; RequestError (400/413) naming the bad item."""
    if not isinstance(payload, dict):
        raise RequestError(400, f"the body must be a JSON object with 'query' and 'labels', got {type(payload).__name__}")
    queries = _string_list(payload, "query", None)
    if queries is None:
        raise RequestError(400, "missing 'query' (a list of prompt + response strings)")
    n = len(queries)
    if n > limits.max_items:
        raise RequestError(413, f"{n} queries in one request; this server accepts at most {limits.max_items}")
    prompts = _string_list(payload, "prompts", n)
    labels = _string_list(payload, "labels", n)
    if labels is None and n:
        raise RequestError(400, "missing 'labels': each query needs a label naming its image/video and references")
    captions, parsed = [], []
    for i in range(n):
        if not isinstance(queries[i], str):
            raise RequestError(400, f"query[{i}] must be a str, got {type(queries[i]).__name__}")
        prompt = None if prompts is None else prompts[i]
        if prompt is not None and not isinstance(prompt, str):
            raise RequestError(400, f"prompts[{i}] must be a str, got {type(prompt).__name__}")
        captions.append(completion_of(queries[i], prompt, f"query[{i}]"))
        try:
            parsed.append(parse_label(labels[i], f"labels[{i}]", media_root))
        except LabelError as exc:
            raise RequestError(400, str(exc)) from None
    return captions, parsed


class RewardService:
    """The server's request handling without HTTP: validate, score, build the response dict."""

    def __init__(self, reward: Any, fallback: float = 0.0, media_root: str | None = None,
                 limits: ServerLimits | None = None):
        if not math.isfinite(float(fallback)):
            raise ValueError(f"fallback must be a finite number, got {fallback}")
        self.reward = reward
        self.fallback = float(fallback)
        self.media_root = media_root
        self.limits = limits or ServerLimits()

    @property
    def name(self) -> str:
        return str(getattr(self.reward, "__name__", type(self.reward).__name__))

    def warm_up(self) -> None:
        """Load the reward's model(s) now rather than on the first request."""
        parts = [func for _, func, _ in getattr(self.reward, "components", [])]  # a CompositeReward's terms
        for reward in [self.reward, *parts]:
            if hasattr(reward, "scorer"):
                reward.scorer  # noqa: B018 - the property builds the scorer

    def handle(self, payload: Any) -> dict[str, Any]:
        """The ``/get_reward`` response for a decoded JSON body (RequestError for bad requests)."""
        captions, labels = parse_request(payload, self.limits, self.media_root)
        batch = score_labelled(self.reward, captions, labels)
        rewards = batch.filled(self.fallback)
        extra: dict[str, list[float]] = {
            key: [v if math.isfinite(v) else self.fallback for v in map(float, column)]
            for key, column in sorted(batch.metrics.items())
        }
        extra["unscored"] = [float(v is None) for v in batch.values]
        return {"rewards": rewards, "scores": list(rewards), "extra_logs": extra,
                "errors": [None if v is not None else (r or "no score") for v, r in zip(batch.values, batch.reasons)]}


class _Handler(BaseHTTPRequestHandler):
    server: "RewardHTTPServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.info("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: dict[str, Any], close: bool = False) -> None:
        data = json.dumps(body, allow_nan=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.rstrip("/") == "/health":
            self._send(200, {"status": "ok", "reward": self.server.service.name})
        else:
            self._send(404, {"error": f"no such endpoint {self.path!r}; use POST /get_reward or GET /health"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/get_reward":
            self._send(404, {"error": f"no such endpoint {self.path!r}; use POST /get_reward"}, close=True)
            return
        limits = self.server.service.limits
        length = self.headers.get("Content-Length")
        if length is None:
            self._send(411, {"error": "a Content-Length header is required"}, close=True)
            return
        try:
            size = int(length)
        except ValueError:
            self._send(400, {"error": f"bad Content-Length {length!r}"}, close=True)
            return
        if size > limits.max_body_bytes:
            # the body is not read; closing the connection discards it
            self._send(413, {"error": f"request body of {size} bytes exceeds the limit of {limits.max_body_bytes}"},
                       close=True)
            return
        body = self.rfile.read(size)
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._send(400, {"error": f"the request body is not valid JSON: {exc}"})
            return
        if not self.server.slots.acquire(timeout=limits.queue_timeout):
            self._send(503, {"error": f"server busy: {limits.max_concurrent} requests in progress"})
            return
        try:
            self._send(200, self.server.service.handle(payload))
        except RequestError as exc:
            self._send(exc.status, {"error": exc.message})
        except Exception as exc:  # keep serving; the client sees what went wrong
            logger.exception("scoring failed")
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            self.server.slots.release()


class RewardHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server around a :class:`RewardService`; at most ``limits.max_concurrent``
    requests are scored at once. Stop it with ``shutdown()`` (from another thread) and then
    :meth:`close_gracefully`, which lets requests being scored finish but does not wait for idle
    keep-alive connections."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], service: RewardService):
        super().__init__(address, _Handler)
        self.service = service
        self.slots = threading.BoundedSemaphore(service.limits.max_concurrent)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close_gracefully(self, timeout: float = 120.0) -> bool:
        """Wait (up to ``timeout`` s) until no request is being scored, then close the socket.
        Returns False when requests were still running at the deadline."""
        deadline = time.monotonic() + timeout
        taken = 0
        for _ in range(self.service.limits.max_concurrent):
            if not self.slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
            taken += 1
        self.server_close()
        for _ in range(taken):
            self.slots.release()
        return taken == self.service.limits.max_concurrent


def make_server(reward: Any, host: str = "127.0.0.1", port: int = 0, *, fallback: float = 0.0,
                media_root: str | None = None, limits: ServerLimits | None = None,
                warm_up: bool = True) -> RewardHTTPServer:
    """A bound (not yet serving) server for ``reward``; ``port=0`` picks a free port (see ``.url``).
    With ``warm_up`` the model is loaded before the socket is bound."""
    service = RewardService(reward, fallback=fallback, media_root=media_root, limits=limits)
    if warm_up:
        service.warm_up()
    return RewardHTTPServer((host, port), service)


def post_json(url: str, payload: Any, timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    """POST ``payload`` as JSON; (HTTP status, decoded JSON answer). A small stdlib client."""
    import urllib.error
    import urllib.request

    data = json.dumps(payload).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


__all__: Sequence[str] = [
    "END_MARKERS", "RequestError", "RewardHTTPServer", "RewardService", "ServerLimits", "completion_of",
    "make_server", "parse_request", "post_json",
]
