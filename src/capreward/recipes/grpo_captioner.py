"""Recipe: GRPO fine-tuning of a VLM captioner with caption-quality rewards (TRL ``GRPOTrainer`` + LoRA).

Needs the ``recipes`` extra (``pip install 'capreward[recipes]'``: trl, peft, datasets). Run it as
``python -m capreward.recipes.grpo_captioner`` (or, in a checkout, ``python recipes/grpo_captioner.py``,
a thin script calling :func:`main`); ``capreward demo`` imports it for its GRPO part.

The policy (a LLaVA-style ``AutoModelForImageTextToText`` and its processor) captions each image of a
JSONL manifest ``--num-generations`` times per step; every caption is scored by capreward rewards
(EMScore, CLIP-S, FLEUR and the hallucination penalty, weighted as ``--rewards`` says, summed by a
``CompositeReward`` that adds guards against repetition, truncated endings and over-length captions)
and the policy's LoRA adapters follow the group-normalised advantages. At the end the reward trajectory
(per step mean of the total, of every reward and of every guard term) is printed, and the trained
adapter (or, with ``--lora-r 0``, the whole model) and the processor are saved in ``--out``.

Runs offline on tiny, locally built models (a seeded tiny LLaVA policy, the tiny CLIP of
``capreward.testing`` and a generated manifest of solid-colour images and short clips)::

    python -m capreward.recipes.grpo_captioner --tiny --steps 4 --out runs/grpo-tiny

With real weights::

    python -m capreward.recipes.grpo_captioner --model llava-hf/llava-1.5-7b-hf --clip ViT-B-32/openai \\
        --manifest data/train.jsonl --rewards emscore=1,clip_s=0.5,hallucination=0.5 \\
        --steps 500 --num-generations 8 --batch-size 8 --max-completion-length 48 --bf16 --out runs/grpo

Manifest: one JSON object per line with ``image`` or ``video`` (a path, relative paths resolved from
the manifest's folder), optional ``references`` (list of strings) and optional ``prompt`` (default
``--prompt``). The policy sees images as they are and videos as G-VEval's three-frame composite
(``--video-as composite``) or their middle frame (``--video-as middle``); the rewards score the video
itself (EMScore over ``--frames`` frames; CLIP-S on the mean frame embedding).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np
from transformers import TrainerCallback

from .. import registry
from .._extras import require

for _module in ("trl", "datasets"):  # fail at import, naming the extra, rather than deep inside train()
    require("recipes", _module, used_by="the GRPO recipe (capreward.recipes.grpo_captioner)")

# ----------------------------------------------------------------------------------------- rewards
DEFAULT_REWARDS = "emscore=1.0,clip_s=0.5,hallucination=0.5"


def __getattr__(name: str):
    if name == "REWARD_NAMES":  # every metric of capreward.registry, in its order
        return registry.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
TINY_WORDS = (
    "a", "an", "the", "of", "in", "is", "on", "image", "photo", "picture", "video", "frame", "colour",
    "red", "green", "blue", "yellow", "purple", "orange", "white", "black", "gray", "Describe", "describe",
)


def parse_rewards(spec: str) -> list[tuple[str, float]]:
    """``"emscore=1,clip_s=0.5"`` -> ``[("emscore", 1.0), ("clip_s", 0.5)]`` (a bare name weighs 1;
    ``name:weight`` is accepted too; the registry's aliases, such as ``clipscore``, are accepted for their
    one name): :func:`capreward.terms.parse_weighted_terms`.

    Raises ValueError naming the bad entry (unknown reward, bad or non-finite weight, duplicates)."""
    from capreward.terms import parse_weighted_terms

    return parse_weighted_terms(spec, what="reward", where=f" in --rewards {spec!r}")


def build_reward(name: str, args: argparse.Namespace, clip: Any, judge: Any) -> Any:
    """One capreward reward callable (TRL contract) for ``name``, a metric of :mod:`capreward.registry`: its
    reward class (:meth:`~capreward.rewards.MetricReward.class_for`), with the options its spec says it takes."""
    from capreward.rewards import MetricReward

    spec = registry.get(name)
    reward = MetricReward.class_for(name)
    if spec.text_judge:  # a text-only judge reads the caption alone
        from capreward.judges.lazy import LazyBackend

        # the recipe's rows carry no questions: the chat judge writes them per visual (loaded on first need)
        return reward(backend=qa_judge(args), question_backend=LazyBackend(lambda: chat_judge(args, judge)))
    remote = bool(getattr(args, "judge_url", None))
    own = {f.option: spec.job_value(f, getattr(args, f.name, None))  # its options the adapters take
           for f in spec.job_flags if f.adapters and f.option}
    if spec.backbone == "clip":
        w = dict(w=args.clip_w) if spec.has_option("w") and spec.shares == "clip" else {}  # CLIP-S's scale
        return reward(model=clip, device=args.reward_device, frames=args.frames, **w)
    if spec.judge_backend:  # a scorer on any chat judge: the server of --judge-url, or the local judge
        tree = {"tree_top_logprobs": max(10, args.judge_top_logprobs_cap)} if remote and spec.has_option("tree_top_logprobs") else {}
        return reward(backend=chat_judge(args, judge), **own, **tree)
    if spec.backbone != "chat_judge":  # a metric on no model the recipe loads: its own options only
        return reward(**own)
    if remote:  # a metric whose scorer needs a local model, on its scorer for a chat server
        return reward(scorer=spec.load_remote_scorer()(chat_judge(args, judge)))
    return reward(model=judge, device=args.reward_device)


def qa_judge(args: argparse.Namespace) -> Any:
    """The text-only judge of qa_utility: the judge server (``--judge-url``), ``--qa-model`` (a causal LM)
    or, with ``--tiny``, the tiny trained QA judge."""
    if getattr(args, "judge_url", None):
        return chat_judge(args, None)
    if getattr(args, "tiny", False):
        from capreward.testing.tiny_qa_judge import qa_backend

        return qa_backend()
    if not getattr(args, "qa_model", None):
        raise ValueError("the qa_utility reward needs a text judge: --qa-model (a causal LM) or --judge-url")
    from capreward.judges.local_text import LocalTextJudge

    return LocalTextJudge(args.qa_model)


def chat_judge(args: argparse.Namespace, judge: Any) -> Any:
    """The chat judge of visce2/gveval (and fleur with ``--judge-url``): an OpenAI-compatible server
    (``--judge-url``, model ``--judge`` as served; key from ``$OPENAI_API_KEY``) or the local judge."""
    if getattr(args, "judge_url", None):
        from capreward.judges.remote import OpenAIJudge

        return OpenAIJudge(args.judge_url, args.judge, top_logprobs_cap=args.judge_top_logprobs_cap)
    from capreward.judges import LocalChatJudge

    return LocalChatJudge(judge)


def build_rewards(args: argparse.Namespace) -> tuple[list[Any], list[float]]:
    """The reward callables named by ``--rewards`` and their weights (see :func:`combine_rewards` for how
    they reach the trainer)."""
    clip, judge = args.clip, args.judge
    if args.tiny:
        from capreward.testing import tiny_clip_factory

        clip = tiny_clip_factory(seed=args.seed)
        # the tiny trained judge of the first chosen metric (in the registry's order) that names one
        chosen = {n for n, _ in args.reward_list}
        from capreward.testing.tiny_judges import tiny_judge_for

        tiny = [build for s in registry.specs() if s.name in chosen and (build := tiny_judge_for(s.name)) is not None]
        if tiny:
            judge = tiny[0]()
    funcs = [build_reward(name, args, clip, judge) for name, _ in args.reward_list]
    return funcs, [w for _, w in args.reward_list]


def combine_rewards(funcs: Sequence[Any], weights: Sequence[float], args: argparse.Namespace) -> tuple[list[Any], list[float]]:
    """What TRL gets: with ``--combine composite`` one :class:`~capreward.rewards.CompositeReward` (the
    weighted sum plus the anti-hacking guards unless ``--no-guards``; a sample one component cannot
    score keeps the others, renormalised), logged as ``rewards/composite/mean`` with each component
    as ``rewards/composite/<name>``; with ``--combine trl`` the rewards themselves and their weights
    (TRL's NaN-aware weighted sum, no guards), each logged as ``rewards/<name>/mean``."""
    from capreward.rewards import CompositeReward, FLEURReward, Guards

    if args.combine == "trl":  # TRL awaits async rewards concurrently: the slow judge runs beside the rest
        return [f.as_async() if isinstance(f, FLEURReward) else f for f in funcs], list(weights)

    guards = Guards(max_words=args.max_words) if args.guards else None
    return [CompositeReward(list(zip(funcs, weights)), guards=guards, on_none="renormalize")], [1.0]


def trajectory_columns(reward_funcs: Sequence[Any]) -> dict[str, str]:
    """Trajectory column name -> the log key it reads: the weighted total, each reward TRL sees and,
    for a composite, each of its components and guard terms."""
    columns = {"total": "reward"}
    for func in reward_funcs:
        name = getattr(func, "__name__", type(func).__name__)
        if len(reward_funcs) > 1:  # a single reward's mean is the total (times its weight): no column
            columns[name] = f"rewards/{name}/mean"
        for label, _, _ in getattr(func, "components", ()):
            columns[label] = f"rewards/{name}/{label}"
        guards = getattr(func, "guards", None)
        if guards is not None:
            for term in guards.terms("a caption."):
                columns[f"guard/{term}"] = f"rewards/{name}/guard/{term}"
    return columns


# ----------------------------------------------------------------------------------------- data
def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a JSONL manifest, validated: each has exactly one of ``image``/``video`` (resolved against
    the manifest's folder), ``references`` a list of strings if present, ``prompt`` a string if present.
    Raises ValueError naming the line of the first bad row."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        kinds = [k for k in ("image", "video") if row.get(k)]
        if len(kinds) != 1:
            raise ValueError(f"{where}: needs exactly one of 'image' or 'video', got {kinds or 'neither'}")
        if not isinstance(row[kinds[0]], str):
            raise ValueError(f"{where}: {kinds[0]!r} must be one path (the recipe's policy sees one visual per "
                             f"prompt), got {type(row[kinds[0]]).__name__}; several-image rows are scored by "
                             "`capreward score` and the rewards' images column")
        refs = row.get("references")
        if refs is not None and (not isinstance(refs, list) or not all(isinstance(r, str) for r in refs)):
            raise ValueError(f"{where}: 'references' must be a list of strings")
        if row.get("prompt") is not None and not isinstance(row["prompt"], str):
            raise ValueError(f"{where}: 'prompt' must be a string")
        media = Path(row[kinds[0]])
        rows.append(
            {
                "kind": kinds[0],
                "path": str(media if media.is_absolute() else (path.parent / media)),
                "references": refs,
                "prompt": row.get("prompt"),
            }
        )
    if not rows:
        raise ValueError(f"{path}: manifest has no rows")
    return rows


def policy_image(row: dict[str, Any], video_as: str) -> Any:
    """The PIL image the policy sees for a manifest row (a video becomes its composite or middle frame)."""
    from capreward.media import load_image, load_video
    from capreward.media.composite import video_composite
    from PIL import Image

    if row["kind"] == "image":
        return load_image(row["path"])
    if video_as == "composite":
        return video_composite(row["path"])
    frames = load_video(row["path"], frames=3)
    return Image.fromarray(frames[1])


def build_dataset(rows: Sequence[dict[str, Any]], prompt: str, video_as: str = "composite") -> Any:
    """A ``datasets.Dataset`` in TRL's conversational VLM format: ``prompt`` (one user turn; TRL inserts
    the image), ``image`` (what the policy sees), ``video`` (the path, for the rewards; None for images)
    and ``references`` (None when the row has none)."""
    from datasets import Dataset, Features, Image, List, Value

    records = [
        {
            "prompt": [{"role": "user", "content": row.get("prompt") or prompt}],
            "image": policy_image(row, video_as),
            "video": row["path"] if row["kind"] == "video" else None,
            "references": row.get("references"),
        }
        for row in rows
    ]
    features = Features(
        {
            "prompt": List({"role": Value("string"), "content": Value("string")}),
            "image": Image(),
            "video": Value("string"),
            "references": List(Value("string")),
        }
    )
    return Dataset.from_list(records, features=features)


TINY_COLOURS = {"red": (215, 30, 35), "green": (35, 165, 50), "blue": (35, 70, 215), "yellow": (240, 215, 35)}


def write_tiny_manifest(folder: str | os.PathLike, images: int = 8, videos: int = 2, seed: int = 0) -> Path:
    """Write a small manifest of solid-colour images (with pixel noise) and short clips of a colour
    changing over time, with references naming the colour(s); returns the manifest path."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = list(TINY_COLOURS)
    lines = []
    for i in range(images):
        colour = names[i % len(names)]
        pixels = np.clip(np.array(TINY_COLOURS[colour]) + rng.normal(0, 12, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"image{i}.png")
        lines.append({"image": f"image{i}.png", "references": [f"a {colour} image", f"a photo of {colour}"]})
    for i in range(videos):
        first, second = names[i % len(names)], names[(i + 1) % len(names)]
        frames = np.stack(
            [np.full((32, 32, 3), TINY_COLOURS[first if t < 4 else second], dtype=np.uint8) for t in range(8)]
        )
        _write_mp4(folder / f"video{i}.mp4", frames)
        lines.append({"video": f"video{i}.mp4", "references": [f"a {first} video then {second}"],
                      "prompt": "Describe the video"})
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def _write_mp4(path: Path, frames: np.ndarray, fps: int = 8) -> None:
    """uint8 frames (T, H, W, 3), H and W even, as an H.264 MP4 written with PyAV (a core dependency)."""
    import av

    _, h, w, _ = frames.shape
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode(None))  # flush the encoder


# ----------------------------------------------------------------------------------------- policy
def build_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(model, processor)`` of the captioner: a seeded tiny LLaVA with ``--tiny``, else
    ``--model`` loaded with ``AutoModelForImageTextToText`` (bf16 with ``--bf16``)."""
    import torch

    if args.tiny:
        from capreward.testing import TinyLlavaSpec, build_tiny_llava

        model, processor = build_tiny_llava(TinyLlavaSpec(words=TINY_WORDS, seed=args.seed))
        return model.train(), processor
    from transformers import AutoModelForImageTextToText, AutoProcessor

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=dtype)
    processor = AutoProcessor.from_pretrained(args.model, padding_side="left")
    return model, processor


def lora_config(args: argparse.Namespace) -> Any:
    """LoRA on the language model's attention and MLP projections (the vision tower stays frozen);
    None when ``--lora-r 0`` (full fine-tuning)."""
    if args.lora_r <= 0:
        return None
    LoraConfig = require("recipes", "peft", used_by="the GRPO recipe's LoRA (--lora-r)").LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
        task_type="CAUSAL_LM",
    )


