"""The chat-level interface every judge backend offers (local transformers or a remote server).

VisCE², G-VEval and FLEUR-on-a-server speak to a judge through :class:`ChatRequest` →
:class:`ChatResponse`: one conversation (user/assistant turns, images attached to the first user
turn), greedy or sampled decoding, and for every generated token the top alternatives with their
log-probabilities (what OpenAI-compatible servers return as ``logprobs.content[i].top_logprobs``).

A backend never drops or reorders requests: ``generate(requests)[i]`` answers ``requests[i]``, and a
request that failed after the backend's retries gets a response with ``error`` set and no text.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from PIL import Image


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

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        return await asyncio.to_thread(self.generate, list(requests))
