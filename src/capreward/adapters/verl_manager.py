"""A veRL reward manager for veRL's reward loop that scores samples together in capreward batches.

veRL's reward loop (``verl.experimental.reward_loop``, the only reward path of ``verl.trainer.main_ppo``
since 0.8; the old ``reward_model.reward_manager=batch`` no longer exists) hands its reward manager one
sample per ``run_single`` call, many at once as concurrent asyncio tasks. The built-in ``naive``
manager then calls ``compute_score`` once per sample. :class:`CaprewardRewardManager` instead collects
the samples that arrive together (within ``CAPREWARD_VERL_MAX_WAIT_MS`` milliseconds, default 5, up to
``CAPREWARD_VERL_MAX_BATCH`` samples, default 256) and scores them in one call of the
environment-configured reward (:func:`capreward.adapters.verl.default_scorer`), in a worker thread so
the loop keeps receiving samples; a visual shared by a group is then decoded and encoded once, and
batched text encoding is used. Scores do not depend on the batch (capreward's scorers are
batch-invariant). Each sample's ``reward_extra_info`` is ``{"score", "unscored", <CAPREWARD_SUBSCORES>...}``,
the same keys for every sample, as veRL's reward loop requires.

veRL loads it by path (this module imports veRL, which :mod:`capreward.adapters.verl` does not)::

    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://capreward.adapters.verl_manager
    reward.reward_manager.name=CaprewardRewardManager

configured with the same ``CAPREWARD_*`` environment variables as :func:`capreward.adapters.verl.compute_score`.
A sample whose ``extra_info`` names no visual is scored on the images it carries in veRL's
``multi_modal_data`` (every one, the values aggregated by the reward's ``image_aggregation``, as a label
naming several images is), or, when it carries no image, on its first video (veRL's frames,
:func:`multi_modal_video`), so a VLM dataset need not duplicate its visuals as paths.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import numpy as np

try:
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
except ModuleNotFoundError as exc:  # a plugin of veRL's, loaded by veRL: no capreward extra installs veRL
    raise ModuleNotFoundError(
        f"capreward.adapters.verl_manager is a reward manager that veRL loads into its own process "
        f"(reward.reward_manager.module.path=pkg://capreward.adapters.verl_manager); it needs veRL "
        f"(>= 0.8, with its reward loop), which cannot be imported here ({exc.name} is missing)",
        name=exc.name,
    ) from None

from capreward.adapters.labels import Label, LabelError, parse_label_questions, parse_references
from capreward.adapters.scoring import ScoredBatch, score_labelled
from capreward.adapters.verl import VerlScorer, default_scorer, sample_label, scorer_from_env

logger = logging.getLogger("capreward.adapters.verl")


class CaprewardRewardManager(RewardManagerBase):
    """veRL reward-loop manager (see the module docstring). ``scorer``: a
    :class:`~capreward.adapters.verl.VerlScorer` (default: the environment-configured one);
    ``max_batch_size``/``max_wait`` (seconds) override ``CAPREWARD_VERL_MAX_BATCH`` and
    ``CAPREWARD_VERL_MAX_WAIT_MS``. veRL passes ``compute_score`` (unused: the scorer is capreward's)
    and, with a reward model (``reward.reward_model.enable=True``), the address of its reward pool's
    OpenAI-compatible router: a chat-judge reward (``CAPREWARD_REWARD`` = ``visce2``, ``gveval`` or
    ``fleur``) then asks that server (``http://{reward_router_address}/v1``, model
    ``reward.reward_model.model_path``, as veRL's own requests name it), unless ``CAPREWARD_JUDGE_URL``
    names another. veRL routes samples to a reward manager only when ``reward.custom_reward_function.path``
    is set, so set it too with a reward model (e.g. ``pkg://capreward.adapters.verl``)."""

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, reward_router_address: Any = None,
                 reward_model_tokenizer: Any = None, scorer: VerlScorer | None = None,
                 max_batch_size: int | None = None, max_wait: float | None = None, **kwargs: Any):
        super().__init__(config, tokenizer, compute_score)
        env = os.environ
        if scorer is None and reward_router_address is not None and not env.get("CAPREWARD_JUDGE_URL"):
            model = _reward_model_path(config)
            scorer = scorer_from_env(judge_url=f"http://{reward_router_address}/v1", judge_model=model,
                                     judge_api_key_env=None)
        self.reward_router_address = reward_router_address
        self.scorer = scorer if scorer is not None else default_scorer()
        self.max_batch_size = int(max_batch_size if max_batch_size is not None
                                  else env.get("CAPREWARD_VERL_MAX_BATCH", "256"))
        self.max_wait = float(max_wait if max_wait is not None
                              else float(env.get("CAPREWARD_VERL_MAX_WAIT_MS", "5")) / 1000)
        if self.max_batch_size < 1 or self.max_wait < 0:
            raise ValueError(f"bad batching settings: max_batch_size={self.max_batch_size}, max_wait={self.max_wait}")
        self.batches = 0  # scorer calls made (each scores one or more samples)
        self._pending: list[tuple[str, Label, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def run_single(self, data: Any) -> dict:
        """One sample's ``{"reward_score", "reward_extra_info"}``, scored with the samples that
        arrive with it."""
        item = data[-1:][0]  # like veRL's naive manager: the last sequence of a multi-sequence output
        response_ids = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
        response = self.tokenizer.decode(response_ids[:valid], skip_special_tokens=True)
        ground_truth = item.non_tensor_batch["reward_model"]["ground_truth"]
        extra_info = item.non_tensor_batch.get("extra_info", None)
        carried = item.non_tensor_batch.get("multi_modal_data", None)
        try:
            images = multi_modal_images(carried)
            video = multi_modal_video(carried) if not images else None
            if images and not _names_visual(extra_info):
                # the sample carries its images (veRL's multi_modal_data): score them, no path needed
                label = image_label(ground_truth, extra_info, images[0])
                label.images = tuple(images) if len(images) > 1 else None
            elif video is not None and not _names_visual(extra_info):
                label = image_label(ground_truth, extra_info, None)
                label.video = video
            else:
                label = sample_label(ground_truth, extra_info, self.scorer.paths)
        except LabelError as exc:
            logger.warning("unscored sample gets %s: %s", self.scorer.fallback, exc)
            row = self.scorer.rows(ScoredBatch([None], [str(exc)]))[0]
        else:
            row = await self._submit(response, label)
        return {"reward_score": row["score"], "reward_extra_info": row}

    def _submit(self, caption: str, label: Label) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((caption, label, future))
        if len(self._pending) >= self.max_batch_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait, self._flush)
        return future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            asyncio.get_running_loop().create_task(self._score(batch))

    async def _score(self, batch: list[tuple[str, Label, asyncio.Future]]) -> None:
        captions, labels = [c for c, _, _ in batch], [lab for _, lab, _ in batch]
        try:
            scored = await asyncio.to_thread(score_labelled, self.scorer.reward, captions, labels)
            rows = self.scorer.rows(scored)
        except Exception as exc:  # noqa: BLE001 - a broken reward is every waiting sample's error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self.batches += 1
        for (_, _, future), row in zip(batch, rows):  # score_labelled logged the unscored ones' reasons
            if not future.done():
                future.set_result(row)


def _first(data: Any, keys: tuple[str, ...]) -> Any:
    """The first item under the first of ``keys`` that ``data`` (a dict) holds, or None."""
    if not isinstance(data, dict):
        return None
    for key in keys:
        items = data.get(key)
        if items is None:
            continue
        if isinstance(items, (list, tuple)) or (isinstance(items, np.ndarray) and items.dtype == object):
            return items[0] if len(items) else None
        return items
    return None


def multi_modal_images(data: Any) -> list:
    """Every image a veRL sample carries in ``multi_modal_data`` (``"image"``, or the agent loop's
    ``"images"``), in order; empty when there is none."""
    if not isinstance(data, dict):
        return []
    for key in ("image", "images"):
        items = data.get(key)
        if items is None:
            continue
        if isinstance(items, (list, tuple)) or (isinstance(items, np.ndarray) and items.dtype == object):
            return [item for item in items if item is not None]
        return [items]
    return []


def multi_modal_image(data: Any) -> Any:
    """The image a veRL sample carries in ``multi_modal_data`` (``{"image": [PIL images]}``, as veRL's
    RLHF dataset stores it; ``"images"``, the agent loop's name, too): the first one, or None when there
    is none."""
    return _first(data, ("image", "images"))


def multi_modal_video(data: Any) -> Any:
    """The first video a veRL sample carries in ``multi_modal_data`` (``"video"``, or the agent loop's
    ``"videos"``), as frames capreward reads, or None when there is none.

    veRL stores a video as its ``fetch_video`` output: a (T, 3, H, W) tensor or array of pixel values
    0..255 in float after resizing (``video.numpy()``). Such frames are moved to (T, H, W, 3), rounded and
    clipped to uint8 (the resize's overshoot past 0 and 255); a list of PIL frames or a (T, H, W, 3)
    uint8 array is passed on as it is. Raises :class:`LabelError` for a non-finite frame array."""
    import torch

    video = _first(data, ("video", "videos"))
    if video is None:
        return None
    if isinstance(video, torch.Tensor):
        video = video.detach().cpu().numpy()
    if isinstance(video, np.ndarray) and video.ndim == 4 and video.shape[1] == 3 and video.shape[3] != 3:
        video = np.moveaxis(video, 1, 3)
    if isinstance(video, np.ndarray) and video.dtype != np.uint8 and np.issubdtype(video.dtype, np.number):
        if not np.isfinite(video).all():
            raise LabelError("sample multi_modal_data: the video's frames hold NaN or infinite values")
        video = np.clip(np.rint(video), 0, 255).astype(np.uint8)
    return video


def image_label(ground_truth: Any, extra_info: Any, image: Any) -> Label:
    """The label of a sample scored on the image object it carries: references from ``ground_truth``
    (else ``extra_info["references"]``), ``visual_id`` and ``questions`` from ``extra_info``."""
    info = extra_info if isinstance(extra_info, dict) else {}
    refs = parse_references(ground_truth, "sample ground_truth")
    if refs is None:
        refs = parse_references(info.get("references"), "sample extra_info")
    visual_id = info.get("visual_id")
    if visual_id is not None and not isinstance(visual_id, (str, int)):
        raise LabelError(f"sample extra_info: visual_id must be a str, got {type(visual_id).__name__}")
    return Label(image=image, references=refs, visual_id=None if visual_id is None else str(visual_id),
                 questions=parse_label_questions(info.get("questions"), "sample extra_info"))


def _names_visual(extra_info: Any) -> bool:
    return isinstance(extra_info, dict) and any(extra_info.get(k) is not None for k in ("image", "images", "video"))


def _reward_model_path(config: Any) -> str | None:
    """``reward.reward_model.model_path`` of veRL's config (the model name its reward pool serves)."""
    try:
        return str(config.reward.reward_model.model_path)
    except (AttributeError, KeyError):
        return None


__all__ = ["CaprewardRewardManager"]
