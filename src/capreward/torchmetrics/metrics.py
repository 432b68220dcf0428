"""torchmetrics ``Metric`` classes wrapping the scorers: :class:`CaptionMetric` (per-caption rows, DDP-synced),
:class:`RegisteredMetric` (any registered metric, read from its spec and its scorer's
:class:`~capreward.scorers.contract.Scores`) and the named classes fixed to one metric (EMScore, CLIP-S /
RefCLIP-S, FLEUR here; VisCE² and G-VEval in :mod:`capreward.torchmetrics.judges`).

Each metric keeps, per caption, one row of values (the main score and its sub-scores, see
``columns``) and optionally a sample id, in list states with ``dist_reduce_fx="cat"``, so syncing
across processes is torchmetrics' own. :meth:`CaptionMetric.compute` returns the mean score (and on
request the sub-score means and the per-sample values); :meth:`CaptionMetric.summary` returns the
synced per-sample table as :class:`~capreward.torchmetrics.summary.CaptionScores`.

Sample ids (dataset indices) make the result independent of the number of processes: rows are ordered
by id and the samples a ``DistributedSampler`` repeats to pad the last batch are counted once. In a
LightningModule, ``ids=sample_ids(self.trainer, batch_idx)`` (:func:`~capreward.callbacks.sample_ids`)
reads them from the loader's ``DistributedSampler``. Without ids under DDP the metric warns at compute
time, with the count and, given ``dataset_size=``, the dataset's length.

The scorer (and its CLIP backbone or VLM judge) is held by reference, outside the module tree: it is
not part of ``state_dict()`` (checkpoints stay small and strict loading works), ``metric.to(device)``
moves only the metric's states, and copies of the metric (``clone()``, ``deepcopy``) share the same
scorer. Build several metrics on one :class:`~capreward.backbones.CLIPBackbone` with ``backbone=``.

Empty captions (what a young captioner often produces) are not sent to the scorer: they score
``empty_score`` (0.0 by default; None gives NaN, i.e. left out of the mean) and are counted in the
``"empty"`` column.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, cast
from collections.abc import Sequence

import numpy as np
import torch

from .._extras import require

require("callbacks", "torchmetrics", used_by="capreward's torchmetrics metrics")
from torchmetrics import Metric  # noqa: E402 (after the check that names the extra)
from torchmetrics.utilities import rank_zero_warn
from torchmetrics.utilities.data import dim_zero_cat

from ..errors import failures
from ..judges.caller_text import is_blank
from ..caption_budget import check_captions
from ..caption_reading import as_read
from .distributed import is_distributed
from .sources import as_captions, as_references, per_visual
from .sources import per_sample as split_per_sample
from .summary import NO_ID, CaptionScores, check_ids, nanmean, summarize
from ..explicit_options import ClassSignature

logger = logging.getLogger(__name__)

_VISUAL_KINDS = ("video", "image")
#: File suffixes read as images, refused by a metric set for videos.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


class _Shared:
    """Holds an object by reference: deep copies (``Metric.clone``) keep pointing at the same object,
    and ``nn.Module`` does not register it, so it never enters ``state_dict`` or ``.to()``."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


