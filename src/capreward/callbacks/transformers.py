"""``CaptionEvalCallback``: caption metrics at each evaluation of a transformers / TRL trainer.

At every evaluation (``on_evaluate``) the callback generates captions for a held-out set with the
trainer's model, split across processes with ``accelerator.split_between_processes`` (padded so that
every process runs the same number of batches, which DeepSpeed ZeRO-3 generation needs), scores each
process's share with the metrics (synced by torchmetrics; the padding repeats are dropped by sample id),
gathers the captions with ``accelerate.utils.gather_object`` and logs ``eval_<metric>`` and
``eval_<metric>/<sub-score>`` (``eval_emscore/video/full_f``) through ``trainer.log`` on every process, as
``Trainer.evaluate`` does.

``on_evaluate`` runs after ``Trainer.evaluate`` has logged its own metrics, so values added to the
``metrics`` dict there are never logged; that is why this callback calls ``trainer.log``. With
``add_to_metrics=True`` it also puts its values into that dict, which ``Trainer`` reads afterwards for
``metric_for_best_model`` (e.g. ``"eval_emscore"``) and returns from ``trainer.evaluate()``.

Tested with ``Seq2SeqTrainer`` (a ``VisionEncoderDecoderModel``) and TRL's ``GRPOTrainer`` (a causal
LM policy with text prompts).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from .._extras import require
from ..torchmetrics.metrics import CaptionMetric, named_metrics
from ..torchmetrics.sources import Source, as_captions, as_references, read
from ..torchmetrics.summary import CaptionScores
from .generation import CaptionGenerator, has_image_blocks, is_image_processor
from .loggers import file_store_refusal, is_file_store
from .tables import TABLE_FORMATS, best_and_worst, examples_markdown, logged_means, merge_records, score_table, write_table

logger = logging.getLogger(__name__)


def default_generator(trainer: Any, dataset: Sequence[Mapping[str, Any]], input_keys: Sequence[str] | None,
                      prompt_key: str | None, image_key: str | None, max_new_tokens: int,
                      generation_kwargs: Mapping[str, Any] | None) -> CaptionGenerator:
    """The :class:`CaptionGenerator` for the trainer's ``processing_class`` and the examples' keys (see
    :class:`CaptionEvalCallback`), checked on the first example. Raises ValueError naming ``generate_fn``
    when the inputs cannot be told or the first example cannot be prepared."""
    processing_class = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    first = dataset[0]
    if input_keys is None and prompt_key is None:
        if "pixel_values" in first:
            input_keys = ("pixel_values",)
        elif "prompt" in first:
            prompt_key = "prompt"
        else:
            raise ValueError(
                f"cannot tell the model inputs from the example keys {sorted(first)}: give input_keys, "
                "prompt_key or generate_fn"
            )
    if image_key is None and prompt_key is not None and is_image_processor(processing_class):
        image_key = next((k for k in ("image", "images") if first.get(k) is not None), None)
        if image_key is None and has_image_blocks(first.get(prompt_key)):
            raise ValueError(
                f"the prompts have image blocks but the examples have no 'image' or 'images' (keys: {sorted(first)}): "
                "give image_key, or generate_fn=fn(model, examples) -> captions"
            )
    generator = CaptionGenerator(processing_class, input_keys=input_keys or (), prompt_key=prompt_key,
                                 image_key=image_key, max_new_tokens=max_new_tokens,
                                 generation_kwargs=generation_kwargs)
    try:
        generator.inputs([first], torch.device("cpu"))
    except Exception as exc:
        raise ValueError(
            f"the default caption generator cannot prepare example 0 with the trainer's processing_class "
            f"({type(processing_class).__name__}): {type(exc).__name__}: {exc}; pass "
            "generate_fn=fn(model, examples) -> list of captions"
        ) from exc
    return generator


def check_trainer_loggers(trainer: Any, prefix: str) -> None:
    """ValueError when the trainer reports to MLflow's file store, which cannot hold ``eval_emscore`` beside
    ``eval_emscore/video/full_f`` (see :mod:`capreward.callbacks.loggers`)."""
    import os

    handler = getattr(trainer, "callback_handler", None)
    mlflow_callbacks = [c for c in getattr(handler, "callbacks", ()) if type(c).__name__ == "MLflowCallback"]
    if not mlflow_callbacks:
        return
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:  # the mlflow module transformers' MLflowCallback imported (it exists only when mlflow does)
        uri = mlflow_callbacks[0]._ml_flow.get_tracking_uri()
    if is_file_store(uri):
        raise ValueError(file_store_refusal(uri, f"{prefix}emscore", "CaptionEvalCallback"))


class CaptionEvalCallback(TrainerCallback):
    """Generate captions for ``dataset`` at each evaluation, score them, log through the trainer.

    Args:
        trainer: the ``Trainer`` (``Seq2SeqTrainer``, TRL ``GRPOTrainer`` …) this callback is added to
            (``trainer.add_callback(callback)``); its accelerator splits the work and its ``log`` logs.
        dataset: held-out examples (a list of dicts or a ``datasets.Dataset``); example ``i`` has id ``i``.
        metrics: `CaptionMetric` instances (list, or mapping name → metric).
        generate_fn: ``fn(model, examples) -> list[str]``; default: `CaptionGenerator` built from
            ``input_keys``/``prompt_key``/``image_key`` (inferred: ``"pixel_values"`` if examples have it,
            else ``"prompt"``, with ``"image"`` or ``"images"`` as the prompt's image when the examples
            have one and the trainer's ``processing_class`` is a processor with an image processor, as for a
            VLM policy trained by TRL on an image column) and the trainer's ``processing_class``. The
            default generator prepares the first example at construction: what it cannot prepare (no
            chat template, a prompt it cannot read) fails there, naming ``generate_fn``.
        visuals: example key (or ``fn(example)``, or mapping metric name → source) of each sample's video or
            image; references: key or ``fn(example)`` of its reference captions (None: none).
        batch_size: examples per ``generate`` call on each process.
        max_new_tokens: passed to the default generator.
        generation_kwargs: passed to the default generator.
        prefix: log key prefix (``"eval_"``, the Trainer's convention).
        log_sub_scores: also log ``<prefix><metric>/<column>`` means (refused at construction when the
            trainer reports to MLflow's file store, which cannot hold a key beside keys under it).
        add_to_metrics: also add the values to the ``metrics`` dict of ``on_evaluate``.
        table: ``"jsonl"``/``"csv"``: write every caption and its scores per evaluation to ``table_dir``
            (default ``<output_dir>/caption_eval``) on the main process; None: no file.
        examples: how many best/worst captions (by the first metric) to keep in ``last_examples`` and
            write to the log (INFO).

    After an evaluation: ``history`` (one dict of logged values per evaluation, with ``step``),
    ``last_table`` (per-sample rows) and ``last_examples`` (Markdown of the best/worst captions).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> import tempfile
        >>> from transformers import Trainer, TrainingArguments
        >>> from capreward.callbacks import CaptionEvalCallback
        >>> from capreward.torchmetrics import CLIPScoreMetric
        >>> from capreward.testing.tiny_captioner import build_tiny_captioner
        >>> model, processor, tokenizer = build_tiny_captioner(seed=0)   # a tiny ViT-GPT2 captioner
        >>> held_out = [{"pixel_values": processor(red, return_tensors="pt").pixel_values[0], "image": red}] * 2
        >>> args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, disable_tqdm=True)
        >>> trainer = Trainer(model=model, args=args, processing_class=tokenizer)
        >>> callback = CaptionEvalCallback(trainer, held_out, [CLIPScoreMetric(model=clip)], visuals="image",
        ...                                max_new_tokens=4, generation_kwargs={"suppress_tokens": [0, 1, 3]},
        ...                                table=None, examples=0)
        >>> logs = callback.evaluate()                   # what each evaluation logs through the trainer
        {'eval_clip_s': ...}
        >>> logs["eval_clip_s/empty"], len(callback.last_table)
        (0.0, 2)
    """

    def __init__(
        self,
        trainer: Any,
        dataset: Sequence[Mapping[str, Any]],
        metrics: Sequence[CaptionMetric] | Mapping[str, CaptionMetric],
        *,
        generate_fn: Callable[[Any, list], list[str]] | None = None,
        input_keys: Sequence[str] | None = None,
        prompt_key: str | None = None,
        image_key: str | None = None,
        visuals: Source | Mapping[str, Source] = "video",
        references: Source = None,
        batch_size: int = 8,
        max_new_tokens: int = 32,
        generation_kwargs: Mapping[str, Any] | None = None,
        prefix: str = "eval_",
        log_sub_scores: bool = True,
        add_to_metrics: bool = False,
        table: str | None = "jsonl",
        table_dir: str | Path | None = None,
        examples: int = 5,
    ):
        if len(dataset) == 0:
            raise ValueError("the held-out caption dataset is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if table is not None and table not in TABLE_FORMATS:
            raise ValueError(f"table must be one of {TABLE_FORMATS} or None, got {table!r}")
        self.trainer = trainer
        self.dataset = dataset
        self.metrics = named_metrics(metrics)
        if isinstance(visuals, Mapping):
            unknown = sorted(set(visuals) - set(self.metrics))
            if unknown:
                raise ValueError(f"visuals given for unknown metrics {unknown}; metrics are {sorted(self.metrics)}")
        if generate_fn is None:
            generate_fn = default_generator(trainer, dataset, input_keys, prompt_key, image_key, max_new_tokens,
                                            generation_kwargs)
        self.generate_fn = generate_fn
        if log_sub_scores:
            check_trainer_loggers(trainer, prefix)
        self.visuals = visuals
        self.references = references
        self.batch_size = batch_size
        self.prefix = prefix
        self.log_sub_scores = log_sub_scores
        self.add_to_metrics = add_to_metrics
        self.table = table
        self.table_dir = None if table_dir is None else Path(table_dir)
        self.examples = examples
        self.history: list[dict[str, float]] = []
        self.last_table: list[dict] | None = None
        self.last_examples: str | None = None

    # -------------------------------------------------------------------------------------- hook
    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if not self._first_of_round(metrics):
            return  # Trainer.evaluate with a dict of eval datasets fires once per dataset: score once
        values = self.evaluate(model)
        if self.add_to_metrics and metrics is not None:
            metrics.update(values)

    def _first_of_round(self, metrics: Mapping[str, Any] | None) -> bool:
        eval_dataset = getattr(self.trainer, "eval_dataset", None)
        if not isinstance(eval_dataset, dict) or not eval_dataset or not metrics:
            return True
        first = next(iter(eval_dataset))
        return any(k.startswith(f"eval_{first}_") for k in metrics)

    # ------------------------------------------------------------------------------------- public
    def evaluate(self, model: Any = None) -> dict[str, float]:
        """Generate, score and log now (call it on every process).

        Args:
            model: the model to caption with (None: the trainer's).

        Returns:
            The logged values, means over the held-out set: ``<prefix><metric>`` in the metric's range
            and ``<prefix><metric>/<column>`` for its sub-scores; NaN values are not logged.
        """
        trainer = self.trainer
        accelerator = trainer.accelerator
        model = accelerator.unwrap_model(model if model is not None else trainer.model)
        was_training = model.training
        model.eval()
        try:
            # Everything, logging included, in eval mode: GRPOTrainer.log files the values it merges in
            # under "train" or "eval" by the model's mode, so logging in train mode would mix our entry
            # with (and clear) the pending training metrics.
            return self._evaluate(model, trainer, accelerator)
        finally:
            model.train(was_training)

    def _evaluate(self, model, trainer, accelerator) -> dict[str, float]:
        for m in self.metrics.values():
            m.reset()
            m.to(accelerator.device)  # the metric's states only; the shared scorer stays where it is

        records = self._generate_and_update(model, accelerator)
        scores: dict[str, CaptionScores] = {name: m.summary() for name, m in self.metrics.items()}  # collective
        gather_object = require("callbacks", "accelerate.utils", used_by="CaptionEvalCallback").gather_object

        gathered = gather_object(records) if accelerator.num_processes > 1 else records
        rows = score_table(merge_records([gathered], by_id=True), scores)
        self.last_table = rows

        logs = logged_means(scores, self.prefix, self.log_sub_scores)
        logs = {k: float(v) for k, v in logs.items() if not math.isnan(v)}  # JSON loggers reject NaN
        trainer.log(dict(logs))  # Trainer.log adds "epoch" to the dict it gets
        step = trainer.state.global_step
        self.history.append({"step": step, **logs})
        if accelerator.is_main_process:
            self._write(rows, step, trainer.args.output_dir)
        for m in self.metrics.values():
            m.reset()
        return logs

    # ---------------------------------------------------------------------------------- internals
    def _generate_and_update(self, model, accelerator) -> list[dict]:
        """Generate and score this process's share of the held-out set; return its caption records."""
        records: list[dict] = []
        with accelerator.split_between_processes(list(range(len(self.dataset))), apply_padding=True) as local:
            local = list(local)
        for start in range(0, len(local), self.batch_size):
            ids = local[start : start + self.batch_size]
            examples = [self.dataset[i] for i in ids]
            with torch.no_grad():
                captions = as_captions(self.generate_fn(model, examples), len(ids), "generated captions")
            refs = None
            if self.references is not None:
                refs = as_references([read(self.references, ex, "references") for ex in examples], len(ids))
            for name, metric in self.metrics.items():
                source = self.visuals.get(name) if isinstance(self.visuals, Mapping) else self.visuals
                visuals = None if source is None else [read(source, ex, f"visuals for {name}") for ex in examples]
                metric.update(captions, visuals, refs, ids=ids)
            records += [
                {"id": i, "caption": c, "references": None if refs is None else refs[j]}
                for j, (i, c) in enumerate(zip(ids, captions))
            ]
        return records

    def _write(self, rows: list[dict], step: int, output_dir: str | None) -> None:
        if self.table is not None:
            directory = self.table_dir or Path(output_dir or ".") / "caption_eval"
            path = write_table(rows, directory / f"step-{step:07d}.{self.table}", self.table)
            logger.info("caption scores written to %s", path)
        if self.examples > 0:
            key = next(iter(self.metrics))
            best, worst = best_and_worst(rows, key, self.examples)
            self.last_examples = examples_markdown(best, worst, key)
            logger.info("caption examples at step %d:\n%s", step, self.last_examples)
