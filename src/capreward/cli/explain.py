"""``capreward explain``: the judge's reasons for its scores, for every row of a manifest.

Writes one JSONL row per manifest row (resumable like ``capreward score``: rerun to continue, no row
twice): ``id``, ``caption``, ``image``/``video``, ``references`` (with ``--references``), ``metric``, the
score under the metric's name (``fleur`` / ``gveval``, null when there is none), the judge's first
answer (``<metric>/raw``), ``explanation`` (null when there is no score to explain) and ``errors``.

Metrics: ``fleur`` (FLEUR, or RefFLEUR with ``--references``: the score, then the follow-up question
"Why? Tell me the reason.") and ``gveval`` (G-VEval: the judge writes its reasoning before the score;
that reasoning is the explanation). Each is an :class:`Explainer` in :data:`EXPLAINERS`.

The settings that change an explanation are fixed per output file as ``capreward score``'s are
(:func:`explanation_settings`, recorded in ``<out>.settings.json`` by
:func:`capreward.jobs.settings_file.check_settings`): a resume with any of them different is refused,
naming each, and an output with rows but no record needs ``--accept-unrecorded-settings``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from ..jobs.settings_file import SEPARATOR_FLAG
from ..names import SEP, sub_score
from .common import add_device_option, add_media_limit_options, add_resume_options, metric_name

DESCRIPTION = """Writes one JSONL row per manifest row (resumable: rerun to continue, no row twice): id, caption,
image/video, references (with --references), metric, the score under the metric's name (fleur / gveval,
null when there is none), the judge's first answer (<metric>/raw), explanation (null when there is no
score to explain) and errors.

Metrics: fleur (FLEUR, or RefFLEUR with --references: the score, then the follow-up question "Why? Tell
me the reason.") and gveval (G-VEval: the judge writes its reasoning before the score; that reasoning is
the explanation).

The settings that change an explanation are fixed per output file: the first run records them (metric,
references, the judge model and its files' size and time, dtype, max new tokens, media limits; not the
batch size, device or progress) in <out>.settings.json, and a resume with any of them different is
refused, naming each; an output with rows but no settings record (from before they were recorded) is
refused unless --accept-unrecorded-settings. Resumes repair only a torn last line: any other line that is
not a result row stops the run with the file as it is (--quarantine-bad-lines moves such lines to
<out>.quarantine); a disk error and Ctrl-C end with one line saying how many rows are safe."""

#: How each setting in explain's settings record is set on the command line (for the refusal message).
EXPLAIN_FLAGS = {
    "metric": "--metric",
    "references": "--references",
    "judge_model": "--judge-model",
    "judge_dtype": "--dtype",
    "max_new_tokens": "--max-new-tokens",
    "max_pixels": "--max-pixels",
    "max_video_pixels": "--max-video-pixels",
    "sub_score_separator": SEPARATOR_FLAG,
}

Explainer = Callable[[list], list[dict]]  # manifest rows -> one result dict per row


def _split_by_kind(rows: list) -> dict[str, list[int]]:
    kinds: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        kinds.setdefault(r.kind, []).append(i)
    return kinds


def fleur_explainer(args: argparse.Namespace) -> Explainer:
    """FLEUR score and explanation per row; a row without a score gets the reason and no explanation."""
    from ..scorers.fleur import FLEUR

    scorer = FLEUR(model=args.judge_model, device=args.device, dtype=args.dtype, batch_size=args.batch_size,
                   explain_max_new_tokens=args.max_new_tokens)

    def run(rows: list) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, idx in _split_by_kind(rows).items():
            caps = [rows[i].caption for i in idx]
            visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
            refs = [rows[i].references for i in idx] if args.references else None
            if refs is not None and any(r is None for r in refs):
                missing = next(rows[i].id for i in idx if rows[i].references is None)
                raise ValueError(f"--references: row {missing!r} has no references")
            res = scorer.score(caps, references=refs, **visual)
            scores = res.score.tolist()
            ok = [k for k, s in enumerate(scores) if not math.isnan(s)]
            explanations: dict[int, str] = {}
            if ok:
                sub = {key: [v[k] for k in ok] for key, v in visual.items()}
                texts = scorer.explain([caps[k] for k in ok], references=[refs[k] for k in ok] if refs else None,
                                       scores=[scores[k] for k in ok], **sub)
                explanations = dict(zip(ok, texts))
            for k, i in enumerate(idx):
                row = {"fleur": None if math.isnan(scores[k]) else scores[k], sub_score("fleur", "raw"): res.raw[k],
                       "explanation": explanations.get(k)}
                if res.error[k]:
                    row["_error"] = res.error[k]
                out[i] = row
        return out

    return run


def gveval_explainer(args: argparse.Namespace) -> Explainer:
    """G-VEval score per row with the judge's written reasoning as the explanation."""
    from ..judges.local import LocalJudge
    from ..judges.local_chat import LocalChatJudge
    from ..scorers.gveval import GVEval

    judge = LocalJudge(args.judge_model, device=args.device, dtype=args.dtype)
    scorer = GVEval(LocalChatJudge(judge, batch_size=args.batch_size), mode="combined" if args.references else "ref-free",
                    max_tokens=args.max_new_tokens)

    def run(rows: list) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, idx in _split_by_kind(rows).items():
            visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
            refs = [rows[i].references or [] for i in idx] if args.references else None
            res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
            for k, i in enumerate(idx):
                score = float(res.score[k])
                row = {"gveval": None if math.isnan(score) else score, sub_score("gveval", "raw"): res.raw[k],
                       "explanation": res.raw[k] or None}
                if res.error[k]:
                    row["_error"] = res.error[k]
                out[i] = row
        return out

    return run


