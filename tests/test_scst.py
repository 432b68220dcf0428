"""SCST and the differentiable reward: the math by hand, the step against an independent log-probability
path, the vocabulary bridge's refusals, soft == hard scoring, gradients against finite differences, and
real Lightning runs of recipes/scst_captioner.py."""

from __future__ import annotations

import math
import random

import pytest
import torch

from capreward import CLIPScore, EMScore
from capreward.testing.tiny_captioner import build_tiny_captioner, build_word_tokenizer
from capreward.training import (
    DifferentiableRewardLoss,
    SelfCriticalStep,
    UnsupportedVocabularyError,
    VocabularyBridge,
    clip_soft_captions,
    generated_mask,
    reinforce_loss,
    relaxed_decode,
    scst_advantages,
    sequence_log_probs,
)

from conftest import REPO, import_script

NAN = float("nan")


# ------------------------------------------------------------------------------------------ the math
def test_greedy_baseline_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, NAN], [0.5, 0.7, 0.2]])
    adv = scst_advantages(rewards, torch.tensor([0.4, NAN]), "greedy")
    # row 0: r - 0.4 for scored samples, 0 for the unscored one; row 1: no baseline -> no signal
    assert adv.reshape(-1).tolist() == pytest.approx([0.6, -0.4, 0.0, 0.0, 0.0, 0.0])


def test_mean_of_others_baseline_by_hand():
    rewards = torch.tensor([[1.0, 0.0, NAN], [0.5, 0.7, 0.2], [0.3, NAN, NAN]])
    adv = scst_advantages(rewards, baseline="mean")
    assert adv[0].tolist() == pytest.approx([1.0 - 0.0, 0.0 - 1.0, 0.0])
    assert adv[1].tolist() == pytest.approx([0.5 - 0.45, 0.7 - 0.35, 0.2 - 0.6])
    assert adv[2].tolist() == [0.0, 0.0, 0.0]  # one scored sample: no baseline


def test_baseline_arguments_are_checked():
    with pytest.raises(ValueError, match="greedy"):
        scst_advantages(torch.zeros(2, 2), None, "greedy")
    with pytest.raises(ValueError, match="baseline"):
        scst_advantages(torch.zeros(2, 2), baseline="max")
    with pytest.raises(ValueError, match="samples"):
        SelfCriticalStep(lambda p, c, **k: [0.0] * len(c), None, samples=1, baseline="mean")


def test_reinforce_loss_sign_raises_good_samples():
    logp = torch.tensor([-2.0, -1.0, -3.0, -0.5], requires_grad=True)
    adv = torch.tensor([0.5, -0.25, 0.0, 1.0])
    loss = reinforce_loss(logp, adv)
    assert loss.item() == pytest.approx(-(0.5 * -2.0 + -0.25 * -1.0 + 1.0 * -0.5) / 4)
    loss.backward()
    # gradient descent moves log p along +advantage: up for positive, down for negative, not at all for 0
    assert (-logp.grad).tolist() == pytest.approx((adv / 4).tolist())
    lengths = torch.tensor([2, 1, 3, 5])
    assert float(reinforce_loss(logp.detach(), adv, lengths)) == pytest.approx(-(0.5 * -1.0 + -0.25 * -1.0 + 1.0 * -0.1) / 4)


def test_generated_mask_and_sequence_log_probs():
    tokens = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 2, 2, 2]])
    mask = generated_mask(tokens, 2)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True], [True, False, False, False]]
    logits = torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(0))
    expected = [sum(torch.log_softmax(logits[i, t], -1)[tokens[i, t]].item() for t in range(4) if mask[i, t]) for i in range(3)]
    assert sequence_log_probs(logits, tokens, mask).tolist() == pytest.approx(expected, rel=1e-5)


# ------------------------------------------------------------------------------------- the SCST step
@pytest.fixture(scope="module")
def captioner():
    model, processor, tokenizer = build_tiny_captioner(seed=0)
    return model, processor, tokenizer


@pytest.fixture(scope="module")
def colour_images():
    from capreward.testing.trained_clip import colour_image

    return [colour_image(c, random.Random(i)) for i, c in enumerate(["red", "blue", "green"])]


def count_red(prompts, completions, **columns):
    """A hand-checkable reward: how often the caption says "red"; None for an empty caption."""
    assert len(columns["image"]) == len(completions)
    return [None if not c.strip() else float(c.split().count("red")) for c in completions]


