"""A picture of a meta-evaluation: metric vs human score (matplotlib, Agg backend, no display needed).

Rated benchmarks with few distinct human values (e.g. Flickr8k's 1-4) get a heatmap of the metric's
distribution per human value, others a scatter plot; pairwise benchmarks a scatter of the preferred
caption's score against the other's, one colour per category (points above the diagonal are hits).
"""

from __future__ import annotations

from pathlib import Path

from .protocols import MetaEvalResult


def _title(result: MetaEvalResult) -> str:
    measures = ", ".join(f"{k}={v:.1f}" for k, v in result.measures.items())
    return f"{result.benchmark}: {measures} (n={result.n_matched}, unmatched={result.n_unmatched})"


def plot_result(result: MetaEvalResult, path: str | Path, metric_name: str = "metric") -> Path:
    """Write the plot of ``result`` as a PNG to ``path``; returns the path."""
    from .._extras import require

    matplotlib = require("plot", "matplotlib", used_by="meta-evaluation plots (--plot)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)
    try:
        if result.preferred:
            pts = [(p, o, c) for p, o, c in zip(result.preferred, result.other, result.category) if p is not None and o is not None]
            for cat in dict.fromkeys(c for _, _, c in pts):
                xs = [o for _, o, c in pts if c == cat]
                ys = [p for p, _, c in pts if c == cat]
                ax.scatter(xs, ys, s=8, alpha=0.6, label=cat)
            if pts:
                lo = min(min(p, o) for p, o, _ in pts)
                hi = max(max(p, o) for p, o, _ in pts)
                ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
                ax.legend()
            ax.set_xlabel(f"{metric_name} of the other caption")
            ax.set_ylabel(f"{metric_name} of the human-preferred caption")
        else:
            human, metric = np.asarray(result.human, float), np.asarray(result.metric, float)
            levels = np.unique(human)
            if 0 < len(levels) <= 12:
                bins = np.linspace(metric.min(), metric.max() + 1e-9, 31) if len(metric) else 30
                grid = np.stack([np.histogram(metric[human == v], bins=bins)[0] for v in levels], axis=1)
                # Each human level normalised on its own so sparse levels stay visible.
                grid = grid / np.maximum(grid.sum(axis=0, keepdims=True), 1)
                mesh = ax.pcolormesh(np.arange(len(levels) + 1) - 0.5, bins, grid, cmap="viridis", shading="flat")
                ax.set_xticks(range(len(levels)), [f"{v:g}" for v in levels])
                fig.colorbar(mesh, ax=ax, label="share of captions at this human score")
            else:
                ax.scatter(human, metric, s=8, alpha=0.5)
            ax.set_xlabel("human score")
            ax.set_ylabel(metric_name)
        ax.set_title(_title(result), fontsize=9)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
