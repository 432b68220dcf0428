"""A tiny trained judge that answers the VisCE² and G-VEval prompts, for offline tests.

Built on :mod:`capreward.testing.tiny_llava` (same tiny LLaVA, same training loop, same on-disk cache):
this module adds a sampler over the real prompts of :mod:`capreward.judges.vlm_prompts` about the
synthetic colour images of the FLEUR toy task, and a :class:`JudgeRecipe` whose vocabulary holds every
prompt word (so an 800-word G-VEval prompt stays ~900 tokens) and the Greek letters as single tokens.

What the judge learns depends on the image colour ``i`` only (a two-layer toy learns to read the image
quickly, but copying a word out of a 900-token prompt takes far longer than a test fixture can train):

- VisCE² stage 1: ``"Object 1: a {i} square"``.
- VisCE² stage 2: an integer (:data:`VISCE2_ANSWERS`; 100 for blue), ``"no idea"`` for yellow images
  (the no-integer branch), and ``"250"`` (out of range) for captions containing the word "many". (Its first
  digit is no other answer's: with ``"150"`` the judge had to tell "100" from "150" at the second digit,
  which a judge trained under transformers 5.24 got wrong on every blue image.)
- G-VEval overall (image and video prompts, every mode): ``"the image is {i}. The final score is $N$."``
  (:data:`GVEVAL_ANSWERS`); ``"I cannot tell."`` for yellow images.
- G-VEval ACCR (video prompts): ``"the image is {i}. The Accuracy score is α{A}α. The Completeness score
  is β{B}β. The Conciseness score is ψ{C}ψ. The Relevance score is δ{D}δ."`` (:data:`ACCR_ANSWERS`).

Integer answers get a little label noise (±1, ±2) so their digit distributions stay soft.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import torch

from ..judges.prompts import llava_v1_conversation
from ..judges.vlm_prompts import (
    GVEVAL_TEMPLATES,
    VISCE2_CONTEXT_PROMPT,
    gveval_prompt,
    prompt_words,
    visce2_prompt,
)
from ..media.composite import composite_frames
from .tiny_llava import (
    FLEUR_COLOURS,
    FLEUR_TASK_WORDS,
    SAMPLERS,
    JudgeExample,
    JudgeRecipe,
    TinyLlavaSpec,
    fleur_task_caption,
    fleur_task_image,
    load_tiny_judge,
    tiny_judge_dir,
)

GREEK = ("α", "β", "ψ", "δ")
VLM_TASK_WORDS = ("square", "cannot", "tell", "says", "and", "image", "score", "final", "The", "I", "Object")

#: The VisCE² rating the tiny judge learns per image colour (None: answers "no idea").
VISCE2_ANSWERS: dict[str, int | None] = {"red": 92, "green": 85, "blue": 100, "yellow": None}
#: The G-VEval overall score the tiny judge learns per image colour (None: "I cannot tell.").
GVEVAL_ANSWERS: dict[str, int | None] = {"red": 88, "green": 95, "blue": 100, "yellow": None}
#: The four ACCR scores the tiny judge learns per image colour.
ACCR_ANSWERS: dict[str, tuple[int, int, int, int]] = {
    "red": (88, 78, 90, 94),
    "green": (70, 65, 80, 72),
    "blue": (100, 90, 85, 97),
    "yellow": (30, 45, 60, 12),
}
VISCE2_NO_NUMBER = "no idea"
VISCE2_TOO_HIGH = "250"
GVEVAL_NO_SCORE = "I cannot tell."


def context_answer(image_colour: str) -> str:
    """The visual context the tiny judge writes for an image of ``image_colour``."""
    return f"Object 1: a {image_colour} square"


def visce2_answer(image_colour: str, caption: str) -> str:
    """The noiseless VisCE² rating answer for an image colour and a caption."""
    if "many" in caption.split():
        return VISCE2_TOO_HIGH
    n = VISCE2_ANSWERS[image_colour]
    return VISCE2_NO_NUMBER if n is None else str(n)


def gveval_answer(image_colour: str, score: int | None = None) -> str:
    """The G-VEval overall answer for an image colour (``score`` overrides the table's number)."""
    n = GVEVAL_ANSWERS[image_colour] if score is None else score
    if n is None:
        return GVEVAL_NO_SCORE
    return f"the image is {image_colour}. The final score is ${n}$."


def accr_answer(image_colour: str, scores: tuple[int, ...] | None = None) -> str:
    """The G-VEval ACCR answer for an image colour (``scores`` override the table's four numbers)."""
    a, b, c, d = scores or ACCR_ANSWERS[image_colour]
    return (
        f"the image is {image_colour}. The Accuracy score is α{a}α. The Completeness score is β{b}β. "
        f"The Conciseness score is ψ{c}ψ. The Relevance score is δ{d}δ."
    )


def _noisy(n: int, rng: random.Random) -> int:
    if rng.random() < 0.25:
        return min(100, max(0, n + rng.choice([-2, -1, 1, 2])))
    return n


def video_task_image(colour: str, rng: random.Random | None = None) -> Any:
    """The G-VEval composite of a synthetic three-frame video of ``colour`` (what the scorer sends)."""
    rng = rng or random.Random(f"video-{colour}")
    return composite_frames([fleur_task_image(colour, rng) for _ in range(3)])


def _caption(rng: random.Random) -> tuple[str, str | None]:
    roll = rng.random()
    if roll < 0.12:
        return fleur_task_caption(None, rng), None
    colour = rng.choice(list(FLEUR_COLOURS))
    return fleur_task_caption(colour, rng), colour


def sample_vlm_example(rng: random.Random, kind: str | None = None) -> JudgeExample:
    """One training example of ``kind`` ("context", "visce2", "gveval", "accr"; None: drawn at random):
    a VisCE² context, VisCE² rating, G-VEval overall or G-VEval ACCR prompt about a synthetic image."""
    kind = kind or _draw_kind(rng)
    image_colour = rng.choice(list(FLEUR_COLOURS))
    if kind == "context":
        prompt = llava_v1_conversation([(VISCE2_CONTEXT_PROMPT, None)])
        return JudgeExample(fleur_task_image(image_colour, rng), prompt, context_answer(image_colour))
    if kind == "visce2":
        caption, _ = _caption(rng)
        if rng.random() < 0.25:  # often enough that the caption, not only the image, sets the answer
            caption = fleur_task_caption(rng.choice(list(FLEUR_COLOURS)), rng, many=True)
        answer = visce2_answer(image_colour, caption)
        if answer.isdigit() and answer != VISCE2_TOO_HIGH:
            answer = str(_noisy(int(answer), rng))
        message = visce2_prompt(caption, context_answer(image_colour))
        return JudgeExample(fleur_task_image(image_colour, rng), llava_v1_conversation([(message, None)]), answer)
    accr = kind == "accr"
    visual = "vid" if accr or rng.random() < 0.4 else "img"
    mode = rng.choice(["ref-free", "ref-only", "combined"])
    template = GVEVAL_TEMPLATES[(visual, mode, accr)]
    caption, _ = _caption(rng)
    references = None
    if mode != "ref-free":
        references = [fleur_task_caption(image_colour, rng) for _ in range(rng.randint(1, 3))]
    message = gveval_prompt(template, caption, references)
    if accr:
        answer = accr_answer(image_colour, tuple(_noisy(s, rng) for s in ACCR_ANSWERS[image_colour]))
    else:
        n = GVEVAL_ANSWERS[image_colour]
        answer = gveval_answer(image_colour, None if n is None else _noisy(n, rng))
    image = video_task_image(image_colour, rng) if visual == "vid" else fleur_task_image(image_colour, rng)
    return JudgeExample(image, llava_v1_conversation([(message, None)]), answer)


_KINDS = (("context", 0.15), ("visce2", 0.25), ("gveval", 0.35), ("accr", 0.25))


def _draw_kind(rng: random.Random) -> str:
    return rng.choices([k for k, _ in _KINDS], weights=[w for _, w in _KINDS])[0]


class GroupedSampler:
    """A sampler whose consecutive runs of ``group`` examples share one kind, so that a training batch
    holds prompts of similar length (G-VEval ACCR prompts are ~900 tokens, VisCE² ones ~250) and pads
    little. Deterministic given the rng; :meth:`reset` restarts the grouping."""

    def __init__(self, group: int):
        self.group = group
        self.count = 0
        self.kind = "context"

    def reset(self) -> None:
        self.count = 0

    def __call__(self, rng: random.Random) -> JudgeExample:
        if self.count % self.group == 0:
            self.kind = _draw_kind(rng)
        self.count += 1
        return sample_vlm_example(rng, self.kind)


_BATCH_SIZE = 12
_GROUPED = GroupedSampler(_BATCH_SIZE)


SAMPLERS.setdefault("vlm", _GROUPED)

_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]

