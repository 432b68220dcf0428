"""CLIP towers for the matching metrics: per-token and pooled text embeddings, frame embeddings.

All embeddings come back L2-normalised, in fp32, on the backbone's device. Visual embeddings are
cached (LRU) by a content key (file identity or pixel hash, narrowed by an explicit id when one is given;
an id alone never serves an embedding), so the video of a GRPO group is encoded once. Caption
embeddings are cached (LRU, bounded in entries and bytes) by their token ids, so references that recur
over training steps and repeated completions are encoded once; captions missing from the cache are
encoded in length-planned batches (:func:`plan_text_batches`) rather than padded to the longest.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..devices import checked_device, host_to_device, strict_fp32_method
from ..media import MediaError, describe, frames_to_pil, get_media_limits, load_image, open_video, to_rgb
from ..media.keys import content_key, with_id
from .cache import LRUCache
from ..default_models import DEFAULT_CLIP
from .clip_loading import load_clip
from .windows import check_long_captions, combine_windows, split_windows


@dataclass
class TokenBatch:
    """Token ids of a batch of captions, SOS..EOS then zero padding."""

    ids: torch.Tensor  # LongTensor [N, L]
    lengths: torch.Tensor  # LongTensor [N]: number of tokens from SOS to EOS inclusive
    truncated: list[bool]  # True where the caption was cut to fit the context (EOS kept)


@dataclass
class TextEmbeddings:
    """Per-token and pooled caption embeddings."""

    tokens: torch.Tensor  # [N, L, D], L2-normalised per position; zero at padded positions
    pooled: torch.Tensor  # [N, D], the EOS position's embedding (CLIP's caption embedding)
    mask: torch.Tensor  # BoolTensor [N, L], True for SOS..EOS


class CLIPBackbone:
    """A CLIP model with the encoders EMScore and CLIP-S need (one backbone can be shared by several
    scorers: ``EMScore(backbone=b)``, ``CLIPScore(backbone=b)``).

    Args:
        model: a specification :func:`~capreward.backbones.clip_loading.load_clip` accepts (an open_clip
            name or ``name:tag``, an OpenAI-format ``.pt`` path, a local checkpoint, a zero-argument
            factory returning ``(model, preprocess, tokenizer)``; a transformers spec gives a
            :class:`~capreward.backbones.TransformersBackbone`).
        device: where the model runs.
        precision: open_clip precision (default fp32).
        cache_size: entries of the visual-embedding cache.
        image_batch_size: images per encoder pass.
        trim_text: run the text tower only up to the longest caption of each batch (exact under CLIP's
            causal mask); False always runs the full context (the reference implementations' behaviour).
        text_cache_size: entries of the caption-embedding cache (0 disables it).
        text_cache_bytes: bytes of the caption-embedding cache.
        text_tokens_per_pass: tokens of one packed text-tower pass (memory).
        preprocessing: ``"pil"`` (default: the released transform on PIL images, on the CPU) or ``"device"``
            (the same resize, centre crop and normalisation as tensors where the model runs,
            :class:`~capreward.media.device_pixels.TensorPreprocess`: no CPU preprocessing of frames on a
            GPU machine; its score deviation from the PIL path is in docs/design/parity.md).

    Raises:
        ModelLoadError: the model cannot be loaded (the message says how to point at a local file).
        ValueError: ``preprocessing="device"`` with a transform other than resize, crop and normalise.

    The attribute
    ``preprocess_workers`` (default: half the CPU cores, at most 4) is how many threads run the CLIP preprocessing of
    frames and images while the caller's thread decodes the next ones and the encoder runs (each frame is
    preprocessed by the same function as alone: the pixels are identical); 1 preprocesses in the caller's thread.

    Examples:
        >>> from PIL import Image
        >>> from capreward.backbones import CLIPBackbone
        >>> from capreward.testing import tiny_clip_factory
        >>> backbone = CLIPBackbone(tiny_clip_factory())
        >>> batch = backbone.tokenize(["a red image.", "a blue image."])
        >>> text = backbone.encode_text(batch.ids, batch.lengths)
        >>> image = backbone.encode_pixels(backbone.image_pixels(Image.new("RGB", (32, 32), "red"), 0))
        >>> text.pooled.shape[0], image.shape[0], round(float(image.norm()), 4)
        (2, 1, 1.0)
    """

    #: The backbone classes of other model families, each registered when its module is imported (the
    #: package imports them all, so this module names none of them): a class whose :meth:`takes_spec` is
    #: true of the model specification is built instead of this one (transformers models), one whose
    #: :meth:`takes_model` is true of the model open_clip loaded takes it over (SigLIP, EVA-CLIP).
    families: ClassVar[list[type[CLIPBackbone]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "takes_spec" in vars(cls) or "takes_model" in vars(cls):
            CLIPBackbone.families.append(cls)

    @staticmethod
    def takes_spec(spec: Any) -> bool:
        """Whether this family's class loads the model specification ``spec`` itself.

        Args:
            spec: what ``CLIPBackbone(model=...)`` was given.

        Returns:
            False here (open_clip loads it); True in a family that loads it (transformers).
        """
        return False

    @staticmethod
    def takes_model(model: Any) -> bool:
        """Whether this family's class encodes with the open_clip ``model`` once loaded (its ``_adopt``
        then finishes the construction).

        Args:
            model: the model open_clip loaded.

        Returns:
            False here; True in a family with its own text tower (open_clip ``CustomTextCLIP``).
        """
        return False

    def _adopt(self, **options: Any) -> None:
        """Finish the construction of a family's backbone that took over the loaded model
        (:meth:`takes_model`), with the constructor's cache and batching options."""
        raise NotImplementedError(f"{type(self).__name__} takes over no loaded model")

    def __new__(cls, *args: Any, **kwargs: Any):
        # A transformers model (a "transformers:" name, a transformers directory, a (model, processor)
        # pair) gets its own backbone class; everything open_clip loads stays here.
        if cls is CLIPBackbone:
            spec = args[0] if args else kwargs.get("model", DEFAULT_CLIP)
            cls = next((f for f in CLIPBackbone.families if f.takes_spec(spec)), cls)
        return super().__new__(cls)

    def __init__(
        self,
        model: str | os.PathLike | Callable[[], tuple] = DEFAULT_CLIP,
        device: str | torch.device = "cpu",
        precision: str | None = None,
        cache_size: int = 512,
        image_batch_size: int = 64,
        trim_text: bool = True,
        text_cache_size: int = 8192,
        text_cache_bytes: int = 256 * 2**20,
        text_tokens_per_pass: int = 8192,
        preprocessing: str = "pil",
    ):
        self.device = checked_device(device)  # a missing GPU is one clear error, not torch's from deep in .to()
        self.model, self.preprocess, self.tokenizer = load_clip(model, self.device, precision)
        family = next((f for f in CLIPBackbone.families if f.takes_model(self.model)), None)
        if type(self) is CLIPBackbone and family is not None:  # SigLIP, EVA-CLIP...: own text tower
            self.__class__ = family
            self._adopt(cache_size=cache_size, image_batch_size=image_batch_size, trim_text=trim_text,
                        text_cache_size=text_cache_size, text_cache_bytes=text_cache_bytes,
                        text_tokens_per_pass=text_tokens_per_pass)
            self.set_preprocessing(preprocessing)
            return
        for attr in ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection"):
            if not hasattr(self.model, attr):
                raise TypeError(
                    f"per-token text embeddings need a CLIP with a built-in text tower; "
                    f"{type(self.model).__name__} has no '{attr}'"
                )
        for attr in ("encode", "sot_token_id", "eot_token_id"):
            if not hasattr(self.tokenizer, attr):
                raise TypeError(f"the tokenizer must be CLIP's BPE tokenizer; it has no '{attr}'")
        self.model.requires_grad_(False)
        self.context_length = int(self.model.positional_embedding.shape[0])
        self.vocab_size = int(self.model.token_embedding.weight.shape[0])
        self.sot_id = int(self.tokenizer.sot_token_id)
        self.eot_id = int(self.tokenizer.eot_token_id)
        self.image_batch_size = image_batch_size
        self.trim_text = trim_text
        self.cache = LRUCache(cache_size)
        self.text_cache = LRUCache(text_cache_size, max_bytes=text_cache_bytes)
        # Text-cache keys carry the model's identity and dtype, so a cache can never serve another model.
        self.model_key = (type(self.model).__name__, id(self.model), str(self.model.token_embedding.weight.dtype))
        self._token_text: dict[int, str] = {}
        self._packable_cache: bool | None = None
        self.text_tokens_per_pass = text_tokens_per_pass
        self.preprocess_workers = max(1, min(4, (os.cpu_count() or 1) // 2))  # 1 on a 2-core machine
        self.set_preprocessing(preprocessing)

    #: ``"pil"`` or ``"device"`` (:meth:`set_preprocessing`).
    preprocessing = "pil"
    _tensor_preprocess: Any = None

    def set_preprocessing(self, preprocessing: str) -> None:
        """Preprocess frames and RGB images with the released PIL transform (``"pil"``) or as tensors on the
        backbone's device (``"device"``: :class:`~capreward.media.device_pixels.TensorPreprocess`, read off
        the transform; other image modes keep the PIL path, which converts them after resizing as released).

        Args:
            preprocessing: ``"pil"`` or ``"device"``.

        Raises:
            ValueError: another value, or a transform the device path does not reproduce.
        """
        if preprocessing not in ("pil", "device"):
            raise ValueError(f"preprocessing must be 'pil' or 'device', got {preprocessing!r}")
        if preprocessing == "device":
            from ..media.device_pixels import TensorPreprocess

            self._tensor_preprocess = TensorPreprocess.from_transform(self.preprocess)
        self.preprocessing = preprocessing

    # ------------------------------------------------------------------ text
    def full_ids(self, caption: str) -> list[int]:
        """SOS + BPE ids + EOS, however long (what :meth:`token_ids` cuts to the context)."""
        if not isinstance(caption, str):
            raise TypeError(f"captions must be str, got {type(caption).__name__}")
        return [self.sot_id, *self.tokenizer.encode(caption), self.eot_id]

    def token_ids(self, caption: str) -> tuple[list[int], bool]:
        """SOS + BPE ids + EOS, cut to the context keeping EOS; and whether it was cut."""
        ids = self.full_ids(caption)
        if len(ids) <= self.context_length:
            return ids, False
        return ids[: self.context_length - 1] + [self.eot_id], True

    def caption_windows(self, caption: str, prefix: str = "") -> list[str]:
        """The windows of ``caption`` that each fit the text context behind ``prefix`` (the metric's
        template), as :func:`capreward.backbones.windows.split_windows` defines them: ``[caption]`` when
        ``prefix + caption`` fits."""
        return split_windows(caption, lambda text: len(self.full_ids(prefix + text)) <= self.context_length)

    def tokenize(self, captions: Sequence[str], pad_to_context: bool | None = None) -> TokenBatch:
        """Token ids padded to the longest caption (or the full context when not trimming)."""
        rows, truncated = zip(*(self.token_ids(c) for c in captions)) if captions else ((), ())
        full = (not self.trim_text) if pad_to_context is None else pad_to_context
        width = self.context_length if full else max((len(r) for r in rows), default=1)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        return TokenBatch(ids=ids, lengths=lengths, truncated=list(truncated))

    def context_rows(self, captions: Sequence[str]) -> list[list[int]]:
        """Each caption as the full padded context row (as ``clip.tokenize`` gives), for idf counting."""
        rows = []
        for c in captions:
            ids, _ = self.token_ids(c)
            rows.append(ids + [0] * (self.context_length - len(ids)))
        return rows

    @strict_fp32_method  # capreward's fp32 is IEEE fp32 on CUDA too (capreward.devices.strict_fp32)
    def _text_tower(self, x: torch.Tensor, lengths: torch.Tensor) -> TextEmbeddings:
        """Run token embeddings ``x`` [N, L, W] through the text tower; normalised per position."""
        m = self.model
        n, width = x.shape[0], x.shape[1]
        cast = m.transformer.get_cast_dtype()
        x = x.to(cast) + m.positional_embedding[:width].to(cast)
        attn_mask = m.attn_mask[:width, :width] if m.attn_mask is not None else None
        x = m.transformer(x, attn_mask=attn_mask)
        x = m.ln_final(x)
        if isinstance(m.text_projection, torch.nn.Linear):
            x = m.text_projection(x)
        else:
            x = x @ m.text_projection
        x = F.normalize(x.float(), dim=-1)
        positions = torch.arange(width, device=x.device)
        mask = positions[None, :] < lengths.to(x.device)[:, None]
        tokens = x * mask[..., None]
        pooled = x[torch.arange(n, device=x.device), lengths.to(x.device) - 1]
        return TextEmbeddings(tokens=tokens, pooled=pooled, mask=mask)

    def encode_text(self, ids: torch.Tensor, lengths: torch.Tensor) -> TextEmbeddings:
        """Embeddings of every position SOS..EOS (ln_final, then projection) and of EOS (pooled).

        Args:
            ids: token ids [N, L] (:meth:`tokenize`'s ``ids``).
            lengths: tokens per caption [N], SOS and EOS included.

        Returns:
            :class:`TextEmbeddings`: ``tokens`` [N, L, D] (L2-normalised; zero at padding), ``pooled``
            [N, D] and ``mask`` [N, L].
        """
        ids = ids.to(self.device)
        return self._text_tower(self.model.token_embedding(ids), lengths)

    def encode_text_soft(self, probs: torch.Tensor, lengths: torch.Tensor) -> TextEmbeddings:
        """Like :meth:`encode_text` for soft captions: ``probs`` [N, L, V] are distributions over the
        vocabulary at each position (SOS..EOS, then padding); the input embedding of a position is the
        probability-weighted mix of token embeddings, so gradients flow to ``probs``."""
        if probs.ndim != 3 or probs.shape[-1] != self.vocab_size:
            raise ValueError(f"soft captions must have shape (N, L, {self.vocab_size}), got {tuple(probs.shape)}")
        weight = self.model.token_embedding.weight
        x = probs.to(device=self.device, dtype=weight.dtype) @ weight
        return self._text_tower(x, lengths)

    def embed_rows(
        self, rows: Sequence[tuple[int, ...]], batch_size: int = 64, dedup: bool = True
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(tokens [L, D], pooled [D])`` for each row of token ids (SOS..EOS, as :meth:`token_ids` gives),
        in input order, L2-normalised, fp32, without gradients.

        Rows found in the text cache are not re-encoded; with ``dedup`` each distinct row of the rest is
        encoded once, in passes of at most ``batch_size`` rows: packed without padding
        (:meth:`_text_tower_packed`) for open_clip's standard text tower, else padded batches planned by
        :func:`plan_text_batches`. Exact under CLIP's causal mask: a row's embedding does not depend on
        the other rows of its pass beyond floating-point rounding.
        """
        out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(rows)
        todo: dict[Hashable, list[int]] = {}
        for i, row in enumerate(rows):
            hit = self.text_cache.get((self.model_key, row))
            if hit is not None:
                out[i] = hit
            else:
                todo.setdefault(row if dedup else i, []).append(i)
        slots = sorted(todo, key=lambda slot: len(rows[todo[slot][0]]))
        lengths = [len(rows[todo[slot][0]]) for slot in slots]
        packed = self.trim_text and self._packable()
        if packed:
            batches = plan_packed_passes(lengths, batch_size, self.text_tokens_per_pass)
        else:
            batches = plan_text_batches([self.context_length] * len(slots) if not self.trim_text else lengths, batch_size)
        for batch in batches:
            members = [slots[k] for k in batch]
            member_rows = [rows[todo[slot][0]] for slot in members]
            with torch.no_grad():
                if packed:
                    entries = self._text_tower_packed(member_rows)
                else:
                    entries = self._encode_padded(member_rows)
            for slot, row, entry in zip(members, member_rows, entries):
                self.text_cache.put((self.model_key, row), entry, cost=4 * (len(row) + 1) * entry[1].numel() + 64 * len(row))
                for i in todo[slot]:
                    out[i] = entry
        return out  # type: ignore[return-value]

    def _encode_padded(self, rows: list[tuple[int, ...]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Rows padded to the longest (or to the context when not trimming) through :meth:`_text_tower`."""
        width = max(len(r) for r in rows) if self.trim_text else self.context_length
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for j, row in enumerate(rows):
            ids[j, : len(row)] = torch.tensor(row, dtype=torch.long)
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        emb = self.encode_text(ids, lens)
        return [(emb.tokens[j, : len(r)].clone(), emb.pooled[j].clone()) for j, r in enumerate(rows)]

    def _packable(self) -> bool:
        """Whether the text tower is open_clip's standard pre-norm block stack, which
        :meth:`_text_tower_packed` re-implements."""
        if self._packable_cache is None:
            blocks: Any = getattr(self.model.transformer, "resblocks", None)
            self._packable_cache = bool(blocks) and all(
                type(b).__name__ == "ResidualAttentionBlock"
                and type(b).__module__.startswith("open_clip")
                and not hasattr(b, "ln_1_kv")
                and isinstance(b.attn, torch.nn.MultiheadAttention)
                and b.attn._qkv_same_embed_dim
                and b.attn.in_proj_bias is not None
                and b.attn.bias_k is None
                for b in blocks
            )
        return self._packable_cache

    @strict_fp32_method
    def _text_tower_packed(self, rows: list[tuple[int, ...]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The text tower on rows of token ids packed without padding: every linear layer runs on the
        [total tokens, width] matrix of all rows (large matmuls, no padded work), only attention is done per
        row (padded to the longest, causal, so padding is never attended). Mathematically identical to
        :meth:`_text_tower`. Returns ``(tokens [L, D], pooled [D])`` per row, L2-normalised, fp32."""
        m = self.model
        dev = self.device
        sizes = [len(r) for r in rows]
        lengths = torch.tensor(sizes, dtype=torch.long)
        n, longest = len(rows), max(sizes)
        # Every index is computed on the host from the row lengths and copied once: boolean-mask indexing
        # on the device (``padded[real] = qkv``) would make the host wait for a nonzero count twice per layer.
        positions = torch.cat([torch.arange(k) for k in sizes])  # [T]
        slot = torch.repeat_interleave(torch.arange(n) * longest, lengths) + positions  # [T] in [n * longest]
        ends = torch.cumsum(lengths, 0) - 1  # [n]: each row's EOS in the packed rows
        flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
        flat, positions, slot, ends = (host_to_device(t, dev) for t in (flat, positions, slot, ends))
        cast = m.transformer.get_cast_dtype()
        x = m.token_embedding(flat).to(cast) + m.positional_embedding[positions].to(cast)  # [T, W]
        causal = m.attn_mask is not None
        key_mask = None
        if not causal:
            real = torch.arange(longest)[None, :] < lengths[:, None]  # [n, longest]
            key_mask = host_to_device(real, dev)[:, None, None, :]
        for block in m.transformer.resblocks:
            attn = block.attn
            heads, width = attn.num_heads, x.shape[-1]
            qkv = F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias)  # [T, 3W]
            padded = qkv.new_zeros(n * longest, 3 * width).index_copy_(0, slot, qkv)
            q, k, v = padded.view(n, longest, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=causal)
            a = a.transpose(1, 2).reshape(n * longest, width).index_select(0, slot)
            x = x + block.ls_1(attn.out_proj(a))
            x = x + block.ls_2(block.mlp(block.ln_2(x)))
        x = m.ln_final(x)
        x = m.text_projection(x) if isinstance(m.text_projection, torch.nn.Linear) else x @ m.text_projection
        x = F.normalize(x.float(), dim=-1)
        # One fresh tensor per pass, no per-row copies (hundreds of tiny kernels on a GPU): each row's tokens
        # are a view of the pass's packed rows (no padding in it, so nothing but the rows is held), each
        # pooled embedding a row of one gathered [n, D] tensor.
        return list(zip(torch.split(x, sizes), x.index_select(0, ends).unbind(0)))

    def decode_token(self, token_id: int) -> str:
        """The text of one BPE token, e.g. ``'dog'``; special tokens as ``<sos>``/``<eos>``."""
        if token_id == self.sot_id:
            return "<sos>"
        if token_id == self.eot_id:
            return "<eos>"
        token_id = int(token_id)
        if token_id not in self._token_text:
            self._token_text[token_id] = self.tokenizer.decode([token_id]).strip()
        return self._token_text[token_id]

    # ---------------------------------------------------------------- images
    @strict_fp32_method
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image embeddings of preprocessed pixels.

        Args:
            pixels: [n, 3, H, W], as :meth:`image_pixels` gives them.

        Returns:
            L2-normalised embeddings [n, D], fp32.
        """
        outs = []
        dtype = pixel_dtype(self.model.visual)
        for start in range(0, pixels.shape[0], self.image_batch_size):
            # pinned and non-blocking on CUDA (the host goes on preprocessing); cast on the device
            chunk = host_to_device(pixels[start : start + self.image_batch_size], self.device).to(dtype)
            outs.append(F.normalize(self.model.encode_image(chunk).float(), dim=-1))
        return torch.cat(outs)

    def pixels_of(self, frames: np.ndarray) -> torch.Tensor:
        """CLIP preprocessing (resize, centre crop, normalise) of uint8 frames (k, H, W, 3); the frames are
        shared among ``preprocess_workers`` threads (same pixels as one by one). With
        ``preprocessing="device"``: as tensors on the backbone's device."""
        if self.preprocessing == "device":
            return self._tensor_preprocess(frames, self.device)
        images = frames_to_pil(frames)
        if self.preprocess_workers > 1 and len(images) > 1 and not _in_preprocess_pool():
            return torch.stack(list(preprocess_pool(self.preprocess_workers).map(self.preprocess, images)))
        return torch.stack([self.preprocess(im) for im in images])

    def image_pixels(self, item: Any, index: int) -> torch.Tensor:
        """CLIP preprocessing of one image, [1, 3, H, W], in the released order: the image keeps its
        mode (RGBA, palette, CMYK...) through resize and centre crop, and open_clip's transform converts
        it to RGB after them, as OpenAI CLIP's, clipscore's, PAC-S's and EMScore's code does. Only modes
        PIL converts wrongly (16-bit, float) are fixed first (:func:`capreward.media.viewable`)."""
        image = load_image(item, index=index, keep_mode=True)
        if image.mode == "RGB":
            if self.preprocessing == "device":
                return self._tensor_preprocess(np.asarray(image)[None], self.device)
            return self.preprocess(image)[None]
        try:
            pixels = self.preprocess(image)
        except Exception:  # a custom transform that does not convert modes itself
            pixels = None
        if pixels is None or pixels.ndim != 3 or pixels.shape[0] != 3:
            pixels = self.preprocess(to_rgb(image, describe(item, index)))
        return pixels[None]

    @property
    def input_pixels(self) -> int:
        """Pixels of one encoder input (the preprocessed height x width, e.g. 224 x 224), measured once
        on the transform itself so that any ``preprocess`` is right."""
        if getattr(self, "_input_pixels", None) is None:
            from PIL import Image

            probe = self.preprocess(Image.new("RGB", (64, 48)))
            self._input_pixels = int(probe.shape[-1] * probe.shape[-2])
        return self._input_pixels

    def check_frame_budget(self, count: int, name: str) -> None:
        """MediaError naming the item when ``count`` frames of this encoder's input size are over the
        frame budget ``max_model_pixels`` (:mod:`capreward.media.limits`)."""
        budget = get_media_limits().max_model_pixels
        cost = count * self.input_pixels
        if cost > budget:
            raise MediaError(
                name,
                f"{count:,} frames at the encoder's input of {self.input_pixels:,} pixels are {cost:,} pixels, over "
                f"the frame budget of {budget:,} (max_model_pixels; sample fewer frames or raise the limit)",
            )

    def visual_embeddings(
        self,
        items: Sequence[Any],
        kind: str = "video",
        frames: int | None = 10,
        ids: Sequence[str | None] | None = None,
    ) -> list[torch.Tensor]:
        """Frame embeddings [k, D] for each visual item (an image is a one-frame video).

        Each distinct item is decoded and encoded once per call, and kept in the LRU cache keyed by
        its content key (file identity or pixel hash, :func:`~capreward.media.keys.content_key`),
        narrowed by its explicit id when ``ids`` gives one (an id alone never serves an embedding),
        together with ``kind`` and ``frames``. A video's frame count is checked against the frame budget
        (:meth:`check_frame_budget`) before any frame is decoded; its frames are then decoded,
        preprocessed and encoded a chunk of ``image_batch_size`` at a time (images of the call share the
        same passes), so that memory holds one chunk of pixels and the embeddings, whatever the number
        of frames. Raises :class:`~capreward.media.MediaError` naming the first unusable item.
        """
        if kind not in ("video", "image"):
            raise ValueError(f"kind must be 'video' or 'image', got {kind!r}")
        if ids is not None and len(ids) != len(items):
            raise ValueError(f"got {len(ids)} ids for {len(items)} {kind}s")
        results: list[torch.Tensor | None] = [None] * len(items)
        pending: dict[Any, list[int]] = {}
        queue = _EncodeQueue(self.encode_pixels, self.image_batch_size, pin=self.device.type == "cuda")
        # with several preprocess_workers, images are loaded and preprocessed, and video frames preprocessed, in
        # the pool while this thread decodes the next ones and the encoder runs (the queue waits for each in
        # order when it encodes, so the first unusable item is still the one reported)
        threads = self.preprocess_workers > 1 and self.preprocessing == "pil" and not _in_preprocess_pool()
        pool = preprocess_pool(self.preprocess_workers) if threads else None
        # A GRPO group repeats the same object many times; hash its pixels once per call, not per sample.
        key_of_object: dict[int, str | None] = {}
        for i, item in enumerate(items):
            if id(item) not in key_of_object:
                key_of_object[id(item)] = content_key(item)
            base = with_id(key_of_object[id(item)], None if ids is None else ids[i])
            key = None if base is None else (kind, frames if kind == "video" else None, base)
            if key is not None and key in pending:
                pending[key].append(i)
                continue
            cached = self.cache.get(key)
            if cached is not None:
                results[i] = cached
                continue
            pending_key = key if key is not None else ("uncached", i)
            pending[pending_key] = [i]
            # only CLIP-sized pixels are queued, a chunk at a time, never the decoded full-size frames
            if kind == "video":
                with open_video(item, frames=frames, index=i) as video:
                    self.check_frame_budget(video.count, video.name)
                    for chunk in video.chunks(self.image_batch_size):
                        if pool is None:
                            queue.add(pending_key, self.pixels_of(chunk))
                        else:  # PIL copies the frames here: the decoder may reuse its buffer for the next chunk
                            frames_ahead = [pool.submit(self.preprocess, im) for im in frames_to_pil(chunk)]
                            queue.add(pending_key, frames_ahead, count=len(frames_ahead))
            elif pool is not None:
                queue.add(pending_key, pool.submit(self.image_pixels, item, i), count=1)
            else:
                queue.add(pending_key, self.image_pixels(item, i))
        for done, chunk in queue.finish().items():
            if cast(tuple, done)[0] != "uncached":
                self.cache.put(done, chunk)
            for i in pending[done]:
                results[i] = chunk
        return results


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_POOL_THREAD_PREFIX = "capreward-preprocess"


def preprocess_pool(workers: int) -> ThreadPoolExecutor:
    """The process's thread pool of ``workers`` threads for CLIP preprocessing (one per process id: a
    forked child gets its own, never its parent's threads)."""
    key = (os.getpid(), int(workers))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(int(workers), thread_name_prefix=_POOL_THREAD_PREFIX)
        return pool


def _in_preprocess_pool() -> bool:
    """Whether this thread is one of the pool's (work submitted from there must not wait on the pool)."""
    return threading.current_thread().name.startswith(_POOL_THREAD_PREFIX)


class _EncodeQueue:
    """Preprocessed pixels of several items (tensors, or futures of the preprocessing pool resolved in
    order when encoded), encoded as soon as ``batch`` frames are waiting (and at :meth:`finish`), so that
    at most about two batches of pixels are held; the embeddings are gathered per item. With ``pin`` the
    pixels of a batch are gathered in pinned memory (a GPU copies them without blocking the host)."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], batch: int, pin: bool = False):
        self.encode, self.batch, self.pin = encode, max(1, int(batch)), pin
        self.waiting: list[tuple[Hashable, torch.Tensor | Future | list[Future]]] = []
        self.count = 0
        self.parts: dict[Hashable, list[torch.Tensor]] = {}

    def add(self, key: Hashable, pixels: torch.Tensor | Future | list[Future], count: int | None = None) -> None:
        """Queue ``pixels`` [k, 3, H, W] of item ``key``: a tensor, a future of one, or a list of futures of
        single frames [3, H, W] (a future needs its frame ``count``)."""
        self.parts.setdefault(key, [])
        self.waiting.append((key, pixels))
        self.count += cast(torch.Tensor, pixels).shape[0] if count is None else count
        if self.count >= self.batch:
            self._flush()

    def _flush(self) -> None:
        if not self.waiting:
            return
        keys = [k for k, _ in self.waiting]
        ready = [p.result() if isinstance(p, Future) else torch.stack([f.result() for f in p]) if isinstance(p, list)
                 else p for _, p in self.waiting]
        counts = [p.shape[0] for p in ready]
        if self.pin and all(p.shape[1:] == ready[0].shape[1:] and p.device.type == "cpu" for p in ready):
            out = torch.empty((sum(counts), *ready[0].shape[1:]), dtype=ready[0].dtype, pin_memory=True)
            pixels = torch.cat(ready, out=out)
        else:
            pixels = torch.cat(ready)
        del ready
        self.waiting, self.count = [], 0
        # no_grad rather than inference_mode: cached frames may later meet tensors that need grad
        with torch.no_grad():
            embeds = self.encode(pixels)
        del pixels
        for key, part in zip(keys, torch.split(embeds, counts)):
            self.parts[key].append(part)

    def finish(self) -> dict[Hashable, torch.Tensor]:
        """Every item's embeddings [k, D], in the order the items were added."""
        self._flush()
        return {k: (parts[0].clone() if len(parts) == 1 else torch.cat(parts)) for k, parts in self.parts.items()}


def pixel_dtype(visual: torch.nn.Module) -> torch.dtype:
    """The dtype an image tower's input must have: that of its first convolution or linear layer (its
    patch embedding). open_clip's mixed ``precision="bf16"``/``"fp16"`` keeps the class and position
    embeddings in fp32 while the layers are bf16/fp16, so the first parameter's dtype is the wrong one."""
    for module in visual.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            return module.weight.dtype
    return next(visual.parameters()).dtype


@dataclass
class CaptionEmbeddings:
    """Embeddings of a list of captions, in input order."""

    tokens: list[torch.Tensor]  # [L_i, D] per caption, SOS..EOS of each window, L2-normalised
    ids: list[torch.Tensor]  # LongTensor [L_i] per caption (its windows' rows, concatenated)
    pooled: torch.Tensor  # [N, D]
    truncated: list[bool]  # cut to the context (only with long_captions="truncate")
    windows: list[int] | None = None  # windows per caption (1: the caption fits the context)


def embed_captions(
    backbone: CLIPBackbone,
    captions: Sequence[str],
    batch_size: int = 64,
    dedup: bool = True,
    prefix: str = "",
    long_captions: str = "windows",
) -> CaptionEmbeddings:
    """Embeddings of ``prefix + caption`` for each of ``captions``, in input order: each distinct caption
    tokenised once, then :meth:`CLIPBackbone.embed_rows` (text cache, length-planned batches, each
    distinct row encoded once with ``dedup``).

    ``long_captions="windows"`` (default): a caption whose ``prefix + caption`` is over the text context
    is split into windows (:meth:`CLIPBackbone.caption_windows`), each encoded as ``prefix + window`` and
    combined by :func:`~capreward.backbones.windows.combine_windows` (union of token embeddings,
    length-weighted pooled mean); a caption that fits is one row, as before. ``"truncate"``: the released
    behaviour, ``prefix + caption`` cut to the context keeping EOS (``truncated`` says which)."""
    check_long_captions(long_captions)
    if not captions:
        raise ValueError("no captions to encode")
    plans: dict[Hashable, tuple[list[tuple[int, ...]], list[int], bool]] = {}
    keys = [caption if dedup else i for i, caption in enumerate(captions)]
    prefix_len = len(backbone.full_ids(prefix)) if long_captions == "windows" else 0
    for key, caption in zip(keys, captions):
        if key in plans:
            continue
        if long_captions == "truncate":
            row, cut = backbone.token_ids(prefix + caption)
            plans[key] = ([tuple(row)], [len(row)], cut)
            continue
        full = backbone.full_ids(prefix + caption)
        if len(full) <= backbone.context_length:
            plans[key] = ([tuple(full)], [len(full)], False)
            continue
        rows = [tuple(backbone.full_ids(prefix + w)) for w in backbone.caption_windows(caption, prefix)]
        plans[key] = (rows, [len(r) - prefix_len for r in rows], False)
    flat = [row for key in plans for row in plans[key][0]]
    embedded = iter(backbone.embed_rows(flat, batch_size, dedup=dedup))
    combined: dict[Hashable, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for plan_key, (rows, counts, _) in plans.items():
        parts = [next(embedded) for _ in rows]
        tokens, pooled = combine_windows([t for t, _ in parts], [p for _, p in parts], counts)
        combined[plan_key] = (tokens, pooled, torch.tensor([t for row in rows for t in row], dtype=torch.long))
    return CaptionEmbeddings(
        tokens=[combined[k][0] for k in keys],
        ids=[combined[k][2] for k in keys],
        pooled=torch.stack([combined[k][1] for k in keys]),
        truncated=[plans[k][2] for k in keys],
        windows=[len(plans[k][0]) for k in keys],
    )


def plan_packed_passes(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Consecutive positions of ``lengths`` grouped into passes of at most ``max_rows`` rows and (unless a
    single row is longer) ``max_tokens`` tokens."""
    passes: list[list[int]] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if not passes or len(passes[-1]) >= max_rows or tokens + n > max_tokens:
            passes.append([])
            tokens = 0
        passes[-1].append(i)
        tokens += n
    return passes


# A text-tower call costs about this many caption tokens of work beyond its tokens (dispatch, small
# matmuls); the planner weighs it against padding.
TEXT_BATCH_OVERHEAD_TOKENS = 32


def plan_text_batches(
    lengths: Sequence[int], max_batch: int, overhead_tokens: int = TEXT_BATCH_OVERHEAD_TOKENS
) -> list[list[int]]:
    """Split rows sorted by ascending length into contiguous batches of at most ``max_batch`` rows,
    minimising the padded tokens (each batch padded to its longest row) plus ``overhead_tokens`` per
    batch. Returns the batches as lists of positions in ``lengths``."""
    if max_batch < 1:
        raise ValueError(f"batch size must be >= 1, got {max_batch}")
    if any(b < a for a, b in zip(lengths, lengths[1:])):
        raise ValueError("lengths must be sorted in ascending order")
    n = len(lengths)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(max(0, end - max_batch), end):
            cost = best[start] + (end - start) * lengths[end - 1] + overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    batches = []
    end = n
    while end > 0:
        batches.append(list(range(cut[end], end)))
        end = cut[end]
    return batches[::-1]
