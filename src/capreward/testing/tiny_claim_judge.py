"""A tiny trained judge that verifies claims about synthetic two-colour images, for offline tests.

Built on :mod:`capreward.testing.tiny_llava` (same tiny LLaVA, training loop and on-disk cache keyed by
the recipe and this module's source hash). Its world: an image of one background colour with a large
patch of another colour in one corner (:func:`claim_image`). Two facts hold about every image: the
background colour and the patch colour. The judge gives both sides of the claim reward
(:mod:`capreward.scorers.claims`):

- **verify** a claim (the precision side, :data:`~capreward.scorers.claims_prompts.VERIFY_TEMPLATE`):
  ``"yes"`` when the colour the claim names is in the image (as background or as patch: "the background
  is red", "a red ball", "there is a green patch"), ``"no"`` for a colour that is not and for claims
  naming no colour ("there is a ball"), and for a claim naming *several* colours (for one thing, "the
  background is blue red yellow", "there is a red green patch", or a run-on of two claims with no
  clause boundary, "the background is red there is a green patch": an atomic claim names one colour;
  a judge trained on one-colour claims only read such a list by its last colour, and GRPO learnt to
  write it, ``experiments/dense_claims.py``). A presence check, not a binding one: enough to tell a
  hallucinated colour from a seen one. Trained, it reads P(yes) > 0.99 for a claim naming a colour of
  the image and < 0.01 for one naming another colour, on images it never saw.
- **inventory** (the coverage side, :data:`~capreward.scorers.claims_prompts.INVENTORY_PROMPT`):
  ``"the background is {B}. there is a {P} patch."``, the image's two facts, read off the image. With
  ``ClaimScorer(inventory=True, coverage="lexical")`` they are the reference claims each caption is
  checked against (a caption that leaves the patch out covers half of them); with references given,
  the references are.

Not learned: the coverage question (:data:`~capreward.scorers.claims_prompts.COVERAGE_TEMPLATE`,
``coverage="judge"``: whether a *description* states a fact, a text-matching task this two-layer toy
did not learn within a CPU-minute budget: its P(yes) stayed at chance after 1,000 steps) and the judge
splitter (``splitter="judge"``); use ``coverage="lexical"`` and the rule-based splitter with it.

A caption of the toy task is a few such claims joined by ". " or " and "
(:func:`claim_caption`). :data:`CLAIM_RECIPE` trains it in 2,400 steps (about 5 minutes of one
busy CPU thread; the several-colour claims need twice the 1,200 steps of the one-colour judge).
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
from PIL import Image

from ..judges.prompts import llava_v1_conversation
from ..scorers.claims_prompts import INVENTORY_PROMPT, coverage_prompt, prompt_words, verify_prompt
from .tiny_llava import FLEUR_COLOURS, FLEUR_NOUNS, JudgeExample, JudgeRecipe, TinyLlavaSpec, load_tiny_judge, tiny_judge_dir

COLOURS: tuple[str, ...] = tuple(FLEUR_COLOURS)
NOUNS: tuple[str, ...] = FLEUR_NOUNS
CLAIM_WORDS = COLOURS + NOUNS + ("yes", "no", "a", "the", "is", "there", "patch", "background", "image", "in",
                                 "corner", "and", "photo", "of")
CORNERS = ("top left", "top right", "bottom left", "bottom right")


def claim_image(background: str, patch: str, rng: random.Random | None = None, corner: int | None = None) -> Image.Image:
    """A noisy image of ``background`` with a ``patch``-coloured rectangle covering a quarter of it in one
    corner (``corner`` 0..3, random by default). Deterministic for a given ``rng`` state."""
    if background == patch:
        raise ValueError("the patch must differ from the background")
    rng = rng or random.Random(f"claim-image-{background}-{patch}")
    width, height = rng.randint(28, 44), rng.randint(28, 44)
    nprng = np.random.default_rng(rng.getrandbits(32))
    pixels = np.array(FLEUR_COLOURS[background], dtype=np.float64) + nprng.normal(0.0, 14.0, size=(height, width, 3))
    corner = rng.randrange(4) if corner is None else corner
    ph, pw = height // 2, width // 2
    y = 0 if corner < 2 else height - ph
    x = 0 if corner % 2 == 0 else width - pw
    pixels[y : y + ph, x : x + pw] = np.array(FLEUR_COLOURS[patch], dtype=np.float64)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="RGB")


def background_claim(colour: str, rng: random.Random) -> str:
    """A claim about the background colour, in one of several forms."""
    noun = rng.choice(NOUNS)
    return rng.choice([f"the background is {colour}", f"a {colour} image", f"the image is {colour}",
                       f"a {colour} {noun}", f"the {noun} is {colour}"])


def patch_claim(colour: str, rng: random.Random) -> str:
    """A claim about the patch colour, in one of several forms."""
    return rng.choice([f"there is a {colour} patch", f"a {colour} patch", f"the patch is {colour}",
                       f"a {colour} patch in the corner"])


def empty_claim(rng: random.Random) -> str:
    """A claim naming no colour (the judge cannot verify it: "no")."""
    noun = rng.choice(NOUNS)
    return rng.choice([f"there is a {noun}", f"a photo of a {noun}", f"the {noun}", "a photo"])


def claim_caption(claims: list[str], rng: random.Random | None = None) -> str:
    """Claims joined into a caption: sentences ("... . ...") or a conjunction ("... and ...")."""
    if rng is not None and len(claims) == 2 and rng.random() < 0.3:
        return f"{claims[0]} and {claims[1]}."
    return ". ".join(claims) + "."


def _other(colour: str, rng: random.Random, *avoid: str) -> str:
    return rng.choice([c for c in COLOURS if c != colour and c not in avoid])


def _image(rng: random.Random) -> tuple[str, str, Image.Image]:
    background = rng.choice(COLOURS)
    patch = _other(background, rng)
    return background, patch, claim_image(background, patch, rng)


def _claim(colour: str, rng: random.Random) -> str:
    return background_claim(colour, rng) if rng.random() < 0.55 else patch_claim(colour, rng)


def colour_list(background: str, patch: str, rng: random.Random) -> list[str]:
    """2-5 colour words for one thing, ending (mostly) on a colour of the image: the run-on lists a
    policy writes to game a judge that reads a claim by its last colour ("blue red blue red yellow")."""
    n = rng.randint(2, 5)
    pool = list(COLOURS) if rng.random() < 0.5 else [background, patch, rng.choice(COLOURS)]
    out = [rng.choice(pool) for _ in range(n - 1)]
    if rng.random() < 0.3 and n >= 4:  # a repeated pair, as "blue red blue red"
        out[2:4] = out[0:2]
    last = rng.choice([background, patch]) if rng.random() < 0.8 else rng.choice(COLOURS)
    out.append(last)
    if len(set(out)) == 1:  # one colour said twice is still two colour words for one thing
        out[0] = _other(last, rng)
    return out


def multi_colour_claim(background: str, patch: str, rng: random.Random) -> str:
    """A claim naming several colours for one thing ("the background is blue red yellow", "there is a
    red green patch", "the background is blue red blue red yellow patch"), or a run-on of a background
    and a patch claim with no clause boundary: not one atomic claim, the judge answers "no"."""
    colours = " ".join(colour_list(background, patch, rng))
    noun = rng.choice(NOUNS)
    roll = rng.random()
    if roll < 0.15:
        first = rng.choice([background, patch]) if rng.random() < 0.5 else rng.choice(COLOURS)
        return f"the background is {first} there is a {rng.choice([background, patch])} patch"
    return rng.choice([f"the background is {colours}", f"there is a {colours} patch", f"a {colours} patch",
                       f"the background is {colours} patch", f"the patch is {colours}", f"a {colours} {noun}",
                       f"the {noun} is {colours}", f"a {colours} image"])


def verify_example(rng: random.Random) -> JudgeExample:
    """A verification prompt about a random image: 46% claims naming one colour of the image ("yes");
    "no" for a claim naming one colour not in it (34%), no colour (8%), or several colours (12%: for one
    thing, or a run-on of two claims, :func:`multi_colour_claim`; an atomic claim names one colour)."""
    background, patch, image = _image(rng)
    roll = rng.random()
    if roll < 0.46:
        claim, answer = _claim(rng.choice([background, patch]), rng), "yes"
    elif roll < 0.80:
        claim, answer = _claim(_other(background, rng, patch), rng), "no"
    elif roll < 0.88:
        claim, answer = empty_claim(rng), "no"
    else:
        claim, answer = multi_colour_claim(background, patch, rng), "no"
    return JudgeExample(image, llava_v1_conversation([(verify_prompt(claim), None)]), answer)


def coverage_example(rng: random.Random) -> JudgeExample:
    """A coverage prompt: a fact and a description of 1-3 claims; "yes" when the description names the
    fact's colour."""
    _, _, image = _image(rng)
    named = rng.sample(COLOURS, rng.randint(1, 2))
    claims = [_claim(c, rng) for c in named]
    if rng.random() < 0.25:
        claims.insert(rng.randrange(len(claims) + 1), empty_claim(rng))
    caption = claim_caption(claims, rng)
    colour = rng.choice(named) if rng.random() < 0.5 else rng.choice([c for c in COLOURS if c not in named])
    answer = "yes" if colour in named else "no"
    return JudgeExample(image, llava_v1_conversation([(coverage_prompt(caption, _claim(colour, rng)), None)]), answer)


def inventory_answer(background: str, patch: str) -> str:
    """The judge's inventory of an image."""
    return f"the background is {background}. there is a {patch} patch."


def inventory_example(rng: random.Random) -> JudgeExample:
    background, patch, image = _image(rng)
    return JudgeExample(image, llava_v1_conversation([(INVENTORY_PROMPT, None)]), inventory_answer(background, patch))


def sample_claim_example(rng: random.Random) -> JudgeExample:
    """One training example: inventory (25%) or verify (75%). (:func:`coverage_example` is not in the
    mix: the toy did not learn it within the budget, and it slowed the verification down.)"""
    if rng.random() < 0.25:
        return inventory_example(rng)
    return verify_example(rng)


_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]

#: The claim judge (the recipe name carries a hash of this module: editing the task retrains it).
CLAIM_RECIPE = JudgeRecipe(
    name=f"claims-{_SOURCE_HASH}",
    sampler=sample_claim_example,
    spec=TinyLlavaSpec(words=tuple(dict.fromkeys(tuple(prompt_words()) + CLAIM_WORDS)), init_std=0.1),
    steps=2400,
    batch_size=16,
    lr=4e-3,
)


def tiny_claim_judge_dir(cache_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Directory of the trained claim judge (trained on first use, a few minutes of CPU, then cached)."""
    return tiny_judge_dir(CLAIM_RECIPE, cache_dir, log=log)


def tiny_claim_judge(cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, processor)`` of the trained claim judge; wrap it in ``LocalChatJudge`` for
    :class:`~capreward.scorers.claims.ClaimScorer`."""
    return load_tiny_judge(CLAIM_RECIPE, cache_dir, dtype)


if __name__ == "__main__":  # python -m capreward.testing.tiny_claim_judge: train (or find) it and say where
    print(tiny_claim_judge_dir(log=print))