class CaptionMetric(Metric):
    """Base class: per-caption rows of ``columns`` accumulated over ``update`` calls.

    Subclasses set ``columns`` (``"score"`` first, ``"empty"`` second) and implement
    :meth:`_score_rows`. ``compute()`` returns a 0-d float32 tensor with the mean of ``"score"`` over
    the samples that have one (NaN when none); with ``sub_scores=True`` or ``per_sample=True`` a flat
    dict instead: ``"score"`` (the mean), each other column's mean under its own name (sub-scores named
    with ``/``, as everywhere in capreward: ``video/full_f``), and with
    ``per_sample=True`` ``"per_sample/<column>"`` Tensor [N] plus ``"per_sample/id"`` LongTensor [N]
    when ids were given. ``dataset_size``: the number of samples one evaluation should count, for the
    padding check: the metric warns when it counted more, and (under DDP) when it got no ids.
    ``image_aggregation``: how a sample given several images (a list or tuple of images as its visual) is
    scored: its caption against each image, then ``"mean"`` (default), ``"min"`` or ``"max"`` of the
    per-image scores (other columns: their mean), as the rewards do; an image without a score leaves the
    sample without one; the per-image scores are logged (INFO). Extra keyword arguments go to
    ``torchmetrics.Metric`` (``sync_on_compute``, ``process_group``, ``compute_on_cpu`` …).

    Args:
        scorer: the scorer the rows come from.
        visual: the kind of visual ``update`` gets (``"image"``, ``"video"``; None: references only).
        empty_score: the score of an empty caption (None: no score).
        per_sample: ``compute()`` also returns the per-sample columns.
        sub_scores: ``compute()`` returns every column's mean.
        name: the metric's name (default: the class's ``default_name``).
        dataset_size: the number of samples one evaluation should count (the padding check).
        image_aggregation: ``"mean"``, ``"min"`` or ``"max"`` over a sample's images.
        **kwargs: ``torchmetrics.Metric``'s options.

    Raises:
        ValueError: an unknown ``image_aggregation``.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> from capreward.torchmetrics import CaptionMetric, EMScoreMetric
        >>> metric = EMScoreMetric(model=str(trained_clip_path()), visual="image", per_sample=True)
        >>> isinstance(metric, CaptionMetric)
        True
        >>> metric.update(["a red image.", ""], [colour_image("red")] * 2)
        >>> out = metric.compute()
        >>> out["per_sample/empty"].tolist()
        [0.0, 1.0]
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    columns: tuple[str, ...] = ("score", "empty")
    #: score the captions exactly as given (set True on an instance for parity with the released
    #: metric); by default each caption is read as a person reads it first
    #: (:func:`~capreward.caption_reading.read_caption`), which leaves ordinary captions unchanged
    as_given: bool = False
    default_name = "caption_score"
    #: the scorer is an LLM judge: a caption blank once special-token strings ("<s></s>") are removed is
    #: empty too (:func:`~capreward.judges.caller_text.is_blank`)
    judge_text = False
    #: the other inputs ``update`` takes besides captions, visuals and references (QA utility's ``questions``)
    row_inputs: tuple[str, ...] = ()

    def __init__(
        self,
        scorer: Any,
        *,
        visual: str | None,
        empty_score: float | None = 0.0,
        per_sample: bool = False,
        sub_scores: bool = False,
        name: str | None = None,
        dataset_size: int | None = None,
        image_aggregation: str = "mean",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        from ..rewards.base import IMAGE_AGGREGATIONS

        if image_aggregation not in IMAGE_AGGREGATIONS:
            raise ValueError(f"image_aggregation must be one of {sorted(IMAGE_AGGREGATIONS)}, got {image_aggregation!r}")
        self.image_aggregation = image_aggregation
        if dataset_size is not None and (isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1):
            raise ValueError(f"dataset_size must be a positive int or None, got {dataset_size!r}")
        self.dataset_size = dataset_size
        self._warned_count = False
        if visual is not None and visual not in _VISUAL_KINDS:
            raise ValueError(f"visual must be 'video', 'image' or None, got {visual!r}")
        self._scorer = _Shared(scorer)
        self.visual = visual
        self.empty_score = math.nan if empty_score is None else float(empty_score)
        self.per_sample = per_sample
        self.sub_scores = sub_scores
        self.name = name or self.default_name
        self._mode: tuple[bool, bool] | None = None
        self._mode_across_reset: tuple[bool, bool] | None = None
        self.add_state("ids", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")

    @property
    def scorer(self) -> Any:
        """The wrapped scorer (shared, never copied or moved by the metric)."""
        return self._scorer.obj

    # ------------------------------------------------------------------------------- torchmetrics
    def update(
        self,
        candidates: Sequence[str],
        visuals: Any = None,
        references: Sequence[Sequence[str] | str] | None = None,
        *,
        ids: Sequence[int] | torch.Tensor | None = None,
        visual_ids: Sequence[str | None] | None = None,
        **inputs: Sequence[Any],
    ) -> None:
        """Score a batch and keep its per-caption rows.

        ``candidates``: the captions (a list, or one str for one sample). ``visuals``: one video (or image,
        per ``visual=``) per caption: a list, a batched tensor/array split along dim 0, or one tensor/array
        for one caption. Images as torchmetrics takes them: paths, PIL images, tensors (3, H, W) or
        (H, W, 3) of integers 0..255 (uint8, int64 …) or floats in [0, 1], uint8 arrays (H, W, 3); videos
        as paths or uint8 (T, H, W, 3) frames. ``references``: one caption or list of captions per
        candidate. ``ids``: one int sample id per caption (dataset index), needed for exact results under
        a DistributedSampler. ``visual_ids``: optional cache keys for the visuals. ``inputs``: the metric's
        other inputs (its spec's ``row_inputs``: QA utility's ``questions``), one entry per caption.

        The captions come first (torchmetrics' CLIPScore takes images first): visuals given as the first
        argument are refused with a TypeError saying so.
        """
        candidates = self._captions_first(candidates, visuals)
        n = len(candidates)
        if n == 0:
            return
        if visuals is not None and self.visual is not None:
            if self.visual == "video":
                self._refuse_images(visuals)
            visuals = per_visual(visuals, n, self.visual, "visuals")
        elif visuals is not None:
            visuals = split_per_sample(visuals, n, "visuals")
        refs = None if references is None else as_references(references, n)
        if visual_ids is not None:
            visual_ids = split_per_sample(visual_ids, n, "visual_ids")
        id_tensor = torch.full((n,), NO_ID) if ids is None else check_ids(ids, n)
        unknown = sorted(set(inputs) - set(self.row_inputs))
        if unknown:
            raise TypeError(f"{self.name}: update() got unexpected inputs {unknown}; its inputs: {list(self.row_inputs) or 'none'}")
        inputs = {k: split_per_sample(v, n, k) for k, v in inputs.items() if v is not None}
        self._check_mode(visuals is not None, refs is not None, bool(inputs))
        if self.visual == "image" and visuals is not None and any(isinstance(v, (list, tuple)) for v in visuals):
            rows = self._multi_image_rows(candidates, visuals, refs, visual_ids, inputs)
        else:
            rows = self._rows(candidates, visuals, refs, visual_ids, inputs)
        self.ids.append(id_tensor.to(self.device))
        self.values.append(rows.reshape(-1).to(self.device))
        self._mode = (visuals is not None, refs is not None)

    def _rows(self, candidates: list[str], visuals, refs, visual_ids, inputs: dict | None = None) -> torch.Tensor:
        """Rows [n, len(columns)] of one visual per caption: scored rows, ``empty_score`` rows for empty
        captions, the ``empty`` column filled."""
        n = len(candidates)
        rows = torch.full((n, len(self.columns)), math.nan, dtype=torch.float32)
        empty = [is_blank(c) if self.judge_text else not c.strip() for c in candidates]
        keep = [i for i in range(n) if not empty[i]]
        if keep:
            pick: Callable[[Any], Any] = lambda xs: None if xs is None else [xs[i] for i in keep]  # noqa: E731
            scored = self._score_rows([candidates[i] for i in keep], pick(visuals), pick(refs), pick(visual_ids),
                                      **{k: pick(v) for k, v in (inputs or {}).items()})
            rows[keep] = scored.to(torch.float32).cpu()
        if len(keep) < n:
            drop = [i for i in range(n) if empty[i]]
            rows[drop] = self._empty_row(visuals is not None, refs is not None)
        rows[:, 1] = torch.tensor(empty, dtype=torch.float32)
        return rows

    def _multi_image_rows(self, candidates: list[str], visuals, refs, visual_ids, inputs: dict | None = None) -> torch.Tensor:
        """Rows of samples some of which have several images: every (caption, image) pair scored as a
        row of its own in one batch, then each sample's rows aggregated (``image_aggregation`` for the
        score, the mean for the other columns; NaN when an image has no score)."""
        owner: list[int] = []
        flat: list[Any] = []
        for i, v in enumerate(visuals):
            items = list(v) if isinstance(v, (list, tuple)) else [v]
            if not items:
                raise ValueError(f"{self.name}: visuals[{i}] is an empty list of images")
            flat.extend(items)
            owner.extend([i] * len(items))
        pick: Callable[[Any], Any] = lambda xs: None if xs is None else [xs[i] for i in owner]  # noqa: E731
        ids = pick(visual_ids)
        if ids is not None:  # a sample's cache key names its first image only
            ids = [ids[j] if j == 0 or owner[j - 1] != owner[j] else None for j in range(len(owner))]
        flat_rows = self._rows(pick(candidates), flat, pick(refs), ids, {k: pick(v) for k, v in (inputs or {}).items()})
        reduce = {"mean": torch.mean, "min": torch.amin, "max": torch.amax}[self.image_aggregation]
        rows = torch.empty((len(candidates), len(self.columns)), dtype=torch.float32)
        members = torch.tensor(owner)
        for i in range(len(candidates)):
            mine = flat_rows[members == i]
            rows[i] = mine.mean(dim=0)
            rows[i, 0] = reduce(mine[:, 0])  # NaN stays NaN: a missing score is never worth more
            if len(mine) > 1:
                logger.info("%s: sample %d per-image scores %s -> %s (%s)", self.name, i, mine[:, 0].tolist(),
                            float(rows[i, 0]), self.image_aggregation)
        return rows

    def _refuse_images(self, visuals: Any) -> None:
        """A TypeError naming ``visual="image"`` when a metric set for videos is given images (PIL images,
        image files, or one (H, W, 3) / (3, H, W) array) instead of a cryptic "unsupported video type"."""
        from PIL import Image

        items = [visuals] if isinstance(visuals, (str, os.PathLike, Image.Image)) else visuals
        single_image = isinstance(visuals, (torch.Tensor, np.ndarray)) and visuals.ndim == 3
        if not single_image and isinstance(items, (list, tuple)):
            for i, item in enumerate(items):  # noqa: B007 (i names the item in the error below)
                if isinstance(item, Image.Image):
                    what = "a PIL image"
                    break
                if isinstance(item, (str, os.PathLike)) and os.fspath(item).lower().endswith(IMAGE_SUFFIXES):
                    what = f"the image file {os.fspath(item)!r}"
                    break
                if isinstance(item, (torch.Tensor, np.ndarray)) and item.ndim == 3:
                    what = f"an array of shape {tuple(item.shape)} (an image, not (T, H, W, 3) frames)"
                    break
            else:
                return
        elif single_image:
            i, what = 0, f"an array of shape {tuple(visuals.shape)} (one image, not (T, H, W, 3) frames)"
        else:
            return
        raise TypeError(
            f"{type(self).__name__} is set for videos (visual='video') but visuals[{i}] is {what}; "
            f"to score images pass {type(self).__name__}(..., visual=\"image\")"
        )

    def _captions_first(self, candidates: Any, visuals: Any) -> list[str]:
        """The captions as a list (one str is one caption); a TypeError naming the argument order when the
        visuals came first (torchmetrics' CLIPScore order) or a caption is not a str."""
        if isinstance(candidates, str):
            check_captions([candidates], "candidates")
            return [candidates if self.as_given else as_read(candidates)]
        looks_visual = isinstance(candidates, (torch.Tensor, np.ndarray)) or (
            isinstance(candidates, Sequence) and len(candidates) > 0 and not isinstance(candidates[0], str)
            and isinstance(visuals, (str, Sequence)) and not isinstance(visuals, (torch.Tensor, np.ndarray))
            and len(visuals) > 0 and (isinstance(visuals, str) or isinstance(visuals[0], str))
        )
        if looks_visual:
            raise TypeError(
                f"{type(self).__name__}.update takes (captions, visuals, references): the captions come first "
                f"(torchmetrics' CLIPScore takes (images, captions)); got a {type(candidates).__name__} of "
                "visuals where the captions go"
            )
        captions = as_captions(candidates, what="candidates")
        check_captions(captions, "candidates")  # over the caption budget: CaptionOverBudget, never read
        return captions if self.as_given else [as_read(c) for c in captions]

    def compute(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mean score (0-d float32), or a dict (see the class docstring)."""
        scores = self._summarize()
        mean = torch.tensor(scores.mean, dtype=torch.float32)
        if not (self.per_sample or self.sub_scores):
            return mean
        out = {"score": mean}
        if self.sub_scores:
            out.update({k: torch.tensor(v, dtype=torch.float32) for k, v in scores.means().items() if k != "score"})
        if self.per_sample:
            out.update({f"per_sample/{k}": v for k, v in scores.values.items()})
            if scores.ids is not None:
                out["per_sample/id"] = scores.ids
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The batch's value (as ``compute`` would give on this batch alone); also accumulates it.

        torchmetrics' ``forward`` resets the metric around the batch update; the inputs mode of the
        earlier updates is carried through that reset so that mixing modes is still refused.
        """
        self._mode_across_reset = self._mode
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._mode_across_reset = None

    def reset(self) -> None:
        super().reset()
        self._mode = getattr(self, "_mode_across_reset", None)

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """torchmetrics' ``Metric.plot``: the main score of ``val`` (a result of ``compute()`` or
        ``forward()``, or a list of them, plotted as steps; default: ``compute()`` now) between the
        metric's bounds (``plot_lower_bound``/``plot_upper_bound``), on ``ax`` or a new figure.
        Returns ``(figure, axes)``; needs matplotlib."""
        val = self.compute() if val is None else val
        return self._plot(_main_score(val), ax)

    # ---------------------------------------------------------------------------------- results
    def summary(self) -> CaptionScores:
        """Per-sample scores over every process (synced like ``compute``), repeats removed by id."""
        if self._is_synced or not self.sync_on_compute:
            return self._summarize()
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=True, should_unsync=True):
            return self._summarize()

    def _summarize(self) -> CaptionScores:
        ids = _cat(self.ids)
        values = _cat(self.values)
        scores = summarize(self.name, self.columns, ids, values)
        if len(scores) == 0:
            rank_zero_warn(
                f"{self.name}: no sample has been scored (compute() or summary() before any update() with "
                "captions, or after reset()): the score is NaN", UserWarning)
        self._check_count(scores)
        return scores

    def _check_count(self, scores: CaptionScores) -> None:
        """Warn (once per metric) when samples may be counted twice: under DDP without ids, or more
        samples than ``dataset_size``."""
        n = len(scores)
        world = torch.distributed.get_world_size() if is_distributed() else 1
        too_many = self.dataset_size is not None and n > self.dataset_size
        unknown = world > 1 and scores.ids is None and n > 0
        if self._warned_count or not (too_many or unknown):
            return
        self._warned_count = True
        size = f" for a dataset of {self.dataset_size}" if self.dataset_size is not None else ""
        message = f"{self.name}: {n} samples counted{size}"
        if scores.ids is None and world > 1:
            message += (
                f" on {world} processes without sample ids: a DistributedSampler pads the last round with up to "
                f"{world - 1} repeated samples, which are then counted twice. Pass ids=sample_ids(self.trainer, "
                "batch_idx) (capreward.callbacks.sample_ids) or the dataset index of each sample to update()."
            )
        else:
            message += "; some samples were counted more than once (duplicate updates, or a metric not reset between evaluations)."
        rank_zero_warn(message, UserWarning)

    # ------------------------------------------------------------------------------ for subclasses
    def _score_rows(self, candidates: list[str], visuals, references, visual_ids, **inputs: list[Any]) -> torch.Tensor:
        """Rows [n, len(columns)] for non-empty captions (column 1, ``empty``, is filled by update)."""
        raise NotImplementedError

    def _parts(self, has_visuals: bool, has_refs: bool) -> list[str]:
        """Columns that get ``empty_score`` for an empty caption, given which inputs were present."""
        return [c for c in self.columns if c not in ("empty", "truncated", "parsed")]

    def _empty_row(self, has_visuals: bool, has_refs: bool) -> torch.Tensor:
        row = torch.full((len(self.columns),), math.nan)
        for c in self._parts(has_visuals, has_refs):
            row[self.columns.index(c)] = self.empty_score
        if "truncated" in self.columns:
            row[self.columns.index("truncated")] = 0.0
        return row

    def _check_mode(self, has_visuals: bool, has_refs: bool, has_inputs: bool = False) -> None:
        if not has_visuals and not has_refs and not has_inputs:
            raise ValueError(f"{self.name}: update needs visuals and/or references")
        if has_visuals and self.visual is None:
            raise ValueError(f"{self.name}: got visuals but the metric was built with visual=None")
        mode = (has_visuals, has_refs)
        if self._mode is not None and mode != self._mode:
            raise ValueError(
                f"{self.name}: this update has visuals={has_visuals}, references={has_refs} but earlier updates "
                f"had visuals={self._mode[0]}, references={self._mode[1]}; the main score would mix different "
                "definitions. Give the same inputs every time, or use separate metrics."
            )

    def _log_unscored(self, candidates: Sequence[str], score: Any, errors: Sequence[Any] | None) -> None:
        """Log the captions the scorer gave no score (:func:`capreward.errors.failures`, the rule rewards,
        jobs and the server share; a NaN score is the scorer's "no score", ``errors`` its reasons): they
        stay NaN in the rows, so the mean leaves them out and the ``scored`` column counts them.
        One INFO line per batch naming the first."""
        values = [None if math.isnan(float(s)) else float(s) for s in score]
        failed = failures(values, list(errors) if errors is not None else [None] * len(values), kind="judge_unreadable")
        if failed:
            first = failed[0]
            logger.info(
                "%s: %d of %d judge answers gave no score (left out of the mean); first: candidate %r: %s",
                self.name, len(failed), len(candidates), candidates[cast(int, first.index)], first,
            )

    def _row_tensor(self, columns: dict[str, torch.Tensor], n: int) -> torch.Tensor:
        rows = torch.full((n, len(self.columns)), math.nan, dtype=torch.float32)
        for name, col in columns.items():
            rows[:, self.columns.index(name)] = col.detach().float().cpu()
        return rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, visual={self.visual!r})"


