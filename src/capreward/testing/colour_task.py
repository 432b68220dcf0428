"""A toy captioning task on which caption rewards mean something, for the demo, tests and experiments.

With the colour-trained tiny CLIP (:mod:`capreward.testing.trained_clip`), a caption naming a visual's
colour scores high and one naming another colour scores low. This module provides:

- foils on real footage: :func:`tint` colours every frame of a clip, :func:`colour_foils` pairs each
  tinted clip with its true caption ("a red image.") and a foil that swaps the colour word;
  :func:`synthetic_clips` makes footage-like clips in memory when no sample clips are at hand;
- a GRPO task for a tiny LLaVA policy: images of one solid colour (:func:`colour_rows`), the prompt
  :data:`PROMPT` in TRL's conversational format (:func:`grpo_dataset`), and a short SFT
  (:func:`sft_random_colours`) that teaches the answer format "a <colour> image" with colours drawn
  independently of the image, so GRPO groups start with reward variance and chance-level correctness;
- :func:`clean_colour` and :func:`right_colour` to check a caption against the truth (a caption counts
  as right only when it is a clean caption of the task: exactly "a <colour> image", no repeats, no junk
  tokens), and :class:`EmptyIsWorst` to give unscorable completions a floor instead of None.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from .trained_clip import COLOURS

#: The colours of the GRPO task (a subset of :data:`~capreward.testing.trained_clip.COLOURS`).
TASK_COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow")
PROMPT = "Describe the image"
#: Words the tiny LLaVA policy's vocabulary needs for the task.
WORDS: tuple[str, ...] = ("a", "image", "Describe", "the") + TASK_COLOURS


# ------------------------------------------------------------------------------------------ foils
def tint(frames: np.ndarray, colour: str, alpha: float = 0.7) -> np.ndarray:
    """``frames`` (uint8, any shape ending in 3 channels) blended towards ``colour``'s RGB:
    ``alpha * colour + (1 - alpha) * frame``, as uint8."""
    rgb = np.array(COLOURS[colour], dtype=np.float64)
    return np.clip(alpha * rgb + (1 - alpha) * frames.astype(np.float64), 0, 255).astype(np.uint8)


@dataclass
class ColourFoils:
    """Tinted clips with one true caption and one colour foil each (parallel lists), plus calibration
    captions (also true, differently worded) for :meth:`HallucinationPenalty.calibrate`."""

    videos: list[np.ndarray]
    names: list[str]
    colours: list[str]
    truth: list[str]
    foils: list[str]
    foil_colours: list[str]
    calibration: list[str]


def synthetic_clips(frames: int = 10, height: int = 120, width: int = 160, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """Two clips synthesised in memory, for the demo when the sample clips are absent (an installed
    wheel has no ``../shared``): uint8 arrays (``frames``, ``height``, ``width``, 3) of grey, textured
    content that moves (diagonal stripes drifting over noise; a bright disc crossing a dark, noisy
    background), and their names. Deterministic for ``seed``; colour comes only from :func:`tint`."""
    if frames < 1 or height < 8 or width < 8:
        raise ValueError(f"need frames >= 1 and a frame of at least 8x8, got {frames} frames of {height}x{width}")
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    stripes, disc = [], []
    for t in range(frames):
        phase = t / max(frames, 2)
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * ((x + y) / 24.0 - phase))
        stripes.append(60 + 150 * wave + rng.normal(0, 10, (height, width)))
        cx, cy, r = width * (0.2 + 0.6 * phase), height * 0.5, min(height, width) * 0.22
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
        disc.append(np.where(inside, 220.0, 40.0) + rng.normal(0, 12, (height, width)))
    clips = [np.repeat(np.clip(np.stack(c), 0, 255).astype(np.uint8)[..., None], 3, axis=-1) for c in (stripes, disc)]
    return clips, ["stripes (synthetic)", "disc (synthetic)"]


def colour_foils(clips: Sequence[np.ndarray], names: Sequence[str] | None = None, colours: Sequence[str] = TASK_COLOURS) -> ColourFoils:
    """Every clip of ``clips`` (decoded uint8 frames) tinted with every colour of ``colours``; the true
    caption "a <colour> image.", the foil naming the next colour of the list, and the calibration
    caption "a <colour> picture.". Calibration captions name the colour first: this CLIP knows only
    colour words, and under its causal text tower a word before the colour has not seen it."""
    names = list(names) if names is not None else [f"clip{i}" for i in range(len(clips))]
    out = ColourFoils([], [], [], [], [], [], [])
    for base, name in zip(clips, names):
        for k, c in enumerate(colours):
            foil = colours[(k + 1) % len(colours)]
            out.videos.append(tint(base, c))
            out.names.append(name)
            out.colours.append(c)
            out.truth.append(f"a {c} image.")
            out.foils.append(f"a {foil} image.")
            out.foil_colours.append(foil)
            out.calibration.append(f"a {c} picture.")
    return out


#: The task's one caption form, as the policy's SFT writes it: "a <colour> image" (a final period allowed).
CLEAN_FORM = re.compile(r"a ([a-z]+) image\.?")


def clean_colour(caption: str) -> str | None:
    """The colour word of a *clean* caption of the task, else None.

    Clean means exactly the task's form :data:`CLEAN_FORM`, "a <colour> image" with one colour of
    :data:`~capreward.testing.trained_clip.COLOURS` (case ignored, a final period and surrounding
    white space allowed): no repeated words ("a blue blue blue blue blue"), no junk tokens ("a red5 red
    image", "a& green image"), nothing cut off ("a red"), nothing added. A caption that names the right
    colour in a malformed sentence is not an answer a reader would accept, so it is not counted right.

    Args:
        caption: the caption as decoded.

    Returns:
        The colour, or None when the caption is not a clean caption of the task.
    """
    match = CLEAN_FORM.fullmatch(caption.strip().lower())
    return match.group(1) if match and match.group(1) in COLOURS else None


def right_colour(caption: str, colour: str) -> bool:
    """True when ``caption`` is a clean caption of the task (:func:`clean_colour`) naming ``colour``."""
    return clean_colour(caption) == colour


def names_colour(caption: str, colour: str) -> bool:
    """The lenient reading: ``caption`` names ``colour`` and no other colour of :data:`COLOURS`, however
    malformed the rest ("a blue blue blue blue blue" names blue). Shown beside :func:`right_colour` to
    tell junk from wrong answers, never counted as right."""
    named = {w.strip(".,!?") for w in caption.lower().split()} & set(COLOURS)
    return named == {colour}


# ------------------------------------------------------------------------------------------- GRPO
def colour_rows(n: int, seed: int, colours: Sequence[str] = TASK_COLOURS) -> list[dict[str, Any]]:
    """``n`` examples cycling through ``colours``: {"colour", "image"} (a PIL image, see
    :func:`~capreward.testing.trained_clip.colour_image`). Deterministic for ``seed``."""
    from .trained_clip import colour_image

    rng = random.Random(seed)
    return [{"colour": c, "image": colour_image(c, rng)} for c in (colours[i % len(colours)] for i in range(n))]


def grpo_dataset(rows: Sequence[dict[str, Any]], keep_colour: bool = False) -> Any:
    """TRL's conversational VLM format: a user turn with :data:`PROMPT`, and the image (and, with
    ``keep_colour``, the true ``colour``, which TRL passes on to the rewards)."""
    from .._extras import require

    Dataset = require("demo", "datasets", used_by="the demo's GRPO task").Dataset

    def record(r):
        out = {"prompt": [{"role": "user", "content": PROMPT}], "image": r["image"]}
        if keep_colour:
            out["colour"] = r["colour"]
        return out

    return Dataset.from_list([record(r) for r in rows])


def prompt_text(processor: Any) -> str:
    """The prompt exactly as TRL renders it for the policy (chat template + generation prompt)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def sft_random_colours(model: Any, processor: Any, steps: int, seed: int, batch_size: int = 16, lr: float = 3e-3) -> float:
    """Teach the policy the answer format "a <colour> image" with a colour drawn independently of the
    image (so it cannot learn which colour is right). Returns the final loss (about ln 4 = 1.39 per
    colour token when the colours are uniform). Leaves the model in eval mode."""
    return sft_colours(model, processor, steps, seed, label=random_label, batch_size=batch_size, lr=lr)


