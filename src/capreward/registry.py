"""The metric registry: every metric describes itself once, in a :class:`MetricSpec` next to its scorer.

Each metric's spec (its name and aliases, how to build its scorer, the sub-scores it writes for a given
configuration, its range, the visuals and references it takes, which model it can share, its options and
where it deliberately differs from the authors' released code) is declared in a ``<metric>_spec`` module of
:mod:`capreward.scorers`, which imports nothing heavy: importing this module, or reading a spec, never
imports torch or a scorer. The scorer itself is imported on :meth:`MetricSpec.load`.

Every consumer (rewards, torchmetrics metrics, jobs, the server, the recipe, the CLI, meta-evaluation,
the docs) reads the specs here instead of restating a fact about a metric.

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
import pkgutil
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import CaprewardError

#: The reference modes a spec may declare.
REFERENCE_MODES = ("none", "optional", "required")
#: The models a metric can share with another metric of the same kind.
SHARES = ("clip", "chat_judge")
#: The generic reward and torchmetrics classes, and the hooks they use for a metric whose spec names none.
GENERIC_REWARD = "capreward.rewards.metric_reward:MetricReward"
GENERIC_METRIC = "capreward.torchmetrics.metrics:RegisteredMetric"
GENERIC_REWARD_HOOKS = "capreward.rewards.hooks:ScoreHooks"
GENERIC_METRIC_HOOKS = "capreward.torchmetrics.hooks:ScoreMetricHooks"
#: The package whose ``*_spec`` modules declare the built-in metrics.
SPEC_PACKAGE = "capreward.scorers"
#: The job runner of a spec without :attr:`MetricSpec.job_runner`.
GENERIC_JOB_RUNNER = "capreward.jobs.runners:generic_runner"


@dataclass(frozen=True)
class Option:
    """One constructor option of a metric: its name, default and a one-line description."""

    name: str
    default: Any
    doc: str


@dataclass(frozen=True)
class Deviation:
    """Where capreward's default differs from the authors' released code, and the option that restores the
    released behaviour (``restore``; None when nothing does, e.g. a released crash)."""

    what: str
    restore: str | None


@dataclass(frozen=True)
class JobFlag:
    """A per-metric setting of the job commands (``capreward score``): a command-line flag, a field of
    :class:`~capreward.jobs.runners.ScoreOptions` and, when ``record`` is not None, a setting recorded per
    results file (:mod:`capreward.jobs.settings_file`).

    Attributes:
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



def scorer_values(result: Any, sub_score: str) -> Any:
    """The values a scorer's ``result`` holds for ``sub_score`` (one per caption): its attribute named
    as the sub-score with ``/`` read as ``_`` (``video/full_f`` is ``result.video_full_f``), or None when
    it has none. The one rule by which the generic reward, Metric and job runner read a result."""
    return getattr(result, sub_score.replace("/", "_"), None)


