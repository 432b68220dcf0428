"""The metric registry: every metric describes itself once, in a :class:`MetricSpec` next to its scorer.

Each metric's spec (its name and aliases, how to build its scorer, the sub-scores it writes for a given
configuration, its range, the visuals and references it takes, which model it can share, its options and
where it deliberately differs from the authors' released code) is declared in a ``<metric>_spec`` module of
:mod:`capreward.scorers`, which imports nothing heavy: importing this module, or reading a spec, never
imports torch or a scorer. The scorer itself is imported on :meth:`MetricSpec.load`.

Every consumer (rewards, torchmetrics metrics, jobs, the server, the recipe, the CLI, meta-evaluation,
the docs) reads the specs here instead of restating a fact about a metric, and reads a metric's scores
from its scorer's :class:`~capreward.scorers.contract.Scores` (the one contract: see
:mod:`capreward.scorers.contract`). A spec holds facts only: it names no consumer code.

The registry finds the built-in metrics (the ``*_spec`` modules of :mod:`capreward.scorers`) and the
metrics of installed packages through the entry-point group ``capreward.metrics`` (:data:`ENTRY_POINTS`):
an entry point names a module that registers its specs when imported, or a :class:`MetricSpec`. A metric
in a user's own package reaches every entry point (``capreward score``, ``serve``, the adapters, the
recipe, :func:`~capreward.rewards.reward_for`, :func:`~capreward.torchmetrics.metric_for`); see the
"Adding a metric" guide (docs/adding-a-metric.md).

Examples:
    >>> from capreward import registry
    >>> registry.get("CLIPScore").name
    'clip_s'
    >>> registry.get("visce2").visuals
    ('image',)
    >>> registry.get("emscore").sub_scores({"visual": "video"})[:2]
    ('video/coarse', 'video/fine_p')
    >>> registry.get("emscor")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    capreward.registry.UnknownMetric: unknown metric 'emscor' (did you mean 'emscore'?); choose one of ...
"""

from __future__ import annotations

import difflib
import importlib
import logging
import pkgutil
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

from .errors import CaprewardError

#: The reference modes a spec may declare.
REFERENCE_MODES = ("none", "optional", "required")
#: The models a metric can share with another metric of the same kind.
SHARES = ("clip", "chat_judge")
#: The package whose ``*_spec`` modules declare the built-in metrics.
SPEC_PACKAGE = "capreward.scorers"
#: The entry-point group through which an installed package adds metrics: each entry point names a module
#: (imported: it registers its specs) or a :class:`MetricSpec` (registered).
ENTRY_POINTS = "capreward.metrics"
#: What a sub-score is (:attr:`MetricSpec.sub_score_kinds`): ``"score"`` (on the metric's scale: an
#: empty caption's Metric row gets ``empty_score`` there), ``"number"`` (a count or a number as a judge
#: wrote it: logged and a Metric column, NaN for an empty caption) or ``"data"`` (text or a list: results
#: files only).
SUB_SCORE_KINDS = ("score", "number", "data")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Option:
    """One option of a metric (of its scorer, or of its reward: :attr:`RewardPolicy.options`).

    Args:
        name: the keyword.
        default: its default.
        doc: a one-line description.
        choices: the values it takes when it takes only some (a reward refuses another at construction),
            or None.

    Examples:
        >>> from capreward.registry import Option
        >>> Option("part", "f", "the reward's side", ("f", "precision", "recall")).choices
        ('f', 'precision', 'recall')
    """

    name: str
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class RewardPolicy:
    """What makes a metric a reward besides its scores, as data the one generic reward
    (:class:`~capreward.rewards.MetricReward`) reads.

    Args:
        options: the reward's own options (each an attribute of the reward and a keyword of its
            signature; ``choices`` refused otherwise). An option the scorer's ``scores`` method names
            is passed to it on every call (EMScore's and CLIP-S's ``harmonic_mean``); the others choose
            among the scores (:attr:`MetricSpec.value`) or scale them (``scale``).
        scale: the option whose value multiplies the reward's value and range (the 0..100 judges'
            ``scale``), or None.
        implies: the scorer options a choice of reward options sets when the scorer is built by the reward
            (``use_expected=True`` needs VisCE²'s ``expected=True``), or None.
        check: refuses a configuration (ValueError) before anything is built, given the reward's own and
            scorer options (``idf="batch"`` would make a sample's reward depend on its batch), or None.
        verdict: ``(claims, false_claims)``: the two sub-scores holding the metric's verdict on a caption's
            claims (how many it checked, how many it found false), which a
            :class:`~capreward.rewards.CompositeReward`'s ``verifier`` reads; None when it gives none.

    Examples:
        >>> from capreward import registry
        >>> policy = registry.get("visce2").reward_policy
        >>> [o.name for o in policy.options], policy.scale
        (['scale', 'use_expected'], 'scale')
    """

    options: tuple[Option, ...] = ()
    scale: str | None = None
    implies: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    check: Callable[[Mapping[str, Any]], None] | None = None
    verdict: tuple[str, str] | None = None


