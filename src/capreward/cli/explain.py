"""``capreward explain``: the judge's reasons for its scores, for every row of a manifest.

Writes one JSONL row per manifest row (resumable like ``capreward score``: rerun to continue, no row
twice): ``id``, ``caption``, ``image``/``video``, ``references`` (with ``--references``), ``metric``, the
score under the metric's name (null when there is none), the judge's first answer (``<metric>/raw``),
``explanation`` (null when there is no score to explain) and ``errors``.

Metrics: those whose spec says what an explanation is (:attr:`capreward.registry.MetricSpec.explanation`)
and whose scorer explains (``explanations``, see :class:`capreward.scorers.contract.Scorer`), built for
the command's options by the scorer class's ``for_explain`` (else with no argument).

The settings that change an explanation are fixed per output file as ``capreward score``'s are
(:func:`explanation_settings`, recorded in ``<out>.settings.json`` by
:func:`capreward.jobs.settings_file.check_settings`): a resume with any of them different is refused,
naming each, and an output with rows but no record needs ``--accept-unrecorded-settings``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

from .. import registry
from ..default_models import DEFAULT_LLAVA
from ..names import SEP
from .common import add_device_option, add_media_limit_options, add_resume_options, metric_name, whole_number

DESCRIPTION = """Writes one JSONL row per manifest row (resumable: rerun to continue, no row twice): id, caption,
image/video, references (with --references), metric, the score under the metric's name ({names},
null when there is none), the judge's first answer (<metric>/raw), explanation (null when there is no
score to explain) and errors.

Metrics: {metrics}.

The settings that change an explanation are fixed per output file: the first run records them (metric,
references, the judge model and its files' size and time, dtype, max new tokens, media limits; not the
batch size, device or progress) in <out>.settings.json, and a resume with any of them different is
refused, naming each; an output with rows but no settings record (from before they were recorded) is
refused unless --accept-unrecorded-settings. Resumes repair only a torn last line: any other line that is
not a result row stops the run with the file as it is (--quarantine-bad-lines moves such lines to
<out>.quarantine); a disk error and Ctrl-C end with one line saying how many rows are safe."""

#: How each setting in explain's settings record is set on the command line (for the refusal message; the
#: sub-score separator's text is :data:`capreward.jobs.settings_file.SEPARATOR_FLAG`).
EXPLAIN_FLAGS = {
    "metric": "--metric",
    "references": "--references",
    "judge_model": "--judge-model",
    "judge_dtype": "--dtype",
    "max_new_tokens": "--max-new-tokens",
    "max_pixels": "--max-pixels",
    "max_video_pixels": "--max-video-pixels",
}

Explainer = Callable[[list], list[dict]]  # manifest rows -> one result dict per row


def explainer_doc(spec) -> str:
    """``spec``'s line in the help: its :attr:`~capreward.registry.MetricSpec.explanation`."""
    return " ".join((spec.explanation or "").split()).replace("``", "").rstrip(".")


def explainer(spec, args: argparse.Namespace) -> Explainer:
    """``spec``'s explainer for the command's options: its scorer (``for_explain(args)`` when the class
    has it) asked ``explanations`` per visual kind; each row gets the score under the metric's name, its
    declared sub-scores (``<metric>/raw`` ...), ``explanation`` and ``_error``. With ``--references`` a row
    without references is an error."""
    from ..jobs.runners import finite_or_none, result_value

    cls = spec.load()
    scorer = cls.for_explain(args) if hasattr(cls, "for_explain") else cls()

    def run(rows: list) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        kinds: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            kinds.setdefault(r.kind, []).append(i)
        for kind, idx in kinds.items():
            refs = None
            if args.references:
                missing = next((rows[i].id for i in idx if rows[i].references is None), None)
                if missing is not None:
                    raise ValueError(f"--references: row {missing!r} has no references")
                refs = [rows[i].references for i in idx]
            res = scorer.explanations([rows[i].caption for i in idx], references=refs,
                                      **{f"{kind}s": [rows[i].path for i in idx]})
            for k, i in enumerate(idx):
                row = {spec.name: finite_or_none(res.score[k]),
                       **{spec.field_of(s): result_value(v[k]) for s, v in res.sub_scores.items()},
                       "explanation": res.extras["explanation"][k]}
                if res.errors[k]:
                    row["_error"] = res.errors[k]
                out[i] = row
        return out

    return run


def explainers() -> dict[str, Callable[[argparse.Namespace], Explainer]]:
    """Metric name -> ``build(args) -> explain(rows)``: the metrics whose spec says what they explain."""
    return {name: functools.partial(explainer, registry.get(name)) for name in registry.explaining()}


