"""``CaptionScoreCallback``: caption metrics on Lightning's validation (and test) loop.

Per validation batch the callback reads the generated captions from ``validation_step``'s output and
the visuals, references and sample ids from the batch, and updates its metrics. At epoch end it
computes them (synced across processes by torchmetrics) and logs ``val/<metric>`` and
``val/<metric>/<sub-score>`` (``val/emscore/video/full_f``: the ``/`` of every capreward sub-score name,
as in TRL's ``rewards/emscore/video/full_f``) through ``pl_module.log``, so
``ModelCheckpoint(monitor="val/emscore")`` and ``EarlyStopping`` work. MLflow's deprecated file store
keeps each metric in a file named by its key and so cannot hold ``val/emscore`` beside
``val/emscore/video/full_f``: with an ``MLFlowLogger`` on a ``file:`` store and sub-scores on, the
callback stops at setup saying so (use a database store, ``sqlite:///mlflow.db``, or
``log_sub_scores=False``). Optionally it writes every sample's caption and scores to
``<log_dir>/captions/val-epoch=NNN.jsonl`` (or ``.csv``) and sends the best and worst captions as a
text table to the loggers that take text (TensorBoard, Weights & Biases, MLflow, Comet).

Distributed validation: Lightning puts a ``DistributedSampler`` on the validation loader, which pads
the last round with repeated samples so that every process gets the same number of batches. The
metrics count each sample once and order them by dataset index when they get ids: the batch's
``"index"`` field when it has one (see ``ids=``), else the indices read from the loader's
``DistributedSampler`` (:func:`~capreward.callbacks.sample_ids`), so the results equal a single-process
run's without any change to the dataset. Where neither exists (an ``IterableDataset``, a custom
sampler) the repeats are counted and the metrics warn.

At setup the callback reads the first sample of the validation (and, with ``test=True``, test) loader
and loads its visual as each metric's kind (``visual="video"`` or ``"image"``), so a metric configured
for the other kind, or a ``visuals`` key the batches do not have, stops the run before the first
training step rather than at the first validation, after a whole epoch.

Works with ``lightning`` (``lightning.pytorch``) and with the standalone ``pytorch_lightning``
package: the trainers call callbacks by duck typing; the base class is taken from whichever is installed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from .._extras import require
from ..torchmetrics.distributed import gather_objects
from ..torchmetrics.metrics import CaptionMetric, named_metrics
from ..torchmetrics.sources import Source, as_captions, as_ids, as_references, per_sample, per_visual, read
from ..torchmetrics.summary import CaptionScores
from .loggers import file_store_refusal, is_file_store
from .sampler_ids import eval_loaders, sample_ids
from .tables import (
    TABLE_FORMATS,
    best_and_worst,
    example_columns,
    examples_markdown,
    logged_means,
    merge_records,
    score_table,
    write_table,
)

Callback: Any = require("callbacks", "lightning.pytorch", "pytorch_lightning", used_by="CaptionScoreCallback").Callback

logger = logging.getLogger(__name__)

_STAGES = {"validate": "val", "test": "test"}


def _source_name(source: Source | Mapping) -> Any:
    if callable(source):
        return getattr(source, "__qualname__", repr(source))
    if isinstance(source, Mapping):
        return {k: _source_name(v) for k, v in source.items()}
    return source


class CaptionScoreCallback(Callback):
    """Score generated captions with caption metrics during validation, log ``val/<metric>``.

    Args:
        metrics: `CaptionMetric` instances, as a list (logged under each
            metric's ``name``) or a mapping name → metric. Build them on one shared CLIP backbone.
        captions: where the captions are in ``validation_step``'s output: a key (default
            ``"captions"``), None (the output is the list of captions), or ``fn(outputs, batch)``.
        visuals: where the videos/images are in the batch: a key or index (default ``"video"``),
            ``fn(batch)``, None (reference-only metrics), or a mapping metric name → source.
        references: where each sample's reference captions are (key, index, ``fn(batch)`` or None).
            A default ``collate_fn`` transposes lists of lists: collate references per sample.
        ids: where the integer sample ids (dataset indices) are: default ``"index"`` (used when the
            batch has it, else read from the loader's DistributedSampler), a source, or None (no ids).
            Needed for exact results under a DistributedSampler.
        prefix: log key prefix for validation (``"val/"``); test uses ``test_prefix``.
        log_sub_scores: also log ``<prefix><metric>/<column>`` means (EMScore components, empty rate…).
        run_on_sanity_check: score the sanity-check batches too (skipped by default).
        test: also score the test loop (``trainer.test``) under ``test_prefix``.
        dataloader_idx: score only this validation dataloader (None: all of them, pooled; ids must then
            be unique across loaders).
        table: ``"jsonl"`` or ``"csv"`` to write every sample's caption and scores per epoch to
            ``table_dir`` (default ``<trainer.log_dir>/captions``); None to write nothing.
        examples: how many best and worst captions (by ``rank_by``, default the first metric) to log as a
            text table to loggers that support text; 0 disables it.
        prog_bar: show the first metric on the progress bar.

    Returns nothing; logged values are in ``trainer.callback_metrics``, the history of epoch means in
    ``callback.history`` and the last epoch's per-sample table in ``callback.last_table``.

    Examples:
        >>> from capreward.callbacks import CaptionScoreCallback
        >>> from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric
        >>> from capreward.testing import trained_clip_path
        >>> clip = str(trained_clip_path())
        >>> callback = CaptionScoreCallback([EMScoreMetric(model=clip), CLIPScoreMetric(model=clip, visual="video")])
        >>> sorted(callback.metrics)                     # logged as val/emscore, val/clip_s and their sub-scores
        ['clip_s', 'emscore']
    """

    def __init__(
        self,
        metrics: Sequence[CaptionMetric] | Mapping[str, CaptionMetric],
        captions: Source = "captions",
        visuals: Source | Mapping[str, Source] = "video",
        references: Source = None,
        ids: Source = "index",
        *,
        prefix: str = "val/",
        test_prefix: str = "test/",
        log_sub_scores: bool = True,
        run_on_sanity_check: bool = False,
        test: bool = False,
        dataloader_idx: int | None = None,
        table: str | None = None,
        table_dir: str | Path | None = None,
        examples: int = 5,
        rank_by: str | None = None,
        prog_bar: bool = True,
    ):
        super().__init__()
        self.metrics = named_metrics(metrics)
        if isinstance(visuals, Mapping):
            unknown = sorted(set(visuals) - set(self.metrics))
            if unknown:
                raise ValueError(f"visuals given for unknown metrics {unknown}; metrics are {sorted(self.metrics)}")
        if table is not None and table not in TABLE_FORMATS:
            raise ValueError(f"table must be one of {TABLE_FORMATS} or None, got {table!r}")
        if rank_by is not None and rank_by not in self.metrics:
            raise ValueError(f"rank_by={rank_by!r} is not one of the metrics {sorted(self.metrics)}")
        self.captions = captions
        self.visuals = visuals
        self.references = references
        self.ids = ids
        self.prefixes = {"validate": prefix, "test": test_prefix}
        self.log_sub_scores = log_sub_scores
        self.run_on_sanity_check = run_on_sanity_check
        self.score_test = test
        self.dataloader_idx = dataloader_idx
        self.table = table
        self.table_dir = None if table_dir is None else Path(table_dir)
        self.examples = examples
        self.rank_by = rank_by or next(iter(self.metrics))
        self.prog_bar = prog_bar
        self.history: list[dict[str, Any]] = []
        self.last_table: list[dict] | None = None
        self._records: list[dict] = []
        self._active = False

    # ------------------------------------------------------------------------------------ identity
    @property
    def state_key(self) -> str:
        return self._generate_state_key(prefix=self.prefixes["validate"], metrics=tuple(self.metrics))

    def config(self) -> dict[str, Any]:
        """The callback's configuration as plain data (sources shown by key or function name)."""
        return {
            "metrics": {n: type(m).__name__ for n, m in self.metrics.items()},
            "captions": _source_name(self.captions),
            "visuals": _source_name(self.visuals),
            "references": _source_name(self.references),
            "ids": _source_name(self.ids),
            "prefix": self.prefixes["validate"],
            "test_prefix": self.prefixes["test"],
            "table": self.table,
            "examples": self.examples,
        }

    def state_dict(self) -> dict[str, Any]:
        """Config and per-epoch history of means only (no metric states, no model weights)."""
        return {"config": self.config(), "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]

    # ------------------------------------------------------------------------------------- hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        """Check, before any step runs: the loggers can hold the keys this callback logs, and the first
        sample of each loader the callback scores has a visual of each metric's kind (see the module
        docstring). Raises ValueError (KeyError for a missing batch key) naming the metric and the fix."""
        if self.log_sub_scores:
            check_loggers(trainer.loggers, self.prefixes)
        if stage == "fit" and getattr(trainer, "limit_val_batches", 1) == 0:
            return  # no validation in this run
        if stage == "test" and not self.score_test:
            return
        for where, batch in first_samples(trainer, stage, self.dataloader_idx):
            self._check_visual_kinds(batch, where)

    def _check_visual_kinds(self, batch: Any, where: str) -> None:
        """Load the visual of the one-sample ``batch`` as each metric's kind; ValueError on a mismatch."""
        from ..media import MediaError, load_image, load_video

        for name, metric in self.metrics.items():
            source = self.visuals.get(name) if isinstance(self.visuals, Mapping) else self.visuals
            if source is None or metric.visual is None:
                continue
            if callable(source):
                try:
                    value = source(batch)
                except Exception:  # a user function may need more than one sample: the first batch will tell
                    continue
            else:
                value = read(source, batch, f"visuals for {name} (in {where})")
            if value is None:
                continue
            item = per_visual(value, None, metric.visual, f"visuals for {name} (in {where})")[0]
            try:
                if metric.visual == "video":
                    load_video(item, frames=1)
                else:
                    load_image(item)
            except MediaError as exc:
                other = "image" if metric.visual == "video" else "video"
                article = "an" if metric.visual == "image" else "a"
                raise ValueError(
                    f"CaptionScoreCallback: metric {name!r} takes {article} {metric.visual} (visual={metric.visual!r}) but "
                    f"the first sample of {where} cannot be read as one: {exc.problem}. If the batches hold "
                    f"{other}s, build the metric with visual={other!r}; else point visuals= at the {metric.visual} "
                    "(a key per metric: visuals={name: key})"
                ) from None

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._update(outputs, batch, dataloader_idx, trainer, batch_idx)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "validate")

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        if self.score_test:
            self._start(trainer, pl_module)

    on_test_batch_end = on_validation_batch_end  # a test batch is collected as a validation batch

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "test")

    # ---------------------------------------------------------------------------------- internals
    def _start(self, trainer, pl_module) -> None:
        self._active = self.run_on_sanity_check or not trainer.sanity_checking
        self._records = []
        for m in self.metrics.values():
            m.reset()
            # the metric's states only (so that they sync over the process group's device); the shared
            # scorer and its backbone stay where they are
            m.to(pl_module.device)

    def _update(self, outputs, batch, dataloader_idx: int, trainer=None, batch_idx: int = 0) -> None:
        if not self._active:
            return
        if self.dataloader_idx is not None and dataloader_idx != self.dataloader_idx:
            return
        if outputs is None:
            raise ValueError(
                "validation_step returned nothing: return the generated captions, e.g. {'captions': [...]}, "
                "for CaptionScoreCallback"
            )
        captions = as_captions(read(self.captions, outputs, "captions", batch) if self.captions is not None else outputs)
        n = len(captions)
        refs = None
        if self.references is not None:
            refs = as_references(read(self.references, batch, "references"), n)
        ids = self._read_ids(batch, n, trainer, batch_idx, dataloader_idx)
        for name, metric in self.metrics.items():
            source = self.visuals.get(name) if isinstance(self.visuals, Mapping) else self.visuals
            visuals = None if source is None else per_sample(read(source, batch, f"visuals for {name}"), n, "visuals")
            metric.update(captions, visuals, refs, ids=ids)
        for i, c in enumerate(captions):
            self._records.append({"id": None if ids is None else ids[i], "caption": c, "references": None if refs is None else refs[i]})

    def _read_ids(self, batch, n: int, trainer, batch_idx: int, dataloader_idx: int) -> list[int] | None:
        if self.ids is None:
            return None
        if self.ids == "index" and not _has_field(batch, "index"):
            # the default: the batch's own ids when present, else the loader's DistributedSampler's (dataset
            # indices, unique only within one loader: not when several loaders are pooled)
            if trainer is None or (self.dataloader_idx is None and len(eval_loaders(trainer)) > 1):
                return None
            derived = sample_ids(trainer, batch_idx, dataloader_idx)
            if derived is not None and len(derived) != n:
                logger.warning("CaptionScoreCallback: batch %d has %d captions but its sampler gave %d indices; "
                               "scoring it without ids", batch_idx, n, len(derived))
                derived = None
            return derived
        return as_ids(read(self.ids, batch, "ids"), n)

    def _finish(self, trainer, pl_module, stage: str) -> None:
        if not self._active:
            return
        self._active = False
        prefix = self.prefixes[stage]
        scores: dict[str, CaptionScores] = {name: m.summary() for name, m in self.metrics.items()}
        logged = logged_means(scores, prefix, self.log_sub_scores)
        for key, value in logged.items():
            # Values are already identical on every process (synced by torchmetrics): a max-reduce keeps
            # them exact and tells Lightning they are synced.
            pl_module.log(
                key, float(value), on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max",
                prog_bar=self.prog_bar and key == f"{prefix}{self.rank_by}",
            )
        self.history.append(
            {"stage": stage, "epoch": trainer.current_epoch, "step": trainer.global_step, "n": len(next(iter(scores.values()))), **logged}
        )
        if self.table is not None or self.examples > 0:
            self._tables(trainer, stage, scores)
        for m in self.metrics.values():
            m.reset()

    def _tables(self, trainer, stage: str, scores: dict[str, CaptionScores]) -> None:
        by_id = next(iter(scores.values())).ids is not None
        records = merge_records(gather_objects(self._records), by_id)
        self._records = []
        rows = score_table(records, scores)
        self.last_table = rows
        directory = None
        if self.table is not None:
            directory = self.table_dir or Path(trainer.log_dir or trainer.default_root_dir) / "captions"  # all ranks
        if not trainer.is_global_zero:
            return
        name = f"{_STAGES[stage]}-epoch={trainer.current_epoch:03d}-step={trainer.global_step}"
        if directory is not None:
            path = write_table(rows, directory / f"{name}.{self.table}", cast(str, self.table))  # a directory only with a table
            logger.info("caption scores written to %s", path)
        if self.examples > 0:
            best, worst = best_and_worst(rows, self.rank_by, self.examples)
            log_text(trainer.loggers, f"{self.prefixes[stage]}captions", best, worst, self.rank_by, _logger_step(trainer))


