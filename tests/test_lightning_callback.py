"""CaptionScoreCallback on real Lightning runs (CPU): logged values against the scorers, checkpoint
monitoring and early stopping on ``val/emscore``, tables, callback state, sanity-check skipping, the
``pytorch_lightning`` package, and a 1-process vs 2-process DDP (gloo) comparison.

Run as a script (``python tests/test_lightning_callback.py OUT.json --devices 2``) this file does one
validation-only fit and writes the logged metrics and the per-sample table; the DDP test runs it in a
subprocess because Lightning's ``strategy="ddp"`` re-launches the running script for rank 1.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # when run as a script
    sys.path.insert(0, str(HERE))

import lightning.pytorch as lp  # noqa: E402
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from conftest import random_video  # noqa: E402

from capreward import CLIPScore, EMScore  # noqa: E402
from capreward.backbones import CLIPBackbone  # noqa: E402
from capreward.callbacks import CaptionScoreCallback  # noqa: E402
from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric  # noqa: E402
from capreward.testing import tiny_clip_factory  # noqa: E402

FRAMES = 4
N_VAL = 7  # odd on purpose: a 2-process DistributedSampler pads it with a repeated sample
SLOTS = (("dark", "bright", "pale"), ("red", "green", "blue"), ("video", "clip", "scene"))


# ------------------------------------------------------------------------------- tiny captioner
def make_items(n: int, offset: int = 0) -> list[dict]:
    """Synthetic clips whose target caption follows their colours (brightness, dominant channel)."""
    items = []
    for i in range(n):
        video = torch.from_numpy(random_video(100 + offset + i, frames=FRAMES, height=32, width=32))
        mean = video.float().mean(dim=(0, 1, 2)) / 255
        target = [min(int(mean.mean() * 6) % 3, 2), int(mean.argmax()), i % 3]
        words = [SLOTS[s][t] for s, t in enumerate(target)]
        items.append(
            {
                "video": video,
                "index": i,
                "target": torch.tensor(target),
                "references": [f"a {words[0]} {words[1]} {words[2]}", f"{words[1]} colours"],
            }
        )
    return items


def collate(items: list[dict]) -> dict:
    """Stack tensors; keep each sample's list of references together (default_collate would transpose)."""
    return {
        "video": torch.stack([it["video"] for it in items]),
        "index": torch.tensor([it["index"] for it in items]),
        "target": torch.stack([it["target"] for it in items]),
        "references": [it["references"] for it in items],
    }


def collate_without_index(items: list[dict]) -> dict:
    """Batches that do not say which dataset samples they hold."""
    batch = collate(items)
    del batch["index"]
    return batch


def features(video: torch.Tensor) -> torch.Tensor:
    """Mean colour of each frame quadrant: (B, T, H, W, 3) uint8 -> (B, 12) in [0, 1]."""
    x = video.float().mean(dim=1) / 255
    h, w = x.shape[1] // 2, x.shape[2] // 2
    quads = [x[:, :h, :w], x[:, :h, w:], x[:, h:, :w], x[:, h:, w:]]
    return torch.cat([q.mean(dim=(1, 2)) for q in quads], dim=1)


def captioner_class(base):
    """The tiny captioning module on a given LightningModule base (lightning or pytorch_lightning)."""

    class TinyCaptioner(base):
        """Three word slots predicted from colour features; greedy captions like "bright red clip"."""

        def __init__(self, lr: float = 0.5):
            super().__init__()
            self.lr = lr
            self.head = torch.nn.Linear(12, len(SLOTS) * 3)

        def logits(self, video):
            return self.head(features(video)).view(-1, len(SLOTS), 3)

        def generate(self, video) -> list[str]:
            best = self.logits(video).argmax(-1)
            return [" ".join(SLOTS[s][int(t)] for s, t in enumerate(row)) for row in best]

        def training_step(self, batch, batch_idx):
            loss = F.cross_entropy(self.logits(batch["video"]).reshape(-1, 3), batch["target"].reshape(-1))
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            return {"captions": self.generate(batch["video"])}

        def test_step(self, batch, batch_idx):
            return {"captions": self.generate(batch["video"])}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return TinyCaptioner


TinyCaptioner = captioner_class(lp.LightningModule)