def named_metrics(metrics: Sequence[CaptionMetric] | Mapping[str, CaptionMetric]) -> dict[str, CaptionMetric]:
    """Metrics keyed by log name: a mapping as given, a list by each metric's ``name``.

    Raises ValueError for no metrics or two with the same name, TypeError for a non-CaptionMetric.
    """
    if isinstance(metrics, Mapping):
        named = dict(metrics)
    else:
        named = {}
        for m in metrics:
            if not isinstance(m, CaptionMetric):
                raise TypeError(f"metrics must be capreward CaptionMetrics, got {type(m).__name__}")
            if m.name in named:
                raise ValueError(f"two metrics are named {m.name!r}; pass a mapping name -> metric")
            named[m.name] = m
    if not named:
        raise ValueError("at least one metric is needed")
    for name, m in named.items():
        if not isinstance(m, CaptionMetric):
            raise TypeError(f"metric {name!r} must be a capreward CaptionMetric, got {type(m).__name__}")
    return named


def _main_score(val: Any) -> Any:
    """The main score of a compute()/forward() result (a 0-d tensor, or the ``"score"`` of a dict), or of
    each result of a list."""
    if isinstance(val, Mapping):
        return val["score"]
    if isinstance(val, (list, tuple)):
        return [_main_score(v) for v in val]
    return val


