"""One reward class for every registered metric: :class:`MetricReward` reads the metric's spec.

``MetricReward("emscore", model=...)`` is EMScore as a TRL reward; the per-metric names
(:class:`~capreward.rewards.EMScoreReward`, :class:`~capreward.rewards.CLIPScoreReward`, ...) are
subclasses that fix ``metric`` and give the same rewards. What the spec cannot say as data (how the
scorer's result becomes the value and the sub-scores, the reward's own options) is in the metric's
:class:`~capreward.rewards.hooks.RewardHooks`, named by
:attr:`~capreward.registry.MetricSpec.reward_hooks`.

Options are explicit: a class fixed to a metric has a ``__signature__`` listing its own options and its
scorer's (so ``help(EMScoreReward)`` and ``inspect.signature`` show ``idf``, ``frames`` ...), and a
keyword that is none of them is refused at construction, naming the nearest valid option.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from .. import registry
from ..explicit_options import ClassSignature, check_options, constructor_parameters, keyword_only, merged_signature
from .base import CaptionReward, GroupScores, RewardOutput
from .hooks import RewardHooks

#: CaptionReward's options common to every metric (everything else is the metric's or its scorer's).
_COMMON = tuple(p for p in list(inspect.signature(CaptionReward.__init__).parameters.values())[1:]
                if p.kind is not inspect.Parameter.VAR_KEYWORD)
_COMMON_NAMES = frozenset(p.name for p in _COMMON)


def _own_parameters(hooks: RewardHooks) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(hooks.options).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def reward_parameters(metric: str) -> tuple[inspect.Signature, frozenset[str] | None]:
    """The constructor signature of ``metric``'s reward (its scorer's options, the reward's own, then the
    common options, all keyword-only) and the names it accepts (None: any, the scorer forwarding ``**kwargs``)."""
    spec = registry.get(metric)
    hooks = spec.load_reward_hooks()()
    common = [p.replace(default=hooks.use_references) if p.name == "use_references" else p
              for p in _COMMON if p.name not in hooks.fixed]
    own = _own_parameters(hooks)
    scorer_params, open_kwargs = constructor_parameters(hooks.scorer_class(spec))
    var = inspect.Parameter("scorer_options", inspect.Parameter.VAR_KEYWORD) if open_kwargs else None
    signature = merged_signature(keyword_only(scorer_params), own, common, var_keyword=var)
    names = None if open_kwargs else frozenset(signature.parameters) | _COMMON_NAMES
    return signature, names


def _signature(cls: type) -> inspect.Signature:
    if cls.metric is None:
        return inspect.Signature([inspect.Parameter("metric", inspect.Parameter.POSITIONAL_ONLY), *_COMMON,
                                  inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)])
    return reward_parameters(cls.metric)[0]


class MetricReward(CaptionReward):
    """Any registered metric as a reward (TRL's reward-function contract), read from its spec.

    The value is the metric's headline score (the hooks may scale it, as the 0..100 judges' ``scale``),
    clipped into :meth:`value_range` and counted when outside; a sample that cannot be scored gets
    None with its reason logged. TRL logs it as ``rewards/<metric>/...``.

    Args:
        metric: a metric name or alias (:func:`capreward.registry.names`); the per-metric subclasses fix it.
        **options: the options of :class:`CaptionReward` (columns, ``use_references``, ``injection_guard``,
            ``scorer``, ``name`` ...), the metric's reward options and its scorer's options (``model``,
            ``backend``, ``idf`` ...): :meth:`signature_of` lists them.

    Raises:
        capreward.registry.UnknownMetric: no metric has that name.
        capreward.registry.UnknownOption: an option the reward and its scorer do not take (naming the
            nearest valid one).
        ValueError: the metric has no reward, or an option's value is refused.

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
    __signature__ = ClassSignature(_signature)

    def __init__(self, metric: str | None = None, /, **options: Any):
        fixed = type(self).metric
        if metric is None and fixed is None:
            raise TypeError("MetricReward() needs a metric name: MetricReward('emscore', ...)")
        if metric is not None and fixed is not None and registry.get(metric).name != registry.get(fixed).name:
            raise ValueError(f"{type(self).__name__} is the {fixed!r} reward; use MetricReward({metric!r}) for {metric!r}")
        spec = registry.get(metric or fixed)
        hooks: RewardHooks = spec.load_reward_hooks()()
        owner = type(self).__name__ if fixed is not None else f"MetricReward({spec.name!r})"
        names = reward_parameters(spec.name)[1]
        if names is not None:
            check_options(owner, options, names)
        own_names = [p.name for p in _own_parameters(hooks)]
        own = hooks.options(**{k: options.pop(k) for k in own_names if k in options})
        common = {k: options.pop(k) for k in _COMMON_NAMES if k in options}
        hooks.check(spec, own, options)
        common.setdefault("use_references", hooks.use_references)
        common.update(hooks.fixed)
        if fixed is None and common.get("name") is None:
            common["name"] = spec.name
        self.metric = spec.name
        self.hooks = hooks
        self.needs_visual = spec.visual_required(options)
        self.guard_injection = spec.judged_by_llm
        self.reason_kind = spec.unscored_kind
        for key, value in own.items():
            setattr(self, key, value)
        super().__init__(**common, **options)
        hooks.configure(self)

    @property
    def spec(self) -> registry.MetricSpec:
        """The metric's spec."""
        return registry.get(self.metric)

    @property
    def verdict_metrics(self) -> tuple[str, str] | None:
        """``(claims, false_claims)``: the two sub-scores holding this reward's verdict on a caption's
        claims (how many it checked, how many it found false), read by a `CompositeReward`'s
        ``verifier``; None when the metric gives no such verdict."""
        return getattr(self.hooks, "verdict_metrics", None)

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

    # -------------------------------------------------------------------- the hooks
    def _build(self) -> Any:
        return self.hooks.build(self)

    def value_range(self) -> tuple[float, float]:
        """The closed interval every value of this reward lies in (read from the metric's spec and
        options; values outside are clipped and counted).

        Returns:
            ``(low, high)``.
        """
        return self.hooks.value_range(self)

    def metric_names(self) -> tuple[str, ...]:
        """Every per-sample sub-score this reward can report (the metric's, then the common ones).

        Returns:
            The sub-score names.
        """
        return (*self.hooks.metric_names(self), *super().metric_names())

    def score_group(self, captions, visuals, kind, references, visual_ids) -> GroupScores:
        return self.hooks.score_group(self, captions, visuals, kind, references, visual_ids)

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        return self.hooks.compute(self, prompts, completions, kwargs)

    def score_inputs(self, inputs) -> RewardOutput:
        return self.hooks.score_inputs(self, inputs)

    def _call_group(self, samples, rows, kind, with_refs) -> GroupScores:
        return self.hooks.call_group(self, samples, rows, kind, with_refs)


__all__ = ["MetricReward", "reward_parameters"]
