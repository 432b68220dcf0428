"""capreward.recipes.grpo_captioner (recipes/grpo_captioner.py runs it): real TRL GRPOTrainer runs on CPU with the tiny LLaVA policy, LoRA and
capreward's rewards on the tiny CLIP. Checks that every reward is logged per step, that the values the
rewards return are exactly what the trainer logs (per-step means, weighted total), that samples a
reward cannot score (None) leave training running, and the command-line surface."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import import_script, write_mp4
from reward_recording import Recording, nanmean

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipe():
    from capreward.recipes import grpo_captioner

    return grpo_captioner


ARGS = ["--tiny", "--quiet", "--steps", "3", "--batch-size", "4", "--num-generations", "2",
        "--max-completion-length", "6", "--frames", "4", "--lora-r", "4", "--lora-alpha", "8"]


def tiny_rewards(recipe, args):
    funcs, weights = recipe.build_rewards(args)
    return [Recording(f) for f in funcs], weights


def step_logs(log_history):
    return [h for h in log_history if "reward" in h]


@pytest.mark.integration
def test_grpo_run_logs_every_reward_and_the_values_reach_the_trainer(recipe, tmp_path):
    args = recipe.parse_args(
        [*ARGS, "--out", str(tmp_path), "--rewards", "emscore:1,clipscore:0.5,hallucination:0.5", "--combine", "trl"]
    )
    funcs, weights = tiny_rewards(recipe, args)
    result = recipe.train(args, reward_funcs=funcs, reward_weights=weights)

    logs = step_logs(result["log_history"])
    assert [h["step"] for h in logs] == [1, 2, 3]
    names = ["emscore", "clip_s", "hallucination"]  # "clipscore" given: its one name
    for func, name in zip(funcs, names):
        assert func.__name__ == name
        # one call per step, each with the whole generation batch, one value per completion
        assert [c["n"] for c in func.calls] == [4, 4, 4]
        assert all(len(c["values"]) == 4 and None not in c["values"] for c in func.calls)
        logged = [h[f"rewards/{name}/mean"] for h in logs]
        assert logged == pytest.approx([nanmean(c["values"]) for c in func.calls], abs=1e-5)
    # the penalty is in [-1, 0]; CLIP-S in [0, 2.5]
    assert all(-1 <= v <= 0 for c in funcs[2].calls for v in c["values"])
    assert all(0 <= v <= 2.5 for c in funcs[1].calls for v in c["values"])
    # TRL's total is the weighted sum of the per-sample rewards
    for k, h in enumerate(logs):
        per_sample = [sum(w * f.calls[k]["values"][i] for f, w in zip(funcs, weights)) for i in range(4)]
        assert h["reward"] == pytest.approx(np.mean(per_sample), abs=1e-5)
    # sub-scores reported through TRL's log_metric reach the logs too
    assert "rewards/emscore/video/fine_p" in logs[0] or "rewards/emscore/reference/fine_p" in logs[0]
    # the trajectory the recipe prints is the logged one
    assert [r["clip_s"] for r in result["trajectory"]] == pytest.approx(
        [h["rewards/clip_s/mean"] for h in logs]
    )
    # the policy was trained through LoRA adapters only
    model = result["trainer"].model
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_samples_a_reward_cannot_score_give_none_and_training_continues(recipe, tmp_path):
    """Half the rows point at a corrupt video: EMScore returns None for their completions (and for any
    empty completion the random policy writes); TRL turns None into NaN and nansum keeps the other
    reward; the unscored fraction is logged; the loss stays finite."""
    from capreward.rewards import CLIPScoreReward, EMScoreReward
    from capreward.testing import tiny_clip_factory

    from conftest import random_video

    good = str(write_mp4(tmp_path / "good.mp4", random_video(0, frames=6)))
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video at all")
    manifest = recipe.write_tiny_manifest(tmp_path / "data", images=4, videos=0)
    rows = recipe.read_manifest(manifest)
    dataset = recipe.build_dataset(rows, "Describe the image")
    videos = [good, str(bad), good, str(bad)]
    dataset = dataset.remove_columns("video").add_column("video", videos)

    args = recipe.parse_args([*ARGS, "--out", str(tmp_path / "out")])
    emscore = Recording(EMScoreReward(model=tiny_clip_factory(0), frames=4))
    clip_s = Recording(CLIPScoreReward(model=tiny_clip_factory(0), video_column="no_such_column"))
    result = recipe.train(args, reward_funcs=[emscore, clip_s], reward_weights=[1.0, 1.0], dataset=dataset)

    logs = step_logs(result["log_history"])
    assert len(logs) == 3
    for call in emscore.calls:
        none_at = [i for i, v in enumerate(call["values"]) if v is None]
        assert none_at == [i for i, (v, t) in enumerate(zip(call["video"], call["texts"])) if v == str(bad) or not t.strip()]
    assert any(None in c["values"] for c in emscore.calls)
    for k, h in enumerate(logs):
        assert math.isfinite(h["loss"])
        values = emscore.calls[k]["values"]
        expected = nanmean(values)
        if math.isnan(expected):
            assert math.isnan(h["rewards/emscore/mean"])
        else:
            assert h["rewards/emscore/mean"] == pytest.approx(expected, abs=1e-5)
        assert h["rewards/emscore/unscored_frac"] == pytest.approx(values.count(None) / len(values))
        # the total skips a missing term (nansum) rather than becoming NaN; samples no reward could
        # score are left out of it (and get zero advantage)
        pairs = zip(values, clip_s.calls[k]["values"])
        per_sample = [(v or 0.0) + (c or 0.0) for v, c in pairs if v is not None or c is not None]
        assert h["reward"] == pytest.approx(np.mean(per_sample), abs=1e-5)


def test_main_composite_reward_prints_the_trajectory(recipe, tmp_path, capsys):
    """The default: one CompositeReward (weighted sum + guards) goes to TRL; the printed trajectory has
    its total and each component and guard term, as logged, and the total is their weighted sum."""
    result = recipe.main([*ARGS, "--steps", "2", "--rewards", "clipscore:0.5,emscore:1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "reward trajectory (2 GRPO steps" in out
    table = out[out.index("reward trajectory") :].splitlines()
    # one reward function: its mean is the total, so no separate "composite" column
    header = ["step", "total", "clip_s", "emscore", "guard/repetition", "guard/truncation", "guard/length", "guard/injection"]
    assert table[1].split() == header
    printed = [[float(x) for x in line.split()] for line in table[3:5]]
    assert [int(r[0]) for r in printed] == [1, 2]
    logs = step_logs(result["log_history"])
    for row, h in zip(printed, logs):
        assert row[1] == pytest.approx(h["rewards/composite/mean"], abs=1e-4)
        assert row[2] == pytest.approx(h["rewards/composite/clip_s"], abs=1e-4)
        # batch means of the terms add up to the composite's mean when no sample is unscored
        if h["rewards/composite/unscored_frac"] == 0:
            assert row[1] == pytest.approx(0.5 * row[2] + row[3] + sum(row[4:]), abs=1e-3)
    # the generated manifest holds images and videos
    manifest = tmp_path / "tiny_data" / "manifest.jsonl"
    kinds = [("video" in json.loads(line)) for line in manifest.read_text().splitlines()]
    assert any(kinds) and not all(kinds)


def test_parse_rewards_and_argument_errors(recipe):
    assert recipe.parse_rewards("emscore:1, clipscore:0.5,hallucination") == [
        ("emscore", 1.0), ("clip_s", 0.5), ("hallucination", 1.0)
    ]
    for spec, message in [
        ("emscore,bleu:1", "unknown reward 'bleu'"),
        ("emscore:x", "bad weight 'x' for reward 'emscore'"),
        ("emscore:nan", "must be finite"),
        ("emscore,emscore:2", "given twice"),
        (" , ", "names no reward"),
    ]:
        with pytest.raises(ValueError, match=message):
            recipe.parse_rewards(spec)
    with pytest.raises(SystemExit):
        recipe.parse_args(["--num-generations", "1"])
    with pytest.raises(SystemExit):
        recipe.parse_args(["--batch-size", "6", "--num-generations", "4"])


def test_manifest_rows_are_validated_with_their_line(recipe, tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / "m.jsonl"
    path.write_text('{"image": "a.png", "references": ["x"], "prompt": "Say"}\n\n{"video": "/abs/v.mp4"}\n')
    rows = recipe.read_manifest(path)
    assert rows == [
        {"kind": "image", "path": str(tmp_path / "a.png"), "references": ["x"], "prompt": "Say"},
        {"kind": "video", "path": "/abs/v.mp4", "references": None, "prompt": None},
    ]
    for line, message in [
        ('{"image": "a.png", "video": "b.mp4"}', "exactly one of 'image' or 'video'"),
        ('{"references": ["x"]}', "exactly one of"),
        ('{"image": "a.png", "references": "x"}', "'references' must be a list of strings"),
        ('{"image": "a.png", "prompt": 3}', "'prompt' must be a string"),
        ('{"image": ["a.png", "a.png"]}', "'image' must be one path (the recipe's policy sees one visual per prompt), got list"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "not JSON"),
    ]:
        path.write_text('{"image": "a.png"}\n' + line + "\n")
        with pytest.raises(ValueError, match=f"m.jsonl:2: .*{re.escape(message)}"):
            recipe.read_manifest(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        recipe.read_manifest(path)


def test_videos_are_shown_to_the_policy_as_composite_or_middle_frame(recipe, tmp_path):
    from capreward.media import load_video
    from capreward.media.composite import video_composite

    manifest = recipe.write_tiny_manifest(tmp_path, images=1, videos=1)
    rows = recipe.read_manifest(manifest)
    video = rows[1]["path"]
    composite = recipe.build_dataset(rows, "Describe", "composite")
    assert composite[1]["video"] == video and composite[0]["video"] is None
    assert np.array_equal(np.asarray(composite[1]["image"]), np.asarray(video_composite(video)))
    assert composite[1]["prompt"] == [{"role": "user", "content": "Describe the video"}]
    assert composite[0]["prompt"] == [{"role": "user", "content": "Describe"}]
    middle = recipe.build_dataset(rows, "Describe", "middle")
    assert np.array_equal(np.asarray(middle[1]["image"]), load_video(video, frames=3)[1])


def test_trained_adapter_and_processor_are_saved_and_load_back(recipe, tmp_path, capsys):
    """The recipe keeps what it trains: the LoRA adapter and the processor in --out; loading them onto a
    fresh base model (PeftModel.from_pretrained) gives the trained policy's logits and captions."""
    import torch
    from peft import PeftModel
    from transformers import AutoProcessor

    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    out = tmp_path / "run"
    result = recipe.main([*ARGS, "--steps", "1", "--rewards", "clipscore", "--lr", "5e-2", "--out", str(out)])
    assert result["saved"] == out and "LoRA adapter and processor saved in" in capsys.readouterr().out
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    trained = result["trainer"].model.eval()
    base, _ = build_tiny_llava(TinyLlavaSpec(words=recipe.TINY_WORDS, seed=0))
    untouched, _ = build_tiny_llava(TinyLlavaSpec(words=recipe.TINY_WORDS, seed=0))
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    processor = AutoProcessor.from_pretrained(str(out))
    assert processor.tokenizer.get_vocab() == result["trainer"].processing_class.tokenizer.get_vocab()

    rows = recipe.read_manifest(out / "tiny_data" / "manifest.jsonl")
    image = recipe.policy_image(rows[0], "composite")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(images=[image], text=[prompt], return_tensors="pt")
    with torch.no_grad():
        logits = {name: m(**enc).logits for name, m in (("trained", trained), ("loaded", loaded), ("base", untouched.eval()))}
        captions = {name: m.generate(**enc, do_sample=False, max_new_tokens=6)[0].tolist() for name, m in (("trained", trained), ("loaded", loaded))}
    assert torch.allclose(logits["loaded"], logits["trained"], atol=1e-5)
    assert not torch.allclose(logits["loaded"], logits["base"], atol=1e-4)  # the adapter did change the policy
    assert captions["loaded"] == captions["trained"]


