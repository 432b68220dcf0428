"""VisCE² and G-VEval through the OpenAI-compatible backend against a real HTTP server process on
127.0.0.1 that serves the tiny trained chat judge (its logprobs computed by the model for each request,
prefilled assistant messages included): the same answers and the local judge's exact expected scores,
and failed requests keep their place."""

from __future__ import annotations

import numpy as np
import pytest

from capreward import GVEval, VisCE2
from capreward.judges.protocol import ChatResponse, SyncBackendMixin
from capreward.judges.remote import OpenAIJudge
from capreward.testing.chat_server import ChatServer
from capreward.testing.tiny_vlm_judges import probe_image, synthetic_video, tiny_vlm_judge_dir
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def local(vlm_judge):
    return vlm_judge


#: The tiny judge's vocabulary is 1103 tokens: a server asked for 1000 alternatives lists every digit at
#: every node of the digit tree, so the remote expected scores are exact.
WIDE = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("vlm-server") / "server.log"
    with ChatServer("local", judge_dir=tiny_vlm_judge_dir(), model="tiny-vlm", log_path=log, max_logprobs=WIDE,
                    memo=True) as s:
        yield s


def remote(server, retries=3):
    return OpenAIJudge(server.base_url, "tiny-vlm", api_key_env=None, timeout=120, max_retries=retries,
                       top_logprobs_cap=WIDE)


