"""veRL adapter: capreward rewards as veRL custom reward functions.

veRL (0.9.x; its reward loop, ``verl.experimental.reward_loop``, is the reward path of
``verl.trainer.main_ppo``) calls ``compute_score(data_source, solution_str, ground_truth, extra_info=None,
**reward_kwargs)`` once per response (its ``naive`` reward manager, the default) and expects a number,
or a dict whose ``"score"`` entry is the reward and whose other entries are logged as extra reward info.
:func:`compute_score_batch` takes ``compute_score(data_sources=, solution_strs=, ground_truths=,
extra_infos=)`` for a batch and returns a list; veRL 0.9 no longer has the ``batch`` manager that
called it (``reward_model.reward_manager=batch`` is not read): capreward's own reward manager,
:mod:`capreward.adapters.verl_manager`, scores a batch together instead.

The visual comes from ``extra_info`` (``{"video": path}`` or ``{"image": path}``, optional
``"visual_id"``; see :mod:`capreward.adapters.labels`) and the references from ``ground_truth`` (a
str, a list of str, or ``extra_info["references"]``); ``qa_utility``'s questions from
``extra_info["questions"]`` (else the judge writes them per visual).

Two ways to configure it:

- Environment variables, with this module as the custom reward function::

      reward.custom_reward_function.path=pkg://capreward.adapters.verl
      reward.custom_reward_function.name=compute_score
      CAPREWARD_REWARD=emscore CAPREWARD_CLIP_MODEL=/models/ViT-B-32.pt CAPREWARD_IDF=corpus.txt \\
      CAPREWARD_RETURN_DICT=1 CAPREWARD_SUBSCORES=video/fine_p,video/fine_r \\
      python -m verl.trainer.main_ppo ...

  (see :meth:`capreward.adapters.factory.RewardOptions.from_env` for the model variables;
  ``CAPREWARD_FALLBACK`` sets the fallback, default the bottom of the reward's range).
  ``CAPREWARD_MEDIA_ROOT`` confines the paths ``extra_info`` names to that directory (relative paths
  are resolved against it; absolute paths, ``..`` and symlinks that lead outside it, and anything
  that is not a regular file get the fallback with one fixed reason, when the label is read and again
  when the file is opened); without it, paths are used
  as given (the dataset is the operator's own). The reward is built once per worker process, on first
  call.
- In your own reward file: ``compute_score = make_compute_score(EMScoreReward(model=..., idf=...))``.

Unscorable samples: veRL needs a number for every response, so a sample that cannot be scored (empty
response, a response that is not a str, unreadable video, malformed extra_info, invalid references, a
ground truth of the wrong type, that does not parse or is over
:data:`~capreward.adapters.labels.MAX_REFERENCES` references or
:data:`~capreward.adapters.labels.MAX_REFERENCE_CHARS` characters) gets ``fallback`` and the reason is
logged with ``logging`` (logger ``capreward.adapters.verl``); in dict mode ``"unscored"`` is 1.0 for it.
The other samples of the batch score as they do alone. The fallback is the bottom of the reward's range
by default (-1 for EMScore and RefCLIP-S): a mid-range value such as 0.0 for EMScore would rank an empty
response above every wrong caption.

veRL loads the file with ``importlib`` as a standalone module, so this file uses absolute imports only.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any, cast
from collections.abc import Sequence

from capreward.adapters.factory import RewardOptions, build_reward
from capreward.adapters.labels import Label, LabelError, parse_label, parse_references
from capreward.adapters.paths import MediaPaths
from capreward.adapters.scoring import ScoredBatch, resolve_fallback, score_labelled
from capreward.errors import SampleError, sample_failure

logger = logging.getLogger("capreward.adapters.verl")


def sample_label(ground_truth: Any, extra_info: Any, paths: MediaPaths | str | None = None,
                 where: str = "sample") -> Label:
    """The :class:`Label` of one veRL sample: visual (and optional id/references) from ``extra_info``,
    references from ``ground_truth`` when it holds any; ``paths`` as for
    :func:`~capreward.adapters.labels.parse_label`. Raises LabelError naming ``where``."""
    info = {} if extra_info is None else extra_info
    if not isinstance(info, dict):
        raise LabelError(f"{where}: extra_info must be a dict with an image or video path, got {type(info).__name__}")
    fields = {k: info[k] for k in ("image", "images", "video", "visual_id", "references", "questions")
              if info.get(k) is not None}
    refs = parse_references(ground_truth, f"{where} ground_truth")
    if refs is not None:
        fields["references"] = refs
    return parse_label(fields, f"{where} extra_info", paths)


def solution_problem(solution: Any, where: str) -> str | None:
    """Why ``solution`` (veRL's decoded response) cannot be scored: it is not a str (None is never
    scored as the text "None"); None when it is one."""
    if isinstance(solution, str):
        return None
    return f"{where}: solution_str must be a str, got {type(solution).__name__}"


class VerlScorer:
    """Callable in both veRL forms; see the module docstring.

    Args:
        reward: a capreward reward (it loads its model lazily, on the first scored batch).
        fallback: the value returned for an unscorable sample; None (default): the bottom of the
            reward's range (:func:`~capreward.adapters.scoring.resolve_fallback`).
        return_dict: return ``{"score": value, "unscored": 0/1, <sub-scores>...}`` instead of a float.
        subscores: in dict mode, the reward's sub-scores to add (e.g. ``["video/fine_p",
            "reference/full_f"]``). veRL collects every key over the batch, so each result has exactly
            these keys; a sub-score a sample lacks (unscored, no references) is NaN, as the reward
            server answers it (the fallback is a reward, not a sub-score).
        media_root: directory that image/video paths are confined to (relative ones resolved against
            it; anything else gets the fallback with one fixed reason). None: paths are used as given.
    """

    def __init__(self, reward: Any, fallback: float | None = None, return_dict: bool = False,
                 subscores: Sequence[str] = (), media_root: str | None = None):
        fallback = resolve_fallback(reward, fallback)
        reserved = {"score", "unscored"} & set(subscores)
        if reserved:
            raise ValueError(f"sub-score names {sorted(reserved)} clash with the result's own keys")
        self.reward = reward
        self.fallback = float(fallback)
        self.return_dict = return_dict
        self.subscores = list(subscores)
        self.media_root = media_root
        self.paths = MediaPaths(media_root) if media_root is not None else MediaPaths(None, allow_any_path=True)

    def score_batch(
        self,
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[Any] | None = None,
    ) -> list[float | dict[str, float]]:
        """One result per response (float, or dict in ``return_dict`` mode)."""
        n = len(solution_strs)
        extra_infos = [None] * n if extra_infos is None else list(extra_infos)
        if len(ground_truths) != n or len(extra_infos) != n:
            raise ValueError(f"got {n} responses, {len(ground_truths)} ground truths and {len(extra_infos)} extra_infos")
        labels: list[Label | None] = []
        reasons: list[str | None] = []
        for i in range(n):
            labels.append(None)
            reasons.append(SampleError.of(solution_problem(solution_strs[i], f"sample {i}"), i, kind="input"))
            if reasons[i] is not None:
                continue
            try:
                labels[i] = self.label(ground_truths[i], extra_infos[i], where=f"sample {i}")
            except LabelError as exc:
                reasons[i] = SampleError(i, "input", "", str(exc))
            except Exception as exc:  # noqa: BLE001 - a hostile ground truth or extra_info costs its sample only
                reasons[i] = SampleError(i, "input", f"sample {i}",
                                         f"unusable ground_truth or extra_info ({type(exc).__name__}: {str(exc)[:200]})")
        ok = [i for i in range(n) if labels[i] is not None]
        scored = score_labelled(self.reward, [solution_strs[i] for i in ok], [cast(Label, labels[i]) for i in ok])
        values: list[float | None] = [None] * n
        metrics: dict[str, list[float]] = {}
        for j, i in enumerate(ok):
            values[i], reasons[i] = scored.values[j], scored.reasons[j]
        for key, column in scored.metrics.items():
            metrics[key] = [math.nan] * n
            for j, i in enumerate(ok):
                metrics[key][i] = column[j]
        for i in range(n):
            if (error := sample_failure(i, values[i], reasons[i])) is not None:
                logger.warning("unscored sample %d gets %s: %s", i, self.fallback, error)
        return self._results(ScoredBatch(values, reasons, metrics))

    def label(self, ground_truth: Any, extra_info: Any, where: str) -> Label:
        """The :class:`Label` of one sample (veRL's: :func:`sample_label`); LabelError naming ``where``."""
        return sample_label(ground_truth, extra_info, self.paths, where=where)

    def _results(self, batch: ScoredBatch) -> list[float | dict[str, float]]:
        return list(self.rows(batch)) if self.return_dict else list(batch.filled(self.fallback))

    def rows(self, batch: ScoredBatch) -> list[dict[str, float]]:
        """Dict-mode results: ``{"score", "unscored", <each of subscores>}`` per sample (always these
        keys: veRL's reward loop takes the extra-info keys of a batch from its first sample)."""
        filled = batch.filled(self.fallback)
        out = []
        for i, value in enumerate(filled):
            row = {"score": value, "unscored": float(batch.values[i] is None)}
            for key in self.subscores:
                v = batch.metrics.get(key, [math.nan] * len(filled))[i]
                row[key] = float(v) if math.isfinite(v) else math.nan  # as the server: never the fallback
            out.append(row)
        return out

    def __call__(self, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None,
                 **kwargs: Any) -> float | dict[str, float]:
        """veRL's per-sample signature; extra ``reward_kwargs`` are accepted and ignored."""
        return self.score_batch([solution_str], [ground_truth], [extra_info])[0]

    def batch(self, data_sources: Sequence[Any], solution_strs: Sequence[str], ground_truths: Sequence[Any],
              extra_infos: Sequence[Any] | None = None, **kwargs: Any) -> list[float | dict[str, float]]:
        """veRL's batch-manager signature."""
        return self.score_batch(solution_strs, ground_truths, extra_infos)


def make_compute_score(reward: Any, fallback: float | None = None, return_dict: bool = False,
                       subscores: Sequence[str] = (), media_root: str | None = None) -> VerlScorer:
    """A veRL ``compute_score`` for a capreward reward.

    Args:
        reward: a capreward reward object.
        fallback: the value returned for an unscorable sample (None: the bottom of the reward's range).
        return_dict: return ``{"score": value, "unscored": 0/1, <sub-scores>...}`` instead of a float.
        subscores: in dict mode, the reward's sub-scores to add.
        media_root: the folder image/video paths are confined to (None: paths are used as given).

    Returns:
        A :class:`VerlScorer`, callable with veRL's per-sample signature; its ``.batch`` method has the
        batch-manager signature."""
    return VerlScorer(reward, fallback=fallback, return_dict=return_dict, subscores=subscores,
                      media_root=media_root)


_default: VerlScorer | None = None
_default_lock = threading.Lock()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def scorer_from_env(**options: Any) -> VerlScorer:
    """A new scorer configured from ``CAPREWARD_*`` environment variables, ``options`` replacing fields of
    :class:`~capreward.adapters.factory.RewardOptions` (e.g. the judge veRL's reward pool serves)."""
    env = os.environ
    reward = build_reward(env.get("CAPREWARD_REWARD", "emscore"), RewardOptions.from_env(), **options)
    fallback = (env.get("CAPREWARD_FALLBACK") or "").strip()
    return VerlScorer(
        reward,
        fallback=float(fallback) if fallback else None,  # unset: the bottom of the reward's range
        return_dict=_truthy(env.get("CAPREWARD_RETURN_DICT")),
        subscores=[k.strip() for k in env.get("CAPREWARD_SUBSCORES", "").split(",") if k.strip()],
        media_root=env.get("CAPREWARD_MEDIA_ROOT") or None,
    )


def default_scorer() -> VerlScorer:
    """The process-wide scorer configured from ``CAPREWARD_*`` environment variables (built once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = scorer_from_env()
        return _default


def reset_default_scorer() -> None:
    """Forget the environment-configured scorer (the next call re-reads the environment)."""
    global _default
    with _default_lock:
        _default = None


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  **kwargs: Any) -> float | dict[str, float]:
    """veRL custom reward function (per sample), configured by ``CAPREWARD_*`` environment variables."""
    return default_scorer()(data_source, solution_str, ground_truth, extra_info, **kwargs)


def compute_score_batch(data_sources: Sequence[Any], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[Any] | None = None, **kwargs: Any) -> list[float | dict[str, float]]:
    """veRL custom reward function for ``reward_manager=batch``, configured like :func:`compute_score`."""
    return default_scorer().batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)


__all__: list[str] = [
    "VerlScorer", "compute_score", "compute_score_batch", "default_scorer", "make_compute_score",
    "reset_default_scorer", "sample_label", "scorer_from_env",
]