def make_callback(backbone=None, **kwargs) -> CaptionScoreCallback:
    backbone = backbone or CLIPBackbone(tiny_clip_factory(0))
    metrics = [
        EMScoreMetric(backbone=backbone, frames=FRAMES),
        CLIPScoreMetric(backbone=backbone, visual="video", frames=FRAMES),
    ]
    kwargs.setdefault("references", "references")
    return CaptionScoreCallback(metrics, **kwargs)


def loaders(n_val: int = N_VAL, val_batch_size: int = 2, index: bool = True):
    train = DataLoader(make_items(8, offset=50), batch_size=4, shuffle=True, collate_fn=collate)
    val = DataLoader(make_items(n_val), batch_size=val_batch_size, shuffle=False,
                     collate_fn=collate if index else collate_without_index)
    return train, val


def fit(root: Path, callbacks: list, epochs: int = 1, lr: float = 0.5, trainer_module=lp, module_cls=None,
        val_batch_size: int = 2, n_val: int = N_VAL, index: bool = True, **trainer_kwargs):
    """Fit the (seeded) tiny captioner on CPU; return (trainer, model)."""
    trainer_module.seed_everything(0, workers=True)
    kwargs = dict(
        default_root_dir=root, accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=2,
        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False,
    )
    kwargs.update(trainer_kwargs)
    trainer = trainer_module.Trainer(callbacks=callbacks, **kwargs)
    model = (module_cls or TinyCaptioner)(lr=lr)
    trainer.fit(model, *loaders(n_val, val_batch_size=val_batch_size, index=index))
    return trainer, model


def direct_scores(model, n_val: int = N_VAL):
    """Independent path: captions from the module's own generate, scored by fresh scorers."""
    items = make_items(n_val)
    with torch.no_grad():
        captions = model.generate(torch.stack([it["video"] for it in items]))
    fresh = CLIPBackbone(tiny_clip_factory(0))
    videos = [it["video"].numpy() for it in items]
    refs = [it["references"] for it in items]
    em = EMScore(backbone=fresh, frames=FRAMES).score(captions, videos=videos, references=refs)
    cs = CLIPScore(backbone=fresh, frames=FRAMES).score(captions, videos=videos, references=refs)
    return captions, em, cs


class TextRecorder(Logger):
    """A logger whose experiment takes ``add_text`` like TensorBoard's SummaryWriter; records the calls."""

    def __init__(self):
        super().__init__()
        self.texts: list[tuple[str, str, int]] = []

    name = "rec"
    version = 0

    @property
    def experiment(self):
        return self

    def add_text(self, tag, text, global_step=None):
        self.texts.append((tag, text, global_step))

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass


# ------------------------------------------------------------------------------------- tests
@pytest.mark.integration
def test_logged_values_equal_scorers_and_best_epoch_is_checkpointed(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/emscore", mode="max", save_top_k=1,
                           filename="best-{epoch}")
    callback = make_callback(table="jsonl", examples=2)
    recorder = TextRecorder()
    trainer, model = fit(tmp_path, [callback, ckpt], epochs=3, enable_checkpointing=True, logger=recorder)

    # the last epoch's logged values equal the scorers' own numbers on the same captions
    captions, em, cs = direct_scores(model)
    logged = trainer.callback_metrics
    assert float(logged["val/emscore"]) == pytest.approx(float(em.score.double().mean()), abs=1e-5)
    assert float(logged["val/emscore/video/fine_p"]) == pytest.approx(float(em.video.fine_p.double().mean()), abs=1e-5)
    assert float(logged["val/emscore/reference/full_f"]) == pytest.approx(float(em.reference.full_f.double().mean()), abs=1e-5)
    assert float(logged["val/clip_s"]) == pytest.approx(float(cs.ref_clip_s.double().mean()), abs=1e-5)
    assert float(logged["val/clip_s/ref_similarity"]) == pytest.approx(float(cs.ref_similarity.double().mean()), abs=1e-5)
    assert [r["caption"] for r in callback.last_table] == captions
    assert [r["emscore"] for r in callback.last_table] == pytest.approx(em.score.tolist(), abs=1e-5)

    # ModelCheckpoint monitored the logged value and kept the best epoch
    values = [h["val/emscore"] for h in callback.history]
    assert len(values) == 3
    best_epoch = max(range(3), key=lambda e: values[e])
    assert float(ckpt.best_model_score) == pytest.approx(max(values), abs=1e-5)
    assert Path(ckpt.best_model_path).name == f"best-epoch={best_epoch}.ckpt"

    # the callback's checkpoint state is config + history only
    state = torch.load(ckpt.best_model_path, weights_only=False)
    cb_state = state["callbacks"][callback.state_key]
    assert set(cb_state) == {"config", "history"}
    assert len(cb_state["history"]) == best_epoch + 1
    assert len(json.dumps(cb_state)) < 10_000
    assert set(state["state_dict"]) == {"head.weight", "head.bias"}  # no metric or backbone weights

    # one JSONL table per epoch in the log dir; best/worst captions as text
    files = sorted((tmp_path / "captions").glob("val-epoch=*.jsonl"))
    assert len(files) == 3
    rows = [json.loads(line) for line in files[-1].read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(N_VAL))
    assert rows[0]["references"] == make_items(1)[0]["references"]
    assert rows[0]["emscore"] == pytest.approx(float(em.score[0]), abs=1e-5)
    assert len(recorder.texts) == 3 and recorder.texts[0][0] == "val/captions"
    best = max(callback.last_table, key=lambda r: r["emscore"])
    assert "**best by emscore**" in recorder.texts[-1][1] and best["caption"] in recorder.texts[-1][1]

    # resuming from the best checkpoint restores the history up to it and keeps appending
    resumed = make_callback()
    trainer2 = lp.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=4, limit_train_batches=2,
                          num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                          logger=False, enable_checkpointing=False, callbacks=[resumed])
    trainer2.fit(TinyCaptioner(), *loaders(), ckpt_path=ckpt.best_model_path)
    assert [h["epoch"] for h in resumed.history] == [0, 1, 2, 3]
    assert resumed.history[: best_epoch + 1] == callback.history[: best_epoch + 1]


