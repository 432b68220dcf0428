"""Tiny CLIPs *trained* on the scenes world (:mod:`scenes_world.world`), for the scenes experiment
and its tests: a reward model A and, trained apart, a held-out model B.

The architecture is the tiny OpenAI-format CLIP of :mod:`capreward.testing.tiny_clip` with a finer image
patch (4 px on a 32 px input, :data:`SCENE_CLIP_CONFIG`) so that a shape in one cell of the 2x2 grid
covers several patches. Training follows :mod:`capreward.testing.trained_clip` (its token-embedding
readout and multi-positive contrastive loss), with hard negatives:

- image -> text: each image against the batch's true captions *and hard negatives* of every image
  (:func:`~scenes_world.world.hard_negative`, ``negatives`` kinds drawn per image of: count,
  binding, missing, extra, colour and shape swaps); any caption whose content equals the image's scene counts as a positive;
- text -> image: each true caption against the batch's images;
- token level: the embedding of each colour and shape word of the true captions *at its position*, and
  of each such word encoded alone, against every image of the batch, a binary loss on the similarity
  (positive where the image has that colour or shape, negative elsewhere), so that the hallucination
  penalty (EMScore's token -> visual matching, thresholded) sees the words.

Half the captions carry CLIP-S's prefix "A photo depicts ". Model A and model B differ in their
initialisation seed and in the scenes they are trained on (disjoint streams of the generator); the
experiment's held-out scenes come from a third stream.

Weights are cached as OpenAI-format state dicts under ``$CAPREWARD_CACHE`` (default
``~/.cache/capreward``) in ``trained_clip/<name>-<hash>.pt``, the hash covering the recipe, this module's
and :mod:`~scenes_world.world`' source, the config and the torch version, as the colour CLIP's are.
:func:`scene_clip_path` trains on the first call (a few CPU minutes on one thread) and returns the path,
which every CLIP-based scorer accepts as ``model=``.

Examples:
    >>> from scenes_world.clips import MODEL_A, scene_clip_path
    >>> from capreward.rewards import CLIPScoreReward
    >>> reward = CLIPScoreReward(model=str(scene_clip_path(MODEL_A)))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from . import world

from capreward.testing.tiny_clip import build_tiny_clip
from capreward.testing.trained_clip import (CLIPS_PREFIX, _lr_factor, _multi_positive_ce, cached_clip_path, fp16_rounded,
                                            optimiser_step, padded_ids, recipe_key, seeded_single_thread,
                                            text_token_embeddings)

SCENE_CLIP_VERSION = "1"

#: The tiny CLIP's architecture with 4-pixel patches (64 patches of a 32 px image) and 64-d embeddings.
SCENE_CLIP_CONFIG = {
    "embed_dim": 64,
    "vision": {"image_size": 32, "patch_size": 4, "width": 64, "layers": 2},
    "text": {"context_length": 77, "vocab_size": 49408, "width": 64, "layers": 2},
}


@dataclass(frozen=True)
class SceneClipRecipe:
    """Everything that determines a trained scenes CLIP (and therefore its cache key). ``seed`` seeds the
    initialisation and the batches; ``data`` names the generator's stream of training scenes;
    ``negatives``: hard-negative kinds drawn per image; ``partial``: the share of training captions that
    name only some of the scene's groups (each then counts as true of every scene of the batch holding
    those groups), as web alt-text names only some of what a photo shows."""

    name: str = "scenes-a"
    seed: int = 0
    data: str = "train-a"
    steps: int = 1000
    batch_size: int = 32
    pool_size: int = 3000
    lr: float = 2e-3
    weight_decay: float = 0.01
    logit_scale: float = 10.0
    token_loss_weight: float = 1.0
    negatives: int = 3
    partial: float = 0.0

    def key(self) -> str:
        """A hash of the recipe, this module's and the world's source, the config and the torch version."""
        return recipe_key(self, SCENE_CLIP_VERSION, Path(__file__).read_bytes() + Path(world.__file__).read_bytes(),
                          SCENE_CLIP_CONFIG)


#: The reward model.
MODEL_A = SceneClipRecipe()
#: The held-out model: another initialisation, other training scenes.
MODEL_B = SceneClipRecipe(name="scenes-b", seed=1, data="train-b")
#: A negative control for the reward model: A's recipe without hard negatives (in-batch negatives only,
#: as CLIPs are usually trained).
MODEL_A_PLAIN = SceneClipRecipe(name="scenes-a-plain", negatives=0)
#: A second negative control: no hard negatives and half the training captions partial (naming some of
#: the scene's groups), as CLIPs trained on web alt-text see them.
MODEL_A_PARTIAL = SceneClipRecipe(name="scenes-a-partial", negatives=0, partial=0.5)
#: The image tower the scenes captioner starts from (:func:`scenes_world.policy.build_policy`), as a VLM starts
#: from a pretrained CLIP: another seed, its own stream of scenes (neither A's, B's nor the held-out ones).
MODEL_POLICY = SceneClipRecipe(name="scenes-policy", seed=2, data="train-p")
#: The stream of held-out scenes neither model trained on.
HELD_OUT = "held-out"


def scene_stream(data: str, n: int, size: int = 64) -> list[dict]:
    """``n`` scenes of the generator's stream ``data`` (a name: "train-a", "train-b", "held-out", ...):
    {"scene", "image", "caption"}, deterministic for the name."""
    rng = random.Random(f"scene-stream-{data}")
    out = []
    for _ in range(n):
        scene = world.random_scene(rng)
        out.append({"scene": scene, "image": world.render_scene(scene, rng, size), "caption": world.true_caption(scene)})
    return out


def _preprocess():
    import open_clip

    return open_clip.image_transform(SCENE_CLIP_CONFIG["vision"]["image_size"], is_train=False)


def _tokenizer():
    import open_clip

    return open_clip.tokenizer.SimpleTokenizer(context_length=SCENE_CLIP_CONFIG["text"]["context_length"])


def content_key(caption: str) -> tuple:
    """What a caption says, as comparable with :meth:`Scene.key`: its (colour, shape) -> count pairs."""
    from collections import Counter

    counts: Counter = Counter()
    for m in world.parse_caption(caption).mentions:
        counts[(m.colour, m.shape)] += m.count
    return tuple(sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])))


def _scene_key(scene: world.Scene) -> tuple:
    return tuple(sorted(scene.groups().items(), key=lambda kv: (str(kv[0][0]), kv[0][1])))


_ENCODED: dict[int, dict[str, list[int]]] = {}


def encode_scene_captions(tokenizer, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, list[list[tuple[int, str]]]]:
    """Token ids [B, L] (SOT..EOT, zero padded), lengths [B], and per caption the (position, word) of
    each colour or shape word (every such word of the grammar is one BPE token)."""
    attributes = set(world.SCENE_COLOURS) | set(world.SHAPES) | set(world.PLURALS)
    cache = _ENCODED.setdefault(id(tokenizer), {})
    rows, where = [], []
    for caption in captions:
        ids = [tokenizer.sot_token_id]
        found = []
        for word in caption.replace(",", " ,").split(" "):
            if not word:
                continue
            if word not in cache:
                cache[word] = tokenizer.encode(word)
            ids.extend(cache[word])
            if word.lower() in attributes:
                found.append((len(ids) - 1, word.lower()))
        ids.append(tokenizer.eot_token_id)
        rows.append(ids)
        where.append(found)
    ids, lengths = padded_ids(rows)
    return ids, lengths, where


def _has(scene: world.Scene, word: str) -> bool:
    if word in world.SCENE_COLOURS:
        return word in scene.colours()
    return world.PLURALS.get(word, word) in scene.shapes()


def train_scene_clip(recipe: SceneClipRecipe = MODEL_A, log: Callable[[str], None] | None = None) -> tuple[torch.nn.Module, list[float]]:
    """Train a tiny CLIP on the scenes world; returns (model in eval mode, per-step losses). Deterministic
    on the CPU for a given recipe. Runs on one torch thread (restored afterwards)."""
    rng = random.Random(f"scene-clip-{recipe.seed}")
    words = [*world.SCENE_COLOURS, *world.SHAPES, *world.PLURALS]
    with seeded_single_thread(recipe.seed):
        model = build_tiny_clip(recipe.seed, SCENE_CLIP_CONFIG).train()
        model.logit_scale.requires_grad_(False).fill_(math.log(recipe.logit_scale))
        # the 49k-row token table stays at its (distinct, random) initialisation: training it costs
        # most of a step and the grammar uses a few dozen tokens
        model.token_embedding.weight.requires_grad_(False)
        preprocess, tokenizer = _preprocess(), _tokenizer()
        pool = scene_stream(recipe.data, recipe.pool_size)
        pixels = torch.stack([preprocess(r["image"]) for r in pool])
        # which attribute word each pool scene has ([pool, words]), for the token-level loss
        column = {w: j for j, w in enumerate(words)}
        has_word = torch.tensor([[_has(r["scene"], w) for w in words] for r in pool], dtype=torch.float32)
        word_ids, word_len, word_where = encode_scene_captions(tokenizer, words)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=recipe.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor(recipe.steps))
        scale = recipe.logit_scale
        losses: list[float] = []
        for step in range(recipe.steps):
            idx = rng.sample(range(recipe.pool_size), recipe.batch_size)
            scenes = [pool[i]["scene"] for i in idx]
            truths, negatives = [], []
            for scene in scenes:
                prefix = CLIPS_PREFIX if rng.random() < 0.5 else ""
                mentions = world.true_mentions(scene, rng)
                if recipe.partial and len(mentions) > 1 and rng.random() < recipe.partial:
                    mentions = mentions[: rng.randint(1, len(mentions) - 1)]  # already shuffled
                truths.append(prefix + world.write_caption(mentions))
                for kind in rng.sample(world.NEGATIVE_KINDS, recipe.negatives):
                    neg = world.hard_negative(scene, kind, rng)
                    if neg is not None:
                        negatives.append(prefix + neg)
            captions = truths + negatives
            ids, lengths, where = encode_scene_captions(tokenizer, captions)
            images = F.normalize(model.encode_image(pixels[idx]), dim=-1)
            tokens = text_token_embeddings(model, ids)
            text = tokens[torch.arange(len(captions)), lengths - 1]
            keys = [_scene_key(s) for s in scenes]
            caption_keys = [content_key(c) for c in captions]
            if recipe.partial:  # a caption is true of every scene holding the groups it names
                positive = torch.tensor([[set(ck) <= set(k) for ck in caption_keys] for k in keys])
            else:
                positive = torch.tensor([[k == ck for ck in caption_keys] for k in keys])
            logits = scale * images @ text.T  # [B, B + negatives]
            i2t = _multi_positive_ce(logits, positive)
            t2i = _multi_positive_ce(logits[:, : len(truths)].T, positive[:, : len(truths)].T)
            # token level: attribute words in the true captions, and each word alone
            rows, row_words = [], []
            for c, found in enumerate(where[: len(truths)]):
                for pos, word in found:
                    rows.append(tokens[c, pos])
                    row_words.append(word)
            alone = text_token_embeddings(model, word_ids)
            for w, found in enumerate(word_where):
                rows.append(alone[w, found[0][0]])
                row_words.append(found[0][1])
            has = has_word[idx][:, [column[w] for w in row_words]].T
            # a binary loss, not a contrastive one: the penalty thresholds the similarity itself, so a
            # word must be above 0 on every image that has it and below on every image that has not
            token_logits = scale * torch.stack(rows) @ images.T
            token_loss = F.binary_cross_entropy_with_logits(token_logits, has)
            loss = (i2t + t2i) / 2 + recipe.token_loss_weight * token_loss
            losses.append(optimiser_step(opt, sched, loss))
            if log is not None and (step % 100 == 0 or step == recipe.steps - 1):
                log(f"{recipe.name} step {step}: loss {losses[-1]:.3f} (i2t {i2t.item():.3f}, t2i {t2i.item():.3f}, token {token_loss.item():.3f})")
    return fp16_rounded(model), losses


def scene_clip_path(
    recipe: SceneClipRecipe = MODEL_A,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Path of the trained scenes CLIP for ``recipe`` as an OpenAI-format ``.pt`` state dict (pass it as
    ``model=``); trained and written atomically on the first call, then reused (as
    :func:`~capreward.testing.trained_clip.trained_clip_path` does for the colour CLIP). A ``.json``
    beside it records the recipe and the final training loss."""
    return cached_clip_path(recipe, lambda: train_scene_clip(recipe, log=log), cache_dir, rebuild, loss_steps=50)