def test_scst_step_loss_equals_an_independent_log_probability_path(captioner, colour_images):
    model, processor, tokenizer = captioner
    px = processor(colour_images, return_tensors="pt").pixel_values
    step = SelfCriticalStep(count_red, tokenizer, samples=4, max_new_tokens=6, generation_kwargs={"suppress_tokens": [0, 1, 3]})
    torch.manual_seed(0)
    out = step(model, {"pixel_values": px}, colour_images)
    assert len(out.captions) == 12 and out.rewards.shape == (3, 4) and len(out.greedy_captions) == 3
    # rewards by hand from the decoded captions
    for i, caption in enumerate(out.captions):
        expected = NAN if not caption.strip() else caption.split().count("red")
        got = float(out.rewards.reshape(-1)[i])
        assert (math.isnan(got) and math.isnan(expected)) or got == expected
    for g, caption in zip(out.greedy_rewards.tolist(), out.greedy_captions):
        assert g == caption.split().count("red") or (math.isnan(g) and not caption.strip())
    # log-probabilities independently: the model's own cross-entropy on each caption as labels (+ EOS)
    logps = []
    for j, caption in enumerate(out.captions):
        ids = tokenizer(caption, add_special_tokens=False)["input_ids"]
        labels = torch.tensor([[*ids, tokenizer.eos_token_id]])[:, :6]
        with torch.no_grad():
            nll = model(pixel_values=px[j // 4 : j // 4 + 1], labels=labels).loss
        logps.append(-float(nll) * labels.shape[1])
    adv = out.advantages.reshape(-1)
    expected_loss = -sum(a * lp for a, lp in zip(adv.tolist(), logps)) / 12
    assert out.loss.item() == pytest.approx(expected_loss, rel=1e-4, abs=1e-5)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad()


def test_unscored_captions_get_the_configured_reward(captioner, colour_images):
    model, processor, tokenizer = captioner
    px = processor(colour_images, return_tensors="pt").pixel_values

    def nothing_scores(prompts, completions, **columns):
        return [None] * len(completions)

    silent = SelfCriticalStep(nothing_scores, tokenizer, samples=2, max_new_tokens=3)
    out = silent(model, {"pixel_values": px}, colour_images)
    assert torch.isnan(out.rewards).all() and (out.advantages == 0).all() and out.metrics["unscored"] == 6
    floor = SelfCriticalStep(nothing_scores, tokenizer, samples=2, max_new_tokens=3, unscored_reward=-1.0)
    out = floor(model, {"pixel_values": px}, colour_images)
    assert (out.rewards == -1.0).all() and (out.greedy_rewards == -1.0).all() and out.metrics["unscored"] == 6


def test_scst_step_with_a_capreward_composite_logs_sub_scores(captioner, colour_images):
    from capreward.rewards import CLIPScoreReward, CompositeReward
    from capreward.testing.trained_clip import TrainedClipFactory

    model, processor, tokenizer = captioner
    clip = CLIPScoreReward(model=TrainedClipFactory())
    reward = CompositeReward([(clip, 1.0)], guards=None)
    px = processor(colour_images, return_tensors="pt").pixel_values
    step = SelfCriticalStep(reward, tokenizer, samples=2, baseline="mean", max_new_tokens=5,
                            generation_kwargs={"suppress_tokens": [0, 1, 3]})
    out = step(model, {"pixel_values": px}, colour_images)
    assert out.greedy_captions is None and out.greedy_rewards is None
    # every reward equals CLIP-S scored directly on the same caption and image
    images = [im for im in colour_images for _ in range(2)]
    keep = [i for i, c in enumerate(out.captions) if c.strip()]
    direct = clip.scorer.score([out.captions[i] for i in keep], images=[images[i] for i in keep]).clip_s
    assert [out.rewards.reshape(-1)[i].item() for i in keep] == pytest.approx(direct.tolist(), abs=1e-5)
    assert all(math.isnan(out.rewards.reshape(-1)[i].item()) for i in range(len(images)) if i not in keep)
    assert "clip_s" in out.metrics and out.metrics["reward"] == pytest.approx(out.metrics["clip_s"], abs=1e-6)


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_scst_steps_move_the_greedy_caption_towards_the_reward(colour_images, baseline):
    """SCST optimises the test-time (greedy) caption: with "count the word red" as the reward, a few steps
    take the greedy captions from no "red" to several. With the mean baseline it stays there; with the
    greedy baseline it reaches the optimum and may then oscillate (once the greedy caption is the best
    caption, every sample's advantage is negative), so there the best step is checked."""
    model, processor, tokenizer = build_tiny_captioner(seed=1)
    px = processor(colour_images, return_tensors="pt").pixel_values
    step = SelfCriticalStep(count_red, tokenizer, samples=8, baseline=baseline, max_new_tokens=4,
                            generation_kwargs={"suppress_tokens": [0, 1, 3]})

    def greedy_reward() -> float:
        captions = step.greedy(model, {"pixel_values": px})
        return sum(c.split().count("red") for c in captions) / len(captions)

    before = greedy_reward()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    during = []
    for _ in range(8):
        opt.zero_grad()
        step(model, {"pixel_values": px}, colour_images).loss.backward()
        opt.step()
        during.append(greedy_reward())
    assert (during[-1] if baseline == "mean" else max(during)) >= before + 2.0, during


# ------------------------------------------------------------------------------ vocabulary bridge
@pytest.fixture(scope="module")
def colour_clip():
    from capreward.testing.trained_clip import TrainedClipFactory

    return CLIPScore(model=TrainedClipFactory())


def test_word_vocabulary_maps_to_single_clip_tokens(colour_clip):
    backbone = colour_clip.backbone
    tokenizer = build_word_tokenizer()
    bridge = VocabularyBridge.from_tokenizers(tokenizer, backbone)
    for word, i in tokenizer.get_vocab().items():
        if i in tokenizer.all_special_ids:
            assert i not in bridge.rows.tolist()
            continue
        j = bridge.rows.tolist().index(i)
        assert [int(bridge.cols[j])] == backbone.token_ids(word)[0][1:-1]
    assert bridge.allowed[tokenizer.eos_token_id] and not bridge.allowed[tokenizer.pad_token_id]
    y = torch.zeros(1, len(tokenizer))
    y[0, tokenizer.convert_tokens_to_ids("red")] = 1.0
    assert bridge.to_clip(y).argmax().item() == backbone.token_ids("red")[0][1]


def test_unmappable_vocabularies_are_refused(colour_clip):
    backbone = colour_clip.backbone
    multi = build_word_tokenizer(["a", "red", "xylophonist"])
    assert len(backbone.token_ids("xylophonist")[0]) > 3  # CLIP splits it
    with pytest.raises(UnsupportedVocabularyError, match="xylophonist"):
        VocabularyBridge.from_tokenizers(multi, backbone)
    bridge = VocabularyBridge.from_tokenizers(multi, backbone, on_unmappable="exclude")
    assert not bridge.allowed[multi.convert_tokens_to_ids("xylophonist")]

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE({"<eos>": 0, "r": 1, "e": 2, "d": 3, "re": 4, "red": 5}, [("r", "e"), ("re", "d")]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    subword = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    with pytest.raises(UnsupportedVocabularyError, match="SCST"):
        VocabularyBridge.from_tokenizers(subword, backbone)


# --------------------------------------------------------------------------- differentiable reward
def test_one_hot_soft_captions_score_as_their_text(captioner, colour_images, colour_clip):
    model, processor, tokenizer = captioner
    backbone = colour_clip.backbone
    bridge = VocabularyBridge.from_tokenizers(tokenizer, backbone)
    px = processor(colour_images, return_tensors="pt").pixel_values
    torch.manual_seed(3)
    relaxed = relaxed_decode(model, {"pixel_values": px}, bridge, tokenizer, max_new_tokens=6)
    probs, lengths = clip_soft_captions(relaxed, bridge, backbone)
    texts = [c if c.strip() else None for c in relaxed.captions]
    keep = [i for i, c in enumerate(texts) if c is not None]
    assert keep, "the draw produced only empty captions"
    soft_clip = colour_clip.score_soft(probs, lengths, images=colour_images)
    hard_clip = colour_clip.score([texts[i] for i in keep], images=[colour_images[i] for i in keep]).clip_s
    assert soft_clip[keep].tolist() == pytest.approx(hard_clip.tolist(), abs=1e-5)
    em = EMScore(backbone=backbone)
    soft_em = em.score_soft(probs, lengths, images=colour_images).score
    hard_em = em.score([texts[i] for i in keep], images=[colour_images[i] for i in keep]).score
    assert soft_em[keep].tolist() == pytest.approx(hard_em.tolist(), abs=1e-5)


def test_differentiable_loss_gradient_matches_finite_differences(colour_images, colour_clip):
    model, processor, tokenizer = build_tiny_captioner(seed=2)
    bridge = VocabularyBridge.from_tokenizers(tokenizer, colour_clip.backbone)
    px = processor(colour_images, return_tensors="pt").pixel_values
    noise = -torch.empty(3, 4, len(tokenizer)).exponential_(generator=torch.Generator().manual_seed(0)).log()
    soft = DifferentiableRewardLoss(colour_clip, bridge, tokenizer, max_new_tokens=4, hard=False, tau=2.0)
    param = model.decoder.transformer.h[-1].mlp.c_proj.weight
    direction = torch.randn(param.shape, generator=torch.Generator().manual_seed(1))
    direction /= direction.norm()

    loss = soft(model, {"pixel_values": px}, colour_images, noise=noise).loss
    loss.backward()
    analytic = float((param.grad * direction).sum())
    eps = 1e-2
    with torch.no_grad():
        param += eps * direction
        up = float(soft(model, {"pixel_values": px}, colour_images, noise=noise).loss)
        param -= 2 * eps * direction
        down = float(soft(model, {"pixel_values": px}, colour_images, noise=noise).loss)
        param += eps * direction
    numeric = (up - down) / (2 * eps)
    assert abs(analytic) > 1e-4
    assert numeric == pytest.approx(analytic, rel=0.05, abs=1e-5)

    model.zero_grad()
    hard = DifferentiableRewardLoss(EMScore(backbone=colour_clip.backbone), bridge, tokenizer, max_new_tokens=4)
    hard(model, {"pixel_values": px}, colour_images, noise=noise).loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0


# ------------------------------------------------------------------------------------ the recipe
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["scst", "differentiable"])
def test_recipe_trains_validates_and_saves(tmp_path, objective):
    from transformers import VisionEncoderDecoderModel

    recipe = import_script(REPO / "recipes" / "scst_captioner.py", "scst_captioner")
    args = ["--objective", objective, "--epochs", "2", "--train-size", "8", "--val-size", "4", "--batch-size", "4",
            "--samples", "2", "--max-new-tokens", "5", "--out", str(tmp_path / objective)]
    if objective == "scst":
        args += ["--hallucination", "0.5", "--baseline", "mean"]
    result = recipe.main(args)
    assert [h["epoch"] for h in result["history"]] == [0, 1]
    assert all(math.isfinite(h["val/clip_s"]) for h in result["history"])
    best = max(h["val/clip_s"] for h in result["history"])
    assert result["best_score"] == pytest.approx(best, abs=1e-5)
    assert (tmp_path / objective / "checkpoints").exists() and result["best_model_path"]
    # the saved model is the best epoch's and loads back with its tokenizer and processor
    saved = VisionEncoderDecoderModel.from_pretrained(result["model_dir"])
    state = torch.load(result["best_model_path"], map_location="cpu", weights_only=True)["state_dict"]
    for name, value in saved.state_dict().items():
        assert torch.equal(value, state["model." + name]), name
    from transformers import AutoImageProcessor, AutoTokenizer

    assert AutoTokenizer.from_pretrained(result["model_dir"]).get_vocab() == build_word_tokenizer().get_vocab()
    AutoImageProcessor.from_pretrained(result["model_dir"])


def test_scst_colour_toy_names_what_installs_lightning_when_it_is_missing(monkeypatch):
    """experiments/scst_colour_toy.py runs a Lightning recipe: without the `callbacks` extra it stops at
    once with one error naming the extra and the bootstrap command, not an ImportError deep in the recipe."""
    import sys as _sys
    from pathlib import Path as _Path

    from capreward._extras import MissingExtraError
    from conftest import import_script

    module = import_script(_Path(__file__).resolve().parents[1] / "experiments" / "scst_colour_toy.py", "scst_colour_toy_missing")
    monkeypatch.setitem(_sys.modules, "lightning.pytorch", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"bootstrap\.sh --test.*capreward\[callbacks\]"):
        module.main(["--seeds", "1"])


def test_differentiable_loss_refuses_captions_the_context_would_cut(colour_clip):
    """The soft path reads a caption in one pass of the text tower (no windows): a length cap past the
    context would leave the words after it unscored, so free; it is refused, naming the limit."""
    _, _, tokenizer = build_tiny_captioner(seed=2)
    bridge = VocabularyBridge.from_tokenizers(tokenizer, colour_clip.backbone)
    room = colour_clip.backbone.context_length - 2
    DifferentiableRewardLoss(colour_clip, bridge, tokenizer, max_new_tokens=room)  # fits: accepted
    for bad in (room + 1, 4 * room, 0):
        with pytest.raises(ValueError, match=f"<= {room}"):
            DifferentiableRewardLoss(colour_clip, bridge, tokenizer, max_new_tokens=bad)
