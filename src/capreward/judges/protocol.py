"""The chat-level interface every judge backend offers (local transformers or a remote server).

VisCE², G-VEval and FLEUR-on-a-server speak to a judge through :class:`ChatRequest` →
:class:`ChatResponse`: one conversation (user/assistant turns, images attached to the first user
turn), greedy or sampled decoding, and for every generated token the top alternatives with their
log-probabilities (what OpenAI-compatible servers return as ``logprobs.content[i].top_logprobs``).

A backend never drops or reorders requests: ``generate(requests)[i]`` answers ``requests[i]``, and a
request that failed after the backend's retries gets a response with ``error`` set and no text.

What a backend answers is read in one way by every reader (digit trees, yes/no, option letters, listed
alternatives, prompt log-probabilities): :func:`checked_logprob` and :func:`listed_probabilities` turn
log-probabilities into probabilities and refuse what no model writes (a value that is not a finite
number at most 0, alternatives at one position whose probabilities sum above 1), and
:func:`answer_problem` refuses an answer larger than was asked. A remote backend treats such an answer as
a failed attempt (asked again, never cached); a reader given one directly gives that sample no score and
the reason, never an exception. A backend that can score chosen next tokens exactly
(:class:`NextTokenQuery`, :class:`NextTokenScorer`) lets the readers reach exact remote scores in at most
two requests per caption.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable
from collections.abc import Hashable, Iterator, Mapping, Sequence

from PIL import Image

from ..metrics.logprobs import MAX_TOKEN_CHARS, MalformedAnswer, checked_logprob, listed_probabilities


class FrozenMapping(Mapping):
    """A read-only, hashable mapping of JSON-like data (nested dicts frozen too, lists as tuples): what
    :attr:`ChatRequest.structured_outputs` holds, so a request hashes and compares by its content.
    :meth:`thaw` gives back plain dicts and lists (for a request body)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, data: Mapping[str, Any]):
        self._items = {str(k): _freeze(v) for k, v in data.items()}
        self._hash = hash(json.dumps(self.thaw(), sort_keys=True, default=repr))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenMapping({self.thaw()!r})"

    def thaw(self) -> dict[str, Any]:
        """The content as plain dicts and lists."""
        return {k: _thaw(v) for k, v in self._items.items()}


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return value if isinstance(value, FrozenMapping) else FrozenMapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, FrozenMapping):
        return value.thaw()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, frozenset):
        return [_thaw(v) for v in sorted(value, key=repr)]
    return value


def visual_key(item: Any) -> tuple[str, Any]:
    """What a request's image (or a video's frames) hashes and compares by: its pixels' content key
    (:func:`~capreward.media.keys.content_key`: a hash of the mode, size and bytes), so two requests with
    equal pixels in different objects are equal; ``("id", id(item))`` for an item without a content key
    (an image over the pixel limit), equal only to itself (:attr:`ChatRequest.content_key` is then None:
    such a request is deduplicated within a call but never cached)."""
    from ..media.keys import content_key

    key = content_key(list(item) if isinstance(item, tuple) else item)
    return ("content", key) if key is not None else ("id", id(item))


@dataclass(frozen=True, eq=False)
class ChatTurn:
    """One message of a conversation.

    Args:
        role: ``"system"``, ``"user"`` or ``"assistant"``.
        text: the message's text.
        images: the images of a user turn; they go before the text, or after it with ``text_first``.
        text_first: put the text before the images (G-VEval's released request does).
        image_detail: OpenAI's ``detail`` of each image part (``"low"``, ``"high"``, ``"auto"``; None: not
            sent). Local backends ignore it and ``text_first`` (the image comes where the model's template
            puts it).
        videos: videos of a user turn as tuples of RGB frames, for a judge that takes video (a local
            Qwen2-VL, Qwen2.5-VL or LLaVA-OneVision; :class:`~capreward.judges.local_chat.LocalChatJudge`
            fills its video slot with them; a remote judge refuses the request).

    A turn hashes and compares by its content: role, text, flags, and each image and video by its
    pixels (:func:`visual_key`), never by object identity or by text joined with other fields.

    Examples:
        >>> from capreward.judges import user_turn
        >>> turn = user_turn("Describe the image.")
        >>> turn.role, turn.text, turn.images
        ('user', 'Describe the image.', ())
    """

    role: str
    text: str
    images: tuple[Image.Image, ...] = ()
    text_first: bool = False
    image_detail: str | None = None
    videos: tuple[tuple[Image.Image, ...], ...] = ()

    def _identity(self) -> tuple:
        cached = self.__dict__.get("_identity_cache")
        if cached is None:
            cached = (
                self.role, self.text, self.text_first, self.image_detail,
                tuple(visual_key(im) for im in self.images),
                tuple(visual_key(tuple(v)) for v in self.videos),
            )
            object.__setattr__(self, "_identity_cache", cached)
        return cached

    def __hash__(self) -> int:
        return hash(self._identity())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChatTurn):
            return NotImplemented
        return self is other or self._identity() == other._identity()

    @property
    def content_key(self) -> tuple | None:
        """The turn's identity with every visual keyed by content, or None when a visual has no content
        key (then it only equals itself, and no cache may keep it)."""
        identity = self._identity()
        if any(kind == "id" for kind, _ in (*identity[4], *identity[5])):
            return None
        return identity