def _cat(state: Any) -> torch.Tensor:
    if isinstance(state, torch.Tensor):
        return state
    return dim_zero_cat(state) if len(state) else torch.zeros(0)


# ------------------------------------------------------------------------------ any registered metric
#: torchmetrics ``Metric``'s own keyword arguments (its constructor takes them as ``**kwargs``).
TORCHMETRICS_OPTIONS = (("compute_on_cpu", False), ("dist_sync_on_step", False), ("process_group", None),
                        ("dist_sync_fn", None), ("distributed_available_fn", None), ("sync_on_compute", True),
                        ("compute_with_cache", True))
_CAPTION_OPTIONS = tuple(
    p for p in list(inspect.signature(CaptionMetric.__init__).parameters.values())[1:]
    if p.name not in ("scorer", "visual") and p.kind is not inspect.Parameter.VAR_KEYWORD
)
_METRIC_OPTION_NAMES = frozenset([p.name for p in _CAPTION_OPTIONS] + [n for n, _ in TORCHMETRICS_OPTIONS])


def fixed_visual(spec: Any) -> str | None:
    """The one visual kind a metric that scores only one takes (VisCE²: images), else None."""
    return spec.visuals[0] if len(spec.visuals) == 1 else None


def metric_columns(spec: Any, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The per-caption columns of ``spec``'s Metric with ``config``: ``score`` (the value, see
    :meth:`~capreward.registry.MetricSpec.value_of`), ``empty``, ``truncated`` (a metric on a CLIP),
    ``scored`` (a metric a language model reads: 1 where the caption has a score), the headline under the
    metric's name where the value may be another sub-score (CLIP-S's ``clip_s``), and every numeric
    sub-score its spec declares."""
    return ("score", "empty", *(("truncated",) if spec.backbone == "clip" else ()),
            *(("scored",) if spec.judged_by_llm else ()), *((spec.name,) if spec.headline_differs(config) else ()),
            *spec.all_sub_scores(config, ("score", "number")))


def metric_parameters(metric: str) -> tuple[inspect.Signature, frozenset[str] | None]:
    """The constructor signature of ``metric``'s torchmetrics Metric (its scorer's first option
    positional, the scorer's other options, ``scorer``, ``visual``, the options of
    :class:`CaptionMetric` and torchmetrics' own) and the names it accepts (None: any)."""
    from .. import registry
    from ..explicit_options import constructor_parameters, keyword_only, merged_signature

    spec = registry.get(metric)
    scorer_params, open_kwargs = constructor_parameters(spec.load())
    first = [scorer_params[0].replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)] if scorer_params else []
    if first and first[0].default is inspect.Parameter.empty:  # optional: scorer= may come instead
        first = [first[0].replace(default=None)]
    kw = inspect.Parameter.KEYWORD_ONLY
    own = [inspect.Parameter("scorer", kw, default=None)]
    if fixed_visual(spec) is None:
        own.append(inspect.Parameter("visual", kw, default=spec.default_visual, annotation="str | None"))
    own.append(inspect.Parameter("scorer_kwargs", kw, default=None, annotation="dict[str, Any] | None"))
    tm = [inspect.Parameter(n, kw, default=d) for n, d in TORCHMETRICS_OPTIONS]
    var = inspect.Parameter("scorer_options", inspect.Parameter.VAR_KEYWORD) if open_kwargs else None
    signature = merged_signature(first, keyword_only(scorer_params[1:]), own, keyword_only(_CAPTION_OPTIONS), tm,
                                 var_keyword=var)
    return signature, (None if open_kwargs else frozenset(signature.parameters))


