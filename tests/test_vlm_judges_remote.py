"""VisCE² and G-VEval through the OpenAI-compatible backend against a real HTTP server process on
127.0.0.1 that serves the tiny trained chat judge: same answers as the local backend, and failed requests
keep their place."""

from __future__ import annotations

import numpy as np
import pytest

from capreward import GVEval, VisCE2
from capreward.judges.protocol import ChatResponse, SyncBackendMixin
from capreward.judges.remote import OpenAIJudge
from capreward.testing.chat_server import ChatServer
from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge_dir
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def local(vlm_judge):
    return vlm_judge


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("vlm-server") / "server.log"
    with ChatServer("local", judge_dir=tiny_vlm_judge_dir(), model="tiny-vlm", log_path=log) as s:
        yield s


def remote(server, retries=3):
    return OpenAIJudge(server.base_url, "tiny-vlm", api_key_env=None, timeout=60, max_retries=retries)


class AsServer(SyncBackendMixin):
    """The local backend's answers without token ids: what a server returns (text + alternatives)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def generate(self, requests):
        return [ChatResponse(a.text, a.tokens, a.error, a.finish_reason) for a in self.inner.generate(requests)]


COLOURS = ("green", "blue", "red", "yellow")


def test_gveval_remote_equals_local_with_the_released_rule(server, local):
    captions = ["a green ball", "a blue kite", "a red car", "the box"]
    images = [probe_image("gveval", c) for c in COLOURS]
    want = GVEval(AsServer(local), max_tokens=120).score(captions, images=images)
    got = GVEval(remote(server), max_tokens=120).score(captions, images=images)
    assert got.raw == want.raw and got.error == want.error and got.source == want.source
    np.testing.assert_allclose(got.score, want.score, rtol=1e-5, equal_nan=True)
    np.testing.assert_array_equal(got.parsed, want.parsed)


def test_visce2_remote_equals_local(server, local, tmp_path):
    captions = ["a green ball", "a blue kite", "a red car", "a photo of a kite"]
    images = [probe_image("visce2", c) for c in COLOURS]
    want = VisCE2(AsServer(local), expected=True).score(captions, images)
    got = VisCE2(remote(server), expected=True, cache_dir=tmp_path).score(captions, images)
    assert got.context == want.context and got.raw == want.raw and got.error == want.error
    np.testing.assert_array_equal(got.score, want.score)
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
