"""CaptionEvalCallback on real tiny transformers runs (CPU): a Seq2SeqTrainer training a
VisionEncoderDecoderModel captioner, and TRL's GRPOTrainer with a tiny causal-LM policy.

Checked: the callback logs ``eval_<metric>`` through the trainer at every evaluation (after the
trainer's own eval log), the values equal the scorers' on captions regenerated independently with
``model.generate``, ``metric_for_best_model="eval_emscore"`` tracks the best checkpoint, the per-sample
table is written, and the model's training mode is restored. (``load_best_model_at_end`` is left out:
transformers 5.23 reloads a ViT-based VisionEncoderDecoderModel checkpoint with mismatched key names.)
A torchrun run with 2 CPU processes gives exactly the values of a 1-process run.

Run as a script under torchrun (``python -m torch.distributed.run --nproc_per_node=2
tests/test_trainer_callback.py OUT.json OUTPUT_DIR``) this file does one ``CaptionEvalCallback.evaluate()``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from conftest import random_video

from capreward import EMScore
from capreward.backbones import CLIPBackbone
from capreward.callbacks import CaptionEvalCallback
from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric
from capreward.testing import tiny_clip_factory

FRAMES = 4
WORDS = ["a", "the", "red", "green", "blue", "dark", "bright", "video", "clip", "scene", "of", "describe", ":"]


def tiny_tokenizer():
    """A whitespace word-level tokenizer built in memory: [PAD]=0, [BOS]=1, [EOS]=2, [UNK]=3."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[BOS]", "[EOS]", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]",
        model_input_names=["input_ids", "attention_mask"],  # a causal LM's: transformers < 5 refuses token_type_ids in generate()
    )


def caption_for(video: np.ndarray) -> str:
    mean = video.reshape(-1, 3).mean(0)
    return f"a {'bright' if mean.mean() > 127 else 'dark'} {['red', 'green', 'blue'][int(mean.argmax())]} clip"


def pixel_values(video: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(video[0]).permute(2, 0, 1).float() / 255


def make_examples(n: int, offset: int, tokenizer) -> list[dict]:
    out = []
    for i in range(n):
        video = random_video(300 + offset + i, frames=FRAMES, height=32, width=32)
        caption = caption_for(video)
        out.append(
            {
                "pixel_values": pixel_values(video),
                "labels": tokenizer(caption, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id],
                "video": video,
                "references": [caption],
            }
        )
    return out


def collate(batch: list[dict]) -> dict:
    width = max(len(b["labels"]) for b in batch)
    labels = torch.full((len(batch), width), -100)
    for i, b in enumerate(batch):
        labels[i, : len(b["labels"])] = torch.tensor(b["labels"])
    return {"pixel_values": torch.stack([b["pixel_values"] for b in batch]), "labels": labels}


def tiny_vision_encoder_decoder(tokenizer):
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    torch.manual_seed(0)
    encoder = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    decoder = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=1, n_head=2,
                         add_cross_attention=True, is_decoder=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = 1
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


def direct_emscore_mean(captions, videos, references=None) -> float:
    """Independent path: a fresh backbone and scorer; empty captions score 0 as the metric's default."""
    scorer = EMScore(backbone=CLIPBackbone(tiny_clip_factory(0)), frames=FRAMES)
    keep = [i for i, c in enumerate(captions) if c.strip()]
    values = torch.zeros(len(captions), dtype=torch.float64)
    if keep:
        res = scorer.score([captions[i] for i in keep], videos=[videos[i] for i in keep],
                           references=None if references is None else [references[i] for i in keep])
        values[keep] = res.score.double()
    return float(values.mean())


@pytest.mark.slow
def test_seq2seq_trainer_logs_caption_metrics_and_selects_the_best_checkpoint(tmp_path, tiny_backbone):
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    tokenizer = tiny_tokenizer()
    model = tiny_vision_encoder_decoder(tokenizer)
    train = make_examples(16, 0, tokenizer)
    held_out = make_examples(6, 100, tokenizer)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=8, learning_rate=1e-2,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, save_total_limit=3,
        metric_for_best_model="eval_emscore", greater_is_better=True,
        logging_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=0, seed=0,
    )
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train, eval_dataset=held_out[:4],
                             data_collator=collate, processing_class=tokenizer)
    metrics = [EMScoreMetric(backbone=tiny_backbone, frames=FRAMES),
               CLIPScoreMetric(backbone=tiny_backbone, visual="video", frames=FRAMES)]
    callback = CaptionEvalCallback(trainer, held_out, metrics, references="references", batch_size=4,
                                   max_new_tokens=6, add_to_metrics=True, examples=2)
    trainer.add_callback(callback)
    trainer.train()

    history = trainer.state.log_history
    ours = [h for h in history if "eval_emscore" in h]
    assert [h["step"] for h in ours] == [2, 4, 6]
    for h in ours:  # logged after (not into) the trainer's own eval entry of the same step
        own = [i for i, e in enumerate(history) if "eval_loss" in e and e["step"] == h["step"]]
        assert own and own[0] < history.index(h)
        assert {"eval_clip_s", "eval_emscore/video/fine_p", "eval_emscore/reference/full_f"} <= set(h)

    # the trainer tracked the best checkpoint by eval_emscore (first of equal values, like Trainer)
    values = [h["eval_emscore"] for h in ours]
    assert len(set(values)) > 1  # the captions changed while training
    best_step = ours[values.index(max(values))]["step"]
    assert trainer.state.best_metric == pytest.approx(max(values))
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")

    # evaluate() returns our values too (add_to_metrics); an independent path gives the same number
    for mode in (True, False):  # generation restores the model's mode
        trainer.model.train(mode)
        callback.evaluate()
        assert trainer.model.training is mode
    result = trainer.evaluate()
    assert result["eval_emscore"] == callback.history[-1]["eval_emscore"] == pytest.approx(values[-1], abs=1e-5)
    model = trainer.model.eval()
    with torch.no_grad():
        out = model.generate(pixel_values=torch.stack([e["pixel_values"] for e in held_out]), max_new_tokens=6,
                             do_sample=False)
    captions = [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
    assert [r["caption"] for r in callback.last_table] == captions
    videos = [e["video"] for e in held_out]
    refs = [e["references"] for e in held_out]
    assert result["eval_emscore"] == pytest.approx(direct_emscore_mean(captions, videos, refs), abs=1e-5)

    # per-sample tables, one per evaluation
    files = sorted((tmp_path / "caption_eval").glob("step-*.jsonl"))
    assert [f.name for f in files] == ["step-0000002.jsonl", "step-0000004.jsonl", "step-0000006.jsonl"]
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(6)) and "emscore" in rows[0]
    assert "best by emscore" in callback.last_examples


