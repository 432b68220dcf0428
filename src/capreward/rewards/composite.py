"""A weighted sum of rewards plus guard penalties against reward hacking, as one TRL reward function."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

from .base import AsyncReward, RewardFunction, RewardOutput, clip_to_range
from .guards import Guards
from .inputs import completion_text

ON_NONE = ("none", "renormalize")


def _callable_name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


class CompositeReward(RewardFunction):
    """``Σ_c w_c · r_c + Σ_g guard_g`` per completion.

    Args:
        components: ``[(reward, weight), ...]`` (a bare reward means weight 1). A reward is a capreward
            :class:`RewardFunction` or any synchronous TRL-style reward function.
        guards: a :class:`~capreward.rewards.guards.Guards` (default: repetition, truncation and
            over-length, weight 1 each) or None for no guards.
        on_none: what a None from a component does. ``"none"``: the composite is None for that sample
            (the reason names the component). ``"renormalize"``: the component is dropped for that
            sample and the remaining weighted sum is scaled by Σ|w| / Σ_valid |w|, so the reward keeps
            its scale; None only when every component is None.
        name: the TRL name (``__name__``), default ``"composite"``.
        log_subscores: log every component's batch mean as ``rewards/<name>/<component>``, each guard
            term as ``rewards/<name>/guard/<term>`` (weighted) and the components' own sub-scores as
            ``rewards/<name>/<component>/<sub>``.

    Returns (per completion) a float or None in :meth:`value_range`: the weighted sum of the
    components' ranges plus [-Σ guard weights, 0] when every component is a capreward reward (each
    keeps its own range); values outside (``renormalize`` scales the valid components up) are clipped
    and counted as ``clipped``. With a plain function as a component the composite promises no range.
    """

    __name__ = "composite"

    def __init__(
        self,
        components: Sequence[tuple[Callable, float] | Callable],
        guards: Guards | None = Guards(),
        on_none: str = "none",
        name: str | None = None,
        log_subscores: bool = True,
    ):
        super().__init__(name=name, log_subscores=log_subscores)
        if on_none not in ON_NONE:
            raise ValueError(f"on_none must be one of {ON_NONE}, got {on_none!r}")
        if not components:
            raise ValueError("a composite needs at least one component reward")
        self.components: list[tuple[str, Callable, float]] = []
        seen: dict[str, int] = {}
        for k, item in enumerate(components):
            func, weight = item if isinstance(item, tuple) else (item, 1.0)
            if isinstance(func, AsyncReward):
                func = func.reward  # the composite runs its parts in turn; wrap the composite instead
            if not callable(func):
                raise TypeError(f"components[{k}] is not callable: {type(func).__name__}")
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):
                raise TypeError(f"components[{k}] is async; use sync components and CompositeReward(...).as_async()")
            if not math.isfinite(float(weight)):
                raise ValueError(f"components[{k}] has a non-finite weight {weight!r}")
            base = _callable_name(func)
            seen[base] = seen.get(base, 0) + 1
            label = base if seen[base] == 1 else f"{base}_{seen[base]}"
            self.components.append((label, func, float(weight)))
        self.guards = guards
        self.on_none = on_none

    def load_models(self) -> "CompositeReward":
        for _, func, _ in self.components:
            if isinstance(func, RewardFunction):
                func.load_models()
        return self

    def value_range(self) -> tuple[float, float] | None:
        """Σ_c w_c · range_c + the guards' range, or None when a component has no known range."""
        lo = hi = 0.0
        for _, func, w in self.components:
            part = func.value_range() if isinstance(func, RewardFunction) else None
            if part is None:
                return None
            lo += min(w * part[0], w * part[1])
            hi += max(w * part[0], w * part[1])
        if self.guards is not None:
            for weight in self.guards.weights().values():
                lo += min(0.0, -weight)
                hi += max(0.0, -weight)
        return (lo, hi)

    def metric_names(self) -> tuple[str, ...]:
        """Per component (named by its label): its value and ``<label>/<sub-score>`` for each of its
        own :meth:`~RewardFunction.metric_names`; ``guard/<term>`` per enabled guard; ``clipped``."""
        names: list[str] = []
        for label, func, _ in self.components:
            names.append(label)
            if isinstance(func, RewardFunction):
                names.extend(f"{label}/{key}" for key in func.metric_names())
        if self.guards is not None:
            names.extend(f"guard/{term}" for term in self.guards.weights())
        return (*names, *super().metric_names())

    def _component_output(self, func: Callable, prompts, completions, kwargs) -> RewardOutput:
        if isinstance(func, RewardFunction):
            return func.compute(prompts, completions, **kwargs)
        values = list(func(prompts=prompts, completions=completions, **kwargs))
        if len(values) != len(completions):
            raise ValueError(f"{_callable_name(func)} returned {len(values)} values for {len(completions)} completions")
        clean = [None if v is None or math.isnan(float(v)) else float(v) for v in values]
        return RewardOutput(clean, [None if v is not None else "returned None" for v in clean])

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        """Score every component, combine, add the guards. Returns a :class:`RewardOutput` whose
        metrics hold each component's raw values and each weighted guard term."""
        kwargs.pop("completion_ids", None)
        n = len(completions)
        parts = [(label, w, self._component_output(f, prompts, completions, kwargs)) for label, f, w in self.components]
        metrics: dict[str, list[float]] = {}
        for label, _, out in parts:
            metrics[label] = [math.nan if v is None else v for v in out.values]
            for key, column in out.metrics.items():
                metrics[f"{label}/{key}"] = column

        values: list[float | None] = [None] * n
        reasons: list[str | None] = [None] * n
        total_weight = sum(abs(w) for _, w, _ in parts)
        for i in range(n):
            missing = [(label, out.reasons[i]) for label, _, out in parts if out.values[i] is None]
            valid = [(w, out.values[i]) for _, w, out in parts if out.values[i] is not None]
            if missing and (self.on_none == "none" or not valid):
                reasons[i] = "; ".join(f"{label}: {why or 'no score'}" for label, why in missing)
                continue
            valid_weight = sum(abs(w) for w, _ in valid)
            scale = total_weight / valid_weight if missing and valid_weight > 0 else 1.0
            values[i] = scale * sum(w * v for w, v in valid)

        if self.guards is not None:
            for i, completion in enumerate(completions):
                try:
                    text = completion_text(completion, i)
                except TypeError:
                    text = ""
                try:  # a target-conditioned length guard reads the sample's target from its columns
                    limit = self.guards.max_words_for(kwargs, i)
                except (ValueError, TypeError, IndexError) as exc:
                    why = f"completions[{i}]: length guard: {exc}"
                    values[i], reasons[i] = None, why if reasons[i] is None else f"{reasons[i]}; {why}"
                    limit = None
                for term, value in self.guards.terms(text, max_words=limit).items():
                    metrics.setdefault(f"guard/{term}", [math.nan] * n)[i] = value
                    if values[i] is not None:
                        values[i] += value
        return self.with_metric_names(clip_to_range(RewardOutput(values, reasons, metrics), self.value_range()))
