"""CaptionScoreCallback's best/worst-captions text table through the real Lightning loggers, offline.

Each test does a tiny real fit (2 epochs; validation after global steps 2 and 4, whose values Lightning
logs at steps 1 and 3) with one real logger in ``tmp_path``, then reads back what that logger wrote, with
the logger's own reader where it has one: TensorBoard's event files (``EventAccumulator``), the offline
Weights & Biases run (its ``.wandb`` record log and the table files it points to) and MLflow's file
store (the run's ``.md`` artifacts). The expected rows come from the callback's per-epoch JSONL tables of the same run, so every step's logged
table is checked against the captions and scores of that epoch, and each table must sit at the step
where the same logger got that epoch's ``val/emscore``.

Each test skips only when its logger's package is absent; the ``test`` extra installs all three.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from test_lightning_callback import TinyCaptioner, fit, loaders, make_callback  # noqa: E402

KEY = "emscore"
K = 2
STEPS = [1, 3]  # limit_train_batches=2: Lightning logs the epoch-end validation values at global_step - 1
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")


class NumberedCaptioner(TinyCaptioner):
    """The tiny captioner with each sample's index spelled out in its caption: every caption differs."""

    def validation_step(self, batch, batch_idx):
        return {"captions": [f"{c} {NUMBERS[int(i)]}" for c, i in zip(self.generate(batch["video"]), batch["index"])]}

    test_step = validation_step


def fit_with(tmp_path: Path, logger, **callback_kwargs):
    """Two epochs with ``logger``; return (trainer, model, callback, each epoch's JSONL rows in epoch order)."""
    callback = make_callback(examples=K, table="jsonl", table_dir=tmp_path / "captions", **callback_kwargs)
    trainer, model = fit(tmp_path, [callback], epochs=2, logger=logger, module_cls=NumberedCaptioner)
    return trainer, model, callback, tables(tmp_path / "captions", "val")


def tables(directory: Path, stage: str) -> list[list[dict]]:
    paths = sorted(directory.glob(f"{stage}-epoch=*-step=*.jsonl"), key=lambda p: int(re.search(r"epoch=(\d+)", p.name).group(1)))
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in paths]


