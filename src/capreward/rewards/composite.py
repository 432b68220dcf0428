"""A weighted sum of rewards plus guard penalties against reward hacking, as one TRL reward function."""

from __future__ import annotations

import inspect
import math
from typing import Any, cast
from collections.abc import Callable, Sequence

from ..caption_budget import caption_problem
from ..errors import SampleError, common_kind, sample_failure
from .base import AsyncReward, RewardFunction, RewardOutput, clip_to_range
from .guards import Guards
from .inputs import completion_text

ON_NONE = ("floor", "renormalize", "none")


def _callable_name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


class CompositeReward(RewardFunction):
    """``Σ_c w_c · r_c + Σ_g guard_g`` per completion.

    Args:
        components: ``[(reward, weight), ...]`` (a bare reward means weight 1). A reward is a capreward
            `RewardFunction` or any synchronous TRL-style reward function; a plain function's
            range can be given as a third item, ``(func, weight, (lo, hi))``, so that ``on_none`` can
            floor it. A component value that is None, NaN or ±inf counts as missing (never reaches
            the trainer).
        guards: a `Guards` (default: repetition, truncation and
            over-length, weight 1 each) or None for no guards.
        on_none: what a missing component does to its sample (None when every component is missing,
            whatever the policy). A missing judgment never lifts a sample above what it would get
            with that component scored at the bottom of its range (a caption that breaks a judge's
            answer must not pay):

            - ``"floor"`` (default): the component counts at the bottom of its range (``w · lo``;
              ``w · hi`` for an inverted, negative weight). A judge that cannot answer for a whole
              group shifts the group by a constant, so the other components still rank it.
            - ``"renormalize"``: the remaining weighted sum scaled by Σ|w| / Σ_valid |w| (the reward
              keeps its scale), but never above the ``"floor"`` value.
            - ``"none"``: the composite is None for that sample (the reason names the component).
              A component that is None for every sample (a judge that cannot answer) then makes the
              whole batch None and a GRPO step trains on nothing (TRL sums NaN away to 0).

            A missing component whose range is unknown (a plain function given without one) makes
            the sample None under every policy, with a reason saying how to give the range.
        allow_negative_weights: weights must be finite and > 0 unless this is True; a negative
            weight then inverts its component (``(-1) · EMScore`` rewards a worse caption), and its
            floor is the top of the component's range.
        name: the TRL name (``__name__``), default ``"composite"``.
        log_subscores: log every component's batch mean as ``rewards/<name>/<component>``, each guard
            term as ``rewards/<name>/guard/<term>`` (weighted) and the components' own sub-scores as
            ``rewards/<name>/<component>/<sub>``.
        verifier: the component whose verdict on a caption's claims gates the others (the reward
            contract, docs/design/reward-contract.md): a caption that makes no claim the verifier can
            check, or one it finds false, is paid nothing by the other components (each counts at the
            bottom of its range, as ``on_none="floor"`` counts a missing one), so a vague caption, a
            hedge and a wrong guess earn no similarity credit over each other and the verifier's own
            price ranks them. A missing verdict closes the gate too (never worth more than a scored
            one). ``"auto"`` (default): the first component that gives a verdict (a reward with
            ``verdict_metrics``, as `HallucinationPenalty`), when every other component has a known range;
            a component's label to name it; None: no gate (every component pays independently).

    Raises:
        ValueError: a bad weight, range or ``on_none``; a ``verifier`` that names no component giving a
            verdict, or gates a component without a known range.

    Returns (per completion) a float or None in `value_range()`: the weighted sum of the
    components' ranges plus [-Σ guard weights, 0] when every component is a capreward reward (each
    keeps its own range); values outside (``renormalize`` scales the valid components up) are clipped
    and counted as ``clipped``. With a plain function as a component the composite promises no range.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import CLIPScoreReward, CompositeReward, Guards, HallucinationPenalty
        >>> reward = CompositeReward([(CLIPScoreReward(model=clip), 1.0), (HallucinationPenalty(model=clip), 0.5)],
        ...                          guards=Guards())
        >>> right, wrong, repeated = reward(None, ["a red image.", "a blue image.", "a red red red red image."], image=[red] * 3)
        >>> right > repeated > wrong                     # the repetition guard costs the repeated caption
        True
        >>> vague, hedge, wrong = reward(None, ["an image.", "a red blue image.", "a blue image."], image=[red] * 3)
        >>> right > hedge == wrong > vague               # the contract: no similarity credit without a verified claim
        True
    """

    __name__ = "composite"

    def __init__(
        self,
        components: Sequence[tuple[Callable, float] | Callable],
        guards: Guards | None = Guards(),  # noqa: B008 (a frozen dataclass: one shared default is safe)
        on_none: str = "floor",
        name: str | None = None,
        log_subscores: bool = True,
        allow_negative_weights: bool = False,
        verifier: str | None = "auto",
    ):
        super().__init__(name=name, log_subscores=log_subscores)
        if on_none not in ON_NONE:
            raise ValueError(f"on_none must be one of {ON_NONE}, got {on_none!r}")
        if not components:
            raise ValueError("a composite needs at least one component reward")
        self.components: list[tuple[str, Callable, float]] = []
        self.ranges: list[tuple[float, float] | None] = []  # per component, its declared range
        seen: dict[str, int] = {}
        for k, item in enumerate(components):
            given_range = None
            if isinstance(item, tuple) and len(item) == 3:
                func, weight, given_range = item
            elif isinstance(item, tuple) and len(item) == 2:
                func, weight = item
            elif isinstance(item, tuple):
                raise ValueError(f"components[{k}] must be reward, (reward, weight) or (reward, weight, (lo, hi))")
            else:
                func, weight = item, 1.0
            if isinstance(func, AsyncReward):
                func = func.reward  # the composite runs its parts in turn; wrap the composite instead
            if not callable(func):
                raise TypeError(f"components[{k}] is not callable: {type(func).__name__}")
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004
                raise TypeError(f"components[{k}] is async; use sync components and CompositeReward(...).as_async()")
            base = _callable_name(func)
            weight = _check_weight(k, base, weight, allow_negative_weights)
            seen[base] = seen.get(base, 0) + 1
            label = base if seen[base] == 1 else f"{base}_{seen[base]}"
            self.components.append((label, func, weight))
            self.ranges.append(_component_range(k, base, func, given_range))
        self.guards = guards
        self.on_none = on_none
        self.verifier = self._find_verifier(verifier)

    def _find_verifier(self, verifier: str | None) -> int | None:
        """The index of the gating component (see ``verifier``), or None."""
        if verifier is None:
            return None
        if not isinstance(verifier, str):
            raise ValueError(f"verifier must be 'auto', a component label or None, got {verifier!r}")
        labels = [label for label, _, _ in self.components]
        if verifier == "auto":
            found = [k for k, (_, f, _) in enumerate(self.components) if _verdict_metrics(f) is not None]
            if not found or any(r is None for k, r in enumerate(self.ranges) if k != found[0]):
                return None
            return found[0]
        if verifier not in labels:
            raise ValueError(f"verifier {verifier!r} is not a component label; the labels are {labels}")
        k = labels.index(verifier)
        if _verdict_metrics(self.components[k][1]) is None:
            raise ValueError(f"verifier {verifier!r} gives no verdict on claims (no verdict_metrics)")
        unranged = [labels[j] for j, r in enumerate(self.ranges) if r is None and j != k]
        if unranged:
            raise ValueError(f"verifier {verifier!r} cannot gate {unranged}: give their ranges as (func, weight, (lo, hi))")
        return k

    def load_models(self) -> CompositeReward:
        for _, func, _ in self.components:
            if isinstance(func, RewardFunction):
                func.load_models()
        return self

    def value_range(self) -> tuple[float, float] | None:
        """Σ_c w_c · range_c + the guards' range, or None when a component has no known range."""
        lo = hi = 0.0
        for (_, _, w), part in zip(self.components, self.ranges):
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
        own `metric_names()`; ``guard/<term>`` per enabled guard; ``clipped``."""
        names: list[str] = []
        for label, func, _ in self.components:
            names.append(label)
            if isinstance(func, RewardFunction):
                names.extend(f"{label}/{key}" for key in func.metric_names())
        if self.verifier is not None:
            names.append("verified")
        if self.guards is not None:
            names.extend(f"guard/{term}" for term in self.guards.weights())
        return (*names, *super().metric_names())

    def _verified(self, parts: list[tuple[str, float, RewardOutput]], n: int) -> list[bool]:
        """Per sample, whether the verifier vouches for it: scored, with at least one claim and no false
        one (all True without a verifier)."""
        if self.verifier is None:
            return [True] * n
        keys = _verdict_metrics(self.components[self.verifier][1])
        assert keys is not None  # the verifier's names were checked when it was chosen
        claims_key, false_key = keys
        out = parts[self.verifier][2]
        claims = out.metrics.get(claims_key, [math.nan] * n)
        false = out.metrics.get(false_key, [math.nan] * n)
        return [out.values[i] is not None and claims[i] > 0 and false[i] == 0 for i in range(n)]

    def _component_output(self, func: Callable, prompts, completions, kwargs) -> RewardOutput:
        if isinstance(func, RewardFunction):
            return func.compute(prompts, completions, **kwargs)
        values = list(func(prompts=prompts, completions=completions, **kwargs))
        if len(values) != len(completions):
            raise ValueError(f"{_callable_name(func)} returned {len(values)} values for {len(completions)} completions")
        return _finite_only(RewardOutput([None if v is None else float(v) for v in values], [None] * len(values)))

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        """Score every component, combine, add the guards. Returns a `RewardOutput` whose
        metrics hold each component's raw values and each weighted guard term.

        With the injection guard on (``guards.injection > 0``), a caption the detector flags is also
        scored, by every component and guard, without its suspect segments
        (:func:`~capreward.rewards.suspects.without_suspects`; extra rows of the same calls) and keeps
        the lower total; with nothing left, the bottom of :meth:`value_range`. The ``guard/injection``
        term is what that took off (0 for an unflagged caption)."""
        kwargs.pop("completion_ids", None)
        n = len(completions)
        stripped = self._without_suspects(completions)
        owners = [i for i, text in enumerate(stripped) if text]
        if owners:
            prompts = None if prompts is None else [*prompts, *(prompts[i] for i in owners)]
            kwargs = {k: _extended(v, n, owners) for k, v in kwargs.items()}
            completions = [*completions, *(stripped[i] for i in owners)]
        out = self._combine(prompts, completions, kwargs)
        if self.guards is not None and self.guards.injection:
            _keep_lower_of_stripped(out, stripped, owners, n, self.value_range())
        return self.with_metric_names(clip_to_range(out, self.value_range()))

    def _without_suspects(self, completions: Sequence[Any]) -> list[str | None]:
        """Per completion, the caption without its suspect segments when the injection guard is on and
        the detector flags it (``""``: nothing left), else None."""
        from .suspects import without_suspects

        if self.guards is None or not self.guards.injection:
            return [None] * len(completions)
        out: list[str | None] = []
        for i, completion in enumerate(completions):
            try:
                text = completion_text(completion, i)
            except TypeError:
                out.append(None)
                continue
            left = without_suspects(text)
            out.append(None if left is None else left.strip())
        return out

    def _combine(self, prompts: Sequence[Any] | None, completions: Sequence[Any], kwargs: dict) -> RewardOutput:
        """The weighted sum and the guard terms of every completion (no injection folding, no clipping)."""
        n = len(completions)
        parts = [
            (label, w, _finite_only(self._component_output(f, prompts, completions, kwargs)))
            for label, f, w in self.components
        ]
        metrics: dict[str, list[float]] = {}
        for label, _, out in parts:
            metrics[label] = [math.nan if v is None else v for v in out.values]
            for key, column in out.metrics.items():
                metrics[f"{label}/{key}"] = column

        values: list[float | None] = [None] * n
        reasons: list[str | None] = [None] * n
        total_weight = sum(abs(w) for _, w, _ in parts)
        verified = self._verified(parts, n)
        if self.verifier is not None:
            metrics["verified"] = [float(v) for v in verified]
        for i in range(n):
            missing = [(k, label, out.reasons[i]) for k, (label, _, out) in enumerate(parts) if out.values[i] is None]
            # an unverified caption: every component but the verifier counts at the bottom of its range
            valid: list[tuple[float, float]] = [
                (w, cast(float, out.values[i]) if verified[i] or k == self.verifier else _bottom(w, self.ranges[k]) / w)
                for k, (_, w, out) in enumerate(parts) if out.values[i] is not None]
            if missing and (self.on_none == "none" or not valid):
                text = "; ".join(f"{label}: {why or 'no score'}" for _, label, why in missing)
                reasons[i] = SampleError(i, common_kind([why for _, _, why in missing]), "", text)
                continue
            unranged = [label for k, label, _ in missing if self.ranges[k] is None]
            if unranged:
                reasons[i] = "; ".join(
                    f"{label}: {why or 'no score'} (no range to floor it to: give the component as "
                    f"(func, weight, (lo, hi)))" for _, label, why in missing if label in unranged
                )
                continue
            scored = sum(w * v for w, v in valid)
            floor = scored + sum(_bottom(parts[k][1], self.ranges[k]) for k, _, _ in missing)
            if missing and self.on_none == "renormalize":
                scale = total_weight / sum(abs(w) for w, _ in valid)
                total = min(scale * scored, floor)
            else:
                total = floor
            values[i] = total
            if not math.isfinite(total):  # huge weights can overflow; never pass ±inf on
                values[i], reasons[i] = None, SampleError(i, "non_finite", "", f"the weighted sum is not finite ({total})")

        if self.guards is not None:
            for i, completion in enumerate(completions):
                try:
                    text = completion_text(completion, i)
                except TypeError:
                    text = ""
                if (over := caption_problem(text)) is not None:  # never read by a guard: None and the reason
                    values[i], reasons[i] = None, SampleError(i, "input", f"completions[{i}]", over, " ")
                    continue
                try:  # a target-conditioned length guard reads the sample's target from its columns
                    limit = self.guards.max_words_for(kwargs, i)
                except (ValueError, TypeError, IndexError) as exc:
                    why = SampleError(i, "input", f"completions[{i}]", f"length guard: {exc}")
                    if reasons[i] is not None:
                        why = SampleError(i, common_kind([reasons[i], why]), "", f"{reasons[i]}; {why}")
                    values[i], reasons[i] = None, why
                    limit = None
                for term, value in self.guards.terms(text, max_words=limit, injection=False).items():
                    metrics.setdefault(f"guard/{term}", [math.nan] * n)[i] = value
                    if (before := values[i]) is not None:
                        values[i] = before + value
                if self.guards.injection:
                    metrics.setdefault("guard/injection", [math.nan] * n)[i] = 0.0
        return RewardOutput(values, reasons, metrics)

    def all_none_hint(self) -> str:
        if self.on_none == "none":
            return ("with on_none='none' one component that cannot answer makes every sample None; "
                    "CompositeReward(..., on_none='floor') (the default) scores the sample from the others")
        return "no component scored these samples: see the reasons"


def _extended(column: Any, n: int, owners: list[int]) -> Any:
    """A dataset column (a list with one entry per completion) with the entries of ``owners`` appended
    (the extra rows of their stripped captions); anything else unchanged."""
    if isinstance(column, (list, tuple)) and len(column) == n:
        return [*column, *(column[i] for i in owners)]
    return column


def _keep_lower_of_stripped(out: RewardOutput, stripped: list[str | None], owners: list[int], n: int,
                            value_range: tuple[float, float] | None) -> None:
    """Fold the extra rows ``n..`` (row ``n + k``: completion ``owners[k]`` without its suspect segments)
    into ``out``, in place: a flagged completion keeps the lower total (the bottom of the range when
    nothing is left or its stripped row has no value); ``guard/injection`` holds what that took off.
    Truncates to ``n`` rows."""
    injection = out.metrics.setdefault("guard/injection", [0.0] * len(out.values))
    for i in range(n):
        full = out.values[i]
        if stripped[i] is None or full is None:
            continue
        if stripped[i] == "":
            low = value_range[0] if value_range is not None else None
        else:
            j = n + owners.index(i)
            low = out.values[j] if out.values[j] is not None else (value_range[0] if value_range is not None else None)
        if low is None:
            out.values[i], out.reasons[i] = None, SampleError(i, "input", f"completions[{i}]",
                                                              "flagged as forged prompt structure, and no range to floor it to")
        elif low < full:
            out.values[i] = low
            injection[i] = low - full
    del out.values[n:], out.reasons[n:]
    for column in out.metrics.values():
        del column[n:]


def _verdict_metrics(func: Any) -> tuple[str, str] | None:
    """A component's ``verdict_metrics`` (``(claims, false_claims)`` sub-score names), or None."""
    keys = getattr(func, "verdict_metrics", None)
    if isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys):
        return keys
    return None


