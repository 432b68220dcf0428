"""The reward server with the policy's tokenizer: the response starts where the prompt's tokens end.

OpenRLHF 0.11's rollout (``SingleTurnAgentExecutor.execute``) tokenises the prompt with
``add_special_tokens=False``, appends the generated ids and POSTs ``query = decode(prompt_ids +
response_ids, skip_special_tokens=False)`` with ``prompts = [prompt]`` and ``labels = [label]``; before
0.10 the queries were decoded from left-padded batches (pad and BOS tokens in front). The tests drive a
real server on 127.0.0.1 with OpenRLHF's own executor where it is installed, and with that older form
built by the same tokenizer."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from capreward.server.http import RequestError, completion_of, make_server, post_json
from capreward.adapters.prompt_tokens import PromptTokens
from capreward.rewards import EMScoreReward
from capreward.testing import build_tiny_tokenizer

PROMPT = "USER: Describe the image ASSISTANT:"
# the prompt with full-width letters: an NFKC tokenizer reads (and decodes) it as PROMPT
WIDE_PROMPT = "USER: Describe the \uff49\uff4d\uff41\uff47\uff45 ASSISTANT:"
WORDS = ("USER", "ASSISTANT", "Describe", "the", "image", "a", "of", "red", "blue", "green", "purple", "orange")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(WORDS)


@pytest.fixture(scope="module")
def nfkc_tokenizer():
    from tokenizers import normalizers

    tok = build_tiny_tokenizer(WORDS)
    tok.backend_tokenizer.normalizer = normalizers.NFKC()
    return tok


def ids_of(tok, text: str) -> list[int]:
    return tok(text=text, add_special_tokens=False)["input_ids"]


def openrlhf_query(tok, prompt: str, response: str, left_pad: int = 0) -> str:
    """What OpenRLHF sends as the query: prompt ids (add_special_tokens=False) + the response's ids + EOS,
    decoded with the special tokens kept; ``left_pad`` pad tokens and a BOS in front (before 0.10)."""
    front = [tok.pad_token_id] * left_pad + [tok.bos_token_id] if left_pad else []
    ids = front + ids_of(tok, prompt) + ids_of(tok, response) + [tok.eos_token_id]
    return tok.decode(ids, skip_special_tokens=False)


def test_an_ordinary_query_gives_the_same_response_under_both_rules(tokenizer):
    tokens = PromptTokens(tokenizer)
    for left_pad in (0, 3):
        query = openrlhf_query(tokenizer, PROMPT, " a red image.", left_pad)
        assert completion_of(query, PROMPT, "q", tokens) == completion_of(query, PROMPT, "q") == "a red image."


def test_a_normalising_tokenizer_decodes_another_prompt_which_only_the_token_rule_finds(nfkc_tokenizer):
    query = openrlhf_query(nfkc_tokenizer, WIDE_PROMPT, " a red image.")
    assert WIDE_PROMPT not in query and query.startswith(PROMPT)  # the tokenizer changed the prompt's text
    with pytest.raises(RequestError, match="does not contain its prompt"):
        completion_of(query, WIDE_PROMPT, "query[0]")
    assert completion_of(query, WIDE_PROMPT, "query[0]", PromptTokens(nfkc_tokenizer)) == "a red image."


def test_padding_and_bos_before_the_prompt_are_skipped_and_the_whole_response_is_kept(tokenizer):
    tokens = PromptTokens(tokenizer)
    hidden = " purple orange blue green" * 10
    response = hidden + " " + PROMPT + " a red image."  # round 3's H1: the response repeats the prompt
    query = openrlhf_query(tokenizer, PROMPT, response, left_pad=4)
    assert query.startswith("<pad><pad><pad><pad><s>")
    caption = completion_of(query, PROMPT, "q", tokens)
    assert caption == response.strip() and caption.startswith("purple orange")


@pytest.mark.parametrize("query", [
    "garbage " + PROMPT + " a red image.",  # something that is not a special token before the prompt
    "USER: Describe a red image.",  # the prompt's tokens never complete
    " a red image. " + PROMPT,  # the prompt after the response
])
def test_a_query_that_does_not_begin_with_the_prompts_tokens_is_refused(tokenizer, query):
    with pytest.raises(RequestError, match=r"query\[2\]: the query does not begin with its prompt's tokens"):
        completion_of(query, PROMPT, "query[2]", PromptTokens(tokenizer))


def test_a_tokenizer_directory_is_loaded_offline_and_a_bad_one_is_one_line(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    tokens = PromptTokens(tmp_path / "tok")
    assert tokens.decoded_prompt(PROMPT) == PROMPT
    with pytest.raises(ValueError, match="is not a directory holding a tokenizer"):
        PromptTokens(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no tokenizer could be loaded"):
        PromptTokens(tmp_path / "empty")


# -------------------------------------------------------------------------------- a real server
@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt_tokens_media")
    pixels = np.clip(np.array((215, 30, 35)) + np.random.default_rng(0).normal(0, 10, (32, 32, 3)), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).save(root / "red.png")
    return root


@pytest.fixture(scope="module")
def reward(tiny_clip_path):
    return EMScoreReward(model=str(tiny_clip_path))  # unclipped: captions get distinct rewards


def serve(reward, media, prompt_tokens):
    server = make_server(reward, "127.0.0.1", 0, media_root=str(media), prompt_tokens=prompt_tokens)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def test_the_pre_0_10_padded_query_form_is_scored_on_its_response(reward, media, tokenizer):
    server = serve(reward, media, tokenizer)  # a tokenizer object is wrapped in PromptTokens
    try:
        response = " purple orange blue" * 5 + " " + PROMPT + " a red image."
        queries = [openrlhf_query(tokenizer, PROMPT, response, left_pad=2), openrlhf_query(tokenizer, PROMPT, " a red image.", 5)]
        status, answer = post_json(server.url + "/get_reward", {
            "query": queries, "prompts": [PROMPT] * 2, "labels": [json.dumps({"image": "red.png"})] * 2})
        assert status == 200, answer
        direct = reward(None, [response.strip(), "a red image."], image=[str(media / "red.png")] * 2)
        assert answer["rewards"] == pytest.approx(direct, abs=1e-6)
        assert abs(direct[0] - direct[1]) > 1e-3  # the hidden words count
        status, answer = post_json(server.url + "/get_reward", {
            "query": ["x " + queries[1]], "prompts": [PROMPT], "labels": [json.dumps({"image": "red.png"})]})
        assert status == 400 and "query[0]: the query does not begin with its prompt's tokens" in answer["error"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration
def test_openrlhf_rollouts_with_a_normalising_tokenizer(reward, media, nfkc_tokenizer, tokenizer):
    """OpenRLHF's own executor POSTs decode(prompt ids + response ids): with an NFKC tokenizer the prompt
    as decoded differs from the prompt sent, so the text rule answers 400 (OpenRLHF then has no reward)
    and the token rule scores the response."""
    pytest.importorskip("openrlhf", reason="openrlhf is installed by scripts/bootstrap.sh --test")
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    class FixedEngine:  # stands in for OpenRLHF's vLLM actor: answers with the given response's ids
        def __init__(self, tok, response):
            self.ids = ids_of(tok, response) + [tok.eos_token_id]

        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            return SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(self.ids), finish_reason="stop", logprobs=None)])

    def rollout(server, tok, prompt, response):
        executor = SingleTurnAgentExecutor(remote_rm_url=server.url + "/get_reward")
        params = SimpleNamespace(max_tokens=48, logprobs=None)
        return asyncio.run(executor.execute(prompt, json.dumps({"image": "red.png"}), params, 256, tok,
                                            FixedEngine(tok, response)))

    direct = reward(None, ["a red image."], image=[str(media / "red.png")])[0]
    text_rule, token_rule = serve(reward, media, None), serve(reward, media, PromptTokens(nfkc_tokenizer))
    plain = serve(reward, media, PromptTokens(tokenizer))
    try:
        assert rollout(text_rule, nfkc_tokenizer, WIDE_PROMPT, " a red image.")["reward"] is None  # 400
        assert rollout(token_rule, nfkc_tokenizer, WIDE_PROMPT, " a red image.")["reward"] == pytest.approx([direct], abs=1e-6)
        # an ordinary tokenizer: the same reward under both rules, and a response repeating the prompt is scored whole
        assert rollout(plain, tokenizer, PROMPT, " a red image.")["reward"] == pytest.approx([direct], abs=1e-6)
        attack = " purple orange blue" * 5 + " " + PROMPT + " a red image."
        got = rollout(plain, tokenizer, PROMPT, attack)["reward"]
        assert got == pytest.approx(reward(None, [attack.strip()], image=[str(media / "red.png")]), abs=1e-6)
        assert got[0] != pytest.approx(direct, abs=1e-3)  # the hidden words count
    finally:
        for server in (text_rule, token_rule, plain):
            server.shutdown()
            server.server_close()


def test_capreward_serve_refuses_a_prompt_tokenizer_that_is_not_one_in_one_line(tmp_path, tiny_clip_path):
    import subprocess

    from serve_process import serve_command

    (tmp_path / "media").mkdir()
    proc = subprocess.run(
        [*serve_command(), "--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root",
         str(tmp_path / "media"), "--port", "0", "--prompt-tokenizer", str(tmp_path / "no-tokenizer")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"capreward serve: prompt tokenizer {str(tmp_path / 'no-tokenizer')!r} is not a directory holding a tokenizer"]


def test_capreward_serve_with_a_prompt_tokenizer_scores_the_response_after_its_tokens(tmp_path, tiny_clip_path, nfkc_tokenizer, media):
    from serve_process import Server

    nfkc_tokenizer.save_pretrained(tmp_path / "tok")
    server = Server(["--reward", "emscore", "--clip-model", str(tiny_clip_path), "--media-root", str(media),
                     "--prompt-tokenizer", str(tmp_path / "tok")])
    try:
        query = openrlhf_query(nfkc_tokenizer, WIDE_PROMPT, " a red image.", left_pad=2)
        status, answer = server.post({"query": [query], "prompts": [WIDE_PROMPT],
                                      "labels": [json.dumps({"image": "red.png"})]})
        assert status == 200 and answer["errors"] == [None], answer
        direct = EMScoreReward(model=str(tiny_clip_path))(None, ["a red image."], image=[str(media / "red.png")])
        assert answer["rewards"] == pytest.approx(direct, abs=1e-6)
    finally:
        server.stop()
