"""Run a scoring job over a manifest: skip rows already in the output, score the rest in batches,
append each batch durably, show progress (rate and ETA) on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from .manifest import ManifestRow, read_manifest
from .results_file import ResultsWriter, read_results, recover, write_csv
from .runners import ManifestScorer, ScoreOptions, idf_corpus_from


def batches(rows: list[ManifestRow], size: int):
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def pending_rows(manifest: str | Path, out: str | Path) -> tuple[list[ManifestRow], list[ManifestRow]]:
    """(all manifest rows, the rows not yet in ``out``); repairs a torn last line of ``out``."""
    rows = read_manifest(manifest)
    done = recover(out)
    return rows, [r for r in rows if r.id not in done]


def run_local(todo: list[ManifestRow], options: ScoreOptions, out: str | Path, progress: bool = True) -> int:
    """Score ``todo`` in this process; returns the number of rows written."""
    if not todo:
        return 0
    scorer = ManifestScorer(options)
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
            engine: str = "local", num_actors: int = 2, csv: str | Path | None = None, progress: bool = True) -> dict:
    """Score every manifest row not yet in ``out``; returns counts {total, skipped, written, errors}."""
    rows, todo = pending_rows(manifest, out)
    uses_idf = {"emscore", "hallucination"} & set(options.metrics)  # the same fixed idf for both
    options.idf_corpus = idf_corpus_from(idf, rows) if uses_idf else None
    if engine == "local":
        written = run_local(todo, options, out, progress)
    elif engine == "ray":
        from .ray_engine import run_ray

        written = run_ray(todo, options, out, num_actors=num_actors, progress=progress)
    else:
        raise ValueError(f"unknown engine {engine!r}; use 'local' or 'ray'")
    results = read_results(out)
    if csv is not None:
        order = {r.id: i for i, r in enumerate(rows)}
        write_csv(sorted(results, key=lambda r: order.get(r["id"], len(order))), csv)
    return {
        "total": len(rows),
        "skipped": len(rows) - len(todo),
        "written": written,
        "errors": sum(1 for r in results if r.get("errors")),
    }
