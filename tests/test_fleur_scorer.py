"""FLEUR / RefFLEUR scorer on the trained tiny LLaVA judge.

The reference below is written independently of the scorer: it builds the prompt from the published
text, pads the image itself, runs ``generate(..., output_logits=True)`` one sample at a time through the
HF processor, and applies the released code's smoothing (token search included).
"""

from __future__ import annotations

import math
import os
import random
import re
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from capreward import FLEUR, MediaError
from capreward.judges import JudgeLoadError, LocalJudge, load_llava
from capreward.media.composite import composite_frames, composite_indices, resize_bilinear, video_composite
from capreward.metrics.fleur import ONE, ONE_DECIMAL, TWO_DECIMALS
from capreward.judges.prompts import llava_v1_conversation
from capreward.testing import (
    FLEUR_COLOURS,
    FLEUR_PROBES,
    FLEUR_RECIPE,
    JudgeExample,
    JudgeRecipe,
    TinyLlavaSpec,
    build_tiny_llava,
    fleur_task_image,
    load_tiny_judge,
    mixture,
    tiny_judge_dir,
)
from capreward.testing.tiny_llava import with_spec
from fixtures_llava import colour_images, fleur, one_torch_thread, tiny_judge, tiny_judge_path  # noqa: F401

SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the human's questions."
)
CRITERIA = (
    "based on the given Grading Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption "
    "does not describe the image at all.\n1.0: The caption accurately and clearly describes the image.\n\n"
)
TAIL = "\n\nScore(Choose a rating from 0.0 to 1.0):"


def spec_message(caption: str, refs: list[str] | None = None) -> str:
    if refs is None:
        return f"Your task is to evaluate and rate the caption on a scale of 0.0 to 1.0 {CRITERIA}Caption: {caption}{TAIL}"
    joined = "\n".join(refs)
    return (
        f"Your task is to evaluate and rate the candidate caption on a scale of 0.0 to 1.0 {CRITERIA}"
        f"Reference Captions: {joined}\n\nCandidate Caption: {caption}{TAIL}"
    )