class ModeAtLog(TrainerCallback):
    """Records the model's training mode whenever caption metrics are logged."""

    def __init__(self):
        self.training: list[bool] = []

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if logs and "eval_emscore" in logs:
            self.training.append(model.training)


@pytest.mark.integration
def test_grpo_trainer_logs_caption_metrics(tmp_path, tiny_backbone):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    ))
    videos = [random_video(400 + i, frames=FRAMES, height=32, width=32) for i in range(4)]
    prompts = [f"describe the {w} clip :" for w in ("red", "green", "blue", "dark")]
    held_out = [{"prompt": p, "video": v} for p, v in zip(prompts, videos)]

    def length_reward(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    args = trl.GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, per_device_eval_batch_size=2,
        num_generations=2, max_completion_length=4, eval_strategy="steps", eval_steps=1, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=1e-2, seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=policy, reward_funcs=length_reward, args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        eval_dataset=Dataset.from_list([{"prompt": p} for p in prompts[:2]]),
    )
    callback = CaptionEvalCallback(trainer, held_out, [EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)],
                                   batch_size=3, max_new_tokens=4, table=None, examples=0)
    modes = ModeAtLog()
    trainer.add_callback(callback)
    trainer.add_callback(modes)
    trainer.train()

    history = trainer.state.log_history
    ours = [h for h in history if "eval_emscore" in h]
    assert [h["step"] for h in ours] == [1, 2]
    assert all(math.isfinite(h["eval_emscore"]) and "eval_emscore/empty" in h for h in ours)
    for h in ours:  # GRPO's own evaluation ran first (its loss and rewards on eval_dataset)
        own = [e for e in history[: history.index(h)] if "eval_loss" in e and e["step"] == h["step"]]
        assert own and "eval_reward" in own[0]

    # called from train mode, the callback still logs in eval mode (GRPOTrainer.log sorts what it merges
    # in by the model's mode), then restores train mode
    trainer.model.train()
    callback.evaluate()
    assert trainer.model.training
    assert modes.training == [False, False, False]

    # independent path: greedy completions from the trained policy, scored directly
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    policy = trainer.model.eval()
    with torch.no_grad():
        out = policy.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=0)
    captions = [t.strip() for t in tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]
    assert [r["caption"] for r in callback.last_table] == captions
    assert ours[-1]["eval_emscore"] == pytest.approx(direct_emscore_mean(captions, videos), abs=1e-5)


