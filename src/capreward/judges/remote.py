"""The chat protocol (:mod:`capreward.judges.protocol`) on an OpenAI-compatible server (OpenAI, vLLM).

:class:`OpenAIJudge` sends each :class:`ChatRequest` to ``POST {base_url}/chat/completions`` with the
official ``openai`` client (``AsyncOpenAI``): images as PNG data-URI ``image_url`` parts, greedy or
sampled decoding, ``logprobs=True`` with ``top_logprobs=k`` (capped at 20, the limit of OpenAI and of
vLLM's default ``max_logprobs``).

Robustness, because a reward batch must never lose or shift a sample:

- at most ``max_concurrency`` requests in flight (an ``asyncio.Semaphore``);
- retries are the ``openai`` client's own (``max_retries``): 408/409/429/5xx answers, connection errors
  and timeouts (``timeout``: the client's per-attempt connect/read/write limits) are retried with its
  exponential backoff and jitter, honouring a server's ``Retry-After``; other 4xx answers (a bad
  request) are not retried;
- what the client does not do, done here: a 2xx body that is not a chat completion (not JSON, no
  choices), which the client hands back as it is, is asked again, up to ``max_retries`` times, and so is
  a malformed answer (:func:`~capreward.judges.protocol.answer_problem`: a log-probability that is not a
  finite number at most 0, alternatives summing above 1, more text or tokens than ``max_tokens`` allows);
  the whole request, every attempt and wait included, is bounded (:meth:`OpenAIJudge.request_deadline`);
- a body is never read past ``max_response_bytes`` (:func:`capped_http_client`): a server that answers
  40 MB is a failed attempt, not 40 MB in memory;
- ``result[i]`` always answers ``requests[i]``: results are stored by index, never by completion order,
  and a request that still fails gets a :class:`ChatResponse` with ``error`` naming the failure.

The API key is read from the environment variable ``api_key_env`` and never logged, shown in a repr or
put in an error message (any occurrence in a server's message is masked).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
import logging
import os
from collections import OrderedDict
from dataclasses import replace
from typing import Any, TypeVar, cast
from collections.abc import Callable, Coroutine, Sequence

from PIL import Image

from ..errors import CaprewardError
from .caller_text import escape_special_tokens
from .protocol import (
    FrozenMapping,
    ChatRequest,
    ChatResponse,
    ChatTurn,
    MalformedAnswer,
    NextTokenAnswer,
    NextTokenQuery,
    TokenLogprob,
    answer_problem,
    visual_key,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: OpenAI's and vLLM's (default ``max_logprobs``) limit on ``top_logprobs``.
TOP_LOGPROBS_CAP = 20
#: HTTP statuses the openai client retries (and every 5xx): timeout, conflict, rate limit.
RETRY_STATUSES = frozenset({408, 409, 429})
#: The longest ``Retry-After`` the openai client waits for before a retry (its ``MAX_RETRY_AFTER_DELAY``).
CLIENT_MAX_RETRY_AFTER = 120.0
#: The most bytes of one response body read (a larger body is a failed attempt).
MAX_RESPONSE_BYTES = 64 << 20
#: The most bytes of answers a response cache keeps (beside its count of entries).
CACHE_BYTES = 64 << 20
#: The most prompts one next-token request carries by default (a digit tree needs 102, G-VEval's four
#: ACCR trees 408).
NEXT_TOKEN_BATCH = 512


class MalformedResponse(CaprewardError):
    """The server answered 2xx with a body that is not a usable chat completion."""


class ResponseTooLarge(MalformedResponse):
    """A response body longer than the client's ``max_response_bytes`` (not read past it)."""


def _http_module() -> Any:
    """The HTTP library the installed ``openai`` client runs on (``httpx``, or ``httpx2`` in its newest
    releases): its transports and streams are that library's."""
    import openai._base_client as base

    return getattr(base, "httpx2", None) or base.httpx