def _check_weight(k: int, name: str, weight: Any, allow_negative: bool) -> float:
    """``weight`` as a float; ValueError naming the component unless finite and > 0 (or < 0 with
    ``allow_negative``)."""
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"components[{k}] ({name}): the weight must be a number, got {weight!r}") from None
    if not math.isfinite(w):
        raise ValueError(f"components[{k}] ({name}): the weight must be finite, got {weight!r}")
    if w == 0:
        raise ValueError(f"components[{k}] ({name}): a weight of 0 adds nothing; drop the component")
    if w < 0 and not allow_negative:
        raise ValueError(
            f"components[{k}] ({name}): negative weight {weight!r} inverts the reward (a worse caption scores "
            "higher); pass allow_negative_weights=True if that is what you want"
        )
    return w


def _component_range(k: int, name: str, func: Any, given: Any) -> tuple[float, float] | None:
    """The component's range: the given ``(lo, hi)`` (checked), else a capreward reward's own, else None."""
    if given is None:
        return func.value_range() if isinstance(func, RewardFunction) else None
    try:
        lo, hi = (float(x) for x in given)
    except (TypeError, ValueError):
        raise ValueError(f"components[{k}] ({name}): the range must be (lo, hi), got {given!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"components[{k}] ({name}): the range must be finite with lo <= hi, got {given!r}")
    if isinstance(func, RewardFunction) and func.value_range() is not None and func.value_range() != (lo, hi):
        raise ValueError(f"components[{k}] ({name}) states its own range {func.value_range()}; do not give another")
    return (lo, hi)


def _bottom(weight: float, value_range: tuple[float, float] | None) -> float:
    """The least a component can contribute: ``w · lo`` (``w · hi`` for a negative weight)."""
    assert value_range is not None  # callers floor only the components whose range was checked
    return min(weight * value_range[0], weight * value_range[1])


def _finite_only(out: RewardOutput) -> RewardOutput:
    """``out`` with every NaN or ±inf value made None (in place), the reason saying which."""
    for i, v in enumerate(out.values):
        if v is None:
            if out.reasons[i] is None:
                out.reasons[i] = SampleError(i, "scorer", "", "returned None")
        elif not math.isfinite(v):
            out.values[i] = None
            out.reasons[i] = sample_failure(i, v, out.reasons[i], non_finite="returned a non-finite value ({value})")
    return out