@dataclass(frozen=True)
class Deviation:
    """Where capreward's default differs from the authors' released code, and the option that restores the
    released behaviour.

    Args:
        what: the difference.
        restore: the option that restores the released behaviour; None when nothing does (a released crash).

    Examples:
        >>> from capreward import registry
        >>> registry.get("visce2").deviations[0].restore
        'temperature=0.2 (VisCE2.released())'
    """

    what: str
    restore: str | None


@dataclass(frozen=True)
class JobFlag:
    """A per-metric setting of the job commands (``capreward score``): a command-line flag, a field of
    :class:`~capreward.jobs.runners.ScoreOptions` and, when ``record`` is not None, a setting recorded per
    results file (:mod:`capreward.jobs.settings_file`).

    Examples:
        >>> from capreward import registry
        >>> flag = registry.get("gveval").job_flags[0]
        >>> flag.flags, flag.option, flag.adapters
        (('--gveval-mode',), 'mode', True)

    Args:
        name: the ScoreOptions field, argparse ``dest`` and settings key (``"gveval_mode"``).
        flags: the command-line spellings, the first one canonical (``("--gveval-mode",)``).
        help: the flag's help line.
        option: the scorer option it sets (``"mode"``), or None when it sets none (a model the job
            builds); the metric's config read by :meth:`MetricSpec.sub_scores_for` and friends holds it.
        default: its value when not given (None: the option's default, when ``option`` names one).
        type: ``"str"``, ``"int"``, ``"float"`` or ``"flag"`` (a switch: ``store_true``).
        choices: the accepted values, or None.
        record: how the settings record holds it: ``"value"`` (as it is), ``"bool"``, ``"float"``,
            ``"model"`` (a model name or local path, by :func:`~capreward.jobs.settings_file.model_identity`),
            ``"clip_model"`` (the same, read as a CLIP specification), or None (not recorded).
        hint: what to try when the model it names cannot be loaded (a command's one-line error), or None.
        adapters: whether the adapters' rewards take it too: a field of
            :class:`~capreward.adapters.factory.RewardOptions` (``CAPREWARD_<NAME>`` in the environment), a
            ``capreward serve`` flag and a GRPO recipe flag.
    """

    name: str
    flags: tuple[str, ...]
    help: str
    option: str | None = None
    default: Any = None
    type: str = "str"
    choices: tuple[Any, ...] | None = None
    record: str | None = "value"
    hint: str | None = None
    adapters: bool = False

    def __post_init__(self):
        if self.type not in ("str", "int", "float", "flag"):
            raise ValueError(f"{self.name}: type must be 'str', 'int', 'float' or 'flag', got {self.type!r}")
        if self.record not in (None, "value", "bool", "float", "model", "clip_model"):
            raise ValueError(f"{self.name}: record must be None, 'value', 'bool', 'float', 'model' or 'clip_model', "
                             f"got {self.record!r}")
        if not self.flags or not all(f.startswith("--") for f in self.flags):
            raise ValueError(f"{self.name}: flags must be '--name' spellings, got {self.flags!r}")


