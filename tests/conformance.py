"""The conformance tester of registered metrics, in the spirit of torchmetrics' ``MetricTester``: one
:class:`MetricConformance` checks that a metric keeps the one contract every consumer relies on.

For a metric and a small case on its (tiny) model it checks:

- **declared == written**: the scorer's :class:`~capreward.scorers.contract.Scores` hold exactly the
  sub-scores the spec declares, with and without references (and a job's row exactly the fields
  :meth:`~capreward.registry.MetricSpec.fields` names);
- **range and direction**: every score lies in the spec's range for its configuration, and the case's
  right caption scores above its wrong one when the spec says higher is better (below otherwise);
- **batch and order invariance**: a caption scores the same alone, in its batch and in the batch reversed;
- **reward == Metric == job**: for the same inputs and configuration, the generic reward's values (its
  scale removed), the generic torchmetrics Metric's per-sample ``score`` and a ``capreward score`` job's
  field are the same numbers, and so are their sub-scores;
- **generic == named**: the class named for the metric, when there is one (``EMScoreReward``,
  ``FLEURMetric``), gives what the generic class gives, with the same signature;
- **pickling**: a reward pickles and gives the same values after (when its options pickle: a reward on an
  in-memory model cannot);
- **random streams**: a reward that loads its model on its first call (options naming a model, as a
  pickled reward rebuilds it) leaves torch's random generator as it was, so that attaching a reward, a
  judge or a monitor to a trainer does not change the trainer's later samples.

tests/test_conformance.py runs it over every registered metric on its tiny model. A metric added by a
plugin is checked the same way: build a :class:`ConformanceCase` on its model and call
:meth:`MetricConformance.check_all` (the "Adding a metric" guide, docs/adding-a-metric.md).
"""

from __future__ import annotations

import inspect
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

#: How close two scores of one caption must be to count as the same (batching changes float sums a little).
TOLERANCE = 1e-4