def test_callback_arguments_are_checked(tiny_backbone):
    class FakeTrainer:
        processing_class = tiny_tokenizer()

    metric = EMScoreMetric(backbone=tiny_backbone)
    with pytest.raises(ValueError, match="empty"):
        CaptionEvalCallback(FakeTrainer(), [], [metric])
    with pytest.raises(ValueError, match="cannot tell the model inputs"):
        CaptionEvalCallback(FakeTrainer(), [{"video": 1}], [metric])
    with pytest.raises(ValueError, match="unknown metrics"):
        CaptionEvalCallback(FakeTrainer(), [{"prompt": "a"}], [metric], visuals={"nope": "video"})
    with pytest.raises(ValueError, match="table must be"):
        CaptionEvalCallback(FakeTrainer(), [{"prompt": "a"}], [metric], table="xlsx")


# ------------------------------------------------------------------ multi-process (torchrun, gloo)
N_HELD_OUT = 5  # odd on purpose: split_between_processes pads rank 1 with a repeat of the last example


def evaluation_run(output_dir: str) -> dict:
    """Score an untrained (seeded) captioner on the held-out set with CaptionEvalCallback.evaluate().

    One example per generate call and one thread per process, so every caption and score goes through
    the same float32 kernels in a 1-process and a 2-process run.
    """
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = tiny_tokenizer()
        model = tiny_vision_encoder_decoder(tokenizer)
        held_out = make_examples(N_HELD_OUT, 100, tokenizer)
        args = Seq2SeqTrainingArguments(output_dir=output_dir, report_to=[], use_cpu=True, disable_tqdm=True)
        trainer = Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)
        backbone = CLIPBackbone(tiny_clip_factory(0))
        callback = CaptionEvalCallback(
            trainer, held_out, [EMScoreMetric(backbone=backbone, frames=FRAMES)], references="references",
            batch_size=1, max_new_tokens=6, table=None, examples=0,
        )
        logs = callback.evaluate()
    finally:
        torch.set_num_threads(threads)
    return {
        "num_processes": trainer.accelerator.num_processes,
        "is_main": trainer.accelerator.is_main_process,
        "logs": logs,
        "log_history": [{k: v for k, v in h.items() if k.startswith("eval_")} for h in trainer.state.log_history],
        "table": callback.last_table,
    }


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """torchrun with 2 CPU processes: generation split with accelerate (rank 0: examples 0-2; rank 1:
    3, 4 and a padding repeat of 4), metrics synced by torchmetrics, captions gathered; every logged value
    and per-sample row equals the 1-process run's."""
    single = evaluation_run(str(tmp_path / "single"))
    out = tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, str(out),
         str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ddp = json.loads(out.read_text())
    assert ddp["num_processes"] == 2 and single["num_processes"] == 1
    assert [r["id"] for r in ddp["table"]] == list(range(N_HELD_OUT))
    assert ddp["table"] == single["table"]
    assert ddp["logs"] == single["logs"]
    assert ddp["log_history"] == single["log_history"] == [single["logs"]]


def main() -> None:
    out, output_dir = sys.argv[1], sys.argv[2]
    result = evaluation_run(output_dir)
    if result.pop("is_main"):
        with open(out, "w") as f:
            json.dump(result, f)
    # Tear the process group down before exiting: left to interpreter exit, gloo's threads can be destroyed
    # while still running ("terminate called without an active exception", SIGABRT) on a loaded machine.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------ image-prompt (VLM) policies
def vlm_trainer(tmp_path, processor=None):
    from transformers import Trainer, TrainingArguments

    from capreward.testing import build_tiny_llava

    model, built = build_tiny_llava()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, disable_tqdm=True)
    return Trainer(model=model, args=args, processing_class=processor or built), built


