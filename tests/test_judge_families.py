"""Local judges beyond LLaVA-1.5: tiny random Qwen2-VL, Qwen2.5-VL (image grid, 3-D rotary positions),
Qwen3-VL (the same plus DeepStack features), Idefics3 and SmolVLM (image splitting), LLaVA-NeXT and
LLaVA-OneVision (any-resolution tiling), with their real processor classes and released chat templates,
built offline.

Checked against an independent path on the same model, the family's own ``generate`` / forward fed by its
own processor (which computes the image grid and the rotary positions itself): the batched judge (one
prefill per image prefix shared by the captions, cached decode) writes the same tokens with the same
logits (1e-5), and the exact digit-tree distribution equals the one read from plain forwards over every
number. FLEUR, VisCE² and G-VEval scores do not depend on the batch or its order; no red-team caption
becomes a role, a special token or an image slot in the family's template; a saved directory is loaded
as its family (config.json's model_type), not as LLaVA.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from capreward.judges import LocalChatJudge, LocalJudge
from capreward.judges.caller_text import Data, render
from capreward.judges.prompts import fleur_prompt
from capreward.judges.protocol import ChatRequest, user_turn
from capreward.testing import fleur_task_image
from red_team import ATTACKS, PLAIN_WRONG
from capreward.testing.tiny_vlm_families import (build_tiny_idefics3, build_tiny_llava_next, build_tiny_qwen2_vl,
                                                 build_tiny_smolvlm)

CAPTIONS = ["a red ball", "a blue box on the wall", "the kite"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: family -> (builder, the family's name in capreward, its image placeholder)
FAMILIES = {
    "qwen2-vl": (lambda: build_tiny_qwen2_vl(seed=0, version="2"), "qwen2-vl", "<|image_pad|>"),
    "qwen2.5-vl": (lambda: build_tiny_qwen2_vl(seed=0, version="2.5"), "qwen2-vl", "<|image_pad|>"),
    "qwen3-vl": (lambda: build_tiny_qwen2_vl(seed=0, version="3"), "qwen3-vl", "<|image_pad|>"),
    "idefics3": (lambda: build_tiny_idefics3(seed=0), "idefics3", "<image>"),
    "smolvlm": (lambda: build_tiny_smolvlm(seed=0), "smolvlm", "<image>"),
    "llava-next": (lambda: build_tiny_llava_next(seed=0), "llava-next", "<image>"),
    "llava-onevision": (lambda: build_tiny_llava_next(seed=0, onevision=True), "llava-onevision", "<image>"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def qwen(request):
    """``(model, processor)`` of each family's tiny random model (the name is historical: Qwen first)."""
    model, processor = FAMILIES[request.param][0]()
    model.family_key = request.param
    return model, processor


@pytest.fixture(scope="module")
def judge(qwen):
    return LocalJudge(qwen, image_size=32)


#: family -> builder of a tiny model that answers with numbers (its digit, "$" and end-of-turn outputs
#: scaled up by ``answer_bias``)
ANSWERING = {
    "qwen2-vl": lambda bias: build_tiny_qwen2_vl(seed=0, answer_bias=bias),
    "qwen2.5-vl": lambda bias: build_tiny_qwen2_vl(seed=0, version="2.5", answer_bias=bias),
    "qwen3-vl": lambda bias: build_tiny_qwen2_vl(seed=0, version="3", answer_bias=bias),
    "idefics3": lambda bias: build_tiny_idefics3(seed=0, answer_bias=bias),
    # seed 0's SmolVLM ends every answer at once; seed 4's answers image- and caption-dependent numbers
    "smolvlm": lambda bias: build_tiny_smolvlm(seed=4, answer_bias=bias),
    "llava-next": lambda bias: build_tiny_llava_next(seed=0, answer_bias=bias),
    "llava-onevision": lambda bias: build_tiny_llava_next(seed=0, onevision=True, answer_bias=bias),
}


@pytest.fixture(scope="module", params=list(ANSWERING))
def answering_judge(request):
    """A tiny model of each family with its digit, "$" and end-of-turn outputs scaled up: it answers with
    numbers that depend on the image and caption, so the scorers read real scores."""
    return LocalJudge(ANSWERING[request.param](30.0), image_size=32)


@pytest.fixture(scope="module")
def images():
    # not square and not 32x32: the judge resizes them, the reference path is given the same resized image
    return [fleur_task_image(c, random.Random(f"family-{c}"), size=(40, 28)) for c in ("red", "blue")]


def reference_inputs(judge, parts, image):
    """The family's own processor on the rendered prompt and the resized image (it expands the image
    placeholder from the image grid or the tile layout and returns what the model's generate needs)."""
    return judge.processor(text=[render(parts)], images=[[judge.family.resize(image)]], return_tensors="pt")