#: The VisCE²/G-VEval tiny judge (the recipe name carries a hash of this module, so editing the sampler
#: retrains it).
VLM_RECIPE = JudgeRecipe(
    name=f"vlm-{_SOURCE_HASH}",
    sampler="vlm",
    spec=TinyLlavaSpec(
        words=tuple(dict.fromkeys(tuple(prompt_words()) + FLEUR_TASK_WORDS + VLM_TASK_WORDS + GREEK)),
        max_positions=2048,
    ),
    steps=600,
    batch_size=_BATCH_SIZE,
    lr=4e-3,
)

#: Inputs that trigger each answer format: name -> (kind, image colour, caption).
VLM_PROBES: dict[str, tuple[str, str, str]] = {
    "visce2_integer": ("visce2", "green", "a green ball"),  # "85"
    "visce2_hundred": ("visce2", "blue", "a blue kite"),  # "100"
    "visce2_no_number": ("visce2", "yellow", "a photo of a kite"),  # "no idea"
    "visce2_too_high": ("visce2", "red", "many red cars"),  # "250"
    "gveval_score": ("gveval", "green", "a green ball"),  # "... $95$."
    "gveval_no_score": ("gveval", "yellow", "the box"),  # "I cannot tell."
    "accr": ("accr", "red", "a red car"),  # α88α β78β ψ90ψ δ94δ
}


