"""``capreward serve`` as a real subprocess on 127.0.0.1: OpenRLHF's /get_reward protocol, values equal
to the rewards called directly, 400s naming the bad item, fallback for unscorable samples, request
bounds (413/503) and a clean shutdown on SIGTERM."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from capreward.server.http import END_MARKERS, ServerLimits, completion_of, make_server, post_json
from capreward.adapters.paths import REFUSED
from capreward.rewards import CLIPScoreReward, EMScoreReward

from conftest import random_video, write_mp4
from serve_process import Server

CAPTIONS = ["a man is cooking food in a kitchen", "a dog runs across the grass", "two people dance on a stage"]
REFS = [["a person cooks dinner", "a chef prepares a meal"], ["a dog playing outside"], ["people dance"]]
PROMPT = "<|user|> <image> Describe the picture in one sentence. <|assistant|> "


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve_media")
    for i in range(2):
        write_mp4(root / f"v{i}.mp4", random_video(60 + i, frames=12))
        Image.fromarray(random_video(70 + i, frames=1)[0]).save(root / f"i{i}.png")
    return root


def query(caption: str, end: str = "") -> str:
    return PROMPT + caption + end


@pytest.fixture(scope="module")
def clip_server(tiny_clip_path, media):
    server = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media),
                     "--max-body-bytes", "20000", "--max-items", "16", "--fallback", "-1"])
    yield server
    # an idle keep-alive connection must not hold the shutdown up
    host, port = server.url.removeprefix("http://").split(":")
    idle = socket.create_connection((host, int(port)), timeout=10)
    start = time.monotonic()
    assert server.stop() == 0
    idle.close()
    assert time.monotonic() - start < 30
    assert any("stopped" in line for line in server.lines)


@pytest.fixture(scope="module")
def em_server(tiny_clip_path, media, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("idf") / "corpus.txt"
    corpus.write_text("\n".join(r for rs in REFS for r in rs) + "\n")
    server = Server(["--reward", "emscore", "--clip-model", str(tiny_clip_path), "--idf", str(corpus),
                     "--media-root", str(media)])
    yield server, corpus
    assert server.stop() == 0


def test_health(clip_server):
    with urllib.request.urlopen(clip_server.url + "/health", timeout=30) as resp:
        health = json.loads(resp.read())
    assert health["status"] == "ok" and health["reward"] == "clip_s"
    assert isinstance(health["batches"], int) and isinstance(health["samples"], int)


def test_clip_s_rewards_equal_the_reward_called_directly(clip_server, tiny_clip_path, media):
    labels = [
        json.dumps({"image": "i0.png", "references": REFS[0]}),  # JSON string, relative to --media-root
        {"image": str(media / "i1.png"), "references": REFS[1]},  # object, absolute path
        json.dumps({"image": "i1.png"}),  # no references: CLIP-S
    ]
    status, body = clip_server.post({
        "query": [query(CAPTIONS[0], "</s>"), query(CAPTIONS[1], "<|im_end|>"), query(CAPTIONS[2])],
        "prompts": [PROMPT] * 3,
        "labels": labels,
    })
    assert status == 200, body
    reward = CLIPScoreReward(model=str(tiny_clip_path))
    with_refs = reward(None, CAPTIONS[:2], image=[str(media / "i0.png"), str(media / "i1.png")], references=REFS[:2])
    plain = reward(None, CAPTIONS[2:], image=[str(media / "i1.png")])
    assert body["rewards"] == pytest.approx(with_refs + plain, abs=1e-6)
    assert body["scores"] == body["rewards"]
    assert body["errors"] == [None, None, None]
    assert body["extra_logs"]["unscored"] == [0.0, 0.0, 0.0]
    assert len(body["extra_logs"]["clip_s"]) == 3


def test_emscore_video_rewards_equal_the_reward_called_directly(em_server, tiny_clip_path, media):
    server, corpus = em_server
    videos = [str(media / "v0.mp4"), str(media / "v1.mp4"), str(media / "v0.mp4")]
    labels = [{"video": v, "references": r, "visual_id": Path(v).stem} for v, r in zip(videos, REFS)]
    status, body = server.post({"query": [query(c) for c in CAPTIONS], "prompts": [PROMPT] * 3, "labels": labels})
    assert status == 200, body
    reward = EMScoreReward(model=str(tiny_clip_path), idf=corpus.read_text().split("\n")[:-1])
    direct = reward(None, CAPTIONS, video=videos, references=REFS)
    assert body["rewards"] == pytest.approx(direct, abs=1e-6)
    assert {"video/fine_p", "reference/full_f", "unscored"} <= set(body["extra_logs"])


def test_concurrent_requests_all_answer_consistently(em_server, media):
    server, _ = em_server
    payload = {"query": [query(c) for c in CAPTIONS], "prompts": [PROMPT] * 3,
               "labels": [{"video": str(media / "v1.mp4")}] * 3}
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: server.post(payload), range(6)))
    assert all(status == 200 for status, _ in results)
    first = results[0][1]["rewards"]
    for _, body in results[1:]:
        assert body["rewards"] == pytest.approx(first, abs=1e-6)


def test_unscorable_samples_get_the_fallback_with_a_reason(clip_server, media, tiny_clip_path):
    status, body = clip_server.post({
        "query": [query(CAPTIONS[0]), query(""), query(CAPTIONS[2])],
        "prompts": [PROMPT] * 3,
        "labels": [{"image": "missing.png"}, {"image": "i0.png"}, {"image": "i0.png"}],
    })
    assert status == 200, body
    assert body["rewards"][:2] == [-1.0, -1.0]
    assert body["errors"][0] == f"image: {REFUSED}"  # a missing file reads like any refused path
    assert "empty" in body["errors"][1]
    assert body["errors"][2] is None
    direct = CLIPScoreReward(model=str(tiny_clip_path))(None, [CAPTIONS[2]], image=[str(media / "i0.png")])
    assert body["rewards"][2] == pytest.approx(direct[0], abs=1e-6)
    assert body["extra_logs"]["unscored"] == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "payload, status, message",
    [
        ({"query": [query("a dog")], "labels": ["{not json"]}, 400, r"labels\[0\] is not valid JSON"),
        ({"query": [query("a"), query("b")], "labels": [{"image": "i0.png"}, {"imag": "x"}]}, 400,
         r"labels\[1\] has unknown keys \['imag'\]"),
        ({"query": [query("a")]}, 400, "missing 'labels'"),
        ({"labels": [{"image": "i0.png"}]}, 400, "missing 'query'"),
        ({"query": [query("a")], "prompts": [PROMPT, PROMPT], "labels": [{"image": "i0.png"}]}, 400,
         "'prompts' has 2 entries for 1 queries"),
        ({"query": ["something else"], "prompts": [PROMPT], "labels": [{"image": "i0.png"}]}, 400,
         r"query\[0\]: the query does not contain its prompt"),
        ({"query": [query("a"), 5], "labels": [{"image": "i0.png"}] * 2}, 400, r"query\[1\] must be a str"),
        (["not", "an", "object"], 400, "must be a JSON object"),
        ({"query": [query("a")] * 17, "labels": [{"image": "i0.png"}] * 17}, 413, "at most 16"),
    ],
)
def test_bad_requests_are_refused_naming_the_item(clip_server, payload, status, message):
    got_status, body = clip_server.post(payload)
    assert got_status == status, body
    assert re.search(message, body["error"]), body["error"]


def test_oversized_body_gets_413_and_unknown_paths_404(clip_server):
    big = {"query": [query("x" * 30000)], "labels": [{"image": "i0.png"}]}
    status, body = clip_server.post(big)
    assert status == 413 and "exceeds the limit of 20000" in body["error"]
    status, body = clip_server.post({"query": []}, path="/score")
    assert status == 404
    status, body = clip_server.post({"query": [], "labels": []})
    assert status == 200 and body["rewards"] == []


class GatedReward:
    """A TRL-style reward that blocks inside its call until ``gate`` is set (``entered`` tells that a
    call is inside), and records the size of every call."""

    __name__ = "gated"

    def __init__(self, inner):
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[int] = []

    def __call__(self, prompts, completions, **kwargs):
        self.calls.append(len(completions))
        self.entered.set()
        assert self.gate.wait(120), "the test never opened the gate"
        return self.inner(prompts, completions, **kwargs)


def test_bounded_concurrency_503_and_graceful_close(tiny_clip_path, media):
    """In process: with the only worker held inside a slow scoring call, a request waits
    ``queue_timeout`` for its batch and is refused; graceful close waits for the running batch."""
    reward = GatedReward(CLIPScoreReward(model=str(tiny_clip_path)))
    server = make_server(reward, "127.0.0.1", 0, media_root=str(media), fallback=-1,  # a plain callable: no range
                         limits=ServerLimits(max_concurrent=1, queue_timeout=0.2))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        payload = {"query": [CAPTIONS[0]], "labels": [{"image": "i0.png"}]}
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(post_json, server.url + "/get_reward", payload)
            assert reward.entered.wait(60)
            start = time.monotonic()
            status, body = post_json(server.url + "/get_reward", payload)
            assert status == 503 and "busy" in body["error"]
            assert time.monotonic() - start >= 0.2
            server.shutdown()
            assert server.close_gracefully(timeout=0.2) is False  # the held batch is still running
            reward.gate.set()
            assert held.result(timeout=120)[0] == 200
        assert server.close_gracefully(timeout=60) is True
    finally:
        reward.gate.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_completion_extraction():
    assert completion_of(PROMPT + "a cat</s>", PROMPT, "q") == "a cat"
    assert completion_of("<pad><pad>" + PROMPT + " a cat <|im_end|></s>", PROMPT, "q") == "a cat"
    assert completion_of("a cat", None, "q") == "a cat"
    assert "</s>" in END_MARKERS
    # the response starts after the FIRST copy of the prompt: a repeat of it inside the response hides nothing
    hidden = " purple orange blue green" * 3
    for before in ("", "<s>", " ", "<pad><pad><s>"):
        assert completion_of(before + PROMPT + hidden + PROMPT + " a red image.", PROMPT, "q") == (
            (hidden + PROMPT + " a red image.").strip())


def test_a_response_that_repeats_the_prompt_is_scored_whole_round3_h1(em_server, tiny_clip_path, media):
    """Round 3, H1: ``"<s>" + P + " purple orange blue green" x60 + P + " a red image."`` was scored on
    what followed the last copy of P (the honest caption's reward), hiding everything before it."""
    tail = " a red image."
    hidden = " purple orange blue green" * 60
    queries = ["<s>" + PROMPT + hidden + PROMPT + tail, PROMPT + hidden + PROMPT + tail, "<pad><pad>" + PROMPT + tail]
    server, corpus = em_server
    status, body = server.post({"query": queries, "prompts": [PROMPT] * 3, "labels": [{"video": "v0.mp4"}] * 3})
    assert status == 200, body
    reward = EMScoreReward(model=str(tiny_clip_path), idf=corpus.read_text().split("\n")[:-1])
    video = str(media / "v0.mp4")
    whole, honest = reward(None, [(hidden + PROMPT + tail).strip(), tail.strip()], video=[video] * 2)
    assert whole != pytest.approx(honest, abs=1e-4)  # precondition: the hidden part changes the score
    assert body["rewards"] == pytest.approx([whole, whole, honest], abs=1e-6)
    assert body["errors"] == [None, None, None]


def test_a_request_without_prompts_scores_each_query_as_the_response(clip_server, tiny_clip_path, media):
    """The documented rule: no ``prompts`` -> each query is the response alone, and the server says so
    in its answer (issue 43 item 7: it said so only in its log, once, while the client got a score of
    prompt + response) and in its log (once)."""
    from capreward.server.http import NO_PROMPTS

    status, body = clip_server.post({"query": [CAPTIONS[0]] * 2, "labels": [{"image": "i0.png"}] * 2})
    assert status == 200, body
    direct = CLIPScoreReward(model=str(tiny_clip_path))(None, [CAPTIONS[0]], image=[str(media / "i0.png")])
    assert body["rewards"] == pytest.approx(direct * 2, abs=1e-6)
    assert body["warnings"] == [NO_PROMPTS] and "scored whole as the response" in NO_PROMPTS
    status, body = clip_server.post({"query": ["Describe. " + CAPTIONS[0]], "prompts": ["Describe."],
                                     "labels": [{"image": "i0.png"}]})
    assert status == 200 and "warnings" not in body and body["rewards"] == pytest.approx(direct, abs=1e-6)
    clip_server.post({"query": [CAPTIONS[1]], "labels": [{"image": "i0.png"}]})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("without 'prompts'" in line for line in clip_server.lines):
        time.sleep(0.1)
    warned = [line for line in clip_server.lines if "without 'prompts'" in line]
    assert len(warned) == 1 and "must send 'prompts'" in warned[0]


def test_composite_service_equals_the_composite_called_directly(tiny_clip_path, media):
    """The composite built by the factory (shared CLIP, default guards) through the service."""
    from capreward.adapters import RewardOptions, build_reward
    from capreward.server import RewardService
    from capreward.rewards import CompositeReward, HallucinationPenalty

    composite = build_reward("composite", RewardOptions(clip_model=str(tiny_clip_path),
                                                        composite="emscore=1.0,clip_s=0.5,hallucination=2"))
    backbones = {id(func.scorer.backbone) for _, func, _ in composite.components}
    assert len(backbones) == 1  # one CLIP for the three terms
    service = RewardService(composite, fallback=-3.0, media_root=str(media))
    captions = ["a man is cooking food in a kitchen.", "a dog a dog a dog a dog", "two people dance on a"]
    answer = service.handle({
        "query": [query(c) for c in captions], "prompts": [PROMPT] * 3,
        "labels": [{"video": "v0.mp4", "references": REFS[0]}, {"video": "v1.mp4"}, {"video": "nope.mp4"}],
    })
    path = str(tiny_clip_path)
    direct = CompositeReward([
        (EMScoreReward(model=path), 1.0), (CLIPScoreReward(model=path), 0.5), (HallucinationPenalty(model=path), 2.0),
    ])(None, captions[:2], video=[str(media / "v0.mp4"), str(media / "v1.mp4")], references=[REFS[0], None])
    assert answer["rewards"][:2] == pytest.approx(direct, abs=1e-6)
    assert answer["rewards"][2] == -3.0 and answer["errors"][2] == f"video: {REFUSED}"
    assert answer["extra_logs"]["guard/repetition"][1] < 0  # the repeated caption is penalised
    assert {"emscore", "clip_s", "hallucination"} <= set(answer["extra_logs"])


def _accept_queue_length(port: int) -> int | None:
    """Connections waiting in the kernel's accept queue of the listening socket on 127.0.0.1:``port``
    (Linux's /proc/net/tcp: rx_queue of a LISTEN entry), None where that file does not exist."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return int(fields[4].split(":")[1], 16)
    return None


def test_a_burst_of_connections_waits_in_the_backlog_and_is_served(tiny_clip_path, media):
    """40 workers connecting at once, before the server accepts any: all wait in the kernel's accept
    queue (socketserver's default backlog of 5 kept 6 and made the kernel drop the others' handshakes:
    connection resets under load), then every one is answered."""
    import socket

    server = make_server(CLIPScoreReward(model=str(tiny_clip_path)), "127.0.0.1", 0, media_root=str(media),
                         limits=ServerLimits(max_connections=64, max_connections_per_peer=64))
    port = server.server_address[1]
    clients = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    try:
        for _ in range(40):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=60))
        waiting = _accept_queue_length(port)
        if waiting is None:
            pytest.skip("no /proc/net/tcp on this system")
        assert waiting == 40
        thread.start()
        for sock in clients:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        for sock in clients:
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
    finally:
        for sock in clients:
            sock.close()
        if thread.is_alive():
            server.shutdown()
        server.server_close()
        thread.join(timeout=10)
