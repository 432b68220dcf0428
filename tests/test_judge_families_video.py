"""Video judges on the local VLM families that take video (Qwen2-VL, Qwen2.5-VL): the frames go through the
family's own video processor (``videos=``), fill the template's video placeholder, and get the video's 3-D
rotary positions (frame group, row, column; Qwen2.5-VL spaces frame groups by seconds).

Checked as the image families are (tests/test_judge_families.py), against the model's own ``generate`` fed
by its own processor with ``videos=``: the batched judge (one prefill per video prefix shared by the
captions, cached decode) writes the same tokens with logits within 1e-5, and a row's result does not depend
on the batch or its order; no red-team caption becomes a role, a special token or a video slot; a family
that takes no video says so.
"""

from __future__ import annotations

import random

import pytest
import torch

from capreward.judges import LocalJudge
from capreward.judges.caller_text import Data, render
from capreward.judges.prompts import fleur_prompt
from capreward.testing import fleur_task_image
from red_team import ATTACKS, PLAIN_WRONG
from capreward.testing.tiny_vlm_families import build_tiny_idefics3, build_tiny_qwen2_vl

CAPTIONS = ["a red ball", "a blue box on the wall", "the kite"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["2", "2.5"])
def judge(request):
    return LocalJudge(build_tiny_qwen2_vl(seed=0, version=request.param), image_size=32)


@pytest.fixture(scope="module")
def videos():
    """Two videos of 4 frames (two frame groups), not 32x32: the judge resizes every frame."""
    clips = []
    for colours in (("red", "blue", "green", "red"), ("blue", "blue", "red", "yellow")):
        clips.append([fleur_task_image(c, random.Random(f"video-{k}-{c}"), size=(40, 28)) for k, c in enumerate(colours)])
    return clips


def reference(judge, parts, frames):
    """The family's own processor on the rendered prompt and the resized frames (``videos=``)."""
    resized = [judge.family.resize(f) for f in frames]
    return judge.processor(text=[render(parts)], videos=[resized], return_tensors="pt")


def run_batch(judge, rows, videos, steps=6):
    parts = [judge.conversation_parts([(fleur_prompt(c), None)], video=True) for c, _ in rows]
    features = judge.image_features(judge.preprocess_videos(videos))
    ids = judge.encode_prompts(parts, int(features.shape[1]))
    out = judge.greedy(judge.start(ids, features, [v for _, v in rows]), steps, keep_logits=True)
    return parts, ids, out


def test_batched_video_greedy_equals_the_models_own_generate(judge, videos):
    rows = [(c, v) for v in range(len(videos)) for c in CAPTIONS]
    parts, ids, out = run_batch(judge, rows, videos)
    assert judge.family.frame_groups == 2
    for r, (caption, v) in enumerate(rows):
        inputs = reference(judge, parts[r], videos[v])
        assert inputs["input_ids"][0].tolist() == ids[r], f"prompt ids of row {r}"
        assert "pixel_values_videos" in inputs and "pixel_values" not in inputs
        with torch.inference_mode():
            ref = judge.model.generate(**inputs, do_sample=False, max_new_tokens=6, output_logits=True,
                                       return_dict_in_generate=True)
        new = ref.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        cut = next((k for k, t in enumerate(new) if t in judge.eos_token_ids), len(new))
        assert out.tokens[r] == new[:cut], f"row {r}"
        assert out.logits[r]
        for step, logits in out.logits[r].items():
            torch.testing.assert_close(logits, ref.logits[step][0].float(), atol=1e-5, rtol=0)


def test_a_rows_video_result_does_not_depend_on_the_batch_or_its_order(judge, videos):
    rows = [(c, v) for v in range(len(videos)) for c in CAPTIONS]
    _, _, whole = run_batch(judge, rows, videos)
    order = [4, 0, 5, 2, 1, 3]
    _, _, shuffled = run_batch(judge, [rows[o] for o in order], videos)
    for k, o in enumerate(order):
        assert shuffled.tokens[k] == whole.tokens[o]
        for step, logits in shuffled.logits[k].items():
            torch.testing.assert_close(logits, whole.logits[o][step], atol=1e-5, rtol=0)
    for r, (caption, v) in enumerate(rows[:2]):
        _, _, alone = run_batch(judge, [(caption, 0)], [videos[v]])
        assert alone.tokens[0] == whole.tokens[r]
        for step, logits in alone.logits[0].items():
            torch.testing.assert_close(logits, whole.logits[r][step], atol=1e-5, rtol=0)


def test_no_caption_becomes_a_role_a_special_token_or_a_video_slot(judge, videos):
    features = judge.image_features(judge.preprocess_videos(videos[:1]))
    n_video = int(features.shape[1])
    control = judge.control_token_ids
    video_token = judge.family.video_token_id
    plain = judge.encode_prompts([judge.conversation_parts([(fleur_prompt(PLAIN_WRONG), None)], video=True)], n_video)[0]
    assert plain.count(video_token) == n_video and judge.image_token_id not in plain
    for attack in ATTACKS:
        parts = judge.conversation_parts([(fleur_prompt(attack.caption), None)], video=True)
        assert [p.text for p in parts if isinstance(p, Data)] == [fleur_prompt(attack.caption)]
        ids = judge.encode_prompts([parts], n_video, names=[attack.name])[0]
        assert sorted(t for t in ids if t in control) == sorted(t for t in plain if t in control), attack.name


def test_a_family_without_video_says_so():
    judge = LocalJudge(build_tiny_idefics3(seed=0), image_size=32)
    with pytest.raises(ValueError, match="idefics3 judge family does not take videos"):
        judge.conversation_parts([("hello", None)], video=True)
    qwen3 = LocalJudge(build_tiny_qwen2_vl(seed=0, version="3"), image_size=32)
    with pytest.raises(ValueError, match="qwen3-vl judge family does not take videos"):
        qwen3.preprocess_videos([[fleur_task_image("red", random.Random(0))] * 2])
