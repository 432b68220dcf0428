"""A Goodhart monitor: score the samples the training reward scored with a held-out reward (and ground
truth where the dataset has it), log them beside the training reward, and warn when the training reward
rises while the held-out one falls.

An optimiser finds what its reward pays for; whether that is what you wanted shows only against a
judge it is not optimised on. :class:`GoodhartMonitor` keeps, per training step, the mean of the
training reward and of each held-out judge on the *same* samples, and :meth:`GoodhartMonitor.verdict`
compares the latest ``window`` steps with the first ``window`` steps of the run: when the training reward
rose by at least ``min_rise`` while a held-out judge fell (or rose by less than its ``follow``), it returns
a message naming the judge and both changes. Three ways in:

- **TRL** (``GRPOTrainer``, ``RLOOTrainer``: transformers trainers whose rewards are callables):
  ``trainer = GRPOTrainer(reward_funcs=[monitor.watch(reward)], callbacks=[GoodhartCallback(monitor)], ...)``.
  The watched reward returns exactly what ``reward`` returns; the held-out judges see the same prompts,
  completions and dataset columns.
- **transformers** ``Trainer`` (a custom RL loop in ``compute_loss``): call
  :meth:`GoodhartMonitor.observe` with each step's samples; :class:`GoodhartCallback` logs and warns.
- **Lightning**: :class:`~capreward.callbacks.goodhart_lightning.GoodhartLightningCallback` reads the
  captions and training rewards ``training_step`` returns.

Logged per step (TRL/transformers: into the trainer's logs; Lightning: ``pl_module.log``):
``goodhart/train``, ``goodhart/<judge>`` and ``goodhart/gap/<judge>`` (training minus held-out mean).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping, Sequence

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class GoodhartWarning(UserWarning):
    """The training reward rose while a held-out judge fell (a ``UserWarning``: ``warnings.simplefilter
    ("error", GoodhartWarning)`` stops a run on it).

    Examples:
        >>> import warnings
        >>> from capreward.callbacks import GoodhartWarning
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("reward up, truth down", GoodhartWarning)
        >>> caught[0].category is GoodhartWarning
        True
    """


def _judge_values(values: Any, n: int) -> list[float | None]:
    """A judge's answer as ``n`` floats (None: unscored). Raises ValueError for anything else (a judge's
    failure, which :meth:`GoodhartMonitor.observe` logs)."""
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__"):
        raise ValueError(f"expected a sequence of {n} numbers, got {type(values).__name__}")
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
        elif not isinstance(v, numbers.Real):
            raise ValueError(f"value {i} is not a number: {type(v).__name__}")
        else:
            out.append(float(v))
    return out


def _is_async(func: Any) -> bool:
    """Whether calling ``func`` returns a coroutine (a coroutine function, a partial of one, or an object
    whose ``__call__`` is one), as TRL decides it."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004 (a callable object's own __call__)


def _mean(values: Sequence[float | None]) -> float:
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.fmean(kept) if kept else math.nan


