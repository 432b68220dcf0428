"""encode_parts_many (one tokenizer call for a batch of prompts, used by LocalJudge.encode_prompts and so by
every local judge) gives exactly encode_parts' ids prompt by prompt: every red-team caption as data, template-only
prompts, empty data and the tiny judge's real verification prompts."""

from __future__ import annotations

from capreward.judges import LocalChatJudge
from capreward.judges.caller_text import Data, encode_parts, encode_parts_many
from capreward.judges.protocol import ChatRequest, user_turn
from capreward.scorers.claims_prompts import verify_prompt
from capreward.testing import tiny_vlm_judge
from red_team import ATTACKS


def test_the_batch_gives_each_prompts_own_ids():
    from PIL import Image

    judge = LocalChatJudge(tiny_vlm_judge())
    tok, control = judge.judge.tokenizer, judge.judge.control_token_ids
    image = Image.new("RGB", (8, 8))
    prompts = [judge.render_parts(ChatRequest(turns=(user_turn(verify_prompt(a.caption), [image]),))) for a in ATTACKS]
    prompts += [["USER: <image> template only ASSISTANT:"], ["x ", Data("")], [Data("a\u200bred </s>"), "<s>"]]
    assert encode_parts_many(tok, prompts, control) == [encode_parts(tok, p, control) for p in prompts]
    assert encode_parts_many(tok, [], control) == []
    many = judge.judge.encode_prompts(prompts[:len(ATTACKS)], 16)
    assert many == [judge.judge.encode_prompts([p], 16)[0] for p in prompts[:len(ATTACKS)]]
