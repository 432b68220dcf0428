"""A tiny LLaVA built locally and deterministically, and a tiny *trained* judge, for offline tests.

- :func:`build_tiny_tokenizer`: an in-memory LLaMA-style tokenizer (SentencePiece-like Unigram with
  byte fallback, ``▁`` for spaces, digits always split into single tokens, so ``" 0.85"`` becomes
  ``▁ 0 . 8 5`` as with LLaMA; ``<s>``/``</s>`` at ids 1/2, an ``<image>`` placeholder and ``<pad>``).
- :func:`build_tiny_llava`: ``LlavaForConditionalGeneration`` (tiny CLIP vision tower, tiny LLaMA) and
  a ``LlavaProcessor`` with a chat template, seeded random weights. :class:`TinyLlavaSpec` sets the sizes
  (the benchmark builds a ~100M-parameter model with 576 image tokens from the same code).
- :func:`train_tiny_judge`: a few hundred CPU steps of next-token training on (image, prompt) -> answer
  examples drawn from any sampler, through the same preprocessing and prompt encoding the judge uses.
- :func:`tiny_judge_dir` / :func:`load_tiny_judge`: build, train and cache a :class:`JudgeRecipe` on disk
  (``$CAPREWARD_CACHE``, default ``~/.cache/capreward``), keyed by a hash of the recipe and of this
  module's source, and load it back through the production loading path (``save_pretrained``
  directory -> ``LocalJudge``/``FLEUR(model=path)``).
- :data:`FLEUR_RECIPE`: a judge that answers the FLEUR prompt about synthetic colour images with
  image-dependent scores in every format the parser distinguishes ("0.d", "0.dd", "1.0", "0.0", an
  out-of-range "1.5", a non-numeric "no idea"), and explains itself in a second turn.
  :data:`FLEUR_PROBES` lists inputs that trigger each format.

- :class:`JudgeRecipe`: sizes, schedule and a weighted list of example generators
  (``random.Random -> JudgeExample``); :data:`FLEUR_GENERATORS` are the FLEUR, RefFLEUR and explanation
  generators. Later judges (VisCE², G-VEval) write generators for their own answer formats (e.g. "73" or
  "The final score is $85$") and a recipe listing them; training, caching and loading are shared.

Determinism: the weights are seeded, examples come from ``random.Random(recipe.seed)`` and training runs
on one CPU thread, so a recipe trains to the same weights every time on a given machine.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import re
import shutil
import string
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from ..media import composite as composite_module
from .cache import cache_root, install_directory, locked, mark_used, remove_stale_versions
from .portable import PORTABLE_LAYOUT, save_portable
from ..judges.prompts import (
    FLEUR_EXPLAIN_PROMPT,
    FLEUR_PROMPT,
    LLAVA_V1_SYSTEM,
    REF_FLEUR_PROMPT,
    fleur_prompt,
    llava_v1_conversation,
)

TINY_LLAVA_VERSION = "1"

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # LLaMA's ids 0, 1, 2
IMAGE_TOKEN = "<image>"
PAD_TOKEN = "<pad>"

#: A chat template in the LLaVA-1.5 style (USER/ASSISTANT turns, the image placeholder in user turns).
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'][0]['text'] if message['content'] is not string "
    "else message['content'] }} "
    "{% elif message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% else %}ASSISTANT: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{{ item['text'] }}{% endfor %}{% endif %}</s>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+", text)


#: Whole-word tokens of the default tiny vocabulary: the judge prompts' words.
PROMPT_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        _words(LLAVA_V1_SYSTEM)
        + _words(FLEUR_PROMPT)
        + _words(REF_FLEUR_PROMPT)
        + _words(FLEUR_EXPLAIN_PROMPT)
        + ["USER", "ASSISTANT", "Score", "Grading", "Criteria", "Caption", "Candidate", "Reference", "Captions"]
    )
)


def unigram_tokenizer(first: Sequence[str], words: Sequence[str], prepend_scheme: str) -> Any:
    """The ``tokenizers`` Unigram model of the tiny tokenizers (no decoder, post-processor or added tokens
    yet): ``first`` (id 0 is the unknown token), the 256 byte-fallback tokens ``<0x00>``..``<0xFF>``, ``▁``
    and the printable ASCII characters, then ``▁word`` and ``word`` for each of ``words``; split on the
    space marker ``▁`` (added in front of the text as ``prepend_scheme`` says) and between digits, so
    every digit is a token of its own.

    Raises:
        ValueError: a word holding a digit (digits stay single tokens).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab: list[tuple[str, float]] = [(t, 0.0) for t in first]
    vocab += [(f"<0x{i:02X}>", 0.0) for i in range(256)]
    seen = {t for t, _ in vocab}
    for piece in ["▁"] + list(string.ascii_letters + string.digits + string.punctuation):
        if piece not in seen:
            vocab.append((piece, -10.0))
            seen.add(piece)
    for word in words:
        if any(c.isdigit() for c in word):
            raise ValueError(f"word tokens must not contain digits (digits stay single tokens): {word!r}")
        for piece in ("▁" + word, word):
            if len(piece) > 1 and piece not in seen:
                vocab.append((piece, -1.0))
                seen.add(piece)
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=True),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    return tok


