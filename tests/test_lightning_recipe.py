"""recipes/lightning_captioner.py end to end on the tiny CLIP and synthetic clips (CPU): it trains
(cross-entropy falls), validates every epoch through the callback, and the kept checkpoint is the best
epoch by val/emscore, which an independent re-scoring of that checkpoint's captions confirms; the final
model is saved as well and loads back to the trained one."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch

from capreward import EMScore
from capreward.backbones import CLIPBackbone
from capreward.testing import tiny_clip_factory
from conftest import import_script

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "lightning_captioner.py"


@pytest.fixture(scope="module")
def recipe():
    yield import_script(RECIPE, "lightning_captioner")
    sys.modules.pop("lightning_captioner", None)


ARGS = ["--epochs", "3", "--train-size", "24", "--val-size", "6", "--batch-size", "8", "--frames", "4"]


@pytest.mark.slow
def test_recipe_trains_and_keeps_the_best_epoch_by_emscore(recipe, tmp_path):
    result = recipe.main([*ARGS, "--out", str(tmp_path)])

    history = [h["val/emscore"] for h in result["history"]]
    assert len(history) == 3
    best_epoch = max(range(3), key=lambda e: history[e])
    assert Path(result["best_model_path"]).name == f"best-epoch={best_epoch:02d}.ckpt"
    assert result["best_score"] == pytest.approx(max(history), abs=1e-6)

    # the CSV log has the callback's values per epoch, and cross-entropy went down
    with open(Path(result["log_dir"]) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [float(r["val/emscore"]) for r in rows if r.get("val/emscore")]
    assert logged == pytest.approx(history, abs=1e-6)
    assert {"val/clip_s", "val/emscore/video/fine_p", "val_loss"} <= set(rows[0])
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss")]
    assert losses[-1] < losses[0]
    tables = sorted((Path(result["log_dir"]) / "captions").glob("val-epoch=*.jsonl"))
    assert len(tables) == 3

    # independent check: the kept checkpoint's greedy captions, re-scored directly, give its score
    model = recipe.TinyCaptioner.load_from_checkpoint(result["best_model_path"], map_location="cpu").eval()
    backbone = CLIPBackbone(tiny_clip_factory(0))
    clips = recipe.synthetic_clips(6, seed=1, frames=4)
    val = recipe.CaptionDataset(clips, backbone, recipe.Vocab(["unused"]), frames=4)
    captions = model.generate(val.features)
    # the final model is kept too, and loads back to the trained module's captions and weights
    final = recipe.TinyCaptioner.load_from_checkpoint(result["final_model_path"], map_location="cpu").eval()
    trained = result["model"].eval()
    assert final.vocab_words == trained.vocab_words
    assert all(torch.equal(a, b) for a, b in zip(final.state_dict().values(), trained.state_dict().values()))
    assert final.generate(val.features) == trained.generate(val.features)
    table = [json.loads(line) for line in tables[best_epoch].read_text().splitlines()]
    assert [r["caption"] for r in table] == captions
    keep = [i for i, c in enumerate(captions) if c]
    scores = torch.zeros(len(captions), dtype=torch.float64)  # an empty caption scores 0 in the metric
    if keep:
        res = EMScore(backbone=backbone, frames=4).score(
            [captions[i] for i in keep], videos=[clips[i]["video"] for i in keep],
            references=[clips[i]["captions"] for i in keep],
        )
        scores[keep] = res.score.double()
    assert float(scores.mean()) == pytest.approx(result["best_score"], abs=1e-5)