# ----------------------------------------------------------------------------------------- training
def _float(value: Any) -> float:
    """A logged value as a float; None (how a NaN mean can arrive, e.g. every sample unscored) -> NaN."""
    return math.nan if value is None else float(value)


class RewardTrajectory(TrainerCallback):
    """Collects, per logged step, the logged value of every column of ``columns`` (name -> log key,
    see :func:`trajectory_columns`) into ``rows`` (dicts with ``step`` and one entry per column; NaN
    where a key was not logged)."""

    def __init__(self, columns: dict[str, str]):
        self.columns = dict(columns)
        self.rows: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            row = {"step": state.global_step}
            row.update({name: _float(logs.get(key)) for name, key in self.columns.items()})
            self.rows.append(row)


def format_trajectory(rows: Sequence[dict[str, float]]) -> str:
    """The trajectory as a fixed-width table, one line per step, one column per reward."""
    if not rows:
        return "(no reward logged)"
    names = [k for k in rows[0] if k != "step"]
    width = max([10] + [len(n) + 2 for n in names])
    head = f"{'step':>5}" + "".join(f"{n:>{width}}" for n in names)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{int(r['step']):>5}" + "".join(f"{r[n]:>{width}.4f}" for n in names))
    return "\n".join(lines)


def grpo_config(args: argparse.Namespace, reward_weights: Sequence[float]) -> Any:
    """The ``GRPOConfig`` for the parsed arguments (logging every step, no checkpoints unless asked)."""
    import torch
    from trl import GRPOConfig

    on_cpu = args.tiny or not torch.cuda.is_available()
    # transformers 5.24 renamed gradient_checkpointing to activation_checkpointing (the old name warns, to
    # be removed in v6): pass the name the installed config declares.
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    # the warm-up share: transformers 5 reads a warmup_steps below 1 as a share of the steps (warmup_ratio is
    # gone); transformers 4 has warmup_ratio and an integer warmup_steps
    warmup = {"warmup_ratio": args.warmup_ratio} if "warmup_ratio" in names else {"warmup_steps": args.warmup_ratio}
    return GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type=args.lr_scheduler,
        **warmup,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        reward_weights=list(reward_weights),
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=args.report_to,
        seed=args.seed,
        bf16=bool(args.bf16) and not on_cpu,
        use_cpu=on_cpu,
        **{checkpointing: args.gradient_checkpointing},
        dataloader_num_workers=0,
        disable_tqdm=args.quiet,
    )


