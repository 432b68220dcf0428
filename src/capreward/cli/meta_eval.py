"""``capreward meta-eval``: correlate a scores file with a benchmark's human judgments.

The table (or, with ``--json``, exactly one JSON object) goes to stdout; the counts of unmatched
judgments with a few examples, and every other message, go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

BENCHMARK_CHOICES = ("flickr8k-expert", "flickr8k-cf", "composite", "pascal50s", "vatex-eval", "msvd-eval", "thumb", "foil",
                     "caparena", "detailcaps")
# every benchmark's protocol names (capreward.metaeval.PROTOCOLS; kept here so --help imports no scipy)
PROTOCOL_CHOICES = ("per-rating", "per-candidate", "per-caption", "per-annotator-average", "per-annotator",
                    "annotator-mean", "pairwise", "caption-level")


#: measures that are ratios, not percent (DetailCaps' 1 - R²)
RATIOS = ("one_minus_r2",)


def format_table(result) -> str:
    """The measures (percent) and counts as an aligned two-column text table."""
    rows = [(name, "n/a" if math.isnan(v) else f"{v:.1f}") if name not in RATIOS else
            (f"{name} (ratio)", "n/a" if math.isnan(v) else f"{v:.4g}") for name, v in result.measures.items()]
    dims = result.details.get("dimensions")
    if dims:
        for dim, vals in dims.items():
            rows += [(f"{dim}.{k}", "n/a" if math.isnan(v) else f"{v:.1f}") for k, v in vals.items()]
    counts = result.details.get("counts")
    if counts and len(counts) > 1:
        rows += [(f"{c}: hits/ties/unscored", f"{v['hits']}/{v['ties']}/{v['unscored']} of {v['pairs']}") for c, v in counts.items()]
    rows += [("n_matched", str(result.n_matched)), ("n_unmatched", str(result.n_unmatched)),
             ("n_unused_scores", str(result.n_unused_scores))]
    width = max(len(r[0]) for r in rows)
    header = f"{result.benchmark} (values in %)"
    return "\n".join([header, "-" * max(len(header), width + 12)] + [f"{k:<{width}}  {v:>8}" for k, v in rows])


def report_unmatched(result, examples: int) -> None:
    if result.n_unmatched:
        what = "pairs" if result.preferred else "judgment rows"
        print(f"warning: {result.n_unmatched} {what} have no score (counted as unmatched"
              + (", i.e. misses)" if result.preferred else ")"), file=sys.stderr)
        for u in result.unmatched[:examples]:
            print(f"  {u['image']} | {u['caption']!r}: {u['reason']} ({u['where']})", file=sys.stderr)
    if result.n_unused_scores:
        print(f"note: {result.n_unused_scores} scored captions match no judgment of {result.benchmark}", file=sys.stderr)
    if result.details.get("nan_ratings_dropped"):
        print(f"note: {result.details['nan_ratings_dropped']} NaN human ratings dropped", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import logging

    from ..metaeval import JudgmentError, meta_evaluate

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s: %(message)s")
    try:
        result = meta_evaluate(args.benchmark, args.judgments, args.scores, args.score_field, args.protocol)
    except (JudgmentError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report_unmatched(result, args.examples)
    if args.plot:
        from ..metaeval.plot import plot_result

        print(f"plot written to {plot_result(result, args.plot, args.score_field or 'score')}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_table(result))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("meta-eval", help="correlate scores with human judgments (benchmark protocols)",
                              description=__doc__)
    p.add_argument("--benchmark", required=True, choices=BENCHMARK_CHOICES, help="the benchmark and its protocol")
    p.add_argument("--judgments", required=True, help="the benchmark's released judgments file (VATEX-EVAL: its folder)")
    p.add_argument("--scores", required=True, help="JSONL with image|video, caption and a score (e.g. `capreward score` output)")
    p.add_argument("--score-field", help="field holding the score (default 'score', or the one metric in the file); "
                                         "a key such as clip_s or emscore/video/full_f, or a dotted path into nested objects")
    p.add_argument("--protocol", choices=PROTOCOL_CHOICES,
                   help="the benchmark's protocol (default: its first). flickr8k-expert: per-rating (CLIP-S/PAC-S) or "
                        "per-candidate (G-VEval: three ratings averaged); msvd-eval: per-annotator (G-VEval's release: "
                        "annotators' rows stacked) or annotator-mean")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="write a metric-vs-human plot")
    p.add_argument("--examples", type=int, default=5, help="unmatched judgments to show on stderr")
    p.set_defaults(func=run)
