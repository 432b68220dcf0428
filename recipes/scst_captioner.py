"""Recipe: fine-tune an encoder-decoder image captioner with self-critical sequence training (SCST) or
the differentiable CLIP reward, in Lightning, validated every epoch by
:class:`capreward.callbacks.CaptionScoreCallback`; the best epoch (by ``val/<metric>``) is kept and the
trained model is saved with its tokenizer and image processor.

Objectives (``--objective``):

- ``scst``: k sampled captions per image, rewarded by CLIP-S (``--reward clip-s``) or EMScore
  (``--reward emscore``) plus, with ``--hallucination W``, W times capreward's hallucination penalty
  (a :class:`~capreward.rewards.CompositeReward`), and with ``--guards`` capreward's repetition and
  dangling-word guards; baseline: the greedy caption's reward
  (``--baseline greedy``, Rennie et al.) or the mean of the other samples (``--baseline mean``, Luo).
- ``differentiable``: minus the reward of straight-through Gumbel-softmax captions, backpropagated
  through CLIP (:class:`capreward.training.DifferentiableRewardLoss`; word-level or CLIP-BPE captioner
  vocabularies only).
- ``ce``: cross-entropy on the reference captions only (the usual first stage).
``--ce-weight`` adds cross-entropy to either reward objective.

Runs offline on tiny local models by default: a tiny ViT-GPT2 captioner
(:func:`capreward.testing.tiny_captioner.build_tiny_captioner`) and the tiny CLIP trained on colour words,
on synthetic single-colour images::

    python recipes/scst_captioner.py --objective ce --epochs 8 --out runs/scst/ce
    python recipes/scst_captioner.py --init runs/scst/ce/model --objective scst --hallucination 0.5 --out runs/scst/rl

With real weights: ``--model nlpconnect/vit-gpt2-image-captioning`` (or a local directory with a
``VisionEncoderDecoderModel``, its tokenizer and image processor), ``--clip ViT-B-32/openai`` and JSONL
manifests ``--train train.jsonl --val val.jsonl`` with lines ``{"image": "a.jpg", "captions": [...]}``
(paths relative to the manifest).

Outputs under ``--out``: ``checkpoints/best-epoch=NN.ckpt``, ``model/`` (``save_pretrained`` of the best
epoch's weights, tokenizer and image processor; load it back with
``VisionEncoderDecoderModel.from_pretrained(out / "model")``), CSV logs and ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as lp
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from capreward.backbones import CLIPBackbone
from capreward.callbacks import CaptionScoreCallback
from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric
from capreward.rewards import CLIPScoreReward, CompositeReward, EMScoreReward, Guards, HallucinationPenalty
from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore
from capreward.training import DifferentiableRewardLoss, SelfCriticalStep, VocabularyBridge
from capreward.training.lightning import RewardCaptionerModule

OBJECTIVES = ("scst", "differentiable", "ce")
REWARDS = ("clip-s", "emscore")
#: Monitored validation metric per reward (the callback's names).
MONITOR = {"clip-s": "clip_s", "emscore": "emscore"}
#: Colour-free captions mixed into the synthetic training targets with ``--hedge``.
HEDGES = ("an image", "a picture", "this shows something", "the image")


# ------------------------------------------------------------------------------------------- data
def synthetic_images(n: int, seed: int, colours: Sequence[str] | None = None, hedge: float = 0.0) -> list[dict[str, Any]]:
    """Single-colour images (:func:`capreward.testing.trained_clip.colour_image`) with a target caption
    naming the colour (or, with probability ``hedge``, a colour-free caption) and the colour's
    reference captions. Returns dicts ``image`` (PIL), ``colour``, ``captions`` (target first)."""
    from capreward.testing.trained_clip import CAPTION_TEMPLATES, COLOURS, colour_caption, colour_image

    rng = random.Random(seed)
    names = list(colours or COLOURS)
    out = []
    for _ in range(n):
        colour = rng.choice(names)
        target = rng.choice(HEDGES) if rng.random() < hedge else colour_caption(colour, rng)
        refs = [t.format(colour=colour) for t in CAPTION_TEMPLATES[:3]]
        out.append({"image": colour_image(colour, rng), "colour": colour, "captions": [target, *refs]})
    return out


def jsonl_images(path: str | Path) -> list[dict[str, Any]]:
    """Images listed in a JSONL manifest (``{"image": path, "captions": [...]}`` per line), loaded."""
    from capreward.jsonl import json_lines
    from capreward.media import load_image

    root = Path(path).parent
    out = []
    for n, _where, entry in json_lines(Path(path)):
        if not entry.get("captions"):
            raise ValueError(f"{path}: line {n} has no captions")
        out.append({"image": load_image(root / entry["image"], index=n), "colour": None, "captions": list(entry["captions"])})
    return out


class ImageCaptions(Dataset):
    """Images with their pixel values (the captioner's processor), target ids and references."""

    def __init__(self, items: list[dict[str, Any]], processor: Any, tokenizer: Any, max_len: int = 24):
        self.items = items
        self.pixels = processor([it["image"] for it in items], return_tensors="pt").pixel_values
        self.labels = []
        for it in items:
            ids = tokenizer(it["captions"][0], add_special_tokens=False)["input_ids"][: max_len - 1]
            self.labels.append(torch.tensor([*ids, tokenizer.eos_token_id]))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"index": i, "pixel_values": self.pixels[i], "labels": self.labels[i], "image": self.items[i]["image"],
                "references": self.items[i]["captions"]}


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack pixels, pad labels with -100, keep images and each sample's references as lists."""
    return {
        "index": torch.tensor([it["index"] for it in items]),
        "pixel_values": torch.stack([it["pixel_values"] for it in items]),
        "labels": torch.nn.utils.rnn.pad_sequence([it["labels"] for it in items], batch_first=True, padding_value=-100),
        "image": [it["image"] for it in items],
        "references": [it["references"] for it in items],
    }