def train(
    args: argparse.Namespace,
    reward_funcs: Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    model_and_processor: tuple[Any, Any] | None = None,
    dataset: Any = None,
    callbacks: Sequence[Any] = (),
    save: bool = True,
) -> dict[str, Any]:
    """Run GRPO; the optional arguments replace what ``args`` would build (tests and experiments pass
    their own rewards, policy or dataset; ``reward_weights`` defaults to 1 each for given rewards).
    With ``save`` the trained policy (the LoRA adapter, or the whole model with ``--lora-r 0``) and its
    processor are written to ``args.out`` (see :func:`save_policy`).
    Returns ``{"trajectory": RewardTrajectory.rows, "log_history", "trainer", "saved"}`` (``saved``: the
    folder, or None)."""
    from trl import GRPOTrainer

    if reward_funcs is None:
        reward_funcs, reward_weights = combine_rewards(*build_rewards(args), args)
    reward_weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs)
    if len(reward_weights) != len(reward_funcs):
        raise ValueError(f"{len(reward_weights)} reward weights for {len(reward_funcs)} rewards")
    model, processor = model_and_processor or build_policy(args)
    if dataset is None:
        manifest = args.manifest or write_tiny_manifest(Path(args.out) / "tiny_data", seed=args.seed)
        dataset = build_dataset(read_manifest(manifest), args.prompt, args.video_as)
    trajectory = RewardTrajectory(trajectory_columns(reward_funcs))
    peft_config = lora_config(args)
    in_memory = model_and_processor is not None or args.tiny
    with reference_snapshot(model, args.beta > 0 and peft_config is None and in_memory):
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=list(reward_funcs),
            args=grpo_config(args, reward_weights),
            train_dataset=dataset,
            processing_class=processor,
            peft_config=peft_config,
            callbacks=[trajectory, *callbacks],
        )
    if args.quiet:  # no per-step log dicts either; the trajectory is printed at the end
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    trainer.train()
    saved = save_policy(trainer, processor, args.out) if save else None
    return {"trajectory": trajectory.rows, "log_history": trainer.state.log_history, "trainer": trainer, "saved": saved}