EXPLAINERS: dict[str, Callable[[argparse.Namespace], Explainer]] = {
    "fleur": fleur_explainer,
    "gveval": gveval_explainer,
}


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
    from ..jobs.settings_file import JobKind, check_settings

    with disk_errors(args.out), exclusive_output(args.out):
        rows = read_manifest(args.manifest)
        has_results = Path(args.out).is_file() and Path(args.out).stat().st_size > 0
        check_settings(args.out, explanation_settings(args), JobKind("explain", "explained", EXPLAIN_FLAGS),
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
        explain = EXPLAINERS[args.metric](args)
        with ResultsWriter(args.out) as writer, tqdm(total=len(todo), unit="row", file=sys.stderr,
                                                      disable=args.no_progress, desc="explaining") as bar:
            for batch in batches(todo, args.batch_size):
                results = []
                for row, fields in zip(batch, isolate_errors(explain, batch, args.metric)):
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
    p = subparsers.add_parser("explain", help="judge explanations (FLEUR, G-VEval) for a manifest (resumable)",
                              description=DESCRIPTION)
    p.add_argument("manifest", help="JSONL rows: caption, image|video, optional references, id")
    p.add_argument("--out", required=True, help="explanations JSONL (appended to; rerun to resume)")
    p.add_argument("--metric", default="fleur", choices=sorted(EXPLAINERS), type=metric_name,
                   help="the judge metric to explain")
    p.add_argument("--references", action="store_true", help="use the rows' references (RefFLEUR / G-VEval combined)")
    p.add_argument("--judge-model", default="llava-hf/llava-1.5-13b-hf", help="LLaVA hub name or local directory")
    add_device_option(p)
    add_media_limit_options(p)
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"], help="default: float16 on GPU, float32 on CPU")
    p.add_argument("--batch-size", type=int, default=8, help="rows judged at once")
    p.add_argument("--max-new-tokens", type=int, default=512, help="length budget of an explanation")
    p.add_argument("--accept-unrecorded-settings", action="store_true",
                   help="resume an output that has rows but no <out>.settings.json (written before settings were "
                        "recorded), recording this run's settings as theirs: only if they are the same")
    add_resume_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run)