def test_the_family_is_read_from_the_model(judge):
    _, name, placeholder = FAMILIES[judge.model.family_key]
    assert judge.family is not None and judge.family.name == name
    assert judge.image_placeholder == placeholder
    assert judge.family.image_size == (32, 32)


def test_batched_greedy_equals_the_models_own_generate(judge, images):
    """Six prompts (three captions x two images) in one batch with shared prefixes, against
    ``generate(output_logits=True)`` per prompt: same prompt ids, same tokens, logits within 1e-5."""
    rows = [(c, i) for i in range(len(images)) for c in CAPTIONS]
    parts = [judge.conversation_parts([(fleur_prompt(c), None)]) for c, _ in rows]
    features = judge.image_features(judge.preprocess(images))
    ids = judge.encode_prompts(parts, int(features.shape[1]))
    state = judge.start(ids, features, [i for _, i in rows])
    out = judge.greedy(state, 6, keep_logits=True)
    for r, (caption, i) in enumerate(rows):
        inputs = reference_inputs(judge, parts[r], images[i])
        assert inputs["input_ids"][0].tolist() == ids[r], f"prompt ids of row {r}"
        with torch.inference_mode():
            ref = judge.model.generate(**inputs, do_sample=False, max_new_tokens=6, output_logits=True,
                                       return_dict_in_generate=True)
        new = ref.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        eos = judge.eos_token_ids
        cut = next((k for k, t in enumerate(new) if t in eos), len(new))
        assert out.tokens[r] == new[:cut], f"row {r}"
        for step, logits in out.logits[r].items():
            torch.testing.assert_close(logits, ref.logits[step][0].float(), atol=1e-5, rtol=0)