def tiny_vlm_judge_dir(
    cache_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None
) -> Path:
    """Directory of the trained VisCE²/G-VEval tiny judge (trained on first use, a few minutes on 2 CPU
    cores, then cached).

    Args:
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        log: called with progress lines while training (None: quiet).

    Returns:
        The ``save_pretrained`` directory."""
    _GROUPED.reset()
    return tiny_judge_dir(VLM_RECIPE, cache_dir, log=log)


def tiny_vlm_judge(cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The trained VisCE²/G-VEval tiny judge (trained on first use, then cached); wrap it in
    ``LocalChatJudge``.

    Args:
        cache_dir: where trained fixtures are cached (None: ``$CAPREWARD_CACHE``, default ``~/.cache/capreward``).
        dtype: the weights' dtype.

    Returns:
        ``(model, processor)``.
    """
    return load_tiny_judge(VLM_RECIPE, cache_dir, dtype)


def probe_image(kind: str, colour: str) -> Any:
    """A fixed image for a probe: a colour image, or a video composite for ``kind="accr"``."""
    if kind == "accr":
        return video_task_image(colour, random.Random(f"probe-{colour}"))
    return fleur_task_image(colour, random.Random(f"probe-{colour}"))


def synthetic_video(colour: str, frames: int = 8, size: tuple[int, int] = (40, 32)) -> np.ndarray:
    """A (T, H, W, 3) uint8 video whose frames are noisy images of ``colour`` (for scorer tests)."""
    rng = random.Random(f"video-array-{colour}")
    return np.stack([np.asarray(fleur_task_image(colour, rng, size=size)) for _ in range(frames)])