@contextlib.contextmanager
def reference_snapshot(model: Any, needed: bool):
    """While ``needed``, point ``model.config._name_or_path`` at a temporary copy of ``model``'s weights
    as they are now, so that TRL's ``GRPOTrainer`` (which, with ``beta > 0`` and no LoRA, builds its KL
    reference by loading ``get_config_model_id(model.config)`` from disk) gets the policy it was given:
    an in-memory policy has an empty name (TRL then fails to load ``""``), and one loaded and then changed
    in memory (an SFT stage) would otherwise be compared with the weights on disk. The name is restored
    and the copy deleted on exit (the trainer has loaded its reference by then)."""
    if not needed:
        yield
        return
    original = getattr(model.config, "_name_or_path", "")
    with tempfile.TemporaryDirectory(prefix="capreward-grpo-ref-") as folder:
        model.save_pretrained(folder)
        model.config._name_or_path = folder
        try:
            yield
        finally:
            model.config._name_or_path = original


def save_policy(trainer: Any, processor: Any, out: str | os.PathLike) -> Path:
    """Write the trained policy and its processor to ``out``: with LoRA the adapter
    (``adapter_config.json``, ``adapter_model.safetensors``; load it with
    ``PeftModel.from_pretrained(base_model, out)``), else the full model (``from_pretrained(out)``).
    Returns ``out``."""
    out = Path(out)
    trainer.save_model(str(out))
    if trainer.is_world_process_zero():
        processor.save_pretrained(str(out))
    return out