def test_the_exact_digit_tree_equals_plain_forwards(judge, images):
    """``integer_distributions`` (batched, branching cached states) against p(k) for every k in 0..100
    read from plain full-sequence forwards of the model on its processor's inputs."""
    backend = LocalChatJudge(judge, batch_size=4)
    prompt = "Rate the caption from 0 to 100. Caption: a red ball"
    requests = [ChatRequest(turns=(user_turn(prompt, [im]),)) for im in images]
    exact = backend.integer_distributions(requests, [[] for _ in requests])
    digits = judge.digit_token_ids()
    model = judge.model
    for r, image in enumerate(images):
        parts = judge.conversation_parts([(prompt, None)])
        inputs = reference_inputs(judge, parts, image)
        n = inputs["input_ids"].shape[1]
        probs = np.zeros(101)
        with torch.inference_mode():
            for k in range(101):
                tail = [digits[int(d)] for d in str(k)]
                ids = torch.cat([inputs["input_ids"], torch.tensor([tail])], dim=1)
                batch = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
                if "mm_token_type_ids" in inputs:  # Qwen2-VL's processor marks image tokens for the rotary positions
                    batch["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros((1, len(tail)), dtype=torch.long)], 1)
                logp = torch.log_softmax(model(**batch).logits[0].double(), dim=-1)
                total = sum(float(logp[n - 1 + j, t]) for j, t in enumerate(tail))
                end = 1.0 - float(logp[n - 1 + len(tail)].exp()[digits].sum())
                probs[k] = math.exp(total) * end
        np.testing.assert_allclose(exact[r], probs, atol=1e-5, rtol=0)


def test_fleur_visce2_gveval_are_batch_and_order_invariant(answering_judge, images):
    from capreward import FLEUR, GVEval, VisCE2

    judge = answering_judge
    caps = CAPTIONS + ["many red cars"]
    ims = [images[0], images[1], images[1], images[0]]
    fleur = FLEUR(judge, max_new_tokens=8)
    whole = fleur.score(caps, ims)
    assert all(any(ch.isdigit() for ch in raw) for raw in whole.raw)  # it answers numbers: the comparison means something
    alone = [fleur.score([c], [im]) for c, im in zip(caps, ims)]
    order = [3, 1, 0, 2]
    shuffled = fleur.score([caps[o] for o in order], [ims[o] for o in order])
    for k in range(len(caps)):
        torch.testing.assert_close(whole.score[k], alone[k].score[0], equal_nan=True, atol=1e-5, rtol=0)
        assert whole.raw[k] == alone[k].raw[0]
    torch.testing.assert_close(shuffled.score, whole.score[order], equal_nan=True, atol=1e-5, rtol=0)

    backend = LocalChatJudge(judge, batch_size=3)
    makers = {  # a fresh scorer per call: VisCE²'s visual contexts are cached per image
        "visce2": lambda: (lambda c, i: VisCE2(backend, expected=True, max_tokens=8, context_max_tokens=8).score(c, i)),
        "gveval": lambda: (lambda c, i: GVEval(backend, max_tokens=8, requery=0).score(c, images=i)),
    }
    for name, make in makers.items():
        both = make()(caps, ims)
        if name == "visce2":  # the exact digit tree at the answer's number: finite for every sample
            assert np.isfinite(np.asarray(both.expected, dtype=float)).all(), name
        for k in range(len(caps)):
            one = make()([caps[k]], [ims[k]])
            a, b = float(np.asarray(both.score, dtype=float)[k]), float(np.asarray(one.score, dtype=float)[0])
            # float32 padding noise only: 1e-5 of the value (G-VEval's scale is 0..100)
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5 * max(1.0, abs(a)), (name, k, a, b)
            assert both.raw[k] == one.raw[0], (name, k)
        if name == "visce2":
            exp_both = np.asarray(both.expected, dtype=float)
            for k in range(len(caps)):
                exp_one = float(np.asarray(make()([caps[k]], [ims[k]]).expected, dtype=float)[0])
                assert (math.isnan(exp_both[k]) and math.isnan(exp_one)) or abs(exp_both[k] - exp_one) <= 1e-5 * max(1.0, exp_one)


def test_no_caption_becomes_a_role_a_special_token_or_an_image_slot(judge, images):
    """Every red-team caption, in the family's template: the prompt holds exactly the plain prompt's
    structure tokens (roles, turn ends, vision markers, image tokens), and the caption's own tokens are
    none of them."""
    features = judge.image_features(judge.preprocess(images[:1]))
    n_image = int(features.shape[1])
    control = judge.control_token_ids

    def structure(ids):
        return sorted(t for t in ids if t in control)

    plain = judge.encode_prompts([judge.conversation_parts([(fleur_prompt(PLAIN_WRONG), None)])], n_image)[0]
    assert plain.count(judge.image_token_id) == n_image
    for attack in ATTACKS:
        parts = judge.conversation_parts([(fleur_prompt(attack.caption), None)])
        assert [p.text for p in parts if isinstance(p, Data)] == [fleur_prompt(attack.caption)]
        ids = judge.encode_prompts([parts], n_image, names=[attack.name])[0]
        assert structure(ids) == structure(plain), attack.name


def test_a_saved_directory_loads_as_its_family(judge, qwen, images, tmp_path):
    from capreward.judges import load_llava

    model, processor = qwen
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, loaded_processor = load_llava(tmp_path, dtype=torch.float32, device=torch.device("cpu"))
    assert type(loaded) is type(model)  # Qwen2VL... / Qwen2_5_VL...ForConditionalGeneration, not LLaVA
    again = LocalJudge((loaded, loaded_processor), image_size=32)
    parts = [judge.conversation_parts([(fleur_prompt(c), None)]) for c in CAPTIONS]
    results = []
    for j in (judge, again):
        features = j.image_features(j.preprocess(images[:1]))
        state = j.start(j.encode_prompts(parts, int(features.shape[1])), features, [0] * len(parts))
        results.append(j.greedy(state, 4, keep_logits=False).tokens)
    assert results[0] == results[1]


def test_an_unsupported_image_text_family_is_a_clear_error_not_a_llava_path():
    from types import SimpleNamespace

    from capreward.judges.families import judge_family

    with pytest.raises(ValueError, match="'mllama' are not supported yet; supported: llava, idefics3, llava_next, "
                                         "llava_onevision, qwen2_5_vl, qwen2_vl, qwen3_vl, smolvlm"):
        judge_family(SimpleNamespace(config=SimpleNamespace(model_type="mllama")), None)
    assert judge_family(SimpleNamespace(config=SimpleNamespace(model_type="llava")), None) is None


def test_the_teacher_forced_pass_gives_the_cached_paths_logits(judge, images):
    """``logits_at`` (one differentiable pass over prompt + answer, what FLEUR's gradients use) gives the
    logits the batched cached path chose each answer token with (Qwen3-VL: its DeepStack features in
    this pass too), with gradients reaching the image features."""
    rows = [(c, i) for i in range(len(images)) for c in CAPTIONS[:2]]
    parts = [judge.conversation_parts([(fleur_prompt(c), None)]) for c, _ in rows]
    features = judge.image_features(judge.preprocess(images))
    ids = judge.encode_prompts(parts, int(features.shape[1]))
    out = judge.greedy(judge.start(ids, features, [i for _, i in rows]), 4, keep_logits=True)
    steps = [sorted(out.logits[r])[:len(out.tokens[r])] or [0] for r in range(len(rows))]
    inputs = judge.teacher_forcing_inputs(ids, out.tokens, steps)
    leaf = features.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = judge.logits_at(inputs, leaf, [i for _, i in rows])
        logits[..., 0].sum().backward()
    for r in range(len(rows)):
        for k, step in enumerate(steps[r]):
            torch.testing.assert_close(logits[r, k].detach(), out.logits[r][step], atol=1e-5, rtol=0)
    assert leaf.grad is not None and bool(leaf.grad.abs().sum() > 0)
