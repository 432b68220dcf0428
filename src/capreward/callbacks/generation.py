"""Default caption generation with a transformers model, for :class:`CaptionEvalCallback`.

Two input styles cover the common captioners:

- tensor inputs taken from each example (``input_keys``, e.g. ``("pixel_values",)`` for a
  ``VisionEncoderDecoderModel`` or any encoder-decoder captioner), stacked into a batch;
- a text prompt per example (``prompt_key``) for decoder-only models (the policy of a GRPO run):
  plain strings are tokenised as they are, conversations (lists of ``{"role", "content"}``) through the
  tokenizer's chat template; batches are padded on the left and only the new tokens are decoded.

Anything else (a VLM whose processor needs images and text together …): pass your own
``generate_fn(model, examples) -> list[str]`` to the callback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class CaptionGenerator:
    """Greedy (by default) captions for a list of examples.

    Args:
        processing_class: the tokenizer, or a processor with a ``tokenizer`` attribute, used to encode
            prompts and decode outputs.
        input_keys: example keys whose tensors are stacked and passed to ``generate`` as they are.
        prompt_key: example key holding a text prompt or a conversation.
        max_new_tokens: generation budget. generation_kwargs: more ``generate`` arguments
            (``do_sample=False`` unless given).

    Calling it returns one stripped caption string per example.
    """

    def __init__(
        self,
        processing_class: Any,
        *,
        input_keys: Sequence[str] = (),
        prompt_key: str | None = None,
        max_new_tokens: int = 32,
        generation_kwargs: Mapping[str, Any] | None = None,
    ):
        if not input_keys and prompt_key is None:
            raise ValueError("give input_keys (tensor inputs) and/or prompt_key (text prompts)")
        if processing_class is None:
            raise ValueError("caption generation needs the trainer's processing_class (tokenizer or processor)")
        self.tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self.input_keys = tuple(input_keys)
        self.prompt_key = prompt_key
        self.generation_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, **(generation_kwargs or {})}

    def inputs(self, examples: Sequence[Mapping[str, Any]], device: torch.device) -> dict[str, torch.Tensor]:
        """The batch of model inputs for ``examples``; raises KeyError naming a missing key."""
        batch: dict[str, torch.Tensor] = {}
        for key in self.input_keys:
            values = []
            for i, ex in enumerate(examples):
                if key not in ex:
                    raise KeyError(f"example {i} has no input {key!r}; keys: {sorted(ex)}")
                values.append(torch.as_tensor(ex[key]))
            batch[key] = torch.stack(values).to(device)
        if self.prompt_key is not None:
            texts, templated = [], False
            for i, ex in enumerate(examples):
                if self.prompt_key not in ex:
                    raise KeyError(f"example {i} has no prompt {self.prompt_key!r}; keys: {sorted(ex)}")
                prompt = ex[self.prompt_key]
                if not isinstance(prompt, str):
                    prompt = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
                    templated = True
                texts.append(prompt)
            side = self.tokenizer.padding_side
            self.tokenizer.padding_side = "left"
            try:
                enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not templated)
            finally:
                self.tokenizer.padding_side = side
            batch.update({k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")})
        return batch

    @torch.no_grad()
    def __call__(self, model: Any, examples: Sequence[Mapping[str, Any]]) -> list[str]:
        device = next(model.parameters()).device
        inputs = self.inputs(examples, device)
        kwargs = dict(self.generation_kwargs)
        if self.tokenizer.pad_token_id is not None:
            kwargs.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        out = model.generate(**inputs, **kwargs)
        is_encoder_decoder = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
        if not is_encoder_decoder and "input_ids" in inputs:
            out = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]