def expand2square(image: Image.Image, background: tuple[int, ...]) -> Image.Image:
    w, h = image.size
    if w == h:
        return image
    side = max(w, h)
    out = Image.new("RGB", (side, side), background)
    out.paste(image, ((side - w) // 2, (side - h) // 2))
    return out


def reference_generate(model, processor, image, prompt, max_new_tokens):
    """Per-sample ``generate``: (generated ids up to EOS, finished, per-step logits)."""
    background = tuple(int(x * 255) for x in processor.image_processor.image_mean)
    inputs = processor(images=expand2square(image, background), text=prompt, return_tensors="pt")
    out = model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
    )
    gen = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    eos = processor.tokenizer.eos_token_id
    finished = eos in gen
    if finished:
        gen = gen[: gen.index(eos)]
    return gen, finished, [step[0] for step in out.logits]


def reference_fleur(model, processor, image, caption, refs=None, max_new_tokens=10):
    """The released FLEUR computation on one sample: (score or NaN, greedy answer text)."""
    tok = processor.tokenizer
    prompt = f"{SYSTEM} USER: <image>\n{spec_message(caption, refs)} ASSISTANT:"
    gen, finished, logits = reference_generate(model, processor, image, prompt, max_new_tokens)
    text = tok.decode(gen, skip_special_tokens=True).strip()
    if not finished:
        return float("nan"), text
    rate2token = {s: tok.encode(str(s))[-1] for s in range(10)}
    numbers = re.sub(r"\.+$", "", re.sub(r"^\.+", "", re.sub(r"[^\d\.]", "", text)))
    try:
        score_check = float(numbers)
    except ValueError:
        return float("nan"), text
    if not 0 <= score_check <= 1:
        return float("nan"), text

    def probs_at(pos):
        return torch.softmax(logits[pos].double(), dim=-1)

    if score_check < 1.0:
        printed = str(score_check)
        first = int(printed[printed.index(".") + 1])
        hits = [i for i, t in enumerate(gen) if t == rate2token[first]]
        pos = hits[1] if (len(hits) > 1 and first == 0) else hits[0]
        p = probs_at(pos)
        score = sum(float(p[rate2token[d]]) * d * 0.1 for d in range(10))
        if len(printed) > 3:
            second = int(printed[printed.index(".") + 2])
            hits2 = [i for i, t in enumerate(gen) if t == rate2token[second]]
            pos2 = hits2[1] if len(hits2) > 1 else hits2[0]
            p2 = probs_at(pos2)
            score += sum(float(p2[rate2token[d]]) * d * 0.01 for d in range(10))
    else:
        pos = [i for i, t in enumerate(gen) if t == rate2token[1]][0]
        p = probs_at(pos)
        score = 0.9 * float(p[rate2token[0]]) + float(p[rate2token[1]])
    return score, text


def grpo_batch(colour_images):
    """4 images x 6 captions (the probes spread over the groups, plus other captions)."""
    rng = random.Random(7)
    nouns = ["ball", "box", "car", "kite"]
    captions, images = [], []
    for colour, image in colour_images.items():
        group = [f"a {c} {rng.choice(nouns)}" for c in FLEUR_COLOURS] + ["a photo of a kite", f"many {colour} cars"]
        captions += group
        images += [image] * len(group)
    return captions, images


def assert_same_scores(a, b, atol=1e-5):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.allclose(a.nan_to_num(), b.nan_to_num(), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------- the fixture
def test_fixture_tokenizer_splits_digits_like_llama(fleur):
    tok = fleur.judge.tokenizer
    pieces = tok.convert_ids_to_tokens(tok("ASSISTANT: 0.85", add_special_tokens=False)["input_ids"])
    assert pieces[-5:] == ["▁", "0", ".", "8", "5"]
    ids = fleur.judge.digit_token_ids()
    assert ids == [tok.encode(str(d))[-1] for d in range(10)]
    assert [tok.decode([i]) for i in ids] == [str(d) for d in range(10)]


def test_fixture_builds_deterministically():
    spec = TinyLlavaSpec(text_layers=1, vision_layers=1)
    (m1, p1), (m2, p2) = build_tiny_llava(spec), build_tiny_llava(spec)
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    assert p1.tokenizer.get_vocab() == p2.tokenizer.get_vocab()
    assert with_spec(FLEUR_RECIPE, seed=1).key() != FLEUR_RECIPE.key()


def test_trained_fixture_is_cached(tiny_judge_path):
    assert (tiny_judge_path / "config.json").exists()
    assert (tiny_judge_path / "capreward_recipe.json").exists()
    assert tiny_judge_dir(FLEUR_RECIPE) == tiny_judge_path  # found, not retrained


def _answer_a(rng):
    return JudgeExample(fleur_task_image("red", rng), "p", "A")


def _answer_b(rng):
    return JudgeExample(fleur_task_image("blue", rng), "p", "B")


def test_recipe_mixes_its_generators_by_weight():
    sample = JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_b, 1.0))).make_sampler()
    answers = [sample(random.Random(i)).answer for i in range(2000)]
    assert abs(answers.count("A") / len(answers) - 0.75) < 0.03
    again = JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_b, 1.0))).make_sampler()
    rng1, rng2 = random.Random(5), random.Random(5)
    assert [sample(rng1).answer for _ in range(50)] == [again(rng2).answer for _ in range(50)]
    with pytest.raises(ValueError, match="exactly one of"):
        JudgeRecipe("none")
    with pytest.raises(ValueError, match="exactly one of"):
        JudgeRecipe("both", sampler=_answer_a, generators=((_answer_b, 1.0),))
    with pytest.raises(ValueError, match="weights"):
        mixture([(_answer_a, -1.0), (_answer_b, 1.0)])
    with pytest.raises(KeyError, match="no sampler named 'nope'"):
        JudgeRecipe("named", sampler="nope").make_sampler()


def test_recipe_key_tracks_generators_weights_and_schedule():
    base = JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_b, 1.0)))
    assert base.key() == JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_b, 1.0))).key()
    variants = [
        JudgeRecipe("ab", generators=((_answer_a, 2.0), (_answer_b, 1.0))),
        JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_a, 1.0))),
        JudgeRecipe("ab", generators=((_answer_a, 3.0), (_answer_b, 1.0)), steps=401),
        JudgeRecipe("ab", sampler=_answer_a),
    ]
    assert len({base.key()} | {v.key() for v in variants}) == 5
    example = FLEUR_RECIPE.make_sampler()(random.Random(0))
    assert example.prompt.endswith("ASSISTANT:") and example.prompt.count("<image>") == 1


FINAL_SCORES = {"red": 7, "blue": 3}
FINAL_PROMPT = "What is the final score?"


def final_score_example(rng):
    """A new answer format for the extensibility test: "The final score is $N$", N set by the image."""
    colour = rng.choice(sorted(FINAL_SCORES))
    prompt = llava_v1_conversation([(FINAL_PROMPT, None)])
    return JudgeExample(fleur_task_image(colour, rng), prompt, f"The final score is ${FINAL_SCORES[colour]}$")


