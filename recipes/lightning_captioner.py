"""Recipe: train a small video captioner with cross-entropy in Lightning, validate every epoch with
EMScore and CLIP-S through :class:`capreward.callbacks.CaptionScoreCallback`, keep the best epoch by
EMScore.

The captioner is a frozen CLIP video encoder (mean of the frame embeddings) feeding a one-layer GRU
decoder over a word vocabulary built from the training captions. The same CLIP backbone is shared by
the encoder and by both metrics, so it is loaded once and never copied.

Runs offline on tiny local models (the default: the tiny CLIP of ``capreward.testing`` and synthetic
clips of a coloured square moving over a coloured background)::

    python recipes/lightning_captioner.py --epochs 5 --out runs/captioner
    python recipes/lightning_captioner.py --devices 2 --strategy ddp          # CPU DDP (gloo)

With a real CLIP and data: ``--clip ViT-B-32/openai --train data/train.jsonl --val data/val.jsonl``,
where each JSONL line is ``{"video": "clip.mp4", "captions": ["a man ...", ...]}`` (the first caption
is the training target, all of them are the validation references).

Outputs under ``--out``: ``checkpoints/best-epoch=NN.ckpt`` (monitor ``val/emscore``, mode max),
``final.ckpt`` (the last epoch; both hold the vocabulary in their hyperparameters, so
``TinyCaptioner.load_from_checkpoint(path).generate(features)`` captions on its own), the CSV
logs (``val/emscore``, ``val/clip_s`` and their sub-scores per epoch) and one JSONL table of every
validation caption and its scores per epoch in ``<log_dir>/captions``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as lp
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from capreward.backbones import CLIPBackbone
from capreward.callbacks import CaptionScoreCallback
from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 50),
           "white": (240, 240, 240), "black": (20, 20, 20)}


# ------------------------------------------------------------------------------------------- data
class Vocab:
    """Word-level vocabulary: ids 0-3 are <pad>, <bos>, <eos>, <unk>; words in first-seen order."""

    def __init__(self, captions: Sequence[str]):
        words = dict.fromkeys(w for c in captions for w in c.lower().split())
        self.itos = SPECIALS + list(words)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, caption: str) -> list[int]:
        """<bos> word ids <eos>."""
        return [BOS] + [self.stoi.get(w, UNK) for w in caption.lower().split()] + [EOS]

    def decode(self, ids: Sequence[int]) -> str:
        return decode(ids, self.itos)


def decode(ids: Sequence[int], words: Sequence[str]) -> str:
    """The words of ``ids`` up to the first <eos>, special tokens dropped."""
    kept = []
    for i in ids:
        if i == EOS:
            break
        if i > UNK:
            kept.append(words[i])
    return " ".join(kept)


def synthetic_clips(n: int, seed: int, frames: int = 8, size: int = 32) -> list[dict[str, Any]]:
    """Clips of a coloured square moving left or right over a coloured background, with a caption
    that names both colours and the direction. Returns dicts with ``video`` (uint8 T,H,W,3) and
    ``captions`` (one caption)."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    out = []
    for _ in range(n):
        fg, bg = rng.choice(len(names), size=2, replace=False)
        direction = rng.choice(["left", "right"])
        video = np.empty((frames, size, size, 3), dtype=np.uint8)
        video[:] = COLOURS[names[bg]]
        side = size // 3
        top = int(rng.integers(0, size - side))
        for t in range(frames):
            x = int(round((size - side) * t / max(frames - 1, 1)))
            x = x if direction == "right" else size - side - x
            video[t, top : top + side, x : x + side] = COLOURS[names[fg]]
        noise = rng.normal(0, 6, size=video.shape)
        video = np.clip(video + noise, 0, 255).astype(np.uint8)
        out.append({"video": video, "captions": [f"a {names[fg]} square moves {direction} on a {names[bg]} background"]})
    return out


def jsonl_clips(path: str | os.PathLike, frames: int) -> list[dict[str, Any]]:
    """Clips listed in a JSONL manifest (``{"video": path, "captions": [...]}`` per line), decoded."""
    from capreward.media import load_video

    root = Path(path).parent
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        entry = json.loads(line)
        if not entry.get("captions"):
            raise ValueError(f"{path}: line {n + 1} has no captions")
        video = load_video(root / entry["video"], frames=frames, index=n)
        out.append({"video": video, "captions": list(entry["captions"])})
    return out


class CaptionDataset(Dataset):
    """Clips with precomputed (frozen) CLIP video features, target tokens, references and indices."""

    def __init__(self, clips: list[dict[str, Any]], backbone: CLIPBackbone, vocab: Vocab, frames: int):
        self.clips = clips
        self.vocab = vocab
        embeddings = backbone.visual_embeddings([c["video"] for c in clips], kind="video", frames=frames)
        self.features = torch.stack([F.normalize(e.mean(0), dim=-1) for e in embeddings]).cpu()

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> dict[str, Any]:
        clip = self.clips[i]
        return {
            "index": i,
            "features": self.features[i],
            "tokens": torch.tensor(self.vocab.encode(clip["captions"][0])),
            "video": torch.from_numpy(np.ascontiguousarray(clip["video"])),
            "references": clip["captions"],
        }


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack features/videos, pad tokens with <pad>, keep each sample's references together."""
    return {
        "index": torch.tensor([it["index"] for it in items]),
        "features": torch.stack([it["features"] for it in items]),
        "tokens": torch.nn.utils.rnn.pad_sequence([it["tokens"] for it in items], batch_first=True, padding_value=PAD),
        "video": torch.stack([it["video"] for it in items]),
        "references": [it["references"] for it in items],
    }


