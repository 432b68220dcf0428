"""A tiny LLaVA captioner of the scenes world: its vocabulary, a weakly supervised start, the GRPO data,
the wrong-image control reward, and grading held-out captions by the generator's ground truth and by the
held-out CLIP B.

- :func:`build_policy`: the seeded tiny LLaVA (the grammar's words in its vocabulary; 32 px images in
  4 px patches, so a shape in a cell of the 2x2 grid covers several patches);
- :func:`supervised_start`: a short supervised start on the scenes' captions: the policy attends to the
  image (colours mostly right) but gets counts, shapes and bindings wrong: a start RL can improve;
- :func:`grpo_rows` / :func:`grpo_dataset`: GRPO's training scenes in TRL's conversational format, with
  ``scene_id`` (which :class:`WrongImage` reads);
- :class:`WrongImage`: a reward scored against *another* scene's image of the batch: the control arm
  that has the same optimiser, the same samples and a reward of the same scale, but no information about
  the image it captions;
- :func:`grade`: greedy and sampled captions of held-out scenes, graded by :func:`~scenes_world.world.judge`
  (exact, per slot, hallucinated and omitted objects) and by CLIP-S under the held-out model B.
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Sequence

from . import world

from capreward.testing.colour_task import WrappedReward

PROMPT = "Describe the image"
#: Words of the policy's vocabulary: the grammar's, and the prompt's.
WORDS: tuple[str, ...] = (*world.scene_vocabulary(), "Describe", "the", "image")
#: Longest caption in tokens (four groups, commas, the end of sequence) with room to spare.
MAX_TOKENS = 24
#: Data streams of the policy (disjoint from the CLIPs' "train-a"/"train-b" and from "held-out").
SFT_STREAM, GRPO_STREAM = "policy-sft", "policy-grpo"


def build_policy(seed: int, vision: str | None = None) -> tuple[Any, Any]:
    """``(model, processor)``: the seeded tiny LLaVA captioner of the world (eval mode). Its vision tower
    has the scenes CLIPs' architecture (32 px images in 4 px patches, width 64, 2 layers); with ``vision``
    (the path of a trained scenes CLIP, OpenAI format) it starts from that CLIP's image tower, as a VLM
    starts from a pretrained CLIP, and reads its last layer's tokens (class token and patches)."""
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=seed, image_size=32, patch_size=4, vision_hidden=64,
                                                      vision_heads=1, vision_intermediate=256, vision_layers=2))
    # the last layer's tokens, the class token included: a trained CLIP's class token carries what its
    # contrastive training taught it about the whole scene (the patch tokens alone left the start image-blind)
    model.config.vision_feature_layer = -1
    model.config.vision_feature_select_strategy = "full"
    processor.vision_feature_select_strategy = "full"
    if vision is not None:
        import torch

        load_clip_vision(model, torch.load(vision, map_location="cpu", weights_only=True))
    return model, processor


def load_clip_vision(model: Any, state: dict[str, Any]) -> None:
    """Copy an OpenAI-format CLIP's image tower (``visual.*`` of ``state``) into the LLaVA's vision tower
    (transformers' ``CLIPVisionModel`` layout: the fused attention input projection split into q, k, v)."""
    import torch

    tower = model.model.vision_tower  # transformers 5 flattens CLIPVisionModel (no .vision_model)
    tower = getattr(tower, "vision_model", tower)
    v = {k[len("visual."):]: t.float() for k, t in state.items() if k.startswith("visual.")}
    target = {
        "embeddings.class_embedding": v["class_embedding"],
        "embeddings.patch_embedding.weight": v["conv1.weight"],
        "embeddings.position_embedding.weight": v["positional_embedding"],
        "pre_layrnorm.weight": v["ln_pre.weight"], "pre_layrnorm.bias": v["ln_pre.bias"],
        "post_layernorm.weight": v["ln_post.weight"], "post_layernorm.bias": v["ln_post.bias"],
    }
    for i in range(len(tower.encoder.layers)):
        src, dst = f"transformer.resblocks.{i}.", f"encoder.layers.{i}."
        for part, name in zip(v[src + "attn.in_proj_weight"].chunk(3), ("q", "k", "v")):
            target[f"{dst}self_attn.{name}_proj.weight"] = part
        for part, name in zip(v[src + "attn.in_proj_bias"].chunk(3), ("q", "k", "v")):
            target[f"{dst}self_attn.{name}_proj.bias"] = part
        for a, b in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                     ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
            target[f"{dst}{b}.weight"], target[f"{dst}{b}.bias"] = v[f"{src}{a}.weight"], v[f"{src}{a}.bias"]
    own = tower.state_dict()
    missing = set(own) - set(target)
    if missing:
        raise ValueError(f"no CLIP weights for {sorted(missing)}")
    with torch.no_grad():
        for k, t in target.items():
            own[k].copy_(t.reshape(own[k].shape))


def stream(name: str, n: int) -> list[dict[str, Any]]:
    """``n`` scenes of the generator's stream ``name`` (see :func:`scenes_world.clips.scene_stream`)."""
    from .clips import scene_stream

    return scene_stream(name, n)