def __getattr__(name: str):
    if name == "EXPLAINERS":  # the table this module held before the specs named the explainers
        return explainers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def explanation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``args`` that change an explanation, as JSON values: ``metric``; ``references``
    (RefFLEUR / G-VEval's combined mode instead of the reference-free prompt); ``judge_model`` (a hub name
    as given, weights on local disk by :func:`~capreward.jobs.settings_file.model_identity`: path, size
    and modification time, so new weights at the same path count as another judge); ``judge_dtype``
    (``--dtype`` resolved: float16 on CUDA, else float32, when not given); ``max_new_tokens`` (where an
    explanation is cut); ``max_pixels`` and ``max_video_pixels`` (the limits in force: they decide which
    rows are refused, and a JPEG over ``max_pixels`` is decoded at a reduced scale, which the judge sees);
    ``sub_score_separator`` (``/`` in ``<metric>/raw``).

    Excluded: ``--batch-size`` (a row never depends on its batch), ``--device`` (a job may go on on
    another machine; the dtype it implies is recorded, what is left is other hardware's float
    arithmetic), ``--no-progress``, and the manifest and ``--out`` themselves."""
    from ..judges.loading import resolve_device, resolve_dtype
    from ..jobs.settings_file import model_identity
    from ..media.limits import get_media_limits
    from .common import resolve_device as resolve_auto

    limits = get_media_limits()  # main() sets --max-pixels / --max-video-pixels for the command
    return {
        "metric": args.metric,
        "references": bool(args.references),
        "judge_model": model_identity(args.judge_model),
        "judge_dtype": str(resolve_dtype(args.dtype, resolve_device(resolve_auto(args.device)))).removeprefix("torch."),
        "max_new_tokens": int(args.max_new_tokens),
        "max_pixels": limits.max_pixels,
        "max_video_pixels": limits.max_video_pixels,
        "sub_score_separator": SEP,
    }


def explain_manifest(args: argparse.Namespace) -> dict:
    """Explain every manifest row not yet in ``args.out`` (holding the output's writer lock, as
    ``capreward score`` does); returns counts {total, skipped, written, errors}.

    The manifest is read first (a bad one is refused before anything is written), then the settings are
    checked against ``<out>.settings.json`` or recorded there
    (:class:`~capreward.jobs.settings_file.SettingsMismatch` before ``--out`` is touched)."""
    from ..jobs.manifest import read_manifest
    from ..jobs.output_lock import exclusive_output
    from ..jobs.results_file import disk_errors
    from ..jobs.settings_file import SEPARATOR_FLAG, JobKind, check_settings

    with disk_errors(args.out), exclusive_output(args.out):
        rows = read_manifest(args.manifest)
        has_results = Path(args.out).is_file() and Path(args.out).stat().st_size > 0
        check_settings(args.out, explanation_settings(args), JobKind("explain", "explained", {**EXPLAIN_FLAGS, "sub_score_separator": SEPARATOR_FLAG}),
                       has_results=has_results, accept_unrecorded=args.accept_unrecorded_settings)
        return _explain_rows(args, rows)


def _explain_rows(args: argparse.Namespace, rows: list) -> dict:
    from tqdm import tqdm

    from ..jobs.results_file import ResultsWriter, read_results
    from ..jobs.runners import base_fields, isolate_errors
    from ..jobs.score_job import batches, unscored

    todo = unscored(rows, args.out, args.quarantine_bad_lines, references_used=args.references)
    written = 0
    if todo:
        explain = explainers()[args.metric](args)
        with ResultsWriter(args.out) as writer, tqdm(total=len(todo), unit="row", file=sys.stderr,
                                                      disable=args.no_progress, desc="explaining") as bar:
            for batch in batches(todo, args.batch_size):
                results = []
                # an explanation is about one visual: a several-image row gets an error, not its first image's
                single = [r for r in batch if not r.paths]
                explained = iter(isolate_errors(explain, single, args.metric) if single else [])
                outcomes = [next(explained) if not row.paths else
                            {"_error": f"the row has {len(row.paths)} images; an explanation is about one visual "
                                       "(give each image its own row)"} for row in batch]
                for row, fields in zip(batch, outcomes):
                    result = base_fields(row)
                    if not args.references:
                        result.pop("references", None)
                    result["metric"] = args.metric
                    err = fields.pop("_error", None)
                    result.update({args.metric: None, "explanation": None, **fields})
                    result["errors"] = {args.metric: err} if err else None
                    results.append(result)
                writer.write(results)
                written += len(results)
                bar.update(len(results))
    results = read_results(args.out)
    return {"total": len(rows), "skipped": len(rows) - len(todo), "written": written,
            "errors": sum(1 for r in results if r.get("errors"))}


def run(args: argparse.Namespace) -> int:
    from ..jobs.manifest import ManifestError

    try:
        summary = explain_manifest(args)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), file=sys.stderr)
    return 0


def add_parser(subparsers) -> None:
    names = registry.explaining()
    metrics = "; ".join(f"{n} ({explainer_doc(registry.get(n))})" for n in names)
    p = subparsers.add_parser(
        "explain", help=f"judge explanations ({', '.join(registry.get(n).title for n in names)}) for a manifest "
                        "(resumable)", description=DESCRIPTION.format(names=" / ".join(names), metrics=metrics))
    p.add_argument("manifest", help="JSONL rows: caption, image|video, optional references, id")
    p.add_argument("--out", required=True, help="explanations JSONL (appended to; rerun to resume)")
    p.add_argument("--metric", default=names[0] if names else None, choices=sorted(names), type=metric_name,
                   help="the judge metric to explain")
    p.add_argument("--references", action="store_true", help="use the rows' references (RefFLEUR / G-VEval combined)")
    p.add_argument("--judge-model", default=DEFAULT_LLAVA, help="LLaVA hub name or local directory")
    add_device_option(p)
    add_media_limit_options(p)
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"], help="default: float16 on GPU, float32 on CPU")
    p.add_argument("--batch-size", type=whole_number(1), default=8, help="rows judged at once")
    p.add_argument("--max-new-tokens", type=whole_number(1), default=512, help="length budget of an explanation")
    add_resume_options(p, "an output")  # --no-progress: added to every command by capreward.cli.main
    p.set_defaults(func=run)