@dataclass(frozen=True)
class ChatRequest:
    """A conversation to continue with the assistant's next message.

    Args:
        turns: the messages, oldest first (:func:`user_turn`, :func:`system_turn`, :func:`assistant_turn`).
        max_tokens: the generation budget (None: no limit; details below).
        temperature: 0 means greedy.
        top_logprobs: alternatives to report per generated token (0: none).
        stop: strings that end the answer (not included in it).
        chat_template: a Jinja chat template for the server to render the conversation with.
        structured_outputs: a constraint on the answer, in vLLM's ``structured_outputs`` field.
        prompt_logprobs: ask for the log-probability of every prompt token, with this many alternatives.

    ``max_tokens``: generation budget (None: no limit is sent to a server, which then allows what the
    model's context leaves; a local backend fills its context); ``temperature`` 0 means greedy;
    ``top_logprobs``: how many alternatives to report per generated token (0: none; OpenAI allows up to
    20, as does vLLM); ``stop``: strings that end the answer (not included in it); ``chat_template``: a
    Jinja chat template the server should render the conversation with (vLLM's ``chat_template``
    request field; None: the server's own), so that the model sees exactly the prompt a local judge
    would build. ``structured_outputs``: a constraint on the answer in vLLM's ``structured_outputs``
    request field (``{"regex": ...}``, ``{"choice": [...]}``, ``{"json": schema}``; vLLM >= 0.12, which
    removed the ``guided_*`` fields), or None; local judges ignore it. It is kept as a
    :class:`FrozenMapping` (a dict given is frozen): the request stays hashable and compares by content
    (images and videos by their pixels: :class:`ChatTurn`), so identical requests can be deduplicated and
    cached (:attr:`content_key`).

    A request whose last turn is an assistant turn asks the backend to *continue* that message (an
    assistant prefill: vLLM's ``continue_final_message=True, add_generation_prompt=False``), as the exact
    remote score distributions do (:mod:`capreward.scorers.remote_numbers`). ``prompt_logprobs``: ask the
    server for the log-probability of every prompt token (and this many alternatives each; vLLM's
    ``prompt_logprobs`` request field), returned in :attr:`ChatResponse.prompt_logprobs`; None: not asked.

    Raises:
        TypeError: ``structured_outputs`` is not a mapping.

    Examples:
        >>> from capreward.judges import ChatRequest, assistant_turn, user_turn
        >>> request = ChatRequest(turns=(user_turn("Rate the caption."), assistant_turn("The score is ")),
        ...                       max_tokens=2, top_logprobs=5, structured_outputs={"regex": "[0-9]+"})
        >>> request.prefilled, hash(request) == hash(ChatRequest(request.turns, 2, top_logprobs=5,
        ...                                                      structured_outputs={"regex": "[0-9]+"}))
        (True, True)
    """

    turns: tuple[ChatTurn, ...]
    max_tokens: int | None = 256
    temperature: float = 0.0
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()
    chat_template: str | None = None
    structured_outputs: Mapping[str, Any] | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self):
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, FrozenMapping):
            if not isinstance(self.structured_outputs, Mapping):
                raise TypeError(f"structured_outputs must be a mapping, got {type(self.structured_outputs).__name__}")
            object.__setattr__(self, "structured_outputs", FrozenMapping(self.structured_outputs))

    @property
    def content_key(self) -> tuple | None:
        """What identifies this request for a response cache: every field, each turn's
        :attr:`ChatTurn.content_key`; None when a visual has no content key (never cache it)."""
        turns = tuple(t.content_key for t in self.turns)
        if any(t is None for t in turns):
            return None
        return (turns, self.max_tokens, self.temperature, self.top_logprobs, self.stop, self.chat_template,
                self.structured_outputs, self.prompt_logprobs)

    @property
    def visual_kind(self) -> str | None:
        """``"video"`` when a turn carries a video, ``"image"`` when one carries an image, else None."""
        if any(t.videos for t in self.turns):
            return "video"
        return "image" if any(t.images for t in self.turns) else None

    @property
    def prefilled(self) -> bool:
        """Whether the last turn is an assistant message to continue."""
        return bool(self.turns) and self.turns[-1].role == "assistant"


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token.

    Args:
        token: its text.
        logprob: its log-probability.
        top: the top alternatives, text → log-probability (the generated token included when it is among
            them; when a server lists one text twice, the first, most likely entry).
        ranked: the alternatives as the backend listed them, duplicates included (G-VEval's released rule
            lets a later duplicate win).

    Examples:
        >>> import math
        >>> from capreward.judges import TokenLogprob
        >>> t = TokenLogprob("7", math.log(0.6), {"7": math.log(0.6), "8": math.log(0.3)})
        >>> round(math.exp(t.top["8"]), 2)
        0.3
    """

    token: str
    logprob: float
    top: dict[str, float] = field(default_factory=dict)
    ranked: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ChatResponse:
    """The assistant's answer to one request.

    Args:
        text: the answer ("" when ``error`` is set).
        tokens: per generated token, a :class:`TokenLogprob` with alternatives when they were asked for
            (empty if the backend could not report them).
        error: None, or why this request has no answer (after the backend's retries); a local judge gives
            a :class:`~capreward.errors.SampleError` (kind ``"limit"`` for a prompt over its context), which
            the scorers keep.
        finish_reason: ``"stop"``, ``"length"`` or None.
        prompt_logprobs: for a request that asked (:attr:`ChatRequest.prompt_logprobs`) and a server that
            answers it (vLLM), per prompt token the listed (token text, log-probability) pairs at that
            position (the prompt's own token among them; None for the first position), else None.

    Examples:
        >>> from capreward.judges import ChatResponse
        >>> ChatResponse("The score is 7.").ok, ChatResponse("", error="HTTP 500 after 3 retries").ok
        (True, False)
    """

    text: str
    tokens: tuple[TokenLogprob, ...] = ()
    error: str | None = None
    finish_reason: str | None = None
    prompt_logprobs: tuple[tuple[tuple[str, float], ...] | None, ...] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class JudgeBackend(Protocol):
    """What the judge-based scorers need from a backend: a ``name`` (the model, used in cache keys; never
    an API key) and :meth:`generate` / :meth:`agenerate`.

    Examples:
        >>> from capreward.judges import ChatResponse, JudgeBackend
        >>> class Echo:
        ...     name = "echo"
        ...     def generate(self, requests):
        ...         return [ChatResponse(r.turns[-1].text) for r in requests]
        ...     async def agenerate(self, requests):
        ...         return self.generate(requests)
        >>> isinstance(Echo(), JudgeBackend)
        True
    """

    name: str  # model identifier, used in cache keys (never an API key)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Answer every request.

        Args:
            requests: the conversations to continue.

        Returns:
            One :class:`ChatResponse` per request: ``result[i]`` belongs to ``requests[i]`` (a request
            that failed has ``error`` set; the call itself does not raise for it).
        """

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """:meth:`generate`, awaitable (remote backends run requests concurrently).

        Args:
            requests: the conversations to continue.

        Returns:
            One :class:`ChatResponse` per request, in order.
        """


def user_turn(
    text: str, images: Sequence[Image.Image] = (), *, text_first: bool = False, image_detail: str | None = None,
    videos: Sequence[Sequence[Image.Image]] = (),
) -> ChatTurn:
    """A user message with its images or videos.

    Args:
        text: the message.
        images: its images (PIL).
        text_first: put the text before the images (see :class:`ChatTurn`).
        image_detail: OpenAI's ``detail`` of each image (see :class:`ChatTurn`).
        videos: its videos, each a sequence of frames (see :class:`ChatTurn`).

    Returns:
        The :class:`ChatTurn`.
    """
    return ChatTurn(role="user", text=text, images=tuple(images), text_first=text_first, image_detail=image_detail,
                    videos=tuple(tuple(v) for v in videos))


def system_turn(text: str) -> ChatTurn:
    """A system message (G-VEval's release sends a ref-only prompt without a visual this way).

    Args:
        text: the message.

    Returns:
        The :class:`ChatTurn`.
    """
    return ChatTurn(role="system", text=text)


def assistant_turn(text: str) -> ChatTurn:
    """A finished assistant message (for multi-turn prompts such as FLEUR's explanation); as the last turn
    of a :class:`ChatRequest`, a prefill the backend continues.

    Args:
        text: the message.

    Returns:
        The :class:`ChatTurn`.
    """
    return ChatTurn(role="assistant", text=text)


class SyncBackendMixin:
    """``agenerate`` for a backend whose work is synchronous (a local model): runs ``generate`` in a
    worker thread so an event loop stays responsive."""

    if TYPE_CHECKING:  # the backend's own
        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]: ...

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        return await asyncio.to_thread(self.generate, list(requests))


# ------------------------------------------------------------------------------ reading answers safely
#: The most characters an answer may hold whatever was asked (a request with ``max_tokens`` allows
#: at most ``MAX_TOKEN_CHARS`` per token asked, below this).
MAX_ANSWER_CHARS = 1 << 20
#: The most tokens an answer may hold when no ``max_tokens`` was asked.
MAX_ANSWER_TOKENS = 1 << 16
#: The most prompt positions a response's ``prompt_logprobs`` may hold.
MAX_PROMPT_POSITIONS = 1 << 18


def answer_limit(max_tokens: int | None) -> tuple[int, int]:
    """``(most tokens, most characters)`` an answer to a request with this ``max_tokens`` may hold."""
    if max_tokens is None:
        return MAX_ANSWER_TOKENS, MAX_ANSWER_CHARS
    tokens = max(1, int(max_tokens))
    return tokens, min(MAX_ANSWER_CHARS, MAX_TOKEN_CHARS * tokens)


def answer_problem(response: ChatResponse, max_tokens: int | None = None) -> str | None:
    """Why ``response`` is malformed, or None: its text or token count larger than ``max_tokens`` allows
    (:func:`answer_limit`), or a token, alternative or prompt log-probability that
    :func:`listed_probabilities` refuses. An answer with ``error`` set is not malformed (it has nothing
    to read).

    Args:
        response: the backend's answer.
        max_tokens: the budget the request asked (None: the global bounds).

    Returns:
        None, or the reason (a sentence naming the first problem).

    Examples:
        >>> from capreward.judges.protocol import ChatResponse, TokenLogprob, answer_problem
        >>> answer_problem(ChatResponse("Yes", (TokenLogprob("Yes", 5.0, {"Yes": 5.0}),)))
        "token 0 ('Yes') is 5.0: a log-probability is a finite number at most 0"
        >>> answer_problem(ChatResponse("8" * 5000), max_tokens=2)
        'the answer holds 5000 characters; max_tokens=2 allows at most 2048'
    """
    if response.error is not None:
        return None
    text = response.text
    if not isinstance(text, str):
        return f"the answer is a {type(text).__name__}, not text"
    most_tokens, most_chars = answer_limit(max_tokens)
    budget = "no max_tokens" if max_tokens is None else f"max_tokens={max_tokens}"
    if len(text) > most_chars:
        return f"the answer holds {len(text)} characters; {budget} allows at most {most_chars}"
    if len(response.tokens) > most_tokens:
        return f"the answer holds {len(response.tokens)} tokens; {budget} allows at most {most_tokens}"
    try:
        for n, token in enumerate(response.tokens):
            name = f"token {n} ({str(token.token)[:20]!r})"
            if not isinstance(token.token, str) or len(token.token) > MAX_TOKEN_CHARS:
                return f"{name} is not a text of at most {MAX_TOKEN_CHARS} characters"
            checked_logprob(token.logprob, name)
            listed_probabilities(token.ranked or tuple(token.top.items()), f"the alternatives of {name}")
        positions = response.prompt_logprobs
        if positions is not None:
            if len(positions) > MAX_PROMPT_POSITIONS:
                return f"prompt_logprobs hold {len(positions)} positions (at most {MAX_PROMPT_POSITIONS})"
            for n, entries in enumerate(positions):
                if entries is not None:
                    listed_probabilities(entries, f"the prompt log-probabilities at position {n}")
    except MalformedAnswer as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------- exact next-token scoring
@dataclass(frozen=True)
class NextTokenQuery:
    """Ask a backend for the exact log-probability of chosen tokens as the next token of an answer.

    Args:
        request: the conversation (its last turn a user turn; its images, template and text as for
            :meth:`JudgeBackend.generate`).
        prefix: the assistant's answer written so far, continued as a prefill ("": the answer's first
            token).
        token_ids: the vocabulary ids (of the backend's :attr:`NextTokenScorer.tokenizer`) whose
            log-probability is asked.
        group: queries with equal ``group`` go to the server together, in one request (a reader puts
            one caption's queries, or one image's, in one group).

    Examples:
        >>> from capreward.judges import NextTokenQuery, ChatRequest, user_turn
        >>> q = NextTokenQuery(ChatRequest((user_turn("Rate it."),)), "The score is $8", (15, 16), group=0)
        >>> q.prefix, q.token_ids
        ('The score is $8', (15, 16))
    """

    request: ChatRequest
    prefix: str = ""
    token_ids: tuple[int, ...] = ()
    group: Hashable = None


@dataclass(frozen=True)
class NextTokenAnswer:
    """The answer to one :class:`NextTokenQuery`.

    Args:
        logprobs: per asked token id, in order, its log-probability as the next token (checked: finite,
            at most 0; -9999 where a server floors a vanishing one), or None when ``error`` is set.
        error: None, or why there is no answer (after the backend's retries).

    Examples:
        >>> import math
        >>> from capreward.judges import NextTokenAnswer
        >>> a = NextTokenAnswer((math.log(0.25), math.log(0.5)))
        >>> a.ok, [round(p, 2) for p in a.probabilities()]
        (True, [0.25, 0.5])
    """

    logprobs: tuple[float, ...] | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether there is an answer."""
        return self.error is None and self.logprobs is not None

    def probabilities(self) -> list[float]:
        """The probabilities of the asked tokens.

        Returns:
            ``exp`` of each of ``logprobs``, in order.

        Raises:
            ValueError: there is no answer (``error`` set).
        """
        if not self.ok:
            raise ValueError(f"no answer: {self.error}")
        return [math.exp(lp) for lp in cast(tuple[float, ...], self.logprobs)]  # ok: logprobs is set


@runtime_checkable
class NextTokenScorer(Protocol):
    """A backend that scores chosen next tokens exactly (:class:`~capreward.judges.sglang.SGLangJudge`,
    :class:`~capreward.judges.vllm.VLLMJudge`): ``tokenizer`` is the served model's tokenizer (the ids
    of :attr:`NextTokenQuery.token_ids`), and :meth:`next_token_logprobs` answers every query, each
    group of queries in one request.

    Examples:
        >>> from capreward.judges import NextTokenScorer, OpenAIJudge
        >>> isinstance(OpenAIJudge("http://127.0.0.1:1/v1", "m", api_key_env=None), NextTokenScorer)
        False
    """

    name: str
    tokenizer: Any

    def next_token_logprobs(self, queries: Sequence[NextTokenQuery]) -> list[NextTokenAnswer]:
        """Answer every query.

        Args:
            queries: what to score.

        Returns:
            One :class:`NextTokenAnswer` per query, in order (a failed one has ``error`` set).
        """


def scores_next_tokens(backend: Any) -> bool:
    """Whether ``backend`` scores chosen next tokens exactly (a :class:`NextTokenScorer` with a tokenizer)."""
    return callable(getattr(backend, "next_token_logprobs", None)) and getattr(backend, "tokenizer", None) is not None


def answer_next_tokens(queries: Sequence[NextTokenQuery], logprobs: Sequence[Any], where: str = "the server") -> list[NextTokenAnswer]:
    """:class:`NextTokenAnswer` s from a server's per-query ``{token id: log-probability}`` maps (None: no
    answer for that query): each asked id must be listed, each value pass :func:`checked_logprob`, and
    the asked ids' probabilities sum to at most 1. Raises :class:`MalformedAnswer` for the first query
    that does not (a backend asks the whole request again)."""
    out = []
    for n, (query, got) in enumerate(zip(queries, logprobs)):
        if not isinstance(got, Mapping):
            raise MalformedAnswer(f"{where} gave no log-probabilities for query {n}")
        values = []
        for token_id in query.token_ids:
            if token_id not in got:
                raise MalformedAnswer(f"{where} did not list the asked token {token_id} for query {n}")
            values.append(got[token_id])
        listed_probabilities([(str(t), v) for t, v in zip(query.token_ids, values)], f"the asked tokens of query {n}")
        out.append(NextTokenAnswer(tuple(checked_logprob(v) for v in values)))
    return out
