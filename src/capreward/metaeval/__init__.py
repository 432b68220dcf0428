"""Meta-evaluation: how well a metric's scores agree with human judgments, per benchmark protocol.

``meta_evaluate("flickr8k-expert", "flickr8k.json", "scores.jsonl")`` reads the judgments with the
benchmark's reader, matches scores by image and whitespace-normalised caption, and applies the protocol
(see :mod:`capreward.metaeval.protocols`).
"""

from __future__ import annotations

from pathlib import Path

from .judgments import Judgments, JudgmentError, PairItem, RatedItem, normalize_caption, visual_aliases
from .protocols import MSVD_PARTS, PROTOCOLS, MetaEvalResult, protocol_names, run_protocol
from .readers import BENCHMARKS, read_judgments
from .scores import ScoreIndex, ScoreRow, index_scores, read_scores
from .stats import kendall, pairwise_accuracy, pairwise_outcomes, pearson, spearman


def meta_evaluate(benchmark: str, judgments: str | Path | Judgments, scores: str | Path | list[ScoreRow],
                  score_field: str | None = None, protocol: str | None = None) -> MetaEvalResult:
    """How well a metric's scores agree with a benchmark's human judgments.

    Args:
        benchmark: one of :data:`BENCHMARKS` (``"flickr8k-expert"``, ``"pascal-50s"``...).
        judgments: a path read with ``benchmark``'s reader, or judgments already read.
        scores: a scores JSONL path (a ``capreward score`` results file), or its rows.
        score_field: the field holding the score (None: picked from the rows).
        protocol: one of ``protocol_names(benchmark)`` (default: the first).

    Returns:
        The :class:`MetaEvalResult`: the protocol's measures in percent and the match counts.

    Raises:
        JudgmentError: an unusable judgments or scores file.
        ValueError: an unknown protocol, or judgments of another benchmark.
    """
    if protocol is not None and protocol not in protocol_names(benchmark):
        raise ValueError(f"{benchmark} has no protocol {protocol!r}; choose from {list(protocol_names(benchmark))}")
    if not isinstance(judgments, Judgments):
        judgments = read_judgments(benchmark, judgments)
    elif judgments.benchmark != benchmark:
        raise ValueError(f"judgments are for {judgments.benchmark!r}, not {benchmark!r}")
    parts = MSVD_PARTS if benchmark == "msvd-eval" else ()
    rows = scores if isinstance(scores, list) else read_scores(scores, score_field, parts)
    return run_protocol(judgments, index_scores(rows, judgments), protocol)


#: Documented in the API reference (docs/api/metaeval.md); the other names above still import from here.
__all__ = ["JudgmentError", "Judgments", "MetaEvalResult", "kendall", "meta_evaluate", "pairwise_accuracy", "pearson",
           "protocol_names", "read_judgments", "read_scores", "spearman"]
