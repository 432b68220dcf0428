"""A tiny CLIP *trained* to know colour words, for tests and toy experiments that need a CLIP whose
scores mean something.

The random tiny CLIP of :mod:`capreward.testing.tiny_clip` cannot tell "a red image" from "a blue
image". This module fine-tunes the same architecture (:data:`~capreward.testing.TINY_CLIP_CONFIG`) for a
couple of hundred CPU steps on images of one colour (with jitter and pixel noise) paired with captions
that name the colour ("a red image", "the picture is red", "red", ...; see :data:`CAPTION_TEMPLATES`),
half of them behind CLIP-S's prefix "A photo depicts ".

Two contrastive objectives are trained together:

- CLIP's own, on the caption embedding (EOS position) against the image embedding; every image of the
  batch with the caption's colour counts as a positive.
- A token-level one: the embedding of the colour word *at its position* against the images, so that
  EMScore's token-to-frame matching (which reads per-token embeddings) also sees the colour.

What it can and cannot show: it knows the words of :data:`COLOURS` on (nearly) uniform images; every
other word is out of its vocabulary, so similarities for them are meaningless.

The weights are cached as an OpenAI-format state dict under ``$CAPREWARD_CACHE`` (default
``~/.cache/capreward``) in ``trained_clip/<name>-<hash>.pt``, the hash covering the recipe, this
module's source, the tiny CLIP config and the torch version; :func:`trained_clip_path` trains on the
first call and returns the path, which every CLIP-based scorer accepts as ``model=``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .cache import cache_root
from .tiny_clip import TINY_CLIP_CONFIG, build_tiny_clip, openai_state_dict

TRAINED_CLIP_VERSION = "2"

#: Colour words the trained CLIP knows (name -> RGB).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 30, 35),
    "green": (35, 165, 50),
    "blue": (35, 70, 215),
    "yellow": (240, 215, 35),
    "purple": (135, 45, 170),
    "orange": (245, 135, 25),
}

CAPTION_TEMPLATES: tuple[str, ...] = (
    "a {colour} image",
    "a {colour} image.",
    "a {colour} picture",
    "a photo of {colour}",
    "the image is {colour}",
    "the picture is {colour}.",
    "{colour}",
    "an image of the colour {colour}",
)


@dataclass(frozen=True)
class ColourClipRecipe:
    """Everything that determines a trained colour CLIP (and therefore its cache key)."""

    name: str = "colours"
    steps: int = 200
    batch_size: int = 48
    lr: float = 2e-3
    weight_decay: float = 0.01
    token_loss_weight: float = 1.0
    logit_scale: float = 10.0
    pool_size: int = 768
    seed: int = 0

    def key(self) -> str:
        """A hash of the recipe, this module's source, the tiny CLIP config and the torch version."""
        return recipe_key(self, TRAINED_CLIP_VERSION, Path(__file__).read_bytes(), TINY_CLIP_CONFIG)


def recipe_key(recipe: Any, version: str, source: bytes, config: Mapping[str, Any]) -> str:
    """The cache key of a trained CLIP: 16 hex digits of a hash of what determines its weights.

    Args:
        recipe: the training recipe (a dataclass).
        version: the training code's version string.
        source: the bytes of the training code's source files.
        config: the CLIP's architecture config.

    Returns:
        The key.
    """
    payload = {
        "recipe": asdict(recipe),
        "version": version,
        "source": hashlib.sha256(source).hexdigest(),
        "config": config,
        "torch": torch.__version__.split("+")[0],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


COLOUR_RECIPE = ColourClipRecipe()


# ------------------------------------------------------------------------------------ the synthetic task
def colour_image(colour: str, rng: random.Random | None = None, size: tuple[int, int] | None = None) -> Image.Image:
    """An RGB image of ``colour`` (a key of :data:`COLOURS`): the colour shifted by up to +-25 per
    channel, plus Gaussian pixel noise (sigma 12). Deterministic for a given ``rng`` state.

    Args:
        colour: a key of :data:`COLOURS`.
        rng: the random source (None: a fresh one).
        size: (width, height) (None: random in [24, 64] per side).

    Returns:
        The PIL image."""
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; expected one of {list(COLOURS)}")
    rng = rng or random.Random(f"colour-{colour}")
    width, height = size or (rng.randint(24, 64), rng.randint(24, 64))
    base = np.array([c + rng.randint(-25, 25) for c in COLOURS[colour]], dtype=np.float64)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, 12.0, size=(height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), mode="RGB")


#: CLIP-S's caption prefix (see :mod:`capreward.scorers.clipscore`); half the training captions carry
#: it, so the model scores captions the same with and without it.
CLIPS_PREFIX = "A photo depicts "