def _metric_signature(cls: Any) -> inspect.Signature | None:
    if cls.metric is None:
        return inspect.Signature([
            inspect.Parameter("metric", inspect.Parameter.POSITIONAL_ONLY),
            inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)])
    return metric_parameters(cls.metric)[0]


def _spec_of_scorer(scorer: Any) -> Any:
    """The spec whose scorer class ``scorer`` is an instance of (exactly), or None."""
    from .. import registry

    path = f"{type(scorer).__module__}:{type(scorer).__qualname__}"
    return next((s for s in registry.specs() if s.scorer == path), None)


class _OfTheMetric:
    """A class attribute read from the metric a class is fixed to (its default ``columns``, its
    ``default_name``); an instance's own value, set at construction, comes first."""

    def __init__(self, read: Any, fallback: Any):
        self.read, self.fallback = read, fallback

    def __get__(self, obj: Any, cls: Any) -> Any:
        if cls.metric is None:
            return self.fallback
        from .. import registry

        return self.read(registry.get(cls.metric))


class RegisteredMetric(CaptionMetric):
    """Any registered metric with a torchmetrics Metric, read from its spec: ``RegisteredMetric("emscore",
    clip, visual="image")`` is :class:`EMScoreMetric` (the per-metric classes are subclasses that fix
    ``metric``).

    The scorer is built from the scorer's own options (the first one may be given positionally: ``model``
    or ``backend``), or pass a configured ``scorer``. Its :meth:`~capreward.scorers.contract.Scorer.scores`
    fill the columns (:func:`metric_columns`: ``score``, ``empty`` and every numeric sub-score its spec
    declares); the name, range (plot bounds), default ``visual``, the inputs every update needs and
    whether a language model reads the caption come from its spec.

    Args:
        *args: the metric's name or alias (for ``RegisteredMetric`` itself; the per-metric classes fix
            it), then optionally the scorer's first option (``model`` or ``backend``).
        **options: the scorer's options, ``scorer``, ``visual``, ``scorer_kwargs`` (more scorer options,
            as a dict), the options of :class:`CaptionMetric` and torchmetrics' own
            (:meth:`signature_of` lists them).

    Raises:
        capreward.registry.UnknownMetric: no metric has that name.
        capreward.registry.UnknownOption: an option it does not take (naming the nearest valid one).
        ValueError: the options conflict (a scorer option beside ``scorer=``), or the visual kind is one
            the metric does not score.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.torchmetrics import RegisteredMetric
        >>> metric = RegisteredMetric("EMScore", clip, visual="image")
        >>> metric.name, metric.columns[:3]
        ('emscore', ('score', 'empty', 'truncated'))
        >>> metric.update(["a red image.", "a blue image."], [red, red])
        >>> bool(-1 <= metric.compute() <= 1)
        True
        >>> RegisteredMetric("emscore", clip, vidual="image")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        capreward.registry.UnknownOption: RegisteredMetric('emscore')() got an unexpected keyword argument 'vidual' (did you mean 'visual'?); ...
    """

    #: the metric this class is fixed to (the per-metric subclasses), None for the generic class
    metric: str | None = None
    #: the class fixed to each metric that has one (filled as the classes are defined)
    named: dict[str, type] = {}
    __signature__ = ClassSignature(_metric_signature)
    columns = _OfTheMetric(metric_columns, CaptionMetric.columns)
    default_name = _OfTheMetric(lambda spec: spec.name, CaptionMetric.default_name)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.metric is not None:
            RegisteredMetric.named.setdefault(cls.metric, cls)

    def __init__(self, *args: Any, **options: Any):
        from .. import registry
        from ..explicit_options import check_options, constructor_parameters

        fixed = type(self).metric
        args_ = list(args)
        if fixed is None:
            if not args_:
                raise TypeError("RegisteredMetric() needs a metric name: RegisteredMetric('emscore', ...)")
            name = args_.pop(0)
        else:
            name = fixed
        spec = registry.get(name)
        owner = type(self).__name__ if fixed is not None else f"RegisteredMetric({spec.name!r})"
        signature, names = metric_parameters(spec.name)
        first = next(iter(signature.parameters))
        if len(args_) > 1:
            raise TypeError(f"{owner}() takes one positional argument ({first}), got {len(args_)}")
        if args_:
            if first in options:
                raise TypeError(f"{owner}() got multiple values for argument {first!r}")
            options[first] = args_[0]
        if names is not None:
            check_options(owner, options, names)
        scorer = options.pop("scorer", None)
        visual = fixed_visual(spec) or options.pop("visual", spec.default_visual)
        metric_kw = {k: options.pop(k) for k in _METRIC_OPTION_NAMES if k in options}
        scorer_options = {k: v for k, v in {**(options.pop("scorer_kwargs", None) or {}), **options}.items()}
        params = constructor_parameters(spec.load())[0]
        required = params[0].name if params and params[0].default is inspect.Parameter.empty else None
        if scorer is None:
            if required is not None and scorer_options.get(required) is None:
                raise ValueError(f"give either {required}= or scorer=")
            scorer = spec.load()(**scorer_options)
        else:
            both = next((k for k, v in scorer_options.items() if v is not None), None)
            if both is not None:
                raise ValueError(f"give either scorer= or {both}=, not both")
        config = spec.config_of(scorer)
        if visual is None and spec.visual_required(config):
            raise ValueError(f"{spec.title} needs visuals: visual must be 'image' or 'video'")
        kinds = spec.visual_kinds(config)
        if visual in _VISUAL_KINDS and visual not in kinds:  # another value: CaptionMetric names the choices
            raise ValueError(f"{spec.title} scores {' and '.join(k + 's' for k in kinds)} only{spec.with_config(config)}: "
                             f"use visual={kinds[0]!r}")
        self.metric = spec.name
        self.columns = metric_columns(spec, config)
        self.judge_text = spec.judged_by_llm
        self.row_inputs = spec.row_inputs
        if metric_kw.get("name") is None:
            own = _spec_of_scorer(scorer)  # PAC-S's scorer in CLIP-S's Metric: named pac_s
            metric_kw["name"] = own.name if own is not None else spec.name
        super().__init__(scorer, visual=visual, **metric_kw)

    @property
    def spec(self) -> Any:
        """The metric's spec (:class:`~capreward.registry.MetricSpec`)."""
        from .. import registry

        return registry.get(cast(str, self.metric))  # set on every instance

    @classmethod
    def class_for(cls, metric: str) -> Any:
        """``metric``'s Metric class (``EMScoreMetric``), else this class fixed to it
        (:func:`~capreward.explicit_options.class_for`).

        Args:
            metric: a metric name or alias.

        Returns:
            The class, or a callable building the generic Metric.
        """
        from ..explicit_options import class_for

        return class_for(RegisteredMetric.named, RegisteredMetric, metric)

    @staticmethod
    def signature_of(metric: str) -> inspect.Signature:
        """The options ``RegisteredMetric(metric, ...)`` takes (the signature of its per-metric class).

        Args:
            metric: a metric name or alias.

        Returns:
            The options' signature (``RegisteredMetric.signature_of("emscore")`` lists ``idf``).
        """
        return metric_parameters(metric)[0]

    def _config(self) -> dict[str, Any]:
        return self.spec.config_of(self.scorer)

    @property
    def plot_lower_bound(self) -> float:
        """The bottom of the metric's range."""
        return self.spec.range_of(self._config())[0]

    @property
    def plot_upper_bound(self) -> float:
        """The top of the metric's range (CLIP-S: its ``w``)."""
        return self.spec.range_of(self._config())[1]

    def _mode_config(self, has_visuals: bool, has_refs: bool) -> dict[str, Any]:
        config = self._config()
        with_refs = has_refs and self.spec.references_for(config) != "none"
        return {**config, "visual": self.visual if has_visuals else None, "references": with_refs}

    def _check_mode(self, has_visuals: bool, has_refs: bool, has_inputs: bool = False) -> None:
        spec, config = self.spec, self._config()
        where = spec.with_config(config)
        if not has_visuals and spec.visual_required(config):
            raise ValueError(f"{self.name}: {spec.title}{where} needs visuals (images or videos) in every update")
        mode = spec.references_for(config)
        if has_refs and mode == "none":
            raise ValueError(f"{self.name}: {spec.title}{where} takes no references")
        if not has_refs and mode == "required":
            raise ValueError(f"{self.name}: {spec.title}{where} needs references for every caption")
        super()._check_mode(has_visuals, has_refs, has_inputs)

    def _score_rows(self, candidates, visuals, references, visual_ids, **inputs):
        spec = self.spec
        mode = self._mode_config(visuals is not None, references is not None)
        kwargs: dict[str, Any] = dict(inputs)
        if visuals is not None:
            kwargs[f"{self.visual}s"] = visuals
        if mode["references"]:
            kwargs["references"] = references
        if visual_ids is not None:
            kwargs["visual_ids"] = visual_ids
        out = self.scorer.scores(candidates, **kwargs)
        out.check(spec.sub_scores_for(mode), spec.name)
        n = len(candidates)
        cols = {"score": out.value(spec.value_of(mode))}
        if "scored" in self.columns:
            cols["scored"] = [0.0 if math.isnan(v) else 1.0 for v in cols["score"]]
            self._log_unscored(candidates, cols["score"], out.errors)
        if spec.name in self.columns:
            cols[spec.name] = list(out.score)
        if "truncated" in self.columns:
            cols["truncated"] = [float(t) for t in out.extras.get("truncated", [False] * n)]
        for sub in spec.sub_scores_for(mode):
            if sub in self.columns:
                cols[sub] = out.value(sub)
        return self._row_tensor({k: torch.tensor(v, dtype=torch.float32) for k, v in cols.items()}, n)

    def _parts(self, has_visuals: bool, has_refs: bool) -> list[str]:
        spec = self.spec
        present = [s for s in spec.sub_scores_for(self._mode_config(has_visuals, has_refs)) if spec.kind_of(s) == "score"]
        return ["score", *([spec.name] if spec.name in self.columns else []), *(c for c in present if c in self.columns)]


