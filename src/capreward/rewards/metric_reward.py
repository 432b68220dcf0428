"""One reward class for every registered metric: :class:`MetricReward` reads the metric's spec and its
scorer's :class:`~capreward.scorers.contract.Scores`.

``MetricReward("emscore", model=...)`` is EMScore as a TRL reward; the per-metric names
(:class:`~capreward.rewards.EMScoreReward`, :class:`~capreward.rewards.CLIPScoreReward`, ...) are
subclasses that only fix ``metric``. Everything a reward does with a metric is read from its spec
(:class:`~capreward.registry.MetricSpec`): which sub-score is the value (:attr:`~capreward.registry.MetricSpec.value`),
its range, the reward's own options and their scale (:class:`~capreward.registry.RewardPolicy`),
whether a sample needs a visual or references, whether a language model reads the caption (the
injection guard), the sub-scores it logs (every numeric one its spec declares).

Options are explicit: a class fixed to a metric has a ``__signature__`` listing its own options and its
scorer's (so ``help(EMScoreReward)`` and ``inspect.signature`` show ``idf``, ``frames`` ...), and a
keyword that is none of them is refused at construction, naming the nearest valid option.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, cast
from collections.abc import Callable, Sequence

from .. import registry
from ..errors import SampleError
from ..explicit_options import ClassSignature, check_options, class_for, constructor_parameters, keyword_only, merged_signature
from ..scorers.contract import Scores
from .base import CaptionReward, GroupScores
from .inputs import RewardInputs, collect_inputs

#: CaptionReward's options common to every metric (everything else is the metric's or its scorer's).
_COMMON = tuple(p for p in list(inspect.signature(CaptionReward.__init__).parameters.values())[1:]
                if p.kind is not inspect.Parameter.VAR_KEYWORD)
_COMMON_NAMES = frozenset(p.name for p in _COMMON)
_KW = inspect.Parameter.KEYWORD_ONLY


def own_options(spec: registry.MetricSpec) -> tuple[registry.Option, ...]:
    """The reward's own options: its policy's (:attr:`~capreward.registry.RewardPolicy.options`) and, per
    row input, the dataset column holding it (``questions_column``)."""
    columns = tuple(registry.Option(f"{name}_column", name, f"the dataset column of the samples' {name}")
                    for name in spec.row_inputs)
    return (*spec.reward_policy.options, *columns)


def reward_parameters(metric: str) -> tuple[inspect.Signature, frozenset[str] | None]:
    """The constructor signature of ``metric``'s reward (its scorer's options, the reward's own, then the
    common options, all keyword-only) and the names it accepts (None: any, the scorer forwarding ``**kwargs``)."""
    spec = registry.get(metric)
    use_refs = spec.references != "none"
    common = [p.replace(default=use_refs) if p.name == "use_references" else p for p in _COMMON]
    own = [inspect.Parameter(o.name, _KW, default=o.default,
                             annotation=type(o.default).__name__ if o.default is not None else inspect.Parameter.empty)
           for o in own_options(spec)]
    scorer_params, open_kwargs = constructor_parameters(spec.load())
    var = inspect.Parameter("scorer_options", inspect.Parameter.VAR_KEYWORD) if open_kwargs else None
    signature = merged_signature(keyword_only(scorer_params), own, common, var_keyword=var)
    names = None if open_kwargs else frozenset(signature.parameters) | _COMMON_NAMES
    return signature, names


def _signature(cls: Any) -> inspect.Signature:
    if cls.metric is None:
        return inspect.Signature([inspect.Parameter("metric", inspect.Parameter.POSITIONAL_ONLY), *_COMMON,
                                  inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)])
    return reward_parameters(cls.metric)[0]


@functools.cache
def _call_options(scorer_class: Any) -> frozenset[str]:
    """The keyword names of ``scorer_class.scores`` (reward options it reads per call)."""
    return frozenset(inspect.signature(scorer_class.scores).parameters)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


class MetricReward(CaptionReward):
    """Any registered metric as a reward (TRL's reward-function contract), read from its spec.

    The value is the metric's value for the sample (:meth:`~capreward.registry.MetricSpec.value_of`: the
    headline, or the sub-score the reward's options choose, times the policy's ``scale``), clipped into
    :meth:`value_range` and counted when outside; a sample that cannot be scored gets None with its
    reason logged. TRL logs it as ``rewards/<metric>/...``, with every numeric sub-score its spec
    declares. The scorer's public methods and options read through the reward
    (``HallucinationPenalty(...).calibrate(...)``, ``.threshold``); the last group's typed result is
    :attr:`last_result`.

    Args:
        metric: a metric name or alias (:func:`capreward.registry.names`); the per-metric subclasses fix it.
        **options: the options of :class:`CaptionReward` (columns, ``use_references``, ``injection_guard``,
            ``scorer``, ``name`` ...), the metric's reward options and its scorer's options (``model``,
            ``backend``, ``idf`` ...): :meth:`signature_of` lists them.

    Raises:
        capreward.registry.UnknownMetric: no metric has that name.
        capreward.registry.UnknownOption: an option the reward and its scorer do not take (naming the
            nearest valid one).
        ValueError: an option's value is refused.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import MetricReward
        >>> reward = MetricReward("CLIP-S", model=clip)
        >>> reward.__name__, reward.value_range()
        ('clip_s', (-1.0, 2.5))
        >>> r = reward(None, ["a red image.", "a blue image."], image=[red, red])
        >>> r[0] > r[1]
        True
        >>> MetricReward("clip_s", modle=clip)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        capreward.registry.UnknownOption: MetricReward('clip_s')() got an unexpected keyword argument 'modle' (did you mean 'model'?); ...
    """

    #: the metric this class is fixed to (the per-metric subclasses), None for the generic class
    metric: str | None = None
    #: the class fixed to each metric that has one (filled as the classes are defined)
    named: dict[str, type] = {}
    __signature__ = ClassSignature(_signature)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.metric is not None:
            MetricReward.named.setdefault(cls.metric, cls)

    def __init__(self, metric: str | None = None, /, **options: Any):
        fixed = type(self).metric
        if metric is None and fixed is None:
            raise TypeError("MetricReward() needs a metric name: MetricReward('emscore', ...)")
        if metric is not None and fixed is not None and registry.get(metric).name != registry.get(fixed).name:
            raise ValueError(f"{type(self).__name__} is the {fixed!r} reward; use MetricReward({metric!r}) for {metric!r}")
        spec = registry.get(cast(str, metric or fixed))  # one of them is given (checked above)
        policy = spec.reward_policy
        owner = type(self).__name__ if fixed is not None else f"MetricReward({spec.name!r})"
        names = reward_parameters(spec.name)[1]
        if names is not None:
            check_options(owner, options, names)
        own = {o.name: options.pop(o.name, o.default) for o in own_options(spec)}
        for o in own_options(spec):
            if o.choices is not None and own[o.name] not in o.choices:
                raise ValueError(f"{o.name} must be one of {o.choices}, got {own[o.name]!r}")
        common = {k: options.pop(k) for k in _COMMON_NAMES if k in options}
        if spec.wraps is not None and common.get("scorer") is not None:
            common["scorer"] = _wrapped(spec, common["scorer"], options)
        if policy.check is not None:
            policy.check({**own, **options})
        if common.get("scorer") is None and policy.implies is not None:
            for key, value in policy.implies(own).items():
                options.setdefault(key, value)
        common.setdefault("use_references", spec.references != "none")
        if fixed is None and common.get("name") is None:
            common["name"] = spec.name
        self.metric = spec.name
        self._own = tuple(own)
        self._options = frozenset(o.name for o in spec.options)  # the scorer's options, settable on the reward
        for key, value in own.items():
            setattr(self, key, value)
        config = spec.config_of(common.get("scorer"), options)
        self.needs_visual = spec.visual_required(config)
        self.guard_injection = spec.judged_by_llm
        self.reason_kind = spec.unscored_kind
        self.alone_with = (("references",) if spec.references_for(config) != "none" else ()) + spec.row_inputs
        self.last_result: Any = None
        super().__init__(**common, **options)
        self.use_references = bool(self.use_references) and spec.references_for(config) != "none"

    @property
    def spec(self) -> registry.MetricSpec:
        """The metric's spec."""
        spec = self.__dict__.get("_spec")
        if spec is None:
            spec = self.__dict__["_spec"] = registry.get(self.__dict__["metric"])
        return spec

    @classmethod
    def class_for(cls, metric: str) -> Callable[..., MetricReward]:
        """The reward class of ``metric``: its named class (``EMScoreReward``), else ``MetricReward``
        fixed to it (:func:`~capreward.explicit_options.class_for`).

        Args:
            metric: a metric name or alias.

        Returns:
            The class, or a callable building the generic reward.
        """
        return class_for(MetricReward.named, MetricReward, metric)

    @property
    def verdict_metrics(self) -> tuple[str, str] | None:
        """``(claims, false_claims)``: the two sub-scores holding this reward's verdict on a caption's
        claims (how many it checked, how many it found false), read by a `CompositeReward`'s
        ``verifier``; None when the metric gives no such verdict."""
        return self.spec.reward_policy.verdict

    @staticmethod
    def signature_of(metric: str) -> inspect.Signature:
        """The options ``MetricReward(metric, ...)`` takes: the common ones, the metric's reward options
        and its scorer's (the signature of its per-metric class).

        Args:
            metric: a metric name or alias.

        Returns:
            The options' signature.

        Examples:
            >>> from capreward.rewards import MetricReward
            >>> "idf" in MetricReward.signature_of("emscore").parameters
            True
        """
        return reward_parameters(metric)[0]

    # ------------------------------------------------------------------ the scorer's options and methods
    def __getattr__(self, name: str) -> Any:
        """An option of the scorer (as built, or as it will be built) or a public member of its class, read
        through the reward (``penalty.threshold``, ``penalty.calibrate(...)``)."""
        if name.startswith("_") or "scorer_kwargs" not in self.__dict__:
            raise AttributeError(name)
        spec = registry.get(self.__dict__["metric"])
        scorer = self.__dict__.get("_scorer")
        if spec.has_option(name):
            if scorer is not None and hasattr(scorer, name):
                return getattr(scorer, name)
            return self.scorer_kwargs.get(name, spec.option(name).default)
        if hasattr(spec.load(), name):
            return getattr(self.scorer, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        state = self.__dict__
        option = "scorer_kwargs" in state and (name in state.get("_own", ()) or name == "use_references"
                                               or name in state["_options"])
        if option:
            state.pop("_plans", None)  # an option changes: what the reward reads off its scores is read again
        if option and name not in state and name not in state.get("_own", ()) and name != "use_references":
            self.scorer_kwargs[name] = value  # a scorer option set on the reward: the scorer's from now on
            if state.get("_scorer") is not None and hasattr(state["_scorer"], name):
                setattr(state["_scorer"], name, value)
            return
        super().__setattr__(name, value)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for key in ("last_result", "_spec", "_plans"):
            state.pop(key, None)
        built = self.__dict__.get("_scorer")
        if built is not None and self._given_scorer is None:  # the scorer's settings changed since (calibrate)
            kwargs = dict(state["scorer_kwargs"])
            for o in self.spec.options:
                value = getattr(built, o.name, None) if hasattr(built, o.name) else None
                if hasattr(built, o.name) and _plain(value) and value != kwargs.get(o.name, o.default):
                    kwargs[o.name] = value
            state["scorer_kwargs"] = kwargs
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("last_result", None)

    # --------------------------------------------------------------------------------------- reading
    def _config(self) -> dict[str, Any]:
        """The scorer's configuration (as built, or as it will be built) with the reward's own options."""
        scorer = self._given_scorer if self._given_scorer is not None else self.__dict__.get("_scorer")
        own = {k: getattr(self, k) for k in self._own}
        return {**self.spec.config_of(scorer, self.scorer_kwargs), **own}

    def _plan(self, key: Any) -> dict[str, Any]:
        """What the reward reads off its metric's spec for ``key`` (``(kind, with_refs)`` of a group, or
        ``"names"`` / ``"range"``), worked out once per configuration (the spec's facts do not change
        between calls; an option set on the reward clears them)."""
        plans = self.__dict__.setdefault("_plans", {})
        if key in plans:
            return plans[key]
        spec, config = self.spec, self._config()
        if key == "names":
            headline = (spec.name,) if spec.headline_differs(config) else ()
            truncated = ("truncated",) if spec.backbone == "clip" else ()
            plan: dict[str, Any] = {"names": (*headline, *spec.all_sub_scores(config, ("score", "number")), *truncated)}
        elif key == "range":
            lo, hi = spec.range_of({**config, "references": self.use_references})
            scale = getattr(self, spec.reward_policy.scale) if spec.reward_policy.scale else 1.0
            plan = {"range": (min(lo * scale, hi * scale) + 0.0, max(lo * scale, hi * scale) + 0.0)}  # + 0.0: no -0.0
        else:
            kind, has_refs = key
            kinds, reference_mode = spec.visual_kinds(config), spec.references_for(config)
            refused = None
            if kind is not None and kind not in kinds:
                refused = f"{spec.title} scores {' and '.join(k + 's' for k in kinds)} only{spec.with_config(config)}, got a {kind}"
            elif not has_refs and reference_mode == "required":
                refused = f"{spec.title}{spec.with_config(config)} needs references for this sample"
            with_refs = has_refs and reference_mode != "none"
            mode = {**config, "visual": kind, "references": with_refs}
            declared = spec.sub_scores_for(mode)
            plan = {"refused": refused, "with_refs": with_refs, "declared": declared, "value": spec.value_of(mode),
                    "numeric": tuple(s for s in declared if spec.kind_of(s) != "data"),
                    "headline": spec.name if spec.headline_differs(config) else None,
                    "scale": getattr(self, spec.reward_policy.scale) if spec.reward_policy.scale else 1.0,
                    "call": None}
        plans[key] = plan
        return plan

    def _build(self) -> Any:
        return self.spec.load()(**self.scorer_kwargs)

    def value_range(self) -> tuple[float, float]:
        """The closed interval every value of this reward lies in (read from the metric's spec and
        options; values outside are clipped and counted).

        Returns:
            ``(low, high)``.
        """
        return self._plan("range")["range"]

    def metric_names(self) -> tuple[str, ...]:
        """Every per-sample sub-score this reward can report: the headline under the metric's name where
        the value is another sub-score, every numeric sub-score its spec declares, ``truncated`` for a
        metric on a CLIP, then the common ones.

        Returns:
            The sub-score names.
        """
        return (*self._plan("names")["names"], *super().metric_names())

    def _collect(self, prompts: Sequence[Any] | None, completions: Sequence[Any], kwargs: dict) -> RewardInputs:
        inputs = collect_inputs(prompts, completions, kwargs, self.columns)
        for name in self.spec.row_inputs:
            column = getattr(self, f"{name}_column")
            values = kwargs.get(column)
            if values is None:
                continue
            if isinstance(values, (str, bytes)) or len(values) != len(inputs):
                raise ValueError(f"{len(inputs)} completions but {len(values)} entries in {column!r}")
            for sample, value in zip(inputs.samples, values):
                sample.inputs = {**sample.inputs, name: value}
        return inputs

    def score_group(self, captions, visuals, kind, references, visual_ids, **inputs) -> GroupScores:
        """Score k valid samples sharing a visual ``kind`` through the scorer's
        :meth:`~capreward.scorers.contract.Scorer.scores`, as the spec says (the visual kinds and
        reference mode of the configuration), and read the value and sub-scores off its
        :class:`~capreward.scorers.contract.Scores`."""
        n = len(captions)
        scorer = self.scorer
        plan = self._plan((kind, references is not None))
        if plan["refused"] is not None:
            reason = SampleError(None, "input", "", plan["refused"])
            return GroupScores(scores=[None] * n, reasons=[reason] * n)
        kwargs: dict[str, Any] = dict(inputs)
        if kind is not None and visuals is not None:
            kwargs[f"{kind}s"] = visuals
        if plan["with_refs"]:
            kwargs["references"] = references
        if visual_ids is not None:
            kwargs["visual_ids"] = visual_ids
        if plan["call"] is None:
            scorer_class: Any = type(scorer)  # a class is hashable (typeshed's type[Any] does not say so)
            call = _call_options(scorer_class)
            plan["call"] = {k: getattr(self, k) for k in self._own if k in call}
        kwargs.update(plan["call"])
        out: Scores = scorer.scores(captions, **kwargs)
        out.check(plan["declared"], cast(str, self.metric))  # set at construction
        self.last_result = out.result
        value, scale = plan["value"], plan["scale"]
        columns = out.values([value, *plan["numeric"]])
        values = [None if math.isnan(v) else v * scale for v in columns[value]]
        reasons = [None if v is not None else out.reason(value, i) for i, v in enumerate(values)]
        metrics = {sub: columns[sub] for sub in plan["numeric"]}
        if plan["headline"] is not None:
            metrics[plan["headline"]] = list(out.score)
        if "truncated" in out.extras:
            metrics["truncated"] = [float(t) for t in out.extras["truncated"]]
        return GroupScores(scores=values, reasons=reasons, metrics=metrics)


__all__ = ["MetricReward", "reward_parameters"]


def _wrapped(spec: registry.MetricSpec, scorer: Any, options: dict[str, Any]) -> Any:
    """``scorer`` as the metric's scorer: itself when it is one, else the metric's scorer built around it
    (``spec.wraps``: ``HallucinationPenalty(scorer=EMScore(...))`` reads that EMScore's alignments), taking
    the options of ``options`` its constructor names (popped)."""
    import inspect

    cls = spec.load()
    if isinstance(scorer, cls):
        return scorer
    named = {p.name for p in inspect.signature(cls.__init__).parameters.values()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", spec.wraps)}
    return cls(**{str(spec.wraps): scorer}, **{k: options.pop(k) for k in list(options) if k in named})