@pytest.mark.integration
def test_early_stopping_on_the_logged_metric(tmp_path):
    stop = EarlyStopping(monitor="val/emscore", mode="max", patience=1, min_delta=10.0)
    trainer, _ = fit(tmp_path, [make_callback(examples=0), stop], epochs=6)
    assert trainer.current_epoch == 2 and stop.stopped_epoch == 1


def test_sanity_check_is_skipped_unless_asked(tmp_path):
    skipped = make_callback(examples=0)
    fit(tmp_path, [skipped], epochs=1, num_sanity_val_steps=2)
    assert [h["n"] for h in skipped.history] == [N_VAL]

    asked = make_callback(examples=0, run_on_sanity_check=True)
    fit(tmp_path, [asked], epochs=1, num_sanity_val_steps=2)
    assert [h["n"] for h in asked.history] == [4, N_VAL]  # 2 sanity batches of 2, then the full epoch


@pytest.mark.integration
def test_works_with_the_pytorch_lightning_package(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    callback = make_callback(examples=0, test=True)
    trainer, model = fit(tmp_path, [callback], epochs=1, trainer_module=pl, module_cls=captioner_class(pl.LightningModule))
    _, em, _ = direct_scores(model)
    assert float(trainer.callback_metrics["val/emscore"]) == pytest.approx(float(em.score.double().mean()), abs=1e-5)
    out = trainer.test(model, loaders()[1], verbose=False)
    assert out[0]["test/emscore"] == pytest.approx(float(em.score.double().mean()), abs=1e-5)


class TupleCaptioner(TinyCaptioner):
    """Batches are (video, target) tuples and validation_step returns the list of captions itself."""

    def training_step(self, batch, batch_idx):
        return super().training_step({"video": batch[0], "target": batch[1]}, batch_idx)

    def validation_step(self, batch, batch_idx):
        return self.generate(batch[0])


def test_tuple_batches_plain_caption_outputs_and_csv_tables(tmp_path):
    def tuples(items):
        return torch.stack([it["video"] for it in items]), torch.stack([it["target"] for it in items])

    backbone = CLIPBackbone(tiny_clip_factory(0))
    callback = CaptionScoreCallback([EMScoreMetric(backbone=backbone, frames=FRAMES)], captions=None, visuals=0,
                                    table="csv", examples=0)
    lp.seed_everything(0)
    trainer = lp.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=1,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False, callbacks=[callback])
    model = TupleCaptioner()
    trainer.fit(model, DataLoader(make_items(4), batch_size=4, collate_fn=tuples),
                DataLoader(make_items(N_VAL), batch_size=3, collate_fn=tuples))
    items = make_items(N_VAL)
    captions = model.generate(torch.stack([it["video"] for it in items]))
    direct = EMScore(backbone=backbone, frames=FRAMES).score(captions, videos=[it["video"] for it in items])
    assert float(trainer.callback_metrics["val/emscore"]) == pytest.approx(float(direct.score.double().mean()), abs=1e-5)
    table = next((tmp_path / "captions").glob("val-epoch=000-*.csv")).read_text().splitlines()
    assert table[0].startswith("id,caption,references,emscore,") and len(table) == N_VAL + 1
    assert table[1].split(",")[1] == captions[0]  # no ids: rows in validation order