# ----------------------------------------------------------------------------------------- models
def load_captioner(spec: str, seed: int = 0) -> tuple[Any, Any, Any]:
    """``(model, image_processor, tokenizer)``: ``"tiny"`` builds the tiny ViT-GPT2 locally; anything else
    is a ``VisionEncoderDecoderModel`` name or directory (with its tokenizer and image processor)."""
    if spec == "tiny":
        from capreward.testing.tiny_captioner import build_tiny_captioner

        return build_tiny_captioner(seed)
    from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

    model = VisionEncoderDecoderModel.from_pretrained(spec)
    tokenizer = AutoTokenizer.from_pretrained(spec)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    return model, AutoImageProcessor.from_pretrained(spec), tokenizer


def load_backbone(spec: str) -> CLIPBackbone:
    """``"colour"``: the tiny CLIP trained on colour words; ``"tiny"``: the random tiny CLIP; else any CLIP
    specification (``ViT-B-32/openai``, a ``.pt`` path, ...)."""
    if spec == "colour":
        from capreward.testing.trained_clip import TrainedClipFactory

        return CLIPBackbone(TrainedClipFactory())
    if spec == "tiny":
        from capreward.testing import tiny_clip_factory

        return CLIPBackbone(tiny_clip_factory(0))
    return CLIPBackbone(spec)


def special_ids(tokenizer: Any) -> list[int]:
    """Special token ids other than EOS (never sampled: they are not words)."""
    return sorted({int(i) for i in tokenizer.all_special_ids} - {int(tokenizer.eos_token_id)})


def build_objective(args: argparse.Namespace, backbone: CLIPBackbone, tokenizer: Any, calibration: list[dict[str, Any]]):
    """The training objective the flags describe (None for cross-entropy only)."""
    if args.objective == "ce":
        return None
    if args.objective == "differentiable":
        scorer = CLIPScore(backbone=backbone) if args.reward == "clip-s" else EMScore(backbone=backbone)
        bridge = VocabularyBridge.from_tokenizers(tokenizer, backbone)
        return DifferentiableRewardLoss(scorer, bridge, tokenizer, tau=args.tau, max_new_tokens=args.max_new_tokens)
    main = CLIPScoreReward(backbone=backbone, use_references=False) if args.reward == "clip-s" else EMScoreReward(backbone=backbone, use_references=False)
    components: list[tuple[Any, float]] = [(main, 1.0)]
    if args.hallucination > 0:
        penalty = HallucinationPenalty(backbone=backbone)
        # a nominal 5 % false-flag rate needs 19 known-good captions; with fewer, the lowest rate they hold
        rate = max(0.05, 1.0 / (len(calibration) + 1))
        penalty.calibrate([c["captions"][1] for c in calibration], [c["image"] for c in calibration], kind="image",
                          quantile=rate)
        components.append((penalty, args.hallucination))
    # repetition and dangling-word guards; captioners trained without final periods are not penalised for it
    guards = Guards(require_punctuation=False, length=0.0) if getattr(args, "guards", False) else None
    reward: Any = main if len(components) == 1 and guards is None else CompositeReward(components, guards=guards)
    return SelfCriticalStep(
        reward, tokenizer, samples=args.samples, baseline=args.baseline, max_new_tokens=args.max_new_tokens,
        visual_column="image", generation_kwargs={"suppress_tokens": special_ids(tokenizer)},
        unscored_reward=getattr(args, "unscored_reward", None),
    )


