"""OpenRLHF's in-process reward function: ``reward_func(queries, prompts, labels)``, read from this file.

OpenRLHF (0.11: ``openrlhf.utils.agent.SingleTurnAgentExecutor``) takes a Python file in place of a
reward server's URL: with ``--reward.remote_url /path/to/file.py`` it loads the file's ``reward_func`` and,
for each rollout, calls ``reward_func([query], [prompt], [label])`` in a worker thread
(``asyncio.to_thread``), reading its answer exactly as it reads the reward server's
(:mod:`capreward.server.http`): ``{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}``. This
file is that function, with the server's rules without HTTP (:class:`~capreward.server.http.RewardService`):
the response is what follows the prompt in the query, the label names the visual and references
(:mod:`capreward.adapters.labels`), ``extra_logs`` has one key set whatever the sample (the reward's
sub-scores, NaN where undefined, and ``unscored``), an unscorable sample gets the fallback (the bottom of
the reward's range) with its reason in ``errors``. Calls from concurrent rollouts are merged into one
scorer call (:class:`~capreward.server.batching.DynamicBatcher`), so a group's visual is encoded once.

Usage (``python -m capreward.server.reward_func`` prints this file's path)::

    CAPREWARD_REWARD=emscore CAPREWARD_CLIP_MODEL=/models/ViT-B-32.pt CAPREWARD_MEDIA_ROOT=/data/media \\
    python -m openrlhf.cli.train_ppo_ray ... --data.label_key label \\
        --reward.remote_url "$(python -m capreward.server.reward_func)"

Configured by environment variables, read on the first call of each process: ``CAPREWARD_REWARD`` (any
name of :func:`~capreward.adapters.factory.reward_names`, default ``emscore``) with the model options of
:meth:`~capreward.adapters.factory.RewardOptions.from_env`; ``CAPREWARD_FALLBACK`` (default: the bottom of
the reward's range); ``CAPREWARD_MEDIA_ROOT`` (labels may name files under it only; unset, paths are used
as given: the dataset is the operator's own, as in the veRL adapter); ``CAPREWARD_PROMPT_TOKENIZER`` (the
policy's tokenizer directory: the response starts where the prompt's tokens end);
``CAPREWARD_MAX_BATCH`` (64) and ``CAPREWARD_MAX_WAIT_MS`` (5) bound a merged batch.

A malformed call (labels that are not label objects, a query without its prompt, lengths that differ)
raises ``ValueError`` naming the item, as the server answers 400: such a call is a pipeline bug that would
fail the same way at every step (OpenRLHF logs it and the rollout gets no reward).

OpenRLHF loads the file with ``importlib`` as a standalone module (named ``reward_func``), so it uses
absolute imports only.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from capreward.adapters.factory import RewardOptions, build_reward
from capreward.server.batching import DynamicBatcher
from capreward.server.http import RequestError, RewardService

logger = logging.getLogger("capreward.server.reward_func")

_state: tuple[RewardService, DynamicBatcher] | None = None
_state_lock = threading.Lock()


def service_from_env() -> RewardService:
    """A :class:`~capreward.server.http.RewardService` configured from the ``CAPREWARD_*`` variables (see
    the module docstring); its model is loaded now."""
    env = os.environ
    reward = build_reward(env.get("CAPREWARD_REWARD", "emscore"), RewardOptions.from_env())
    fallback = (env.get("CAPREWARD_FALLBACK") or "").strip()
    root = env.get("CAPREWARD_MEDIA_ROOT") or None
    service = RewardService(reward, fallback=float(fallback) if fallback else None, media_root=root,
                            allow_any_path=root is None, prompt_tokens=env.get("CAPREWARD_PROMPT_TOKENIZER") or None)
    service.warm_up()
    return service


def _current() -> tuple[RewardService, DynamicBatcher]:
    global _state
    with _state_lock:
        if _state is None:
            service = service_from_env()
            env = os.environ
            batcher = DynamicBatcher(service.score, max_batch_size=int(env.get("CAPREWARD_MAX_BATCH") or 64),
                                     max_wait=float(env.get("CAPREWARD_MAX_WAIT_MS") or 5) / 1000)
            _state = (service, batcher)
            logger.info("reward %s ready (fallback %s)", service.name, service.fallback)
        return _state


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict[str, Any]:
    """OpenRLHF's ``reward_func``: the reward server's answer for these queries, computed in process.

    Args:
        queries: prompt + response, decoded by OpenRLHF with the policy's tokenizer.
        prompts: each query's prompt.
        labels: each sample's label (a JSON object or its JSON text naming the visual and references).

    Returns:
        ``{"rewards", "scores", "extra_logs", "errors"}``, one entry per query (``extra_logs``: one list
        per sub-score).

    Raises:
        ValueError: a malformed call (the message names the item).
    """
    service, batcher = _current()
    payload = {"query": _listed(queries), "prompts": None if prompts is None else _listed(prompts),
               "labels": _listed(labels)}
    try:
        captions, parsed = service.parse(payload)
    except RequestError as exc:
        logger.error("reward_func refused its call: %s", exc.message)
        raise ValueError(exc.message) from None
    return service.respond(batcher.submit(captions, parsed), payload)


def _listed(value: Any) -> Any:
    """A sequence as a list (a str or anything else is left for the request's checks to name)."""
    return list(value) if isinstance(value, (list, tuple)) else value


def reset() -> None:
    """Forget the configured reward (the next call reads the environment again)."""
    global _state
    with _state_lock:
        if _state is not None:
            _state[1].close()
        _state = None


__all__ = ["reset", "reward_func", "service_from_env"]


if __name__ == "__main__":
    print(os.path.abspath(__file__))