@dataclass
class GoodhartMonitor:
    """Per-step training reward beside held-out judges on the same samples, and the Goodhart verdict.

    Args:
        judges: name -> a judge of the TRL reward contract, called by keyword as TRL calls a reward,
            ``judge(prompts=..., completions=..., **columns)`` (the completions as text), returning one
            float (or None: unscored, left out of the mean) per completion; one that raises or returns
            anything else is logged and left empty for that batch (:meth:`observe`): a held-out
            reward model, an LLM judge, or ground truth computed from a dataset column (e.g.
            ``lambda prompts, completions, colour, **_: [float(right(c, k)) for c, k in zip(completions, colour)]``).
        window: steps averaged at the start of the run and at its latest end when comparing.
        min_rise: the training reward's rise (latest window mean minus first) that counts as rising.
        follow: how much a judge's mean must rise (same windows) while the training reward rises, or per
            judge name -> that amount (judges not named: 0.0). The default 0.0 flags a judge that fell;
            a positive value also flags one that stayed level (ground truth that does not move while the
            reward climbs: a blind policy exploiting the reward, as in the demo's earlier start).
        warn: called with the message when the verdict turns bad (default: ``warnings.warn`` with
            `GoodhartWarning`, and a log record); called again only after a good verdict.

    Examples:
        >>> m = GoodhartMonitor({"truth": lambda prompts, completions, **k: [float("red" in x) for x in completions]}, window=2, warn=print)
        >>> for captions, reward in [(["red", "red"], 0.1), (["red", "blue"], 0.2), (["blue", "red"], 0.6), (["blue", "blue"], 0.9)]:
        ...     _ = m.observe([reward] * 2, None, captions)
        ...     logs = m.flush()  # one training step (GoodhartCallback calls it at each log)
        Goodhart: the training reward rose 0.150 -> 0.750 over steps 1-2 -> 3-4 while truth fell 0.750 -> 0.250
        >>> sorted(logs)
        ['goodhart/gap/truth', 'goodhart/train', 'goodhart/truth']
    """

    judges: Mapping[str, Callable[..., Sequence[float | None]]]
    window: int = 8
    min_rise: float = 0.05
    follow: float | Mapping[str, float] = 0.0
    z: float = 0.0
    warn: Callable[[str], Any] | None = None
    rows: list[dict[str, float]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    alarms: list[tuple[int, str]] = field(default_factory=list)
    _pending: list[dict[str, float]] = field(default_factory=list, repr=False)
    _warned: bool = field(default=False, repr=False)

    def __post_init__(self):
        if not self.judges:
            raise ValueError("GoodhartMonitor needs at least one held-out judge")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        for name in self.judges:
            if name == "train" or "/" in name:
                raise ValueError(f"judge name {name!r} is reserved or contains '/'")

    # ------------------------------------------------------------------------ input
    def observe(self, train: Sequence[float | None], prompts: Any, completions: Sequence[Any], **columns: Any) -> dict[str, float]:
        """Record one batch: the training reward's values ``train`` for ``completions`` and every judge's
        scores of the same ``prompts``/``completions``/``columns``. Batches observed before the next
        `flush()` are one step.

        Each judge is called by keyword, as TRL calls a reward:
        ``judge(prompts=prompts, completions=completions, **columns)``. A judge that raises, or returns
        anything but one number (or None) per completion, is logged (a warning naming the judge and the
        reason, the first time and then every 100th time; :attr:`failures` counts them) and its entry for
        this batch is left empty (NaN, left out of the step's mean): an observer never stops training.

        Args:
            train: the training reward's values (None: unscored).
            prompts: the batch's prompts, as the reward received them.
            completions: the batch's completions.
            columns: the batch's other columns (images, ground truth...), passed to the judges.

        Returns:
            This batch's means (``train`` and each judge; NaN for a judge that failed).

        Raises:
            ValueError: ``train`` does not hold one value per completion (the caller's error, not a judge's).
        """
        if len(train) != len(completions):
            raise ValueError(f"{len(train)} training rewards for {len(completions)} completions")
        row = {"train": _mean(train), "n": float(len(completions))}
        for name, judge in self.judges.items():
            try:
                row[name] = _mean(_judge_values(judge(prompts=prompts, completions=completions, **columns), len(completions)))
            except Exception as exc:  # noqa: BLE001 (any failure of a held-out judge leaves its row empty)
                self._failed(name, exc)
                row[name] = math.nan
        self._pending.append(row)
        return row

    def _failed(self, name: str, exc: Exception) -> None:
        count = self.failures[name] = self.failures.get(name, 0) + 1
        if count == 1 or count % 100 == 0:
            logger.warning("Goodhart monitor: held-out judge %r failed (%d time%s so far; its entry is left empty): %s: %s",
                           name, count, "" if count == 1 else "s", type(exc).__name__, str(exc)[:300])

    def watch(self, reward: Callable[..., Any]) -> Callable[..., Any]:
        """Watch a TRL reward function.

        The watched reward forwards its arguments to ``reward`` exactly as it was called (TRL calls
        ``reward(prompts=..., completions=..., completion_ids=..., **columns)`` by keyword, so a reward
        written ``def f(prompts, completions, **kwargs)`` or ``def f(completions, **kwargs)`` works) and
        returns exactly what ``reward`` returned; then it :meth:`observe`-s the values beside the judges'
        scores of the same samples. Nothing the monitor does can fail the call: a failing judge is logged
        (:meth:`observe`), and so is any other error of the observation. An ``async`` reward (TRL awaits
        those concurrently) is watched by an ``async`` function.

        Args:
            reward: the training reward (TRL's contract).

        Returns:
            A reward function with ``reward``'s ``__name__`` (TRL logs it under the same name) and its
            ``components`` and ``guards`` when it has them.
        """
        monitor = self

        def observe(values: Any, args: tuple, kwargs: dict) -> None:
            try:
                from ..rewards import completion_text

                named = dict(zip(("prompts", "completions", "completion_ids"), args))
                named.update(kwargs)
                prompts, completions = named.pop("prompts", None), named.pop("completions")
                monitor.observe(list(values), prompts, [completion_text(c) for c in completions], **named)
            except Exception as exc:  # noqa: BLE001 (the observer never breaks training)
                monitor._failed("watch", exc)

        watched: Callable[..., Any]
        if _is_async(reward):
            async def watched_async(*args, **kwargs):
                values = await reward(*args, **kwargs)
                observe(values, args, kwargs)
                return values

            watched = watched_async
        else:
            def watched_sync(*args, **kwargs):
                values = reward(*args, **kwargs)
                observe(values, args, kwargs)
                return values

            watched = watched_sync
        watched.__name__ = getattr(reward, "__name__", type(reward).__name__)
        for attr in ("components", "guards"):
            if hasattr(reward, attr):
                setattr(watched, attr, getattr(reward, attr))
        return watched

    def flush(self, step: int | None = None) -> dict[str, float]:
        """Close the current step: the means over the batches observed since the last flush (weighted by
        their sizes) become one row; warns (:class:`GoodhartWarning`) if the verdict turned bad.

        Args:
            step: the training step (None: the number of this flush, from 1).

        Returns:
            The logs ``goodhart/train``, ``goodhart/<judge>`` and ``goodhart/gap/<judge>`` (empty when
            nothing was observed)."""
        if not self._pending:
            return {}
        pending, self._pending = self._pending, []
        row: dict[str, float] = {"step": float(step if step is not None else len(self.rows) + 1)}
        for key in ["train", *self.judges]:
            pairs = [(r[key], r["n"]) for r in pending if math.isfinite(r[key])]
            row[key] = sum(v * n for v, n in pairs) / sum(n for _, n in pairs) if pairs else math.nan
        self.record(row)
        logs = {"goodhart/train": row["train"]}
        for name in self.judges:
            logs[f"goodhart/{name}"] = row[name]
            logs[f"goodhart/gap/{name}"] = row["train"] - row[name]
        return logs

    def record(self, row: Mapping[str, float]) -> str | None:
        """Append one closed step (``step``, ``train`` and each judge's mean, as :meth:`flush` makes it, or
        as :attr:`rows` kept it: a run can be replayed under other settings) and evaluate the verdict:
        a verdict that turns bad is warned and added to :attr:`alarms`.

        Args:
            row: the step's means.

        Returns:
            The verdict (:meth:`verdict`).
        """
        self.rows.append({"step": float(row.get("step", len(self.rows) + 1)), "train": float(row["train"]),
                          **{name: float(row.get(name, math.nan)) for name in self.judges}})
        message = self.verdict()
        if message and not self._warned:
            self.alarms.append((int(self.rows[-1]["step"]), message))
            (self.warn or _default_warn)(message)
        self._warned = message is not None
        return message

    @property
    def fired(self) -> bool:
        """Whether the monitor raised an alarm at any step of the run so far (a run's end state: a collapse
        that the verdict caught mid-run stays caught)."""
        return bool(self.alarms)

    # ------------------------------------------------------------------------ verdict
    def changes(self) -> dict[str, tuple[float, float]] | None:
        """How each series moved.

        Returns:
            ``{"train" or judge: (first-window mean, latest-window mean)}``, or None before
            ``2 * window`` steps.
        """
        k = self.window
        if len(self.rows) < 2 * k:
            return None
        out = {}
        for key in ["train", *self.judges]:
            out[key] = (_mean([r[key] for r in self.rows[:k]]), _mean([r[key] for r in self.rows[-k:]]))
        return out

    def noise(self) -> dict[str, float] | None:
        """The standard error of each series' change (latest window mean minus first), from the spread of
        its step means within the two windows: ``sqrt(var_first / k + var_latest / k)``; None before
        ``2 * window`` steps. A series with fewer than two finite steps in a window has no spread (0)."""
        k = self.window
        if len(self.rows) < 2 * k:
            return None
        out = {}
        for key in ["train", *self.judges]:
            parts = []
            for rows in (self.rows[:k], self.rows[-k:]):
                values = [r[key] for r in rows if math.isfinite(r[key])]
                parts.append(statistics.variance(values) / len(values) if len(values) > 1 else 0.0)
            out[key] = math.sqrt(sum(parts))
        return out

    def verdict(self) -> str | None:
        """Whether the training reward is being gamed.

        The training reward *rose* when its change (first window -> latest) is at least ``min_rise`` and
        at least ``z`` standard errors (:meth:`noise`). A judge *followed* when its change less ``z`` of
        its standard errors is at least its ``follow`` (it rose that much beyond the noise); a judge with no
        value in a window says nothing.

        Returns:
            The warning text when the training reward rose while a judge did not follow (naming it, and
            whether it fell); None otherwise (and before ``2 * window`` steps).
        """
        ch, se = self.changes(), self.noise()
        if ch is None or se is None:
            return None
        t0, t1 = ch["train"]
        if not (t1 - t0 >= self.min_rise and t1 - t0 >= self.z * se["train"]):
            return None
        lagging = [(name, a, b) for name in self.judges for a, b in [ch[name]]
                   if math.isfinite(a) and math.isfinite(b) and b - a - self.z * se[name] < self._follow(name)]
        if not lagging:
            return None
        k, n = self.window, len(self.rows)
        steps = f"steps {self._label(0, k)} -> {self._label(n - k, n)}"
        judged = "; ".join(
            f"{name} fell {a:.3f} -> {b:.3f}" if b < a else
            f"{name} did not follow, {a:.3f} -> {b:.3f} (needs +{self._follow(name) + self.z * se[name]:.3f})"
            for name, a, b in lagging
        )
        return f"Goodhart: the training reward rose {t0:.3f} -> {t1:.3f} over {steps} while {judged}"

    def _follow(self, name: str) -> float:
        return float(self.follow.get(name, 0.0)) if isinstance(self.follow, Mapping) else float(self.follow)

    def _label(self, lo: int, hi: int) -> str:
        a, b = int(self.rows[lo]["step"]), int(self.rows[hi - 1]["step"])
        return f"{a}" if a == b else f"{a}-{b}"


def _default_warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, GoodhartWarning, stacklevel=3)