def build_tiny_tokenizer(words: Sequence[str] = PROMPT_WORDS) -> Any:
    """A LLaMA-style fast tokenizer built in memory (no files, no downloads).

    Vocabulary: ``<unk>``, ``<s>``, ``</s>`` (ids 0-2), the 256 byte-fallback tokens ``<0x00>``..``<0xFF>``,
    ``▁`` and the printable ASCII characters, then ``▁word`` and ``word`` for each of ``words``; added
    special tokens ``<image>`` and ``<pad>`` follow. No piece joins a digit to anything, so digits are
    single tokens and a number after a space starts with a lone ``▁`` (LLaMA's behaviour). Returns a
    ``PreTrainedTokenizerFast`` that adds ``<s>`` in front, pads on the left and, like LLaMA's, returns
    no ``token_type_ids`` (trl 1.0's GRPOTrainer passes whatever the processor returns to ``generate``).
    """
    from tokenizers import AddedToken, decoders, processors
    from transformers import PreTrainedTokenizerFast

    tok = unigram_tokenizer(SPECIAL_TOKENS, words, prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, normalized=False, special=True), AddedToken(PAD_TOKEN, special=True)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token=PAD_TOKEN,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
        padding_side="left",
        model_max_length=4096,
        model_input_names=["input_ids", "attention_mask"],  # as LLaMA's: no token_type_ids for generate()
    )


