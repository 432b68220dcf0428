"""Default caption generation with a transformers model, for :class:`CaptionEvalCallback`.

Three input styles cover the common captioners:

- tensor inputs taken from each example (``input_keys``, e.g. ``("pixel_values",)`` for a
  ``VisionEncoderDecoderModel`` or any encoder-decoder captioner), stacked into a batch;
- a text prompt per example (``prompt_key``) for decoder-only models (the policy of a GRPO run):
  plain strings are tokenised as they are, conversations (lists of ``{"role", "content"}``) through the
  processing class's chat template;
- an image prompt (``prompt_key`` and ``image_key``) for vision-language policies (LLaVA, Qwen-VL …, as
  TRL's GRPO trains them on an ``image`` column): the example's image(s) go into the first user turn of
  the conversation (a plain-string prompt becomes one user turn) as ``{"type": "image"}`` blocks unless
  it already has them, the conversation is rendered by the processor's chat template, and the processor
  takes the texts and images together.

Batches are padded on the left and only the new tokens are decoded. Anything else: pass your own
``generate_fn(model, examples) -> list[str]`` to the callback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch


class CaptionGenerator:
    """Greedy (by default) captions for a list of examples.

    Args:
        processing_class: the tokenizer, or a processor with a ``tokenizer`` attribute, used to encode
            prompts and decode outputs (a processor's own chat template renders conversations).
        input_keys: example keys whose tensors are stacked and passed to ``generate`` as they are.
        prompt_key: example key holding a text prompt or a conversation.
        image_key: example key holding the prompt's image (a path, PIL image, array or tensor) or a list of
            them, for a vision-language policy; needs ``prompt_key`` and a processor with an image processor.
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
        image_key: str | None = None,
        max_new_tokens: int = 32,
        generation_kwargs: Mapping[str, Any] | None = None,
    ):
        if not input_keys and prompt_key is None:
            raise ValueError("give input_keys (tensor inputs) and/or prompt_key (text prompts)")
        if processing_class is None:
            raise ValueError("caption generation needs the trainer's processing_class (tokenizer or processor)")
        if image_key is not None:
            if prompt_key is None:
                raise ValueError("image_key needs prompt_key: the image goes into the prompt's conversation")
            if not is_image_processor(processing_class):
                raise ValueError(
                    f"image prompts need a processor that takes images and text together; the processing class is a "
                    f"{type(processing_class).__name__}"
                )
        self.processing_class = processing_class
        self.tokenizer = getattr(processing_class, "tokenizer", processing_class)
        # a processor renders conversations with its own chat template (its tokenizer may have none)
        self.templater = processing_class if hasattr(processing_class, "apply_chat_template") else self.tokenizer
        self.input_keys = tuple(input_keys)
        self.prompt_key = prompt_key
        self.image_key = image_key
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
        if self.prompt_key is not None and self.image_key is not None:
            batch.update({k: v.to(device) for k, v in self._image_prompts(examples).items()})
        elif self.prompt_key is not None:
            texts, templated = [], False
            for i, ex in enumerate(examples):
                prompt = self._prompt(ex, i)
                if not isinstance(prompt, str):
                    prompt = self.templater.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
                    templated = True
                texts.append(prompt)
            enc = self._left_padded(self.tokenizer, texts, add_special_tokens=not templated)
            batch.update({k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")})
        return batch

    def _prompt(self, example: Mapping[str, Any], i: int) -> Any:
        key = cast(str, self.prompt_key)  # prompts are read only with a prompt_key
        if key not in example:
            raise KeyError(f"example {i} has no prompt {key!r}; keys: {sorted(example)}")
        return example[key]

    def _image_prompts(self, examples: Sequence[Mapping[str, Any]]) -> Mapping[str, torch.Tensor]:
        """The processor's inputs (ids, mask, pixel values …) for image prompts: each example's
        conversation with its images, rendered by the processor's chat template."""
        from ..media import load_image

        texts, images = [], []
        for i, ex in enumerate(examples):
            if self.image_key not in ex:
                raise KeyError(f"example {i} has no image {self.image_key!r}; keys: {sorted(ex)}")
            given = ex[cast(str, self.image_key)]  # image prompts are built only with an image_key
            pictures = [load_image(p, index=i) for p in (given if isinstance(given, (list, tuple)) else [given])]
            messages = image_conversation(self._prompt(ex, i), len(pictures), f"example {i}")
            texts.append(self.processing_class.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
            images.extend(pictures)
        # the template wrote the special tokens it wants; as TRL encodes its prompts
        return self._left_padded(self.processing_class, texts, images=images, add_special_tokens=False)

    def _left_padded(self, encoder: Any, texts: list[str], **kwargs: Any) -> Mapping[str, torch.Tensor]:
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"
        try:
            return encoder(text=texts, return_tensors="pt", padding=True, **kwargs)
        finally:
            self.tokenizer.padding_side = side

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


def is_image_processor(processing_class: Any) -> bool:
    """Whether ``processing_class`` is a processor that takes images with the text (it has an image processor)."""
    return getattr(processing_class, "image_processor", None) is not None


def has_image_blocks(prompt: Any) -> bool:
    """Whether a conversation has ``{"type": "image"}`` content blocks."""
    if isinstance(prompt, str) or not isinstance(prompt, Sequence):
        return False
    return any(isinstance(m, Mapping) and not isinstance(m.get("content"), str)
               and any(isinstance(b, Mapping) and b.get("type") == "image" for b in (m.get("content") or ()))
               for m in prompt)


def image_conversation(prompt: Any, n_images: int, where: str = "example") -> list[dict]:
    """The conversation of an image prompt, in the content-block form chat templates of VLM processors take.

    A plain string becomes one user turn. String contents become ``[{"type": "text", ...}]``. A
    conversation without image blocks gets ``n_images`` of them at the start of its first user turn;
    one that has them must have ``n_images``. Raises ValueError naming ``where`` otherwise. The
    prompt's text is never searched or rewritten: it is one text block.
    """
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) and "role" in m for m in prompt):
        raise ValueError(f"{where}: the prompt must be a string or a list of {{'role', 'content'}} messages")
    messages = []
    for m in prompt:
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        messages.append({**m, "content": list(content or [])})
    present = sum(1 for m in messages for b in m["content"] if isinstance(b, Mapping) and b.get("type") == "image")
    if present == 0:
        users = [m for m in messages if m["role"] == "user"]
        if not users:
            raise ValueError(f"{where}: the conversation has no user turn to put the image in")
        users[0]["content"] = [{"type": "image"} for _ in range(n_images)] + users[0]["content"]
    elif present != n_images:
        raise ValueError(f"{where}: the conversation has {present} image blocks for {n_images} images")
    return messages