class EMScoreMetric(RegisteredMetric):
    """EMScore as a torchmetrics Metric: the mean full F of EMScore(X, V), EMScore(X, X*) or
    EMScore(X, V, X*) depending on what ``update`` gets (in [-1, 1]; higher is better).

    Columns: ``score``, ``empty`` (1 for an empty caption), ``truncated`` (1 when the caption was cut
    to CLIP's context: only with a ``scorer`` built with ``long_captions="truncate"``; by default a long
    caption is read whole, see `capreward.backbones.windows`) and ``<part>/<component>`` for part in video/reference/combined and component in
    coarse, fine_p/r/f, full_p/r/f (NaN for parts not computed).

    Args: ``model`` (any CLIP specification) or ``backbone`` (a shared `CLIPBackbone`) or
    ``scorer`` (a configured `EMScore`); ``idf``, ``frames``, ``batch_size`` as for
    the scorer (``idf`` defaults to ``False``, no idf, where the released ``score()`` uses each batch's
    idf: pass a fixed corpus for idf weights that do not change with the validation batches, or
    ``idf="batch"`` for the release's default); ``visual``: ``"video"`` (default) or ``"image"``; see
    `CaptionMetric` for the rest.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.torchmetrics import EMScoreMetric
        >>> metric = EMScoreMetric(model=clip, visual="image")
        >>> metric.update(["a red image.", "a blue image."], [red, red])   # captions first, then visuals
        >>> float(metric.compute()) == float(EMScoreMetric(model=clip, visual="image")(["a red image.", "a blue image."], [red, red]))
        True
    """

    metric = "emscore"