# ------------------------------------------------------------------------------------------ model
class TinyCaptioner(lp.LightningModule):
    """Video feature -> GRU decoder; trained with cross-entropy (teacher forcing), greedy at validation.

    ``validation_step`` returns ``{"captions": [...]}`` for the callback and logs ``val_loss``.
    """

    def __init__(self, feature_dim: int, vocab: list[str], hidden: int = 128, lr: float = 3e-3, max_len: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.vocab_words = list(vocab)
        self.init = torch.nn.Linear(feature_dim, hidden)
        self.embed = torch.nn.Embedding(len(vocab), hidden, padding_idx=PAD)
        self.gru = torch.nn.GRU(hidden, hidden, batch_first=True)
        self.out = torch.nn.Linear(hidden, len(vocab))

    def _decode(self, features: torch.Tensor, tokens: torch.Tensor, state=None):
        h0 = torch.tanh(self.init(features)).unsqueeze(0) if state is None else state
        y, h = self.gru(self.embed(tokens), h0)
        return self.out(y), h

    def loss(self, batch) -> torch.Tensor:
        tokens = batch["tokens"]
        logits, _ = self._decode(batch["features"], tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), ignore_index=PAD)

    @torch.no_grad()
    def generate(self, features: torch.Tensor) -> list[str]:
        """Greedy captions, one per feature row."""
        n = features.shape[0]
        token = torch.full((n, 1), BOS, dtype=torch.long, device=features.device)
        state, rows = None, []
        for _ in range(self.hparams.max_len):
            logits, state = self._decode(features, token, state)
            token = logits[:, -1].argmax(-1, keepdim=True)
            rows.append(token)
        return [decode(row, self.vocab_words) for row in torch.cat(rows, dim=1).tolist()]

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["index"]), sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), batch_size=len(batch["index"]), sync_dist=True)
        return {"captions": self.generate(batch["features"])}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


# ------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/lightning_captioner", help="output directory")
    p.add_argument("--clip", default="tiny", help="CLIP specification, or 'tiny' for the offline test model")
    p.add_argument("--train", help="JSONL manifest of training clips (default: synthetic clips)")
    p.add_argument("--val", help="JSONL manifest of validation clips (default: synthetic clips)")
    p.add_argument("--train-size", type=int, default=64, help="synthetic training clips")
    p.add_argument("--val-size", type=int, default=16, help="synthetic validation clips")
    p.add_argument("--frames", type=int, default=8, help="frames per clip for the encoder and EMScore")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_backbone(spec: str, device: str) -> CLIPBackbone:
    if spec == "tiny":
        from capreward.testing import tiny_clip_factory

        return CLIPBackbone(tiny_clip_factory(0), device=device)
    return CLIPBackbone(spec, device=device)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train and validate; return ``final_model_path``, ``model`` (the trained module), ``best_model_path``,
    ``best_score`` (val/emscore), ``history`` and ``log_dir``."""
    args = parse_args(argv)
    lp.seed_everything(args.seed, workers=True)
    out = Path(args.out)
    device = "cuda" if args.accelerator in ("gpu", "cuda") and torch.cuda.is_available() else "cpu"
    backbone = build_backbone(args.clip, device)

    train_clips = jsonl_clips(args.train, args.frames) if args.train else synthetic_clips(args.train_size, args.seed, args.frames)
    val_clips = jsonl_clips(args.val, args.frames) if args.val else synthetic_clips(args.val_size, args.seed + 1, args.frames)
    vocab = Vocab([c["captions"][0] for c in train_clips])
    train = CaptionDataset(train_clips, backbone, vocab, args.frames)
    val = CaptionDataset(val_clips, backbone, vocab, args.frames)

    model = TinyCaptioner(train.features.shape[1], vocab.itos, hidden=args.hidden, lr=args.lr)
    scores = CaptionScoreCallback(
        [EMScoreMetric(backbone=backbone, frames=args.frames), CLIPScoreMetric(backbone=backbone, visual="video", frames=args.frames)],
        captions="captions", visuals="video", references="references", ids="index", table="jsonl", examples=3,
    )
    best = ModelCheckpoint(dirpath=out / "checkpoints", monitor="val/emscore", mode="max", save_top_k=1,
                           filename="best-epoch={epoch:02d}", auto_insert_metric_name=False)
    trainer = lp.Trainer(
        default_root_dir=out, max_epochs=args.epochs, accelerator=args.accelerator, devices=args.devices,
        strategy=args.strategy, callbacks=[scores, best], logger=CSVLogger(out, name="logs"),
        log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        deterministic=True,
    )
    trainer.fit(
        model,
        DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate),
        DataLoader(val, batch_size=args.batch_size, shuffle=False, collate_fn=collate),
    )
    final = out / "final.ckpt"
    trainer.save_checkpoint(final)  # the last epoch, whatever its score (the best one is kept by ``best``)
    result = {
        "final_model_path": str(final),
        "model": model,
        "best_model_path": best.best_model_path,
        "best_score": None if best.best_model_score is None else float(best.best_model_score),
        "history": scores.history,
        "log_dir": trainer.log_dir,
    }
    if trainer.is_global_zero:
        print(json.dumps({k: v for k, v in result.items() if k not in ("history", "model")}, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
