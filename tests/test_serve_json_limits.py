"""JSON limits of the reward server: numbers out of range (a JSON integer of any length, which Python
refuses past 4300 digits with a bare ValueError that used to drop the connection unanswered), nesting,
string and array sizes each get 400 naming the field, from a real ``capreward serve`` process and the
in-process service; the server keeps serving on the same connection afterwards."""

from __future__ import annotations

import json
import re

import pytest
from PIL import Image

from capreward.server import RewardService
from capreward.json_limits import JSONLimitError, JSONLimits, check, loads, path_past_depth
from capreward.server.http import RequestError, ServerLimits
from capreward.rewards import CLIPScoreReward

from conftest import random_video
from serve_process import Server, read_answer

CAPTION = "two people dance"
HUGE = "9" * 5000  # past Python's 4300-digit limit for int()


# ------------------------------------------------------------------------------- the limits alone
@pytest.mark.parametrize("text, where", [
    ('{"labels": [{"visual_id": %s}]}' % HUGE, r"labels\[0\]\.visual_id is an integer of 5000 digits, out of range"),
    ('{"a": [1, {"b c": -%s}]}' % HUGE, r'a\[1\]\["b c"\] is an integer of 5000 digits'),
    ('{"x": 9223372036854775808}', r"x is an integer of 19 digits, out of range"),
    ('{"x": 1e999}', r"x is the number 1e999, out of range"),
    ('{"x": -1.5e400}', r"x is the number -1.5e400, out of range"),
    ('{"deep": ' + "[" * 9 + "]" * 9 + "}", r"deep\[0\]\[0\]\[0\]\[0\]\[0\]\.\.\. is nested too deeply \(more than 8"),
    ('{"q": ["ok", "' + "a" * 101 + '"]}', r"q\[1\] is a string of 101 characters, over the limit of 100"),
    ('{"refs": [' + ",".join(['"r"'] * 11) + "]}", r"refs has 11 entries, over the limit of 10"),
    ('{"' + "k" * 101 + '": 1}', r"the body has a key of 101 characters, over the limit of 100"),
])
def test_each_limit_names_the_field(text, where):
    with pytest.raises(JSONLimitError) as exc:
        loads(text.encode(), JSONLimits(max_depth=8, max_string_chars=100, max_array_length=10))
    assert re.fullmatch(where + r".*", str(exc.value)), str(exc.value)


def test_values_within_the_limits_decode_as_json_does():
    text = '{"a": [9223372036854775807, -9223372036854775808, 1.5e300, "x", null, true, NaN], "b": {"c": [[]]}}'
    value = loads(text, JSONLimits(max_depth=4, max_string_chars=1, max_array_length=7))
    reference = json.loads(text)
    assert value["a"][:6] == reference["a"][:6] and value["b"] == reference["b"]


def test_nesting_past_the_decoder_is_found_from_the_brackets():
    deep = '{"query": ["a]", "b\\"["], "labels": [{"references": ' + "[" * 100_000 + "]" * 100_000 + "}]}"
    with pytest.raises(JSONLimitError, match=r"^labels\[0\]\.references\[0\]\[0\]\[0\]\.\.\. is nested too deeply"):
        loads(deep)
    assert path_past_depth('{"a": [1, {"b": [[[]]]}]}', 4) == "a[1].b[0]"
    assert path_past_depth('{"a": "[[[[[[", "b": []}', 2) is None  # brackets in strings do not count


def test_a_label_string_is_decoded_within_the_limits():
    from capreward.adapters import LabelError, parse_label

    with pytest.raises(LabelError, match=r"^labels\[3\]\.visual_id is an integer of 5000 digits, out of range"):
        parse_label('{"image": "x.png", "visual_id": %s}' % HUGE, "labels[3]")
    with pytest.raises(LabelError, match=r"^labels\[3\]\[0\]\[0\]\[0\]\[0\]\.\.\. is nested too deeply"):
        parse_label("[" * 5000 + "]" * 5000, "labels[3]")
    assert parse_label('{"image": "x.png", "visual_id": 12}', "labels[3]").visual_id == "12"