def expected(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Best K (highest emscore first) and worst K (lowest first), computed here from the JSONL rows."""
    ranked = sorted(rows, key=lambda r: r[KEY], reverse=True)
    assert len({r["caption"] for r in rows}) == len(rows)  # distinct captions: the check below is meaningful
    return ranked[:K], ranked[::-1][:K]


def check_markdown(text: str, rows: list[dict]) -> None:
    """The Markdown text has a best and a worst table with those samples' ids, captions, references, scores."""
    best, worst = expected(rows)
    assert text.startswith(f"**best by {KEY}**")
    head, tail = text.split(f"**worst by {KEY}**")
    for section, want in ((head, best), (tail, worst)):
        lines = [line for line in section.splitlines() if line.startswith("|")]
        assert lines[0] == f"| id | caption | references | {KEY} | clip_s |"
        body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
        assert len(body) == K
        for cells, r in zip(body, want):
            assert cells[:3] == [str(r["id"]), r["caption"], " / ".join(r["references"])]
            assert float(cells[3]) == pytest.approx(r[KEY], abs=5e-5)
            assert float(cells[4]) == pytest.approx(r["clip_s"], abs=5e-5)


# ---------------------------------------------------------------------------------- TensorBoard
def test_tensorboard_text_at_each_validation_step(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb", name="captioner")
    trainer, model, callback, epochs = fit_with(tmp_path, logger, test=True)
    trainer.test(model, loaders()[1], verbose=False)
    test_rows = tables(tmp_path / "captions", "test")
    logger.experiment.flush()

    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    assert sorted(tags) == ["test/captions/text_summary", "val/captions/text_summary"]
    val = events.Tensors("val/captions/text_summary")
    assert [e.step for e in val] == STEPS == [e.step for e in events.Scalars("val/emscore")]
    assert len(epochs) == len(STEPS)
    for e, rows in zip(val, epochs):
        check_markdown(e.tensor_proto.string_val[0].decode(), rows)
    (test,) = events.Tensors("test/captions/text_summary")
    assert [test.step] == [e.step for e in events.Scalars("test/emscore")] == [4]
    check_markdown(test.tensor_proto.string_val[0].decode(), test_rows[0])


# ----------------------------------------------------------------------------- Weights & Biases
def wandb_records(path: Path) -> list:
    """The records of an offline run's ``.wandb`` file: a LevelDB-style log of ``Record`` protobufs.

    A 7-byte W&B header, then 32 KiB blocks of chunks, each with a 7-byte header (CRC32C, length,
    type: 1 full, 2 first, 3 middle, 4 last); a block's tail shorter than a header is padding.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding
            continue
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    """Every history row of the run, keys joined with '/', values decoded from JSON."""
    (path,) = run_dir.glob("*.wandb")
    rows = []
    for r in wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item})
    return rows


def close_wandb(wandb) -> None:
    """Finish the run and wait until its ``.wandb`` file is complete on disk.

    ``wandb.finish()`` returns once the service has handled the run's exit record, then only *informs*
    the service process that the run is finished (a one-way message). The service writes the
    transaction log through a LevelDB-style writer that holds the current 32 KiB block in memory and
    writes it when the stream closes, which it does after handling that message, on its own schedule.
    ``wandb.teardown()`` asks the service to shut down and waits for its process to exit; the service
    handles a connection's messages in order, so by then the run's stream is closed and the file complete.
    """
    wandb.finish()
    wandb.teardown()


def test_wandb_offline_table_at_each_validation_step(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    for var, value in {"WANDB_MODE": "offline", "WANDB_DIR": tmp_path, "WANDB_CONFIG_DIR": tmp_path / "config",
                       "WANDB_CACHE_DIR": tmp_path / "cache", "WANDB_DATA_DIR": tmp_path / "data",
                       "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_X_DISABLE_STATS": "true",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true"}.items():
        monkeypatch.setenv(var, str(value))
    logger = WandbLogger(project="capreward-test", save_dir=str(tmp_path), offline=True)
    try:
        _, _, _, epochs = fit_with(tmp_path, logger)
        files = Path(logger.experiment.dir)
    finally:
        close_wandb(wandb)
    history = wandb_history(files.parent)
    tables_logged = [h for h in history if "val/captions/path" in h]

    assert [h["trainer/global_step"] for h in tables_logged] == STEPS
    assert [h["trainer/global_step"] for h in history if "val/emscore" in h] == STEPS
    assert len(epochs) == len(STEPS)
    for h, rows in zip(tables_logged, epochs):
        assert h["val/captions/_type"] == "table-file"
        table = json.loads((files / h["val/captions/path"]).read_text())
        assert table["columns"] == ["rank", "id", "caption", "references", KEY, "clip_s"]
        best, worst = expected(rows)
        want = [[f"best {i + 1}", r] for i, r in enumerate(best)] + [[f"worst {i + 1}", r] for i, r in enumerate(worst)]
        assert len(table["data"]) == 2 * K
        for row, (rank, r) in zip(table["data"], want):
            assert row[:4] == [rank, r["id"], r["caption"], " / ".join(r["references"])]
            assert row[4:] == pytest.approx([r[KEY], r["clip_s"]], abs=1e-6)


# ------------------------------------------------------------------------------------- MLflow
@pytest.fixture
def mlflow_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses the file store without it
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    return "file:" + str(tmp_path / "mlruns")


def test_mlflow_markdown_artifact_at_each_validation_step(tmp_path, mlflow_file_store):
    import mlflow.artifacts
    from lightning.pytorch.loggers import MLFlowLogger

    logger = MLFlowLogger(experiment_name="captions", tracking_uri=mlflow_file_store)
    _, _, _, epochs = fit_with(tmp_path, logger, log_sub_scores=False)  # the file store holds no sub-scores

    client = logger.experiment
    names = sorted(a.path for a in client.list_artifacts(logger.run_id))
    assert names == [f"val_captions_step{s}.md" for s in STEPS]
    assert [m.step for m in client.get_metric_history(logger.run_id, "val/emscore")] == STEPS
    assert len(epochs) == len(STEPS)
    root = client.get_run(logger.run_id).info.artifact_uri
    for step, rows in zip(STEPS, epochs):
        check_markdown(mlflow.artifacts.load_text(f"{root}/val_captions_step{step}.md"), rows)


def test_mlflow_file_store_with_sub_scores_stops_at_setup(tmp_path, mlflow_file_store):
    """MLflow's file store keeps each metric in a file named by its key, so it cannot hold ``val/emscore``
    beside ``val/emscore/video/fine_p`` (the one sub-score separator, "/"): the callback says so at setup,
    before the first training step, and runs with ``log_sub_scores=False``."""
    import lightning.pytorch as lp
    from lightning.pytorch.loggers import MLFlowLogger

    from test_lightning_callback import loaders

    logger = MLFlowLogger(experiment_name="captions", tracking_uri=mlflow_file_store)
    model = NumberedCaptioner()
    trainer = lp.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=2,
                         num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                         logger=logger, callbacks=[make_callback(examples=0)])
    with pytest.raises(ValueError, match=r"MLflow's file store .* cannot hold .*sqlite:///mlflow.db.*log_sub_scores=False"):
        trainer.fit(model, *loaders())
    assert trainer.global_step == 0

    logger = MLFlowLogger(experiment_name="captions2", tracking_uri=mlflow_file_store)
    fit(tmp_path, [make_callback(examples=0, log_sub_scores=False)], epochs=1, logger=logger)
    assert logger.experiment.get_metric_history(logger.run_id, "val/emscore")