@pytest.mark.slow
def test_a_recipe_for_a_new_answer_format_trains_caches_and_decodes(tmp_path, monkeypatch):
    spec = TinyLlavaSpec(
        text_hidden=32, text_layers=1, text_heads=2, text_kv_heads=1, text_intermediate=64, vision_hidden=16,
        vision_layers=1, vision_heads=1, vision_intermediate=32, image_size=16, init_std=0.1,
        words=("What", "final", "score", "The"),
    )  # fmt: skip
    recipe = JudgeRecipe("final-score", generators=((final_score_example, 1.0),), spec=spec, steps=60, batch_size=8, lr=1e-2)
    from capreward.testing import cache, tiny_llava

    base = tmp_path / "tiny_llava"
    stale, recent, other = base / "final-score-0123456789abcdef", base / "final-score-fedcba9876543210", base / "final-0123456789abcdef"
    for d in (stale, recent, other):
        d.mkdir(parents=True)
    old = time.time() - (cache.STALE_AFTER_DAYS + 1) * 86400
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    path = tiny_judge_dir(recipe, cache_dir=tmp_path)
    assert path.parent == base and path.name == f"final-score-{recipe.key()}"
    # another key of this recipe unused for over STALE_AFTER_DAYS is dropped; one another environment may
    # still use (recently used) stays, and other recipes' trainings are not this recipe's to prune
    assert not stale.exists() and recent.exists() and other.exists()
    def no_training(*args, **kwargs):
        raise AssertionError("a cached recipe must not be trained again")

    monkeypatch.setattr(tiny_llava, "train_tiny_judge", no_training)
    assert tiny_judge_dir(recipe, cache_dir=tmp_path) == path
    judge = LocalJudge(load_tiny_judge(recipe, cache_dir=tmp_path))
    images = [fleur_task_image(c, random.Random(f"final-{c}")) for c in ["red", "blue"]]
    features = judge.image_features(judge.preprocess(images))
    prompt = llava_v1_conversation([(FINAL_PROMPT, None)])
    ids = judge.encode_prompts([prompt, prompt], int(features.shape[1]))
    out = judge.greedy(judge.start(ids, features, [0, 1]), 12)
    assert [judge.decode(t) for t in out.tokens] == ["The final score is $7$", "The final score is $3$"]
    assert out.finished == [True, True]


def test_trained_judge_answers_in_every_format(fleur, colour_images):
    names = list(FLEUR_PROBES)
    result = fleur.score([FLEUR_PROBES[n][1] for n in names], [colour_images[FLEUR_PROBES[n][0]] for n in names])
    by = {n: i for i, n in enumerate(names)}
    assert result.raw[by["one"]] == "1.0" and result.rule[by["one"]] == ONE
    assert re.fullmatch(r"0\.\d[1-9]", result.raw[by["two_decimals"]]) and result.rule[by["two_decimals"]] == TWO_DECIMALS
    assert re.fullmatch(r"0\.\d", result.raw[by["one_decimal"]]) and result.rule[by["one_decimal"]] == ONE_DECIMAL
    assert result.raw[by["zero"]] == "0.0" and result.rule[by["zero"]] == ONE_DECIMAL
    assert result.raw[by["out_of_range"]] == "1.5" and "outside [0, 1]" in result.error[by["out_of_range"]]
    assert result.raw[by["no_number"]] == "no idea" and "no number" in result.error[by["no_number"]]
    for name in ["out_of_range", "no_number"]:
        assert math.isnan(result.score[by[name]]) and result.rule[by[name]] is None
    for name in ["one", "two_decimals", "one_decimal", "zero"]:
        i = by[name]
        assert result.error[i] is None and 0.0 <= result.score[i] <= 1.0
        # Smoothing moves the score off the greedy number but not far: the distributions are peaked.
        assert abs(result.score[i] - result.raw_score[i]) < 0.15
    # Soft distributions: the greedy digit has clearly less than all the mass, so gradients are not ~0.
    two = result.digit_probs[by["two_decimals"], 0]
    assert 0.3 < float(two.max()) < 0.99


def test_scores_depend_on_the_image(fleur, colour_images):
    result = fleur.score(["a red car"] * 4, [colour_images[c] for c in FLEUR_COLOURS])
    assert len(set(result.raw)) == 4
    assert result.score[0] > 0.9 and result.score[2] < 0.3  # red image vs blue image


# ------------------------------------------------------------------------- exactness of the fast path
def test_prompt_encoding_matches_the_processor(fleur, tiny_judge, colour_images):
    model, processor = tiny_judge
    prompt = fleur.prompts(["a red car"])[0]
    assert prompt == f"{SYSTEM} USER: <image>\n{spec_message('a red car')} ASSISTANT:"
    n_image = int(model.config.image_seq_length)
    ours = fleur.judge.encode_prompts([prompt], n_image)[0]
    theirs = processor(images=colour_images["red"], text=prompt, return_tensors="pt")["input_ids"][0].tolist()
    assert ours == theirs


