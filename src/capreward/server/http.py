"""An OpenRLHF-compatible HTTP reward server (``--reward.remote_url http://host:port/get_reward``, with
``--data.label_key label``; OpenRLHF before 0.10: ``--remote_rm_url`` and ``--label_key``).

Protocol (OpenRLHF's remote reward model): ``POST /get_reward`` with the JSON body
``{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [label, ...]}``; the answer
is ``{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}`` with one number per query.
``rewards`` drive the advantage, ``scores`` (the same values here) OpenRLHF's dynamic filtering, and
``extra_logs`` are per-sample sub-scores that OpenRLHF logs (plus ``unscored``: 1.0 where a sample got
the fallback). ``extra_logs`` has one fixed key set per server, the reward's
:meth:`~capreward.rewards.RewardFunction.metric_names` plus ``unscored``, whatever the request: a
sub-score a sample does not have (unscored, no references) is NaN (JSON ``NaN``, which Python's
``json`` and so OpenRLHF's client read). OpenRLHF sends one query per request and stacks the answers'
``extra_logs`` per key (``Experience.concat_experiences``), then splits them per sample: keys that
varied from answer to answer broke that split. The answer also has ``errors`` (per sample, None or
why it got the fallback) and, for a request the server read by a rule the client may not expect,
``warnings`` (a list of lines: a request without ``prompts``), which OpenRLHF ignores.

The completion is the part of the query after the *first* occurrence of its prompt (whatever precedes
it, a BOS, left padding, a space, is ignored; a response that repeats the prompt is scored whole, the
repeat included); trailing end-of-text markers (:data:`END_MARKERS`) are removed. With the policy's tokenizer
(``prompt_tokens``, ``capreward serve --prompt-tokenizer DIR``) the completion starts where the prompt's
tokens end instead (:class:`~capreward.adapters.prompt_tokens.PromptTokens`): the query must begin, after
special tokens and padding, with the prompt as its tokens decode (which a normalising tokenizer changes),
and everything after them is the response. A request without
``prompts`` (OpenRLHF always sends them) follows a documented rule: each query is taken as the response
alone and scored whole; the answer says so in ``warnings`` (:data:`NO_PROMPTS`), and the server logs it
once; a client that sends prompt + response must send ``prompts`` too. Labels (JSON strings or objects) name the visual and references:
see :mod:`capreward.adapters.labels`.

Errors: a malformed request (not JSON, missing ``query``/``labels``, lengths that differ, a label that
is not a valid label object, a query that does not contain its prompt) is answered 400 with a message
naming the offending item, e.g. ``labels[3] has unknown keys ['vidoe']``; such requests are pipeline
bugs that would fail identically at every step. A well-formed sample that cannot be scored (unreadable
file, empty completion, a path the server does not serve, invalid references) gets ``fallback`` with its
reason in ``errors`` and the log, and the rest of the batch is scored. The fallback is the bottom of the
reward's range by default (:func:`~capreward.adapters.scoring.resolve_fallback`: -1 for EMScore), so an
unscorable sample never outranks a scored one.

Files: labels name files under the server's media root only (:mod:`capreward.adapters.paths`): every
path is resolved, symlinks included, and must be a regular file inside the root; anything else (an
absolute path elsewhere, ``..`` past the root, a symlink pointing out, a directory, a missing file)
gets the fallback with one fixed reason that tells nothing about what is there. The file is opened inside
the root too (:class:`~capreward.media.files.ConfinedFile`): a path component swapped for a symlink
after the check gets the same refusal when the batch is scored. Without a media root every path is
refused, unless the operator passes ``allow_any_path``.

Limits (:class:`ServerLimits`): bodies need a ``Content-Length`` (missing: 411; negative, non-numeric
or repeated with different values: 400; chunked bodies: 411) and bodies over ``max_body_bytes`` get
413, all without reading the body; a request line and headers over ``max_header_bytes`` get 431; more
than ``max_items`` queries get 413. The JSON is bounded too (:mod:`capreward.json_limits`):
an integer outside 64 bits or a number that overflows, nesting deeper than ``max_json_depth``, a
string longer than ``max_string_chars`` or an array longer than ``max_items`` get 400 naming the field
(``labels[2].visual_id is an integer of 5000 digits, out of range (at most 64-bit signed)``).

Slow clients: a request's line and headers must arrive within ``header_timeout`` seconds (10) of the
server starting to wait for it (a new connection, or the previous answer sent: idle keep-alive
connections are closed then), and the whole request, body included, within ``read_timeout`` (30) of
the same start, however slowly its bytes trickle in; else the connection is closed (408 when the
headers were complete). Connections are admitted by :class:`~capreward.server.connections.ConnectionSlots`:
``max_connections`` (128) in all, ``max_connections_per_peer`` (64) from one client address, and the
last ``reserved_connections`` (16) only for addresses that hold none, so one client's slow connections
cannot take the slots of another; a connection over a limit gets 503 saying which, and is closed.

Concurrent requests are merged into one scorer call (:mod:`capreward.server.batching`: up to
``max_batch_size`` samples or ``max_wait`` seconds); ``max_concurrent`` batches are scored at once (1
by default with batching, 4 without), and a request whose batch has not started within
``queue_timeout`` seconds gets 503. ``GET /health`` answers once the model is loaded, with the number
of batches and samples scored so far and the connection counters (open, peers, refused, timeouts).

The HTTP front is the standard library's threading server, not an ASGI app on uvicorn: uvicorn has no
header deadline, per-address cap or reserve, and bounds headers only with its h11 parser; measured and
decided in ``experiments/asgi_front.py``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from collections.abc import Sequence

from ..errors import CaprewardError, SampleError, sample_failure
from .batching import Busy, DynamicBatcher
from .connections import ConnectionSlots, peer_of
from ..json_limits import JSONLimitError, JSONLimits
from ..json_limits import check as check_json
from ..json_limits import loads as loads_json
from ..adapters.labels import Label, LabelError, parse_label
from ..adapters.paths import MediaPaths
from ..adapters.scoring import ScoredBatch, concat_batches, resolve_fallback, score_labelled
from ..adapters.prompt_tokens import PromptTokens

logger = logging.getLogger(__name__)

END_MARKERS = ("</s>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<pad>", "<eos>")


class RequestError(CaprewardError):
    """A request the server refuses: HTTP ``status`` and a message naming the problem."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ServerLimits:
    """Bounds on what one server accepts (see the module docstring).

    Args:
        max_body_bytes: bytes of one request's body.
        max_items: samples of one request; also bounds every JSON array in it.
        max_concurrent: batches scored at once (None: 1 with batching, as a merged batch already keeps
            every core busy and a second one running beside it only slows both, 10-15 % fewer requests/s
            measured at 16 clients on 2 cores; 4 without batching).
        queue_timeout: seconds a request may wait for its batch to start.
        header_timeout: seconds from when the server starts waiting for a request (a new connection, or
            after the previous answer) until its headers are complete, idle keep-alive time included.
        read_timeout: seconds the whole request (line, headers, body) may take from the same start.
        max_connections: connections served at once.
        max_connections_per_peer: connections one client address may hold (None: ``max_connections // 2``).
        reserved_connections: of ``max_connections``, the slots only clients holding none may take
            (None: ``max_connections // 8``; :mod:`capreward.server.connections`).
        max_header_bytes: request line and headers together.
        max_json_depth: nesting of a request's JSON.
        max_string_chars: length of one string in a request's JSON.
        max_batch_size: samples of one merged batch (0: no merging across requests).
        max_wait: seconds a batch waits for more requests to merge.

    Raises:
        ValueError: a timeout that is not positive, or connection limits that do not fit together.

    Examples:
        >>> from capreward.server import ServerLimits
        >>> limits = ServerLimits(max_items=256, max_connections=16)
        >>> limits.max_connections_per_peer, limits.reserved_connections, limits.max_concurrent
        (8, 2, 1)
    """

    max_body_bytes: int = 16 * 1024 * 1024
    max_items: int = 4096
    max_concurrent: int | None = None
    queue_timeout: float = 120.0
    header_timeout: float = 10.0
    read_timeout: float = 30.0
    max_connections: int = 128
    max_connections_per_peer: int | None = None
    reserved_connections: int | None = None
    max_header_bytes: int = 64 * 1024
    max_json_depth: int = 32
    max_string_chars: int = 1 << 18
    max_batch_size: int = 64
    max_wait: float = 0.005

    def __post_init__(self):
        if self.max_concurrent is None:
            self.max_concurrent = 1 if self.max_batch_size > 0 else 4
        if self.max_connections_per_peer is None:
            self.max_connections_per_peer = max(1, self.max_connections // 2)
        if self.reserved_connections is None:
            self.reserved_connections = self.max_connections // 8
        if not (self.header_timeout > 0 and self.read_timeout > 0):
            raise ValueError(f"timeouts must be positive, got header_timeout={self.header_timeout}, "
                             f"read_timeout={self.read_timeout}")
        if not (1 <= self.max_connections_per_peer <= self.max_connections
                and 0 <= self.reserved_connections < self.max_connections):
            raise ValueError(f"connection limits need 1 <= max_connections_per_peer ({self.max_connections_per_peer}) "
                             f"<= max_connections ({self.max_connections}) and 0 <= reserved_connections "
                             f"({self.reserved_connections}) < max_connections")

    @property
    def json(self) -> JSONLimits:
        """The bounds on a request's decoded JSON (arrays: at most ``max_items`` entries)."""
        return JSONLimits(max_depth=self.max_json_depth, max_string_chars=self.max_string_chars,
                          max_array_length=self.max_items)


def completion_of(query: str, prompt: str | None, where: str, prompt_tokens: PromptTokens | None = None) -> str:
    """The response part of ``query``: everything after the *first* occurrence of ``prompt`` (special
    tokens, padding or spaces before it are ignored; a response that repeats the prompt is kept whole,
    so nothing it holds escapes the reward), with trailing end markers and whitespace removed.
    With ``prompt_tokens`` (the policy's tokenizer) the response starts where the prompt's tokens end
    (:meth:`PromptTokens.response_start`). Without a prompt the whole query is the response.
    RequestError(400) naming ``where`` when the prompt is not in the query (with ``prompt_tokens``: when
    the query does not begin with the prompt's tokens).

    >>> completion_of("<s>Describe. a dog. Describe. a cat.", "Describe.", "q")
    'a dog. Describe. a cat.'
    """
    if prompt and prompt_tokens is not None:
        start = prompt_tokens.response_start(query, prompt)
        if start is None:
            raise RequestError(400, f"{where}: the query does not begin with its prompt's tokens "
                                    "(special tokens and padding before them are ignored)")
        text = query[start:]
    elif prompt:
        at = query.find(prompt)
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


_NO_PROMPTS_WARNED = threading.Event()

#: What the answer to a request without ``prompts`` says it scored (its ``warnings``).
NO_PROMPTS = ("the request has no 'prompts': each query was scored whole as the response (OpenRLHF sends "
              "'prompts'; a client that puts the prompt in 'query' must send 'prompts' too, or the prompt is "
              "scored as caption text)")


def _warn_no_prompts() -> None:
    """Log once per process that requests without ``prompts`` are scored as responses alone."""
    if not _NO_PROMPTS_WARNED.is_set():
        _NO_PROMPTS_WARNED.set()
        logger.warning("a request without 'prompts': %s", NO_PROMPTS.split(": ", 1)[1])


def request_warnings(payload: Any) -> list[str]:
    """The lines the answer to ``payload`` (a decoded ``/get_reward`` body) carries in ``warnings``: how
    the server read a request by a rule the client may not expect (:data:`NO_PROMPTS`)."""
    if isinstance(payload, dict) and payload.get("prompts") is None and payload.get("query"):
        return [NO_PROMPTS]
    return []


def _string_list(payload: dict, key: str, n: int | None) -> list[Any] | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(400, f"'{key}' must be a list, got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise RequestError(400, f"'{key}' has {len(value)} entries for {n} queries")
    return value


def parse_request(payload: Any, limits: ServerLimits, paths: MediaPaths | None = None,
                  prompt_tokens: PromptTokens | None = None) -> tuple[list[str], list[Label]]:
    """Captions and labels of a ``/get_reward`` body, paths checked by ``paths`` (default: every path
    refused), each response found by :func:`completion_of` (with ``prompt_tokens``: where the prompt's
    tokens end); RequestError (400/413) naming the bad item."""
    paths = paths if paths is not None else MediaPaths(None)
    if not isinstance(payload, dict):
        raise RequestError(400, f"the body must be a JSON object with 'query' and 'labels', got {type(payload).__name__}")
    queries = _string_list(payload, "query", None)
    if queries is None:
        raise RequestError(400, "missing 'query' (a list of prompt + response strings)")
    n = len(queries)
    if n > limits.max_items:
        raise RequestError(413, f"{n} queries in one request; this server accepts at most {limits.max_items}")
    try:
        check_json(payload, limits.json)
    except JSONLimitError as exc:
        raise RequestError(400, str(exc)) from None
    prompts = _string_list(payload, "prompts", n)
    if prompts is None and n:
        _warn_no_prompts()
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
        captions.append(completion_of(queries[i], prompt, f"query[{i}]", prompt_tokens))
        assert labels is not None  # n > 0 here (checked above)
        try:
            parsed.append(parse_label(labels[i], f"labels[{i}]", paths))
        except LabelError as exc:
            raise RequestError(400, str(exc)) from None
    return captions, parsed


class RewardService:
    """The server's request handling without HTTP: validate, score, build the response dict.

    ``media_root``/``allow_any_path``: which files labels may name (see
    :class:`~capreward.adapters.paths.MediaPaths`; neither given: none). ``fallback``: the reward of an
    unscorable sample; None (default): the bottom of the reward's range
    (:func:`~capreward.adapters.scoring.resolve_fallback`). ``prompt_tokens``: the policy's tokenizer
    (a :class:`~capreward.adapters.prompt_tokens.PromptTokens`, a tokenizer or its local directory):
    responses start where the prompt's tokens end (:func:`completion_of`)."""

    def __init__(self, reward: Any, fallback: float | None = None, media_root: str | None = None,
                 limits: ServerLimits | None = None, allow_any_path: bool = False, prompt_tokens: Any = None):
        self.reward = reward
        if prompt_tokens is not None and not isinstance(prompt_tokens, PromptTokens):
            prompt_tokens = PromptTokens(prompt_tokens)
        self.prompt_tokens: PromptTokens | None = prompt_tokens
        self.fallback = resolve_fallback(reward, fallback)
        self.paths = MediaPaths(media_root, allow_any_path=allow_any_path)
        self.limits = limits or ServerLimits()
        names = reward.metric_names() if hasattr(reward, "metric_names") else ()
        if "unscored" in names:
            raise ValueError("the reward reports a sub-score named 'unscored', which the server's own column uses")
        #: the ``extra_logs`` keys of every answer
        self.log_keys: tuple[str, ...] = (*names, "unscored")

    @property
    def name(self) -> str:
        return str(getattr(self.reward, "__name__", type(self.reward).__name__))

    def warm_up(self) -> None:
        """Load the reward's model(s) now rather than on the first request."""
        parts = [func for _, func, _ in getattr(self.reward, "components", [])]  # a CompositeReward's terms
        for reward in [self.reward, *parts]:
            if hasattr(reward, "scorer"):
                reward.scorer  # noqa: B018 - the property builds the scorer

    def decode(self, body: bytes) -> Any:
        """A request body decoded as JSON, to hand to :meth:`parse` (which checks it against the
        limits, naming the field); RequestError(400) when it is not JSON or nested past what the
        decoder can follow (naming where)."""
        try:
            return loads_json(body, self.limits.json, checked=False)
        except JSONLimitError as exc:
            raise RequestError(400, str(exc)) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}") from None

    def parse(self, payload: Any) -> tuple[list[str], list[Label]]:
        """Captions and labels of a decoded body (RequestError for bad requests)."""
        return parse_request(payload, self.limits, self.paths, self.prompt_tokens)

    def score(self, captions: list[str], labels: list[Label]) -> ScoredBatch:
        """Score samples (of one request or of several merged). Should the reward raise, the samples
        are scored one by one so that only the sample that raises gets None (with the error)."""
        try:
            return score_labelled(self.reward, captions, labels)
        except Exception as exc:  # noqa: BLE001 - contained per sample below
            if len(captions) == 1:
                logger.exception("scoring a sample failed")
                return ScoredBatch([None], [SampleError.from_exception(exc, 0, kind="scorer")])
        return concat_batches([self.score([c], [lab]) for c, lab in zip(captions, labels)])

    def respond(self, batch: ScoredBatch, payload: Any = None) -> dict[str, Any]:
        """The ``/get_reward`` answer for one request's scored samples. ``extra_logs`` has exactly the
        keys :attr:`log_keys` (the reward's sub-scores and ``unscored``), each with one number per
        sample, NaN where the sample has no such sub-score; so the answer depends on the request
        alone, not on what it was batched with, and every answer has the same keys. ``payload``: the
        request's decoded body, whose :func:`request_warnings` the answer carries in ``warnings``."""
        rewards = batch.filled(self.fallback)
        n = len(batch.values)
        extra: dict[str, list[float]] = {
            key: [v if math.isfinite(v) else math.nan for v in map(float, batch.metrics.get(key, [math.nan] * n))]
            for key in self.log_keys[:-1]
        }
        extra["unscored"] = [float(v is None) for v in batch.values]
        errors = [None if v is not None else self.paths.redact(_local_item(sample_failure(j, None, r), j))
                  for j, (v, r) in enumerate(zip(batch.values, batch.reasons))]
        answer = {"rewards": rewards, "scores": list(rewards), "extra_logs": extra, "errors": errors}
        if warnings := request_warnings(payload):
            answer["warnings"] = warnings
        return answer

    @staticmethod
    def encode(answer: dict[str, Any]) -> bytes:
        """An answer as JSON bytes; NaN (an undefined sub-score in ``extra_logs``) is written ``NaN``."""
        return json.dumps(answer, allow_nan=True).encode("utf-8")

    def handle(self, payload: Any) -> dict[str, Any]:
        """The ``/get_reward`` response for a decoded JSON body, scored alone (RequestError for bad
        requests)."""
        return self.respond(self.score(*self.parse(payload)), payload)


_BATCH_ITEM = re.compile(r"(completions|candidates|references)\[\d+\]")


def _local_item(error: SampleError, j: int) -> SampleError:
    """A sample's error whose item is the sample's index in the scored batch (``completions[12] is
    empty``) renamed to the request's own item (``query[1] is empty``): a merged batch's index means
    nothing to the client and would make the answer depend on what it was merged with. The item is the
    error's own field (:class:`~capreward.errors.SampleError`), not read from its text."""
    m = _BATCH_ITEM.fullmatch(error.item)
    if m is None:
        return error
    return error.renamed(j, f"query[{j}]" if m.group(1) != "references" else f"labels[{j}] references")


_LENGTH = re.compile(r"[0-9]{1,18}")


def _busy_answer(reason: str) -> bytes:
    """A complete 503 answer (closing the connection) for a connection refused at accept time."""
    body = json.dumps({"error": f"server busy: {reason}"}).encode("utf-8")
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _HeadersTooLarge(CaprewardError):
    """The request line and headers went over ``max_header_bytes``."""


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, every read bounded by what is left of the handler's ``deadline``: a
    client that trickles a byte at a time cannot hold its connection past it. While the handler reads
    a request's line and headers, their bytes are counted against ``max_header_bytes``."""

    def __init__(self, sock: socket.socket, handler: _Handler):
        self.sock, self.handler = sock, handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        handler = self.handler
        remaining = handler.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(remaining)
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            handler.server.count("header_timeouts" if handler.reading_headers else "body_timeouts")
            raise
        if handler.reading_headers:
            handler.header_bytes += n
            if handler.header_bytes > handler.server.service.limits.max_header_bytes:
                raise _HeadersTooLarge()
        return n


class _Handler(BaseHTTPRequestHandler):
    server: RewardHTTPServer
    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes: with Nagle's algorithm and the client's delayed ACK
    # every keep-alive answer would wait ~40 ms
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.reading_headers, self.header_bytes = True, 0
        self.started = self.deadline = time.monotonic()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        # from now: the request's line and headers within header_timeout, all of it within read_timeout
        limits = self.server.service.limits
        self.started = time.monotonic()
        self.deadline = self.started + min(limits.header_timeout, limits.read_timeout)
        self.reading_headers, self.header_bytes = True, 0
        self.request_version, self.requestline, self.command = "HTTP/1.1", "", ""  # for an early answer
        try:
            super().handle_one_request()
        except _HeadersTooLarge:
            self.server.count("headers_too_large")
            self._send(431, {"error": f"the request line and headers exceed {limits.max_header_bytes} bytes"},
                       close=True)

    def _headers_done(self) -> None:
        """The headers are in: the body may take until the whole request's deadline."""
        self.reading_headers = False
        self.deadline = self.started + self.server.service.limits.read_timeout

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.info("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: dict[str, Any], close: bool = False) -> None:
        data = RewardService.encode(body)
        self.connection.settimeout(self.server.service.limits.read_timeout)  # for the writes
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._headers_done()
        if self.path.rstrip("/") == "/health":
            self._send(200, self.server.health())
        else:
            self._send(404, {"error": f"no such endpoint {self.path!r}; use POST /get_reward or GET /health"})

    def _body_size(self, limits: ServerLimits) -> int | None:
        """The declared body size, or None after answering (411/400/413) without reading the body."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._send(411, {"error": "chunked or encoded bodies are not accepted; send a Content-Length"}, close=True)
            return None
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if not lengths:
            self._send(411, {"error": "a Content-Length header is required"}, close=True)
            return None
        if len(lengths) > 1 or not _LENGTH.fullmatch(next(iter(lengths))):
            self._send(400, {"error": "Content-Length must be one non-negative integer"}, close=True)
            return None
        size = int(next(iter(lengths)))
        if size > limits.max_body_bytes:
            self._send(413, {"error": f"request body of {size} bytes exceeds the limit of {limits.max_body_bytes}"},
                       close=True)
            return None
        return size

    def _read_body(self, size: int, limits: ServerLimits) -> bytes | None:
        """The body, or None after answering 408 (not complete within the request's deadline) or
        when the client hung up."""
        try:
            body = self.rfile.read(size)
        except TimeoutError:
            self._send(408, {"error": f"the request did not arrive within {limits.read_timeout} s"}, close=True)
            return None
        if len(body) < size:
            self.close_connection = True
            return None
        return body

    def do_POST(self) -> None:  # noqa: N802
        self._headers_done()
        if self.path.rstrip("/") != "/get_reward":
            self._send(404, {"error": f"no such endpoint {self.path!r}; use POST /get_reward"}, close=True)
            return
        service, limits = self.server.service, self.server.service.limits
        size = self._body_size(limits)
        if size is None:
            return
        body = self._read_body(size, limits)
        if body is None:
            return
        try:
            payload = service.decode(body)
            captions, labels = service.parse(payload)
            batch = self.server.batcher.submit(captions, labels, timeout=limits.queue_timeout)
            self._send(200, service.respond(batch, payload))
        except RequestError as exc:
            self._send(exc.status, {"error": exc.message})
        except Busy as exc:
            self._send(503, {"error": f"server busy: {exc}"})
        except Exception as exc:  # keep serving; the client sees what went wrong
            logger.exception("scoring failed")
            self._send(500, {"error": service.paths.redact(f"{type(exc).__name__}: {exc}")})


class RewardHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server around a :class:`RewardService`: one thread per admitted connection
    (:class:`~capreward.server.connections.ConnectionSlots`: ``limits.max_connections`` in all,
    ``max_connections_per_peer`` per client address, ``reserved_connections`` kept for addresses
    holding none; others get 503 and are closed), requests merged into batches by a
    :class:`~capreward.server.batching.DynamicBatcher`. Stop it with ``shutdown()`` (from another
    thread) and then :meth:`close_gracefully`, which lets queued and running batches finish but does
    not wait for idle keep-alive connections."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], service: RewardService):
        # the listen backlog: socketserver's 5 overflows when RL workers connect at once (16 clients
        # made Linux drop handshakes and reset connections); every allowed connection must fit, and a
        # connection over the limit is better answered 503 than dropped by the kernel
        self.request_queue_size = max(128, service.limits.max_connections)
        super().__init__(address, _Handler)
        self.service = service
        limits = service.limits
        # ServerLimits.__post_init__ fills these
        assert limits.max_connections_per_peer is not None and limits.reserved_connections is not None
        assert limits.max_concurrent is not None
        self.slots = ConnectionSlots(limits.max_connections, limits.max_connections_per_peer,
                                     limits.reserved_connections)
        self.counters = {"header_timeouts": 0, "body_timeouts": 0, "headers_too_large": 0}
        self._counters_lock = threading.Lock()
        self.batcher = DynamicBatcher(service.score, max_batch_size=limits.max_batch_size,
                                      max_wait=limits.max_wait, workers=limits.max_concurrent)

    @property
    def url(self) -> str:
        host, port = cast(tuple[str, int], self.server_address[:2])  # an IPv4/IPv6 TCP address
        return f"http://{host}:{port}"

    def count(self, event: str) -> None:
        with self._counters_lock:
            self.counters[event] += 1

    def health(self) -> dict[str, Any]:
        """``GET /health``: the reward, batches and samples scored, and the connections: ``open``,
        ``peers`` holding them, the ``largest`` number one peer holds, ``refused`` at accept, and
        connections closed for ``header_timeouts``, ``body_timeouts`` and ``headers_too_large``."""
        with self._counters_lock:
            counters = dict(self.counters)
        return {"status": "ok", "reward": self.service.name, "batches": self.batcher.batches,
                "samples": self.batcher.samples, "connections": {**self.slots.snapshot(), **counters}}

    def process_request(self, request, client_address) -> None:
        peer = peer_of(client_address)
        refusal = self.slots.acquire(peer)
        if refusal is not None:
            try:  # a fresh socket's send buffer takes this at once
                request.settimeout(1.0)
                request.sendall(_busy_answer(refusal))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        threading.Thread(target=self._serve_connection, args=(request, client_address, peer), daemon=True).start()

    def _serve_connection(self, request, client_address, peer: str) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - socketserver's convention
            self.handle_error(request, client_address)
        finally:
            # free the slot before the client sees the connection close
            self.slots.release(peer)
            self.shutdown_request(request)

    def close_gracefully(self, timeout: float = 120.0) -> bool:
        """Wait (up to ``timeout`` s) for queued and running batches, then close the socket.
        Returns False when requests were still running at the deadline."""
        finished = self.batcher.close(timeout)
        self.server_close()
        return finished


def make_server(reward: Any, host: str = "127.0.0.1", port: int = 0, *, fallback: float | None = None,
                media_root: str | None = None, limits: ServerLimits | None = None,
                warm_up: bool = True, allow_any_path: bool = False, prompt_tokens: Any = None) -> RewardHTTPServer:
    """A bound (not yet serving) reward server (``server.serve_forever()`` serves it).

    Args:
        reward: the reward to serve (a capreward reward function).
        host: the address to bind (``127.0.0.1``: this machine only).
        port: the port (0 picks a free one; see ``.url``).
        fallback: the value answered for a sample without a score (default: the bottom of the reward's
            range), as for :class:`RewardService`.
        media_root: labels may name files under this folder only (none without one, unless
            ``allow_any_path``).
        limits: the :class:`ServerLimits` (default: its defaults).
        warm_up: load the model before the socket is bound.
        allow_any_path: serve any path a label names (trusted clients only).
        prompt_tokens: the policy's tokenizer, to cut each query where the prompt's tokens end (default:
            the response after the prompt's first occurrence).

    Returns:
        The :class:`RewardHTTPServer`, bound.
    """
    service = RewardService(reward, fallback=fallback, media_root=media_root, limits=limits,
                            allow_any_path=allow_any_path, prompt_tokens=prompt_tokens)
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
    "Busy", "END_MARKERS", "NO_PROMPTS", "RequestError", "RewardHTTPServer", "RewardService", "ServerLimits", "completion_of",
    "make_server", "parse_request", "post_json",
]