# ------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/scst_captioner", help="output directory")
    p.add_argument("--model", default="tiny", help="VisionEncoderDecoderModel name or directory, or 'tiny'")
    p.add_argument("--init", help="start from this saved model directory (e.g. a cross-entropy run's <out>/model)")
    p.add_argument("--clip", default="colour", help="CLIP specification, or 'colour'/'tiny' for the offline test models")
    p.add_argument("--objective", choices=OBJECTIVES, default="scst")
    p.add_argument("--reward", choices=REWARDS, default="clip-s", help="reward (and monitored validation metric)")
    p.add_argument("--hallucination", type=float, default=0.0, help="weight of the hallucination penalty (scst)")
    p.add_argument("--guards", action="store_true", help="add capreward's repetition and dangling-word guards (scst)")
    p.add_argument("--baseline", choices=("greedy", "mean"), default="greedy", help="SCST baseline")
    p.add_argument("--unscored-reward", type=float, default=None,
                   help="reward of captions the reward cannot score, e.g. empty ones (default: no advantage)")
    p.add_argument("--samples", type=int, default=4, help="captions sampled per image (scst)")
    p.add_argument("--tau", type=float, default=1.0, help="Gumbel-softmax temperature (differentiable)")
    p.add_argument("--ce-weight", type=float, default=0.0, help="cross-entropy weight added to the reward objective")
    p.add_argument("--train", help="JSONL manifest of training images (default: synthetic colour images)")
    p.add_argument("--val", help="JSONL manifest of validation images (default: synthetic colour images)")
    p.add_argument("--train-size", type=int, default=64)
    p.add_argument("--val-size", type=int, default=24)
    p.add_argument("--hedge", type=float, default=0.0, help="fraction of colour-free synthetic training targets")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 3e-3 for ce, 5e-4 otherwise)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train, validate, save; return ``best_model_path``, ``best_score``, ``model_dir``, ``history``."""
    args = parse_args(argv)
    lp.seed_everything(args.seed, workers=True)
    out = Path(args.out)
    model, processor, tokenizer = load_captioner(args.init or args.model, args.seed)
    backbone = load_backbone(args.clip)
    train_items = jsonl_images(args.train) if args.train else synthetic_images(args.train_size, args.seed, hedge=args.hedge)
    val_items = jsonl_images(args.val) if args.val else synthetic_images(args.val_size, args.seed + 10_000)
    train = ImageCaptions(train_items, processor, tokenizer)
    val = ImageCaptions(val_items, processor, tokenizer)

    objective = build_objective(args, backbone, tokenizer, train_items[:32])
    lr = args.lr if args.lr is not None else (3e-3 if args.objective == "ce" else 5e-4)
    ce_weight = 1.0 if args.objective == "ce" else args.ce_weight
    module = RewardCaptionerModule(
        model, tokenizer, objective, ce_weight=ce_weight, lr=lr, max_new_tokens=args.max_new_tokens,
        references_key=None,  # the recipe's rewards are reference-free (CLIP-S, EMScore(X, V))
        generation_kwargs={"suppress_tokens": special_ids(tokenizer)},
    )
    metric = MONITOR[args.reward]
    scores = CaptionScoreCallback(
        [CLIPScoreMetric(backbone=backbone, visual="image"), EMScoreMetric(backbone=backbone, visual="image")],
        captions="captions", visuals="image", references=None, ids="index", examples=0, rank_by=metric,
    )
    best = ModelCheckpoint(dirpath=out / "checkpoints", monitor=f"val/{metric}", mode="max", save_top_k=1,
                           filename="best-epoch={epoch:02d}", auto_insert_metric_name=False)
    trainer = lp.Trainer(
        default_root_dir=out, max_epochs=args.epochs, accelerator=args.accelerator, devices=1,
        callbacks=[scores, best], logger=CSVLogger(out, name="logs"), log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(
        module,
        DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate),
        DataLoader(val, batch_size=args.batch_size, shuffle=False, collate_fn=collate),
    )
    if best.best_model_path:
        state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
        module.load_state_dict(state)
    model_dir = out / "model"
    module.model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    result = {
        "best_model_path": best.best_model_path,
        "best_score": None if best.best_model_score is None else float(best.best_model_score),
        "monitor": f"val/{metric}",
        "model_dir": str(model_dir),
        "history": scores.history,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=2))
    return result


if __name__ == "__main__":
    main()
