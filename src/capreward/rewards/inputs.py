"""Turning what TRL passes to a reward function into captions, visuals and references.

TRL (1.x, ``GRPOTrainer._calculate_rewards``) calls ``reward(prompts=..., completions=...,
completion_ids=..., **columns, trainer_state=..., log_extra=..., log_metric=...)`` where every extra
dataset column arrives as a list with one entry per completion. Completions are plain strings
(standard format) or message lists ``[{"role": "assistant", "content": str | [parts]}]``
(conversational format); visuals come from an ``image``/``images``/``video`` column or from
``{"type": "image", "image": ...}`` parts of a conversational prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Sequence

from ..caption_budget import caption_problem
from ..errors import SampleError
from ..scorers.bad_items import references_problem

#: Keyword arguments TRL adds that are not dataset columns.
TRL_CONTROL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


def content_text(content: Any, where: str) -> str:
    """The text of a message ``content``: a str, or the ``text`` parts of a list of typed parts joined
    (non-text parts such as images are skipped). Raises TypeError naming ``where`` otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                if part.get("type", "text") == "text":
                    texts.append(str(part.get("text") or ""))
            else:
                raise TypeError(f"{where}: content part {j} must be a dict or str, got {type(part).__name__}")
        return "".join(texts)
    raise TypeError(f"{where}: message content must be str or a list of parts, got {type(content).__name__}")


def completion_text(completion: Any, index: int = 0) -> str:
    """The caption text of one TRL completion.

    A str is returned as is; a conversational completion (a list of message dicts) gives the text of
    its assistant messages joined (all messages' text when none has role "assistant"). Raises
    TypeError naming ``completions[index]`` for any other shape.
    """
    where = f"completions[{index}]"
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        messages = []
        for j, m in enumerate(completion):
            if not isinstance(m, dict):
                raise TypeError(f"{where}[{j}] must be a message dict, got {type(m).__name__}")
            messages.append(m)
        assistant = [m for m in messages if m.get("role") == "assistant"] or messages
        return "".join(content_text(m.get("content"), where) for m in assistant)
    raise TypeError(f"{where} must be a str or a list of messages, got {type(completion).__name__}")


def prompt_images(prompt: Any) -> list[Any]:
    """Images embedded in a conversational prompt (``{"type": "image", "image": X}`` parts, in order);
    empty for string prompts and placeholder parts without a payload."""
    if not isinstance(prompt, (list, tuple)):
        return []
    found = []
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, (list, tuple)):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None:
                    found.append(part["image"])
    return found


@dataclass(frozen=True)
class Columns:
    """Names of the dataset columns a reward reads (TRL passes each as a keyword argument)."""

    image: str = "image"
    images: str = "images"
    video: str = "video"
    references: str = "references"
    visual_id: str | None = None  # optional column of ids narrowing the visuals' cache keys (never alone)


@dataclass
class Sample:
    """One completion's inputs: ``visual`` is None when the sample has none; ``kind`` is "image",
    "video" or None; ``error`` says why the sample cannot be scored (then it gets a None reward)."""

    caption: str
    visual: Any = None
    kind: str | None = None
    references: list[str] | None = None
    visual_id: str | None = None
    error: SampleError | None = None  # (a SampleError, or a plain text from older callers)
    #: the sample's other images (an ``images`` entry holding several): scored too, then aggregated
    more_visuals: tuple = ()
    #: the metric's other inputs for this sample (its spec's ``row_inputs``: QA utility's questions)
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardInputs:
    """The per-completion samples of one reward call."""

    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)


def _column(kwargs: dict, name: str | None, n: int) -> list[Any] | None:
    """Column ``name`` of the kwargs as a list of n entries, or None when absent."""
    if name is None or name not in kwargs or kwargs[name] is None:
        return None
    values = kwargs[name]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"column {name!r} must be a list with one entry per completion, got {type(values).__name__}")
    values = list(values)
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} entries for {n} completions; give one per completion")
    return values


def _references(value: Any, index: int, column: str) -> tuple[list[str] | None, SampleError | None]:
    """A sample's references as a list of non-empty strings (a str becomes [str]), None when it has
    none (``None``), or an error: an empty list, a blank or non-str entry, or another type is refused
    as the scorers and ``capreward score`` refuse it
    (:func:`~capreward.scorers.bad_items.references_problem`), never read as "no references", which
    would score the sample with another metric."""
    if value is None:
        return None, None
    where = f"{column}[{index}]"
    if not isinstance(value, (str, list, tuple)):
        return None, SampleError(index, "input", where, f"must be a str or list of str, got {type(value).__name__}", " ")
    problem = references_problem(value, where)
    if problem is not None:
        return None, SampleError.naming(index, "input", where, problem)
    return ([value] if isinstance(value, str) else list(value)), None


def _first_image(value: Any) -> Any:
    """The first image of an ``images`` entry (a list), or the entry itself when it is a single image."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def _other_images(value: Any) -> tuple:
    """The images of an ``images`` entry after its first (none for a single image)."""
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value[1:] if v is not None)
    return ()


def collect_inputs(
    prompts: Sequence[Any] | None, completions: Sequence[Any], kwargs: dict, columns: Columns
) -> RewardInputs:
    """Match every completion with its caption text, visual and references.

    Visual precedence per sample: the ``video`` column, then ``image``, then ``images`` (its first entry
    is the sample's visual, the others go in ``more_visuals``: a caption reward scores the caption
    against each and aggregates, see :class:`~capreward.rewards.base.CaptionReward`), then the first
    image embedded in the conversational prompt. Empty captions, captions over the caption budget
    (:mod:`capreward.caption_budget`), unreadable completions and malformed references mark
    the sample with an ``error`` instead of raising, so one bad sample does not stop a training step.
    Column length mismatches raise ValueError (a caller bug, not a data problem).
    """
    if isinstance(completions, str):
        raise TypeError("completions must be a list with one entry per completion, got a single str")
    completions = list(completions)
    n = len(completions)
    if prompts is not None and len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompts for {n} completions")
    videos = _column(kwargs, columns.video, n)
    image = _column(kwargs, columns.image, n)
    images = _column(kwargs, columns.images, n)
    refs = _column(kwargs, columns.references, n)
    ids = _column(kwargs, columns.visual_id, n)

    out = RewardInputs()
    for i, completion in enumerate(completions):
        error = None
        try:
            caption = completion_text(completion, i)
        except TypeError as exc:
            caption, error = "", SampleError.naming(i, "input", f"completions[{i}]", str(exc))
        if error is None and (over := caption_problem(caption)) is not None:  # never read: None + reason
            error = SampleError(i, "input", f"completions[{i}]", over, " ")
        if error is None and not caption.strip():
            error = SampleError(i, "input", f"completions[{i}]", "is empty", " ")
        visual, kind, more = None, None, ()
        if videos is not None and videos[i] is not None:
            visual, kind = videos[i], "video"
        elif image is not None and image[i] is not None:
            visual, kind = image[i], "image"
        elif images is not None and _first_image(images[i]) is not None:
            visual, kind = _first_image(images[i]), "image"
            more = _other_images(images[i])
        elif prompts is not None:
            embedded = prompt_images(prompts[i])
            if embedded:
                visual, kind = embedded[0], "image"
        references, ref_error = _references(None if refs is None else refs[i], i, columns.references)
        visual_id = None if ids is None or ids[i] is None else str(ids[i])
        out.samples.append(Sample(caption, visual, kind, references, visual_id, error or ref_error, more))
    return out