def supervised_start(model: Any, processor: Any, steps: int, seed: int, lr: float = 1e-3, batch: int = 16,
                     pool: int = 512, errors: dict[str, float] | None = None) -> list[float]:
    """``steps`` supervised steps on scenes of :data:`SFT_STREAM`, each captioned afresh by
    :func:`~scenes_world.world.sample_caption` with ``errors`` (default none: the true caption, its groups
    in a random order; the sampler's rates make a noisy annotator); returns the losses. A short start
    attends to the image but gets counts, shapes and bindings wrong. Deterministic for ``seed``.

    (Measured on seed 0: with the noisy annotator at lr 3e-3, or with the policy's own random image tower,
    300 steps left the policy image-blind, the same caption for every image; true captions at lr 1e-3
    give the colour slot 66 % and exact 6 % after 150 steps.)"""
    from policy_arms import supervise

    rows = stream(SFT_STREAM, pool)
    annotator = random.Random(f"annotator-{seed}")
    errors = {} if errors is None else errors

    def draw(rng: random.Random) -> tuple[list[Any], list[str]]:
        batch_rows = [rng.choice(rows) for _ in range(batch)]
        return [r["image"] for r in batch_rows], [world.sample_caption(r["scene"], annotator, errors) for r in batch_rows]

    return supervise(model, processor, PROMPT, draw, steps, seed, lr=lr)


def grpo_rows(n: int = 64) -> list[dict[str, Any]]:
    """GRPO's training scenes ({"scene", "image", "caption", "scene_id"})."""
    return [dict(r, scene_id=i) for i, r in enumerate(stream(GRPO_STREAM, n))]


def grpo_dataset(rows: Sequence[dict[str, Any]]) -> Any:
    """TRL's conversational VLM format: the prompt, the image and ``scene_id``."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}], "image": r["image"],
                               "scene_id": r["scene_id"]} for r in rows])


class WrongImage(WrappedReward):
    """A TRL reward: ``reward`` scored against the image of the *next* scene of the batch (by
    ``scene_id``, cyclically), so its value says nothing about the image captioned; same scale, same
    samples, same optimiser as the reward arm. Keeps the wrapped reward's ``__name__``, ``components``
    and ``guards``."""

    def __init__(self, reward: Any):
        self.reward = reward
        self.__name__ = getattr(reward, "__name__", "reward")

    def __call__(self, prompts=None, completions=None, completion_ids=None, image=None, scene_id=None, **kwargs):
        order = list(dict.fromkeys(scene_id))
        first = {s: image[scene_id.index(s)] for s in order}
        other = {s: first[order[(i + 1) % len(order)]] for i, s in enumerate(order)}
        return self.reward(prompts=prompts, completions=completions, completion_ids=completion_ids,
                           image=[other[s] for s in scene_id], scene_id=scene_id, **kwargs)


class SceneTally(WrappedReward):
    """A TRL reward wrapper recording, per call (one GRPO step), the ground-truth grade of the sampled
    captions (:func:`~scenes_world.world.mean_judgement` of each against its scene, read from the
    ``scene_id`` column and ``rows``)."""

    def __init__(self, reward: Any, rows: Sequence[dict[str, Any]]):
        self.reward, self.rows = reward, {r["scene_id"]: r["scene"] for r in rows}
        self.__name__ = getattr(reward, "__name__", "reward")
        self.steps: list[dict[str, float]] = []

    def __call__(self, prompts=None, completions=None, completion_ids=None, scene_id=None, **kwargs):
        from capreward.rewards import completion_text

        texts = [completion_text(c) for c in completions]
        self.steps.append(world.mean_judgement(world.judge(self.rows[s], t) for s, t in zip(scene_id, texts)))
        return self.reward(prompts=prompts, completions=completions, completion_ids=completion_ids, scene_id=scene_id, **kwargs)


def truth_judge(rows: Sequence[dict[str, Any]]) -> Any:
    """A held-out judge for the Goodhart monitor: 1.0 for an exact caption of the row's scene, else 0.0."""
    scenes = {r["scene_id"]: r["scene"] for r in rows}

    def exact(prompts=None, completions=None, scene_id=None, **kwargs):
        return [float(world.judge(scenes[s], c).exact) for s, c in zip(scene_id, completions)]

    return exact


def grade(model: Any, processor: Any, rows: Sequence[dict[str, Any]], held_out_reward: Any, samples: int = 4,
          seed: int = 0) -> dict[str, Any]:
    """Greedy and ``samples`` sampled captions of ``rows`` (held-out scenes), each graded by the ground
    truth (:func:`~scenes_world.world.mean_judgement`) and by ``held_out_reward`` (CLIP-S under model B;
    its mean over the captions it scores). Returns ``{"greedy": {...}, "sampled": {...}, "captions": ...}``."""
    from policy_arms import caption

    images = [r["image"] for r in rows]
    greedy, sampled = caption(model, processor, images, PROMPT, samples=samples, seed=seed, max_new_tokens=MAX_TOKENS)
    out: dict[str, Any] = {"captions": {"greedy": greedy, "sampled": sampled}}
    for name, caps, ims, scenes in (
        ("greedy", greedy, images, [r["scene"] for r in rows]),
        ("sampled", [c for cs in sampled for c in cs], [im for im in images for _ in range(samples)],
         [r["scene"] for r in rows for _ in range(samples)]),
    ):
        values = [v for v in held_out_reward(None, caps, image=ims) if v is not None]
        out[name] = {**world.mean_judgement(world.judge(s, c) for s, c in zip(scenes, caps)),
                     "held_out": statistics.fmean(values) if values else float("nan")}
    return out
