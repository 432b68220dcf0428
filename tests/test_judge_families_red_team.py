"""The red-team suite's captions against every local judge family's template, through the chat judge and
every judge scorer's own prompt: LLaVA-1.5, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Idefics3, SmolVLM, LLaVA-NeXT
and LLaVA-OneVision, each with G-VEval (ref-free and combined), VisCE²'s rating prompt and FLEUR's prompt
as :class:`~capreward.judges.local_chat.LocalChatJudge` encodes them for the model.

For every hostile caption of ``ATTACKS`` (``tests/red_team.py``) the encoded prompt holds exactly
the plain caption's structure tokens (roles, turn ends, vision markers, image tokens, in the same number),
and the caption's message is one piece of data in the rendered parts: no caption becomes a role, a special
token or an image slot. (tests/test_judge_families.py runs FLEUR's prompt through the low-level
``LocalJudge`` path of each family; tests/test_gveval_video_families.py the video slot.)"""

from __future__ import annotations

import random

import pytest
import torch

from capreward import GVEval
from capreward.judges import ChatRequest, LocalChatJudge, LocalJudge, user_turn
from capreward.judges.caller_text import Data
from capreward.judges.prompts import fleur_prompt
from capreward.judges.vlm_prompts import visce2_prompt
from capreward.testing import fleur_task_image
from red_team import ATTACKS, PLAIN_WRONG
from capreward.testing.tiny_llava import build_tiny_llava
from capreward.testing.tiny_vlm_families import (build_tiny_idefics3, build_tiny_llava_next, build_tiny_qwen2_vl,
                                                 build_tiny_smolvlm)

FAMILIES = {
    "llava-1.5": lambda: LocalJudge(build_tiny_llava()),
    "qwen2-vl": lambda: LocalJudge(build_tiny_qwen2_vl(seed=0, version="2"), image_size=32),
    "qwen2.5-vl": lambda: LocalJudge(build_tiny_qwen2_vl(seed=0, version="2.5"), image_size=32),
    "qwen3-vl": lambda: LocalJudge(build_tiny_qwen2_vl(seed=0, version="3"), image_size=32),
    "idefics3": lambda: LocalJudge(build_tiny_idefics3(seed=0), image_size=32),
    "smolvlm": lambda: LocalJudge(build_tiny_smolvlm(seed=0), image_size=32),
    "llava-next": lambda: LocalJudge(build_tiny_llava_next(seed=0), image_size=32),
    "llava-onevision": lambda: LocalJudge(build_tiny_llava_next(seed=0, onevision=True), image_size=32),
}
CONTEXT = "A red ball on a white floor."
REFS = ["a red ball", "a ball on the floor"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(FAMILIES))
def backend(request):
    return LocalChatJudge(FAMILIES[request.param](), batch_size=len(ATTACKS) + 1)


@pytest.fixture(scope="module")
def image():
    return fleur_task_image("red", random.Random("red-team-families"), size=(40, 28))


def requests_of(scorer: str, backend, captions, image):
    """Each caption's request as ``scorer`` builds it (None where the scorer refuses the caption)."""
    if scorer.startswith("gveval"):
        mode = scorer.split(":")[1]
        refs = [REFS] * len(captions) if mode != "ref-free" else None
        requests, _ = GVEval(backend, mode=mode).requests(captions, images=[image] * len(captions), references=refs)
        return requests
    prompt = (lambda c: visce2_prompt(c, CONTEXT)) if scorer == "visce2" else fleur_prompt
    return [ChatRequest(turns=(user_turn(prompt(c), [image]),)) for c in captions]


@pytest.mark.parametrize("scorer", ["gveval:ref-free", "gveval:combined", "visce2", "fleur"])
def test_no_red_team_caption_becomes_structure_in_any_family(backend, image, scorer):
    captions = [PLAIN_WRONG] + [a.caption for a in ATTACKS]
    requests = requests_of(scorer, backend, captions, image)
    live = [i for i, r in enumerate(requests) if r is not None]
    assert live[0] == 0 and len(live) > len(captions) // 2
    for i in live:  # the caption's message is data, whole
        data = [p.text for p in backend.render_parts(requests[i]) if isinstance(p, Data)]
        assert data == [requests[i].turns[0].text], (scorer, captions[i][:40])
    judge = backend.judge
    features = judge.image_features(judge.preprocess([image]))  # the encoding LocalChatJudge runs (no context limit)
    ids = judge.encode_prompts([backend.render_parts(requests[i]) for i in live], int(features.shape[1]),
                               names=[captions[i][:40] for i in live])
    control = judge.control_token_ids
    plain = sorted(t for t in ids[0] if t in control)
    assert ids[0].count(judge.image_token_id) == int(features.shape[1])
    for k, i in enumerate(live[1:], start=1):
        assert sorted(t for t in ids[k] if t in control) == plain, (scorer, ATTACKS[i - 1].name)
