"""Self-critical sequence training (SCST) for any ``generate``-capable ``transformers`` captioner.

:class:`SelfCriticalStep` does one SCST step for a batch of visuals: it samples k captions per visual,
decodes the greedy caption (the baseline of Rennie et al.; or uses the mean of the other samples, the
"new SCST" of Luo 2020), scores every caption with a capreward reward (any
:class:`~capreward.rewards.RewardFunction`, e.g. :class:`~capreward.rewards.CompositeReward`, or a plain
TRL-style reward function) and returns the REINFORCE loss with the rewards and their sub-scores.

Which models: encoder-decoders (``VisionEncoderDecoderModel`` such as ViT-GPT2, BLIP's
``BlipForConditionalGeneration``, video captioners built the same way) and decoder-only captioners that
take the visual as extra inputs (GIT). The step reads only the last G positions of the logits of a
teacher-forced forward pass over the generated sequences, where G is the number of generated tokens,
so models that prepend image tokens to their logits work too.

Samples whose caption cannot be scored (the reward returns ``None``, e.g. an empty caption) get
advantage 0 and are counted in ``metrics["unscored"]``; their reasons are in ``SCSTOutput.reasons``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping, Sequence

import torch

from .scst_math import BASELINES, reinforce_loss, scst_advantages, sequence_log_probs


@dataclass
class SCSTOutput:
    """One SCST step: ``loss`` (scalar, with gradient), the sampled ``captions`` (B·k, visual-major),
    their ``rewards`` [B, k] (NaN where unscored, unless ``unscored_reward`` is set), the ``greedy_captions`` and ``greedy_rewards`` [B]
    (None with ``baseline="mean"``), the ``advantages`` [B, k], per-sample ``reasons`` for unscored
    samples (samples first, then greedy captions) and ``metrics`` (batch means: ``reward``,
    ``reward_greedy``, ``advantage_abs``, ``unscored``, ``length`` and the reward's sub-scores)."""

    loss: torch.Tensor
    captions: list[str]
    rewards: torch.Tensor
    advantages: torch.Tensor
    greedy_captions: list[str] | None = None
    greedy_rewards: torch.Tensor | None = None
    reasons: list[str | None] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def score_captions(
    reward: Callable, captions: list[str], columns: Mapping[str, list[Any]]
) -> tuple[list[float | None], list[str | None], dict[str, list[float]]]:
    """Values (None where unscored), reasons and per-sample sub-scores of ``captions`` under ``reward``.

    A capreward reward is called through ``compute`` (no logging; sub-scores kept); any other callable
    with TRL's contract ``reward(prompts, completions, **columns) -> list[float | None]``."""
    compute = getattr(reward, "compute", None)
    if compute is not None:
        out = compute(None, captions, **columns)
        return list(out.values), list(out.reasons), dict(out.metrics)
    values = list(reward(None, captions, **columns))
    if len(values) != len(captions):
        raise RuntimeError(f"reward returned {len(values)} values for {len(captions)} captions")
    return values, [None if v is not None else "reward returned None" for v in values], {}


def repeat_inputs(inputs: Mapping[str, Any], k: int) -> dict[str, Any]:
    """Every tensor of ``inputs`` repeated k times along dim 0 (each row's copies adjacent, the order of
    ``generate(num_return_sequences=k)``); other values unchanged."""
    return {n: v.repeat_interleave(k, dim=0) if torch.is_tensor(v) else v for n, v in inputs.items()}


def greedy_captions(model, tokenizer, inputs: Mapping[str, Any], max_new_tokens: int, **generation_kwargs: Any) -> list[str]:
    """The greedy caption of each visual of ``inputs``: ``generate`` without sampling, only the generated
    tokens decoded (decoder-only models echo their prompt)."""
    kwargs = dict(generation_kwargs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
    with torch.no_grad():
        out = model.generate(**inputs, **kwargs, return_dict_in_generate=True, output_scores=True)
    return tokenizer.batch_decode(out.sequences[:, -len(out.scores):], skip_special_tokens=True)


def generated_mask(tokens: torch.Tensor, eos_token_id: int | Sequence[int] | None) -> torch.Tensor:
    """True at generated positions up to and including the first EOS of each row (the padding after it
    is False). ``tokens`` [N, G] are the generated tokens only."""
    if eos_token_id is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    eos = torch.as_tensor(eos_token_id, device=tokens.device).reshape(-1)
    is_eos = torch.isin(tokens, eos).long()
    before = torch.cumsum(is_eos, dim=1) - is_eos
    return before == 0


class SelfCriticalStep:
    """One SCST step for a ``transformers`` captioner (see the module docstring).

    Args:
        reward: a capreward reward (``EMScoreReward``, ``CLIPScoreReward``, ``CompositeReward``, ...) or a
            TRL-style reward function. It receives the captions and, per caption, the visual under
            ``visual_column`` and the references under ``"references"`` (when given).
        tokenizer: decodes generated ids to captions (``batch_decode(..., skip_special_tokens=True)``).
        samples: k, captions sampled per visual (>= 1; >= 2 for ``baseline="mean"``).
        baseline: ``"greedy"`` (SCST) or ``"mean"`` (mean of the other samples).
        max_new_tokens: sampling setting: the longest caption, in tokens.
        temperature: sampling setting.
        top_k: sampling setting (top_k=0: the full distribution, as SCST samples).
        generation_kwargs: go to both ``generate`` calls (e.g. ``suppress_tokens``).
        length_normalise: divide each sample's log-probability by its length.
        visual_column: the reward's column for visuals (``"image"`` or ``"video"``).
        unscored_reward: the reward given to a caption the reward cannot score (e.g. an empty caption).
            None (default): such a sample has no advantage, so nothing pushes the policy away from it;
            a policy can then drift to empty captions (see experiments/scst_colour_toy.py). A value at
            or below the reward's minimum (e.g. 0 for CLIP-S) makes them the worst captions instead.

    Examples:
        >>> import torch
        >>> from capreward.testing import colour_image
        >>> from capreward.testing.tiny_captioner import build_tiny_captioner
        >>> from capreward.training import SelfCriticalStep
        >>> model, processor, tokenizer = build_tiny_captioner(seed=0)
        >>> images = [colour_image("red"), colour_image("blue")]
        >>> says_red = lambda prompts, completions, **columns: [float("red" in c) for c in completions]
        >>> step = SelfCriticalStep(says_red, tokenizer, samples=3, max_new_tokens=4, visual_column="image")
        >>> _ = torch.manual_seed(0)
        >>> out = step(model, {"pixel_values": processor(images, return_tensors="pt").pixel_values}, images)
        >>> out.rewards.shape, len(out.greedy_captions), out.loss.requires_grad
        (torch.Size([2, 3]), 2, True)
    """

    def __init__(
        self,
        reward: Callable,
        tokenizer: Any,
        *,
        samples: int = 5,
        baseline: str = "greedy",
        max_new_tokens: int = 20,
        temperature: float = 1.0,
        top_k: int = 0,
        length_normalise: bool = False,
        visual_column: str = "image",
        generation_kwargs: Mapping[str, Any] | None = None,
        unscored_reward: float | None = None,
    ):
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        if samples < 1 or (baseline == "mean" and samples < 2):
            raise ValueError(f"samples must be >= {2 if baseline == 'mean' else 1} with baseline={baseline!r}, got {samples}")
        self.reward = reward
        self.tokenizer = tokenizer
        self.samples = samples
        self.baseline = baseline
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.length_normalise = length_normalise
        self.visual_column = visual_column
        self.generation_kwargs = dict(generation_kwargs or {})
        self.unscored_reward = unscored_reward

    # ------------------------------------------------------------------------------------ decoding
    def _sample(self, model, inputs: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
        """k sampled sequences per visual (visual-major) and the number of generated tokens."""
        kwargs = dict(self.generation_kwargs, max_new_tokens=self.max_new_tokens, do_sample=True,
                      num_return_sequences=self.samples, temperature=self.temperature, top_k=self.top_k)
        with torch.no_grad():
            out = model.generate(**inputs, **kwargs, return_dict_in_generate=True, output_scores=True)
        return out.sequences, len(out.scores)

    def greedy(self, model: Any, inputs: Mapping[str, Any]) -> list[str]:
        """The greedy caption of each visual (what validation scores).

        Args:
            model: the captioner.
            inputs: its processor's inputs for the visuals (and prompts).

        Returns:
            One caption per visual.
        """
        return greedy_captions(model, self.tokenizer, inputs, self.max_new_tokens, **self.generation_kwargs)

    def log_probs(self, model: Any, inputs: Mapping[str, Any], sequences: torch.Tensor, generated: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-probability of each sampled caption under a teacher-forced forward pass.

        Args:
            model: the captioner.
            inputs: its processor's inputs, one row per sequence.
            sequences: prompt and sampled caption per row.
            generated: how many trailing tokens of each row are the caption.

        Returns:
            ``(log_probs, lengths)``: Σ log p of each row's caption tokens (up to and including its EOS),
            with gradient, and their counts.
        """
        eos = getattr(model.generation_config, "eos_token_id", None)
        targets = sequences[:, -generated:]
        mask = generated_mask(targets, eos)
        if getattr(model.config, "is_encoder_decoder", False):
            out = model(**inputs, decoder_input_ids=sequences, decoder_attention_mask=torch.ones_like(sequences))
        else:
            extra = {}
            if "attention_mask" in inputs:
                prompt_mask = inputs["attention_mask"]
                new = torch.ones(sequences.shape[0], sequences.shape[1] - prompt_mask.shape[1], dtype=prompt_mask.dtype, device=prompt_mask.device)
                extra["attention_mask"] = torch.cat([prompt_mask, new], dim=1)
            rest = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
            out = model(**rest, input_ids=sequences, **extra)
        logits = out.logits[:, -generated - 1 : -1]
        return sequence_log_probs(logits, targets, mask), mask.sum(dim=1)

    # ------------------------------------------------------------------------------------- the step
    def __call__(
        self,
        model,
        inputs: Mapping[str, Any],
        visuals: Sequence[Any],
        references: Sequence[Sequence[str]] | None = None,
    ) -> SCSTOutput:
        """SCST on a batch: ``inputs`` are the model's inputs for B visuals (``pixel_values``, ...),
        ``visuals`` the B visuals in the reward's form (paths, PIL images, arrays), ``references`` optional
        per-visual reference captions. Returns an `SCSTOutput`."""
        b, k = len(visuals), self.samples
        if references is not None and len(references) != b:
            raise ValueError(f"got {len(references)} reference lists for {b} visuals")
        sequences, generated = self._sample(model, inputs)
        if sequences.shape[0] != b * k:
            raise ValueError(f"the model's inputs describe {sequences.shape[0] // k} visuals, but {b} visuals were given")
        captions = self.tokenizer.batch_decode(sequences[:, -generated:], skip_special_tokens=True)
        greedy = self.greedy(model, inputs) if self.baseline == "greedy" else []

        per_caption_visuals = [v for v in visuals for _ in range(k)] + list(visuals[: len(greedy)])
        columns: dict[str, list[Any]] = {self.visual_column: per_caption_visuals}
        if references is not None:
            columns["references"] = [list(r) for r in references for _ in range(k)] + [list(r) for r in references[: len(greedy)]]
        values, reasons, sub_scores = score_captions(self.reward, captions + greedy, columns)
        unscored = math.nan if self.unscored_reward is None else float(self.unscored_reward)
        as_float = [unscored if v is None else float(v) for v in values]
        unscored_count = sum(v is None for v in values[: b * k])
        rewards = torch.tensor(as_float[: b * k], dtype=torch.float64).reshape(b, k)
        greedy_rewards = torch.tensor(as_float[b * k :], dtype=torch.float64) if greedy else None
        advantages = scst_advantages(rewards, greedy_rewards, self.baseline)

        seq_logp, lengths = self.log_probs(model, repeat_inputs(inputs, k), sequences, generated)
        loss = reinforce_loss(seq_logp, advantages.to(seq_logp.device), lengths if self.length_normalise else None)
        metrics = {
            "reward": _nanmean(rewards.reshape(-1).tolist()),
            "advantage_abs": float(advantages.abs().mean()),
            "unscored": float(unscored_count),
            "length": float(lengths.float().mean()),
        }
        if greedy_rewards is not None:
            metrics["reward_greedy"] = _nanmean(greedy_rewards.tolist())
        for name, column in sub_scores.items():
            metrics[name] = _nanmean(column[: b * k])
        return SCSTOutput(
            loss=loss, captions=captions, rewards=rewards, advantages=advantages,
            greedy_captions=greedy or None, greedy_rewards=greedy_rewards, reasons=reasons, metrics=metrics,
        )


def _nanmean(values: Sequence[float]) -> float:
    finite = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(finite) / len(finite) if finite else math.nan
