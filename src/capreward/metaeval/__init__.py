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
    """The protocol's measures (percent) for ``scores`` (a JSONL path or rows) against ``judgments``
    (a path read with ``benchmark``'s reader, or already read). ``protocol``: one of
    ``protocol_names(benchmark)`` (default: the first). Raises :class:`JudgmentError` for unusable files,
    ValueError for an unknown protocol."""
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
