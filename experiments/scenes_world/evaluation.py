"""Measuring rewards on the scenes world against its ground truth: the rewards built on the trained
scenes CLIPs, how well a CLIP ranks true captions above hard negatives, and best-of-n re-ranking.

- :func:`scene_rewards`: CLIP-S alone under reward model A; the composite (CLIP-S + the hallucination
  penalty, calibrated on true captions of A's training stream, + the anti-hacking guards) under A; and
  CLIP-S under the held-out model B.
- :func:`ranking_accuracy`: per hard-negative kind, how often a CLIP scores the true caption above it.
- :func:`best_of_n`: re-rank ``n`` sampled candidate captions per held-out scene by a reward and judge the
  top one with the generator's ground truth (:func:`~scenes_world.world.judge`), for several ``n``.

Used by ``experiments/scenes_bestofn.py`` and ``tests/test_scenes_clip.py``.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from . import world

#: Words never counted as content by the scenes' hallucination penalty besides the usual function words:
#: the count words (a count is not an object; the count slot is graded by the judge, not the penalty).
COUNT_STOP_WORDS = frozenset(w for w in world.COUNT_WORDS.values()) | {"one", "four"}
#: Best-of-n sizes of the experiment.
NS: tuple[int, ...] = (1, 2, 4, 8, 16)


def shared_clip_path(recipe: Any, log: Any = None) -> str:
    """:func:`scenes_world.clips.scene_clip_path` under an exclusive lock beside the cached file: the
    scenes CLIPs are built once and shared, so a second process (a test, another experiment) asking for a
    model being trained waits for it instead of training it again. (The lock lives here, not in
    ``clips.py``, whose source is part of every model's cache key.)"""
    from pathlib import Path

    from capreward.testing.cache import locked

    from .clips import scene_clip_path
    from capreward.testing.cache import cache_root

    folder = Path(cache_root()) / "trained_clip"
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder / f".{recipe.name}-{recipe.key()}.pt.lock", what=f"training the scenes CLIP {recipe.name}"):
        return str(scene_clip_path(recipe, log=log))


def scene_guards() -> Any:
    """The guards for scene captions: repetition (bigrams and single words), truncation without a final
    period required, and over-length beyond 14 words (the longest true caption, four groups, has 13)
    ramping to -1 at 28."""
    from capreward.rewards import Guards

    return Guards(require_punctuation=False, max_words=14)


@dataclass
class SceneRewards:
    """The rewards of the scenes experiment: ``rerankers`` (name -> reward: ``clip_s``, CLIP-S under
    model A alone; ``composite``, CLIP-S + hallucination penalty under A behind the guards; with
    negative-control models, ``clip_s_<name>`` and ``composite_<name>`` the same under each), ``held_out``
    (CLIP-S under model B) and A's calibrated ``penalty`` and its ``threshold``."""

    rerankers: dict[str, Any]
    held_out: Any
    penalty: Any
    threshold: float


def composite_reward(model: str, calibration: Sequence[dict], penalty_weight: float = 1.0) -> tuple[Any, Any]:
    """``(composite, penalty)`` under ``model``: CLIP-S (weight 1) + the hallucination penalty (weight
    ``penalty_weight``; count words are not content; threshold calibrated on the true captions of
    ``calibration`` rows, {"image", "caption"}, at the default 5 % quantile) behind :func:`scene_guards`."""
    from capreward.rewards import CLIPScoreReward, CompositeReward, HallucinationPenalty
    from capreward.metrics.token_support import STOP_WORDS

    penalty = HallucinationPenalty(model=model, device="cpu", stop_words=STOP_WORDS | COUNT_STOP_WORDS)
    penalty.calibrate([r["caption"] for r in calibration], [r["image"] for r in calibration], kind="image")
    composite = CompositeReward([(CLIPScoreReward(model=model, device="cpu"), 1.0), (penalty, penalty_weight)],
                                guards=scene_guards(), name="composite")
    return composite, penalty


def scene_rewards(model_a: str, model_b: str, calibration: Sequence[dict], controls: dict[str, str] | None = None) -> SceneRewards:
    """Build :class:`SceneRewards` from the model paths; ``controls`` (name -> path) adds negative-control
    reward models (e.g. ``{"plain": ..., "partial": ...}``: trained without hard negatives, or on partial
    captions) as rerankers ``clip_s_<name>`` and ``composite_<name>``. Calibrate on A's training stream,
    never on the held-out scenes."""
    from capreward.rewards import CLIPScoreReward

    composite, penalty = composite_reward(model_a, calibration)
    rerankers = {"clip_s": CLIPScoreReward(model=model_a, device="cpu"), "composite": composite}
    for name, path in (controls or {}).items():
        rerankers[f"clip_s_{name}"] = CLIPScoreReward(model=path, device="cpu")
        rerankers[f"composite_{name}"] = composite_reward(path, calibration)[0]
    return SceneRewards(rerankers=rerankers, held_out=CLIPScoreReward(model=model_b, device="cpu"),
                        penalty=penalty, threshold=penalty.threshold)