def test_full_fine_tuning_saves_the_whole_model(recipe, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "full"
    args = recipe.parse_args([*ARGS, "--steps", "1", "--rewards", "clipscore", "--lora-r", "0", "--out", str(out)])
    trained = recipe.train(args)["trainer"].model.eval()
    loaded = AutoModelForImageTextToText.from_pretrained(str(out)).eval()
    processor = AutoProcessor.from_pretrained(str(out))
    image = recipe.policy_image(recipe.read_manifest(out / "tiny_data" / "manifest.jsonl")[0], "composite")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image"}]}]
    enc = processor(images=[image], text=[processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(loaded(**enc).logits, trained(**enc).logits, atol=1e-5)


@pytest.mark.integration
def test_kl_regularisation_with_an_in_memory_policy_uses_that_policy_as_reference(recipe, tmp_path):
    """``--beta > 0`` with full fine-tuning of a policy built in memory: TRL builds its reference by loading
    the policy's config name from disk, which is empty here (TRL failed loading ""); the recipe hands it a
    snapshot of the policy as given, changed in memory after it was built."""
    import torch

    args = recipe.parse_args([*ARGS, "--steps", "2", "--rewards", "clipscore", "--lora-r", "0", "--beta", "0.5",
                              "--lr", "1e-2", "--out", str(tmp_path)])
    model, processor = recipe.build_policy(args)
    with torch.no_grad():  # an in-memory change (as an SFT stage makes): the reference must have it
        model.lm_head.weight.mul_(1.5)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert model.config._name_or_path == ""
    result = recipe.train(args, model_and_processor=(model, processor), save=False)
    trainer = result["trainer"]
    ref = trainer.ref_model.state_dict()
    assert ref.keys() == start.keys() and all(torch.equal(ref[k], start[k]) for k in start)
    assert any(not torch.equal(v, start[k]) for k, v in trainer.model.state_dict().items())  # the policy moved
    assert model.config._name_or_path == ""  # the snapshot's temporary name is not left behind
    kl = [h["kl"] for h in step_logs(result["log_history"])]
    assert len(kl) == 2 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 1e-6  # reference == start


def test_colour_toy_experiment_runs_end_to_end(tmp_path, capsys):
    """experiments/grpo_colour_toy.py at toy size (its figures come from a full run, see its docstring):
    before/after evaluation, per-step trajectory and the summary over seeds are produced and consistent."""
    path = REPO / "experiments" / "grpo_colour_toy.py"
    module = import_script(path, "grpo_colour_toy")
    out = module.main(
        ["--seeds", "0", "1", "--steps", "2", "--sft-steps", "2", "--batch-size", "8", "--num-generations", "4",
         "--train-images", "4", "--eval-images", "4", "--eval-samples", "2", "--out", str(tmp_path),
         "--json", str(tmp_path / "r.json")]
    )
    assert [r["seed"] for r in out["runs"]] == [0, 1]
    for r in out["runs"]:
        assert len(r["trajectory"]) == 2
        for phase in ("before", "after"):
            # guarded CLIP-S: [0, 2.5] plus guard terms in [-3, 0]; empty captions get -1
            assert -3.0 <= r[phase]["reward"] <= 2.5 and 0.0 <= r[phase]["right_colour"] <= 1.0
    before = [r["before"]["reward"] for r in out["runs"]]
    assert out["summary"]["reward_before"].startswith(f"{np.mean(before):.3f} +- ")
    assert json.loads((tmp_path / "r.json").read_text())["summary"] == out["summary"]
    assert "over 2 seeds, 2 GRPO steps" in capsys.readouterr().out


def test_recipe_runs_as_a_package_module_and_as_the_repository_script():
    """The recipe ships inside the package (a wheel install has it); recipes/grpo_captioner.py runs it."""
    runs = [[sys.executable, "-m", "capreward.recipes.grpo_captioner", "--help"],
            [sys.executable, str(REPO / "recipes" / "grpo_captioner.py"), "--help"]]
    helps = []
    for command in runs:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO.parent)
        assert proc.returncode == 0, proc.stderr[-2000:]
        helps.append(proc.stdout.split("\n", 1)[1])  # the usage line names the program
    assert helps[0] == helps[1] and "--lora-r" in helps[0] and "--tiny" in helps[0]