#: The weak labels' colour families: an annotator who only tells warm from cool.
FAMILIES: dict[str, tuple[str, str]] = {"red": ("red", "yellow"), "yellow": ("red", "yellow"),
                                        "green": ("green", "blue"), "blue": ("green", "blue")}


def random_label(colour: str, rng: random.Random) -> str:
    """Any task colour, whatever the image (teaches the format only)."""
    return rng.choice(TASK_COLOURS)


def weak_label(colour: str, rng: random.Random) -> str:
    """A weak label: a colour of the image's family (:data:`FAMILIES`: warm red/yellow, cool green/blue)
    drawn at random, so the label is right half the time and never names the other family. A policy
    fitted to these labels attends to the image (warm or cool) but, within the family, can do no better
    than half right however long it trains on them."""
    return rng.choice(FAMILIES[colour])


def true_label(colour: str, rng: random.Random) -> str:
    """The image's colour."""
    return colour


def sft_colours(
    model: Any, processor: Any, steps: int, seed: int, label: Any = weak_label, batch_size: int = 16, lr: float = 3e-3,
) -> float:
    """Supervised fine-tuning on "a <colour> image", the colour given by ``label(image colour, rng)``
    (:func:`random_label`, :func:`weak_label` or :func:`true_label`), ``batch_size`` images of a pool of
    64 per step (AdamW, constant ``lr``). Returns the final loss; leaves the model in eval mode.
    Deterministic for ``seed``."""
    return sft_answers(model, processor, colour_rows(64, seed + 1000), lambda b, rng: f"a {label(b['colour'], rng)} image",
                       steps, seed, batch_size, lr)