def test_clear_errors_for_bad_sources(tmp_path):
    with pytest.raises(KeyError, match="'caps' not found; available keys: \\['captions'\\]"):
        fit(tmp_path, [make_callback(captions="caps")], epochs=1)
    with pytest.raises(KeyError, match="references: key 'refs' not found"):
        fit(tmp_path, [make_callback(references="refs")], epochs=1)
    with pytest.raises(ValueError, match="unknown metrics"):
        make_callback(visuals={"nope": "video"})
    with pytest.raises(ValueError, match="two metrics are named"):
        backbone = CLIPBackbone(tiny_clip_factory(0))
        CaptionScoreCallback([EMScoreMetric(backbone=backbone), EMScoreMetric(backbone=backbone)])


class CountingCaptioner(TinyCaptioner):
    training_steps = 0

    def training_step(self, batch, batch_idx):
        type(self).training_steps += 1
        return super().training_step(batch, batch_idx)


def setup_failure(tmp_path, callback, run="fit"):
    """Run ``run`` (fit without a sanity check, or validate) and return (the exception, training steps)."""
    CountingCaptioner.training_steps = 0
    trainer = lp.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=2,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False, callbacks=[callback])
    model = CountingCaptioner()
    train, val = loaders()
    with pytest.raises((ValueError, KeyError)) as info:
        trainer.fit(model, train, val) if run == "fit" else trainer.validate(model, val, verbose=False)
    assert trainer.global_step == 0 and CountingCaptioner.training_steps == 0
    return info.value


def test_a_metric_of_the_wrong_visual_kind_stops_the_run_at_setup(tmp_path):
    """The batches hold videos; a CLIP-S metric left at its default visual="image" (or fed an image source)
    is refused at setup, before the first training step, naming the metric and the fix; so is a visuals key
    the batches do not have. The same metrics with the right kind train and validate."""
    backbone = CLIPBackbone(tiny_clip_factory(0))
    wrong = CaptionScoreCallback([EMScoreMetric(backbone=backbone, frames=FRAMES), CLIPScoreMetric(backbone=backbone)],
                                 references="references")
    exc = setup_failure(tmp_path, wrong)
    assert "metric 'clip_s' takes an image (visual='image')" in str(exc) and "visual='video'" in str(exc)
    assert "validation loader 0" in str(exc)
    exc = setup_failure(tmp_path, CaptionScoreCallback([EMScoreMetric(backbone=backbone, visual="image")]), run="validate")
    assert "metric 'emscore' takes an image" in str(exc)
    exc = setup_failure(tmp_path, CaptionScoreCallback([EMScoreMetric(backbone=backbone)], visuals="clip"))
    assert isinstance(exc, KeyError) and "'clip' not found" in str(exc)

    right = CaptionScoreCallback([EMScoreMetric(backbone=backbone, frames=FRAMES),
                                  CLIPScoreMetric(backbone=backbone, visual="video", frames=FRAMES)], examples=0)
    trainer, _ = fit(tmp_path, [right], epochs=1)
    assert {"val/emscore", "val/clip_s"} <= set(trainer.callback_metrics)


class HookLoaders(CountingCaptioner):
    """Loaders from the module's own hooks; the validation set is built in the module's setup(), which
    Lightning runs after the callbacks' setup."""

    def setup(self, stage):
        self.val_items = make_items(N_VAL)

    def train_dataloader(self):
        return loaders()[0]

    def val_dataloader(self):
        return DataLoader(self.val_items, batch_size=2, collate_fn=collate)


