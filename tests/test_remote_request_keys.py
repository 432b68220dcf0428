"""Requests that carry images are hashable by their pixels: equal requests (different image objects, the
same pixels) are sent once per call and, with ``cache_size``, answered from a cache in a later call; the
key is the request's structure (a tuple of fields), so no caption text can make two requests share it.

Checked against a real chat-completions server process on 127.0.0.1 (the echo server), counting what it
received."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from capreward.judges import ChatRequest, OpenAIJudge, user_turn
from capreward.judges.protocol import assistant_turn
from capreward.media.limits import media_limits
from capreward.testing.chat_server import ChatServer

ECHO = "echo-model"


def picture(seed: int, size=(6, 5)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def request(text: str, image: Image.Image | None, temperature: float = 0.0) -> ChatRequest:
    return ChatRequest((user_turn(text, [image] if image is not None else []),), max_tokens=8, temperature=temperature)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ChatServer("echo", model=ECHO, log_path=tmp_path_factory.mktemp("echo") / "server.log") as s:
        yield s


@pytest.fixture()
def echo(server):
    server.control(reset=True)
    yield server
    server.control(reset=True)


def judge(server, **kwargs) -> OpenAIJudge:
    return OpenAIJudge(server.base_url, ECHO, api_key_env=None, max_retries=0, timeout=10.0, **kwargs)


def sent_texts(server) -> list[str]:
    return [m["content"][-1]["text"] if isinstance(m["content"], list) else m["content"]
            for body in server.requests() for m in body["messages"][-1:]]


def test_requests_hash_and_compare_by_pixels_not_by_object():
    a, a_copy, b = picture(0), picture(0), picture(1)
    assert a is not a_copy
    assert request("x", a) == request("x", a_copy) and hash(request("x", a)) == hash(request("x", a_copy))
    assert request("x", a) != request("x", b)
    assert request("x", a) != request("x", a.convert("L").convert("RGB"))
    assert request("x", a) != request("y", a)
    assert request("x", a) != request("x", a, temperature=1.0)
    assert request("x", a).content_key == request("x", a_copy).content_key is not None
    # structure, not text joined: moving text across turns or fields never gives an equal request
    one = ChatRequest((user_turn("a b", [a]), assistant_turn("c"), user_turn("d")))
    two = ChatRequest((user_turn("a", [a]), assistant_turn("b c"), user_turn("d")))
    assert one != two and one.content_key != two.content_key
    # a caption that spells an image's key is text, not that image
    key_text = repr(request("x", a).turns[0].content_key[4])
    assert request(key_text, None) != request("", a) and request(key_text, None).content_key != request("", a).content_key
    # videos: frames by pixels, and a video is never the same as its frames as images
    video = ChatRequest((user_turn("v", videos=[[a, b]]),))
    assert video == ChatRequest((user_turn("v", videos=[[a_copy, picture(1)]]),))
    assert video != ChatRequest((user_turn("v", [a, b]),))
    assert video.visual_kind == "video" and request("x", a).visual_kind == "image" and request("x", None).visual_kind is None


def test_an_image_without_a_content_key_hashes_by_identity_and_is_never_cached():
    big = picture(2, size=(40, 40))
    with media_limits(max_pixels=100):
        r1, r2 = request("x", big), request("x", big.copy())
        assert hash(r1) == hash(r1) and r1 == r1 and r1 != r2
        assert r1.content_key is None


def test_equal_greedy_requests_are_sent_once_and_every_copy_gets_the_answer(echo):
    a, a_copy, b = picture(0), picture(0), picture(1)
    requests = [request("q 0", a), request("q 1", b), request("q 0", a_copy), request("q 1", b), request("q 2", a)]
    answers = judge(echo).generate(requests)
    assert [r.text for r in answers] == ["echo: q 0", "echo: q 1", "echo: q 0", "echo: q 1", "echo: q 2"]
    assert all(r.ok for r in answers)
    assert sorted(sent_texts(echo)) == ["q 0", "q 1", "q 2"]
    # the image each server request carried is its own (the PNG of those pixels)
    images = {m["content"][-1]["text"]: m["content"][0]["image_url"]["url"]
              for body in echo.requests() for m in body["messages"]}
    assert images["q 0"] == images["q 2"] != images["q 1"]


def test_sampled_requests_are_each_sent(echo):
    a = picture(0)
    answers = judge(echo).generate([request("s", a, temperature=1.0), request("s", picture(0), temperature=1.0)])
    assert all(r.ok for r in answers) and sent_texts(echo) == ["s", "s"]


def test_the_cache_answers_a_repeat_in_a_later_call_and_never_keeps_a_failure(echo):
    cached = judge(echo, cache_size=2)
    first = cached.generate([request("c 0", picture(0)), request("c 1", picture(1))])
    again = cached.generate([request("c 1", picture(1)), request("c 0", picture(0))])
    assert [r.text for r in again] == ["echo: c 1", "echo: c 0"] and [r.text for r in first] == ["echo: c 0", "echo: c 1"]
    assert sorted(sent_texts(echo)) == ["c 0", "c 1"]
    cached.generate([request("c 2", picture(2))])  # evicts the least recently used ("c 1")
    cached.generate([request("c 0", picture(0)), request("c 1", picture(1))])
    assert sorted(sent_texts(echo)) == ["c 0", "c 1", "c 1", "c 2"]
    # no cache: sent every time
    plain = judge(echo)
    plain.generate([request("c 0", picture(0))])
    assert sent_texts(echo).count("c 0") == 2
    # a failed answer is not cached: the next call asks again
    echo.control(status=400, count=1)
    fresh = judge(echo, cache_size=4)
    (failed,) = fresh.generate([request("f", picture(3))])
    assert not failed.ok
    (ok,) = fresh.generate([request("f", picture(3))])
    assert ok.ok and ok.text == "echo: f"
    # sampled requests are never answered from the cache
    fresh.generate([request("t", picture(0), temperature=1.0)])
    fresh.generate([request("t", picture(0), temperature=1.0)])
    assert sent_texts(echo).count("t") == 2
    with pytest.raises(ValueError, match="cache_size"):
        judge(echo, cache_size=-1)


def test_a_remote_judge_refuses_video_frames_by_name(echo):
    (answer,) = judge(echo).generate([ChatRequest((user_turn("v", videos=[[picture(0), picture(1)]]),))])
    assert not answer.ok and "takes images, not video frames" in answer.error
    assert sent_texts(echo) == []