def test_python_payloads_are_checked_too():
    with pytest.raises(JSONLimitError, match=r"labels\[1\]\.visual_id is an integer of \d+ bits, out of range"):
        check({"labels": [{}, {"visual_id": 10**5000}]})
    check({"labels": [{"visual_id": 2**63 - 1, "ok": True}]})


# ------------------------------------------------------------------------------- through the server
@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("json_media")
    Image.fromarray(random_video(61, frames=1)[0]).save(root / "i0.png")
    return root


@pytest.fixture(scope="module")
def server(tiny_clip_path, media):
    srv = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media),
                  "--max-items", "16", "--max-json-depth", "8", "--max-string-chars", "1000"])
    yield srv
    assert srv.stop() == 0


def good(caption: str = CAPTION) -> str:
    return json.dumps({"query": [caption], "labels": [{"image": "i0.png"}]})


def exchange(sock, body: bytes) -> tuple[int, dict]:
    """One keep-alive POST on ``sock``; (status, decoded answer)."""
    sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    status, _, answer = read_answer(sock)
    return status, answer


BAD = [
    ('{"query": ["%s"], "labels": [{"image": "i0.png", "visual_id": %s}]}' % (CAPTION, HUGE),
     r"labels\[0\]\.visual_id is an integer of 5000 digits, out of range"),
    ('{"query": ["%s"], "labels": ["{\\"image\\": \\"i0.png\\", \\"visual_id\\": -%s}"]}' % (CAPTION, "9" * 900),
     r"labels\[0\]\.visual_id is an integer of 900 digits, out of range"),  # the string itself within 1000 chars
    ('{"query": ["%s"], "labels": [{"image": "i0.png"}], "step": %s}' % (CAPTION, HUGE),
     r"step is an integer of 5000 digits"),
    ('{"query": ["%s"], "prompts": [1e999], "labels": [{"image": "i0.png"}]}' % CAPTION,
     r"prompts\[0\] is the number 1e999, out of range"),
    ('{"query": ["%s"], "labels": [{"image": "i0.png", "references": %s}]}' % (CAPTION, "[" * 9 + "]" * 9),
     r"labels\[0\]\.references\[0\]\[0\]\[0\]\.\.\. is nested too deeply \(more than 8 levels\)"),
    ('{"query": ["%s"], "labels": [%s{"image": "i0.png"}%s]}' % (CAPTION, "[" * 50_000, "]" * 50_000),
     r"labels\[0\]\[0\]\[0\]\[0\]\[0\]\.\.\. is nested too deeply \(more than 8 levels\)"),
    ('{"query": ["%s", "%s"], "labels": [{"image": "i0.png"}, {"image": "i0.png"}]}' % (CAPTION, "a" * 1001),
     r"query\[1\] is a string of 1001 characters, over the limit of 1000"),
    ('{"query": ["%s"], "labels": [{"image": "i0.png", "references": [%s]}]}' % (CAPTION, ",".join(['"r"'] * 17)),
     r"labels\[0\]\.references has 17 entries, over the limit of 16"),
]


@pytest.mark.parametrize("body, error", BAD, ids=["int", "int in a label string", "int in another key", "1e999",
                                                   "depth", "depth past the decoder", "string", "array"])
def test_the_server_answers_400_naming_the_field_and_keeps_the_connection(server, body, error):
    with server.connect(120, "127.0.0.2") as sock:
        status, answer = exchange(sock, body.encode())
        assert status == 400 and re.search(error, answer["error"]), answer
        status, answer = exchange(sock, good().encode())  # the same connection goes on
        assert status == 200 and answer["errors"] == [None]


def test_the_in_process_service_names_the_field(tiny_clip_path, media):
    service = RewardService(CLIPScoreReward(model=str(tiny_clip_path)), media_root=str(media),
                            limits=ServerLimits(max_items=4, max_json_depth=6))
    with pytest.raises(RequestError) as exc:
        service.parse(service.decode(BAD[0][0].encode()))
    assert exc.value.status == 400 and re.search(BAD[0][1], exc.value.message)
    with pytest.raises(RequestError, match=r"labels\[0\]\.references has 5 entries, over the limit of 4"):
        service.handle({"query": [CAPTION], "labels": [{"image": "i0.png", "references": ["r"] * 5}]})