class GoodhartCallback(TrainerCallback):
    """A transformers ``TrainerCallback`` (TRL trainers included) that closes the monitor's step at
    each log and adds its ``goodhart/*`` values to that log (``trainer.state.log_history`` included); the
    monitor warns when the verdict turns bad. transformers calls callbacks in order and puts the
    ``report_to`` integrations first: :meth:`install` puts this one before them, so they log its values too.

    Args:
        monitor: the :class:`GoodhartMonitor` whose :meth:`~GoodhartMonitor.watch`-ed reward (TRL) or
            :meth:`~GoodhartMonitor.observe` calls (a custom loop) feed it.

    Examples:
        >>> callback = GoodhartCallback(GoodhartMonitor({"truth": lambda prompts, completions, **k: [1.0] * len(completions)}))
        >>> # trainer = GRPOTrainer(..., reward_funcs=[callback.monitor.watch(reward)]); callback.install(trainer)
    """

    def __init__(self, monitor: GoodhartMonitor):
        self.monitor = monitor

    def install(self, trainer: Any) -> GoodhartCallback:
        """Put this callback first in the trainer's callbacks (before the logging integrations, so they
        log its values).

        Args:
            trainer: a transformers or TRL trainer.

        Returns:
            This callback.
        """
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        values = self.monitor.flush(state.global_step)
        logs.update(values)
        last = state.log_history[-1] if state.log_history else None
        if values and last is not None and last.get("step") == state.global_step:
            last.update(values)  # Trainer.log appended a copy of ``logs`` just before calling on_log
