"""EasyR1 adapter: capreward's rewards as an EasyR1 reward function file.

EasyR1 (hiyouga/EasyR1: its release v0.3.2, ``verl.workers.reward.{Batch,Sequential}FunctionRewardManager``,
and its main branch, ``verl.workers.reward.AutoRewardManager``) loads a Python file named by
``worker.reward.reward_function=/path/to/file.py:compute_score`` (with ``importlib``, as a standalone
module), binds ``worker.reward.reward_function_kwargs`` to the function, and calls it with the decoded
responses: the batch form takes a list of ``{"response", "response_length", "ground_truth"}`` and returns
one dict per response, the sequential form takes one dict and returns one. v0.3.2 picks the form from its
config (``worker.reward.reward_type``, default ``batch``), main from the file's ``REWARD_TYPE``, which is
``"batch"`` here. EasyR1 puts each result's ``"overall"`` on the response's last token and logs every
key's mean as ``reward/<key>``. v0.3.0 calls ``compute_score(predict_str, ground_truth)``; that form
is taken too.

EasyR1 passes no image to the reward, so the ``ground_truth`` (the dataset's ``answer_key`` column) is a
label naming the visual: a JSON object (or its text), ``{"image": "coco/123.jpg", "references": ["a dog
on a sofa"]}`` (:mod:`capreward.adapters.labels`; ``video`` for a video). Each result holds
``"overall"`` (the reward, or the fallback for a sample that cannot be scored: the bottom of the reward's
range unless set), ``"unscored"`` (1.0 for such a sample) and the sub-scores asked for (``subscores``:
a list of the reward's :meth:`~capreward.rewards.RewardFunction.metric_names`, or ``"all"``), the same keys
for every response (EasyR1 keeps one list per key and may filter groups on one), NaN where a sample has
no such sub-score.

Configure it with ``reward_function_kwargs`` (``reward``: any name of
:func:`~capreward.adapters.factory.reward_names`; the :class:`~capreward.adapters.factory.RewardOptions`
fields such as ``clip_model``, ``idf``, ``judge_url``; ``fallback``; ``subscores``; ``media_root``) or the
veRL adapter's ``CAPREWARD_*`` environment variables (:func:`~capreward.adapters.verl.scorer_from_env`),
the keyword arguments winning::

    worker.reward.reward_function=$(python -m capreward.adapters.easyr1)   # prints <this file>:compute_score
    worker.reward.reward_function_kwargs='{reward: clip_s, clip_model: /models/ViT-B-32.pt, media_root: /data}'

EasyR1 loads the file with ``importlib`` as a standalone module, so it uses absolute imports only.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any, cast

from capreward.adapters.factory import RewardOptions, build_reward
from capreward.adapters.labels import Label, parse_label
from capreward.adapters.scoring import ScoredBatch
from capreward.adapters.verl import VerlScorer

#: Read by EasyR1's main branch (``AutoRewardManager``), which takes the reward's form from the file (v0.3.2
#: from its config, whose default is the same).
REWARD_NAME = "capreward"
REWARD_TYPE = "batch"


class EasyR1Scorer(VerlScorer):
    """An EasyR1 reward function for a capreward reward (see the module docstring).

    Args:
        reward: a capreward reward.
        fallback: the ``"overall"`` of a sample that cannot be scored (None: the bottom of the reward's range).
        subscores: the reward's sub-scores to add to each result (``"all"``: every one it reports).
        media_root: the folder the labels' paths are confined to (None: paths are used as given).

    Examples:
        >>> from capreward.adapters.easyr1 import EasyR1Scorer
        >>> from capreward.rewards import CLIPScoreReward
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> import json, tempfile, os
        >>> folder = tempfile.mkdtemp(); colour_image("red").save(os.path.join(folder, "red.png"))
        >>> score = EasyR1Scorer(CLIPScoreReward(model=str(trained_clip_path())), media_root=folder)
        >>> truth = json.dumps({"image": "red.png"})
        >>> right, wrong = score([{"response": r, "response_length": 3, "ground_truth": truth}
        ...                       for r in ("a red image", "a blue image")])
        >>> sorted(right), right["overall"] > wrong["overall"], right["unscored"]
        (['overall', 'unscored'], True, 0.0)
    """

    def __init__(self, reward: Any, fallback: float | None = None, subscores: Sequence[str] | str = (),
                 media_root: str | None = None):
        if subscores == "all":
            subscores = tuple(reward.metric_names()) if hasattr(reward, "metric_names") else ()
        elif isinstance(subscores, str):
            subscores = [key.strip() for key in subscores.split(",") if key.strip()]
        if "overall" in subscores:
            raise ValueError("a sub-score named 'overall' would clash with EasyR1's own key")
        super().__init__(reward, fallback=fallback, return_dict=True, subscores=subscores, media_root=media_root)

    def label(self, ground_truth: Any, extra_info: Any, where: str) -> Label:
        """The sample's label: its ``ground_truth`` (a JSON object or its text)."""
        return parse_label(ground_truth, f"{where} ground_truth", self.paths)

    def rows(self, batch: ScoredBatch) -> list[dict[str, float]]:
        """``{"overall", "unscored", <sub-scores>}`` per response."""
        return [{"overall": row.pop("score"), **row} for row in super().rows(batch)]

    def __call__(self, reward_inputs: Any, ground_truth: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Score EasyR1's reward inputs, in any of its three forms.

        Args:
            reward_inputs: a list of ``{"response", "response_length", "ground_truth"}`` (the batch form),
                one such dict (the sequential form), or the response text (v0.3.0's form, with
                ``ground_truth``). A response that is not a str is unscored.
            ground_truth: the label, in v0.3.0's two-argument form.
            **kwargs: ignored (EasyR1 binds the reward function's keyword arguments to
                :func:`compute_score`, which builds this scorer from them).

        Returns:
            A list of result dicts for a list, one result dict otherwise (``"overall"``, ``"unscored"``
            and the sub-scores asked for).
        """
        if isinstance(reward_inputs, str) or ground_truth is not None:  # (a response that is not a str is unscored)
            return self.score_batch([reward_inputs], [ground_truth])[0]
        if isinstance(reward_inputs, dict):
            return self([reward_inputs])[0]
        inputs = list(reward_inputs)
        responses = [item.get("response") if isinstance(item, dict) else None for item in inputs]
        truths = [item.get("ground_truth") if isinstance(item, dict) else None for item in inputs]
        return self.score_batch(cast(list[str], responses), truths)  # a response that is not a str is unscored


_OWN_KEYS = ("reward", "fallback", "subscores", "media_root")
_scorers: dict[str, EasyR1Scorer] = {}
_scorers_lock = threading.Lock()


def scorer_for(**kwargs: Any) -> EasyR1Scorer:
    """The scorer for EasyR1's ``reward_function_kwargs`` over the ``CAPREWARD_*`` environment variables
    (built once per distinct set of keyword arguments)."""
    key = json.dumps(kwargs, sort_keys=True, default=str)
    with _scorers_lock:
        if key not in _scorers:
            env = os.environ
            unknown = [k for k in kwargs if k not in _OWN_KEYS and not hasattr(RewardOptions(), k)]
            if unknown:
                raise TypeError(f"unknown reward_function_kwargs {unknown}: give reward, fallback, subscores, "
                                "media_root or fields of capreward's RewardOptions")
            options = RewardOptions.from_env()
            for name, value in kwargs.items():
                if name not in _OWN_KEYS:
                    setattr(options, name, value)
            fallback = kwargs.get("fallback", (env.get("CAPREWARD_FALLBACK") or "").strip() or None)
            _scorers[key] = EasyR1Scorer(
                build_reward(kwargs.get("reward") or env.get("CAPREWARD_REWARD", "emscore"), options),
                fallback=None if fallback is None else float(fallback),
                subscores=kwargs.get("subscores", env.get("CAPREWARD_SUBSCORES", "")),
                media_root=kwargs.get("media_root", env.get("CAPREWARD_MEDIA_ROOT") or None),
            )
        return _scorers[key]


def compute_score(reward_inputs: Any, ground_truth: Any = None, **kwargs: Any) -> Any:
    """EasyR1's reward function (``.../easyr1.py:compute_score``), configured by EasyR1's
    ``reward_function_kwargs`` and the ``CAPREWARD_*`` variables.

    Args:
        reward_inputs: a list of ``{"response", "response_length", "ground_truth"}`` (batch), one such dict
            (sequential), or the response text (older releases, with ``ground_truth``).
        ground_truth: the label, in the older two-argument form.
        **kwargs: ``reward_function_kwargs`` (see the module docstring).

    Returns:
        One dict per response (``"overall"``, ``"unscored"``, the sub-scores asked for); a list for a batch.
    """
    return scorer_for(**kwargs)(reward_inputs, ground_truth)


def reset() -> None:
    """Forget the scorers built so far (the next call reads its configuration again)."""
    with _scorers_lock:
        _scorers.clear()


__all__ = ["REWARD_NAME", "REWARD_TYPE", "EasyR1Scorer", "compute_score", "reset", "scorer_for"]


if __name__ == "__main__":
    print(f"{os.path.abspath(__file__)}:compute_score")
