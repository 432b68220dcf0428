"""CapArena's model-level ranking: online Elo over pairwise battles, bootstrapped, as its released
``cal_ranking.py`` computes it (``compute_elo`` with K=4, scale 400, base 10, initial rating 1000; 1000
bootstrap rounds of the battles resampled with replacement after ``np.random.seed(42)``; models ranked
by their median rating), and the rank correlations ``caparena_metrics.py`` reports between a metric's
ranking and the people's.

Example::

    >>> battles = [("a", "b", 1.0), ("a", "c", 1.0), ("b", "c", 0.5)]
    >>> ratings = elo_ratings(battles)
    >>> round(ratings["a"] - 1000, 4)
    3.9885
    >>> elo_ranking(battles, rounds=0)
    ['a', 'c', 'b']
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: (model 1, model 2, outcome): 1.0 model 1 won, 0.0 model 2 won, 0.5 a tie.
Battle = tuple[str, str, float]

K, SCALE, BASE, INIT_RATING = 4.0, 400.0, 10.0, 1000.0
BOOTSTRAP_ROUNDS, BOOTSTRAP_SEED = 1000, 42

#: The people's ranking of the models in ``caparena_metrics.py`` (``ranking_human``), best first.
CAPARENA_HUMAN_RANKING = (
    "GPT-4o-0806", "human", "Gemini-2.0-flash-exp", "InternVL2-26B", "Gemini-1.5-pro-002", "Claude-3.5-Sonnet-0620",
    "GPT-4o-mini-0718", "LLama-3.2-90B", "Qwen2-VL-72B-Instruct", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B",
    "Qwen2-VL-7B-Instruct", "Qwen2-VL-2B-Instruct", "LLaVA-1.6-34B", "LLaVA-1.5-7B",
)


def elo_ratings(battles: Sequence[Battle], k: float = K, scale: float = SCALE, base: float = BASE,
                init: float = INIT_RATING) -> dict[str, float]:
    """Online Elo over ``battles`` in order: each battle moves both ratings by ``k`` times the outcome
    minus its expectation ``1 / (1 + base ** ((r_other - r) / scale))``. Returns model -> rating, in the
    order models first appear."""
    rating: dict[str, float] = {}
    for a, b, outcome in battles:
        ra, rb = rating.setdefault(a, init), rating.setdefault(b, init)
        ea = 1.0 / (1.0 + base ** ((rb - ra) / scale))
        eb = 1.0 / (1.0 + base ** ((ra - rb) / scale))
        rating[a] = ra + k * (outcome - ea)
        rating[b] = rb + k * (1.0 - outcome - eb)
    return rating


def bootstrap_medians(battles: Sequence[Battle], rounds: int = BOOTSTRAP_ROUNDS,
                      seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Each model's median Elo over ``rounds`` resamplings of ``battles`` (with replacement, the same
    draws as pandas' ``battles.sample(frac=1.0, replace=True)`` after ``np.random.seed(seed)``); a round
    in which a model plays no battle leaves it out of that model's median. ``rounds=0``: the plain Elo."""
    if rounds == 0:
        return elo_ratings(battles)
    state = np.random.RandomState(seed)
    n = len(battles)
    per_model: dict[str, list[float]] = {}
    for model in (m for a, b, _ in battles for m in (a, b)):
        per_model.setdefault(model, [])
    for _ in range(rounds):
        draw = state.choice(n, size=n, replace=True)
        for model, r in elo_ratings([battles[i] for i in draw]).items():
            per_model[model].append(r)
    return {m: float(np.median(v)) if v else float("nan") for m, v in per_model.items()}


def elo_ranking(battles: Sequence[Battle], rounds: int = BOOTSTRAP_ROUNDS, seed: int = BOOTSTRAP_SEED) -> list[str]:
    """Models best first by :func:`bootstrap_medians` (equal medians keep the order models first
    appear; a model with no median last)."""
    medians = bootstrap_medians(battles, rounds, seed)
    order = list(medians)
    return sorted(order, key=lambda m: (np.isnan(medians[m]), -medians[m] if not np.isnan(medians[m]) else 0.0,
                                        order.index(m)))


def ranking_correlations(metric_ranking: Sequence[str], human_ranking: Sequence[str]) -> dict[str, float]:
    """Spearman rho and Kendall tau-b (SciPy's ``spearmanr``/``kendalltau``, as the release) between the positions of
    the models of ``metric_ranking`` in it and in ``human_ranking`` (``"human"`` left out, as
    ``cal_model_level_agreement`` does); models missing from ``human_ranking`` raise ValueError."""
    from .stats import kendall, spearman

    models = [m for m in metric_ranking if m != "human"]
    missing = [m for m in models if m not in human_ranking]
    if missing:
        raise ValueError(f"models {missing} are not in the human ranking")
    if len(models) < 2:
        return {"spearman": float("nan"), "kendall": float("nan")}
    positions = list(range(1, len(models) + 1))
    human = [list(human_ranking).index(m) + 1 for m in models]
    return {"spearman": spearman(human, positions), "kendall": kendall(human, positions, "b")}