def test_fast_path_equals_per_sample_generate(fleur, tiny_judge, colour_images):
    model, processor = tiny_judge
    captions, images = grpo_batch(colour_images)
    result = fleur.score(captions, images)
    expected = [reference_fleur(model, processor, im, c) for c, im in zip(captions, images)]
    assert result.raw == [text for _, text in expected]
    assert_same_scores(result.score, [s for s, _ in expected])
    assert sum(not math.isnan(s) for s, _ in expected) >= 16
    assert {ONE, ONE_DECIMAL, TWO_DECIMALS} <= set(result.rule)
    # The raw-score ablation: the greedy number itself, NaN where it is no number in [0, 1].
    raw_expected = []
    for _, text in expected:
        number = re.sub(r"\.+$", "", re.sub(r"^\.+", "", re.sub(r"[^\d\.]", "", text)))
        value = float(number) if re.fullmatch(r"\d+(\.\d+)?", number) else float("nan")
        raw_expected.append(value if 0 <= value <= 1 else float("nan"))
    assert_same_scores(result.raw_score, raw_expected, atol=1e-7)
    assert any(abs(a - b) > 1e-3 for a, b in zip(result.raw_score.tolist(), result.score.tolist()) if a == a)


def test_ref_fleur_equals_per_sample_generate(fleur, tiny_judge, colour_images):
    model, processor = tiny_judge
    captions = ["a red car", "a blue box", "a green kite", "the ball is yellow", "a photo of a box"]
    colours = ["red", "red", "green", "blue", "yellow"]
    refs = [["a red car"], ["a red wall", "the box is red"], ["a green kite"], ["a blue ball", "blue"], ["a yellow box"]]
    images = [colour_images[c] for c in colours]
    result = fleur.score(captions, images, references=refs)
    expected = [reference_fleur(model, processor, im, c, r) for c, im, r in zip(captions, images, refs)]
    assert result.raw == [text for _, text in expected]
    assert_same_scores(result.score, [s for s, _ in expected])
    # A single reference string is accepted as a one-element list.
    single = fleur.score(captions[:1], images[:1], references=["a red car"])
    assert_same_scores(single.score, result.score[:1])


def test_captions_of_one_image_share_one_prefix_pass(tiny_judge, colour_images):
    model, processor = tiny_judge
    scorer = FLEUR((model, processor), batch_size=64)
    captions, images = grpo_batch(colour_images)
    vision_batches, lm_shapes = [], []
    h1 = model.model.vision_tower.register_forward_pre_hook(
        lambda mod, args, kwargs: vision_batches.append(int((args[0] if args else kwargs["pixel_values"]).shape[0])),
        with_kwargs=True,
    )
    h2 = model.model.language_model.register_forward_pre_hook(
        lambda mod, args, kwargs: lm_shapes.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True
    )
    try:
        scorer.score(captions, images)
    finally:
        h1.remove()
        h2.remove()
    n_image = int(model.config.image_seq_length)
    assert vision_batches == [4]  # each distinct image encoded once
    prefix, suffix, *decode = lm_shapes
    assert prefix[0] == 4 and prefix[1] > n_image + 60  # system + image + prompt text, once per image
    longest = max(len(p) for p in scorer.judge.encode_prompts(scorer.prompts(captions), n_image))
    assert suffix == (len(captions), longest - prefix[1])  # each caption's own tokens and the prompt's tail
    assert suffix[1] < 35
    # Decode steps run one token per live row; once at most half the rows are still writing, the ended
    # ones are dropped (compaction), so the batch only shrinks. Short answers: a handful of steps.
    rows = [shape[0] for shape in decode]
    assert all(shape[1] == 1 for shape in decode) and 3 <= len(decode) <= 9, decode
    assert rows[0] == len(captions) and rows == sorted(rows, reverse=True)


def test_continuation_from_a_cached_state_equals_recomputation(fleur, colour_images):
    judge = fleur.judge
    prompts = fleur.prompts(["a red car", "a blue box"])
    features = judge.image_features(judge.preprocess([colour_images["red"], colour_images["blue"]]))
    ids = judge.encode_prompts(prompts, int(features.shape[1]))
    state = judge.start(ids, features, [0, 1])
    digits = judge.digit_token_ids()
    branched = judge.step(judge.select(state, [0, 0, 1]), torch.tensor([digits[3], digits[7], digits[5]]))
    fresh = judge.start(
        [ids[0] + [digits[3]], ids[0] + [digits[7]], ids[1] + [digits[5]]], features, [0, 0, 1], share_prefix=False
    )
    assert torch.allclose(branched.logits, fresh.logits, atol=1e-5)
    assert branched.next_position.tolist() == [len(ids[0]) + 1, len(ids[0]) + 1, len(ids[1]) + 1]


# ------------------------------------------------------------------------------ batch independence
@pytest.fixture(scope="session")
def invariance_case(fleur, colour_images):
    captions, images = grpo_batch(colour_images)
    captions, images = captions[::2] + ["a red ball is red"], images[::2] + [colour_images["red"]]
    return captions, images, fleur.score(captions, images)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), batch_size=st.sampled_from([1, 2, 3, 5, 64]), share=st.booleans())
