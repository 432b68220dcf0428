"""capreward's error model: one root exception, one per-sample error, one per-sample policy.

Every exception class capreward defines derives from :class:`CaprewardError`, and from the builtin
class it derived from before the root existed (a :class:`~capreward.media.MediaError` is still a
``ValueError``, a :class:`~capreward.hub.ModelNotAvailable` still an ``OSError``), so
``except capreward.CaprewardError`` catches whatever capreward raises on purpose while
``except ValueError`` in existing code keeps working.

Examples:
    >>> from capreward.errors import CaprewardError
    >>> from capreward.media import MediaError
    >>> issubclass(MediaError, CaprewardError) and issubclass(MediaError, ValueError)
    True

A sample that cannot be scored (an empty caption, an unreadable image, a judge answer without a score)
does not raise: it becomes a :class:`SampleError`, a typed object (``index``, ``kind``, ``item``,
``message``) that travels from where the failure is found (the scorer, the reward's input checks) to
every consumer: the reward (None and the reason logged), the torchmetrics metrics, the jobs' ``errors``
column, the reward server's per-sample ``errors`` and the veRL/OpenRLHF adapters. A consumer that
decides something reads ``kind``, never the text. The text every consumer writes (logs, results files,
answers) is made from the object by one function, :func:`written`, and equals today's reasons, so
results files written before keep resuming. A :class:`SampleError` *is* that text (a ``str``
subclass), so code that logs, compares or JSON-encodes reasons sees the same strings as before.

What happens to a failed sample is decided once, here (:func:`sample_failure`, :func:`failures`,
:func:`summarize`): a sample fails when it has no finite value; its error is the one its producer gave,
or says that there is no score. Each consumer then applies its own outcome: a reward returns None and
logs the reason, a metric leaves the sample out of its mean and counts it, a job writes the text in the
row's ``errors`` column, the server answers the fallback value with the text. (A job also writes a
scorer's flag on a scored row, as VisCE²'s "no integer in the answer" beside its score of 0.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args, overload
from collections.abc import Sequence


class CaprewardError(Exception):
    """The root of every exception capreward raises on purpose (each message names what to fix).

    Subclasses keep their builtin base too (``class MediaError(CaprewardError, ValueError)``), so code
    that catches the builtin class keeps working.

    Examples:
        >>> import capreward
        >>> from capreward.media import load_image
        >>> try:
        ...     load_image("no-such-file.png")
        ... except capreward.CaprewardError as exc:
        ...     print(type(exc).__name__, isinstance(exc, ValueError))
        MediaError True
    """

    #: The :class:`SampleError` kind of a sample whose scoring raised this error, set by an error about one
    #: item of one sample, which then names its ``item`` and its ``problem`` (a
    #: :class:`~capreward.media.MediaError` is ``"media"``); None for the others, whose kind follows their
    #: builtin class (:func:`exception_kind`).
    sample_kind: str | None = None


#: Why a sample has no score, as the code finds it:
#:
#: - ``"input"``: the sample's text cannot be scored (an empty caption, a bad references entry, a
#:   completion or label of the wrong shape);
#: - ``"no_visual"``: the sample names no image or video, and the metric needs one;
#: - ``"media"``: its image or video cannot be used (missing, undecodable, over a media limit);
#: - ``"refused"``: its file is not one the server may read (outside the media root: one text whatever
#:   the reason, see :data:`capreward.media.files.REFUSED`);
#: - ``"limit"``: the prompt does not fit the judge's context;
#: - ``"judge_unavailable"``: the judge request failed (a remote judge down, a timeout);
#: - ``"judge_unreadable"``: the judge answered, but no score can be read from the answer;
#: - ``"non_finite"``: the scorer gave NaN or an infinity;
#: - ``"scorer"``: the scorer raised, or a reward gave no value and no reason.
SampleErrorKind = Literal[
    "input", "no_visual", "media", "refused", "limit", "judge_unavailable", "judge_unreadable", "non_finite", "scorer"
]
KINDS: tuple[str, ...] = get_args(SampleErrorKind)

#: The text of a failed sample whose producer gave no reason.
NO_SCORE = "no score"


def written(item: str, message: str, sep: str = ": ") -> str:
    """The one text of a per-sample error, as logs, results files and server answers write it: ``item``
    (what failed: ``"completions[3]"``, ``"row 'a1'"``; may be empty), ``sep``, then ``message``.

    Examples:
        >>> written("completions[3]", "empty caption")
        'completions[3]: empty caption'
        >>> written("", "empty caption")
        'empty caption'
    """
    return f"{item}{sep}{message}" if item else message


@dataclass(frozen=True, eq=False, repr=False)
class SampleError(str):
    """Why one sample has no score: a typed object that is also its written text.

    Args:
        index: the sample's position in the batch where the failure was found (None: not known there).
        kind: one of :data:`KINDS` (what a consumer decides on).
        item: what failed, as the text names it (``"completions[3]"``, ``"row 'a1'"``, ``"image 0 ('a.png')"``;
            ``""`` when the message names it itself).
        message: why, in words (``"empty caption"``, ``"cannot decode image: ..."``).
        sep: how the written text joins ``item`` and ``message`` (``": "``; ``" "`` for
            ``"completions[3] is empty"``).

    The object is a ``str`` equal to :func:`written` of its fields, so it is written, logged and
    JSON-encoded as today's text; equality and hashing are the text's (so is ``str.index``, shadowed
    by the field). Pickles with its fields; ``str`` operations on it (``+``, slicing) give plain text.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.

    Examples:
        >>> e = SampleError(3, "input", "completions[3]", "empty caption")
        >>> e, e.kind, e == "completions[3]: empty caption"
        ('completions[3]: empty caption', 'input', True)
        >>> e.renamed(0, "query[0]")
        'query[0]: empty caption'
    """

    # field(): not str.index, which would read as the field's default; the field shadows str.index on purpose
    index: int | None = field()  # type: ignore[assignment]
    kind: str = field()
    item: str = field()
    message: str = field()
    sep: str = ": "

    def __new__(cls, index: int | None, kind: str, item: str, message: str, sep: str = ": "):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return super().__new__(cls, written(item, str(message), sep))

    def __getnewargs__(self) -> tuple:
        return (self.index, self.kind, self.item, self.message, self.sep)

    __repr__ = str.__repr__  # a list of reasons prints as before (the fields: :meth:`fields`)

    def fields(self) -> dict[str, Any]:
        """The fields as a dict.

        Returns:
            ``{"index", "kind", "item", "message", "sep"}`` of this error.
        """
        return {"index": self.index, "kind": self.kind, "item": self.item, "message": self.message, "sep": self.sep}

    @property
    def text(self) -> str:
        """The written text as a plain ``str``."""
        return str.__str__(self)

    def renamed(self, index: int | None, item: str | None = None) -> SampleError:
        """The same failure for the same sample named elsewhere (a reward's ``completions[3]`` is the
        server's ``query[0]``).

        Args:
            index: the sample's position where it is now named.
            item: its new item (None: keep the item).

        Returns:
            The renamed :class:`SampleError`, same kind and message.
        """
        return replace(self, index=index, item=self.item if item is None else item)

    def within(self, index: int | None, item: str, sep: str = ": ") -> SampleError:
        """This error (of a part of a sample: one image of several, one scorer item) as the error of the
        whole sample.

        Args:
            index: the sample's position.
            item: what names the sample (``"completions[3]"``).
            sep: how the text joins ``item`` and this error's text.

        Returns:
            A :class:`SampleError` of the same kind whose message is this error's text.
        """
        return SampleError(index, self.kind, item, self.text, sep)

    @overload
    @classmethod
    def of(cls, reason: str, index: int | None = None, item: str = "", kind: str = "scorer",
           sep: str = ": ") -> SampleError: ...

    @overload
    @classmethod
    def of(cls, reason: Any, index: int | None = None, item: str = "", kind: str = "scorer",
           sep: str = ": ") -> SampleError | None: ...

    @classmethod
    def of(cls, reason: Any, index: int | None = None, item: str = "", kind: str = "scorer",
           sep: str = ": ") -> SampleError | None:
        """``reason`` as the error of the sample ``item`` at ``index``.

        Args:
            reason: None, a :class:`SampleError` (it keeps its kind and becomes the message, see
                :meth:`within`; with ``item=""`` it is only moved to ``index``), or a plain text.
            index: the sample's position.
            item: what names the sample (may be empty).
            kind: the kind of a plain-text ``reason``, which the caller states from what produced it
                (the text is never read to guess one).
            sep: how the text joins ``item`` and the reason.

        Returns:
            None for a None ``reason``, else the :class:`SampleError`.
        """
        if reason is None:
            return None
        if isinstance(reason, SampleError):
            return reason.renamed(index) if not item else reason.within(index, item, sep)
        return cls(index, kind, item, str(reason), sep)

    @classmethod
    def naming(cls, index: int | None, kind: str, item: str, text: str) -> SampleError:
        """The error whose whole ``text`` was written naming ``item`` first (``"completions[3] must be a
        str..."``, ``"references[2][0] is empty"``): the same text, with ``item`` as its item (so a
        consumer can rename it); a text that does not start with ``item`` keeps no item.

        Args:
            index: the sample's position.
            kind: one of :data:`KINDS`.
            item: the item the text starts with.
            text: the whole text.

        Returns:
            The :class:`SampleError` whose text is ``text``.

        Examples:
            >>> e = SampleError.naming(2, "input", "references[2]", "references[2][0] is empty")
            >>> e.item, e.renamed(0, "labels[0] references")
            ('references[2]', 'labels[0] references[0] is empty')
        """
        if item and text.startswith(item):
            return cls(index, kind, item, text[len(item):], sep="")
        return cls(index, kind, "", text)

    @classmethod
    def from_exception(cls, exc: BaseException, index: int | None = None, item: str = "",
                       kind: str | None = None) -> SampleError:
        """The error of a sample whose scoring raised ``exc``.

        Args:
            exc: the exception.
            index: the sample's position.
            item: what names the sample (a media error names its own item when this is empty).
            kind: the kind of an exception that is not a media error (default ``"input"`` for a
                ValueError/TypeError, ``"scorer"`` otherwise).

        Returns:
            For a media error, kind ``"media"`` (``"refused"`` for a file outside the media root) with its
            item and problem; for anything else kind ``kind`` and the text ``"<type>: <message>"``.
        """
        sample_kind = getattr(exc, "sample_kind", None)
        if isinstance(exc, CaprewardError) and sample_kind is not None:
            return cls(index, sample_kind, item or getattr(exc, "item", ""), getattr(exc, "problem", str(exc)))
        return cls(index, exception_kind(exc, kind), item, f"{type(exc).__name__}: {exc}")


def exception_kind(exc: BaseException, default: str | None = None) -> str:
    """The kind of a sample's failure that raised ``exc``: the :attr:`CaprewardError.sample_kind` the error
    declares (``"refused"`` for a :class:`~capreward.media.MediaRefused`, ``"media"`` for another
    :class:`~capreward.media.MediaError`); else ``default`` when given, ``"input"`` for a ValueError or
    TypeError and ``"scorer"`` for anything else.

    Examples:
        >>> from capreward.media import MediaError, MediaRefused
        >>> exception_kind(MediaRefused("image 0", "x")), exception_kind(MediaError("image 0", "x"))
        ('refused', 'media')
        >>> exception_kind(ValueError("x")), exception_kind(RuntimeError("x")), exception_kind(KeyError(), "input")
        ('input', 'scorer', 'input')
    """
    if isinstance(exc, CaprewardError) and exc.sample_kind is not None:
        return exc.sample_kind
    if default is not None:
        return default
    return "input" if isinstance(exc, (ValueError, TypeError)) else "scorer"


# ------------------------------------------------------------------------------ the per-sample policy
@overload
def sample_failure(index: int, value: None, reason: Any, item: str = "", kind: str = "scorer",
                   non_finite: str = "non-finite value ({value})") -> SampleError: ...


@overload
def sample_failure(index: int, value: Any, reason: Any, item: str = "", kind: str = "scorer",
                   non_finite: str = "non-finite value ({value})") -> SampleError | None: ...


def sample_failure(index: int, value: Any, reason: Any, item: str = "", kind: str = "scorer",
                   non_finite: str = "non-finite value ({value})") -> SampleError | None:
    """The one rule of a failed sample, shared by rewards, metrics, jobs and the server: the sample at
    ``index`` failed when ``value`` is None or not a finite number; its error is ``reason`` (see
    :meth:`SampleError.of`; ``kind`` for a plain-text reason), or, for a non-finite value, kind
    ``"non_finite"`` with the consumer's text ``non_finite`` (``{value}`` filled in) followed by the
    reason, or ``"no score"`` when there is no reason. None for a scored sample.

    Examples:
        >>> sample_failure(0, 0.5, None) is None
        True
        >>> sample_failure(1, float("nan"), None).kind
        'non_finite'
        >>> sample_failure(2, None, None, item="completions[2]")
        'completions[2]: no score'
    """
    if value is not None:
        try:
            finite = math.isfinite(float(value))
        except (TypeError, ValueError):
            finite = False
        if finite:
            return None
        text = non_finite.format(value=value)
        if reason is not None:
            text = f"{text}: {reason}"
        return SampleError(index, "non_finite", item, text)
    if reason is None:
        return SampleError(index, "scorer", item, NO_SCORE)
    return SampleError.of(reason, index, item, kind)


def kind_of(reason: Any, default: str) -> str:
    """The kind of ``reason``: its own for a :class:`SampleError`, else ``default`` (the kind its
    producer states for a plain text, e.g. ``"judge_unavailable"`` for a failed judge request's error).

    Examples:
        >>> kind_of(SampleError(0, "limit", "", "prompt too long"), "judge_unavailable")
        'limit'
        >>> kind_of("connection refused", "judge_unavailable")
        'judge_unavailable'
    """
    return reason.kind if isinstance(reason, SampleError) else default


def common_kind(reasons: Sequence[Any], default: str = "scorer") -> str:
    """The kind of an error made of several (a composite reward's parts): the kind they all share,
    else ``default`` (plain-text reasons have none)."""
    kinds = {getattr(r, "kind", None) for r in reasons}
    return cast(str, kinds.pop()) if len(kinds) == 1 and None not in kinds else default


def failures(values: Sequence[Any], reasons: Sequence[Any], kind: str = "scorer") -> list[SampleError]:
    """The failed samples of a batch (:func:`sample_failure` of each), in order."""
    out = []
    for i, (v, r) in enumerate(zip(values, reasons)):
        e = sample_failure(i, v, r, kind=kind)
        if e is not None:
            out.append(e)
    return out


def summarize(errors: Sequence[SampleError], limit: int = 8, more: bool = True) -> str:
    """The failed samples of one batch in one log line: ``"[i] <text>; [j] <text>"`` for the first
    ``limit``, then (``more``) ``"; ... N more"``.

    Examples:
        >>> summarize([SampleError(0, "input", "", "empty caption"), SampleError(4, "media", "image 'a.png'",
        ...           "cannot decode image")], limit=1)
        '[0] empty caption; ... 1 more'
    """
    shown = "; ".join(f"[{e.index}] {e.text}" for e in errors[:limit])
    return shown + (f"; ... {len(errors) - limit} more" if more and len(errors) > limit else "")


__all__ = ["CaprewardError", "KINDS", "NO_SCORE", "SampleError", "SampleErrorKind", "common_kind", "exception_kind", "failures", "kind_of", "sample_failure",
           "summarize", "written"]