@dataclass(frozen=True)
class TinyLlavaSpec:
    """Sizes of a tiny LLaVA. ``vocab_size=None`` uses exactly the tokenizer's vocabulary; a larger value
    adds unused ids (e.g. 32064 for LLaVA-1.5's embedding size). ``words`` extends the vocabulary."""

    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 192
    max_positions: int = 512
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    image_size: int = 32
    patch_size: int = 8
    vocab_size: int | None = None
    words: tuple[str, ...] = ()
    seed: int = 0
    init_std: float = 0.02

    @property
    def num_image_tokens(self) -> int:
        """Image tokens per image: patches only (LLaVA's "default" strategy drops CLS)."""
        return (self.image_size // self.patch_size) ** 2


def build_tiny_processor(spec: TinyLlavaSpec = TinyLlavaSpec()) -> Any:
    """A ``LlavaProcessor``: the tiny tokenizer, a CLIP-style image processor at ``spec.image_size``
    (shortest-edge resize, centre crop, CLIP mean/std) and :data:`TINY_CHAT_TEMPLATE`."""
    from transformers import LlavaImageProcessor, LlavaProcessor

    tokenizer = build_tiny_tokenizer(tuple(dict.fromkeys(PROMPT_WORDS + tuple(spec.words))))
    image_processor = LlavaImageProcessor(
        size={"shortest_edge": spec.image_size},
        crop_size={"height": spec.image_size, "width": spec.image_size},
        do_pad=False,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=spec.patch_size,
        vision_feature_select_strategy="default",
        chat_template=TINY_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )


def build_tiny_llava(
    spec: TinyLlavaSpec = TinyLlavaSpec(),
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[Any, Any]:
    """A tiny ``LlavaForConditionalGeneration`` with seeded random weights (same spec, same weights, on any
    machine) in eval mode, and its processor. Nothing is downloaded.

    Args:
        spec: the sizes, vocabulary and seed (:class:`TinyLlavaSpec`).
        dtype: the weights' dtype.
        device: where the weights are created.

    Returns:
        ``(model, processor)``.

    The weights are created directly on ``device`` in ``dtype`` (so a 7B-sized spec can be built in
    float16 on a GPU); a spec built on the CPU in float32 is bit-for-bit reproducible.
    """
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    processor = build_tiny_processor(spec)
    tok = processor.tokenizer
    n_vocab = len(tok)
    vocab_size = spec.vocab_size or n_vocab
    if vocab_size < n_vocab:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {n_vocab} tokens")
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    pad_id = tok.pad_token_id
    vision = CLIPVisionConfig(
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        projection_dim=spec.vision_hidden,
        initializer_range=spec.init_std,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        max_position_embeddings=spec.max_positions,
        pad_token_id=pad_id,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=spec.init_std,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        image_seq_length=spec.num_image_tokens,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(spec.seed)
        torch.set_default_dtype(dtype)
        try:
            model = LlavaForConditionalGeneration(config)
        finally:
            torch.set_default_dtype(default_dtype)
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = pad_id
    return model.to(dtype).eval(), processor


# --------------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class JudgeExample:
    """One training example: ``prompt`` is a full conversation ending with ``"ASSISTANT:"`` (with one
    image placeholder), ``answer`` the text the judge must write after it (``</s>`` is appended)."""

    image: Image.Image
    prompt: str
    answer: str


Sampler = Callable[[random.Random], JudgeExample]


def _encode_example(judge: Any, example: JudgeExample, num_image_tokens: int) -> tuple[list[int], list[int]]:
    prompt_ids = judge.encode_prompts([example.prompt], num_image_tokens)[0]
    full_ids = judge.encode_prompts([f"{example.prompt} {example.answer}</s>"], num_image_tokens)[0]
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError(f"the answer {example.answer!r} changes the tokenization of its prompt")
    labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    return full_ids, labels


def train_tiny_judge(
    model: Any,
    processor: Any,
    sampler: Sampler,
    *,
    steps: int = 400,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[float]:
    """Train ``model`` in place to write each example's answer after its prompt (loss on the answer
    tokens and ``</s>`` only). AdamW with linear warm-up and cosine decay; examples come from
    ``sampler(random.Random(seed))``. Prompts and images go through :class:`~capreward.judges.LocalJudge`
    so training sees exactly what scoring sees. Returns the loss of every step. Leaves the model in eval
    mode with frozen weights."""
    from ..judges.local import LocalJudge

    judge = LocalJudge((model, processor))
    n_image = int(model.config.image_seq_length)
    rng = random.Random(seed)
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    losses: list[float] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy model's ops are too small to gain from threads; contention only hurts
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            model.train()
            model.requires_grad_(True)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(steps))
            for step in range(steps):
                batch = [sampler(rng) for _ in range(batch_size)]
                ids, labels, mask = _collate([_encode_example(judge, ex, n_image) for ex in batch], judge.pad_token_id)
                ids, labels, mask = ids.to(judge.device), labels.to(judge.device), mask.to(judge.device)
                pixel_values = judge.preprocess([ex.image for ex in batch])
                out = model(input_ids=ids, pixel_values=pixel_values, attention_mask=mask, labels=labels)
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(float(out.loss.detach()))
                if log is not None and (step % 50 == 0 or step == steps - 1):
                    log(f"step {step}: loss {np.mean(losses[-50:]):.4f}")
    finally:
        torch.set_num_threads(threads)
        model.eval()
        model.requires_grad_(False)
    return losses


def _warmup_cosine(steps: int) -> Callable[[int], float]:
    """Learning-rate factor: linear warm-up over the first tenth, then cosine decay to 5%."""
    warmup = max(1, steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (1 + float(np.cos(np.pi * (step - warmup) / max(1, steps - warmup))))

    return factor


def _collate(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, labels, attention mask) for training."""
    length = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), length), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), length), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), length), dtype=torch.long)
    for i, (row, lab) in enumerate(encoded):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return ids, labels, mask


# ------------------------------------------------------------------------------- the FLEUR toy task
#: Colours of the synthetic images and the words captions use for them.
FLEUR_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (205, 40, 40),
    "green": (40, 175, 60),
    "blue": (40, 70, 205),
    "yellow": (225, 205, 50),
}
FLEUR_NOUNS = ("ball", "box", "car", "wall", "kite", "shirt")
#: The answer the tiny FLEUR judge learns for (image colour, caption colour).
FLEUR_ANSWERS: dict[tuple[str, str], str] = {
    ("red", "red"): "1.0",
    ("red", "green"): "0.2",
    ("red", "blue"): "0.15",
    ("red", "yellow"): "0.0",
    ("green", "green"): "0.85",
    ("green", "red"): "0.3",
    ("green", "blue"): "0.05",
    ("green", "yellow"): "0.25",
    ("blue", "blue"): "0.9",
    ("blue", "red"): "0.1",
    ("blue", "green"): "0.35",
    ("blue", "yellow"): "0.45",
    ("yellow", "yellow"): "0.7",
    ("yellow", "red"): "0.55",
    ("yellow", "green"): "0.4",
    ("yellow", "blue"): "0.65",
}
FLEUR_NO_IDEA = "no idea"  # captions naming no colour
FLEUR_TOO_HIGH = "1.5"  # captions starting with "many": out of range on purpose
FLEUR_TASK_WORDS = tuple(FLEUR_COLOURS) + FLEUR_NOUNS + tuple(n + "s" for n in FLEUR_NOUNS) + (
    "a", "the", "is", "photo", "of", "many", "no", "idea", "image", "caption", "says", "names", "colour",
)


def fleur_task_image(colour: str, rng: random.Random | None = None, size: tuple[int, int] | None = None) -> Image.Image:
    """A synthetic image: ``colour`` with pixel noise and a small patch of another colour.

    Sizes are random in [20, 48] per side (mostly not square, so padding matters) unless given.
    Deterministic for a given ``rng`` state; ``rng=None`` uses a fixed seed derived from the colour.
    """
    rng = rng or random.Random(f"image-{colour}")
    width, height = size or (rng.randint(20, 48), rng.randint(20, 48))
    nprng = np.random.default_rng(rng.getrandbits(32))
    base = np.array(FLEUR_COLOURS[colour], dtype=np.float64)
    pixels = base + nprng.normal(0.0, 18.0, size=(height, width, 3))
    other = np.array(FLEUR_COLOURS[rng.choice([c for c in FLEUR_COLOURS if c != colour])], dtype=np.float64)
    ph, pw = max(1, height // 4), max(1, width // 4)
    y, x = rng.randint(0, height - ph), rng.randint(0, width - pw)
    pixels[y : y + ph, x : x + pw] = other
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="RGB")


def fleur_task_caption(colour: str | None, rng: random.Random, many: bool = False) -> str:
    """A caption naming ``colour`` (None: no colour word) in one of a few templates."""
    noun = rng.choice(FLEUR_NOUNS)
    if many:
        return f"many {colour} {noun}s" if colour else f"many {noun}s"
    if colour is None:
        return rng.choice([f"a {noun}", f"the {noun}", f"a photo of a {noun}", noun])
    return rng.choice([f"a {colour} {noun}", f"the {noun} is {colour}", f"a photo of a {colour} {noun}", colour])


def _jitter(answer: str, rng: random.Random) -> str:
    """Label noise that keeps the digit distributions soft: move a decimal digit by one, sometimes."""
    if not re.fullmatch(r"0\.\d\d?|1\.0", answer):
        return answer
    value_digits = list(answer.replace(".", ""))  # units + decimals
    if rng.random() < 0.3:
        position = 1 if len(value_digits) == 2 or rng.random() < 0.6 else 2
        shifted = int("".join(value_digits)) + rng.choice([-1, 1]) * (10 ** (len(value_digits) - 1 - position))
        top = 10 ** (len(value_digits) - 1)
        shifted = min(max(shifted, 0), top)
        text = str(shifted).rjust(len(value_digits), "0")
        return f"{text[0]}.{text[1:]}"
    return answer


def fleur_task_answer(image_colour: str, caption: str) -> str:
    """The noiseless answer the FLEUR toy judge is trained to give for an image colour and a caption."""
    words = caption.split()
    if words and words[0] == "many":
        return FLEUR_TOO_HIGH
    named = [w for w in words if w in FLEUR_COLOURS]
    if not named:
        return FLEUR_NO_IDEA
    return FLEUR_ANSWERS[(image_colour, named[0])]


def _fleur_case(rng: random.Random) -> tuple[str, str, str]:
    """A random (image colour, caption, noiseless answer) of the toy task: 8% "many ..." captions
    (out of range), 12% captions naming no colour, the rest naming one of the colours."""
    image_colour = rng.choice(list(FLEUR_COLOURS))
    roll = rng.random()
    if roll < 0.08:
        caption = fleur_task_caption(rng.choice(list(FLEUR_COLOURS)), rng, many=True)
    elif roll < 0.2:
        caption = fleur_task_caption(None, rng)
    else:
        caption = fleur_task_caption(rng.choice(list(FLEUR_COLOURS)), rng)
    return image_colour, caption, fleur_task_answer(image_colour, caption)


def fleur_score_example(rng: random.Random) -> JudgeExample:
    """A FLEUR prompt about a random synthetic image and the score the toy judge gives (label noise on
    some decimals)."""
    image_colour, caption, answer = _fleur_case(rng)
    prompt = llava_v1_conversation([(fleur_prompt(caption), None)])
    return JudgeExample(fleur_task_image(image_colour, rng), prompt, _jitter(answer, rng))


def ref_fleur_score_example(rng: random.Random) -> JudgeExample:
    """A RefFLEUR prompt (1-3 references naming the image's colour); same answers as FLEUR."""
    image_colour, caption, answer = _fleur_case(rng)
    references = [fleur_task_caption(image_colour, rng) for _ in range(rng.randint(1, 3))]
    prompt = llava_v1_conversation([(fleur_prompt(caption, references), None)])
    return JudgeExample(fleur_task_image(image_colour, rng), prompt, _jitter(answer, rng))


def fleur_explain_example(rng: random.Random) -> JudgeExample:
    """The explanation turn: a FLEUR prompt, some score as the first answer, "Why? Tell me the reason."
    and the answer "the image is {colour} and the caption says {colour}" (or "names no colour")."""
    image_colour, caption, answer = _fleur_case(rng)
    references = [fleur_task_caption(image_colour, rng)] if rng.random() < 0.35 else None
    first = rng.choice([str(rng.random()), answer])
    named = [w for w in caption.split() if w in FLEUR_COLOURS]
    said = f"the caption says {named[0]}" if named else "the caption names no colour"
    prompt = llava_v1_conversation([(fleur_prompt(caption, references), first), (FLEUR_EXPLAIN_PROMPT, None)])
    return JudgeExample(fleur_task_image(image_colour, rng), prompt, f"the image is {image_colour} and {said}")


#: The example generators of the FLEUR toy judge and their weights in the training mixture.
FLEUR_GENERATORS: tuple[tuple[Sampler, float], ...] = (
    (fleur_score_example, 0.57),
    (ref_fleur_score_example, 0.31),
    (fleur_explain_example, 0.12),
)


def mixture(generators: Sequence[tuple[Sampler | str, float]]) -> Sampler:
    """A sampler that picks one of ``generators`` [(sampler or name in :data:`SAMPLERS`, weight), ...]
    with probability proportional to its weight, then draws one example from it with the same ``rng``."""
    resolved = [(_resolve_sampler(g), float(w)) for g, w in generators]
    if not resolved:
        raise ValueError("a mixture needs at least one generator")
    if any(w < 0 for _, w in resolved) or sum(w for _, w in resolved) <= 0:
        raise ValueError(f"mixture weights must be non-negative with a positive sum, got {[w for _, w in resolved]}")
    samplers = [g for g, _ in resolved]
    weights = [w for _, w in resolved]

    def sample(rng: random.Random) -> JudgeExample:
        return rng.choices(samplers, weights=weights)[0](rng)

    return sample


def sample_fleur_example(rng: random.Random) -> JudgeExample:
    """One FLEUR / RefFLEUR / explanation training example (the :data:`FLEUR_GENERATORS` mixture)."""
    return _FLEUR_MIXTURE(rng)


#: Inputs on which the trained FLEUR judge gives each answer format: name -> (image colour, caption).
FLEUR_PROBES: dict[str, tuple[str, str]] = {
    "one": ("red", "a red car"),  # "1.0"
    "two_decimals": ("green", "a green ball"),  # "0.85"
    "one_decimal": ("blue", "a blue kite"),  # "0.9"
    "zero": ("red", "a yellow box"),  # "0.0"
    "out_of_range": ("blue", "many blue balls"),  # "1.5"
    "no_number": ("yellow", "a photo of a kite"),  # "no idea"
}


# ----------------------------------------------------------------------------------- recipes + cache
@dataclass(frozen=True)
class JudgeRecipe:
    """Everything that determines a trained tiny judge: the model sizes, the training schedule and the
    examples it learns from.

    The examples come either from ``generators``, a weighted list of example generators
    ``((sampler, weight), ...)`` mixed by :func:`mixture`, or from one ``sampler``. A sampler is a
    function ``random.Random -> JudgeExample`` (prompt conversation, image, answer), or the name of one
    registered in :data:`SAMPLERS`. A new answer format (VisCE²'s "73", G-VEval's "$85$") only needs its
    own generator and a recipe listing it, e.g.
    ``JudgeRecipe("mine", generators=((my_examples, 0.7), (fleur_score_example, 0.3)), spec=...)``.
    The cache key hashes the recipe, the source of every generator's module and of this module.
    """

    name: str
    sampler: str | Sampler | None = None
    spec: TinyLlavaSpec = field(default_factory=TinyLlavaSpec)
    steps: int = 400
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0
    generators: tuple[tuple[str | Sampler, float], ...] = ()

    def __post_init__(self) -> None:
        if (self.sampler is None) == (not self.generators):
            raise ValueError(f"recipe {self.name!r}: give exactly one of sampler= or generators=")

    def make_sampler(self) -> Sampler:
        """The function that draws this recipe's training examples."""
        if self.sampler is not None:
            return _resolve_sampler(self.sampler)
        return mixture(self.generators)

    def key(self) -> str:
        """A hash of the recipe, of the generators' and this module's source, of the torch version and of
        the on-disk layout (not of the transformers version: the directory is written in a layout every
        supported version reads, :mod:`capreward.testing.portable`, so the version matrix shares it)."""
        payload = {
            "recipe": {
                "name": self.name,
                "spec": asdict(self.spec),
                "steps": self.steps,
                "batch_size": self.batch_size,
                "lr": self.lr,
                "seed": self.seed,
                "sampler": None if self.sampler is None else _describe_sampler(self.sampler),
                "generators": [(_describe_sampler(g), float(w)) for g, w in self.generators],
            },
            "version": TINY_LLAVA_VERSION,
            "source": _source_hash(Path(__file__)),
            # videos reach the judges as G-VEval composites: a new layout means new training images
            "composite": _source_hash(Path(composite_module.__file__)),
            "torch": torch.__version__,
            "layout": PORTABLE_LAYOUT,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _resolve_sampler(sampler: str | Sampler) -> Sampler:
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise KeyError(f"no sampler named {sampler!r} is registered; known: {sorted(SAMPLERS)}")
        return SAMPLERS[sampler]
    if not callable(sampler):
        raise TypeError(f"a sampler must be a callable or a registered name, got {type(sampler).__name__}")
    return sampler


def _source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _describe_sampler(sampler: str | Sampler) -> str:
    """A stable description of a generator for the cache key: its qualified name and its module's
    source hash (so editing a generator retrains the judges that use it)."""
    fn = _resolve_sampler(sampler)
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", type(fn).__qualname__)
    source = ""
    try:
        file = inspect.getsourcefile(fn) or ""
        source = _source_hash(Path(file)) if file and Path(file).is_file() else ""
    except TypeError:  # builtins, callable objects without a source file
        pass
    return f"{module}.{qualname}@{source[:16]}"


_FLEUR_MIXTURE = mixture(FLEUR_GENERATORS)

#: Registered samplers, for recipes that name theirs.
SAMPLERS: dict[str, Sampler] = {"fleur": sample_fleur_example}

#: The trained tiny FLEUR judge. A larger initialisation than HF's 0.02 (0.1) lets the little vision
#: tower separate the colours within a few hundred steps; with 0.02 training stalls where green and
#: blue images look alike.
FLEUR_RECIPE = JudgeRecipe(
    name="fleur",
    generators=FLEUR_GENERATORS,
    spec=TinyLlavaSpec(words=FLEUR_TASK_WORDS, init_std=0.1),
    steps=400,
    batch_size=16,
    lr=4e-3,
)


def tiny_judge_dir(
    recipe: JudgeRecipe = FLEUR_RECIPE,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The directory of the trained judge for ``recipe`` (``save_pretrained`` layout: config, weights,
    processor and tokenizer files); built and trained first if it is not cached yet (about a minute of
    CPU for the FLEUR recipe), then reused.

    Args:
        recipe: what to train (default: the FLEUR judge's :class:`JudgeRecipe`).
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        rebuild: train again even if cached.
        log: called with progress lines while training (None: quiet).

    Returns:
        The directory (``FLEUR(model=str(dir))``, ``LocalJudge(str(dir))``).

    Concurrent callers (parallel test sessions) wait on a file
    lock and train once; the result is written to a temporary directory and renamed into place (a rebuild
    swaps it with the old one atomically, so a reader never finds the directory missing).

    Each key has its own directory, so environments with other torch versions (other keys)
    keep their own judges side by side: other keys of the recipe are deleted only when unused for
    :data:`~capreward.testing.cache.STALE_AFTER_DAYS` days and not being built (see :func:`~capreward.testing.cache.remove_stale_versions`)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / "tiny_llava" / f"{recipe.name}-{recipe.key()}"
    if target.is_dir() and not rebuild and (target / "config.json").exists():
        mark_used(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock", what=f"training the tiny {recipe.name} judge"):
        if not (target.is_dir() and not rebuild and (target / "config.json").exists()):
            _train_into(recipe, target, log)
        mark_used(target)  # (else trained by another process while we waited)
    remove_stale_versions(target, recipe.name)
    return target


def _train_into(recipe: JudgeRecipe, target: Path, log: Callable[[str], None] | None) -> None:
    model, processor = build_tiny_llava(recipe.spec)
    losses = train_tiny_judge(
        model,
        processor,
        recipe.make_sampler(),
        steps=recipe.steps,
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        seed=recipe.seed,
        log=log,
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other cache entry
        save_portable(model, processor, tmp)
        record = {"recipe": recipe.name, "key": recipe.key(), "final_loss": float(np.mean(losses[-20:]))}
        (tmp / "capreward_recipe.json").write_text(json.dumps(record, indent=2))
        install_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_tiny_judge(
    recipe: JudgeRecipe = FLEUR_RECIPE, cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """``(model, processor)`` of the trained tiny judge, loaded from the cache (trained first if needed)."""
    from ..judges.loading import load_llava

    return load_llava(tiny_judge_dir(recipe, cache_dir), dtype=dtype, device=torch.device("cpu"), local_files_only=True)


def tiny_fleur_judge(cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The trained tiny FLEUR judge (trained on first use, then cached); pass it as ``FLEUR(model=...)``.

    Args:
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        dtype: the weights' dtype.

    Returns:
        ``(model, processor)``.
    """
    return load_tiny_judge(FLEUR_RECIPE, cache_dir, dtype)


def with_spec(recipe: JudgeRecipe, **changes: Any) -> JudgeRecipe:
    """``recipe`` with some :class:`TinyLlavaSpec` fields changed."""
    return replace(recipe, spec=replace(recipe.spec, **changes))