def test_scores_do_not_depend_on_batch_order_or_size(invariance_case, tiny_judge, data, batch_size, share):
    captions, images, base = invariance_case
    order = data.draw(st.permutations(range(len(captions))))
    scorer = FLEUR(tiny_judge, batch_size=batch_size, share_prefix=share)
    result = scorer.score([captions[i] for i in order], [images[i] for i in order])
    assert result.raw == [base.raw[i] for i in order]
    assert result.error == [base.error[i] for i in order]
    assert_same_scores(result.score, base.score[list(order)])


def test_a_sample_scores_the_same_alone_and_in_a_batch(invariance_case, fleur):
    captions, images, base = invariance_case
    for i in [0, 3, len(captions) - 1]:
        alone = fleur.score([captions[i]], [images[i]])
        assert alone.raw == [base.raw[i]]
        assert_same_scores(alone.score, base.score[i : i + 1])


def test_equal_images_given_as_different_objects_are_shared(fleur, colour_images, tmp_path):
    red = colour_images["red"]
    path = tmp_path / "red.png"
    red.save(path)
    # Equal pixels share (content hash); a path is keyed by the file, without decoding it.
    forms = [red, red.copy(), np.asarray(red), str(path), tmp_path / "red.png"]
    plan = fleur.plan(["a red car"] * 5, forms)
    assert plan.image_index == [0, 0, 0, 1, 1] and len(plan.visuals) == 2
    result = fleur.score(["a red car"] * 5, forms)
    assert_same_scores(result.score, result.score[:1].expand(5))  # the PNG holds the same pixels


# ------------------------------------------------------------------------------------ explanations
def test_explanation_uses_the_two_turn_conversation(fleur, tiny_judge, colour_images):
    model, processor = tiny_judge
    captions = ["a red car", "a green ball", "a photo of a kite"]
    images = [colour_images["red"], colour_images["blue"], colour_images["yellow"]]
    result = fleur.score(captions, images)
    explanations = fleur.explain(captions, images)
    for caption, image, score, raw, got in zip(captions, images, result.score.tolist(), result.raw, explanations):
        first = raw if math.isnan(score) else str(score)
        prompt = (
            f"{SYSTEM} USER: <image>\n{spec_message(caption)} ASSISTANT: {first}</s>"
            "USER: Why? Tell me the reason. ASSISTANT:"
        )
        n_prompt = len(processor(images=image, text=prompt)["input_ids"][0])
        budget = min(512, model.config.text_config.max_position_embeddings - n_prompt)
        gen, finished, _ = reference_generate(model, processor, image, prompt, budget)
        assert got == processor.tokenizer.decode(gen, skip_special_tokens=True).strip()
        assert finished and got
    # The toy judge learned to name the image's colour when asked why.
    assert explanations[0].startswith("the image is red")
    assert explanations[1].startswith("the image is blue")


def test_explanation_with_given_scores(fleur, tiny_judge, colour_images):
    model, processor = tiny_judge
    got = fleur.explain(["a red car"], [colour_images["red"]], scores=[0.25])
    prompt = (
        f"{SYSTEM} USER: <image>\n{spec_message('a red car')} ASSISTANT: 0.25</s>USER: Why? Tell me the reason. ASSISTANT:"
    )
    gen, _, _ = reference_generate(model, processor, colour_images["red"], prompt, 64)
    assert got == [processor.tokenizer.decode(gen, skip_special_tokens=True).strip()]
    with pytest.raises(ValueError, match="empty caption"):
        fleur.explain([" "], [colour_images["red"]])
    with pytest.raises(ValueError, match="scores"):
        fleur.explain(["a", "b"], [colour_images["red"]] * 2, scores=[0.5])


# -------------------------------------------------------------------------------------- bad inputs
def test_missing_or_broken_images_raise_naming_the_item(fleur, colour_images, tmp_path):
    red = colour_images["red"]
    with pytest.raises(MediaError, match="item 1"):
        fleur.score(["a", "b"], [red, None])
    missing = tmp_path / "nope.jpg"
    with pytest.raises(MediaError, match="nope.jpg"):
        fleur.score(["a", "b"], [red, str(missing)])
    with pytest.raises(MediaError, match="item 0"):
        fleur.score(["a"], [np.zeros((4, 4), dtype=np.uint8)])
    with pytest.raises(ValueError, match="one per candidate"):
        fleur.score(["a", "b"], [red])
    with pytest.raises(ValueError, match="exactly one of"):
        fleur.score(["a"])
    with pytest.raises(ValueError, match="exactly one of"):
        fleur.score(["a"], [red], videos=[np.zeros((2, 8, 8, 3), dtype=np.uint8)])