class CLIPScoreMetric(RegisteredMetric):
    """CLIP-S (or RefCLIP-S when ``update`` gets references) as a torchmetrics Metric; in [0, w]
    (w = 2.5; PAC-S: pass ``scorer=PACScore(...)``, then named ``pac_s`` and in [0, 2]), higher is better.

    Columns: ``score`` (RefCLIP-S with references, else CLIP-S), ``empty``, ``truncated``, ``clip_s`` (the
    reference-free CLIP-S), ``ref`` (RefCLIP-S) and ``ref_similarity`` (max cosine to the references, in
    [-1, 1]).

    Args: ``model``/``backbone``/``scorer`` as for `EMScoreMetric`; ``w``; ``frames`` (for
    videos, scored through their mean frame embedding); ``visual``: ``"image"`` (default) or ``"video"``.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.torchmetrics import CLIPScoreMetric
        >>> right, wrong = CLIPScoreMetric(model=clip), CLIPScoreMetric(model=clip)
        >>> right.update(["a red image."], [red]); wrong.update(["a blue image."], [red])
        >>> bool(right.compute() > wrong.compute())
        True
    """

    metric = "clip_s"


class FLEURMetric(RegisteredMetric):
    """FLEUR (or RefFLEUR when ``update`` gets references) as a torchmetrics Metric; in [0, 1],
    higher is better.

    Columns: ``score`` (NaN where the judge's answer did not parse, so left out of the mean), ``empty``,
    ``scored`` (1 when the answer gave a score; its mean is the parse rate) and ``parsed`` (the greedy
    answer read as a number).

    Args: ``model`` (a LLaVA name or directory, a ``(model, processor)`` pair or a LocalJudge) or
    ``scorer`` (a configured `FLEUR`); ``device``, ``dtype``; ``visual``:
    ``"image"`` (default) or ``"video"`` (scored on FLEUR's three-frame composite).

    Examples:
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red")                # a fixed synthetic image
        >>> from capreward.torchmetrics import FLEURMetric
        >>> from capreward.testing import tiny_judge_dir
        >>> metric = FLEURMetric(model=str(tiny_judge_dir()))
        >>> metric.update(["a red car", "a yellow box"], [red, red])
        >>> bool(0 <= metric.compute() <= 1)
        True
    """

    metric = "fleur"


__all__ = ["CaptionMetric", "CaptionScores", "CLIPScoreMetric", "EMScoreMetric", "FLEURMetric", "RegisteredMetric",
           "metric_columns", "named_metrics", "nanmean"]