def capped_http_client(max_bytes: int) -> Any:
    """An async HTTP client for the ``openai`` client (its defaults: timeouts, connection limits,
    redirects) that reads no response body past ``max_bytes``: a ``Content-Length`` above it is refused
    before the body is read, and a body streamed past it stops there; both raise
    :class:`ResponseTooLarge`, which the ``openai`` client retries like a broken connection.

    Args:
        max_bytes: the most bytes of one body.

    Returns:
        An ``openai.DefaultAsyncHttpxClient``.
    """
    import openai

    hx: Any = _http_module()
    limit = int(max_bytes)

    class CappedStream(hx.AsyncByteStream):
        def __init__(self, inner: Any):
            self.inner = inner

        async def __aiter__(self):
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > limit:
                    raise ResponseTooLarge(f"the response body is longer than {limit} bytes")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def cap(response: Any) -> None:
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise ResponseTooLarge(f"the response body has {int(length)} bytes (at most {limit} are read)")
        response.stream = CappedStream(response.stream)

    return openai.DefaultAsyncHttpxClient(event_hooks={"response": [cap]})


def response_bytes(response: ChatResponse) -> int:
    """About how many bytes ``response`` holds in memory (its text, tokens and listed alternatives): what a
    response cache counts against its byte bound."""
    size = 200 + 2 * len(response.text)
    for token in response.tokens:
        size += 120 + 2 * len(token.token)
        for text, _ in token.ranked or tuple(token.top.items()):
            size += 2 * (80 + 2 * len(text))  # in ranked and in top
    for entries in response.prompt_logprobs or ():
        for text, _ in entries or ():
            size += 80 + 2 * len(text)
    return size