def test_bad_captions_and_references(fleur, colour_images):
    red = colour_images["red"]
    with pytest.raises(TypeError, match=r"candidates\[1\]"):
        fleur.score(["a red car", None], [red, red])
    with pytest.raises(TypeError, match="single str"):
        fleur.score("a red car", [red])
    with pytest.raises(ValueError, match=r"references\[0\]"):
        fleur.score(["a red car"], [red], references=[[]])


def test_empty_and_overlong_captions_get_nan_with_a_reason(fleur, colour_images):
    red = colour_images["red"]
    captions = ["a red car", "", "a red car " * 200, "a blue kite"]
    result = fleur.score(captions, [red] * 4)
    assert result.error[1] == "empty caption"
    assert "context" in result.error[2] and "caption too long" in result.error[2]
    assert math.isnan(result.score[1]) and math.isnan(result.score[2])
    assert result.raw[1] == result.raw[2] == ""
    clean = fleur.score([captions[0], captions[3]], [red, red])
    assert_same_scores(result.score[[0, 3]], clean.score)
    with pytest.raises(ValueError, match="context"):
        fleur.explain([captions[2]], [red])


def test_unfinished_answers_get_nan_with_a_reason(tiny_judge, colour_images):
    scorer = FLEUR(tiny_judge, max_new_tokens=3)
    result = scorer.score(["a green ball"], [colour_images["green"]])
    assert math.isnan(result.score[0])
    assert "did not end within max_new_tokens=3" in result.error[0]


# ----------------------------------------------------------------------------------------- gradients
@pytest.fixture(scope="session")
def fleur64(tiny_judge_path):
    return FLEUR(load_llava(tiny_judge_path, dtype=torch.float64, device=torch.device("cpu"), local_files_only=True))


def test_differentiable_scores_equal_the_fast_path(fleur, colour_images):
    names = list(FLEUR_PROBES)
    captions = [FLEUR_PROBES[n][1] for n in names]
    images = [colour_images[FLEUR_PROBES[n][0]] for n in names]
    plain = fleur.score(captions, images)
    graded = fleur.score(captions, images, requires_grad=True)
    assert_same_scores(graded.score.detach(), plain.score)
    assert graded.grad_rows == [i for i, e in enumerate(plain.error) if e is None]
    graded.score.nansum().backward()
    assert graded.pixel_values.grad.abs().sum() > 0
    assert graded.inputs_embeds.grad.abs().sum() > 0