def check_loggers(loggers: Sequence[Any], prefixes: Mapping[str, str]) -> None:
    """ValueError when a logger cannot hold a metric beside its sub-scores (``val/emscore`` and
    ``val/emscore/video/full_f``): an MLFlowLogger on MLflow's file store, which writes each key as a
    file path."""
    for lg in loggers:
        uri = getattr(lg, "_tracking_uri", None)
        if type(lg).__name__ == "MLFlowLogger" and is_file_store(uri):
            raise ValueError(file_store_refusal(cast(str, uri), f"{prefixes['validate']}emscore", "CaptionScoreCallback"))


def first_samples(trainer, stage: str, dataloader_idx: int | None = None) -> list[tuple[str, Any]]:
    """``(where, batch)`` with a one-sample batch of each evaluation loader of the setup ``stage`` ("fit":
    the validation loaders of fit, "validate", "test"), collated by the loader's own ``collate_fn`` from
    ``dataset[0]``. Best effort: loaders without a map-style dataset (or an empty one), trainers whose
    loaders cannot be read before the loop runs, and a ``*_dataloader`` hook or collate function that fails
    this early (a module's hook may need the module's own ``setup``, which runs after the callbacks') give
    none, and the loop itself reports what is wrong."""
    if stage == "fit":
        loop = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "val_loop", None)
    else:
        loop = getattr(trainer, {"validate": "validate_loop", "test": "test_loop"}.get(stage, ""), None)
    source = getattr(loop, "_data_source", None)
    if source is None or not getattr(source, "is_defined", lambda: False)():
        return []
    try:
        loaders = source.dataloader()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logger.debug("CaptionScoreCallback: %s loaders not readable at setup (%s); visual kinds not checked", stage, exc)
        return []
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    elif not isinstance(loaders, Sequence):
        loaders = [loaders]
    out = []
    for i, loader in enumerate(loaders):
        if dataloader_idx is not None and i != dataloader_idx:
            continue
        dataset = getattr(loader, "dataset", None)
        collate = getattr(loader, "collate_fn", None)
        if dataset is None or collate is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            continue
        try:
            if len(dataset) == 0:
                continue
        except TypeError:  # an IterableDataset
            continue
        where = f"{'test' if stage == 'test' else 'validation'} loader {i}"
        try:
            out.append((where, collate([dataset[0]])))
        except Exception as exc:  # noqa: BLE001 - see the docstring
            logger.debug("CaptionScoreCallback: first sample of %s not readable at setup (%s)", where, exc)
    return out