def test_visual_kind_check_reads_hook_loaders_and_skips_what_it_cannot_read_early(tmp_path):
    """A val_dataloader hook that needs the module's setup cannot be read at the callback's setup: the check
    is skipped (the run goes on and scores), it never breaks a run that would work."""
    backbone = CLIPBackbone(tiny_clip_factory(0))
    callback = CaptionScoreCallback([EMScoreMetric(backbone=backbone, frames=FRAMES)], examples=0)
    trainer = lp.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=1,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False, callbacks=[callback])
    trainer.fit(HookLoaders())
    assert [h["n"] for h in callback.history] == [N_VAL]


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process(tmp_path):
    """A 2-process gloo DDP validation equals a 1-process one sample for sample.

    7 validation samples on 2 processes: the DistributedSampler gives rank 0 samples 0, 2, 4, 6 and
    rank 1 samples 1, 3, 5 and a repeat of 0. The batches carry their dataset index, so the metrics
    count sample 0 once and order samples by index. For a bit-exact comparison both runs use one-sample
    validation batches and one thread per process, so every caption goes through the same float32
    kernels with the same reduction order: with other batch shapes or thread counts the scores differ
    in the last bit (~1e-7), which is the scorers' float precision, not a synchronisation error.
    """
    single = validation_run(tmp_path / "single", devices=1)
    out = tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, __file__, str(out), "--devices", "2", "--root", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ddp = json.loads(out.read_text())
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert ddp["seen"] == N_VAL + 1  # the sampler really did repeat a sample
    assert [r["id"] for r in ddp["table"]] == list(range(N_VAL))
    assert [r["caption"] for r in ddp["table"]] == [r["caption"] for r in single["table"]]
    assert ddp["table"] == single["table"]  # every sample's caption, references and every (sub-)score
    assert ddp["metrics"] == single["metrics"]  # every logged value, exactly
    assert {"val/emscore", "val/emscore/video/fine_p", "val/clip_s"} <= set(single["metrics"])


N_PADDED = 13  # 2 processes: rank 0 gets samples 0, 2, ..., 12, rank 1 gets 1, 3, ..., 11 and a repeat of 0


def ddp_run(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, __file__, str(out), "--devices", "2", "--root", str(tmp_path / name), *args],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_ddp_without_index_in_the_batch_reads_ids_from_the_sampler(tmp_path):
    """13 samples on 2 gloo processes, batches without an "index": the callback reads each batch's dataset
    indices from the loader's DistributedSampler, so the repeated sample 0 is counted once and every logged
    value equals the 1-process run's (the exact mean over the 13 samples)."""
    single = validation_run(tmp_path / "single", devices=1, n_val=N_PADDED, index=False)
    ddp = ddp_run(tmp_path, "ddp", "--n-val", str(N_PADDED), "--no-index")
    assert ddp["world_size"] == 2 and ddp["seen"] == N_PADDED + 1  # the sampler really did repeat a sample
    assert [r["id"] for r in ddp["table"]] == list(range(N_PADDED))
    assert [r["id"] for r in single["table"]] == [None] * N_PADDED  # one process: no sampler to read ids from
    assert ddp["table"] == [{**r, "id": i} for i, r in enumerate(single["table"])]
    assert ddp["metrics"] == single["metrics"]
    scores = [r["emscore"] for r in single["table"]]
    assert single["metrics"]["val/emscore"] == pytest.approx(sum(scores) / N_PADDED, abs=1e-6)
    assert ddp["warnings"] == [] and single["warnings"] == []


@pytest.mark.slow
def test_ddp_metric_logged_by_the_module_ids_from_sample_ids_or_a_warning(tmp_path):
    """The ``EMScoreMetric`` + ``self.log`` path on 13 samples and 2 processes: with
    ``ids=sample_ids(self.trainer, batch_idx)`` the value is the 1-process mean over exactly 13 samples;
    without ids the repeated sample 0 is counted twice (mean over 14, computed here from the 1-process
    per-sample scores) and the metric itself warns, naming the count and the dataset's length."""
    single = validation_run(tmp_path / "single", devices=1, n_val=N_PADDED, index=False, mode="metric")
    ddp = ddp_run(tmp_path, "ddp", "--n-val", str(N_PADDED), "--no-index", "--mode", "metric")
    per_sample = single["per_sample"]
    assert len(per_sample) == N_PADDED and single["warnings"] == []
    exact = sum(per_sample) / N_PADDED
    assert single["metrics"]["val/em_ids"] == pytest.approx(exact, abs=1e-6)
    assert ddp["metrics"]["val/em_ids"] == single["metrics"]["val/em_ids"]
    padded = (sum(per_sample) + per_sample[0]) / (N_PADDED + 1)
    assert ddp["metrics"]["val/em_plain"] == pytest.approx(padded, abs=1e-6)
    assert abs(ddp["metrics"]["val/em_plain"] - exact) > 1e-5
    (warning,) = ddp["warnings"]
    assert warning.startswith(f"em_plain: {N_PADDED + 1} samples counted for a dataset of {N_PADDED} on 2 processes")
    assert "sample_ids" in warning


