"""open_clip's ``CustomTextCLIP`` (SigLIP, SigLIP2, EVA-CLIP and the other ``custom_text`` configs) as a
backbone: its own text tower (``model.text``, an open_clip ``TextTransformer``), its own tokenizer
(open_clip's ``HFTokenizer`` with its text cleaning, or CLIP's BPE ``SimpleTokenizer``) and context.

``CLIPBackbone("ViT-B-16-SigLIP/webli")`` (or any open_clip specification whose model is a
``CustomTextCLIP``) becomes a :class:`CustomTextBackbone`. The text tower runs as ``encode_text`` runs
it: rows padded as the tokenizer pads them (to the full context unless the tower is causal without a
padding mask or class token, where padding cannot change a row), the tower's own pooling
(``argmax``/``eos``/``last``/``first``, or the appended class token) for the caption embedding, and
``ln_final`` then the projection at every caption position for EMScore's token embeddings. For a
non-causal tower (SigLIP) see :mod:`capreward.backbones.towers` for what the token embeddings mean.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .towers import TowerBackbone


def is_custom_text_clip(model: Any) -> bool:
    """Whether ``model`` keeps its text tower in ``model.text`` (open_clip ``CustomTextCLIP``) rather
    than on the model itself (open_clip ``CLIP``)."""
    return not hasattr(model, "token_embedding") and hasattr(getattr(model, "text", None), "transformer")


class CustomTextBackbone(TowerBackbone):
    """A :class:`~capreward.backbones.CLIPBackbone` on an open_clip ``CustomTextCLIP``; built by
    ``CLIPBackbone(spec)`` when the loaded model is one (see the module doc).

    Examples:
        >>> from capreward.backbones import CLIPBackbone
        >>> from capreward.testing.tiny_custom_clip import tiny_custom_clip_factory
        >>> backbone = CLIPBackbone(tiny_custom_clip_factory("siglip"))
        >>> type(backbone).__name__, backbone.context_length, backbone.causal
        ('CustomTextBackbone', 64, False)
    """

    takes_model = staticmethod(is_custom_text_clip)

    def _adopt(self, **kwargs: Any) -> None:
        """Finish construction once ``model``, ``preprocess``, ``tokenizer`` and ``device`` are set."""
        text = self.model.text
        for attr in ("token_embedding", "positional_embedding", "transformer", "ln_final"):
            if not hasattr(text, attr):
                raise TypeError(f"per-token text embeddings need open_clip's TextTransformer; "
                                f"{type(text).__name__} has no '{attr}'")
        if getattr(self.tokenizer, "tokenizer_mode", "") == "clips":
            raise TypeError("open_clip's 'clips' tokenizer mode is not supported")
        self.model.requires_grad_(False)
        self.text = text
        self.hf = getattr(self.tokenizer, "tokenizer", None) if hasattr(self.tokenizer, "clean_fn") else None
        if self.hf is None and not all(hasattr(self.tokenizer, a) for a in ("encode", "sot_token_id", "eot_token_id")):
            raise TypeError("the tokenizer must be open_clip's HFTokenizer or CLIP's BPE SimpleTokenizer")
        self.causal = text.attn_mask is not None and text.cls_emb is None and not getattr(text, "use_pad_mask", False)
        if self.hf is not None:
            probe = self.hf("a", add_special_tokens=True)["input_ids"]
            bos = self.hf.bos_token_id if self.hf.bos_token_id is not None else self.hf.cls_token_id
            sot = bos if bos is not None and probe and probe[0] == bos else None
            eot = self.hf.eos_token_id if self.hf.eos_token_id is not None else self.hf.sep_token_id
            self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else 0
        else:
            sot, eot, self.pad_id = self.tokenizer.sot_token_id, self.tokenizer.eot_token_id, 0
        weight = text.token_embedding.weight
        self._setup(
            context_length=int(text.positional_embedding.shape[0]) - (1 if text.cls_emb is not None else 0),
            vocab_size=int(weight.shape[0]), sot_id=sot, eot_id=int(eot),
            key=(type(self.model).__name__, id(self.model), str(weight.dtype)), **kwargs,
        )

    # ------------------------------------------------------------------ text
    def full_ids(self, caption: str) -> list[int]:
        """The tokenizer's ids with its special tokens, uncut (``HFTokenizer``: after its text cleaning;
        a caption's text never becomes a special token)."""
        if not isinstance(caption, str):
            raise TypeError(f"captions must be str, got {type(caption).__name__}")
        if self.hf is None:
            return [self.sot_id, *self.tokenizer.encode(caption), self.eot_id]
        cleaned = self.tokenizer.clean_fn(caption)
        return list(self.hf(cleaned, add_special_tokens=True, split_special_tokens=True)["input_ids"])

    def _pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows) if self.causal else self.context_length
        if self.hf is not None:
            batch = self.hf.pad({"input_ids": [list(r) for r in rows]}, padding="max_length", max_length=width,
                                return_attention_mask=True, return_tensors="pt")
            return batch["input_ids"], batch["attention_mask"].bool()
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        real = torch.zeros(len(rows), width, dtype=torch.bool)
        for j, row in enumerate(rows):
            ids[j, : len(row)] = torch.tensor(row, dtype=torch.long)
            real[j, : len(row)] = True
        return ids, real

    def encode_rows(self, rows: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from open_clip.transformer import text_global_pool

        t = self.text
        ids, real = self._pad(rows)
        ids, real = ids.to(self.device), real.to(self.device)
        with torch.no_grad():
            x, attn_mask = t._embeds(ids)
            if attn_mask is not None and attn_mask.dim() == 2:  # the causal mask, built for the full context
                attn_mask = attn_mask[: x.shape[1], : x.shape[1]]
            x = t.transformer(x, attn_mask=attn_mask)
            if t.cls_emb is not None:  # an appended class token is the caption embedding
                pooled, tokens = t.ln_final(x[:, -1]), t.ln_final(x[:, :-1])
            else:
                tokens = t.ln_final(x)
                pooled = text_global_pool(tokens, ids, pool_type=t.pool_type, eos_token_id=getattr(t, "eos_id", None))
            proj = t.text_projection
            if proj is not None:
                tokens, pooled = (proj(tokens), proj(pooled)) if isinstance(proj, torch.nn.Linear) else (tokens @ proj, pooled @ proj)
        tokens, pooled = F.normalize(tokens.float(), dim=-1), F.normalize(pooled.float(), dim=-1)
        return [(tokens[j][real[j]].clone(), pooled[j].clone()) for j in range(len(rows))]

    def decode_token(self, token_id: int) -> str:
        if self.hf is None:
            return super().decode_token(token_id)
        return self._decode_with(self.hf, token_id)
