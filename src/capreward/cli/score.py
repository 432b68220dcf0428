"""``capreward score``: score a JSONL manifest into a resumable JSONL (and optional CSV) file.

Metrics (``--metrics``, comma-separated; ``-`` and ``_`` are interchangeable) and the fields each
writes per row (each metric's spec in ``capreward.registry``; sub-score fields are named
``<metric>/<sub-score>``, as the rewards and callbacks log them):

{metrics}

EMScore's F and RefCLIP-S/RefPAC-S are formed sign-safely by default (--harmonic-mean sign-safe: in
[-1, 1], equal to the rewards' values and ranking captions as they do); --harmonic-mean released writes
the papers' 2ab/(a+b), which leaves the range when its parts have opposite signs. A caption over the
caption budget (--max-caption-chars 16384, --max-caption-claims 256) is not read: its row gets the reason.

The judge metrics run on the local LLaVA of ``--judge-model``, or on an OpenAI-compatible server
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
were recorded) is refused unless ``--accept-unrecorded-settings``. The idf of the metrics that weigh
tokens by it ({idf}) is fixed per results file: the first run records it in ``<out>.idf.json`` and every
resume reuses it (a resume that would use a different idf is refused). One run at a time writes a results
file: it holds ``<out>.lock`` (a second run on the same ``--out`` is refused, naming the holder's PID; a
killed run's lock does not block a rerun).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..default_models import DEFAULT_CLIP, DEFAULT_LLAVA
from .. import registry
from ..metric_flags import add_metric_flags, metric_flag_values
from .common import (add_caption_budget_options, add_device_option, add_media_limit_options, add_resume_options, metric_list,
                     spelled_aliases, whole_number)


def metric_lines() -> str:
    """One line per metric for the help page, read from the specs: its fields with and without
    references, the visuals it takes and what it needs."""
    lines = []
    for spec in registry.specs():
        bare = spec.fields({"references": False})
        with_refs = [f for f in spec.fields({"references": True}) if f not in bare]
        text = f"- {spec.name} ({spec.title}): {', '.join(bare)}"
        if with_refs and spec.references != "none":
            text += f"; with references also {', '.join(with_refs)}"
        if spec.writes_alignment:
            text += "; --alignment adds alignment (tokens SOS..EOS, best frame, similarity, idf weight)"
        if tuple(spec.visuals) != ("image", "video"):
            text += f" ({' and '.join(v + 's' for v in spec.visuals)} only)"
        if spec.references == "required":
            text += " (needs references)"
        flags = [f.flags[0] for f in spec.job_flags]
        if flags:
            text += f"; options: {', '.join(flags)}"
        lines.append(text + ".")
    return "\n".join(lines)


def description() -> str:
    """The help page's description: this module's text with the metrics of the registry."""
    return __doc__.format(metrics=metric_lines(), idf=", ".join(registry.using_idf())).replace("``", "")


def run(args: argparse.Namespace) -> int:
    from ..jobs.errors import JobError
    from ..jobs.manifest import ManifestError
    from ..jobs.runners import ScoreOptions
    from ..jobs.score_job import run_job

    precision = {"fp32": None}.get(args.precision, args.precision)
    options = ScoreOptions(
        metrics=args.metrics,
        clip_model=args.clip_model, judge_model=args.judge_model,
        judge_base_url=args.judge_base_url, judge_api_model=args.judge_api_model,
        judge_top_logprobs_cap=args.judge_top_logprobs_cap,
        metric_options=metric_flag_values(args, registry.job_flags()),
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
    p = subparsers.add_parser("score", help="score a JSONL manifest (resumable)", description=description(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", help="JSONL rows: caption, image|video, optional references, id")
    p.add_argument("--out", required=True, help="results JSONL (appended to; rerun to resume)")
    p.add_argument("--csv", help="also write the results as CSV")
    p.add_argument("--metrics", default="emscore", type=metric_list(registry.names()),
                   help=f"comma-separated, from: {', '.join(registry.names())}; any case, - for _, and the aliases "
                        f"{spelled_aliases(registry.names())} (default: emscore)")
    p.add_argument("--clip-model", default=DEFAULT_CLIP,
                   help=f"CLIP for {'/'.join(registry.sharing('clip'))} (one shared copy): name/tag, .pt path, ...")
    judges = "/".join(registry.on_backbone("chat_judge"))
    p.add_argument("--judge-model", "--fleur-model", dest="judge_model", default=DEFAULT_LLAVA,
                   help=f"local LLaVA name or dir for {judges} unless a server is given (one shared copy)")
    p.add_argument("--judge-base-url",
                   help=f"OpenAI-compatible server for {judges}, e.g. http://localhost:8000/v1 (vLLM); "
                        "API key from $OPENAI_API_KEY (unset: a placeholder, fine for vLLM)")
    p.add_argument("--judge-api-model",
                   help="model name on that server (alone: OpenAI's API with this model)")
    p.add_argument("--judge-top-logprobs-cap", type=whole_number(1), default=20,
                   help="the most top_logprobs the judge server serves (vLLM --max-logprobs; default 20): the "
                        "exact digit tree of a digit-by-digit judge asks this many alternatives per node")
    add_metric_flags(p, registry.job_flags())  # each metric's own options, from its spec
    p.add_argument("--idf", default="auto",
                   help=f"idf of {'/'.join(registry.using_idf())} (default: auto = the manifest's references, none if it has "
                        "none); refs | none | FILE (one caption per line) | OUT.idf.json (a recorded idf). "
                        "Recorded in <out>.idf.json and reused on resume")
    p.add_argument("--frames", type=whole_number(0), default=10, help="frames per video (0: all)")
    p.add_argument("--image-aggregation", default="mean", choices=["mean", "min", "max"],
                   help="a row whose 'image' is a list of paths is scored on every image: its value is the mean, "
                        "min or max of theirs (per-image values in <metric>/per_image; default mean)")
    add_device_option(p)
    add_media_limit_options(p)
    add_caption_budget_options(p)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="CLIP precision")
    p.add_argument("--batch-size", type=whole_number(1), default=64, help="rows scored at once")
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local: this process; ray: Ray Data with --num-actors model copies")
    p.add_argument("--num-actors", type=whole_number(1), default=2, help="Ray actors (one model copy each)")
    p.add_argument("--alignment", action="store_true",
                   help="store the token -> frame alignment of "
                        f"{'/'.join(s.name for s in registry.specs() if s.writes_alignment)} (for reports)")
    add_resume_options(p)  # --no-progress: added to every command by capreward.cli.main
    p.set_defaults(func=run)
