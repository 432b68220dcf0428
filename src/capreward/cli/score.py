"""``capreward score``: score a JSONL manifest into a resumable JSONL (and optional CSV) file.

Metrics (``--metrics``, comma-separated; ``-`` and ``_`` are interchangeable) and the fields each
writes per row (details in ``capreward.jobs.runners``):

Sub-score fields are named ``<metric>/<sub-score>``, as the rewards and callbacks log them.

- ``emscore``: ``emscore``, ``emscore/<part>/<component>``; ``--alignment`` adds ``alignment``
  (tokens SOS..EOS, best frame, similarity, idf weight).
- ``clip_s`` / ``pac_s``: ``clip_s`` / ``pac_s`` (``ref_clip_s`` / ``ref_pac_s`` with references).
- ``hallucination``: ``hallucination`` in [-1, 0] (minus the weighted fraction of the caption's content
  words without a matching frame: 0 all supported, -1 none) and ``hallucination/flagged`` (positions of
  the flagged tokens in ``alignment.tokens``, outlined by ``capreward report``). Threshold:
  ``--hallucination-threshold``; uses the CLIP of ``--clip-model`` and the idf of ``--idf``.
- ``fleur``: ``fleur`` in [0, 1], ``fleur/raw`` (local LLaVA of ``--judge-model``, or the server below;
  videos on G-VEval's three-frame composite).
- ``visce2``: ``visce2`` in [0, 100], ``visce2/raw``, ``visce2/context`` (images only; a video row gets
  an error).
- ``gveval``: ``gveval`` in [0, 100], ``gveval/raw``; ``--gveval-accr`` adds ``gveval/accuracy``,
  ``gveval/completeness``, ``gveval/conciseness``, ``gveval/relevance`` (videos only). ``--gveval-mode``.

fleur, visce2 and gveval run on the local LLaVA of ``--judge-model``, or on an OpenAI-compatible server
(vLLM, OpenAI) when ``--judge-base-url`` or ``--judge-api-model`` is given; the API key is read from
``$OPENAI_API_KEY`` and never printed. A score that cannot be computed is null with the reason in
``errors[metric]``; the other rows and metrics are unaffected.

A row's scores never depend on the rest of its batch, the row order or a resume. Rerun the same command
to resume: only a torn last line (from a killed run) is repaired; any other line of ``--out`` that is not a
result row stops the run with the file left as it is (``--quarantine-bad-lines`` moves such lines to
``<out>.quarantine`` and goes on). A full disk, a read-only file system or a file that cannot be written,
and Ctrl-C, end with one line saying how many rows are safe. Manifest keys other than ``id``, ``caption``,
``image``, ``video`` and ``references`` are carried to the results as they are; a near miss of one of these
(``refrences``) is refused with "did you mean ...". The scoring settings are fixed per results file: the first run records those that change a
row (metrics, models and their files' size and time, frames, precision, judge options, ...; not the
batch size, device, engine or progress) in ``<out>.settings.json``, and a resume with any of them
different is refused, naming each; a results file with rows but no settings record (from before they
were recorded) is refused unless ``--accept-unrecorded-settings``. The idf of emscore and hallucination
is fixed per results file: the first run records it in ``<out>.idf.json`` and every resume reuses it (a
resume that would use a different idf is refused). One run at a time writes a results file:
it holds ``<out>.lock`` (a second run on the same ``--out`` is refused, naming the holder's PID; a killed
run's lock does not block a rerun).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..backbones.clip_loading import DEFAULT_CLIP
from .. import registry
from ..scorers.hallucination import DEFAULT_THRESHOLD
from .common import add_device_option, add_media_limit_options, add_resume_options, metric_list, spelled_aliases


def run(args: argparse.Namespace) -> int:
    from ..jobs.errors import JobError
    from ..jobs.manifest import ManifestError
    from ..jobs.runners import ScoreOptions
    from ..jobs.score_job import run_job

    precision = {"fp32": None}.get(args.precision, args.precision)
    options = ScoreOptions(
        metrics=args.metrics,
        clip_model=args.clip_model, pac_model=args.pac_model, judge_model=args.judge_model,
        judge_base_url=args.judge_base_url, judge_api_model=args.judge_api_model,
        judge_top_logprobs_cap=args.judge_top_logprobs_cap,
        gveval_mode=args.gveval_mode, gveval_accr=args.gveval_accr, qa_model=args.qa_model,
        hallucination_threshold=args.hallucination_threshold,
        device=args.device, precision=precision, batch_size=args.batch_size,
        frames=None if args.frames == 0 else args.frames, alignment=args.alignment,
        image_aggregation=args.image_aggregation,
    )
    try:
        summary = run_job(args.manifest, args.out, options, idf=args.idf, engine=args.engine,
                          num_actors=args.num_actors, csv=args.csv, progress=not args.no_progress,
                          accept_unrecorded_settings=args.accept_unrecorded_settings,
                          quarantine_bad_lines=args.quarantine_bad_lines)
    except (JobError, ManifestError) as exc:
        print(f"capreward score: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), file=sys.stderr)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("score", help="score a JSONL manifest (resumable)", description=__doc__.replace("``", ""),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", help="JSONL rows: caption, image|video, optional references, id")
    p.add_argument("--out", required=True, help="results JSONL (appended to; rerun to resume)")
    p.add_argument("--csv", help="also write the results as CSV")
    p.add_argument("--metrics", default="emscore", type=metric_list(registry.names()),
                   help=f"comma-separated, from: {', '.join(registry.names())}; any case, - for _, and the aliases "
                        f"{spelled_aliases(registry.names())} (default: emscore)")
    p.add_argument("--clip-model", default=DEFAULT_CLIP,
                   help="CLIP for emscore/clip-s/hallucination (one shared copy): name/tag, .pt path, ...")
    p.add_argument("--pac-model", help="PAC-S checkpoint path (for pac-s)")
    p.add_argument("--judge-model", "--fleur-model", dest="judge_model", default="llava-hf/llava-1.5-13b-hf",
                   help="local LLaVA name or dir for fleur/visce2/gveval unless a server is given (one shared copy)")
    p.add_argument("--judge-base-url",
                   help="OpenAI-compatible server for fleur/visce2/gveval, e.g. http://localhost:8000/v1 (vLLM); "
                        "API key from $OPENAI_API_KEY (unset: a placeholder, fine for vLLM)")
    p.add_argument("--judge-api-model",
                   help="model name on that server (alone: OpenAI's API with this model)")
    p.add_argument("--judge-top-logprobs-cap", type=int, default=20,
                   help="the most top_logprobs the judge server serves (vLLM --max-logprobs; default 20): the "
                        "exact digit tree of a digit-by-digit judge asks this many alternatives per node")
    p.add_argument("--gveval-mode", default="ref-free", choices=["ref-free", "ref-only", "combined"],
                   help="G-VEval inputs: visual only, references (+ visual), or both; ref-only/combined need "
                        "references on every row")
    p.add_argument("--qa-model", help="qa_utility's text-only judge: a causal LM name or directory (default: the judge "
                                      "server of --judge-base-url); questions come from each row's 'questions'")
    p.add_argument("--gveval-accr", action="store_true",
                   help="G-VEval's four ACCR scores (accuracy, completeness, conciseness, relevance; videos only)")
    p.add_argument("--hallucination-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="token->frame similarity below which a content word is flagged (an uncalibrated starting "
                        "point; set it from HallucinationPenalty.calibrate on known-good captions)")
    p.add_argument("--idf", default="auto",
                   help="idf of emscore/hallucination (default: auto = the manifest's references, none if it has "
                        "none); refs | none | FILE (one caption per line) | OUT.idf.json (a recorded idf). "
                        "Recorded in <out>.idf.json and reused on resume")
    p.add_argument("--frames", type=int, default=10, help="frames per video (0: all)")
    p.add_argument("--image-aggregation", default="mean", choices=["mean", "min", "max"],
                   help="a row whose 'image' is a list of paths is scored on every image: its value is the mean, "
                        "min or max of theirs (per-image values in <metric>/per_image; default mean)")
    add_device_option(p)
    add_media_limit_options(p)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="CLIP precision")
    p.add_argument("--batch-size", type=int, default=64, help="rows scored at once")
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local: this process; ray: Ray Data with --num-actors model copies")
    p.add_argument("--num-actors", type=int, default=2, help="Ray actors (one model copy each)")
    p.add_argument("--alignment", action="store_true",
                   help="store EMScore's token -> frame alignment (for reports; also with hallucination alone)")
    p.add_argument("--accept-unrecorded-settings", action="store_true",
                   help="resume a results file that has rows but no <out>.settings.json (written before settings "
                        "were recorded), recording this run's settings as theirs: only if they are the same")
    add_resume_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run)