def log_text(loggers: Sequence[Any], tag: str, best: list[dict], worst: list[dict], key: str, step: int) -> list[str]:
    """Send the best/worst captions to every logger that takes text; return the names of those that did.

    Weights & Biases gets a table (``log_text``); MLflow a ``.md`` artifact; Comet ``log_text``;
    TensorBoard, and any logger whose ``experiment`` has ``add_text``, Markdown through ``add_text``.
    Other loggers (CSV …) are skipped: use ``table=`` for files.
    """
    done = []
    text = examples_markdown(best, worst, key)
    for lg in loggers:
        kind = type(lg).__name__
        try:
            if kind == "WandbLogger":
                cols = ["rank"] + example_columns(best or worst, key)
                data = [[f"best {i + 1}"] + [_plain(r.get(c)) for c in cols[1:]] for i, r in enumerate(best)]
                data += [[f"worst {i + 1}"] + [_plain(r.get(c)) for c in cols[1:]] for i, r in enumerate(worst)]
                lg.log_text(key=tag, columns=cols, data=data, step=step)
            elif kind == "MLFlowLogger":
                lg.experiment.log_text(lg.run_id, text, f"{tag.replace('/', '_')}_step{step}.md")
            elif kind == "CometLogger":
                lg.experiment.log_text(text, step=step)
            elif kind == "TensorBoardLogger" or hasattr(getattr(lg, "experiment", None), "add_text"):
                lg.experiment.add_text(tag, text, global_step=step)
            else:
                continue
        except Exception as exc:  # a logger failing to take text must not stop training
            logger.warning("could not log caption examples to %s: %s", kind, exc)
            continue
        done.append(kind)
    return done


def _logger_step(trainer) -> int:
    """The step Lightning gives the loggers for this epoch's logged values (``val/<metric>`` …).

    Validation inside ``fit`` runs before the step counter of the loggers moves on, so the epoch-end
    values go to the loggers at ``global_step - 1``; the text table goes to the same step, beside the
    scores it ranks. Falls back to ``global_step`` where the trainer has no such counter.
    """
    step = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    return int(step) if isinstance(step, int) else int(trainer.global_step)


def _has_field(batch: Any, key: str) -> bool:
    if isinstance(batch, Mapping):
        return key in batch
    return hasattr(batch, key) and not callable(getattr(batch, key))


def _plain(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, list):
        return " / ".join(v)
    return v
