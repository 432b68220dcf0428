"""A tiny encoder-decoder image captioner built locally and deterministically (no downloads).

It has the architecture of the classic "ViT encoder + GPT-2 decoder" captioners that people fine-tune
with self-critical training (``VisionEncoderDecoderModel``, as ``nlpconnect/vit-gpt2-image-captioning``)
at a toy width, with a word-level tokenizer built in memory. Every word of the default vocabulary is a
single token of CLIP's BPE vocabulary, so the captioner's vocabulary maps onto CLIP's token by token
(:class:`capreward.training.VocabularyBridge`) and the differentiable reward path can be tested on it.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

#: Words of the default vocabulary: the colour words and caption templates of
#: :mod:`capreward.testing.trained_clip` plus a few colour-free fillers.
CAPTION_WORDS: tuple[str, ...] = (
    "a", "an", "the", "image", "picture", "photo", "of", "is", "colour", "this", "shows", "something",
    "red", "green", "blue", "yellow", "purple", "orange",
)


def build_word_tokenizer(words: Sequence[str] = CAPTION_WORDS) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` built in memory: ids 0-3 are ``<pad>``, ``<s>``, ``</s>``,
    ``<unk>``, then ``words`` in order. Lower-cases, splits on whitespace and punctuation; decoding joins
    words with single spaces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD_TOKEN, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN,
        model_max_length=64,
    )


def build_tiny_captioner(
    seed: int = 0,
    words: Sequence[str] = CAPTION_WORDS,
    *,
    image_size: int = 32,
    width: int = 64,
    decoder_layers: int = 2,
    max_positions: int = 32,
) -> tuple[Any, Any, Any]:
    """Return ``(model, image_processor, tokenizer)``: a ``VisionEncoderDecoderModel`` (ViT encoder of one
    layer, GPT-2 decoder with cross-attention) with seeded random weights, a ``ViTImageProcessor`` that
    resizes to ``image_size`` and the word tokenizer of :func:`build_word_tokenizer`. The model is in
    train mode with dropout disabled, so sampling and log-probabilities are deterministic given a seed."""
    from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTImageProcessor, ViTModel, VisionEncoderDecoderModel

    tokenizer = build_word_tokenizer(words)
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        encoder = ViTModel(
            ViTConfig(
                image_size=image_size, patch_size=8, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=2 * width, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            ),
        )  # with its (unused) pooler, as from_pretrained rebuilds it, so saving and loading round-trip
        decoder = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tokenizer), n_positions=max_positions, n_embd=width, n_layer=decoder_layers, n_head=2,
                add_cross_attention=True, is_decoder=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
        model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = tokenizer.bos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.max_length = None
    processor = ViTImageProcessor(
        do_resize=True, size={"height": image_size, "width": image_size}, do_normalize=True,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    return model, processor, tokenizer