def _no_sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class MetricSpec:
    """Everything capreward knows about one metric, declared once.

    Attributes:
        name: the one canonical name (``"emscore"``), used by every entry point and log key.
        aliases: other accepted spellings (compared after :func:`capreward.names.normalize`).
        title: the display name (``"EMScore"``).
        summary: one sentence saying what it measures.
        paper: the citation.
        released_code: URL of the authors' code, or None.
        scorer: ``"module:attr"`` of the scorer class, imported lazily by :meth:`load`.
        sub_scores: the sub-scores the scorer writes for a configuration (a mapping with ``visual``:
            ``"image"``/``"video"``/None, ``references``: bool, and the metric's own options), as the
            part after ``<metric>/`` of a results-file field (``video/full_f``, ``raw``).
        value_range: the range of the headline score.
        higher_is_better: whether a larger headline score is a better caption.
        visuals: the visual kinds it scores (``("image",)`` or ``("image", "video")``).
        references: ``"none"``, ``"optional"`` or ``"required"``.
        shares: ``"clip"`` (shares one CLIP backbone with the other CLIP metrics), ``"chat_judge"``
            (shares one chat judge) or None.
        uses_idf: whether it weighs tokens by idf (a job fixes one idf table for it).
        options: its main constructor options.
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
        judge_backend: whether its scorer takes any chat judge backend
            (:class:`~capreward.judges.protocol.JudgeBackend`: a local VLM or an OpenAI-compatible server).
        reward: ``"module:attr"`` of its named reward class (TRL's reward-function contract), or None:
            the generic :class:`~capreward.rewards.MetricReward` (every metric has a reward).
        torchmetric: ``"module:attr"`` of its named torchmetrics Metric class, or None: the generic
            :class:`~capreward.torchmetrics.RegisteredMetric`.
        remote_scorer: ``"module:attr"`` of a scorer that asks an OpenAI-compatible server (given a
            :class:`~capreward.judges.protocol.JudgeBackend`), for a metric whose :attr:`scorer` needs a
            local model (FLEUR); None otherwise.
        tiny_judge: ``"module:attr"`` of the tiny trained judge in `capreward.testing` that runs it
            offline (``(model, processor)``; the GRPO recipe's ``--tiny``), or None.
        text_judge: whether its scorer's ``backend`` is a text-only judge that reads the caption alone
            (a local causal LM, or the judge server), the chat judge then writing what it asks
            (``question_backend``): QA utility.
        reward_hooks: ``"module:attr"`` of its :class:`~capreward.rewards.hooks.RewardHooks` (what the one
            generic reward, :class:`~capreward.rewards.MetricReward`, cannot read from the spec: how the
            scorer's result becomes the value and the logged sub-scores, the reward's own options), or
            None: the generic :class:`~capreward.rewards.hooks.ScoreHooks` (the value is
            ``result.score``, the sub-scores ``result.<sub-score>``), enough for a metric whose scorer
            writes its sub-scores as its spec names them.
        metric_hooks: ``"module:attr"`` of its :class:`~capreward.torchmetrics.hooks.MetricHooks` (for
            the one generic torchmetrics Metric, :class:`~capreward.torchmetrics.RegisteredMetric`: its
            columns and how the scorer's result fills them), or None: the generic
            :class:`~capreward.torchmetrics.hooks.ScoreMetricHooks` (``score`` and the sub-scores).
        needs_visual: whether a sample needs a visual for a configuration; None: always. EMScore scores
            references alone (EMScore_ref), QA utility the sample's questions alone, G-VEval ``ref-only``
            the references alone.
        unscored_kind: the :data:`~capreward.errors.KINDS` kind of a plain-text reason the scorer gives
            for a sample without a score (``"judge_unreadable"``: the judge's answer had none).
        default_visual: the visual kind its torchmetrics Metric takes by default (``visual=``).
        job_flags: its own settings of the job commands (:class:`JobFlag`: ``--gveval-mode``), added to
            ``capreward score`` and its settings record.
        job_runner: ``"module:attr"`` of ``build(spec, job) -> run(rows) -> list[dict]``, how a job scores
            manifest rows with it (``job``: the :class:`~capreward.jobs.runners.ManifestScorer`, which
            holds the shared CLIP, judges, idf and flags); None: the generic runner
            (:func:`capreward.jobs.runners.generic_runner`), which builds :attr:`scorer` from the spec and
            writes ``result.score`` and each of :meth:`sub_scores_for` read off the result.
        row_inputs: manifest keys the scorer reads per row besides caption, visual and references, passed
            to ``score()`` as keyword lists (QA utility's ``questions``).
        writes_alignment: whether a job can write its token -> frame ``alignment`` per row
            (``--alignment``).
        flagged_tokens: the sub-score holding the positions of the caption's tokens it flags (outlined by
            ``capreward report``), or None.
        explainer: ``"module:attr"`` of ``build(spec, args) -> explain(rows) -> list[dict]`` for
            ``capreward explain`` (a judge that says why; ``args``: the command's options), or None; the
            builder's docstring's first paragraph is its line in the command's help.
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
    reward: str | None = None
    torchmetric: str | None = None
    remote_scorer: str | None = None
    text_judge: bool = False
    tiny_judge: str | None = None
    reward_hooks: str | None = None
    metric_hooks: str | None = None
    needs_visual: Callable[[Mapping[str, Any]], bool] | None = None
    unscored_kind: str = "scorer"
    default_visual: str = "image"
    job_flags: tuple[JobFlag, ...] = ()
    job_runner: str | None = None
    row_inputs: tuple[str, ...] = ()
    writes_alignment: bool = False
    flagged_tokens: str | None = None
    explainer: str | None = None

    def __post_init__(self):
        if self.references not in REFERENCE_MODES:
            raise ValueError(f"{self.name}: references must be one of {REFERENCE_MODES}, got {self.references!r}")
        if self.shares is not None and self.shares not in SHARES:
            raise ValueError(f"{self.name}: shares must be one of {SHARES} or None, got {self.shares!r}")
        if ":" not in self.scorer:
            raise ValueError(f"{self.name}: scorer must be 'module:attr', got {self.scorer!r}")
        if not set(self.visuals) <= {"image", "video"} or not self.visuals:
            raise ValueError(f"{self.name}: visuals must be some of ('image', 'video'), got {self.visuals!r}")

    def load(self) -> Any:
        """The scorer class (imported now)."""
        return import_path(self.scorer)

    def load_reward(self) -> Any:
        """The reward class (imported now): :attr:`reward`, or, for a metric that names none, the generic
        :class:`~capreward.rewards.MetricReward` fixed to it (a callable taking the same options)."""
        if self.reward is None:
            import functools

            return functools.partial(import_path(GENERIC_REWARD), self.name)
        return import_path(self.reward)

    def load_torchmetric(self) -> Any:
        """The torchmetrics Metric class (imported now): :attr:`torchmetric`, or, for a metric that names
        none, the generic :class:`~capreward.torchmetrics.RegisteredMetric` fixed to it."""
        if self.torchmetric is None:
            import functools

            return functools.partial(import_path(GENERIC_METRIC), self.name)
        return import_path(self.torchmetric)

    def load_remote_scorer(self) -> Any:
        """The :attr:`remote_scorer` class (imported now); ValueError when the metric has none."""
        if self.remote_scorer is None:
            raise ValueError(f"{self.name} has no scorer for a chat server")
        return import_path(self.remote_scorer)

    @property
    def judged_by_llm(self) -> bool:
        """Whether a language model reads the caption (a chat judge, or QA utility's text judge): its
        rewards floor captions that forge judge-prompt structure by default (the injection guard), and a
        caption blank once special-token strings are removed is empty."""
        return self.backbone == "chat_judge" or self.text_judge

    def visual_required(self, config: Mapping[str, Any] | None = None) -> bool:
        """Whether a sample needs a visual with ``config`` (see :attr:`needs_visual`)."""
        return True if self.needs_visual is None else bool(self.needs_visual(self.configured(config)))

    def load_reward_hooks(self) -> Any:
        """The :attr:`reward_hooks` class (imported now), or the generic
        :class:`~capreward.rewards.hooks.ScoreHooks` for a metric that names none."""
        return import_path(self.reward_hooks or GENERIC_REWARD_HOOKS)

    def load_metric_hooks(self) -> Any:
        """The :attr:`metric_hooks` class (imported now), or the generic
        :class:`~capreward.torchmetrics.hooks.ScoreMetricHooks` for a metric that names none."""
        return import_path(self.metric_hooks or GENERIC_METRIC_HOOKS)

    def load_job_runner(self) -> Any:
        """``build(spec, job) -> run(rows)`` of :attr:`job_runner`, or the generic runner (imported now)."""
        return import_path(self.job_runner or GENERIC_JOB_RUNNER)

    def load_explainer(self) -> Any:
        """The :attr:`explainer` builder (imported now); ValueError when the metric has none."""
        if self.explainer is None:
            raise ValueError(f"{self.name} has no explainer")
        return import_path(self.explainer)

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
        """Option name -> default."""
        return {o.name: o.default for o in self.options}

    def configured(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config`` over the options' defaults."""
        return {**self.defaults(), **(config or {})}

    def sub_scores_for(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """:attr:`sub_scores` for ``config`` (missing options at their defaults)."""
        return tuple(self.sub_scores(self.configured(config)))

    def references_for(self, config: Mapping[str, Any] | None = None) -> str:
        """The reference mode for ``config`` (``"none"``, ``"optional"`` or ``"required"``)."""
        return self.references if self.reference_mode is None else self.reference_mode(self.configured(config))

    def visual_kinds(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The visual kinds it scores with ``config``."""
        return self.visuals if self.visuals_for is None else tuple(self.visuals_for(self.configured(config)))

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
    """A metric name the registry does not hold; the message suggests the nearest names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownOption(CaprewardError, TypeError):
    """A keyword argument a reward or metric constructor does not take; the message names the nearest
    valid option (raised at construction, not at the first call)."""

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
    (a module reloaded); an alias that already names another metric is refused."""
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
    """Remove the metric called ``name`` (its canonical name) and its aliases, and return its spec (a
    metric a test or a plugin registered for a while). UnknownMetric when none has that name."""
    with _LOCK:
        key = normalize(name)
        spec = _SPECS.pop(key, None)
        if spec is None:
            raise UnknownMetric(unknown_message(name, names()))
        for alias in spec.aliases:
            _ALIASES.pop(normalize(alias), None)
        return spec


def _load_builtin() -> None:
    """Import every ``*_spec`` module of :mod:`capreward.scorers` once (each registers its spec)."""
    global _LOADED
    if _LOADED:
        return
    with _LOCK:
        if _LOADED:
            return
        package = importlib.import_module(SPEC_PACKAGE)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.name.endswith("_spec"):
                importlib.import_module(f"{SPEC_PACKAGE}.{info.name}")
        _LOADED = True


def specs() -> tuple[MetricSpec, ...]:
    """Every registered spec, built-in metrics first in their :attr:`~MetricSpec.position` order."""
    _load_builtin()
    return tuple(sorted(_SPECS.values(), key=lambda s: s.position))


def names() -> tuple[str, ...]:
    """The canonical names, in :func:`specs` order."""
    return tuple(s.name for s in specs())


def aliases() -> dict[str, str]:
    """Every alias (normalised) -> the canonical name it stands for."""
    _load_builtin()
    return dict(_ALIASES)


def lookup(name: str) -> str | None:
    """The canonical name of ``name`` (any spelling: case, ``-``/``_``, an alias), or None."""
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
    """The metrics ``capreward explain`` can explain (those with an :attr:`~MetricSpec.explainer`)."""
    return tuple(s.name for s in specs() if s.explainer)


def using_idf() -> tuple[str, ...]:
    """The metrics that weigh tokens by idf."""
    return tuple(s.name for s in specs() if s.uses_idf)


__all__ = ["Deviation", "JobFlag", "MetricSpec", "Option", "explaining", "job_flags", "UnknownMetric", "UnknownOption", "aliases", "get", "import_path", "lookup", "names", "normalize", "on_backbone", "on_judge_backend",
           "result_fields",
           "register", "sharing", "unregister", "specs", "suggest", "unknown_message", "using_idf"]