@dataclass
class ConformanceCase:
    """The inputs a metric is checked on.

    Args:
        metric: the metric's name.
        captions: a few captions; the first is right for its visual and the second wrong (for the
            direction check) unless ``ordered`` is False; an empty one checks the empty-caption path.
        images: one image per caption (paths, so a job reads the same bytes).
        references: one list of references per caption, or None (the checks run with and without them
            where the metric reads them).
        inputs: the metric's row inputs, one list each (QA utility's ``questions``).
        options: the scorer options that put it on its model (``model=`` or ``backend=``).
        ordered: whether the first caption must score above the second.
    """

    metric: str
    captions: list[str]
    images: list[Any]
    references: list[list[str]] | None = None
    inputs: dict[str, list[Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    ordered: bool = True


def _same(a: float, b: float, tol: float = TOLERANCE) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (not math.isnan(a) and not math.isnan(b) and abs(a - b) <= tol)


class _CaseJob:
    """What the job runner reads of a job (:class:`~capreward.jobs.runners.ManifestScorer`): the case's scorer."""

    def __init__(self, metric: str, scorer: Any):
        from types import SimpleNamespace

        self.options = SimpleNamespace(metrics=[metric], alignment=False)
        self._scorer = scorer

    def scorer_for(self, spec: Any) -> Any:
        return self._scorer

    def call_options(self, spec: Any, cls: Any = None) -> dict:
        """No job flags: the case's scorer is scored at its own options."""
        return {}


class MetricConformance:
    """Checks one registered metric against the contract (see the module); each ``check_*`` raises
    AssertionError naming the metric and what differs.

    Args:
        case: the inputs and the scorer options.
    """

    def __init__(self, case: ConformanceCase):
        from capreward import registry

        self.case = case
        self.spec = registry.get(case.metric)
        self._scorer: Any = None

    # ----------------------------------------------------------------------------------------- helpers
    @property
    def scorer(self) -> Any:
        """The scorer on the case's options (built once)."""
        if self._scorer is None:
            self._scorer = self.spec.load()(**self.case.options)
        return self._scorer

    def _where(self) -> str:
        return f"{self.spec.name}: "

    def reference_modes(self) -> list[bool]:
        """With references and without, as the metric's reference mode and the case allow.

        Returns:
            ``True`` (with references) and/or ``False``."""
        mode = self.spec.references_for(self.spec.config_of(self.scorer))
        if mode == "none" or self.case.references is None:
            return [False] if mode != "required" else []
        return [True] if mode == "required" else [True, False]

    def _scored(self, rows: list[int], with_refs: bool) -> Any:
        """The scorer's scores of the case's captions ``rows`` (non-empty captions only)."""
        case = self.case
        kwargs: dict[str, Any] = {"images": [case.images[i] for i in rows]}
        if with_refs:
            kwargs["references"] = [case.references[i] for i in rows]  # type: ignore[index]
        for key, values in case.inputs.items():
            kwargs[key] = [values[i] for i in rows]
        return self.scorer.scores([case.captions[i] for i in rows], **kwargs)

    def _rows(self) -> list[int]:
        return [i for i, c in enumerate(self.case.captions) if c.strip()]

    def _mode(self, with_refs: bool) -> dict[str, Any]:
        return {**self.spec.config_of(self.scorer), "visual": "image", "references": with_refs}

    def _reward_options(self) -> dict[str, Any]:
        """The generic reward's options that give the scorer's own configuration: the reward options a
        scorer reads per call at that call's default (EMScore's ``harmonic_mean="released"``)."""
        defaults = {name: p.default for name, p in inspect.signature(type(self.scorer).scores).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        return {o.name: defaults[o.name] for o in self.spec.reward_policy.options if o.name in defaults}

    # ------------------------------------------------------------------------------------------ checks
    def check_declared(self) -> None:
        """The scorer's sub-scores are those the spec declares, per reference mode; one entry each per caption."""
        for with_refs in self.reference_modes():
            out = self._scored(self._rows(), with_refs)
            out.check(self.spec.sub_scores_for(self._mode(with_refs)), self.spec.name)
            assert len(out) == len(self._rows()), f"{self._where()}{len(out)} scores for {len(self._rows())} captions"

    def check_range_and_direction(self) -> None:
        """Every score lies in the spec's range; the right caption scores above the wrong one (below for a
        metric where lower is better)."""
        for with_refs in self.reference_modes():
            mode = self._mode(with_refs)
            out = self._scored(self._rows(), with_refs)
            lo, hi = self.spec.value_range
            for s in out.score:
                assert math.isnan(s) or lo - TOLERANCE <= s <= hi + TOLERANCE, f"{self._where()}score {s} outside {lo, hi}"
            lo, hi = self.spec.range_of(mode)
            for v in out.value(self.spec.value_of(mode)):
                assert math.isnan(v) or lo - TOLERANCE <= v <= hi + TOLERANCE, f"{self._where()}value {v} outside {lo, hi}"
            if self.case.ordered:
                first, second = out.value(self.spec.value_of(mode))[:2]
                better = first > second if self.spec.higher_is_better else first < second
                assert better, f"{self._where()}the right caption scores {first}, the wrong one {second}"

    def check_batch_and_order(self) -> None:
        """A caption scores the same alone, in its batch and in the batch reversed (scores and numeric
        sub-scores)."""
        rows = self._rows()
        for with_refs in self.reference_modes():
            batch = self._scored(rows, with_refs)
            backward = self._scored(rows[::-1], with_refs)
            names = ["score", *(s for s in batch.sub_scores if self.spec.kind_of(s) != "data")]
            for k, i in enumerate(rows):
                alone = self._scored([i], with_refs)
                for name in names:
                    got = (batch.value(name)[k], backward.value(name)[len(rows) - 1 - k], alone.value(name)[0])
                    assert _same(got[0], got[1]) and _same(got[0], got[2]), \
                        f"{self._where()}{name} of caption {i}: batch {got[0]}, reversed {got[1]}, alone {got[2]}"

    def _reward_run(self, reward: Any) -> tuple[list, dict, dict]:
        case = self.case
        logged: dict = {}
        extra: dict = {}
        columns: dict[str, Any] = {"image": list(case.images), **{k: list(v) for k, v in case.inputs.items()}}
        if case.references is not None:
            columns["references"] = [list(r) for r in case.references]
        values = reward(None, list(case.captions), log_metric=logged.__setitem__, log_extra=extra.__setitem__, **columns)
        return values, logged, {k: [None if r is None else str(r) for r in v] for k, v in extra.items()}

    def _metric_run(self, metric: Any) -> dict[str, list[float]]:
        metric.update(list(self.case.captions), list(self.case.images), self.case.references,
                      **{k: list(v) for k, v in self.case.inputs.items()})
        return {k: v.tolist() for k, v in metric.compute().items()}

    def check_reward_metric_job(self) -> None:
        """The reward, the Metric and a job give the same numbers for the same inputs and configuration."""
        from capreward.jobs.manifest import ManifestRow
        from capreward.jobs.runners import metric_runner
        from capreward.rewards import MetricReward
        from capreward.torchmetrics import RegisteredMetric

        spec, case = self.spec, self.case
        reward = MetricReward(spec.name, scorer=self.scorer, **self._reward_options())
        values, logged, _ = self._reward_run(reward)
        metric = RegisteredMetric(spec.name, scorer=self.scorer, visual="image", per_sample=True) \
            if len(spec.visuals) > 1 else RegisteredMetric(spec.name, scorer=self.scorer, per_sample=True)
        columns = self._metric_run(metric)
        job_rows = [ManifestRow(f"r{i}", c, "image", str(case.images[i]),
                                case.references[i] if case.references is not None else None,
                                {k: v[i] for k, v in case.inputs.items()}) for i, c in enumerate(case.captions)]
        rows = self._rows()
        fields = metric_runner(spec, _CaseJob(spec.name, self.scorer))([job_rows[i] for i in rows])
        with_refs = case.references is not None and spec.references_for(spec.config_of(self.scorer)) != "none"
        mode = self._mode(with_refs)
        value = spec.value_of(mode)
        scale = getattr(reward, spec.reward_policy.scale) if spec.reward_policy.scale else 1.0
        for k, i in enumerate(rows):
            got = values[i] / scale if values[i] is not None else math.nan
            want = columns["per_sample/score"][i]
            assert _same(got, want), f"{self._where()}caption {i}: reward {got}, Metric {want}"
            field_ = spec.name if value == "score" else spec.field_of(value)
            job = fields[k].get(field_)
            assert _same(got, math.nan if job is None else float(job)), f"{self._where()}caption {i}: reward {got}, job {job}"
            written = set(fields[k]) - {"_error"}
            if "_error" not in fields[k] or spec.name in fields[k]:
                assert written == set(spec.fields(mode)), f"{self._where()}job fields {sorted(written)}, declared {spec.fields(mode)}"
            for sub in spec.sub_scores_for(mode):
                if spec.kind_of(sub) == "data" or f"per_sample/{sub}" not in columns:
                    continue
                job_sub = fields[k].get(spec.field_of(sub))
                assert _same(columns[f"per_sample/{sub}"][i], math.nan if job_sub is None else float(job_sub)), \
                    f"{self._where()}{sub} of caption {i}: Metric {columns[f'per_sample/{sub}'][i]}, job {job_sub}"
        for sub in spec.sub_scores_for(mode):
            key = f"rewards/{spec.name}/{sub}"
            if spec.kind_of(sub) != "data":
                assert key in logged or all(v is None for v in values), f"{self._where()}the reward logs no {sub}"

    def check_named_equals_generic(self) -> None:
        """The class named for the metric (reward, Metric) gives what the generic class gives."""
        from capreward.rewards import MetricReward
        from capreward.torchmetrics import RegisteredMetric
        from capreward.torchmetrics import judges, metrics  # noqa: F401  (the named Metric classes)

        spec = self.spec
        named = MetricReward.named.get(spec.name)
        if named is not None:
            assert inspect.signature(named) == MetricReward.signature_of(spec.name), f"{self._where()}reward signatures differ"
            a, b = named(scorer=self.scorer), MetricReward(spec.name, scorer=self.scorer)
            assert a.__name__ == b.__name__ == spec.name and a.metric_names() == b.metric_names()
            assert a.value_range() == b.value_range(), f"{self._where()}{a.value_range()} != {b.value_range()}"
            assert self._reward_run(a) == self._reward_run(b), f"{self._where()}the named reward differs from MetricReward"
        named_metric = RegisteredMetric.named.get(spec.name)
        if named_metric is not None:
            assert inspect.signature(named_metric) == RegisteredMetric.signature_of(spec.name)
            visual = {"visual": "image"} if len(spec.visuals) > 1 else {}
            a = named_metric(scorer=self.scorer, per_sample=True, sub_scores=True, **visual)
            b = RegisteredMetric(spec.name, scorer=self.scorer, per_sample=True, sub_scores=True, **visual)
            assert a.name == b.name and a.columns == b.columns == type(a).columns
            ra, rb = self._metric_run(a), self._metric_run(b)
            assert ra.keys() == rb.keys() and all(_list_same(ra[k], rb[k]) for k in ra), \
                f"{self._where()}the named Metric differs from RegisteredMetric"

    def check_pickling(self) -> None:
        """A reward built from the case's options pickles (its scorer is rebuilt after) and scores the same;
        skipped when the options do not pickle (an in-memory model)."""
        from capreward.rewards import MetricReward

        try:
            pickle.dumps(self.case.options)
        except Exception:  # noqa: BLE001 - an in-memory model: the reward cannot travel either
            return
        reward = MetricReward(self.spec.name, **self.case.options)
        before = self._reward_run(reward)
        copy = pickle.loads(pickle.dumps(reward))
        assert type(copy) is MetricReward and copy._scorer is None, f"{self._where()}the scorer travelled with the reward"
        assert _runs_same(self._reward_run(copy), before), f"{self._where()}a pickled reward scores differently"

    def check_random_streams(self) -> None:
        """A reward's first call, which builds its scorer and loads its model, draws nothing from torch's
        global generator (the loaded layers were initialised before their weights were read); skipped
        when the options do not pickle (an in-memory model is built already)."""
        import torch

        from capreward.rewards import MetricReward

        try:
            pickle.dumps(self.case.options)
        except Exception:  # noqa: BLE001 - an in-memory model: nothing is loaded on the first call
            return
        reward = MetricReward(self.spec.name, **self.case.options)
        state = torch.get_rng_state()
        self._reward_run(reward)
        assert reward._scorer is not None and torch.equal(state, torch.get_rng_state()), \
            f"{self._where()}loading the reward's model moved torch's random generator"

    def check_all(self) -> list[str]:
        """Run every check; returns the names of the checks run (AssertionError on the first that fails).

        Returns:
            The checks' names, in order.
        """
        checks: list[tuple[str, Callable[[], None]]] = [
            ("declared sub-scores", self.check_declared), ("range and direction", self.check_range_and_direction),
            ("batch and order", self.check_batch_and_order), ("reward, Metric and job", self.check_reward_metric_job),
            ("named and generic", self.check_named_equals_generic), ("pickling", self.check_pickling),
            ("random streams", self.check_random_streams)]
        for _, check in checks:
            check()
        return [name for name, _ in checks]


def _list_same(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_list_same(x, y) for x, y in zip(a, b))
    return _same(float(a), float(b), 0.0)


def _runs_same(a: tuple, b: tuple) -> bool:
    values_a, logged_a, extra_a = a
    values_b, logged_b, extra_b = b
    return (_list_same([math.nan if v is None else v for v in values_a], [math.nan if v is None else v for v in values_b])
            and logged_a.keys() == logged_b.keys() and all(_same(logged_a[k], logged_b[k], 0.0) for k in logged_a)
            and extra_a == extra_b)


__all__ = ["ConformanceCase", "MetricConformance"]
