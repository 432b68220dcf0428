"""Run a scoring job over a manifest: lock the results file, check or record the job's scoring settings,
fix its idf, skip rows already in the output, score the rest in batches, append each batch durably, show
progress (rate and ETA) on stderr. A disk error on any of the job's files is one
:class:`~capreward.jobs.results_file.DiskError` saying how many rows are safe."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import registry
from .idf_file import choose_idf, job_idf
from .manifest import ManifestRow, read_manifest
from .output_lock import exclusive_output
from .results_file import ResultsWriter, disk_errors, read_results, recover_scan, write_csv
from .row_inputs import check_unchanged
from .runners import ManifestScorer, ScoreOptions
from .safe_files import check_job_file
from .settings_file import job_settings



def __getattr__(name: str):
    if name == "IDF_METRICS":  # metrics that weigh tokens by idf (they share the job's one idf table)
        from .. import registry

        return registry.using_idf()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def batches(rows: list[ManifestRow], size: int):
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def unscored(rows: list[ManifestRow], out: str | Path, quarantine: bool = False,
             references_used: bool = True) -> list[ManifestRow]:
    """The rows not yet in ``out``; repairs a torn last line of ``out``, refuses a file with other bad
    lines (:class:`~capreward.jobs.results_file.ResultsCorrupt`, nothing changed) or with ``quarantine``
    moves them to ``<out>.quarantine``, and refuses rows of ``out`` whose caption, references or visual
    changed since they were scored (:class:`~capreward.jobs.row_inputs.ChangedInputs`, naming them)."""
    found = recover_scan(out, quarantine=quarantine)
    check_unchanged([r for r in rows if r.id in found.ids], found.inputs, str(out), references_used)
    return [r for r in rows if r.id not in found.ids]


def run_local(todo: list[ManifestRow], options: ScoreOptions, out: str | Path, progress: bool = True,
              backbone=None) -> int:
    """Score ``todo`` in this process (sharing ``backbone`` when given); returns the number of rows written."""
    if not todo:
        return 0
    scorer = ManifestScorer(options, backbone=backbone)
    written = 0
    with ResultsWriter(out) as writer, tqdm(total=len(todo), unit="row", file=sys.stderr, disable=not progress,
                                          desc="scoring") as bar:
        for batch in batches(todo, options.batch_size):
            results = scorer.score_rows(batch)
            writer.write(results)
            written += len(results)
            bar.update(len(results))
    return written


def run_job(manifest: str | Path, out: str | Path, options: ScoreOptions, idf: str = "auto",
            engine: str = "local", num_actors: int = 2, csv: str | Path | None = None, progress: bool = True,
            accept_unrecorded_settings: bool = False, quarantine_bad_lines: bool = False) -> dict:
    """Score every manifest row not yet in ``out``; returns counts {total, skipped, written, errors} and,
    when a metric that weighs tokens by idf is scored (:func:`capreward.registry.using_idf`), ``idf``: where the job's idf comes from (``"auto: the 12
    references in manifest.jsonl"``, ``"none (every token weight 1)"`` …, as ``<out>.idf.json`` records it).

    Holds ``<out>.lock`` for the whole job (:class:`~capreward.jobs.output_lock.OutputLocked` if another
    run holds it), fixes the scoring settings per results file in ``<out>.settings.json``
    (:class:`~capreward.jobs.settings_file.SettingsMismatch` if a resume would change one, or if ``out``
    has rows but no record and not ``accept_unrecorded_settings``; checked before ``out`` is touched,
    whatever the engine) and the idf of the metrics that use one in ``<out>.idf.json``
    (:class:`~capreward.jobs.idf_file.IdfMismatch` if a resume would change it). A complete line of
    ``out`` that is not a result row stops the job with ``out`` unchanged
    (:class:`~capreward.jobs.results_file.ResultsCorrupt`), unless ``quarantine_bad_lines`` (then such
    lines move to ``<out>.quarantine``); a disk error on any of the job's files is a
    :class:`~capreward.jobs.results_file.DiskError` naming the file and the rows safe in ``out``."""
    if engine not in ("local", "ray"):
        raise ValueError(f"unknown engine {engine!r}; use 'local' or 'ray'")
    check_job_file(out, "--out")  # a link, device, FIFO or directory is refused before anything is opened
    if csv is not None:
        check_job_file(csv, "--csv")
    with disk_errors(out, csv), exclusive_output(out):
        rows = read_manifest(manifest)  # a bad manifest is refused before anything is written
        has_results = Path(out).is_file() and Path(out).stat().st_size > 0
        job_settings(out, options, has_results=has_results, accept_unrecorded=accept_unrecorded_settings)
        todo = unscored(rows, out, quarantine_bad_lines)
        clip: list[Any] = []  # the CLIP backbone, loaded at most once: for the idf table and the local scorers
        idf_source = None

        def backbone():
            if not clip:
                from ..backbones.clip import CLIPBackbone

                clip.append(CLIPBackbone(options.clip_model, device=options.device, precision=options.precision))
            return clip[0]

        def compute_idf(corpus: list[str]):
            from ..metrics.idf import idf_from_rows

            return idf_from_rows(backbone().context_rows(corpus), backbone().eot_id)

        if set(registry.using_idf()) & set(options.metrics):
            has_results = Path(out).is_file() and Path(out).stat().st_size > 0  # after a torn line's repair
            choice = choose_idf(idf, rows, manifest)
            table = job_idf(out, choice, has_results=has_results, compute=compute_idf,
                            clip_model=str(options.clip_model))
            idf_source = choice.source
            # the job's own copy: the caller's ScoreOptions is never written to
            options = dataclasses.replace(options, idf_weights=None if table is None else table.weights,
                                          idf_default=None if table is None else table.default)
        if engine == "local":
            written = run_local(todo, options, out, progress, backbone=clip[0] if clip else None)
        else:
            from .ray_engine import run_ray

            written = run_ray(todo, options, out, num_actors=num_actors, progress=progress)
        results = read_results(out)
        if csv is not None:
            order = {r.id: i for i, r in enumerate(rows)}
            write_csv(sorted(results, key=lambda r: order.get(r["id"], len(order))), csv)
    summary: dict[str, Any] = {
        "total": len(rows),
        "skipped": len(rows) - len(todo),
        "written": written,
        "errors": sum(1 for r in results if r.get("errors")),
    }
    if idf_source is not None:
        summary["idf"] = idf_source
    return summary