def import_path(target: str) -> Any:
    """The object a ``"module:attr"`` path names (imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _no_sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class MetricSpec:
    """Everything capreward knows about one metric, declared once, as facts (no consumer code).

    Examples:
        >>> from capreward import registry
        >>> spec = registry.get("clip_s")
        >>> spec.sub_scores_for({"references": True}), spec.value_of({"references": True})
        (('ref', 'ref_similarity'), 'ref')
        >>> spec.field_of("ref"), spec.range_of({"w": 2.5})
        ('ref_clip_s', (0.0, 2.5))

    Args:
        name: the one canonical name (``"emscore"``), used by every entry point and log key.
        aliases: other accepted spellings (compared after :func:`capreward.names.normalize`).
        title: the display name (``"EMScore"``).
        summary: one sentence saying what it measures.
        paper: the citation.
        released_code: URL of the authors' code, or None.
        scorer: ``"module:attr"`` of the scorer class (the :class:`~capreward.scorers.contract.Scorer`
            protocol), imported lazily by :meth:`load`.
        sub_scores: the sub-scores the scorer writes for a configuration (a mapping with ``visual``:
            ``"image"``/``"video"``/None, ``references``: bool, and the metric's own options), as the
            part after ``<metric>/`` of a results-file field (``video/full_f``, ``raw``): exactly the keys
            of its :attr:`~capreward.scorers.contract.Scores.sub_scores`.
        value_range: the range of the headline score.
        higher_is_better: whether a larger headline score is a better caption.
        visuals: the visual kinds it scores (``("image",)`` or ``("image", "video")``).
        references: ``"none"``, ``"optional"`` or ``"required"``.
        shares: ``"clip"`` (shares one CLIP backbone with the other CLIP metrics), ``"chat_judge"``
            (shares one chat judge) or None.
        uses_idf: whether it weighs tokens by idf (a job fixes one idf table for it).
        options: its main scorer options.
        deviations: where its defaults differ from the released code.
        backbone: the kind of model it runs on: ``"clip"`` or ``"chat_judge"`` (PAC-S runs on a CLIP it
            cannot share: its own checkpoint).
        result_fields: results-file field names that differ from ``<metric>/<sub-score>``, kept for files
            users already read (sub-score -> field; e.g. CLIP-S's ``ref`` is written ``ref_clip_s``).
        reference_mode: the reference mode for a configuration when it depends on one (G-VEval's
            ``mode``); None: always :attr:`references`.
        visuals_for: the visual kinds for a configuration when they depend on one (G-VEval's ACCR scores
            videos only); None: always :attr:`visuals`.
        position: sort key of the built-in metrics (the order of :func:`names`).
        judge_backend: whether its scorer takes any chat judge backend as its first argument
            (:class:`~capreward.judges.protocol.JudgeBackend`: a local VLM or an OpenAI-compatible server).
        remote_scorer: ``"module:attr"`` of a scorer of the same metric that asks an OpenAI-compatible
            server (given a :class:`~capreward.judges.protocol.JudgeBackend`), for a metric whose
            :attr:`scorer` needs a local model (FLEUR); None otherwise.
        text_judge: whether its scorer's ``backend`` is a text-only judge that reads the caption alone
            (a local causal LM, or the judge server), the chat judge then writing what it asks
            (``question_backend``): QA utility.
        needs_visual: whether a sample needs a visual for a configuration; None: always. EMScore scores
            references alone (EMScore_ref), QA utility the sample's questions alone, G-VEval ``ref-only``
            the references alone.
        unscored_kind: the :data:`~capreward.errors.KINDS` kind of a plain-text reason the scorer gives
            for a sample without a score (``"judge_unreadable"``: the judge's answer had none).
        default_visual: the visual kind its torchmetrics Metric takes by default (``visual=``).
        job_flags: its own settings of the job commands (:class:`JobFlag`: ``--gveval-mode``), added to
            ``capreward score`` and its settings record.
        row_inputs: inputs the scorer reads per sample besides caption, visual and references, passed to
            ``scores()`` as keyword lists (QA utility's ``questions``): a manifest key of ``capreward
            score``, a dataset column of the reward (``<input>_column`` names it).
        writes_alignment: whether its scores carry a token -> frame ``alignment`` per caption, which a
            job writes with ``--alignment``.
        flagged_tokens: the sub-score holding the positions of the caption's tokens it flags (outlined by
            ``capreward report``), or None.
        wraps: the scorer's first parameter when it reads another scorer (the hallucination penalty's
            ``emscore``): a reward given that scorer as ``scorer=`` builds its own scorer around it; None.
        explanation: what ``capreward explain`` gives for it (its line in the command's help), for a
            scorer with an ``explain`` method; None: it explains nothing.
        sub_score_kinds: sub-score -> :data:`SUB_SCORE_KINDS` kind, for those that are not ``"score"``
            (counts, text, lists).
        value: the sub-score a reward and a torchmetrics Metric take as their value for a configuration
            (its options, the reward's options, ``visual`` and ``references``); None: always the headline
            (``"score"``). CLIP-S's reward is RefCLIP-S (``ref``) with references, its results-file
            headline CLIP-S.
        range_for: the range of :attr:`value` for a configuration when it depends on one (CLIP-S's
            ``w``, and its sign-safe RefCLIP-S reaching -1); None: :attr:`value_range`.
        reward_policy: what makes it a reward besides its scores (:class:`RewardPolicy`).
    """

    name: str
    aliases: tuple[str, ...]
    title: str
    summary: str
    paper: str
    released_code: str | None
    scorer: str
    sub_scores: Callable[[Mapping[str, Any]], tuple[str, ...]] = _no_sub_scores
    value_range: tuple[float, float] = (0.0, 1.0)
    higher_is_better: bool = True
    visuals: tuple[str, ...] = ("image", "video")
    references: str = "optional"
    shares: str | None = None
    uses_idf: bool = False
    options: tuple[Option, ...] = ()
    deviations: tuple[Deviation, ...] = ()
    backbone: str | None = None
    result_fields: Mapping[str, str] = field(default_factory=dict)
    reference_mode: Callable[[Mapping[str, Any]], str] | None = None
    visuals_for: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None
    position: int = 1000
    judge_backend: bool = False
    remote_scorer: str | None = None
    text_judge: bool = False
    needs_visual: Callable[[Mapping[str, Any]], bool] | None = None
    unscored_kind: str = "scorer"
    default_visual: str = "image"
    job_flags: tuple[JobFlag, ...] = ()
    row_inputs: tuple[str, ...] = ()
    writes_alignment: bool = False
    flagged_tokens: str | None = None
    wraps: str | None = None
    explanation: str | None = None
    sub_score_kinds: Mapping[str, str] = field(default_factory=dict)
    value: Callable[[Mapping[str, Any]], str] | None = None
    range_for: Callable[[Mapping[str, Any]], tuple[float, float]] | None = None
    reward_policy: RewardPolicy = field(default_factory=RewardPolicy)

    def __post_init__(self):
        if self.references not in REFERENCE_MODES:
            raise ValueError(f"{self.name}: references must be one of {REFERENCE_MODES}, got {self.references!r}")
        if self.shares is not None and self.shares not in SHARES:
            raise ValueError(f"{self.name}: shares must be one of {SHARES} or None, got {self.shares!r}")
        for target in (self.scorer, self.remote_scorer):
            if target is not None and ":" not in target:
                raise ValueError(f"{self.name}: a scorer must be 'module:attr', got {target!r}")
        if not set(self.visuals) <= {"image", "video"} or not self.visuals:
            raise ValueError(f"{self.name}: visuals must be some of ('image', 'video'), got {self.visuals!r}")
        bad = {k: v for k, v in self.sub_score_kinds.items() if v not in SUB_SCORE_KINDS}
        if bad:
            raise ValueError(f"{self.name}: sub_score_kinds must be among {SUB_SCORE_KINDS}, got {bad}")

    def load(self) -> Any:
        """The scorer class (imported now)."""
        return import_path(self.scorer)

    def load_remote_scorer(self) -> Any:
        """The :attr:`remote_scorer` class (imported now); ValueError when the metric has none."""
        if self.remote_scorer is None:
            raise ValueError(f"{self.name} has no scorer for a chat server")
        return import_path(self.remote_scorer)

    @property
    def judged_by_llm(self) -> bool:
        """Whether a language model reads the caption (a chat judge, or QA utility's text judge): its
        rewards floor captions that forge judge-prompt structure by default (the injection guard), a
        caption blank once special-token strings are removed is empty, and its answer may hold no score
        (a Metric counts the ``scored`` captions)."""
        return self.backbone == "chat_judge" or self.text_judge

    def visual_required(self, config: Mapping[str, Any] | None = None) -> bool:
        """Whether a sample needs a visual with ``config`` (see :attr:`needs_visual`)."""
        return True if self.needs_visual is None else bool(self.needs_visual(self.configured(config)))

    def job_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The scorer options its :attr:`job_flags` set, from ``values`` (flag name -> value; a missing or
        None value: the flag's default)."""
        return {f.option: self.job_value(f, values.get(f.name)) for f in self.job_flags if f.option}

    def job_value(self, flag: JobFlag, value: Any) -> Any:
        """``value`` of ``flag``, or its default when None (the option's default when it names one)."""
        if value is not None:
            return value
        if flag.default is not None or flag.option is None or not self.has_option(flag.option):
            return flag.default
        return self.option(flag.option).default

    def has_option(self, name: str) -> bool:
        return any(o.name == name for o in self.options)

    def option(self, name: str) -> Option:
        """The option called ``name``; KeyError naming the options otherwise."""
        for opt in self.options:
            if opt.name == name:
                return opt
        raise KeyError(f"{self.name} has no option {name!r}; its options: {', '.join(o.name for o in self.options)}")

    def defaults(self) -> dict[str, Any]:
        """Option name -> default (the scorer's options, then the reward's own)."""
        return {**{o.name: o.default for o in self.reward_policy.options}, **{o.name: o.default for o in self.options}}

    def configured(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config`` over the options' defaults."""
        return {**self.defaults(), **(config or {})}

    def config_of(self, scorer: Any = None, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A configuration read from a built ``scorer`` (its attributes named as the spec's options), else
        from the ``options`` it is built with (a None value: the option's default), over the defaults."""
        if scorer is not None:
            given = {o.name: getattr(scorer, o.name) for o in self.options if hasattr(scorer, o.name)}
        else:
            given = {k: v for k, v in (options or {}).items() if v is not None}
        return self.configured(given)

    def sub_scores_for(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """:attr:`sub_scores` for ``config`` (missing options at their defaults)."""
        return tuple(self.sub_scores(self.configured(config)))

    def modes(self, config: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], ...]:
        """``config`` with each ``visual`` kind it scores and each ``references`` its reference mode
        allows: every configuration a consumer may score in."""
        config = self.configured(config)
        refs = {"none": (False,), "required": (True,)}.get(self.references_for(config), (True, False))
        return tuple({**config, "visual": visual, "references": with_refs}
                     for visual in self.visual_kinds(config) or (None,) for with_refs in refs)

    def all_sub_scores(self, config: Mapping[str, Any] | None = None, kinds: tuple[str, ...] = SUB_SCORE_KINDS) -> tuple[str, ...]:
        """Every sub-score of the ``kinds`` asked for that it writes in any of :meth:`modes`, in the order
        the spec names them: the fixed key set of a consumer that reports sub-scores whatever the batch."""
        out: list[str] = []
        for mode in self.modes(config):
            for sub in self.sub_scores_for(mode):
                if sub not in out and self.kind_of(sub) in kinds:
                    out.append(sub)
        return tuple(out)

    def kind_of(self, sub_score: str) -> str:
        """The :data:`SUB_SCORE_KINDS` kind of ``sub_score``."""
        return self.sub_score_kinds.get(sub_score, "score")

    def value_of(self, config: Mapping[str, Any] | None = None) -> str:
        """The sub-score (or ``"score"``, the headline) that is the value of a reward or Metric with
        ``config`` (see :attr:`value`)."""
        return "score" if self.value is None else self.value(self.configured(config))

    def headline_differs(self, config: Mapping[str, Any] | None = None) -> bool:
        """Whether in some of :meth:`modes` the value is not the headline: then a reward logs, and a
        Metric keeps, the headline under the metric's name (CLIP-S's reference-free ``clip_s``)."""
        return any(self.value_of(mode) != "score" for mode in self.modes(config))

    def range_of(self, config: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """The range of :meth:`value_of` with ``config`` (see :attr:`range_for`)."""
        if self.range_for is None:
            return (float(self.value_range[0]), float(self.value_range[1]))
        lo, hi = self.range_for(self.configured(config))
        return (float(lo), float(hi))

    def references_for(self, config: Mapping[str, Any] | None = None) -> str:
        """The reference mode for ``config`` (``"none"``, ``"optional"`` or ``"required"``)."""
        return self.references if self.reference_mode is None else self.reference_mode(self.configured(config))

    def visual_kinds(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The visual kinds it scores with ``config``."""
        return self.visuals if self.visuals_for is None else tuple(self.visuals_for(self.configured(config)))

    def with_config(self, config: Mapping[str, Any] | None = None) -> str:
        """``" with mode='combined'"``: the options of ``config`` that differ from their defaults, as a
        message names them ("" when none does)."""
        defaults = self.defaults()
        shown = [f"{k}={v!r}" for k, v in (config or {}).items()
                 if k in defaults and v != defaults[k] and isinstance(v, (str, bool, int, float))]
        return f" with {', '.join(shown)}" if shown else ""

    def field_of(self, sub_score: str) -> str:
        """The results-file field of ``sub_score`` (``<metric>/<sub-score>`` unless :attr:`result_fields`
        names another)."""
        return self.result_fields.get(sub_score, f"{self.name}/{sub_score}")

    def fields(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The results-file fields written for ``config``: the headline (the metric's name) and its
        sub-scores."""
        return (self.name, *(self.field_of(s) for s in self.sub_scores_for(config)))

    def all_fields(self) -> tuple[str, ...]:
        """The headline field and the legacy top-level fields (:attr:`result_fields`), whatever the
        configuration: the fields a manifest's carried key may not be."""
        return (self.name, *self.result_fields.values())


class UnknownMetric(CaprewardError, ValueError, KeyError):
    """A metric name the registry does not hold; the message suggests the nearest names.

    Examples:
        >>> from capreward import registry
        >>> try:
        ...     registry.get("clipscor")
        ... except registry.UnknownMetric as exc:
        ...     print(str(exc).split(";")[0])
        unknown metric 'clipscor' (did you mean 'clip_s'?)
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownOption(CaprewardError, TypeError):
    """A keyword argument a reward or metric constructor does not take; the message names the nearest
    valid option (raised at construction, not at the first call).

    Examples:
        >>> from capreward.registry import UnknownOption
        >>> from capreward.rewards import EMScoreReward
        >>> try:
        ...     EMScoreReward(idff=False)
        ... except UnknownOption as exc:
        ...     print(str(exc).split(";")[0])
        EMScoreReward() got an unexpected keyword argument 'idff' (did you mean 'idf'?)
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_SPECS: dict[str, MetricSpec] = {}
_ALIASES: dict[str, str] = {}
_LOADED = False
_LOCK = threading.RLock()


def normalize(name: str) -> str:
    """``name`` stripped, in lower case, ``-`` written ``_`` (``CLIP-S`` → ``clip_s``)."""
    return name.strip().lower().replace("-", "_")


def register(spec: MetricSpec) -> MetricSpec:
    """Add ``spec`` to the registry and return it. Registering the same name again replaces the spec
    (a module reloaded); an alias that already names another metric is refused.

    Args:
        spec: the metric's spec.

    Returns:
        ``spec``.

    Raises:
        TypeError: ``spec`` is not a :class:`MetricSpec`.
        ValueError: its name is not canonical (lower case, ``_``), or an alias names another metric.
    """
    if not isinstance(spec, MetricSpec):
        raise TypeError(f"register() takes a MetricSpec, got {type(spec).__name__}")
    with _LOCK:
        key = normalize(spec.name)
        if key != spec.name:
            raise ValueError(f"a metric's name must be lower case with '_' (got {spec.name!r}; use {key!r})")
        for alias in spec.aliases:
            other = _ALIASES.get(normalize(alias))
            if (other is not None and other != spec.name) or (normalize(alias) in _SPECS and normalize(alias) != key):
                raise ValueError(f"alias {alias!r} of {spec.name!r} already names {other or normalize(alias)!r}")
        old = _SPECS.get(key)
        if old is not None:
            for alias in old.aliases:
                _ALIASES.pop(normalize(alias), None)
        _SPECS[key] = spec
        for alias in spec.aliases:
            _ALIASES[normalize(alias)] = key
    return spec


def unregister(name: str) -> MetricSpec:
    """Remove the metric called ``name`` (its canonical name) and its aliases (a metric a test or a
    plugin registered for a while).

    Args:
        name: the canonical name.

    Returns:
        The spec removed.

    Raises:
        UnknownMetric: no metric has that name.
    """
    with _LOCK:
        key = normalize(name)
        spec = _SPECS.pop(key, None)
        if spec is None:
            raise UnknownMetric(unknown_message(name, names()))
        for alias in spec.aliases:
            _ALIASES.pop(normalize(alias), None)
        return spec


def _load_builtin() -> None:
    """Import every ``*_spec`` module of :mod:`capreward.scorers` once (each registers its spec), then the
    installed packages' metrics (:func:`load_plugins`)."""
    global _LOADED
    if _LOADED:
        return
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True  # set first: a plugin that reads the registry while it loads sees the built-in metrics
        package = importlib.import_module(SPEC_PACKAGE)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.name.endswith("_spec"):
                importlib.import_module(f"{SPEC_PACKAGE}.{info.name}")
        load_plugins()


def load_plugins(group: str = ENTRY_POINTS) -> tuple[str, ...]:
    """Register the metrics of every installed package's ``group`` entry points and return their names.

    An entry point names a module (imported: its ``register`` calls add its specs) or a
    :class:`MetricSpec` (registered). One that cannot be loaded, or whose metric takes the name of a
    metric already registered, is skipped with a warning naming it: a broken plugin never stops the
    others, nor capreward.

    Args:
        group: the entry-point group (:data:`ENTRY_POINTS`).

    Returns:
        The names of the metrics the entry points added.
    """
    from importlib.metadata import entry_points

    added: list[str] = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        before = set(_SPECS)
        try:
            target = ep.load()
            if isinstance(target, MetricSpec):
                if target.name in _SPECS and _SPECS[target.name] is not target:
                    raise ValueError(f"the metric name {target.name!r} is taken")
                register(target)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop capreward
            message = f"capreward: the metric plugin {ep.name!r} ({ep.value}) is skipped: {type(exc).__name__}: {exc}"
            logger.warning("%s", message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            continue
        added.extend(sorted(set(_SPECS) - before) or ([target.name] if isinstance(target, MetricSpec) else []))
    return tuple(added)


def specs() -> tuple[MetricSpec, ...]:
    """Every registered spec, built-in metrics first in their :attr:`~MetricSpec.position` order.

    Returns:
        The specs (the built-in metrics, then the installed packages')."""
    _load_builtin()
    return tuple(sorted(_SPECS.values(), key=lambda s: s.position))


def names() -> tuple[str, ...]:
    """The canonical names, in :func:`specs` order.

    Returns:
        The names."""
    return tuple(s.name for s in specs())


def aliases() -> dict[str, str]:
    """Every alias (normalised) -> the canonical name it stands for."""
    _load_builtin()
    return dict(_ALIASES)


def lookup(name: str) -> str | None:
    """The canonical name of ``name`` (any spelling: case, ``-``/``_``, an alias), or None.

    Args:
        name: a name or alias.

    Returns:
        The canonical name, or None when no metric has it."""
    _load_builtin()
    key = normalize(name)
    if key in _SPECS:
        return key
    return _ALIASES.get(key)


def suggest(name: str, choices: tuple[str, ...] | list[str] | None = None) -> list[str]:
    """The canonical names closest to ``name`` (through its aliases too), best first."""
    _load_builtin()
    pool = {**{n: n for n in (choices if choices is not None else _SPECS)},
            **{a: t for a, t in _ALIASES.items() if choices is None or t in choices}}
    close = difflib.get_close_matches(normalize(name), list(pool), n=3, cutoff=0.75)
    out: list[str] = []
    for c in close:
        if pool[c] not in out:
            out.append(pool[c])
    return out


def unknown_message(name: Any, choices: tuple[str, ...] | list[str], what: str = "metric") -> str:
    """"unknown <what> 'x' (did you mean 'y'?); choose one of ..."."""
    from .text import capped  # a 1 MB name is not echoed whole

    near = suggest(name, choices) if isinstance(name, str) and len(name) <= 200 else []
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return f"unknown {what} {capped(name)}{hint}; choose one of {', '.join(choices)}"


def get(name: str) -> MetricSpec:
    """The spec of ``name`` (canonical name or alias, any case, ``-`` or ``_``).

    Args:
        name: a name or alias.

    Returns:
        Its :class:`MetricSpec`.

    Raises:
        TypeError: ``name`` is not a str.
        UnknownMetric: no metric has that name; the message suggests the closest names.
    """
    if not isinstance(name, str):
        raise TypeError(f"a metric name must be a str, got {type(name).__name__}")
    key = lookup(name)
    if key is None:
        raise UnknownMetric(unknown_message(name, names()))
    return _SPECS[key]


def sharing(kind: str) -> tuple[str, ...]:
    """The metrics that can share one ``kind`` model (``"clip"`` or ``"chat_judge"``)."""
    if kind not in SHARES:
        raise ValueError(f"kind must be one of {SHARES}, got {kind!r}")
    return tuple(s.name for s in specs() if s.shares == kind)


def on_backbone(kind: str) -> tuple[str, ...]:
    """The metrics that run on a ``kind`` model (``"clip"`` or ``"chat_judge"``), shared or not."""
    return tuple(s.name for s in specs() if s.backbone == kind)


def on_judge_backend() -> tuple[str, ...]:
    """The metrics whose scorer takes any chat judge backend (local or an OpenAI-compatible server)."""
    return tuple(s.name for s in specs() if s.judge_backend)


def result_fields() -> tuple[str, ...]:
    """The top-level fields a results file may hold for the metrics: each metric's name followed by its
    legacy fields (``clip_s``, ``ref_clip_s``, ...), in :func:`specs` order."""
    return tuple(f for s in specs() for f in s.all_fields())


def job_flags() -> tuple[tuple[MetricSpec, JobFlag], ...]:
    """Every metric's :attr:`~MetricSpec.job_flags`, with its spec, in :func:`specs` order (a flag two
    metrics share, such as a model both read, is listed once, with the first)."""
    seen: set[str] = set()
    out = []
    for spec in specs():
        for flag in spec.job_flags:
            if flag.name not in seen:
                seen.add(flag.name)
                out.append((spec, flag))
    return tuple(out)


def explaining() -> tuple[str, ...]:
    """The metrics ``capreward explain`` can explain (those with an :attr:`~MetricSpec.explanation`)."""
    return tuple(s.name for s in specs() if s.explanation)


def using_idf() -> tuple[str, ...]:
    """The metrics that weigh tokens by idf."""
    return tuple(s.name for s in specs() if s.uses_idf)


#: The documented surface (docs/api/registry.md); the helpers the consumers share (``sharing``,
#: ``on_backbone``, ``job_flags``, ``result_fields``, ``explaining``, ``using_idf``, ``suggest``...) import
#: from here too.
__all__ = ["Deviation", "ENTRY_POINTS", "JobFlag", "MetricSpec", "Option", "RewardPolicy", "UnknownMetric", "UnknownOption",
           "get", "load_plugins", "lookup", "names", "register", "specs", "unregister"]
