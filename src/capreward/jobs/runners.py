"""Metric runners for offline jobs: manifest rows in, one flat result dict per row out.

One runner serves every metric (:func:`metric_runner`): it builds the metric's scorer for the job from
its spec's facts (:meth:`ManifestScorer.scorer_for`) and writes what the scorer's
:class:`~capreward.scorers.contract.Scores` hold: the headline field (the metric's name) and its
sub-scores (:meth:`~capreward.registry.MetricSpec.fields` for the job's configuration), named
``<metric>/<sub-score>`` (the one separator of :mod:`capreward.names`); the chosen metric that
:attr:`~capreward.registry.MetricSpec.writes_alignment` first in the registry's order also writes ``alignment`` = {tokens (SOS..EOS),
best_frame, similarity, weight} with ``alignment=True``. Each metric's own settings (its
:attr:`~capreward.registry.MetricSpec.job_flags`, such as G-VEval's mode) are fields of
:class:`ScoreOptions` by name.

The metrics on a shared CLIP (:func:`capreward.registry.sharing`) share one CLIP backbone; the judge
metrics share one local LLaVA, or those that take any chat backend use an OpenAI-compatible server when
``judge_base_url`` or ``judge_api_model`` is set (key from ``$OPENAI_API_KEY``; a metric with a
:attr:`~capreward.registry.MetricSpec.remote_scorer` then runs on that server too).

A row with several images (``"image": [path, ...]``) is scored on each image as its own row, in the
same batch; each of a metric's top-level fields (``clip_s``, ``ref_clip_s``, ``gveval``, ...) is then the
``image_aggregation`` (``"mean"``, ``"min"`` or ``"max"``: the rewards' rule, :class:`~capreward.rewards.base.CaptionReward`)
of the images' values, and ``<metric>/per_image`` lists, per image in order, ``image`` (its path), every
field the metric wrote for it (sub-scores included) and ``error``. An image without a value leaves the
metric without one (null, the reason in ``errors`` naming the image): a missing judgment is never worth
more than a scored one. Such rows have no ``alignment``.

A row's output never depends on the other rows of its batch: within a batch, rows are scored in
groups of one kind (image or video) and one reference mode (with or without references), each row
with its own references, and the idf is fixed for the whole job. A score that is NaN or missing is
written as null with the reason in ``errors[metric]``. A row whose caption or references are empty
gets that error for every metric without being scored. A batch is scored at once; if that fails on a
bad item, it is split in halves until the failing rows are alone, so the error (``"row '<id>':
<reason>"``) is recorded on the offending row only and nothing else is lost.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, cast
from collections.abc import Callable

from ..default_models import DEFAULT_CLIP
from .. import registry
from ..caption_budget import caption_problem
from ..errors import SampleError
from ..metric_options import FlagFields
from ..names import spelling, sub_score
from .row_inputs import HASH_FIELD, visual_digests
from .manifest import ManifestRow

logger = logging.getLogger(__name__)



def __getattr__(name: str):
    # the tuples this module exported before the registry, now read from it
    if name == "METRICS":  # every metric, by its one name
        return registry.names()
    if name == "CLIP_METRICS":  # metrics computed on the shared CLIP backbone
        return registry.sharing("clip")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class SharedScoreOptions:
    """The options every job has (the metrics' own are :class:`ScoreOptions` fields too, see there)."""

    metrics: list[str] = field(default_factory=lambda: ["emscore"])
    clip_model: str = DEFAULT_CLIP
    judge_model: str = "llava-hf/llava-1.5-13b-hf"  # local LLaVA (name or dir) of the judge metrics
    judge_base_url: str | None = None  # OpenAI-compatible server of the judge metrics (key: $OPENAI_API_KEY)
    judge_api_model: str | None = None  # the served model's name (None: OpenAIJudge's default)
    judge_top_logprobs_cap: int = 20  # the most top_logprobs the server serves (vLLM --max-logprobs)
    device: str = "cpu"
    precision: str | None = None
    batch_size: int = 64
    frames: int | None = 10
    # The idf table of the metrics that use one (token id -> weight, ``idf_default`` for other ids), fixed for
    # the whole job so results do not depend on batching; None: every token weight 1.
    idf_weights: dict[int, float] | None = None
    idf_default: float | None = None
    alignment: bool = False  # store the token -> best-frame alignment per row (for reports)
    image_aggregation: str = "mean"  # a row with several images: mean | min | max of the images' values
    # the metrics' own settings (their specs' job_flags), by flag name; read them as attributes
    metric_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        from ..rewards.base import IMAGE_AGGREGATIONS

        if self.image_aggregation not in IMAGE_AGGREGATIONS:
            raise ValueError(f"image_aggregation must be one of {list(IMAGE_AGGREGATIONS)}, got {self.image_aggregation!r}")
        self.metrics = [spelling(m) for m in self.metrics]  # "clip-s", "clipscore" are "clip_s"
        known = registry.names()
        unknown = [m for m in self.metrics if m not in known]
        if unknown:
            from ..text import capped  # a 1 MB name is not echoed whole

            near = {m: registry.suggest(m) for m in unknown if len(m) <= 200}
            hint = "".join(f" (did you mean {' or '.join(map(repr, n))} for {m!r}?)" for m, n in near.items() if n)
            raise ValueError(f"unknown metrics [{', '.join(capped(m) for m in unknown)}]{hint}; choose from {list(known)}")

    @property
    def remote_judge(self) -> bool:
        """Whether the judge metrics ask an OpenAI-compatible server instead of the local LLaVA."""
        return bool(self.judge_base_url or self.judge_api_model)


class ScoreOptions(FlagFields, SharedScoreOptions):
    """Everything a worker needs to build its scorers (picklable, so Ray actors can receive it).

    The fields of :class:`SharedScoreOptions`, and each metric's own settings by the name its spec gives
    them (:attr:`~capreward.registry.MetricSpec.job_flags`: ``pac_model``, ``hallucination_threshold``,
    ``gveval_mode``, ``gveval_accr``, ``qa_model`` for the built-in metrics), as keyword arguments and
    attributes; an attribute not given reads the flag's default (the option's default it sets). See
    :mod:`capreward.metric_options`.

    Examples:
        >>> from capreward.jobs.runners import ScoreOptions
        >>> options = ScoreOptions(metrics=["G-VEval"], gveval_mode="combined")
        >>> options.metrics, options.gveval_mode, options.gveval_accr
        (['gveval'], 'combined', False)
    """


def finite_or_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


class ManifestScorer:
    """Builds the chosen scorers once (sharing one CLIP, and one judge) and scores batches of manifest rows.

    Each metric's runner (:func:`metric_runner`) scores with the scorer :meth:`scorer_for` builds from
    its spec: on the shared CLIP (:attr:`backbone`), the judges (:meth:`local_judge`,
    :meth:`chat_backend`), the job's fixed idf (:attr:`idf`) and options (:attr:`options`).
    """

    def __init__(self, options: ScoreOptions, backbone=None):
        """``backbone``: an already loaded CLIPBackbone of ``options.clip_model`` to share (else one is loaded
        when a metric on the shared CLIP is chosen)."""
        self.options = options
        self._runners: dict[str, Callable[[list[ManifestRow]], list[dict]]] = {}
        self._judge: Any = None  # the local LLaVA judge, loaded on first use (see local_judge)
        self._chat: Any = None  # the chat backend of the judge metrics (see chat_backend)
        if backbone is None and set(registry.sharing("clip")) & set(options.metrics):
            from ..backbones.clip import CLIPBackbone

            backbone = CLIPBackbone(options.clip_model, device=options.device, precision=options.precision)
        self.backbone = backbone
        for metric in options.metrics:
            self._runners[metric] = metric_runner(registry.get(metric), self)

    @property
    def idf(self) -> dict | bool:
        """The ``idf`` argument of the scorers that weigh tokens: the job's fixed table, or False."""
        if self.options.idf_weights is None:
            return False
        return {int(k): float(v) for k, v in self.options.idf_weights.items()}

    def flag_values(self) -> dict[str, Any]:
        """The metrics' own settings (flag name -> value as given, None: its default)."""
        return dict(self.options.metric_options)

    def local_judge(self):
        """The local LLaVA judge (``judge_model``), loaded once and shared by the judge metrics."""
        if self._judge is None:
            from ..judges.local import LocalJudge

            self._judge = LocalJudge(self.options.judge_model, device=self.options.device)
        return self._judge

    def chat_backend(self):
        """The chat backend of the judge metrics: an OpenAI-compatible server when ``judge_base_url`` or
        ``judge_api_model`` is set (API key from ``$OPENAI_API_KEY``), else the shared local judge."""
        if self._chat is None:
            if self.options.remote_judge:
                from ..judges.remote import OpenAIJudge

                model: dict[str, Any] = {"model": self.options.judge_api_model} if self.options.judge_api_model else {}
                self._chat = OpenAIJudge(self.options.judge_base_url, api_key_env="OPENAI_API_KEY",
                                         top_logprobs_cap=self.options.judge_top_logprobs_cap, **model)
            else:
                from ..judges.local_chat import LocalChatJudge

                self._chat = LocalChatJudge(self.local_judge())
        return self._chat

    _local_judge = local_judge  # the names before the specs' runners
    _chat_backend = chat_backend

    def tree(self) -> dict:
        """The digit-tree width of a remote judge's exact expected scores (the server's logprob cap)."""
        return {"tree_top_logprobs": max(10, self.options.judge_top_logprobs_cap)} if self.options.remote_judge else {}

    _tree = tree

    def text_judge(self) -> Any:
        """The text-only judge of a metric that reads the caption alone (QA utility): the causal LM
        ``qa_model``, else the judge server."""
        if self.options.qa_model:
            from ..judges.local_text import LocalTextJudge

            return LocalTextJudge(self.options.qa_model)
        if self.options.remote_judge:
            return self.chat_backend()
        raise ValueError("qa_utility needs a text judge: --qa-model (a causal LM) or a judge server")

    def call_options(self, spec, cls: Any = None) -> dict[str, Any]:
        """The options ``spec``'s job flags set that its scorer takes per call of
        :meth:`~capreward.scorers.contract.Scorer.scores` rather than in its constructor (EMScore's and
        RefCLIP-S's ``harmonic_mean``: ``--harmonic-mean``)."""
        import inspect

        from ..explicit_options import constructor_parameters

        cls = cls or spec.load()
        per_call = set(inspect.signature(cls.scores).parameters) - {p.name for p in constructor_parameters(cls)[0]}
        return {k: v for k, v in spec.job_config(self.flag_values()).items() if k in per_call}

    def scorer_for(self, spec) -> Any:
        """``spec``'s scorer built for this job from what its spec says it takes: the options its job flags
        set; on a shared CLIP the job's ``backbone`` (on its own checkpoint: the job's device and
        precision), its idf, ``frames`` and ``batch_size``; a scorer on any chat judge gets
        :meth:`chat_backend` (and the digit-tree width its options name); a text judge's scorer
        :meth:`text_judge` and a question writer; a scorer on a local judge model (FLEUR)
        :meth:`local_judge`, or its remote scorer on the judge server."""
        from ..explicit_options import constructor_parameters

        cls = spec.load()
        calls = self.call_options(spec, cls)
        kwargs: dict[str, Any] = {k: v for k, v in spec.job_config(self.flag_values()).items() if k not in calls}
        if spec.backbone == "clip":
            if spec.shares == "clip":
                kwargs["backbone"] = self.backbone
            else:  # its own checkpoint (PAC-S)
                flag = next((f for f in spec.job_flags if f.option == "model"), None)
                if not kwargs.get("model"):
                    raise ValueError(f"{spec.name} needs its own checkpoint: pass {flag.flags[0] if flag else 'model'} PATH")
                kwargs.update(device=self.options.device, precision=self.options.precision)
            params = {p.name for p in constructor_parameters(cls)[0]}
            kwargs.update({k: getattr(self.options, k) for k in ("frames", "batch_size") if k in params})
        if spec.uses_idf:
            kwargs.update(idf=self.idf, idf_default=self.options.idf_default)
        if spec.text_judge:
            if self.options.remote_judge:
                writer: Any = self.chat_backend()
            else:  # a local question writer is the local LLaVA, loaded on first need
                from ..judges.lazy import LazyBackend

                writer = LazyBackend(self.chat_backend)
            return cls(self.text_judge(), question_backend=writer, **kwargs)
        if spec.judge_backend:
            if spec.has_option("tree_top_logprobs"):
                kwargs.update(self.tree())
            return cls(self.chat_backend(), **kwargs)
        if spec.backbone == "chat_judge":  # a scorer on a local judge model (FLEUR)
            if self.options.remote_judge and spec.remote_scorer:  # the served judge, read exactly
                return spec.load_remote_scorer()(self.chat_backend(), top_logprobs=min(20, self.options.judge_top_logprobs_cap))
            return cls(model=self.local_judge(), **kwargs)
        return cls(**kwargs)

    def score_rows(self, rows: list[ManifestRow]) -> list[dict]:
        """One result dict per row: id, caption, visual path, metric fields, and ``errors``; each row's
        output is the same whatever other rows are in ``rows``."""
        if any(r.paths for r in rows):
            return self._score_several_images(rows)
        results = [base_fields(r) for r in rows]
        problems = {i: SampleError(i, "input", f"row {r.id!r}", p) for i, r in enumerate(rows) if (p := row_problem(r))}
        scorable = [i for i in range(len(rows)) if i not in problems]
        for metric, run in self._runners.items():
            for i, problem in problems.items():
                results[i]["errors"][metric] = problem
            if not scorable:
                continue
            for i, fields_ in zip(scorable, isolate_errors(run, [rows[i] for i in scorable], metric)):
                err = fields_.pop("_error", None)
                results[i].update(fields_)
                if err:  # a runner's own plain-text reason (a visual kind the metric refuses) is of kind "input"
                    results[i]["errors"][metric] = err if isinstance(err, SampleError) else SampleError(i, "input", "", err)
        for r in results:
            if not r["errors"]:
                r["errors"] = None
        return results


    def _score_several_images(self, rows: list[ManifestRow]) -> list[dict]:
        """`score_rows()` with each image of a several-image row scored as its own row, then aggregated
        (see the module docstring)."""
        flat_rows, owner = [], []
        for i, row in enumerate(rows):
            for path in row.paths or [row.path]:
                flat_rows.append(replace(row, path=path, paths=None))
                owner.append(i)
        flat = self.score_rows(flat_rows)
        members: list[list[int]] = [[] for _ in rows]
        for j, i in enumerate(owner):
            members[i].append(j)
        results = []
        for row, js in zip(rows, members):
            if not row.paths:
                results.append(flat[js[0]])
                continue
            out = base_fields(row)
            for metric in self._runners:
                out["errors"].update(aggregate_images(metric, [flat[j] for j in js], row, out,
                                                      self.options.image_aggregation))
            out["errors"] = out["errors"] or None
            results.append(out)
        return results


#: How a metric's values over the images of a several-image row become the row's value.
AGGREGATE = {"mean": lambda v: float(sum(v) / len(v)), "min": lambda v: float(min(v)), "max": lambda v: float(max(v))}


def aggregate_images(metric: str, per_image: list[dict], row: ManifestRow, out: dict, how: str) -> dict:
    """Write ``metric``'s fields for a several-image ``row`` into ``out`` from the images' results
    ``per_image`` (one result dict per image, in order): each top-level field the aggregate of the
    images' values, ``<metric>/per_image`` the images' fields. Returns ``{metric: error}`` when an image
    has no value (the fields are then null), else {}."""
    spec = registry.get(metric)
    top = [f for f in spec.all_fields() if any(f in r for r in per_image)]
    entries, error = [], None
    for k, r in enumerate(per_image):
        assert row.paths is not None  # a row scored image by image names its images
        fields_ = {key: value for key, value in r.items() if key in top or key.startswith(sub_score(metric, ""))}
        err = (r.get("errors") or {}).get(metric)
        entries.append({"image": row.paths[k], **fields_, "error": None if err is None else str(err)})
        if error is None and (err is not None or any(r.get(f) is None for f in top)):
            why = err if err is not None else "no value"
            error = SampleError.of(why, None).within(None, f"image {k} of {len(per_image)}")
    for f in top:
        values = [r.get(f) for r in per_image]
        out[f] = None if error is not None or any(v is None for v in values) else AGGREGATE[how](values)
    if error is not None and not top:
        out[metric] = None
    out[sub_score(metric, "per_image")] = entries
    return {metric: error} if error is not None else {}


def result_value(value: Any) -> Any:
    """A scorer's per-row value as a results-file value: a number as a float (NaN as None), a tensor or
    array element as a plain number, a list or a dataclass field by field, text as it is."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return finite_or_none(float(value)) if isinstance(value, float) else value
    if isinstance(value, dict):
        return {str(k): result_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [result_value(v) for v in value]
    return value


def metric_runner(spec, job: ManifestScorer) -> Callable[[list[ManifestRow]], list[dict]]:
    """The runner of any metric: rows in, one dict of the metric's fields per row out (``_error``: the
    row's error for it).

    Its scorer (:meth:`ManifestScorer.scorer_for`) is asked
    :meth:`~capreward.scorers.contract.Scorer.scores` per group of rows of one visual kind and one
    reference mode, as its spec says: a row without references where it needs them, or of a kind it
    does not score, gets an error without being asked; references are passed only where its reference
    mode is not ``"none"``; each of :attr:`~capreward.registry.MetricSpec.row_inputs` is read from the
    rows' manifest keys. Row ``j`` gets the headline under the metric's name and each declared sub-score
    under :meth:`~capreward.registry.MetricSpec.field_of`; its error is the scorer's (a visual that
    cannot be used: the row's media error alone); of the chosen metrics that write an alignment, the
    first in the registry's order writes the row's ``alignment`` with ``alignment=True``.
    """
    scorer = job.scorer_for(spec)
    calls = job.call_options(spec, type(scorer))
    config = {**spec.config_of(scorer), **calls}
    mode = spec.references_for(config)
    writers = [registry.get(m) for m in job.options.metrics if registry.get(m).writes_alignment]
    writer = min(writers, key=lambda w: w.position).name if writers else None  # EMScore's, when chosen
    write_alignment = job.options.alignment and writer == spec.name

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        ready = []
        for i, r in enumerate(rows):
            if mode == "required" and not r.references:
                out[i] = {"_error": f"{spec.title}{spec.with_config(config)} needs references; the row has none"}
            elif (refused := visual_refused(spec, config, r.kind)) is not None:
                out[i] = {"_error": refused}
            else:
                ready.append(i)
        for kind, refs, idx in row_groups([rows[i] for i in ready], with_references=mode != "none"):
            where = [ready[k] for k in idx]
            kwargs: dict[str, Any] = {f"{kind}s": [rows[i].path for i in where]}
            if mode != "none":
                kwargs["references"] = refs
            for key in spec.row_inputs:
                kwargs[key] = [rows[i].extra.get(key) for i in where]
            res = scorer.scores([rows[i].caption for i in where], **kwargs, **calls)
            subs = spec.sub_scores_for({**config, "visual": kind, "references": refs is not None and mode != "none"})
            res.check(subs, spec.name)
            alignment = res.extras.get("alignment")
            for pos, i in enumerate(where):
                error = res.errors[pos]
                if (visual := visual_error(rows[i], pos, error)) is not None:
                    out[i] = {"_error": visual}
                    continue
                out[i] = {spec.name: result_value(res.score[pos])}
                for sub in subs:
                    out[i][spec.field_of(sub)] = result_value(res.sub_scores[sub][pos])
                if error:
                    out[i]["_error"] = error
                if write_alignment and alignment is not None:
                    out[i]["alignment"] = alignment_fields(alignment[pos])
        return out

    return run


def alignment_fields(a) -> dict:
    """The ``alignment`` field of a row from a :class:`~capreward.scorers.emscore.TokenAlignment`."""
    return {"tokens": a.tokens, "best_frame": a.best_frame, "similarity": a.similarity, "weight": a.weight}


def base_fields(row: ManifestRow) -> dict:
    """The fields of ``row``'s result before any metric: id, caption, visual path, ``errors``,
    references (when given) and the manifest's other keys, as they are."""
    out: dict[str, Any] = {"id": row.id, "caption": row.caption, row.kind: row.visual, "errors": {}}
    if row.references is not None:
        out["references"] = row.references
    out[HASH_FIELD] = visual_digests(row)  # a resume refuses the row if its visual changes
    out.update(row.extra)
    return out


def visual_refused(spec, config: dict, kind: str) -> str | None:
    """Why ``spec``'s metric (configured by ``config``) does not score a ``kind`` visual, or None: the
    visual kinds are read from the spec."""
    kinds = spec.visual_kinds(config)
    if kind in kinds:
        return None
    with_config = "" if spec.visual_kinds() == kinds else " with " + ", ".join(f"{k}={v!r}" for k, v in config.items()
                                                                              if v is not False)
    return f"{spec.title} scores {' and '.join(k + 's' for k in kinds)} only{with_config}"


def row_groups(rows: list[ManifestRow], with_references: bool = True):
    """``(kind, references, indices)`` for each non-empty group of rows of one kind ("video", "image")
    and, with ``with_references``, one reference mode: ``references`` is the group's list of reference
    lists, or None for the rows without references (and always None without ``with_references``)."""
    for kind in ("video", "image"):
        modes = (True, False) if with_references else (False,)
        for has_refs in modes:
            idx = [i for i, r in enumerate(rows)
                   if r.kind == kind and (not with_references or (r.references is not None) == has_refs)]
            if idx:
                yield kind, ([rows[i].references for i in idx] if has_refs else None), idx


def row_problem(row: ManifestRow) -> str | None:
    """Why ``row`` cannot be scored by any metric (an empty caption or reference), or None."""
    if (over := caption_problem(row.caption)) is not None:  # never read by any metric
        return f"the caption {over}"
    if not row.caption.strip():
        return "the caption is empty"
    if row.references is not None:
        if not row.references:
            return "'references' is an empty list (leave it out to score without references)"
        for k, ref in enumerate(row.references):
            if not ref.strip():
                return f"references[{k}] is empty"
    return None


def row_error(row: ManifestRow, exc: Exception) -> SampleError:
    """The error recorded on ``row`` when scoring it alone raised ``exc``: ``"row '<id>': <reason>"``
    (just ``"<type>: <message>"`` when the message already names the row); a media error names the
    row's visual: ``"row '<id>': <problem> (<path>)"``."""
    error = SampleError.from_exception(exc, kind="scorer")
    if error.kind in ("media", "refused"):
        return media_row_error(row, error)
    return error if f"row {row.id!r}" in str(exc) else error.within(None, f"row {row.id!r}")


def media_row_error(row: ManifestRow, error: SampleError) -> SampleError:
    """The row's error for a visual that cannot be used (``error`` of kind ``"media"``/``"refused"``):
    ``"row '<id>': <problem> (<path>)"``, the same text whichever scorer found it and wherever the row
    sat in its batch."""
    return SampleError(None, error.kind, f"row {row.id!r}", f"{error.message} ({row.path})")


def visual_error(row: ManifestRow, pos: int, error: str | None) -> SampleError | None:
    """The row's error when a scorer that reports unreadable visuals per item (VisCE², G-VEval) gives
    item ``pos`` of its batch (``row``) a media error (a :class:`~capreward.errors.SampleError` of kind
    ``"media"`` or ``"refused"``): see :func:`media_row_error`; None for no error or another kind."""
    if getattr(error, "kind", None) not in ("media", "refused"):
        return None
    return media_row_error(row, cast(SampleError, error))  # its kind says it is one


def isolate_errors(run, rows: list[ManifestRow], metric: str) -> list[dict]:
    """``run(rows)``; if it raises, run each half on its own (recursively) and record the failure of a
    row that fails alone as ``_error`` naming the row's id. The halves' results equal the batch's
    because every runner scores each row independently of the others."""
    try:
        return run(rows)
    except Exception as exc:  # noqa: BLE001 - any scorer failure must stay on its row
        if len(rows) == 1:
            reason = row_error(rows[0], exc)
            logger.warning("%s: %s", metric, reason)
            return [{"_error": reason}]
    half = len(rows) // 2
    return isolate_errors(run, rows[:half], metric) + isolate_errors(run, rows[half:], metric)