def ranking_accuracy(model: str, rows: Sequence[dict], seed: int = 0) -> dict[str, float]:
    """Per hard-negative kind (:data:`~scenes_world.world.NEGATIVE_KINDS`), the share of ``rows``
    ({"scene", "image"}) whose true caption gets a strictly higher CLIP-S than the negative of that kind
    under ``model`` (a path), read through :class:`~capreward.scorers.CLIPScore` as the rewards read it.
    Scenes where a kind cannot apply are left out of its share; chance is 0.5 (ties count as misses)."""
    from capreward.scorers.clipscore import CLIPScore

    rng = random.Random(f"ranking-{seed}")
    scorer = CLIPScore(model=str(model), device="cpu")
    truths = [world.true_caption(r["scene"], rng) for r in rows]
    true_s = scorer.score(truths, images=[r["image"] for r in rows]).clip_s.tolist()
    out = {}
    for kind in world.NEGATIVE_KINDS:
        pairs = [(i, world.hard_negative(r["scene"], kind, rng)) for i, r in enumerate(rows)]
        pairs = [(i, neg) for i, neg in pairs if neg is not None]
        neg_s = scorer.score([neg for _, neg in pairs], images=[rows[i]["image"] for i, _ in pairs]).clip_s.tolist()
        out[kind] = sum(true_s[i] > s for (i, _), s in zip(pairs, neg_s)) / len(pairs)
    return out


@dataclass
class Candidates:
    """``k`` sampled captions per row (``captions[i]`` for row i) and, per reward name, their values."""

    captions: list[list[str]]
    values: dict[str, list[list[float]]]
    held_out: list[list[float]]


def sample_candidates(rows: Sequence[dict], k: int, seed: int) -> list[list[str]]:
    """``k`` captions per row from :func:`~scenes_world.world.sample_caption`; deterministic for ``seed``."""
    rng = random.Random(f"candidates-{seed}")
    return [[world.sample_caption(r["scene"], rng) for _ in range(k)] for r in rows]


def score_candidates(rewards: SceneRewards, rows: Sequence[dict], captions: list[list[str]]) -> Candidates:
    """Every candidate scored by every reranker and the held-out CLIP-S (B). An unscorable
    candidate (an empty caption) gets -inf under the rerankers and NaN under B."""
    flat = [c for cs in captions for c in cs]
    images = [r["image"] for r, cs in zip(rows, captions) for _ in cs]
    k = len(captions[0])

    def per_row(values: list[float | None], missing: float) -> list[list[float]]:
        vals = [missing if v is None else float(v) for v in values]
        return [vals[i * k:(i + 1) * k] for i in range(len(rows))]

    return Candidates(
        captions=captions,
        values={name: per_row(r(None, flat, image=images), float("-inf")) for name, r in rewards.rerankers.items()},
        held_out=per_row(rewards.held_out(None, flat, image=images), float("nan")),
    )


def best_of_n(rows: Sequence[dict], cands: Candidates, reward: str, ns: Sequence[int] = NS) -> dict[int, dict[str, float]]:
    """For each n of ``ns``: the k candidates of every row split into k // n disjoint groups of n, the top
    of each group by ``reward`` (first on ties) judged against the row's scene; returns per n the
    :func:`~scenes_world.world.mean_judgement` rates over all tops plus ``held_out`` (B's mean
    CLIP-S of the tops) and ``reward`` (their mean reward). n=1 is the sampler itself."""
    k = len(cands.captions[0])
    out: dict[int, dict[str, float]] = {}
    for n in ns:
        if k % n:
            raise ValueError(f"n={n} does not divide the {k} candidates per row")
        judgements, held, value = [], [], []
        for i, row in enumerate(rows):
            for g in range(k // n):
                idx = range(g * n, (g + 1) * n)
                top = max(idx, key=lambda j: (cands.values[reward][i][j], -j))
                judgements.append(world.judge(row["scene"], cands.captions[i][top]))
                held.append(cands.held_out[i][top])
                value.append(cands.values[reward][i][top])
        out[n] = {**world.mean_judgement(judgements), "held_out": statistics.fmean(held), "reward": statistics.fmean(value)}
    return out