def sft_answers(
    model: Any,
    processor: Any,
    rows: Sequence[dict[str, Any]],
    answer: Callable[[dict[str, Any], random.Random], str],
    steps: int,
    seed: int,
    batch_size: int = 16,
    lr: float = 3e-3,
) -> float:
    """Supervised fine-tuning of a policy on its prompt (:func:`prompt_text`) followed by
    ``answer(row, rng)``: ``batch_size`` rows drawn from ``rows`` per step (AdamW, constant ``lr``), only the
    answers learned. Deterministic for ``seed``.

    Args:
        model: the policy (a LLaVA-style VLM).
        processor: its processor (left padding).
        rows: the training rows, each with an ``"image"``.
        answer: the target answer of a row (the end of sequence is appended).
        steps: optimiser steps.
        seed: seeds the draws of rows and what ``answer`` draws.
        batch_size: rows per step.
        lr: the learning rate.

    Returns:
        The final loss; the model is left in eval mode.
    """
    import torch

    rng = random.Random(seed)
    prompt = prompt_text(processor)
    n_prompt = processor(images=[rows[0]["image"]], text=[prompt], return_tensors="pt")["input_ids"].shape[1]
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = [rng.choice(rows) for _ in range(batch_size)]
        texts = [f"{prompt} {answer(b, rng)}</s>" for b in batch]
        enc = processor(images=[b["image"] for b in batch], text=texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        width = labels.shape[1]
        for i, n in enumerate(enc["attention_mask"].sum(1).tolist()):  # left padding: a row ends at the last column
            labels[i, : width - (n - n_prompt)] = -100  # padding and prompt: only the answer is learned
        out = model(**enc, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        loss = out.loss.detach()
    model.eval()
    return float(loss)


class WrappedReward:
    """Base of TRL reward wrappers: keeps the wrapped reward's ``__name__`` and exposes its
    ``components`` and ``guards`` (so the GRPO recipe's trajectory finds its log keys)."""

    def __init__(self, reward: Any):
        self.reward = reward
        self.__name__ = reward.__name__

    @property
    def components(self):
        return getattr(self.reward, "components", ())

    @property
    def guards(self):
        return getattr(self.reward, "guards", None)


class EmptyIsWorst(WrappedReward):
    """A TRL reward wrapping ``reward``: samples it cannot score (e.g. empty captions, which CLIP-S
    refuses) get ``floor`` instead of None. TRL gives unscorable samples zero advantage, so without
    this a policy drifting towards empty answers would never be pushed back."""

    def __init__(self, reward: Any, floor: float = -1.0):
        super().__init__(reward)
        self.floor = floor

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        values = self.reward(prompts, completions, completion_ids, **kwargs)
        return [self.floor if v is None else v for v in values]


class ColourTally(WrappedReward):
    """A TRL reward wrapper that records, per call (one per GRPO step), the share of completions that are
    clean captions naming the row's colour (dataset column ``colour``; :func:`right_colour`) and their
    mean length in words."""

    def __init__(self, reward: Any):
        super().__init__(reward)
        self.right: list[float] = []
        self.words: list[float] = []

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        from ..rewards import completion_text

        texts = [completion_text(c) for c in completions]
        self.right.append(sum(map(right_colour, texts, kwargs["colour"])) / len(texts))
        self.words.append(sum(len(t.split()) for t in texts) / len(texts))
        return self.reward(prompts, completions, completion_ids, **kwargs)


class TruthReward:
    """Ground truth as a TRL reward, for experiments that compare a reward with the truth it stands for:
    1.0 for a clean caption of the row's colour (dataset column ``colour``; :func:`right_colour`), else 0.0."""

    __name__ = "truth"

    def __call__(self, prompts, completions, completion_ids=None, colour=(), **kwargs):
        from ..rewards import completion_text

        return [float(right_colour(completion_text(c), k)) for c, k in zip(completions, colour)]


# ------------------------------------------------------------------------------------- evaluation
@dataclass
class ColourEval:
    """A policy's captions of held-out images (parallel to ``colours``): one greedy caption each and
    ``samples`` captions sampled at temperature 1 each."""

    colours: list[str]
    greedy: list[str]
    sampled: list[list[str]]

    @property
    def greedy_right(self) -> float:
        """Share of greedy captions that are clean captions of the image's colour (:func:`right_colour`)."""
        return sum(map(right_colour, self.greedy, self.colours)) / len(self.colours)

    @property
    def sampled_right(self) -> float:
        """Share of sampled captions that are clean captions of the image's colour."""
        return sum(right_colour(c, colour) for c, colour in self._sampled_pairs()) / max(1, len(self._sampled_pairs()))

    @property
    def greedy_malformed(self) -> float:
        """Share of greedy captions that are not clean captions of the task (:func:`clean_colour` None)."""
        return sum(clean_colour(g) is None for g in self.greedy) / len(self.greedy)

    @property
    def sampled_malformed(self) -> float:
        """Share of sampled captions that are not clean captions of the task."""
        pairs = self._sampled_pairs()
        return sum(clean_colour(c) is None for c, _ in pairs) / max(1, len(pairs))

    def _sampled_pairs(self) -> list[tuple[str, str]]:
        return [(c, colour) for caps, colour in zip(self.sampled, self.colours) for c in caps]

    def per_colour(self) -> dict[str, tuple[str, float]]:
        """Image colour -> (its most frequent greedy caption, the share of its greedy captions naming it right)."""
        from collections import Counter

        out = {}
        for colour in dict.fromkeys(self.colours):
            caps = [g for g, c in zip(self.greedy, self.colours) if c == colour]
            out[colour] = (Counter(caps).most_common(1)[0][0], sum(right_colour(c, colour) for c in caps) / len(caps))
        return out


def caption_colours(model: Any, processor: Any, rows: Sequence[dict[str, Any]], samples: int = 4, seed: int = 0,
                    max_new_tokens: int = 6) -> ColourEval:
    """Caption ``rows`` (:func:`colour_rows`) with ``model``: greedily, and ``samples`` times each at
    temperature 1 (no top-k/top-p), at most ``max_new_tokens`` tokens, the prompt as TRL renders it.
    Deterministic for ``seed``; restores the model's train/eval mode and leaves the global RNG as it was."""
    import torch

    prompt = prompt_text(processor)
    images = [r["image"] for r in rows]
    was_training = model.training
    model.eval()
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            enc = processor(images=images, text=[prompt] * len(images), return_tensors="pt", padding=True)
            n = enc["input_ids"].shape[1]
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
            greedy = processor.batch_decode(out[:, n:], skip_special_tokens=True)
            many = processor(images=[im for im in images for _ in range(samples)], text=[prompt] * (len(images) * samples),
                             return_tensors="pt", padding=True)
            out = model.generate(**many, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)
            flat = processor.batch_decode(out[:, n:], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return ColourEval(
        colours=[r["colour"] for r in rows],
        greedy=[g.strip() for g in greedy],
        sampled=[[c.strip() for c in flat[i * samples:(i + 1) * samples]] for i in range(len(images))],
    )


# ----------------------------------------------------------------------------------- tiny policy
def tiny_caption_policy(seed: int = 0, sft_steps: int = 80, labels: str = "weak") -> tuple[Any, Any]:
    """``(model, processor)``: a tiny LLaVA captioner (:func:`~capreward.testing.build_tiny_llava`, vocabulary
    :data:`WORDS`) fine-tuned in memory for ``sft_steps`` steps (seconds on a CPU) to caption colour images
    (:func:`colour_rows`) "a <colour> image" when prompted with :data:`PROMPT` in TRL's conversational
    format: a policy to start an offline GRPO script from (an untrained one says nothing the rewards can
    grade). ``labels`` picks what it learned: ``"weak"`` (:func:`weak_label`: it attends to the image and is
    right about half the time: a start RL can sharpen), ``"true"`` (:func:`true_label`) or ``"random"``
    (:func:`random_label`: the format only, image-blind). Deterministic for ``seed``; in eval mode.

    Args:
        seed: the seed of the weights and the fine-tuning data.
        sft_steps: fine-tuning steps.
        labels: ``"weak"``, ``"true"`` or ``"random"`` (above).

    Returns:
        ``(model, processor)``.

    Raises:
        ValueError: for an unknown ``labels``.

    Examples:
        >>> from capreward.testing import tiny_caption_policy
        >>> model, processor = tiny_caption_policy(sft_steps=2)
        >>> # GRPOTrainer(model=model, processing_class=processor, train_dataset=grpo_dataset(colour_rows(32, 0)), ...)
    """
    import torch

    from .tiny_llava import TinyLlavaSpec, build_tiny_llava

    labellers = {"weak": weak_label, "true": true_label, "random": random_label}
    if labels not in labellers:
        raise ValueError(f"labels must be one of {sorted(labellers)}, got {labels!r}")
    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=seed))
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        sft_colours(model, processor, sft_steps, seed, label=labellers[labels])
    return model, processor
