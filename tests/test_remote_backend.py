"""OpenAIJudge against real chat-completions server processes on 127.0.0.1.

- The ``local`` server serves the trained tiny LLaVA judge: its answers through HTTP equal
  LocalChatJudge's in-process answers (texts exactly, log-probabilities to 1e-5).
- The ``echo`` server (no model) answers "echo: <prompt>", so every answer shows which request it
  belongs to: faults (429, 500, malformed JSON, timeouts, a killed and restarted server) must lose no
  sample and misalign none. HTTP and network failures are retried by the ``openai`` client itself (its
  log says "Retrying request"); only malformed 2xx bodies are asked again by capreward.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import random
import threading
import time

import numpy as np
import pytest
from PIL import Image

from capreward.judges.protocol import ChatRequest, ChatTurn, assistant_turn, user_turn
from capreward.judges.remote import OpenAIJudge, image_data_uri, to_messages
from capreward.testing.chat_server import ChatServer

from fixtures_llava import one_torch_thread, tiny_judge, tiny_judge_path  # noqa: F401

ECHO = "echo-model"


def echo_requests(n: int, tag: str = "sample", top: int = 2) -> list[ChatRequest]:
    return [ChatRequest((user_turn(f"{tag} {i}"),), max_tokens=16, top_logprobs=top) for i in range(n)]


def assert_echoed(responses, n: int, tag: str = "sample") -> None:
    assert len(responses) == n
    for i, r in enumerate(responses):
        assert r.error is None, (i, r.error)
        assert r.text == f"echo: {tag} {i}", (i, r.text)
        assert [t.token for t in r.tokens] == ["echo:", f" {tag}", f" {i}"]


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    with ChatServer("echo", model=ECHO, log_path=tmp_path_factory.mktemp("echo") / "server.log") as server:
        yield server


@pytest.fixture()
def echo(echo_server):
    """The shared echo server with no faults pending, no request in flight (abandoned slow answers of an
    earlier test finish first) and fresh counters to compare against."""
    deadline = time.monotonic() + 10
    while echo_server.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    echo_server.control(reset=True)
    yield echo_server
    echo_server.control(reset=True)


def fast_judge(server, **kwargs) -> OpenAIJudge:
    options = dict(max_retries=4, timeout=5.0, max_concurrency=4)
    options.update(kwargs)
    return OpenAIJudge(server.base_url, ECHO, api_key_env=None, **options)


# ------------------------------------------------------------------------------------- messages
def test_messages_put_png_data_uris_before_the_text():
    pixels = np.random.default_rng(0).integers(0, 256, size=(7, 5, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    messages = to_messages((user_turn("rate it", [image]), assistant_turn("0.5"), user_turn("why?")), system="be fair")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    parts = messages[1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"] and parts[1]["text"] == "rate it"
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and url == image_data_uri(image)
    decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    assert np.array_equal(decoded, pixels)  # lossless
    assert messages[2] == {"role": "assistant", "content": "0.5"} and messages[3] == {"role": "user", "content": "why?"}
    with pytest.raises(ValueError, match="role"):
        to_messages((ChatTurn("tool", "x"),))


# ------------------------------------------------------------------------- equality with local
@pytest.fixture(scope="module")
def local_server(tiny_judge_path, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("local") / "server.log"
    with ChatServer("local", judge_dir=tiny_judge_path, model="tiny-judge", log_path=log) as server:
        yield server


def judge_requests():
    from capreward.judges.prompts import FLEUR_EXPLAIN_PROMPT, fleur_prompt
    from capreward.testing import FLEUR_PROBES, fleur_task_image

    out = []
    for k, (colour, caption) in FLEUR_PROBES.items():
        image = fleur_task_image(colour, random.Random(k))
        out.append(ChatRequest((user_turn(fleur_prompt(caption), [image]),), max_tokens=10, top_logprobs=5))
    image = fleur_task_image("green", random.Random(1))
    out.append(ChatRequest((user_turn(fleur_prompt("a green ball", ["a green kite"]), [image]),), max_tokens=10, top_logprobs=20))
    explain = (user_turn(fleur_prompt("a blue kite"), [image]), assistant_turn("0.3"), user_turn(FLEUR_EXPLAIN_PROMPT))
    out.append(ChatRequest(explain, max_tokens=4, top_logprobs=3))  # multi-turn, cut at max_tokens
    out.append(ChatRequest(explain, max_tokens=30, stop=(" and",)))  # stop string, no logprobs
    out.append(ChatRequest((user_turn("two images", [image, image]),), max_tokens=4))  # invalid for LLaVA-1.5
    return out


def test_server_answers_equal_the_local_backend(local_server, tiny_judge):  # noqa: F811
    from capreward.judges.local_chat import LocalChatJudge

    requests = judge_requests()
    local = LocalChatJudge(tiny_judge, batch_size=1).generate(requests)
    remote = OpenAIJudge(local_server.base_url, "tiny-judge", api_key_env=None, timeout=60, max_concurrency=4).generate(requests)
    assert len(remote) == len(requests)
    for i, (a, b) in enumerate(zip(local, remote)):
        if a.error is not None:  # the server refuses it with 400: an error, not retried
            assert b.error is not None and "HTTP 400" in b.error and "exactly one image" in b.error
            continue
        assert b.error is None, (i, b.error)
        assert b.text == a.text and b.finish_reason == a.finish_reason, i
        assert [t.token for t in b.tokens] == ([t.token for t in a.tokens] if requests[i].top_logprobs else [])
        for ta, tb in zip(a.tokens, b.tokens):
            assert tb.logprob == pytest.approx(ta.logprob, abs=1e-5)
            assert set(tb.top) == set(ta.top)
            for key, value in ta.top.items():
                assert tb.top[key] == pytest.approx(value, abs=1e-5)
    assert remote[1].text == "0.85" and len(remote[6].tokens[0].top) > 5
    assert remote[7].finish_reason == "length" and len(remote[7].tokens) == 4
    assert remote[8].finish_reason == "stop" and remote[8].text == "the image is green"


# ---------------------------------------------------------------------------------------- faults
def test_429_500_and_malformed_json_lose_no_sample(echo, caplog):
    echo.control(status=429, count=3)
    echo.control(status=500, count=3)
    echo.control(malformed=3)
    echo.control(status=503, count=2)
    echo.control(jitter=0.03)  # answers finish out of order
    with caplog.at_level(logging.INFO):
        responses = fast_judge(echo).generate(echo_requests(30))
    assert_echoed(responses, 30)
    stats = echo.stats()
    assert stats["faults"] == 11 and stats["answered"] == 30 and stats["chat_requests"] == 41
    # the 8 HTTP faults were retried by the openai client, the 3 malformed bodies asked again here
    sdk = [r for r in caplog.records if r.name.startswith("openai") and "Retrying request" in r.getMessage()]
    ours = [r for r in caplog.records if r.name == "capreward.judges.remote" and "malformed response" in r.getMessage()]
    assert len(sdk) == 8 and len(ours) == 3


def test_timeouts_are_retried(echo):
    echo.control(delay=2.0, count=2)
    start = time.monotonic()
    responses = fast_judge(echo, timeout=0.5).generate(echo_requests(6))
    assert_echoed(responses, 6)
    assert time.monotonic() - start < 2.0  # the slow answers were abandoned, not waited for
    assert echo.stats()["faults"] == 2


def test_a_request_that_keeps_failing_gets_an_error_in_its_own_slot(echo):
    requests = echo_requests(6)
    echo.control(status=500, count=3)
    judge = fast_judge(echo, max_retries=2, max_concurrency=1)  # one at a time: request 0 gets all three
    responses = judge.generate(requests)
    assert responses[0].error is not None and not responses[0].ok
    assert "request 0 failed after 3 attempts: HTTP 500" in responses[0].error and responses[0].text == ""
    for i in range(1, 6):
        assert responses[i].text == f"echo: sample {i}"
    assert echo.stats()["chat_requests"] == 3 + 5


def test_retry_after_is_honoured(echo):
    echo.control(status=429, count=1, retry_after=1.5)
    start = time.monotonic()
    responses = fast_judge(echo).generate(echo_requests(1))
    assert_echoed(responses, 1)
    assert time.monotonic() - start >= 1.5  # the server's wait, not the client's first backoff (at most 0.5 s)
    assert echo.stats()["faults"] == 1


def test_retries_are_the_openai_clients(echo, caplog):
    """max_retries is the openai client's: no HTTP retry loop of capreward's own runs beside it (0 retries:
    one request; 2 retries: three, each logged by the client), and the client's backoff replaces
    capreward's former backoff options."""
    echo.control(status=429, count=1)
    (once,) = fast_judge(echo, max_retries=0).generate(echo_requests(1))
    assert "HTTP 429" in once.error and echo.stats()["chat_requests"] == 1
    echo.control(reset=True)
    echo.control(status=500, count=2)
    with caplog.at_level(logging.INFO, logger="openai"):
        assert_echoed(fast_judge(echo, max_retries=2).generate(echo_requests(1)), 1)
    assert echo.stats()["chat_requests"] == 3
    assert sum(r.name.startswith("openai") and "Retrying request" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(TypeError):
        OpenAIJudge(echo.base_url, ECHO, backoff=0.1)  # noqa: the client's backoff is the one used


def test_client_errors_are_not_retried(echo):
    judge = OpenAIJudge(echo.base_url, "no-such-model", api_key_env=None, max_retries=4)
    responses = judge.generate(echo_requests(3))
    assert all("HTTP 404" in r.error and "no-such-model" in r.error for r in responses)
    assert [r.error.split(" failed")[0] for r in responses] == ["request 0", "request 1", "request 2"]
    assert echo.stats()["chat_requests"] == 3


def test_top_logprobs_are_capped_at_20(echo):
    responses = fast_judge(echo).generate(echo_requests(2, top=50))  # the server refuses more than 20
    assert_echoed(responses, 2)
    assert all(len(t.top) == 20 for r in responses for t in r.tokens)


def test_concurrency_is_bounded(echo):
    echo.control(latency=0.05)
    responses = fast_judge(echo, max_concurrency=3).generate(echo_requests(24))
    assert_echoed(responses, 24)
    assert 2 <= echo.stats()["max_in_flight"] <= 3


def test_server_killed_and_restarted_mid_run(tmp_path):
    n = 40
    with ChatServer("echo", model=ECHO, faults=[{"latency": 0.05}], log_path=tmp_path / "server.log") as server:
        judge = fast_judge(server, max_retries=10, timeout=3.0)
        out = {}
        worker = threading.Thread(target=lambda: out.update(responses=judge.generate(echo_requests(n))))
        worker.start()
        deadline = time.monotonic() + 30
        while server.stats()["answered"] < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        before = server.stats()["answered"]
        server.kill()
        time.sleep(0.5)  # the client sees refused connections meanwhile
        server.start()
        worker.join(60)
        assert not worker.is_alive()
        after = server.stats()["answered"]
    assert 8 <= before < n and after > 0  # killed mid-run; the restarted process answered the rest
    assert_echoed(out["responses"], n)


def test_generate_works_inside_a_running_event_loop(echo):
    judge = fast_judge(echo)

    async def inside():
        sync = judge.generate(echo_requests(5))  # called from a coroutine: runs on a worker thread
        concurrent = await judge.agenerate(echo_requests(5))
        return sync, concurrent

    sync, concurrent = asyncio.run(inside())
    assert_echoed(sync, 5)
    assert_echoed(concurrent, 5)
    assert judge.generate([]) == []


def test_api_key_is_sent_and_never_logged_or_shown(tmp_path, monkeypatch, caplog):
    secret = "sk-test-0123456789abcdef-SECRET"
    monkeypatch.setenv("CAPREWARD_TEST_KEY", secret)
    with ChatServer("echo", model=ECHO, api_key=secret, log_path=tmp_path / "server.log") as server:
        judge = OpenAIJudge(server.base_url, ECHO, api_key_env="CAPREWARD_TEST_KEY", max_retries=2)
        server.control(status=429, count=2)
        with caplog.at_level(logging.DEBUG):
            good = judge.generate(echo_requests(3))
            assert_echoed(good, 3)  # the key was sent: the server requires it

            wrong = "sk-wrong-key-that-the-server-echoes"
            monkeypatch.setenv("CAPREWARD_TEST_KEY", wrong)
            failing = judge.generate(echo_requests(2))
    assert all(r.error is not None for r in failing)
    assert any("HTTP 401" in r.error and "***" in r.error for r in failing)  # the server echoed it; masked
    shown = caplog.text + repr(judge) + str(judge.__dict__) + "".join(r.error for r in failing)
    assert secret not in shown and wrong not in shown
    assert "Retrying request" in caplog.text  # the client's retries were logged, without the key


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAIJudge("http://127.0.0.1:1/v1", "m", max_concurrency=0)
    with pytest.raises(ValueError, match="token_limit_param"):
        OpenAIJudge("http://127.0.0.1:1/v1", "m", token_limit_param="tokens")
    bad = OpenAIJudge("http://127.0.0.1:1/v1", "m", api_key_env=None, max_retries=0)
    (response,) = bad.generate([ChatRequest((user_turn("x"),), max_tokens=0)])
    assert response.error.startswith("invalid request: max_tokens must be positive")


def test_structured_outputs_keep_a_request_hashable_and_reach_the_server_as_plain_json(echo):
    """A request's ``structured_outputs`` (a dict, nested JSON schema included) is frozen: requests hash
    and compare by content (one cache entry for equal constraints, two for different ones), the dict the
    caller passed is not aliased, and the server receives the constraint as the plain JSON given."""
    schema = {"type": "object", "properties": {"score": {"type": "integer", "enum": [1, 2, 3]}}, "required": ["score"]}
    given = {"json": schema}

    def make(constraint):
        return ChatRequest((user_turn("sample 0"),), max_tokens=16, top_logprobs=2, structured_outputs=constraint)

    a, b, c = make(given), make({"json": {**schema}}), make({"regex": "[0-9]+"})
    assert hash(a) == hash(b) and a == b and a != c
    cache = {a: "first", c: "other"}
    cache[b] = "again"
    assert len(cache) == 2 and cache[a] == "again"
    given["json"]["required"].append("reason")  # the caller's dict changes later: the request does not
    assert a.structured_outputs["json"]["required"] == ("score",)
    with pytest.raises(TypeError):
        a.structured_outputs["regex"] = "x"  # read-only
    with pytest.raises(TypeError, match="structured_outputs must be a mapping"):
        make("[0-9]+")
    assert_echoed(fast_judge(echo).generate([a]), 1)
    sent = echo.requests()[-1]
    assert sent["structured_outputs"] == {"json": {**schema, "required": ["score"]}}


# ------------------------------------------------------------------------------------- the memo
def test_a_memo_server_answers_a_repeated_body_as_it_did_and_never_past_a_fault_or_a_key(tmp_path):
    """``ChatServer(memo=True)`` (the red team's: its reward targets send again what their scorer targets
    sent): the second identical body is answered from the first answer (counted as a request and as a memo
    hit), another body by the backend; while a fault is pending the body meets the fault, not the memo; and
    a memo server never answers in place of an API-key check (it refuses to start with a key)."""
    import json
    import urllib.error
    import urllib.request

    def post(server, body):
        request = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    body = {"model": ECHO, "messages": [{"role": "user", "content": "a red square"}], "max_tokens": 8,
            "temperature": 0.0, "logprobs": True, "top_logprobs": 2}
    other = dict(body, messages=[{"role": "user", "content": "a blue circle"}])
    with ChatServer("echo", model=ECHO, memo=True, log_path=tmp_path / "server.log") as server:
        first = post(server, body)
        assert first[0] == 200 and first[1]["choices"][0]["message"]["content"] == "echo: a red square"
        assert server.stats()["memo_hits"] == 0
        assert post(server, body) == first
        assert post(server, other)[1]["choices"][0]["message"]["content"] == "echo: a blue circle"
        stats = server.stats()
        assert (stats["memo_hits"], stats["chat_requests"], stats["answered"]) == (1, 3, 3)
        server.control(status=500, count=1)
        assert post(server, body)[0] == 500  # the fault, not the remembered answer
        assert post(server, body) == first and server.stats()["memo_hits"] == 2
    with pytest.raises(RuntimeError, match="exited"):
        ChatServer("echo", model=ECHO, memo=True, api_key="k", log_path=tmp_path / "keyed.log").start()
    assert "not with --api-key" in (tmp_path / "keyed.log").read_text()