def vlm_examples():
    from capreward.testing.trained_clip import colour_image

    prompts = ["Describe the image", [{"role": "user", "content": "Describe the image"}],
               [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image"}]}]]
    return [{"prompt": p, "image": colour_image(c, size=(40, 40))} for p, c in zip(prompts, ("red", "green", "blue"))]


def test_vlm_policy_generates_through_the_processor_chat_template(tmp_path, tiny_backbone):
    """A tiny LLaVA policy (a processor with a chat template, image column): the default generator puts
    each example's image into its prompt (a string, a conversation without image blocks, one with) and
    generates; the captions equal the README's path (chat template, processor with images, greedy
    generate, new tokens decoded), encoded as TRL encodes its prompts (no special tokens added)."""
    trainer, processor = vlm_trainer(tmp_path)
    examples = vlm_examples()
    callback = CaptionEvalCallback(trainer, examples, [CLIPScoreMetric(backbone=tiny_backbone)], visuals="image",
                                   max_new_tokens=4, table=None, examples=0)
    values = callback.evaluate()

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    processor.tokenizer.padding_side = "left"
    inputs = processor(images=[e["image"] for e in examples], text=[prompt] * 3, return_tensors="pt", padding=True,
                       add_special_tokens=False)
    with torch.no_grad():
        out = trainer.model.eval().generate(**inputs, do_sample=False, max_new_tokens=4,
                                            pad_token_id=processor.tokenizer.pad_token_id)
    captions = [t.strip() for t in processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)]
    assert [r["caption"] for r in callback.last_table] == captions
    assert any(captions)  # the tiny random policy writes words: the comparison is not of empty strings
    scored = [c for c in captions if c.strip()]
    if scored:
        direct = CLIPScoreMetric(backbone=CLIPBackbone(tiny_clip_factory(0)))
        direct.update(captions, [e["image"] for e in examples])
        assert values["eval_clip_s"] == pytest.approx(float(direct.compute()), abs=1e-5)


def test_vlm_generator_that_cannot_prepare_the_examples_fails_at_construction(tmp_path, tiny_backbone):
    from capreward.testing import build_tiny_processor

    no_template = build_tiny_processor()
    no_template.chat_template = None
    no_template.tokenizer.chat_template = None
    trainer, _ = vlm_trainer(tmp_path, processor=no_template)
    metric = CLIPScoreMetric(backbone=tiny_backbone)
    with pytest.raises(ValueError, match="cannot prepare example 0 .*LlavaProcessor.*pass generate_fn="):
        CaptionEvalCallback(trainer, vlm_examples(), [metric], visuals="image", table=None)
    two_blocks = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}],
                   "image": vlm_examples()[0]["image"]}]
    trainer, _ = vlm_trainer(tmp_path)
    with pytest.raises(ValueError, match="2 image blocks for 1 images.*generate_fn"):
        CaptionEvalCallback(trainer, two_blocks, [metric], visuals="image", table=None)
    no_image = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]}]}]
    with pytest.raises(ValueError, match="no 'image' or 'images'.*generate_fn"):
        CaptionEvalCallback(trainer, no_image, [metric], visuals=None, table=None)


def test_mlflow_file_store_is_refused_at_construction(tmp_path, monkeypatch, tiny_backbone):
    """A Trainer reporting to MLflow's file store cannot hold eval_emscore beside eval_emscore/video/full_f:
    refused when the callback is built (not at the first evaluation), and accepted with log_sub_scores=False."""
    pytest.importorskip("mlflow")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:" + str(tmp_path / "mlruns"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tokenizer = tiny_tokenizer()
    policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["mlflow"], use_cpu=True)
    trainer = Trainer(model=policy, args=args, processing_class=tokenizer)
    metric = EMScoreMetric(backbone=tiny_backbone)
    with pytest.raises(ValueError, match=r"eval_emscore and eval_emscore/video/full_f.*MLflow's file store"):
        CaptionEvalCallback(trainer, [{"prompt": "a"}], [metric])
    CaptionEvalCallback(trainer, [{"prompt": "a"}], [metric], log_sub_scores=False)


def test_mlflow_tracking_uri_set_in_code_is_read_through_the_trainers_mlflow(tmp_path, monkeypatch, tiny_backbone):
    """Without MLFLOW_TRACKING_URI the store is what mlflow itself says (a URI set in code), read through
    the mlflow module transformers' MLflowCallback holds: a file store is refused, a database store is not."""
    mlflow = pytest.importorskip("mlflow")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tokenizer = tiny_tokenizer()
    policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    trainer = Trainer(model=policy, args=TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["mlflow"],
                                                           use_cpu=True), processing_class=tokenizer)
    metric = EMScoreMetric(backbone=tiny_backbone)
    previous = mlflow.get_tracking_uri()
    try:
        mlflow.set_tracking_uri("file:" + str(tmp_path / "mlruns"))
        with pytest.raises(ValueError, match=r"MLflow's file store"):
            CaptionEvalCallback(trainer, [{"prompt": "a"}], [metric])
        mlflow.set_tracking_uri("sqlite:///" + str(tmp_path / "mlflow.db"))
        CaptionEvalCallback(trainer, [{"prompt": "a"}], [metric])
    finally:
        mlflow.set_tracking_uri(previous)
