"""Dynamic batching in the reward server: concurrent requests merged into one scorer call, answers
split back in order and identical to scoring each sample alone, whatever was merged; a sample that
breaks the reward only affects itself; a request is not held up by an unrelated slow batch."""

from __future__ import annotations

import json
import random
import re
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from capreward.server.batching import Busy, DynamicBatcher
from capreward.server.http import RewardService, ServerLimits, make_server, post_json
from capreward.adapters.scoring import ScoredBatch
from capreward.rewards import CLIPScoreReward

from conftest import random_video
from serve_process import Server

CAPTIONS = ["a dog runs", "two people dance", "a dog runs across the grass", "a red car on a road", ""]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    for i, seed in enumerate((61, 62, 64, 75)):
        Image.fromarray(random_video(seed, frames=1)[0]).save(root / f"i{i}.png")
    (root / "broken.png").write_bytes(b"not an image")
    return root


@pytest.fixture(scope="module")
def reward(tiny_clip_path):
    return CLIPScoreReward(model=str(tiny_clip_path))


def sample_pool():
    """(caption, label) pairs: good ones with and without references, and bad ones (empty caption,
    unreadable file, refused path)."""
    good = [(c, {"image": f"i{i}.png"}) for c in CAPTIONS[:4] for i in range(4)]
    refs = [(CAPTIONS[i], {"image": f"i{i}.png", "references": ["people dancing", "a dog outside"]}) for i in range(4)]
    bad = [("", {"image": "i0.png"}), ("a dog runs", {"image": "broken.png"}), ("a dog runs", {"image": "../x.png"})]
    return good + refs + bad


class SpyReward:
    """Wraps a reward; records the size of every call, raises for the caption ``BOOM`` (a sample that
    breaks the reward), and optionally blocks in calls until ``gate`` is set."""

    __name__ = "spy"

    def __init__(self, inner, gated: bool = False):
        self.inner = inner
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not gated:
            self.gate.set()

    @property
    def columns(self):
        return self.inner.columns

    def value_range(self):
        return self.inner.value_range()  # the server's default fallback is its bottom

    def compute(self, prompts, completions, **kwargs):
        self.calls.append(len(completions))
        self.entered.set()
        assert self.gate.wait(120)
        if "BOOM" in completions:
            raise RuntimeError("the reward broke on BOOM")
        return self.inner.compute(prompts, completions, **kwargs)


def alone(service: RewardService, caption: str, label, j: int = 0) -> dict:
    """The answer for one sample scored alone, its error renamed to position ``j`` of a request."""
    answer = service.handle({"query": [caption], "labels": [label]})
    if answer["errors"][0] is not None:
        answer["errors"][0] = re.sub(r"^query\[0\]", f"query[{j}]", answer["errors"][0])
    return answer


def test_concurrent_requests_are_merged_and_split_back_in_order(reward, media):
    """max_wait is huge, so the batch closes exactly when it is full: two requests of 4 make one
    scorer call of 8, and each answer equals its samples scored alone."""
    spy = SpyReward(reward)
    service = RewardService(spy, fallback=-1, media_root=str(media))
    batcher = DynamicBatcher(service.score, max_batch_size=8, max_wait=120, workers=1)
    pool = sample_pool()
    requests = [pool[0:4], [pool[20], pool[21], pool[5], pool[22]]]
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(batcher.submit, [c for c, _ in r], service.parse(
            {"query": [c for c, _ in r], "labels": [lab for _, lab in r]})[1], 60) for r in requests]
        answers = [service.respond(f.result(timeout=300)) for f in futures]
    assert batcher.batches == 1 and batcher.samples == 8
    assert spy.calls == [7]  # one scorer call; the refused path never reaches the reward
    for request, answer in zip(requests, answers):
        for j, (caption, label) in enumerate(request):
            single = alone(service, caption, label, j)
            assert answer["rewards"][j] == pytest.approx(single["rewards"][0], abs=1e-6)
            assert answer["errors"][j] == single["errors"][0]
    assert answers[1]["errors"][0] is not None and answers[1]["errors"][2] is None  # bad and good in one request
    assert batcher.close(10)


