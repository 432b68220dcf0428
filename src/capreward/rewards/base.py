"""The reward-function base: TRL's call contract, lazy scorers, per-sample failures, logging.

A :class:`CaptionReward` is a plain picklable callable (not an ``nn.Module``, which TRL would treat as
a sequence-classification reward model). TRL names it by its ``__name__`` attribute, so its metrics
appear as ``rewards/<__name__>/mean``. Subclasses implement :meth:`CaptionReward._build` (construct the
scorer) and :meth:`CaptionReward.score_group` (score a batch of valid samples that share a visual
kind); this module does the rest: reading TRL's arguments, grouping, isolating samples whose visual
cannot be loaded, and reporting unscored samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, cast
from collections.abc import Callable, Sequence

from ..caption_reading import read_caption
from ..errors import NO_SCORE, SampleError, exception_kind, sample_failure, summarize
from ..judges.caller_text import is_blank
from ..judges.injection import injection_reason
from ..media import MediaError, describe, media_key
from ..random_state import keeps_random_state
from .inputs import Columns, RewardInputs, Sample, collect_inputs

logger = logging.getLogger(__name__)

#: How a sample with several images is scored (see CaptionReward's ``image_aggregation``).
IMAGE_AGGREGATIONS = ("mean", "min", "max")


@dataclass
class GroupScores:
    """What :meth:`CaptionReward.score_group` returns for k samples: ``scores`` (k floats; NaN or None
    where a sample has no score), ``reasons`` (k entries, None or why a sample has no score: a
    :class:`~capreward.errors.SampleError`, or a plain text taken as of kind :attr:`CaptionReward.reason_kind`) and
    ``metrics`` (sub-score name -> k floats, NaN where undefined), logged as batch means."""

    scores: list[float | None]
    reasons: list[str | None] | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class RewardOutput:
    """One reward call's results, one entry per completion: ``values`` (None = unscored), ``reasons``
    (None or why the value is None: a :class:`~capreward.errors.SampleError`, which is also the text
    logged) and per-sample sub-score ``metrics``.

    Args:
        values: per sample, the reward or None.
        reasons: per sample, None or why the value is None.
        metrics: sub-score name -> per-sample floats (NaN where undefined).
        clipped: samples whose value was clipped into the reward's range.
        injection: per sample, None or why the injection guard flagged it (empty when no guard ran).
        reading: per sample, None or what reading the caption as a person does changed in it.

    Examples:
        >>> from capreward.rewards import RewardOutput
        >>> out = RewardOutput(values=[0.5, None], reasons=[None, "completions[1] is empty"])
        >>> out.unscored, out.flagged
        ([1], [])
    """

    values: list[float | None]
    reasons: list[str | None]
    metrics: dict[str, list[float]] = field(default_factory=dict)
    clipped: list[int] = field(default_factory=list)  # samples whose value was clipped into the range
    #: per sample, None or why the injection guard flagged it (empty when no guard ran)
    injection: list[str | None] = field(default_factory=list)
    #: per sample, None or what reading the caption as a person does changed in it (empty when the
    #: reward scores the text as given)
    reading: list[str | None] = field(default_factory=list)

    @property
    def flagged(self) -> list[int]:
        """Samples the injection guard flagged (paid no more than without their suspect segments)."""
        return [i for i, r in enumerate(self.injection) if r is not None]

    @property
    def unscored(self) -> list[int]:
        return [i for i, v in enumerate(self.values) if v is None]


NO_VISUAL = "no image or video for this sample"
#: Columns that look like a visual but that the rewards do not read by default -> the option that reads them.
LOOKALIKE_COLUMNS = {"videos": "video_column", "video_path": "video_column", "image_path": "image_column",
                     "img": "image_column", "picture": "image_column"}


def clip_to_range(out: RewardOutput, value_range: tuple[float, float] | None) -> RewardOutput:
    """Clip every value of ``out`` into ``value_range`` (in place; None = no range) and record the
    clipped samples in ``out.clipped`` and the per-sample ``clipped`` metric (1.0/0.0, NaN if
    unscored). A NaN or ±inf value becomes None (never clipped to an end of the range, never passed
    to a trainer), the reason saying so. Returns ``out``."""
    for i, v in enumerate(out.values):
        if v is not None and not math.isfinite(v):
            out.values[i] = None
            out.reasons[i] = sample_failure(i, v, out.reasons[i])
    if value_range is None:
        return out
    lo, hi = value_range
    indicator = [math.nan] * len(out.values)
    for i, v in enumerate(out.values):
        if v is None:
            continue
        inside = lo <= v <= hi
        indicator[i] = 0.0 if inside else 1.0
        if not inside:
            out.values[i] = min(max(v, lo), hi)
            out.clipped.append(i)
    out.metrics["clipped"] = indicator
    return out


#: Per-sample 1.0/0.0 indicators logged as a count per batch rather than a mean.
COUNTED_METRICS = ("clipped", "injection", "truncated")


def _hinted(reason: str | None, hint: str) -> str | None:
    """A no-visual error with ``hint`` (which column to pass) added to its message; any other reason as it is."""
    if isinstance(reason, SampleError) and reason.kind == "no_visual":
        return dataclasses.replace(reason, message=reason.message + hint)
    return reason


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


class RewardFunction:
    """Common behaviour of every capreward reward: the TRL name, reporting and the async variant.

    ``name`` overrides the class-level ``__name__`` for this instance (TRL's metric prefix).
    ``log_subscores``: also log the batch mean of every sub-score via TRL's ``log_metric``.

    Args:
        name: the reward's name for this instance (None: the class's ``__name__``).
        log_subscores: also log the batch mean of every sub-score.

    Examples:
        A reward implements :meth:`compute`; calling it is TRL's contract:

        >>> from capreward.rewards import RewardFunction, RewardOutput
        >>> class Length(RewardFunction):
        ...     __name__ = "length"
        ...     def compute(self, prompts, completions, **kwargs):
        ...         return RewardOutput(values=[float(len(c.split())) for c in completions],
        ...                             reasons=[None] * len(completions))
        >>> Length()(None, ["a red image.", "red"])
        [3.0, 1.0]
        >>> Length(name="words").name
        'words'
    """

    __name__ = "reward"

    def __init__(self, name: str | None = None, log_subscores: bool = True):
        if name is not None:
            self.__name__ = name
        self.log_subscores = log_subscores

    @property
    def name(self) -> str:
        return self.__name__

    def value_range(self) -> tuple[float, float] | None:
        """The closed interval every value of this reward lies in (values the scorer puts outside it
        are clipped and counted), or None when the reward promises none.

        Returns:
            ``(low, high)`` or None.
        """
        return None

    def metric_names(self) -> tuple[str, ...]:
        """Every per-sample sub-score this reward can report (the keys of :attr:`RewardOutput.metrics`),
        fixed by its configuration, whatever the batch: :meth:`compute` returns each of them for every
        call, NaN where a sample has none (unscored, no references...), so a framework that stacks the
        sub-scores of separately scored samples sees one key set. ``clipped`` when the reward has a
        :meth:`value_range`.

        Returns:
            The sub-score names.
        """
        return ("clipped",) if self.value_range() is not None else ()

    def with_metric_names(self, out: RewardOutput) -> RewardOutput:
        """``out`` with a column for each of :meth:`metric_names` (NaN where missing), in that order
        (in place; a sub-score a subclass reports without declaring it is kept after them, and the
        reward server leaves it out of its fixed key set). Returns ``out``."""
        n = len(out.values)
        names = self.metric_names()
        declared = {key: list(out.metrics.get(key, [math.nan] * n)) for key in names}
        out.metrics = {**declared, **{k: v for k, v in out.metrics.items() if k not in declared}}
        return out

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        """Score the completions without logging anything (see :meth:`__call__`).

        Args:
            prompts: the prompts (unused by most rewards; may be None).
            completions: the captions (strings, or chat messages).
            **kwargs: the dataset columns, lists with one entry per completion.

        Returns:
            The values, reasons and sub-scores.
        """
        raise NotImplementedError

    def __call__(
        self, prompts: Sequence[Any] | None, completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        """TRL's reward-function contract: one float (or None for an unscorable sample) per completion.

        ``kwargs`` are the dataset columns (lists, one entry per completion) plus TRL's
        ``trainer_state``/``log_extra``/``log_metric``/``environments``. Reasons for None values go to
        the ``logging`` module always and to ``log_extra``/``log_metric`` when TRL provides them.
        """
        log_extra = kwargs.pop("log_extra", None)
        log_metric = kwargs.pop("log_metric", None)
        out = self.compute(prompts, completions, **kwargs)
        if len(out.values) != len(completions):  # a subclass bug; TRL would raise a less clear error
            raise RuntimeError(f"{self.name} returned {len(out.values)} values for {len(completions)} completions")
        self.report(out, log_extra, log_metric)
        return out.values

    def report(self, out: RewardOutput, log_extra: Callable | None = None, log_metric: Callable | None = None) -> None:
        """Log unscored samples (logging module, ``log_extra`` column ``<name>/error``) and the batch's
        unscored fraction, number of values clipped into :meth:`value_range` (``clipped``) and sub-score
        means (``log_metric`` as ``rewards/<name>/<metric>``)."""
        bad = out.unscored
        if out.values and len(bad) == len(out.values):
            self.warn_all_none(out)
        if bad:
            shown = summarize([sample_failure(i, None, out.reasons[i]) for i in bad])
            logger.warning("%s: %d/%d samples unscored (None): %s", self.name, len(bad), len(out.values), shown)
            if log_extra is not None:
                log_extra(f"{self.name}/error", [r if v is None else None for r, v in zip(out.reasons, out.values)])
        if out.flagged and log_extra is not None:  # the log line itself is written when they are floored
            log_extra(f"{self.name}/injection", list(out.injection))
        if any(r is not None for r in out.reading) and log_extra is not None:
            log_extra(f"{self.name}/reading", list(out.reading))
        if out.clipped:
            lo, hi = self.value_range() or (math.nan, math.nan)
            logger.info(
                "%s: %d/%d values outside [%g, %g] clipped to it", self.name, len(out.clipped), len(out.values), lo, hi
            )
        if log_metric is not None and out.values:
            log_metric(f"rewards/{self.name}/unscored_frac", len(bad) / len(out.values))
            for key, values in out.metrics.items():
                counted = key in COUNTED_METRICS or (
                    self.log_subscores and not key.startswith("guard/") and key.endswith(tuple("/" + k for k in COUNTED_METRICS))
                )
                if counted:
                    log_metric(f"rewards/{self.name}/{key}", float(sum(v == 1.0 for v in values)))  # a count
                elif self.log_subscores:
                    mean = _nanmean(values)
                    if not math.isnan(mean):
                        log_metric(f"rewards/{self.name}/{key}", mean)

    def all_none_hint(self) -> str:
        """What fixes a batch whose every sample is None (named in :meth:`warn_all_none`)."""
        return "see the reasons (the visual and reference columns, the judge's answers)"

    def warn_all_none(self, out: RewardOutput) -> None:
        """Log an error and raise a :class:`RuntimeWarning` when every sample of a batch is unscored: a
        GRPO step on it trains on nothing (TRL turns None into NaN and its weighted sum into 0)."""
        reasons = sorted({r or NO_SCORE for r in out.reasons})
        shown = "; ".join(reasons[:3]) + (f"; ... {len(reasons) - 3} more" if len(reasons) > 3 else "")
        message = (
            f"reward {self.name!r}: every one of the {len(out.values)} samples of this batch is unscored (None), "
            f"so a training step on it learns nothing from this reward. Fix: {self.all_none_hint()}. Reasons: {shown}"
        )
        logger.error("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def load_models(self) -> RewardFunction:
        """Load every model this reward uses now rather than on its first call (a server calls this before
        it reports ready, so a missing model fails at start-up). Returns self.

        Returns:
            This reward.
        """
        return self

    def as_async(self) -> AsyncReward:
        """This reward as an ``async`` callable (TRL gathers async reward functions concurrently).

        Returns:
            The :class:`AsyncReward` wrapping this reward.
        """
        return AsyncReward(self)


async def _trl_reward_signature(
    prompts: Sequence[Any] | None, completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any
) -> list[float | None]:
    """The signature of an async TRL reward function: :class:`AsyncReward` carries its code object."""
    raise NotImplementedError  # never called: AsyncReward.__call__ runs the reward


class AsyncReward:
    """A reward as a coroutine function: ``await reward(prompts, completions, ...)`` runs the wrapped
    reward in a worker thread and returns its values.

    ``inspect.iscoroutinefunction(async_reward)`` is True on every Python capreward supports: besides
    its ``async def __call__``, the object has the attributes of a function (``__name__``, and the
    ``__code__``, ``__defaults__``, ``__kwdefaults__`` and ``__annotations__`` of an ``async def`` with
    TRL's reward signature), which is how :mod:`inspect` recognises compiled functions (Cython). So
    every TRL treats it as async: trl < 1.14 tests ``inspect.iscoroutinefunction(func)``, later
    releases ``is_async_callable`` (which also looks at ``__call__``). GRPOTrainer and RLOOTrainer
    await it together with the other async rewards, so a slow judge does not serialise with them;
    TRL's experimental OnlineDPOTrainer calls rewards synchronously and takes the reward itself, not
    this form. It names itself like the wrapped reward (``__name__``, TRL's metric prefix) and pickles
    (TRL's experimental AsyncGRPOTrainer sends rewards to a spawned process). The wrapped reward's lock
    keeps one scorer from running two batches at once.
    """

    __code__ = _trl_reward_signature.__code__
    __defaults__ = _trl_reward_signature.__defaults__
    __kwdefaults__ = _trl_reward_signature.__kwdefaults__
    __annotations__ = dict(_trl_reward_signature.__annotations__)

    def __init__(self, reward: RewardFunction):
        self.reward = reward
        self.__name__ = reward.__name__
        self.__qualname__ = reward.__name__

    async def __call__(
        self, prompts: Sequence[Any] | None, completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        return await asyncio.to_thread(self.reward, prompts, completions, completion_ids, **kwargs)

    def __repr__(self) -> str:
        return f"AsyncReward({self.reward.__name__})"


def _keep_lower(values: list, reasons: list, metrics: dict[str, list[float]], extra: list[tuple[int, bool]], given: int,
                value_range: tuple[float, float] | None) -> None:
    """Fold the extra rows ``given..`` into their samples, in place: row ``given + k`` is another reading of
    sample ``extra[k][0]`` (its decoded reading, or, ``extra[k][1]`` True, the flagged caption without its
    suspect segments). Each sample keeps the lowest value (and that row's sub-scores). A decoded reading
    that could not be scored leaves its sample unscored, with that reason; a flagged sample with either
    row unscored gets the bottom of the range (a missing judgment is never worth more than a scored one).
    Truncates to ``given`` rows."""
    for k, (i, stripped) in enumerate(extra):
        j = given + k
        if stripped and (values[i] is None or values[j] is None):
            if value_range is not None:
                values[i], reasons[i] = value_range[0], None
            else:
                values[i], reasons[i] = None, reasons[i] or reasons[j]
            continue
        if values[i] is None:
            continue
        if values[j] is None:
            why = reasons[j]
            if isinstance(why, SampleError):
                why = replace(why, index=i, item=f"completions[{i}]" if why.item == f"completions[{j}]" else why.item)
            values[i], reasons[i] = None, why
        elif values[j] < values[i]:
            values[i] = values[j]
            for column in metrics.values():
                column[i] = column[j]
    del values[given:], reasons[given:]
    for column in metrics.values():
        del column[given:]


def _visual_group_key(sample: Sample) -> Any:
    key = media_key(sample.visual, sample.visual_id) if sample.visual is not None else None
    return key if key is not None else ("object", id(sample.visual))


class CaptionReward(RewardFunction):
    """Base of the scorer-backed caption rewards.

    Args:
        scorer: an already built scorer to use (pickled along with the reward); else one is built on
            first call from ``scorer_kwargs`` and dropped when pickling (rebuilt lazily after).
        image_column: the dataset column of single images (see
            :func:`capreward.rewards.inputs.collect_inputs` for how a visual is chosen).
        images_column: the column of lists of images.
        video_column: the column of videos.
        references_column: the column of reference captions.
        visual_id_column: the column of visual ids (None: none).
        use_references: score against the references column when a sample has references.
        as_given: score the caption text exactly as given (the released metrics' behaviour, for parity
            checks) instead of the caption a person reads (default:
            :func:`~capreward.caption_reading.read_caption` first: NFKC, invisible characters removed
            or read as spaces, look-alike letters of another script read, accents and digits kept; a
            caption whose reading may stand for other words (spelt letters, leet, an invisible
            separator: :attr:`~capreward.caption_reading.Reading.decoded`) is also scored decoded and
            the lower value kept; what the reading changed is logged, ``<name>/reading`` column). Ordinary captions read as they are written, so their scores do
            not depend on this option. The injection guard reads the caption either way.
        injection_guard: pay a caption that looks like forged judge-prompt structure
            (:func:`~capreward.judges.injection.injection_spans`) no more than its own reading with every
            suspect segment removed (:mod:`capreward.rewards.suspects`: both are scored in the same call,
            the lower value kept), so a false positive costs about nothing and a forged turn or
            instruction loses what it added; with nothing left (or a flag that names no segment, an
            injection judge's) the caption gets the bottom of :meth:`value_range`. The reason is logged
            (``<name>/injection`` column, ``rewards/<name>/injection`` count). None: the class default
            (:attr:`guard_injection`, on for the LLM-judge rewards).
        injection_judge: with the injection guard on, also ask a judge whether each caption the
            patterns let through addresses the grader
            (:class:`~capreward.judges.injection_judge.JudgeInjectionCheck`; image samples only; one
            judge request per caption). None (default): the patterns alone.
        image_aggregation: how a sample with several images (an ``images`` entry holding a list) is
            scored: the caption against every image, then ``"mean"`` (default), ``"min"`` or ``"max"`` of
            the per-image values (sub-scores: their mean); an image that cannot be scored leaves the
            sample unscored, with that image's reason. Each such sample's per-image values are logged
            (INFO).
        name: the reward's name (see :class:`RewardFunction`).
        log_subscores: also log the batch mean of every sub-score (see :class:`RewardFunction`).
        scorer_kwargs: keyword arguments of the scorer class (``model=``, ``device=``, ``backbone=``...).

    Subclasses set ``needs_visual`` (False when references alone can be scored) and implement
    :meth:`_build` and :meth:`score_group` (:class:`~capreward.rewards.MetricReward` does, for every
    registered metric).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> from capreward.rewards import CaptionReward, EMScoreReward
        >>> reward = EMScoreReward(model=str(trained_clip_path()))   # a tiny CLIP (seconds, then cached)
        >>> isinstance(reward, CaptionReward)
        True
        >>> out = reward.compute(None, ["a red image.", ""], image=[colour_image("red")] * 2)
        >>> out.values[1], str(out.reasons[1])
        (None, 'completions[1] is empty')
        >>> "video/full_f" in out.metrics
        True
    """

    needs_visual = True
    #: whether the injection guard is on by default (the LLM-judge rewards turn it on)
    guard_injection = False
    #: exceptions that mean "this sample's input is unusable", not "the code is broken"
    sample_errors: tuple[type[BaseException], ...] = (MediaError, ValueError, TypeError)
    #: the kind (:data:`capreward.errors.KINDS`) of a plain-text reason the scorer gives for a sample
    #: without a score (a scorer that gives :class:`~capreward.errors.SampleError` reasons states its own)
    reason_kind = "scorer"
    #: what lets a sample be scored without a visual when ``needs_visual`` is False: its references, or
    #: one of the metric's other inputs (``Sample.inputs``: QA utility's questions)
    alone_with: tuple[str, ...] = ("references",)

    def __init__(
        self,
        *,
        scorer: Any = None,
        image_column: str = "image",
        images_column: str = "images",
        video_column: str = "video",
        references_column: str = "references",
        visual_id_column: str | None = None,
        use_references: bool = True,
        injection_guard: bool | None = None,
        injection_judge: Any = None,
        as_given: bool = False,
        image_aggregation: str = "mean",
        name: str | None = None,
        log_subscores: bool = True,
        **scorer_kwargs: Any,
    ):
        super().__init__(name=name, log_subscores=log_subscores)
        self.as_given = bool(as_given)
        if injection_judge is not None and not callable(getattr(injection_judge, "reasons", None)):
            raise TypeError("injection_judge must have a reasons(captions, images) method (a JudgeInjectionCheck)")
        self.injection_judge = injection_judge
        if image_aggregation not in IMAGE_AGGREGATIONS:
            raise ValueError(f"image_aggregation must be one of {sorted(IMAGE_AGGREGATIONS)}, got {image_aggregation!r}")
        self.image_aggregation = image_aggregation
        self.injection_guard = self.guard_injection if injection_guard is None else bool(injection_guard)
        self.columns = Columns(image_column, images_column, video_column, references_column, visual_id_column)
        self.use_references = use_references
        self.scorer_kwargs = scorer_kwargs
        self._given_scorer = scorer
        self._scorer = scorer
        self._lock = threading.RLock()

    # ------------------------------------------------------------- the scorer
    def _build(self) -> Any:
        """Construct the scorer from ``self.scorer_kwargs`` (called once, on first use)."""
        raise NotImplementedError

    @property
    def scorer(self) -> Any:
        """The scorer, built on first access (torch's random streams are left as they were: building
        a model inside a training step must not change the trainer's later samples)."""
        with self._lock:
            if self._scorer is None:
                with keeps_random_state():
                    self._scorer = self._build()
            return self._scorer

    def metric_names(self) -> tuple[str, ...]:
        """The base's names, and ``injection`` (1/0 per sample) when the injection guard is on."""
        return (*super().metric_names(), *(("injection",) if self.injection_guard else ()))

    def load_models(self) -> CaptionReward:
        self.scorer  # noqa: B018 - building the scorer loads its models
        return self

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        if self._given_scorer is None:
            state["_scorer"] = None  # models are rebuilt lazily in the receiving process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- scoring
    def score_group(
        self,
        captions: list[str],
        visuals: list[Any] | None,
        kind: str | None,
        references: list[list[str]] | None,
        visual_ids: list[str | None] | None,
        **inputs: list[Any],
    ) -> GroupScores:
        """Score k valid samples sharing a visual ``kind`` ("image", "video"; None = no visuals, only
        when ``needs_visual`` is False) and, when ``references`` is given, each having references;
        ``inputs``: the samples' other inputs (``Sample.inputs``), one list each."""
        raise NotImplementedError

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        """Score each completion; see :meth:`RewardFunction.__call__`. Returns a :class:`RewardOutput`.

        Args:
            prompts: the prompts (unused by most rewards; may be None).
            completions: the captions (strings, or chat messages).
            **kwargs: the dataset columns (the visual, references and id columns), one entry per completion.

        Returns:
            The values, the reasons of the unscored samples and the per-sample sub-scores.
        """
        out = self.score_inputs(self._collect(prompts, completions, kwargs))
        hint = self._column_hint(kwargs)
        if hint:
            out.reasons = [_hinted(r, hint) for r in out.reasons]
        return out

    def _collect(self, prompts: Sequence[Any] | None, completions: Sequence[Any], kwargs: dict) -> RewardInputs:
        """The samples of a call (:func:`~capreward.rewards.inputs.collect_inputs`)."""
        return collect_inputs(prompts, completions, kwargs, self.columns)

    def _column_hint(self, columns: dict) -> str:
        """A hint when a column that looks like a visual is not one this reward reads (a ``videos``
        column beside ``video_column="video"``), else ""."""
        read = {self.columns.image, self.columns.images, self.columns.video}
        for name, option in LOOKALIKE_COLUMNS.items():
            if name in columns and name not in read:
                return f" (a {name!r} column was given but is not read: pass {option}={name!r})"
        return ""

    def score_inputs(self, inputs: RewardInputs) -> RewardOutput:
        """Score collected samples: invalid ones get None, the rest are scored in groups that share a
        visual kind and reference availability; a sample with several images is scored on each and
        aggregated (``image_aggregation``). A caption the injection guard flags is also scored without
        its suspect segments (:func:`~capreward.rewards.suspects.without_suspects`, an extra row of the
        same call) and gets the lower value; with nothing left, or with either unscored, the bottom of
        the range."""
        if any(s.more_visuals for s in inputs.samples):
            return self._score_multi_image(inputs)
        given = len(inputs)
        injection = self._injection_guard(inputs.samples)  # on the captions as given (it reads them itself)
        stripped = self._without_suspects(inputs.samples, injection)
        floored = [why is not None and not stripped[i] for i, why in enumerate(injection)]  # nothing left to score
        decoded = [(i, text) for i, text in self._decoded_rows(inputs) if not floored[i]]
        inputs, reading = self._read(inputs)
        # rows given..: decoded readings, then the flagged captions without their suspect segments
        extra = [*((i, text, False) for i, text in decoded), *((i, text, True) for i, text in enumerate(stripped) if text)]
        inputs = RewardInputs([*inputs.samples, *(replace(inputs.samples[i], caption=text) for i, text, _ in extra)])
        floored = floored + [False] * len(extra)
        n = len(inputs)
        values: list[float | None] = [None] * n
        reasons: list[str | None] = [SampleError.of(s.error, i, kind="input") for i, s in enumerate(inputs.samples)]
        metrics: dict[str, list[float]] = {}
        groups: dict[tuple, list[int]] = {}
        for i, s in enumerate(inputs.samples):
            if s.error is not None:
                continue
            if floored[i]:
                values[i] = cast(tuple[float, float], self.value_range())[0]  # the guard found a range (see _injection_guard)
                continue
            refs = s.references if self.use_references else None
            alone = refs is not None or any(v is not None for v in s.inputs.values())
            if s.visual is None and (self.needs_visual or not alone):
                missing = "" if self.needs_visual else f" and no {' or '.join(self.alone_with)}"
                reasons[i] = SampleError(i, "no_visual", "", NO_VISUAL + missing)
                continue
            groups.setdefault((s.kind, refs is not None), []).append(i)
        with self._lock:
            if groups:
                _ = self.scorer  # build outside the per-sample error handling: a bad config must raise
            for (kind, with_refs), rows in groups.items():
                self._score_rows(inputs.samples, rows, kind, with_refs, values, reasons, metrics, n)
        _keep_lower(values, reasons, metrics, [(i, flag) for i, _, flag in extra], given, self.value_range())
        inputs = RewardInputs(inputs.samples[:given])
        if self.injection_guard:
            metrics["injection"] = [
                math.nan if s.error is not None else float(r is not None) for s, r in zip(inputs.samples, injection)
            ]
        out = RewardOutput(values, reasons, metrics, injection=injection if self.injection_guard else [], reading=reading)
        if out.flagged:
            shown = "; ".join(f"[{i}] {injection[i]}" for i in out.flagged[:8])
            more = f"; ... {len(out.flagged) - 8} more" if len(out.flagged) > 8 else ""
            logger.warning(
                "%s: %d/%d captions look like forged judge-prompt structure, paid no more than without the "
                "suspect segments: %s%s", self.name, len(out.flagged), given, shown, more,
            )
        return self.with_metric_names(clip_to_range(out, self.value_range()))

    def _decoded_rows(self, inputs: RewardInputs) -> list[tuple[int, str]]:
        """(sample index, decoded reading) for each caption whose reading may stand for other words
        (:attr:`~capreward.caption_reading.Reading.decoded`: "r e d" for "red", "b1ue" for "blue", "bl ue"
        read from "bl\\u200bue" for "blue"): the reward scores both and keeps the lower, so that no
        disguise of a word is worth more than the word. None with :attr:`as_given`."""
        if self.as_given:
            return []
        out = []
        for i, s in enumerate(inputs.samples):
            if s.error is None and isinstance(s.caption, str):
                r = read_caption(s.caption)
                if r.suspects and r.decoded.strip() and r.decoded != r.text:
                    out.append((i, r.decoded))
        return out

    def _without_suspects(self, samples: Sequence[Sample], injection: list[str | None]) -> list[str | None]:
        """Per sample, the caption without its suspect segments for a flagged one (``""`` when nothing is
        left, or when the flag names no segment: an injection judge's), None for the others."""
        from .suspects import without_suspects

        out: list[str | None] = []
        for s, why in zip(samples, injection):
            if why is None or s.error is not None or not isinstance(s.caption, str):
                out.append(None)
                continue
            text = without_suspects(s.caption)
            out.append(text if text and text.strip() else "")
        return out

    def _read(self, inputs: RewardInputs) -> tuple[RewardInputs, list[str | None]]:
        """The samples with each caption as a person reads it (:func:`~capreward.caption_reading.read_caption`),
        and per sample what the reading changed (None: nothing). A caption that reads as nothing (invisible
        characters only) is an empty caption. With :attr:`as_given`, the inputs as they are."""
        if self.as_given:
            return inputs, []
        samples: list[Sample] = []
        changes: list[str | None] = []
        for i, s in enumerate(inputs.samples):
            if s.error is not None or not isinstance(s.caption, str):
                samples.append(s)
                changes.append(None)
                continue
            r = read_caption(s.caption)
            what = r.describe()
            if r.mixed_script:
                what = f"{what}; mixed-script words: {', '.join(repr(w) for w in r.mixed_script[:4])}"
            error = (SampleError(i, "input", f"completions[{i}]", "is empty once read (invisible characters only)", " ")
                     if not r.text.strip() else None)
            samples.append(dataclasses.replace(s, caption=r.text, error=error) if r.changed else s)
            changes.append(what)
        changed = [i for i, c in enumerate(changes) if c is not None]
        if changed:
            shown = "; ".join(f"[{i}] {changes[i]}" for i in changed[:4])
            more = f"; ... {len(changed) - 4} more" if len(changed) > 4 else ""
            logger.info("%s: %d/%d captions scored as read: %s%s", self.name, len(changed), len(samples), shown, more)
        return RewardInputs(samples), changes
    def _score_multi_image(self, inputs: RewardInputs) -> RewardOutput:
        """Every image of every sample as its own row, scored together, then aggregated per sample."""
        rows: list[Sample] = []
        owner: list[int] = []
        for i, s in enumerate(inputs.samples):
            for k, visual in enumerate((s.visual, *s.more_visuals)):
                rows.append(replace(s, visual=visual, visual_id=s.visual_id if k == 0 else None, more_visuals=()))
                owner.append(i)
        flat = self.score_inputs(RewardInputs(samples=rows))
        n = len(inputs)
        values: list[float | None] = [None] * n
        reasons: list[str | None] = [None] * n
        members: list[list[int]] = [[] for _ in range(n)]
        for j, i in enumerate(owner):
            members[i].append(j)
        aggregates: dict[str, Callable[[list[Any]], Any]] = {"mean": lambda v: sum(v) / len(v), "min": min, "max": max}
        aggregate = aggregates[self.image_aggregation]
        for i, js in enumerate(members):
            per_image = [flat.values[j] for j in js]
            missing = [(k, flat.reasons[j]) for k, j in enumerate(js) if flat.values[j] is None]
            if missing:  # a missing judgment is never worth more than a scored one: no value
                k, why = missing[0]
                if len(js) == 1:
                    reasons[i] = SampleError.of(why, i)
                else:  # the image's error, named as that image of the sample
                    reasons[i] = sample_failure(js[k], None, why).within(i, f"image {k} of {len(js)}")
            else:
                values[i] = float(aggregate(per_image))
            if len(js) > 1:
                logger.info("%s: completions[%d] per-image values %s -> %s (%s)", self.name, i, per_image, values[i],
                            self.image_aggregation)
        metrics = {key: [float(sum(column[j] for j in js) / len(js)) for js in members] for key, column in flat.metrics.items()}
        injection = [flat.injection[js[0]] for js in members] if flat.injection else []
        reading = [flat.reading[js[0]] for js in members] if flat.reading else []  # one caption per sample
        out = RewardOutput(values, reasons, metrics, injection=injection, reading=reading)
        return self.with_metric_names(clip_to_range(out, self.value_range()))

    def _injection_guard(self, samples: Sequence[Sample]) -> list[str | None]:
        """Per sample, why the guard flags it (:func:`~capreward.judges.injection.injection_reason`), or
        None: always None with the guard off, for samples already invalid, and for captions that are
        blank once special-token strings are removed (those are empty captions, not injections)."""
        if not self.injection_guard:
            return [None] * len(samples)
        if self.value_range() is None:
            raise ValueError(f"{self.name}: the injection guard needs a value range to floor captions to")
        out: list[str | None] = []
        for s in samples:
            reason = None
            if s.error is None and not is_blank(s.caption):
                reason = injection_reason(s.caption)
            out.append(reason)
        if self.injection_judge is not None:
            self._ask_injection_judge(samples, out)
        return out

    def _ask_injection_judge(self, samples: Sequence[Sample], out: list[str | None]) -> None:
        """Fill ``out`` (in place) with the injection judge's reasons for the image samples the patterns
        let through (their captions as read); a sample whose image cannot be loaded is left to the scorer."""
        from ..media import load_image

        rows, captions, images = [], [], []
        for i, s in enumerate(samples):
            if out[i] is not None or s.error is not None or s.kind != "image" or is_blank(s.caption):
                continue
            try:
                image = load_image(s.visual)
            except Exception:  # noqa: BLE001 - the scorer reports an unusable visual
                continue
            rows.append(i)
            captions.append(read_caption(s.caption).text)
            images.append(image)
        if rows:
            for i, reason in zip(rows, self.injection_judge.reasons(captions, images)):
                out[i] = reason

    def _score_rows(self, samples, rows, kind, with_refs, values, reasons, metrics, n) -> None:
        """Score ``rows`` in one scorer call. Scorers give a sample whose caption they cannot score NaN
        and a reason, so a hostile caption never costs its group more calls; if an input error escapes
        anyway (an unusable visual), the rows are retried once per distinct visual (never per row), and
        the rows of a visual that still fails get the error as their reason."""
        try:
            result = self._call_group(samples, rows, kind, with_refs)
        except self.sample_errors as exc:
            by_visual: dict[Any, list[int]] = {}
            for i in rows:
                by_visual.setdefault(_visual_group_key(samples[i]), []).append(i)
            if len(by_visual) == 1:
                for i in rows:
                    reasons[i] = self._sample_error(i, samples[i], exc)
                return
            for part in by_visual.values():
                self._score_rows(samples, part, kind, with_refs, values, reasons, metrics, n)
            return
        for j, i in enumerate(rows):
            v = result.scores[j]
            if v is None or math.isnan(float(v)):
                reason = result.reasons[j] if result.reasons else None
                if not reason:
                    reason = SampleError(i, "scorer", "", f"{self.name} gave no score")
                reasons[i] = SampleError.of(reason, i, f"completions[{i}]", kind=self.reason_kind)
            else:
                values[i] = float(v)
        for key, column in result.metrics.items():
            target = metrics.setdefault(key, [float("nan")] * n)
            for j, i in enumerate(rows):
                target[i] = float(column[j])

    def _call_group(self, samples, rows, kind, with_refs) -> GroupScores:
        group = [samples[i] for i in rows]
        visuals = None if kind is None else [s.visual for s in group]
        ids = [s.visual_id for s in group]
        names = sorted({k for s in group for k in s.inputs})
        result = self.score_group(
            [s.caption for s in group],
            visuals,
            kind,
            [s.references for s in group] if with_refs else None,
            ids if any(x is not None for x in ids) else None,
            **{k: [s.inputs.get(k) for s in group] for k in names},
        )
        if len(result.scores) != len(rows):
            raise RuntimeError(f"{type(self).__name__}.score_group returned {len(result.scores)} scores for {len(rows)} samples")
        return result

    @classmethod
    def _sample_error(cls, i: int, sample: Sample, exc: BaseException) -> SampleError:
        """The error of sample ``i`` whose scoring raised ``exc`` (one of :attr:`sample_errors`): kind
        ``"media"`` (``"refused"``) for its visual, ``"input"`` otherwise; the text names ``completions[i]``."""
        return SampleError(i, exception_kind(exc), f"completions[{i}]", cls._describe_error(sample, exc))

    @staticmethod
    def _describe_error(sample: Sample, exc: BaseException) -> str:
        if isinstance(exc, MediaError) and sample.visual is not None:
            return f"{sample.kind} {describe(sample.visual)}: {exc.problem}"
        return f"{type(exc).__name__}: {exc}"