def colour_caption(colour: str, rng: random.Random | None = None, template: str | None = None) -> str:
    """A caption naming ``colour``.

    Args:
        colour: a key of :data:`COLOURS`.
        rng: the random source of the template (None: a fresh one).
        template: one of :data:`CAPTION_TEMPLATES` (None: a random one).

    Returns:
        The caption.
    """
    rng = rng or random.Random(0)
    return (template or rng.choice(CAPTION_TEMPLATES)).format(colour=colour)


def _training_caption(colour: str, rng: random.Random) -> str:
    caption = colour_caption(colour, rng)
    return CLIPS_PREFIX + caption if rng.random() < 0.5 else caption


# ------------------------------------------------------------------------------------------- training
def _preprocess():
    import open_clip

    return open_clip.image_transform(TINY_CLIP_CONFIG["vision"]["image_size"], is_train=False)


def _tokenizer():
    import open_clip

    return open_clip.tokenizer.SimpleTokenizer(context_length=TINY_CLIP_CONFIG["text"]["context_length"])


def text_token_embeddings(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Normalised per-position text embeddings [B, L, D] (ln_final, then projection), as EMScore reads
    them (see :class:`capreward.backbones.CLIPBackbone`); positions after a caption's EOS are garbage."""
    width = ids.shape[1]
    x = model.token_embedding(ids) + model.positional_embedding[:width]
    x = model.transformer(x, attn_mask=model.attn_mask[:width, :width])
    x = model.ln_final(x)
    return F.normalize(x @ model.text_projection, dim=-1)


def encode_captions(tokenizer, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Token ids [B, L] (SOT..EOT, zero padded), lengths [B], and the position of each caption's colour
    word (its last BPE token; each caption must name a colour of :data:`COLOURS`)."""
    rows, positions = [], []
    for caption in captions:
        ids = [tokenizer.sot_token_id]
        where = None
        for word in caption.rstrip(".").split(" "):
            ids.extend(tokenizer.encode(word))
            if word in COLOURS:
                where = len(ids) - 1
        if where is None:
            raise ValueError(f"caption {caption!r} names none of {list(COLOURS)}")
        if caption.endswith("."):
            ids.extend(tokenizer.encode("."))
        ids.append(tokenizer.eot_token_id)
        rows.append(ids)
        positions.append(where)
    ids, lengths = padded_ids(rows)
    return ids, lengths, positions


def padded_ids(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows as one zero-padded tensor.

    Args:
        rows: the token ids of each caption.

    Returns:
        The ids [B, L] (zero padded on the right) and the lengths [B].
    """
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out, torch.tensor([len(r) for r in rows])


def _multi_positive_ce(logits: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -log(softmax mass on the positive columns)."""
    return (torch.logsumexp(logits, dim=1) - torch.logsumexp(logits.masked_fill(~positive, -1e4), dim=1)).mean()


def _lr_factor(steps: int) -> Callable[[int], float]:
    warmup = max(1, steps // 10)
    return lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))


@contextmanager
def seeded_single_thread(seed: int) -> Iterator[None]:
    """Run the block on one torch thread (toy-sized ops: threads only add contention) with the torch RNGs
    seeded with ``seed`` and restored afterwards, as are the thread count and the CPU RNG's state (the
    CUDA RNGs are forked too where CUDA is available).

    Args:
        seed: the torch seed of the block.

    Yields:
        Nothing.
    """
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


def optimiser_step(opt: torch.optim.Optimizer, sched: Any, loss: torch.Tensor) -> float:
    """One optimiser step on ``loss`` (gradients cleared first), then one scheduler step.

    Args:
        opt: the optimiser.
        sched: its learning-rate scheduler.
        loss: the step's loss.

    Returns:
        The loss as a float.
    """
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def fp16_rounded(model: torch.nn.Module) -> torch.nn.Module:
    """Round the weights to fp16 precision as :func:`~capreward.testing.tiny_clip.build_tiny_clip` does, so
    the OpenAI-format file reloads losslessly.

    Args:
        model: the trained CLIP (changed in place).

    Returns:
        The model, in eval mode.
    """
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model.eval()


def train_colour_clip(
    recipe: ColourClipRecipe = COLOUR_RECIPE, log: Callable[[str], None] | None = None
) -> tuple[torch.nn.Module, list[float]]:
    """Train the tiny CLIP on the colour task; returns (model in eval mode, per-step losses).
    Bit-for-bit deterministic on the CPU for a given recipe (seeded Python and torch RNGs)."""
    rng = random.Random(recipe.seed)
    colours = list(COLOURS)
    with seeded_single_thread(recipe.seed):
        model = build_tiny_clip(recipe.seed).train()
        # A fixed, modest logit scale: the loss then only falls when matching pairs reach a high
        # cosine and others a low one, so CLIP-S (which clips cosines at 0) ranks colours too.
        model.logit_scale.requires_grad_(False).fill_(math.log(recipe.logit_scale))
        preprocess, tokenizer = _preprocess(), _tokenizer()
        pool_colours = [colours[i % len(colours)] for i in range(recipe.pool_size)]
        pixels = torch.stack([preprocess(colour_image(c, rng)) for c in pool_colours])
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=recipe.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor(recipe.steps))
        losses: list[float] = []
        for step in range(recipe.steps):
            idx = rng.sample(range(recipe.pool_size), recipe.batch_size)
            batch = [pool_colours[i] for i in idx]
            ids, lengths, where = encode_captions(tokenizer, [_training_caption(c, rng) for c in batch])
            images = F.normalize(model.encode_image(pixels[idx]), dim=-1)
            tokens = text_token_embeddings(model, ids)
            rows = torch.arange(len(batch))
            scale = recipe.logit_scale
            same = torch.tensor([[a == b for b in batch] for a in batch])
            logits = scale * tokens[rows, lengths - 1] @ images.T
            clip_loss = (_multi_positive_ce(logits, same) + _multi_positive_ce(logits.T, same)) / 2
            word_logits = scale * tokens[rows, torch.tensor(where)] @ images.T
            token_loss = _multi_positive_ce(word_logits, same)
            loss = clip_loss + recipe.token_loss_weight * token_loss
            losses.append(optimiser_step(opt, sched, loss))
            if log is not None and (step % 50 == 0 or step == recipe.steps - 1):
                log(f"step {step}: loss {losses[-1]:.3f} (clip {clip_loss.item():.3f}, token {token_loss.item():.3f})")
    return fp16_rounded(model), losses


# ---------------------------------------------------------------------------------------------- cache
def trained_clip_path(
    recipe: ColourClipRecipe = COLOUR_RECIPE,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Path of the trained colour CLIP as an OpenAI-format ``.pt`` state dict (pass it as ``model=``).

    Args:
        recipe: what to train (the default colour recipe).
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        rebuild: train again even if cached.
        log: called with progress lines while training (None: quiet).

    Returns:
        The ``.pt`` path.

    Trained and written on the first call for ``recipe`` (atomically: a temporary file renamed into
    place, so concurrent callers never read a partial file), then reused. A ``.json`` beside it records
    the recipe and the final training loss. Each key (recipe, this module, torch version) has its own
    file and none is ever deleted, so environments with other versions keep theirs.
    """
    return cached_clip_path(recipe, lambda: train_colour_clip(recipe, log=log), cache_dir, rebuild)


def cached_clip_path(
    recipe: Any,
    train: Callable[[], tuple[torch.nn.Module, list[float]]],
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    loss_steps: int = 20,
) -> Path:
    """Path of a trained CLIP's OpenAI-format ``.pt`` state dict in the cache (``trained_clip/<name>-<key>.pt``),
    trained by ``train`` and written on the first call (atomically: a temporary file renamed into place, so
    concurrent callers never read a partial file), then reused; a ``.json`` beside it records the recipe
    and the final training loss.

    Args:
        recipe: the training recipe (a dataclass with ``name`` and ``key()``).
        train: trains the CLIP: ``() -> (model, per-step losses)``.
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        rebuild: train again even if cached.
        loss_steps: the final loss recorded is the mean of this many last steps' losses.

    Returns:
        The ``.pt`` path.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / "trained_clip" / f"{recipe.name}-{recipe.key()}.pt"
    if target.is_file() and not rebuild:
        return target
    model, losses = train()
    target.parent.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"recipe": asdict(recipe), "final_loss": float(np.mean(losses[-loss_steps:]))}, indent=2)
    for path, write in ((target.with_suffix(".json"), lambda tmp: Path(tmp).write_text(record)),
                        (target, lambda tmp: torch.save(openai_state_dict(model), tmp))):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=target.parent)
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one, whole
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


@dataclass(frozen=True)
class TrainedClipFactory:
    """A picklable zero-argument factory ``() -> (model, preprocess, tokenizer)`` for the trained colour
    CLIP, loaded through the OpenAI-format path exactly as ``model=str(trained_clip_path())`` would."""

    recipe: ColourClipRecipe = COLOUR_RECIPE
    cache_dir: str | None = None

    def __call__(self):
        from ..backbones.clip_loading import load_openai_format

        return load_openai_format(trained_clip_path(self.recipe, self.cache_dir), "cpu", "fp32")
