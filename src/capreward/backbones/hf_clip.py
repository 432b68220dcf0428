"""transformers CLIP-family models as backbones: ``CLIPModel``, ``SiglipModel`` and ``Siglip2Model``,
scored through the model's own processor (its tokenizer, padding and image processor).

Accepted specifications (``model=`` of every CLIP-based scorer, or :class:`TransformersBackbone`):

- ``"transformers:openai/clip-vit-base-patch32"``, ``"transformers:google/siglip-base-patch16-224"``,
  ``"transformers:/models/siglip2"``: a hub name or directory, loaded with ``AutoModel`` /
  ``AutoProcessor`` (the local cache first; a download only when the hub answers);
- a directory holding a transformers ``config.json`` (and no ``open_clip_config.json``);
- a ``(model, processor)`` pair already in memory.

How each family reads a caption (what EMScore and CLIP-S see):

- ``clip`` (causal): BOS + tokens + EOS, at most ``max_position_embeddings`` (77); the token
  embeddings are ``text_projection`` of the final layer-normed hidden states, the caption embedding
  ``get_text_features`` (the EOS position's); exactly open_clip's CLIP definitions.
- ``siglip`` / ``siglip2`` (non-causal): tokens + EOS padded to the full context (64) with the
  tokenizer's pad token, as the model was trained (``padding="max_length"``); every position attends
  to the whole caption and the padding. The caption embedding is ``get_text_features`` (the head on the
  last position); the token embeddings are the head on every caption position (see
  :mod:`capreward.backbones.towers`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..devices import checked_device
from .clip_loading import ModelLoadError, precision_for
from .towers import TowerBackbone

PREFIX = "transformers:"
#: transformers ``model_type`` → whether its text tower is causal.
FAMILIES = {"clip": True, "siglip": False, "siglip2": False}


def _model_type(path: Path) -> str | None:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def is_transformers_spec(spec: Any) -> bool:
    """Whether ``spec`` names a transformers model: a ``(model, processor)`` pair, a ``"transformers:"``
    name, or a directory with a transformers ``config.json`` and no ``open_clip_config.json``."""
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], torch.nn.Module):
        return True
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if text.startswith(PREFIX):
            return True
        path = Path(text)
        return path.is_dir() and (path / "config.json").is_file() and not (path / "open_clip_config.json").is_file()
    return False


def load_transformers_clip(spec: Any, device: str | torch.device, precision: str | None = None):
    """``(model, processor)`` in eval mode on ``device`` for a transformers specification (module doc).

    Raises:
        ModelLoadError: the model cannot be loaded, or is not a CLIP family this module knows.
    """
    precision = precision_for(device, precision)
    if isinstance(spec, (tuple, list)):
        model, processor = spec
        name = type(model).__name__
    else:
        from ..hub import ModelNotAvailable, NotAModel, cache_only, load_cached_first, quiet_root_logging

        name = os.fspath(spec)
        name = name[len(PREFIX):] if name.startswith(PREFIX) else name

        def create(local_only: bool):
            from transformers import AutoModel, AutoProcessor

            with quiet_root_logging("transformers"), cache_only() if local_only else _null():
                # trust_remote_code=False: a folder's own code is never run, and transformers never asks
                return (AutoModel.from_pretrained(name, local_files_only=local_only, trust_remote_code=False),
                        AutoProcessor.from_pretrained(name, local_files_only=local_only, trust_remote_code=False))

        try:
            model, processor = load_cached_first(create, f"transformers model {name!r}", source=name)
        except NotAModel as exc:  # a path on this machine: the hub was not asked
            raise ModelLoadError(str(exc), spec=name, summary=str(exc)) from exc
        except ModelNotAvailable as exc:
            raise ModelLoadError(f"{exc}; point model= at a local directory (model='transformers:/path')", spec=name) from exc
        except Exception as exc:
            raise ModelLoadError(f"cannot load transformers model {name!r}: {exc}", spec=name) from exc
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in FAMILIES:
        raise ModelLoadError(f"{name}: model_type {family!r} is not a CLIP family capreward scores "
                             f"(transformers: {', '.join(FAMILIES)})", spec=name)
    for part in ("tokenizer", "image_processor"):
        if getattr(processor, part, None) is None:
            raise ModelLoadError(f"{name}: the processor has no {part}; pass the model's own processor", spec=name)
    model = model.to(device).eval()
    if precision in ("bf16", "pure_bf16"):
        model = model.to(torch.bfloat16)
    elif precision in ("fp16", "pure_fp16"):
        model = model.to(torch.float16)
    return model, processor


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _ImageTransform:
    """The model's processor as a PIL → tensor transform (``processor(images=image)``, with the
    processor's own defaults): ``[3, H, W]`` pixel values, or for SigLIP2's patch inputs one
    ``[patches, 3·p·p + 3]`` tensor packing pixel values, the patch mask and the spatial shape (unpacked
    by :meth:`TransformersBackbone.encode_pixels`)."""

    def __init__(self, processor: Any, packed: bool):
        self.processor, self.packed = processor, packed

    def __call__(self, image) -> torch.Tensor:
        out = self.processor(images=image, return_tensors="pt")
        if not self.packed:
            return out["pixel_values"][0]
        values, mask, shape = out["pixel_values"][0], out["pixel_attention_mask"][0], out["spatial_shapes"][0]
        extra = torch.cat([mask[:, None].to(values.dtype), shape[None].expand(values.shape[0], 2).to(values.dtype)], -1)
        return torch.cat([values, extra], dim=-1)


def _features(out: Any) -> torch.Tensor:
    """``get_*_features`` output: a tensor (transformers 4) or a model output's ``pooler_output`` (5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class TransformersBackbone(TowerBackbone):
    """A transformers ``CLIPModel`` / ``SiglipModel`` / ``Siglip2Model`` as a
    :class:`~capreward.backbones.CLIPBackbone` (``CLIPBackbone(spec)`` with a transformers spec builds
    one). ``model`` is a spec of :func:`load_transformers_clip`.

    Args:
        model: a ``"transformers:<name or dir>"`` spec, a transformers model directory or a
            ``(model, processor)`` pair.
        device: where the model runs.
        precision: the weights' precision (default fp32).
        cache_size: entries of the visual-embedding cache.
        image_batch_size: images per encoder pass.
        trim_text: as :class:`~capreward.backbones.CLIPBackbone`'s.
        text_cache_size: entries of the caption-embedding cache (0 disables it).
        text_cache_bytes: bytes of the caption-embedding cache.
        text_tokens_per_pass: tokens of one packed text-tower pass (memory).

    Examples:
        >>> from capreward.backbones import CLIPBackbone
        >>> from capreward.testing.tiny_hf_clip import tiny_hf_clip
        >>> backbone = CLIPBackbone(tiny_hf_clip("siglip"))  # a (model, processor) pair
        >>> backbone.context_length, backbone.causal
        (64, False)
    """

    takes_spec = staticmethod(is_transformers_spec)

    def __init__(
        self,
        model: Any,
        device: str | torch.device = "cpu",
        precision: str | None = None,
        cache_size: int = 512,
        image_batch_size: int = 64,
        trim_text: bool = True,
        text_cache_size: int = 8192,
        text_cache_bytes: int = 256 * 2**20,
        text_tokens_per_pass: int = 8192,
    ):
        self.device = checked_device(device)
        self.model, self.processor = load_transformers_clip(model, self.device, precision)
        self.model.requires_grad_(False)
        self.family = self.model.config.model_type
        self.causal = FAMILIES[self.family]
        self.tokenizer = self.processor.tokenizer
        self.preprocess = _ImageTransform(self.processor, packed=self.family == "siglip2")
        text_config = self.model.config.text_config
        probe = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = self.tokenizer.bos_token_id
        if self.tokenizer.eos_token_id is None:
            raise ModelLoadError(f"the {self.family} tokenizer has no end-of-sequence token")
        self._setup(
            context_length=int(text_config.max_position_embeddings),
            vocab_size=max(int(text_config.vocab_size), len(self.tokenizer)),
            sot_id=bos if bos is not None and probe and probe[0] == bos else None,
            eot_id=int(self.tokenizer.eos_token_id),
            key=(type(self.model).__name__, id(self.model), str(self.model.dtype)),
            cache_size=cache_size, image_batch_size=image_batch_size, trim_text=trim_text,
            text_cache_size=text_cache_size, text_cache_bytes=text_cache_bytes,
            text_tokens_per_pass=text_tokens_per_pass,
        )

    # ------------------------------------------------------------------ text
    def full_ids(self, caption: str) -> list[int]:
        """The tokenizer's ids with its special tokens, uncut; a caption's text never becomes a special
        token (``split_special_tokens``)."""
        if not isinstance(caption, str):
            raise TypeError(f"captions must be str, got {type(caption).__name__}")
        return list(self.tokenizer(caption, add_special_tokens=True, split_special_tokens=True)["input_ids"])

    def encode_rows(self, rows: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        width = max(len(r) for r in rows) if self.causal else self.context_length
        batch = self.tokenizer.pad({"input_ids": [list(r) for r in rows]}, padding="max_length", max_length=width,
                                   return_attention_mask=True, return_tensors="pt")
        ids, real = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device).bool()
        inputs = {"input_ids": ids}
        if "attention_mask" in self.tokenizer.model_input_names:
            inputs["attention_mask"] = batch["attention_mask"].to(self.device)
        with torch.no_grad():
            out = self.model.text_model(**inputs)
            hidden = out.last_hidden_state
            if self.family == "clip":
                tokens = self.model.text_projection(hidden)
                pooled = self.model.text_projection(out.pooler_output)
            else:  # SigLIP: the head is the projection; pooler_output is already through it
                tokens = self.model.text_model.head(hidden)
                pooled = out.pooler_output
        tokens, pooled = F.normalize(tokens.float(), dim=-1), F.normalize(pooled.float(), dim=-1)
        return [(tokens[j][real[j]].clone(), pooled[j].clone()) for j in range(len(rows))]

    def decode_token(self, token_id: int) -> str:
        return self._decode_with(self.tokenizer, token_id)

    # ---------------------------------------------------------------- images
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """L2-normalised ``get_image_features`` [n, D] (fp32) of processed pixels."""
        outs = []
        dtype = self.model.dtype
        for start in range(0, pixels.shape[0], self.image_batch_size):
            chunk = pixels[start : start + self.image_batch_size].to(self.device)
            with torch.no_grad():
                if self.family == "siglip2":
                    out = self.model.get_image_features(
                        pixel_values=chunk[..., :-3].to(dtype), pixel_attention_mask=chunk[..., -3].round().long(),
                        spatial_shapes=chunk[:, 0, -2:].round().long(),
                    )
                else:
                    out = self.model.get_image_features(pixel_values=chunk.to(dtype))
            outs.append(F.normalize(_features(out).float(), dim=-1))
        return torch.cat(outs)

    @property
    def input_pixels(self) -> int:
        if getattr(self, "_input_pixels", None) is None:
            from PIL import Image

            probe = self.preprocess(Image.new("RGB", (64, 48)))
            self._input_pixels = int(probe.shape[0] * (probe.shape[1] - 3) // 3) if self.family == "siglip2" else int(
                probe.shape[-1] * probe.shape[-2])
        return self._input_pixels