def test_a_request_larger_than_the_batch_is_scored_alone_and_merging_can_be_off(reward, media):
    spy = SpyReward(reward)
    service = RewardService(spy, media_root=str(media))
    captions, labels = service.parse({"query": ["a dog runs"] * 10, "labels": [{"image": "i1.png"}] * 10})
    big = DynamicBatcher(service.score, max_batch_size=8, max_wait=120, workers=1)
    assert big.submit(captions, labels, 60).values == service.score(captions, labels).values
    assert spy.calls[0] == 10
    off = DynamicBatcher(service.score, max_batch_size=0, max_wait=120, workers=1)
    spy.calls.clear()
    with ThreadPoolExecutor(3) as ex:
        list(ex.map(lambda _: off.submit(captions[:2], labels[:2], 60), range(3)))
    assert spy.calls == [2, 2, 2]  # never merged, and never waiting for max_wait
    assert big.close(10) and off.close(10)


def test_a_sample_that_breaks_the_reward_only_affects_itself(reward, media):
    spy = SpyReward(reward)
    service = RewardService(spy, fallback=-1, media_root=str(media))
    batcher = DynamicBatcher(service.score, max_batch_size=6, max_wait=120, workers=1)
    first = {"query": ["a dog runs", "BOOM", "two people dance"], "labels": [{"image": "i0.png"}] * 3}
    second = {"query": ["a dog runs", "two people dance", "a red car on a road"], "labels": [{"image": "i2.png"}] * 3}
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(lambda p: service.respond(batcher.submit(*service.parse(p), 60)), p) for p in (first, second)]
        a, b = (f.result(timeout=300) for f in futures)
    assert a["rewards"][1] == -1 and a["errors"][1] == "RuntimeError: the reward broke on BOOM"
    spy_free = RewardService(reward, fallback=-1, media_root=str(media))
    assert a["rewards"][0::2] == pytest.approx(spy_free.handle({"query": first["query"][0::2],
                                                                "labels": first["labels"][0::2]})["rewards"], abs=1e-6)
    assert b["rewards"] == pytest.approx(spy_free.handle(second)["rewards"], abs=1e-6)
    assert b["errors"] == [None, None, None]
    assert batcher.close(10)


def test_a_request_does_not_wait_for_an_unrelated_slow_batch(reward, media):
    """Two workers: while one is held inside a slow scoring call, another request is scored by the
    other worker and answered; with one worker it waits and, past its queue timeout, gets Busy."""
    spy = SpyReward(reward, gated=True)
    service = RewardService(spy, media_root=str(media))
    captions, labels = service.parse({"query": ["a dog runs"], "labels": [{"image": "i0.png"}]})
    for workers in (2, 1):
        spy.gate.clear()
        spy.entered.clear()
        batcher = DynamicBatcher(service.score, max_batch_size=8, max_wait=0.005, workers=workers)
        with ThreadPoolExecutor(1) as ex:
            held = ex.submit(batcher.submit, captions, labels, 60)
            assert spy.entered.wait(60)
            if workers == 2:
                spy.entered.clear()
                second_entered = []

                def open_gate_once_the_second_call_is_in():
                    second_entered.append(spy.entered.wait(60))
                    spy.gate.set()

                other = threading.Thread(target=open_gate_once_the_second_call_is_in)
                other.start()
                result = batcher.submit(captions, labels, 60)
                other.join()
                assert second_entered == [True]  # scored while the first call was still held
                assert result.values == held.result(timeout=60).values
            else:
                with pytest.raises(Busy):
                    batcher.submit(captions, labels, 0.2)
                spy.gate.set()
                held.result(timeout=60)
        assert batcher.close(30)