# ------------------------------------------------------------------------- script entry point
class _CountSeen(lp.Callback):
    """Counts validation samples this process saw (before deduplication)."""

    def __init__(self):
        self.seen = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen += len(batch["video"])


class MetricLoggingCaptioner(TinyCaptioner):
    """The torchmetrics path without the callback: the module updates EMScoreMetrics and logs them itself,
    ``em_ids`` with ``ids=sample_ids(self.trainer, batch_idx)``, ``em_plain`` without ids."""

    def __init__(self, lr: float = 0.5, n_val: int = N_VAL):
        super().__init__(lr=lr)  # the head first: building the backbone must not change its seeded weights
        from capreward.callbacks import sample_ids

        self._sample_ids = sample_ids
        backbone = CLIPBackbone(tiny_clip_factory(0))
        self.em_ids = EMScoreMetric(backbone=backbone, frames=FRAMES, dataset_size=n_val, name="em_ids")
        self.em_plain = EMScoreMetric(backbone=backbone, frames=FRAMES, dataset_size=n_val, name="em_plain")
        self.em_per_sample = EMScoreMetric(backbone=backbone, frames=FRAMES, per_sample=True)

    def validation_step(self, batch, batch_idx):
        captions = self.generate(batch["video"])
        ids = self._sample_ids(self.trainer, batch_idx)
        self.em_ids.update(captions, batch["video"], batch["references"], ids=ids)
        self.em_plain.update(captions, batch["video"], batch["references"])
        self.em_per_sample.update(captions, batch["video"], batch["references"])
        self.log("val/em_ids", self.em_ids)
        self.log("val/em_plain", self.em_plain)


def validation_run(root: Path, devices: int, n_val: int = N_VAL, index: bool = True, mode: str = "callback") -> dict:
    """One epoch with a learning rate of 0 (weights stay at their seeded values), then validation.

    ``mode``: "callback" (CaptionScoreCallback scores the returned captions) or "metric" (the module logs
    its own metrics, see :class:`MetricLoggingCaptioner`). Warnings about the sample count are recorded.
    """
    counter = _CountSeen()
    if mode == "callback":
        callback = make_callback(examples=0, table="jsonl")
        callbacks, module_cls = [callback, counter], None
    else:
        callback = None
        callbacks, module_cls = [counter], lambda lr: MetricLoggingCaptioner(lr=lr, n_val=n_val)
    strategy = "ddp" if devices > 1 else "auto"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float reduction order in every process of both runs
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer, model = fit(root, callbacks, epochs=1, lr=0.0, devices=devices, strategy=strategy, val_batch_size=1,
                                 n_val=n_val, index=index, module_cls=module_cls)
    finally:
        torch.set_num_threads(threads)
    seen = torch.tensor(float(counter.seen))
    if trainer.world_size > 1:
        torch.distributed.all_reduce(seen)
    out = {
        "world_size": trainer.world_size,
        "seen": int(seen),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
        "warnings": [str(w.message) for w in caught if "samples counted" in str(w.message)],
        "is_global_zero": trainer.is_global_zero,
    }
    if callback is not None:
        out["table"] = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                        for r in callback.last_table]
    else:
        out["per_sample"] = model.em_per_sample.compute()["per_sample/score"].tolist() if devices == 1 else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--root", default=".")
    parser.add_argument("--n-val", type=int, default=N_VAL)
    parser.add_argument("--no-index", action="store_true", help="batches without the dataset index")
    parser.add_argument("--mode", choices=("callback", "metric"), default="callback")
    args = parser.parse_args()
    result = validation_run(Path(args.root), args.devices, args.n_val, not args.no_index, args.mode)
    if result.pop("is_global_zero"):
        Path(args.out).write_text(json.dumps(result))
    if torch.distributed.is_initialized():  # an orderly gloo teardown, not one at interpreter exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