class AsServer(SyncBackendMixin):
    """The local backend's answers without token ids: what a server returns (text + alternatives)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def generate(self, requests):
        return [ChatResponse(a.text, a.tokens, a.error, a.finish_reason) for a in self.inner.generate(requests)]


COLOURS = ("green", "blue", "red", "yellow")


def test_gveval_remote_equals_the_local_exact_score_on_a_digit_splitting_judge(server, local):
    """The served judge writes "$95$" as "$", "9", "5", "$" (a LLaMA-style tokenizer): the remote score is
    the exact digit tree of prefilled requests, equal to the local judge's exact score on the same model;
    the released reading of the token after "$" would be an expectation over the first digit."""
    captions = ["a green ball", "a blue kite", "a red car", "the box"]
    images = [probe_image("gveval", c) for c in COLOURS]
    want = GVEval(local, max_tokens=120).score(captions, images=images)
    got = GVEval(remote(server), max_tokens=120, tree_top_logprobs=WIDE).score(captions, images=images)
    assert got.raw == want.raw and got.source == want.source
    assert [e is None for e in got.error] == [e is None for e in want.error]
    assert np.isnan(got.score[3]) and "no '$' in the answer" in got.error[3]
    np.testing.assert_allclose(got.score, want.score, rtol=1e-5, equal_nan=True)
    assert (want.score[:3] > 80).all()  # the learned scores (95, 100, 88), not a first digit's 9 or 1
    sent = [b for b in server.requests() if b.get("continue_final_message")]
    assert sent and all(b["add_generation_prompt"] is False and b["max_tokens"] == 1 for b in sent)
    assert sent[-1]["messages"][-1]["role"] == "assistant"
    assert sent[-1]["messages"][-1]["content"].endswith("The final score is $100")


def test_top20_alternatives_give_the_exact_score_or_nan_with_the_reason(server, local):
    captions = ["a green ball", "a red car"]
    images = [probe_image("gveval", c) for c in ("green", "red")]
    want = GVEval(local, max_tokens=120).score(captions, images=images)
    judge = OpenAIJudge(server.base_url, "tiny-vlm", api_key_env=None, timeout=120)  # the default: 20
    got = GVEval(judge, max_tokens=120, requery=0).score(captions, images=images)
    for i in range(len(captions)):
        if np.isnan(got.score[i]):
            assert "uncertain by up to" in got.error[i] and "--max-logprobs" in got.error[i]
        else:
            assert abs(got.score[i] - want.score[i]) <= 1e-4 + 1e-5 * want.score[i]
    loose = GVEval(judge, max_tokens=120, requery=0, tolerance=float("inf")).score(captions, images=images)
    assert np.all(np.abs(loose.score - want.score) < 0.1)  # bounded, never a partial-number expectation


def test_gveval_accr_remote_equals_local_exact(server, local):
    videos, refs = [synthetic_video("red")], [["a red car"]]
    want = GVEval(local, mode="ref-only", accr=True, max_tokens=120).score(["a red car"], videos=videos, references=refs)
    got = GVEval(remote(server), mode="ref-only", accr=True, max_tokens=120, tree_top_logprobs=WIDE).score(
        ["a red car"], videos=videos, references=refs)
    assert got.raw == want.raw and got.error == want.error == [None]
    for name in ("accuracy", "completeness", "conciseness", "relevance"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5)
    np.testing.assert_allclose(got.score, want.score, rtol=1e-5)


def test_visce2_remote_equals_local_exact(server, local, tmp_path):
    captions = ["a green ball", "a blue kite", "a red car", "a photo of a kite"]
    images = [probe_image("visce2", c) for c in COLOURS]
    want = VisCE2(local, expected=True).score(captions, images)
    got = VisCE2(remote(server), expected=True, cache_dir=tmp_path, tree_top_logprobs=WIDE).score(captions, images)
    assert got.context == want.context and got.raw == want.raw and got.error == want.error
    np.testing.assert_array_equal(got.score, want.score)
    assert [e is None for e in got.expected_error] == [e is None for e in want.expected_error]
    np.testing.assert_allclose(got.expected, want.expected, rtol=1e-5, equal_nan=True)


def test_server_errors_lose_no_sample_and_shift_nothing(server, local):
    captions = ["a green ball", "a blue kite", "a red car", "a green kite", "a blue ball", "a red box"]
    images = [probe_image("gveval", c) for c in COLOURS[:3] * 2]
    want = GVEval(AsServer(local), expected=False, max_tokens=120).score(captions, images=images)
    server.control(reset=True)
    server.control(status=500, count=2)
    got = GVEval(remote(server, retries=0), expected=False, max_tokens=120).score(captions, images=images)
    failed = [i for i, e in enumerate(got.error) if e is not None]
    assert len(failed) == 2 and all("500" in got.error[i] and np.isnan(got.score[i]) for i in failed)
    kept = [i for i in range(len(captions)) if i not in failed]
    np.testing.assert_array_equal(got.score[kept], want.score[kept])
    assert [got.raw[i] for i in kept] == [want.raw[i] for i in kept]
    server.control(reset=True)


def test_prompt_logprobs_make_a_narrow_server_exact(server, local):
    """A server that lists only 10 alternatives per token but answers vLLM's ``prompt_logprobs``: each digit
    missing from a node's 10 is read as the last prompt token of a request prefilled with it, and the
    remote score is the local judge's exact one; without prompt logprobs the same server leaves the
    score uncertain (no score, with the reason)."""
    captions = ["a green ball", "a red car"]
    images = [probe_image("gveval", c) for c in ("green", "red")]
    want = GVEval(local, max_tokens=120).score(captions, images=images)
    narrow = dict(api_key_env=None, timeout=120, top_logprobs_cap=10)
    plain = GVEval(OpenAIJudge(server.base_url, "tiny-vlm", **narrow), max_tokens=120, requery=0,
                   tree_top_logprobs=10).score(captions, images=images)
    assert any("uncertain by up to" in (e or "") for e in plain.error)
    got = GVEval(OpenAIJudge(server.base_url, "tiny-vlm", prompt_logprobs=True, **narrow), max_tokens=120, requery=0,
                 tree_top_logprobs=10).score(captions, images=images)
    assert got.error == [None] * 2 and got.raw == want.raw
    np.testing.assert_allclose(got.score, want.score, rtol=1e-5)
    asked = [b for b in server.requests() if b.get("prompt_logprobs") is not None]
    assert asked and all(b["max_tokens"] == 1 and b["messages"][-1]["role"] == "assistant" for b in asked)
    assert asked[-1]["messages"][-1]["content"][-1].isdigit()  # the prefilled text ends with the digit read