@pytest.fixture
def exact_float64_norms(monkeypatch):
    """LLaMA's RMSNorm rounds its input to float32 even in a float64 model, which buries finite
    differences in rounding noise; compute it in the input's precision (identical in float32)."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)


def test_finite_differences_match_the_gradients(fleur64, colour_images, exact_float64_norms):
    captions = ["a green ball", "a blue kite", "a red car", "a yellow box"]
    images = [colour_images["green"], colour_images["blue"], colour_images["red"], colour_images["red"]]
    plan = fleur64.plan(captions, images)
    assert all(r.ok for r in plan.readings)
    weights = torch.tensor([1.0, -0.5, 0.7, 2.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)

    base_pv = fleur64.judge.preprocess(plan.visuals).detach()
    inputs = fleur64.teacher_forcing(plan)
    base_emb = fleur64.judge.model.get_input_embeddings()(inputs.input_ids).detach()

    def objective(pv, emb):
        return (fleur64.differentiable_score(plan, pixel_values=pv, inputs_embeds=emb) * weights).sum()

    pv = base_pv.clone().requires_grad_(True)
    emb = base_emb.clone().requires_grad_(True)
    objective(pv, emb).backward()
    eps = 1e-5
    for grad, base, which in [(pv.grad, base_pv, "pixels"), (emb.grad, base_emb, "embeds")]:
        # A random direction at the scale of the inputs themselves.
        direction = torch.randn(base.shape, generator=gen, dtype=torch.float64) * base.std()
        analytic = float((grad * direction).sum())
        with torch.no_grad():
            if which == "pixels":
                up, down = objective(base + eps * direction, base_emb), objective(base - eps * direction, base_emb)
            else:
                up, down = objective(base_pv, base + eps * direction), objective(base_pv, base - eps * direction)
        numeric = float(up - down) / (2 * eps)
        assert abs(analytic) > 1e-5, which
        assert numeric == pytest.approx(analytic, rel=1e-5), which


# ----------------------------------------------------------------------------------------- loading
def test_loading_from_a_directory_equals_the_model_pair(fleur, tiny_judge_path, colour_images):
    from_dir = FLEUR(str(tiny_judge_path), device="cpu", dtype="float32")
    images = [colour_images["green"], colour_images["red"]]
    a = from_dir.score(["a green ball", "a red car"], images)
    b = fleur.score(["a green ball", "a red car"], images)
    assert a.raw == b.raw
    assert_same_scores(a.score, b.score, atol=0)


def test_unavailable_weights_say_how_to_point_at_a_local_directory(tmp_path):
    with pytest.raises(JudgeLoadError, match="does not exist"):
        FLEUR(str(tmp_path / "no-such-model"))
    with pytest.raises(JudgeLoadError, match=r"hf download .*FLEUR\(model="):
        FLEUR("llava-hf/llava-1.5-13b-hf", local_files_only=True)


def test_model_objects_need_their_processor(tiny_judge):
    model, _ = tiny_judge
    with pytest.raises(TypeError, match="processor"):
        LocalJudge(model)


# --------------------------------------------------------------------------------------------- video
def solid_video(colours: list[tuple[int, int, int]], height: int = 30, width: int = 40) -> np.ndarray:
    return np.stack([np.full((height, width, 3), c, dtype=np.uint8) for c in colours])


def test_composite_layout():
    assert composite_indices(10).tolist() == [0, 3, 6]
    assert composite_indices(1).tolist() == [0, 0, 0]
    frames = [np.full((20, 30, 3), c, dtype=np.uint8) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    image = composite_frames(frames)
    assert image.size == (1536, 512)
    a = np.asarray(image)
    for k, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        panel = a[:, 512 * k : 512 * (k + 1)]
        assert (panel[:462] == colour).all()  # the frame fills 512x462 above the band
        band = panel[462:]
        dark = band.sum(axis=-1) < 200
        assert dark.sum() > 20  # the "Frame k" label
        rows, cols = np.nonzero(dark)
        assert 5 <= cols.min() <= 15 and cols.max() < 256  # left-aligned from x = 10, as released
        assert rows.max() <= 37 and rows.min() >= 3  # sitting on the baseline at y = 35
        assert (band.sum(axis=-1) == 765).mean() > 0.8  # the rest of the band is white
    with pytest.raises(ValueError):
        composite_frames(frames[:2])


def test_composite_resize_is_opencv_linear():
    # cv2.resize INTER_LINEAR samples source x = (x' + 0.5) * W / W' - 0.5, clamped to the edges
    row = np.array([[[0, 0, 0], [100, 200, 40]]], dtype=np.uint8)  # 1x2
    out = resize_bilinear(row, width=4, height=1)[0, :, 0]
    assert out.tolist() == [0, 25, 75, 100]
    assert resize_bilinear(row, width=4, height=3)[:, :, 1].tolist() == [[0, 50, 150, 200]] * 3
    big = np.zeros((8, 8, 3), dtype=np.uint8)
    big[:, 4:] = 255  # downscaling without antialiasing keeps the edge at the sampled pixels
    assert resize_bilinear(big, width=2, height=2)[0, :, 0].tolist() == [0, 255]


def test_video_composite_uses_frames_at_linspace(real_clips):
    colours = [(10 * i, 255 - 20 * i, 5 * i) for i in range(10)]
    image = np.asarray(video_composite(solid_video(colours)))
    for k, t in enumerate([0, 3, 6]):
        assert tuple(image[200, 512 * k + 256]) == colours[t]
    clip = video_composite(str(real_clips[0]))
    assert clip.size == (1536, 512)
    with pytest.raises(MediaError, match="item 4"):
        video_composite(None, index=4)


def test_video_captions_are_scored_on_the_composite(fleur):
    red, blue = FLEUR_COLOURS["red"], FLEUR_COLOURS["blue"]
    video = solid_video([red] * 7 + [blue] * 3)
    captions = ["a red car", "a blue car"]
    by_video = fleur.score(captions, videos=[video, video])
    by_image = fleur.score(captions, [video_composite(video)] * 2)
    assert by_video.raw == by_image.raw
    assert_same_scores(by_video.score, by_image.score, atol=0)
    assert fleur.plan(captions, videos=[video, video.copy()]).image_index == [0, 0]


def test_growing_cache_keeps_its_contents_when_it_grows():
    from capreward.judges.cache import growing_cache

    keys, values = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    cache = growing_cache([(keys, values)], 1, reserve=1, rows=[1, 0, 1])
    layer = cache.layers[0]
    assert torch.equal(layer.keys, keys[[1, 0, 1]]) and torch.equal(layer.values, values[[1, 0, 1]])
    new = [torch.randn(3, 3, 1, 5) for _ in range(5)]
    for step in new:  # room for one: the buffer has to grow on the way
        all_keys, all_values = cache.update(step, 2 * step, 0)
    assert cache.get_seq_length() == 9
    assert torch.equal(all_keys[..., :4, :], keys[[1, 0, 1]])
    assert torch.equal(all_keys[..., 4:, :], torch.cat(new, dim=-2))
    assert torch.equal(all_values[..., 4:, :], 2 * torch.cat(new, dim=-2))
    layer.crop(-2)
    assert cache.get_seq_length() == 7
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys, torch.cat([keys[[0]], torch.cat(new[:3], dim=-2)[[1]]], dim=-2))


def test_fixture_chat_template_renders_llava_v1(tiny_judge):
    from capreward.judges.prompts import LLAVA_V1_SYSTEM, llava_v1_conversation

    _, processor = tiny_judge
    messages = [
        {"role": "system", "content": [{"type": "text", "text": LLAVA_V1_SYSTEM}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q1"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "0.5"}]},
        {"role": "user", "content": [{"type": "text", "text": "Why? Tell me the reason."}]},
    ]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert rendered == llava_v1_conversation([("Q1", "0.5"), ("Why? Tell me the reason.", None)])


# ------------------------------------------------------------------ long answers (release: 512 tokens)
LONG_ANSWER = "The caption accurately and clearly describes the image Score 0.85"


def chain_judge(answer: str, soft: dict[str, dict[str, float]]):
    """A tiny LLaVA built by hand (not trained) whose greedy answer to any FLEUR prompt is ``answer``.

    Attention and MLP outputs are zeroed, so the logits at a position depend only on its own token (a
    bigram model); the output head maps the prompt's last token (":" of "ASSISTANT:") to the answer's first
    token, each answer token to the next and the last to ``</s>``. ``soft[a][b] = w`` adds ``w`` times the
    winning logit to token b after token a, so digit distributions are soft. Returns (model, processor).
    """
    model, processor = build_tiny_llava(TinyLlavaSpec())
    tok = processor.tokenizer
    ids = tok(f"ASSISTANT: {answer}", add_special_tokens=False)["input_ids"][1:]  # ":" then the answer
    chain = ids + [tok.eos_token_id]
    assert len(set(chain)) == len(chain), "every token of the chain must be distinct"
    lm = model.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        normed = lm.norm(model.get_input_embeddings().weight)  # what the head sees for each token
        head = torch.zeros_like(model.lm_head.weight)
        for a, b in zip(chain[:-1], chain[1:]):
            direction = normed[a] / normed[a].norm()
            head[b] += 12.0 * direction
            for other, w in soft.get(tok.convert_ids_to_tokens(a), {}).items():
                head[tok.convert_tokens_to_ids(other)] += 12.0 * w * direction
        model.lm_head.weight.copy_(head)
    return model, processor


def test_an_answer_longer_than_ten_tokens_is_scored_as_released(colour_images):
    model, processor = chain_judge(LONG_ANSWER, {".": {"7": 0.8, "9": 0.7}, "8": {"4": 0.75, "6": 0.6}})
    image, caption = colour_images["red"], "a red car"
    released, text = reference_fleur(model, processor, image, caption, max_new_tokens=512)
    assert text == LONG_ANSWER and len(processor.tokenizer(text)["input_ids"]) > 12 and 0.8 < released < 0.9
    result = FLEUR((model, processor)).score([caption, caption], [image, colour_images["blue"]])
    assert result.raw == [LONG_ANSWER] * 2 and result.error == [None, None] and result.rule == [TWO_DECIMALS] * 2
    assert_same_scores(result.score[:1], [released])
    # the old budget of 10 tokens cut this answer off: no score
    short = FLEUR((model, processor), max_new_tokens=10).score([caption], [image])
    assert torch.isnan(short.score[0]) and "did not end within max_new_tokens=10" in short.error[0]


def test_one_long_answer_among_short_ones_scores_each_as_alone(fleur, colour_images):
    """Rows that end early are dropped from the batch (compaction); every score equals its own run."""
    captions = ["a red car", "a green ball", "a blue kite", "a photo of a kite", "a red car", "many blue balls"]
    images = [colour_images[c] for c in ("red", "green", "blue", "yellow", "red", "blue")]
    together = fleur.score(captions, images)
    for i in range(len(captions)):
        alone = fleur.score(captions[i : i + 1], images[i : i + 1])
        assert alone.raw == together.raw[i : i + 1]
        assert_same_scores(alone.score, together.score[i : i + 1])


def test_release_digit_search_option_matches_the_released_computation(tiny_judge, colour_images):
    model, processor = tiny_judge
    scorer = FLEUR((model, processor), digit_search="release")
    names = [n for n in FLEUR_PROBES]
    captions = [FLEUR_PROBES[n][1] for n in names]
    images = [colour_images[FLEUR_PROBES[n][0]] for n in names]
    result = scorer.score(captions, images)
    expected = [reference_fleur(model, processor, im, c) for c, im in zip(captions, images)]
    assert result.raw == [text for _, text in expected]
    assert_same_scores(result.score, [s for s, _ in expected])
    with pytest.raises(ValueError, match="digit_search"):
        FLEUR((model, processor), digit_search="first")