def image_data_uri(image: Image.Image) -> str:
    """``data:image/png;base64,...`` of ``image`` converted to RGB (lossless, so a server sees the
    exact pixels)."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_encoder() -> Callable[[Image.Image], str]:
    """:func:`image_data_uri` for one call's requests: each distinct image (by its pixels) encoded once."""
    uris: dict[Any, str] = {}

    def encode(image: Image.Image) -> str:
        k = visual_key(image)
        if k not in uris:
            uris[k] = image_data_uri(image)
        return uris[k]

    return encode


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """``coroutine`` run to its end from synchronous code: on a new event loop, or, when this thread
    already runs one (a notebook, an async trainer), on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def to_messages(turns: Sequence[ChatTurn], system: str | None = None, encode=image_data_uri) -> list[dict]:
    """OpenAI chat ``messages`` for ``turns``: a user turn with images becomes content parts (the
    ``image_url`` parts first, then the text; the text first with ``text_first``; each image part with
    ``detail`` when ``image_detail`` is set), other turns plain strings. ``system``: a system message put
    first (configuration, sent as is). ``encode`` maps an image to its URL.

    Turn text is data: servers tokenise message text with special-token parsing (vLLM does), so every
    special-token string in it is broken with a space first
    (:func:`~capreward.judges.caller_text.escape_special_tokens`: "</s>" is sent as "< /s>")."""
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    for turn in turns:
        turn = replace(turn, text=escape_special_tokens(turn.text))
        if turn.role not in ("system", "user", "assistant"):
            raise ValueError(f"turn role must be 'system', 'user' or 'assistant', got {turn.role!r}")
        if turn.videos:
            raise ValueError("a remote judge takes images, not video frames: send a video as images (G-VEval: "
                             "video_input='composite')")
        if turn.images:
            if turn.role != "user":
                raise ValueError("only user turns can carry images")
            images = []
            for im in turn.images:
                url: dict[str, Any] = {"url": encode(im)}
                if turn.image_detail is not None:
                    url["detail"] = turn.image_detail
                images.append({"type": "image_url", "image_url": url})
            text = [{"type": "text", "text": turn.text}]
            messages.append({"role": turn.role, "content": text + images if turn.text_first else images + text})
        else:
            messages.append({"role": turn.role, "content": turn.text})
    return messages


def parse_completion(completion: Any) -> ChatResponse:
    """A :class:`ChatResponse` from an ``openai`` ``ChatCompletion`` object: the first choice's text,
    finish reason and per-token log-probabilities (top alternatives as text -> logprob; when a server
    lists one text twice the first, most likely, entry is kept in ``top``, and every entry, in the
    server's order, in ``ranked``). Raises :class:`MalformedResponse` when the object is not a chat
    completion."""
    try:
        choices = completion.choices
        if not choices:
            raise MalformedResponse("the response has no choices")
        choice = choices[0]
        text = choice.message.content or ""
        tokens = []
        content = choice.logprobs.content if choice.logprobs is not None else None
        for item in content or ():
            ranked = tuple((alt.token, float(alt.logprob)) for alt in item.top_logprobs or ())
            top: dict[str, float] = {}
            for text_, logprob in ranked:
                top.setdefault(text_, logprob)
            tokens.append(TokenLogprob(item.token, float(item.logprob), top, ranked))
    except MalformedResponse:
        raise
    except (AttributeError, TypeError, ValueError) as exc:
        raise MalformedResponse(f"the response is not a chat completion ({type(exc).__name__}: {exc})") from exc
    if not isinstance(text, str):
        raise MalformedResponse(f"message content is {type(text).__name__}, not text")
    return ChatResponse(text=text, tokens=tuple(tokens), finish_reason=choice.finish_reason,
                        prompt_logprobs=parse_prompt_logprobs(completion))


def parse_prompt_logprobs(completion: Any) -> tuple[tuple[tuple[str, float], ...] | None, ...] | None:
    """vLLM's ``prompt_logprobs`` of a chat completion (a field outside OpenAI's schema: per prompt token
    None or ``{token_id: {"logprob", "rank", "decoded_token"}}``) as per-position (text, log-probability)
    pairs ranked as the server ranked them; None when the response has none. Raises
    :class:`MalformedResponse` for a field of another shape."""
    raw = (getattr(completion, "model_extra", None) or {}).get("prompt_logprobs")
    if raw is None:
        raw = getattr(completion, "prompt_logprobs", None)
    if raw is None:
        return None
    try:
        out: list[tuple[tuple[str, float], ...] | None] = []
        for position in raw:
            if position is None:
                out.append(None)
                continue
            entries = sorted(position.values(), key=lambda e: (e.get("rank") is None, e.get("rank") or 0))
            out.append(tuple((str(e["decoded_token"]), float(e["logprob"])) for e in entries))
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise MalformedResponse(f"prompt_logprobs is not vLLM's per-token list ({type(exc).__name__}: {exc})") from exc
    return tuple(out)


#: The model OpenAIJudge asks for when none is named: the snapshot G-VEval's released scorer.py calls.
DEFAULT_API_MODEL = "gpt-4o-2024-05-13"


class OpenAIJudge:
    """A `JudgeBackend` on an OpenAI-compatible chat-completions server.

    Args:
        base_url: e.g. ``"http://localhost:8000/v1"`` for vLLM (None: OpenAI's).
        model: the served model name (also this backend's ``name``, used in cache keys); the default is
            the snapshot G-VEval's released ``scorer.py`` calls, ``gpt-4o-2024-05-13``.
        api_key_env: the environment variable holding the key (None, or unset for a local server: the
            placeholder ``"EMPTY"`` that vLLM accepts).
        max_concurrency: requests in flight.
        timeout: the ``openai`` client's timeout of one attempt (seconds).
        max_retries: the client's retries after the first attempt (its backoff: 0.5 s doubling up to 8 s,
            with jitter, or the server's ``Retry-After``); malformed 2xx bodies are asked again as many times.
        top_logprobs_cap: the most alternatives asked per token (20: OpenAI's limit and vLLM's default
            ``--max-logprobs``; raise it for a vLLM served with more).
        system: an optional system message.
        extra_body: extra request fields (e.g. vLLM's ``{"top_k": 1}``).
        token_limit_param: ``"max_tokens"`` (vLLM, older OpenAI models) or ``"max_completion_tokens"``
            (newer OpenAI models).
        prompt_logprobs: the server answers vLLM's ``prompt_logprobs`` (the log-probability of each prompt
            token): the exact digit trees then read a digit missing from a node's ``top_logprobs`` as the
            last prompt token of a request prefilled with it (`capreward.scorers.remote_numbers`), so a
            server with a small ``--max-logprobs`` still gives exact expected scores.
        cache_size: greedy answers kept in memory (0: none), least recently used first out.
        cache_bytes: the most bytes those answers may hold (:func:`response_bytes`); an answer larger
            than this is not kept.
        max_response_bytes: the most bytes of one response body read (:func:`capped_http_client`).

    A request whose last turn is an assistant message is sent as a prefill (vLLM's
    ``continue_final_message=true, add_generation_prompt=false``); a request's ``structured_outputs`` goes
    in vLLM's field of that name.

    Examples:
        >>> from capreward.judges import ChatRequest, OpenAIJudge, user_turn
        >>> from capreward.testing.chat_server import ChatServer
        >>> with ChatServer("echo", model="echo") as server:   # a local OpenAI-compatible test server
        ...     judge = OpenAIJudge(server.base_url, "echo", api_key_env=None)
        ...     [answer] = judge.generate([ChatRequest(turns=(user_turn("a red square"),), max_tokens=8)])
        >>> answer.text
        'echo: a red square'
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str = DEFAULT_API_MODEL,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 5,
        top_logprobs_cap: int = TOP_LOGPROBS_CAP,
        system: str | None = None,
        extra_body: dict | None = None,
        token_limit_param: str = "max_tokens",
        prompt_logprobs: bool = False,
        cache_size: int = 0,
        cache_bytes: int = CACHE_BYTES,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be non-negative, got {max_retries}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if token_limit_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(f"token_limit_param must be 'max_tokens' or 'max_completion_tokens', got {token_limit_param!r}")
        self.base_url = base_url
        self.model = model
        self.name = model
        self.api_key_env = api_key_env
        self.max_concurrency = int(max_concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.top_logprobs_cap = int(top_logprobs_cap)
        self.prompt_logprobs = bool(prompt_logprobs)
        self.system = system
        self.extra_body = dict(extra_body or {})
        self.token_limit_param = token_limit_param
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        for what, value in (("cache_bytes", cache_bytes), ("max_response_bytes", max_response_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.max_response_bytes = max_response_bytes
        self._cache: OrderedDict[tuple, tuple[ChatResponse, int]] = OrderedDict()
        self._cache_total = 0
        self.requests_sent = 0  # requests sent (each counted once, however often the client retried it)

    def __repr__(self) -> str:
        return (
            f"OpenAIJudge(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"max_concurrency={self.max_concurrency}, timeout={self.timeout}, max_retries={self.max_retries})"
        )

    # ----------------------------------------------------------------------------------- public API
    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Answer every request. Works with or without a running event loop in this thread (inside one,
        the requests run on a fresh loop in a worker thread).

        Args:
            requests: the conversations to continue.

        Returns:
            One :class:`~capreward.judges.protocol.ChatResponse` per request, ``result[i]`` for
            ``requests[i]``; a request that cannot be answered has ``error`` set (the call does not raise).
        """
        return run_blocking(self.agenerate(list(requests)))

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Answer every request concurrently (at most ``max_concurrency`` in flight).

        Args:
            requests: the conversations to continue.

        Returns:
            One :class:`~capreward.judges.protocol.ChatResponse` per request, ``result[i]`` for
            ``requests[i]``; a request that cannot be answered has ``error`` set (the call does not raise).

        Raises:
            ImportError: the ``remote`` extra (the ``openai`` client) is not installed, naming it.
        """
        from .._extras import require

        require("remote", "openai", used_by="OpenAIJudge")  # without the extra: one line naming it, even for no requests
        requests = list(requests)
        results: list[ChatResponse | None] = [None] * len(requests)
        if not requests:
            return []
        # Greedy requests equal by content (images by their pixels) are sent once; the others follow the
        # first. Answers already cached (``cache_size``) are not sent at all.
        first: dict[ChatRequest, int] = {}
        copies: list[tuple[int, int]] = []
        send: list[int] = []
        for i, request in enumerate(requests):
            if not self._deterministic(request):
                send.append(i)
                continue
            cached = self._cache_get(request)
            if cached is not None:
                results[i] = cached
            elif request in first:
                copies.append((i, first[request]))
            else:
                first[request] = i
                send.append(i)
        if send:
            await self._send(requests, send, results)
        for i in send:
            if (result := results[i]) is not None and result.ok and self._deterministic(requests[i]):
                self._cache_put(requests[i], result)
        for i, j in copies:
            results[i] = results[j]
        return [r if r is not None else ChatResponse(text="", error="internal error: no result") for r in results]

    async def _send(self, requests: list[ChatRequest], send: list[int], results: list) -> None:
        """Send ``requests[i]`` for each i in ``send`` concurrently, answers into ``results[i]``."""
        key = self._api_key()
        semaphore = asyncio.Semaphore(self.max_concurrency)
        encode = image_encoder()

        async with self._client(key) as client:

            async def run(index: int, request: ChatRequest) -> None:
                try:
                    body = self._body(request, encode)
                except ValueError as exc:
                    results[index] = ChatResponse(text="", error=f"invalid request: {exc}")
                    return
                async with semaphore:
                    results[index] = await self._complete(client, index, body, key, request.max_tokens)

            await asyncio.gather(*(run(i, requests[i]) for i in send))

    def _client(self, key: str) -> Any:
        """The ``openai`` async client for this server: its retries and timeouts, bodies capped at
        ``max_response_bytes``."""
        from .._extras import require

        AsyncOpenAI = require("remote", "openai", used_by=type(self).__name__).AsyncOpenAI
        return AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=self.max_retries, timeout=self.timeout,
                           http_client=capped_http_client(self.max_response_bytes))

    # ------------------------------------------------------------------------- exact next-token scoring
    def _next_tokens(self, queries: Sequence[NextTokenQuery]) -> list[NextTokenAnswer]:
        """:meth:`_anext_tokens`, from synchronous code (inside a running event loop, on a fresh loop in a
        worker thread)."""
        return run_blocking(self._anext_tokens(list(queries)))

    def next_token_chunks(self, queries: Sequence[NextTokenQuery]) -> list[list[int]]:
        """The requests ``queries`` go out in, as lists of query indices: one per group
        (:attr:`~capreward.judges.protocol.NextTokenQuery.group`, first seen first), split where the
        server needs one request's prompts to agree (:meth:`_batch_key`) and at ``max_batch`` prompts
        (default :data:`NEXT_TOKEN_BATCH`)."""
        size = int(getattr(self, "max_batch", NEXT_TOKEN_BATCH))
        groups: dict[Any, list[int]] = {}
        for i, query in enumerate(queries):
            groups.setdefault((query.group, self._batch_key(query)), []).append(i)
        return [rows[s : s + size] for rows in groups.values() for s in range(0, len(rows), size)]

    def _batch_key(self, query: NextTokenQuery) -> Any:
        """What the prompts of one next-token request must share (none here)."""
        return None

    def _next_token_body(self, chunk: Sequence[NextTokenQuery], encode: Any) -> tuple[str, dict]:
        """``(path, JSON body)`` of the request that scores ``chunk`` (a subclass's protocol)."""
        raise NotImplementedError(f"{type(self).__name__} does not score next tokens")

    def _next_token_maps(self, reply: Any, chunk: Sequence[NextTokenQuery]) -> list[dict]:
        """Per query of ``chunk``, ``{token id: log-probability}`` read from the server's ``reply``."""
        raise NotImplementedError(f"{type(self).__name__} does not score next tokens")

    async def _anext_tokens(self, queries: Sequence[NextTokenQuery]) -> list[NextTokenAnswer]:
        """Every query answered, each chunk (:meth:`next_token_chunks`) in one request, at most
        ``max_concurrency`` in flight, with this backend's retries; a malformed reply
        (:func:`~capreward.judges.protocol.answer_next_tokens` refuses it) is asked again. A failed
        chunk's queries get ``error`` set; the call does not raise for it."""
        from .._extras import require
        from .protocol import answer_next_tokens

        require("remote", "openai", used_by=type(self).__name__)
        queries = list(queries)
        results: list[NextTokenAnswer | None] = [None] * len(queries)
        if not queries:
            return []
        chunks = self.next_token_chunks(queries)
        key = self._api_key()
        semaphore = asyncio.Semaphore(self.max_concurrency)
        encode = image_encoder()

        async with self._client(key) as client:

            async def run(rows: list[int]) -> None:
                chunk = [queries[i] for i in rows]
                try:
                    path, body = self._next_token_body(chunk, encode)
                except ValueError as exc:
                    for i in rows:
                        results[i] = NextTokenAnswer(None, f"invalid request: {exc}")
                    return

                async def ask() -> list[NextTokenAnswer]:
                    reply = await client.post(path, cast_to=object, body=body)
                    try:
                        maps = self._next_token_maps(reply, chunk)
                    except (KeyError, IndexError, TypeError, AttributeError) as exc:
                        raise MalformedResponse(f"the reply is not the server's schema ({type(exc).__name__}: {exc})") from exc
                    return answer_next_tokens(chunk, maps, "the server")

                async with semaphore:
                    got = await self._attempts(rows[0], ask, key)
                for n, i in enumerate(rows):
                    results[i] = NextTokenAnswer(None, got.error) if isinstance(got, ChatResponse) else got[n]

            await asyncio.gather(*(run(rows) for rows in chunks))
        log.info("%s: scored %d next-token queries in %d requests", self.model, len(queries), len(chunks))
        return [r if r is not None else NextTokenAnswer(None, "internal error: no result") for r in results]

    # ------------------------------------------------------------------------------------ response cache
    @staticmethod
    def _deterministic(request: ChatRequest) -> bool:
        """Whether two copies of ``request`` may share one answer: greedy decoding (a sampled request
        asked twice is two samples)."""
        return request.temperature == 0

    def _cache_get(self, request: ChatRequest) -> ChatResponse | None:
        key = request.content_key if self.cache_size else None
        if key is None or key not in self._cache:
            return None
        self._cache.move_to_end(key)
        return self._cache[key][0]

    def _cache_put(self, request: ChatRequest, response: ChatResponse) -> None:
        """Keep a well-formed answer (never an error, never one :func:`answer_problem` refuses), within
        ``cache_size`` entries and ``cache_bytes`` bytes, least recently used first out."""
        key = request.content_key if self.cache_size else None
        if key is None or not response.ok:  # no cache, or a visual without a content key: never cached
            return
        if answer_problem(response, request.max_tokens) is not None:
            return
        size = response_bytes(response)
        if size > self.cache_bytes:
            return
        if key in self._cache:
            self._cache_total -= self._cache.pop(key)[1]
        self._cache[key] = (response, size)
        self._cache_total += size
        while len(self._cache) > self.cache_size or self._cache_total > self.cache_bytes:
            self._cache_total -= self._cache.popitem(last=False)[1][1]

    # ------------------------------------------------------------------------------------ internals
    def request_deadline(self) -> float:
        """Seconds one request may take, every attempt and wait included: each of the ``max_retries + 1``
        attempts ``timeout`` and each wait the longest ``Retry-After`` the client honours. Beyond it the
        request gets an error (a server that trickles its answer cannot hold a sample for ever)."""
        return (self.max_retries + 1) * self.timeout + self.max_retries * CLIENT_MAX_RETRY_AFTER

    def _api_key(self) -> str:
        value = os.environ.get(self.api_key_env) if self.api_key_env else None
        return value or "EMPTY"

    def _body(self, request: ChatRequest, encode) -> dict:
        """The request fields for one `ChatRequest` (``top_logprobs`` capped)."""
        if request.max_tokens is not None and request.max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {request.max_tokens}")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_messages(request.turns, self.system, encode),
            "temperature": float(request.temperature),
        }
        if request.max_tokens is not None:  # None: no limit sent, as G-VEval's release sends none
            body[self.token_limit_param] = int(request.max_tokens)
        if request.top_logprobs > 0:
            body["logprobs"] = True
            body["top_logprobs"] = min(int(request.top_logprobs), self.top_logprobs_cap)
        if request.stop:
            body["stop"] = list(request.stop)
        extra = dict(self.extra_body)
        if request.prefilled:  # continue the final assistant message (vLLM's fields; OpenAI has no prefill)
            extra.update(continue_final_message=True, add_generation_prompt=False)
        if request.structured_outputs is not None:  # vLLM >= 0.12 (the guided_* fields were removed)
            extra["structured_outputs"] = cast(FrozenMapping, request.structured_outputs).thaw()  # plain dicts and lists, as JSON
        if request.chat_template is not None:
            extra["chat_template"] = request.chat_template  # vLLM's extra field (OpenAI rejects it)
        if request.prompt_logprobs is not None:  # vLLM's extra field: every prompt token's log-probability
            extra["prompt_logprobs"] = int(request.prompt_logprobs)
        if extra:
            body["extra_body"] = extra
        return body

    async def _complete(self, client: Any, index: int, body: dict, key: str, max_tokens: int | None = None) -> ChatResponse:
        """One request; never raises for server or network failures. The client retries what HTTP says is
        worth retrying; here a 2xx body that is not a chat completion, or a malformed answer
        (:func:`~capreward.judges.protocol.answer_problem` against ``max_tokens``), is asked again."""

        async def ask() -> ChatResponse:
            completion = await client.chat.completions.create(**body)
            response = parse_completion(completion)
            problem = answer_problem(response, max_tokens)
            if problem is not None:
                raise MalformedResponse(problem)
            return response

        return await self._attempts(index, ask, key)

    async def _attempts(self, index: int, ask: Any, key: str) -> Any:
        """``await ask()`` with this backend's failure handling (one request; never raises for server or
        network failures): the ``openai`` client retries what HTTP says is worth retrying; a malformed
        2xx body (``ask`` raises :class:`MalformedResponse`, a ValueError or :class:`MalformedAnswer`) is
        asked again here, up to ``max_retries`` times. Returns what ``ask`` returns, or a
        :class:`ChatResponse` with ``error`` set."""
        import openai

        attempts = f"after {self.max_retries + 1} attempts"
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            try:
                self.requests_sent += 1
                return await asyncio.wait_for(ask(), timeout=self.request_deadline())
            except (MalformedResponse, MalformedAnswer, openai.APIResponseValidationError, ValueError) as exc:
                # json.JSONDecodeError is a ValueError: a 2xx body that is not JSON
                last = f"malformed response ({_short(str(exc))})"
                if attempt < self.max_retries:
                    log.warning("%s: request %d attempt %d/%d: %s; asking again", self.model, index, attempt + 1,
                                self.max_retries + 1, _mask(last, key))
                continue
            except TimeoutError:
                last = f"no answer within {self.request_deadline():g} s (every attempt and wait)"
            except openai.APITimeoutError:
                last = f"timed out after {self.timeout:g} s, {attempts}"
            except openai.APIConnectionError as exc:
                cause = exc.__cause__
                if isinstance(cause, ResponseTooLarge):
                    last = f"malformed response ({cause}), {attempts}"
                else:
                    last = f"connection error ({exc}), {attempts}"
            except openai.APIStatusError as exc:
                retried = exc.status_code in RETRY_STATUSES or exc.status_code >= 500
                status = f"HTTP {exc.status_code} ({_short(exc.message)})"
                return self._failed(f"request {index} failed {attempts}: {status}" if retried
                                    else f"request {index} failed: {status}", key)
            return self._failed(f"request {index} failed: {last}", key)
        return self._failed(f"request {index} failed {attempts}: {last}", key)

    def _failed(self, error: str, key: str) -> ChatResponse:
        error = _mask(error, key)
        log.error("%s: %s", self.model, error)
        return ChatResponse(text="", error=error)


class NextTokenServerJudge(OpenAIJudge):
    """An :class:`OpenAIJudge` whose server also scores chosen next tokens exactly
    (:class:`~capreward.judges.protocol.NextTokenScorer`): each group of queries in one request, in the
    protocol of the subclass (its ``_next_token_body`` and ``_next_token_maps``; its ``_batch_key`` says
    what one request's prompts must share). The subclasses: :class:`~capreward.judges.sglang.SGLangJudge`
    and :class:`~capreward.judges.vllm.VLLMJudge`; their own arguments are documented there.

    Examples:
        >>> from capreward.judges import NextTokenServerJudge, SGLangJudge, VLLMJudge
        >>> issubclass(SGLangJudge, NextTokenServerJudge), issubclass(VLLMJudge, NextTokenServerJudge)
        (True, True)
    """

    def next_token_logprobs(self, queries: Sequence[NextTokenQuery]) -> list[NextTokenAnswer]:
        """The exact log-probability of each query's tokens as the next token: one request per group of
        queries (see the server's module docstring).

        Args:
            queries: what to score.

        Returns:
            One :class:`~capreward.judges.protocol.NextTokenAnswer` per query, in order (``error`` set
            where its request failed after the retries or the reply was malformed).
        """
        return self._next_tokens(queries)

    async def anext_token_logprobs(self, queries: Sequence[NextTokenQuery]) -> list[NextTokenAnswer]:
        """:meth:`next_token_logprobs`, awaitable.

        Args:
            queries: what to score.

        Returns:
            One answer per query, in order.
        """
        return await self._anext_tokens(queries)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mask(text: str, key: str) -> str:
    """``text`` with any occurrence of the API key replaced (a server may echo it back)."""
    return text.replace(key, "***") if key and key != "EMPTY" else text

