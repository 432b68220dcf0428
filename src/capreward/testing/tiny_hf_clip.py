"""Tiny transformers CLIP-family models built offline (config-built, seeded random weights), each with
its model's own processor classes, for tests of :mod:`capreward.backbones.hf_clip`.

- ``"clip"``: ``CLIPModel`` with the real 49,408-token CLIP BPE vocabulary (``CLIPTokenizer`` built from
  the vocabulary file open_clip ships, so nothing is downloaded), 77 positions, ``CLIPImageProcessor``.
- ``"siglip"``: ``SiglipModel`` (non-causal text tower, 64 positions) with ``SiglipImageProcessor`` and a
  SigLIP-style tokenizer built in memory (lower-casing, tokens then ``</s>``, padded with ``</s>``,
  no attention mask: the ``SiglipTokenizer`` conventions; ``SiglipTokenizer`` itself needs sentencepiece).
- ``"siglip2"``: ``Siglip2Model`` (patch inputs with a patch mask) with ``Siglip2ImageProcessor`` and the
  real ``Siglip2Tokenizer`` class constructed from a tiny vocabulary.

:func:`tiny_hf_clip` returns the ``(model, processor)`` pair every CLIP-based scorer accepts as
``model=``; :func:`save_tiny_hf_clip` writes it as a directory (``model=`` takes the path too).
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import torch

HF_FAMILIES = ("clip", "siglip", "siglip2")
_WORDS = ("a", "an", "the", "of", "with", "and", "is", "on", "in", "photo", "image", "picture", "depicts",
          "red", "green", "blue", "dog", "cat", "car", "tree", "man", "runs")


def _clip_tokenizer():
    import open_clip
    from transformers import CLIPTokenizer

    simple = open_clip.tokenizer.SimpleTokenizer()
    # open_clip names the special tokens <start_of_text>/<end_of_text>; OpenAI's (and transformers') files
    # name the same ids <|startoftext|>/<|endoftext|>
    names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {names.get(token, token): i for token, i in simple.encoder.items()}
    merges = [" ".join(pair) for pair, _ in sorted(simple.bpe_ranks.items(), key=lambda kv: kv[1])]
    try:
        return CLIPTokenizer(vocab=vocab, merges=merges)
    except TypeError:  # transformers 4: files only
        import json
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="tiny-clip-tok-"))
        (folder / "vocab.json").write_text(json.dumps(vocab))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def _piece_vocab(specials: list[str]) -> dict[str, int]:
    pieces = list(specials) + ["\u2581"] + list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces += [f"\u2581{w}" for w in _WORDS] + [f"<0x{i:02X}>" for i in range(256)]
    return {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def _siglip_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = _piece_vocab(["<pad>", "</s>", "<unk>"])
    tok = Tokenizer(models.Unigram([(p, -1.0 if p.startswith("\u2581") and len(p) > 1 else -5.0) for p in vocab],
                                   unk_id=2, byte_fallback=True))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="always"),
                                     decoders.ByteFallback()])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>", unk_token="<unk>",
                                   model_input_names=["input_ids"], model_max_length=64)


def _siglip2_tokenizer():
    from transformers import Siglip2Tokenizer

    vocab = _piece_vocab(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])
    return Siglip2Tokenizer(vocab=vocab, merges=[])


def tiny_hf_clip(family: str = "clip", seed: int = 0) -> tuple[Any, Any]:
    """``(model, processor)`` of a tiny random transformers ``family`` model (one of :data:`HF_FAMILIES`),
    deterministic for ``seed``, in eval mode, on the CPU, in fp32.

    Examples:
        >>> model, processor = tiny_hf_clip("siglip")
        >>> type(model).__name__, model.config.text_config.max_position_embeddings
        ('SiglipModel', 64)
    """
    import transformers as tf

    if family not in HF_FAMILIES:
        raise ValueError(f"family must be one of {HF_FAMILIES}, got {family!r}")
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, patch_size=8)
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if family == "clip":
            tokenizer = _clip_tokenizer()
            config = tf.CLIPConfig(text_config=dict(text, vocab_size=49408, max_position_embeddings=77,
                                                    bos_token_id=49406, eos_token_id=49407, pad_token_id=49407),
                                   vision_config=dict(vision, image_size=32), projection_dim=32)
            model = tf.CLIPModel(config)
            image_processor = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
            processor = tf.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
        elif family == "siglip":
            tokenizer = _siglip_tokenizer()
            config = tf.SiglipConfig(text_config=dict(text, vocab_size=len(tokenizer), max_position_embeddings=64,
                                                      bos_token_id=None, eos_token_id=1, pad_token_id=1),
                                     vision_config=dict(vision, image_size=32))
            model = tf.SiglipModel(config)
            processor = tf.SiglipProcessor(image_processor=tf.SiglipImageProcessor(size={"height": 32, "width": 32}),
                                           tokenizer=tokenizer)
        else:
            tokenizer = _siglip2_tokenizer()
            config = tf.Siglip2Config(text_config=dict(text, vocab_size=len(tokenizer), max_position_embeddings=64,
                                                       bos_token_id=2, eos_token_id=1, pad_token_id=0),
                                      vision_config=dict(vision, patch_size=16, num_patches=16))
            model = tf.Siglip2Model(config)
            processor = tf.Siglip2Processor(image_processor=tf.Siglip2ImageProcessor(patch_size=16, max_num_patches=16),
                                            tokenizer=tokenizer)
        with torch.no_grad():  # widen the init so outputs vary visibly with the input, as a trained model's do
            for name, p in model.named_parameters():
                if p.ndim >= 2 and "norm" not in name:
                    p.normal_(0.0, 0.5 / max(1.0, p.shape[-1]) ** 0.5)
    return model.eval(), processor


def save_tiny_hf_clip(path: str | os.PathLike, family: str = "clip", seed: int = 0) -> Path:
    """Write :func:`tiny_hf_clip` as a transformers directory (``save_pretrained``); return the path."""
    model, processor = tiny_hf_clip(family, seed)
    path = Path(path)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