def test_subprocess_server_answers_equal_scoring_alone_whatever_was_merged(tiny_clip_path, media, reward):
    """Property over rounds of 4 concurrent clients with random requests (sizes adding up to the batch
    size, so each round is exactly one merged batch): every sample's answer equals scoring it alone."""
    server = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media),
                     "--fallback", "-1", "--max-batch-size", "16", "--max-wait-ms", "120000"])
    service = RewardService(reward, fallback=-1, media_root=str(media))
    pool = sample_pool()
    rng = random.Random(7)
    try:
        for round_ in range(3):
            cuts = sorted(rng.sample(range(1, 16), 3))
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, 16])]
            requests = [[rng.choice(pool) for _ in range(k)] for k in sizes]
            payloads = [{"query": [c for c, _ in r], "labels": [lab for _, lab in r]} for r in requests]
            with ThreadPoolExecutor(4) as ex:
                answers = list(ex.map(server.post, payloads))
            for (status, body), request in zip(answers, requests):
                assert status == 200, body
                for j, (caption, label) in enumerate(request):
                    single = alone(service, caption, label, j)
                    assert body["rewards"][j] == pytest.approx(single["rewards"][0], abs=1e-6)
                    assert body["errors"][j] == single["errors"][0]
                    assert body["extra_logs"]["unscored"][j] == single["extra_logs"]["unscored"][0]
            with urllib.request.urlopen(server.url + "/health", timeout=60) as resp:
                health = json.loads(resp.read())
            assert health["batches"] == round_ + 1 and health["samples"] == 16 * (round_ + 1)
    finally:
        assert server.stop() == 0


def test_batched_http_server_in_process_matches_unbatched(reward, media):
    """The same payloads through a server with merging on and one with it off give equal answers."""
    pool = sample_pool()
    payloads = [{"query": [c for c, _ in pool[i:i + 4]], "labels": [lab for _, lab in pool[i:i + 4]]}
                for i in range(0, len(pool) - 3, 4)]
    results = []
    for batch_size in (64, 0):
        server = make_server(reward, media_root=str(media), fallback=-1,
                             limits=ServerLimits(max_batch_size=batch_size, max_wait=0.05))
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            with ThreadPoolExecutor(len(payloads)) as ex:
                results.append(list(ex.map(lambda p: post_json(server.url + "/get_reward", p), payloads)))
        finally:
            server.shutdown()
            assert server.close_gracefully(30)
            thread.join(10)
    for (s_on, on), (s_off, off) in zip(*results):
        assert s_on == s_off == 200
        assert on["rewards"] == pytest.approx(off["rewards"], abs=1e-6)
        assert on["errors"] == off["errors"] and on["extra_logs"].keys() == off["extra_logs"].keys()


def test_scoring_workers_default_to_one_with_batching_and_four_without(reward, media):
    """A merged batch already keeps every core busy, so batching scores one batch at a time unless told
    otherwise; without merging, four requests are scored at once as before."""
    assert ServerLimits().max_concurrent == 1
    assert ServerLimits(max_batch_size=0).max_concurrent == 4
    assert ServerLimits(max_concurrent=3).max_concurrent == 3
    for limits, workers in ((ServerLimits(), 1), (ServerLimits(max_batch_size=0), 4),
                            (ServerLimits(max_concurrent=2), 2)):
        server = make_server(reward, media_root=str(media), limits=limits)
        try:
            assert server.batcher.workers == workers and len(server.batcher._threads) == workers
        finally:
            server.server_close()
            server.batcher.close(10)


def test_scored_batch_slices_keep_metrics_aligned():
    from capreward.server.batching import slice_batch

    batch = ScoredBatch([1.0, None, 3.0], [None, "x", None], {"m": [0.1, float("nan"), 0.3]})
    part = slice_batch(batch, 1, 3)
    assert part.values == [None, 3.0] and part.reasons == ["x", None] and part.metrics["m"][1] == 0.3