# ----------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("models")
    g.add_argument("--tiny", action="store_true", help="locally built tiny policy, CLIP and judge, generated data")
    g.add_argument("--model", default="llava-hf/llava-1.5-7b-hf", help="policy (an image-text-to-text model)")
    g.add_argument("--clip", default="ViT-B-32/openai", help="CLIP for EMScore / CLIP-S / the penalty")
    g.add_argument("--judge", default="llava-hf/llava-1.5-13b-hf",
                   help="judge of fleur/visce2/gveval: a local LLaVA, or with --judge-url the served model name")
    g.add_argument("--judge-url", default=None, help="OpenAI-compatible judge server (vLLM: http://HOST:8000/v1)")
    g.add_argument("--judge-top-logprobs-cap", type=int, default=20, help="the server's --max-logprobs")
    from capreward.metric_flags import adapter_flags, add_metric_flags

    add_metric_flags(g, adapter_flags())  # each metric's own options the adapters take (--gveval-mode, --qa-model)
    g.add_argument("--reward-device", default="cpu", help="device of the reward models")
    g.add_argument("--bf16", action="store_true", help="policy in bfloat16 (GPU)")
    g = p.add_argument_group("data")
    g.add_argument("--manifest", default=None, help="JSONL manifest (default with --tiny: a generated one)")
    g.add_argument("--prompt", default="Describe the image", help="prompt of rows that have none")
    g.add_argument("--video-as", choices=("composite", "middle"), default="composite", help="what the policy sees of a video")
    g.add_argument("--frames", type=int, default=8, help="frames per video for the rewards")
    g = p.add_argument_group("rewards")
    g.add_argument("--rewards", default=DEFAULT_REWARDS, help=f"name=weight list (name:weight accepted) from {', '.join(registry.names())}")
    g.add_argument("--clip-w", type=float, default=2.5, help="CLIP-S scale w")
    g.add_argument("--combine", choices=("composite", "trl"), default="composite",
                   help="one CompositeReward with guards, or each reward to TRL separately (TRL's weighted sum)")
    g.add_argument("--no-guards", dest="guards", action="store_false", help="composite without anti-hacking guards")
    g.add_argument("--max-words", type=int, default=40, help="over-length guard: words before the penalty starts")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=4)
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--lr-scheduler", default="linear", help="transformers lr_scheduler_type (linear, constant, cosine...)")
    g.add_argument("--warmup-ratio", type=float, default=0.0, help="share of the steps warming the learning rate up")
    g.add_argument("--batch-size", type=int, default=4, help="completions per device per step")
    g.add_argument("--num-generations", type=int, default=4, help="completions per prompt (GRPO group)")
    g.add_argument("--max-completion-length", type=int, default=12)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    g.add_argument("--lora-r", type=int, default=8, help="LoRA rank (0: full fine-tuning)")
    g.add_argument("--lora-alpha", type=int, default=16)
    g.add_argument("--gradient-checkpointing", action="store_true")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="runs/grpo-captioner", help="output directory")
    g.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: none)")
    g.add_argument("--report-to", default="none", help="transformers report_to (none, tensorboard, wandb...)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--quiet", action="store_true", help="no progress bar or per-step log lines")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line (reward list parsed into ``args.reward_list``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.reward_list = parse_rewards(args.rewards)
    except ValueError as exc:
        parser.error(str(exc))
    if args.num_generations < 2:
        parser.error("--num-generations must be at least 2 (GRPO normalises rewards within a group)")
    if args.batch_size % args.num_generations:
        parser.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations ({args.num_generations})")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the recipe; prints and returns the reward trajectory (see :func:`train`)."""
    args = parse_args(argv)
    random.seed(args.seed)
    result = train(args)
    print(f"reward trajectory ({args.steps} GRPO steps; per-step mean of each reward):")
    print(format_trajectory(result["trajectory"]))
    if result["saved"] is not None:
        kind = "LoRA adapter" if args.lora_r > 0 else "model"
        print(f"{kind} and processor saved in {result['saved']}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
