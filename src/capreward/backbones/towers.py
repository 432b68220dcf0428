"""The common ground of CLIP-family backbones whose towers are not open_clip's standard ``CLIP``.

:class:`TowerBackbone` is a :class:`~capreward.backbones.CLIPBackbone` (same caches, same visual
pipeline, same :meth:`embed_rows` planning, same caption windows) that encodes token rows through a
family's own text tower (:meth:`encode_rows`) and images through its own image tower
(:meth:`encode_pixels`). Subclasses: :class:`~capreward.backbones.hf_clip.TransformersBackbone`
(transformers ``CLIPModel``, ``SiglipModel``, ``Siglip2Model``) and
:class:`~capreward.backbones.open_clip_text.CustomTextBackbone` (open_clip ``CustomTextCLIP``: SigLIP,
EVA-CLIP).

Token embeddings of a non-causal text tower (SigLIP): every position attends to the whole caption
(and, as the model was trained, to the padding up to its fixed context), so a token's embedding
depends on the words after it too, unlike CLIP's causal tower where it depends only on the words
before it. The caption embedding is the tower's own pooled output (SigLIP: the last position of the
padded context through the head), which is not any caption token's embedding; EMScore's token
embeddings are the head (projection) applied to every caption position SOS..EOS (SigLIP has no SOS:
its tokens and EOS), as CLIP's are ``ln_final`` then the projection.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Sequence

import torch

from .cache import LRUCache
from .clip import CLIPBackbone, TextEmbeddings


class TowerBackbone(CLIPBackbone):
    """Base of the backbones with their own towers: subclasses load the model, call :meth:`_setup` and
    implement :meth:`full_ids`, :meth:`token_ids`, :meth:`encode_rows` and :meth:`encode_pixels`.

    ``causal``: whether the text tower is causal (then rows are padded to the longest of a pass and a
    row's embeddings do not depend on its padding); a non-causal tower always runs at its full context.
    """

    causal: bool = True

    def _setup(
        self,
        *,
        context_length: int,
        vocab_size: int,
        sot_id: int | None,
        eot_id: int,
        key: tuple,
        cache_size: int,
        image_batch_size: int,
        trim_text: bool,
        text_cache_size: int,
        text_cache_bytes: int,
        text_tokens_per_pass: int,
    ) -> None:
        self.context_length = int(context_length)
        self.vocab_size = int(vocab_size)
        self.sot_id = -1 if sot_id is None else int(sot_id)  # -1: the tokenizer adds no start token
        self.eot_id = int(eot_id)
        self.image_batch_size = image_batch_size
        self.trim_text = trim_text and self.causal  # a non-causal tower reads its padding: never trimmed
        self.cache = LRUCache(cache_size)
        self.text_cache = LRUCache(text_cache_size, max_bytes=text_cache_bytes)
        self.model_key = key
        self._token_text: dict[int, str] = {}
        self._packable_cache = False
        self.text_tokens_per_pass = text_tokens_per_pass
        self.preprocess_workers = max(1, min(4, (os.cpu_count() or 1) // 2))  # as CLIPBackbone

    # ------------------------------------------------------------------ text
    def encode_rows(self, rows: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(tokens [L, D], pooled [D])`` per row of token ids (as :meth:`token_ids` gives), L2-normalised,
        fp32: the text tower on the rows padded as the model's own processor pads them."""
        raise NotImplementedError

    def _packable(self) -> bool:
        return False

    def _decode_with(self, tokenizer: Any, token_id: int) -> str:
        """The readable text of one token of a Hugging Face ``tokenizer`` ("<sos>"/"<eos>" for the start and
        end tokens; SentencePiece's word marker read as a space), memoised per backbone."""
        token_id = int(token_id)
        if token_id == self.sot_id:
            return "<sos>"
        if token_id == self.eot_id:
            return "<eos>"
        if token_id not in self._token_text:
            self._token_text[token_id] = tokenizer.decode([token_id]).replace("\u2581", " ").strip()
        return self._token_text[token_id]

    def _encode_padded(self, rows: list[tuple[int, ...]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.encode_rows(rows)

    def encode_text(self, ids: torch.Tensor, lengths: torch.Tensor) -> TextEmbeddings:
        """As :meth:`CLIPBackbone.encode_text`: rows ``ids[i, :lengths[i]]`` through :meth:`encode_rows`."""
        rows = [tuple(ids[i, : int(n)].tolist()) for i, n in enumerate(lengths)]
        out = self.encode_rows(rows)
        width = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), width, out[0][1].shape[-1], device=out[0][1].device)
        mask = torch.zeros(len(rows), width, dtype=torch.bool, device=tokens.device)
        for i, (t, _) in enumerate(out):
            tokens[i, : t.shape[0]] = t
            mask[i, : t.shape[0]] = True
        return TextEmbeddings(tokens=tokens, pooled=torch.stack([p for _, p in out]), mask=mask)

    def encode_text_soft(self, probs: torch.Tensor, lengths: torch.Tensor) -> TextEmbeddings:
        raise TypeError(f"soft captions need an open_clip CLIP; {type(self).__name__} encodes token ids only")

    def token_ids(self, caption: str) -> tuple[list[int], bool]:
        """The caption's ids with the tokenizer's special tokens, cut to the context keeping the end
        token; and whether it was cut."""
        ids = self.full_ids(caption)
        if len(ids) <= self.context_length:
            return ids, False
        if ids[-1] == self.eot_id:
            return ids[: self.context_length - 1] + [self.eot_id], True
        return ids[: self.context_length], True
