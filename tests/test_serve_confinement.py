"""What a reward server's clients may make it read, and what its HTTP front accepts, tested against a
real ``capreward serve`` subprocess over raw sockets on 127.0.0.1: paths outside ``--media-root``
refused with one text that reveals nothing, Content-Length and chunked bodies refused without reading
the body, stalled clients dropped, connections bounded, deeply nested JSON answered 400."""

from __future__ import annotations

import itertools
import os
import re
import select
import time
from pathlib import Path

import pytest
from PIL import Image

from capreward.adapters import make_compute_score
from capreward.server import RewardService
from capreward.adapters.paths import NO_ROOT, NOT_LOCAL, REFUSED
from capreward.rewards import CLIPScoreReward

from conftest import random_video
from serve_process import Server, read_answer

CAPTION = "two people dance"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    """root/ with images, a sub-directory, a symlink inside and one pointing out, a directory named
    like an image and a FIFO; a readable image outside the root."""
    base = tmp_path_factory.mktemp("confine")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    Image.fromarray(random_video(61, frames=1)[0]).save(root / "i0.png")
    Image.fromarray(random_video(62, frames=1)[0]).save(root / "sub" / "i1.png")
    secret = base / "secret.png"
    Image.fromarray(random_video(64, frames=1)[0]).save(secret)
    (root / "inside_link.png").symlink_to(root / "i0.png")
    (root / "out_link.png").symlink_to(secret)
    (root / "sub" / "up_link").symlink_to(base)  # a directory link leading out of the root
    (root / "dir.png").mkdir()
    os.mkfifo(root / "fifo.png")
    return {"root": root, "secret": secret}


@pytest.fixture(scope="module")
def server(tiny_clip_path, tree):
    srv = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(tree["root"]),
                  "--fallback", "-1", "--read-timeout", "2"])
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def reward(tiny_clip_path):
    return CLIPScoreReward(model=str(tiny_clip_path))


REFUSED_NAMES = [
    "/etc/passwd", "SECRET", "../secret.png", "sub/../../secret.png", "~/secret.png", "out_link.png",
    "sub/up_link/secret.png", "dir.png", "fifo.png", "missing.png", "sub", ".", "i0.png\x00.txt", "/",
]


def _name(name: str, tree) -> str:
    return str(tree["secret"]) if name == "SECRET" else name


def test_paths_outside_the_root_are_refused_with_one_text(server, tree, reward):
    names = [_name(n, tree) for n in REFUSED_NAMES]
    allowed = ["i0.png", "sub/i1.png", "sub/../i0.png", "inside_link.png", str(tree["root"] / "sub" / "i1.png")]
    labels = [{"image": n} for n in names + allowed]
    status, body = server.post({"query": [CAPTION] * len(labels), "labels": labels})
    assert status == 200, body
    n = len(names)
    assert body["rewards"][:n] == [-1.0] * n
    assert set(body["errors"][:n]) == {f"image: {REFUSED}"}  # existence and type are not revealed
    direct = reward(None, [CAPTION] * len(allowed), image=[
        str(tree["root"] / "i0.png"), str(tree["root"] / "sub" / "i1.png"), str(tree["root"] / "i0.png"),
        str(tree["root"] / "i0.png"), str(tree["root"] / "sub" / "i1.png")])
    assert body["errors"][n:] == [None] * len(allowed)
    assert body["rewards"][n:] == pytest.approx(direct, abs=1e-6)
    assert min(direct) > 0  # real scores, not the clip at 0


def test_videos_urls_and_non_strings(server, tree):
    status, body = server.post({"query": [CAPTION] * 4, "labels": [
        {"video": "../secret.png"}, {"image": "http://127.0.0.1:1/x.png"},
        {"image": "data:image/png;base64,iVBORw0KGgo="}, {"video": "file:///etc/passwd"}]})
    assert status == 200, body
    assert body["errors"] == [f"video: {REFUSED}", f"image: {NOT_LOCAL}", f"image: {NOT_LOCAL}", f"video: {NOT_LOCAL}"]
    for bad, message in [({"image": 5}, r"labels\[1\]: 'image' must be a non-empty path string, got 5"),
                         ({"image": {"path": "i0.png"}}, r"labels\[1\]: 'image' must be a non-empty path string, got 'dict'"),
                         ({"video": ["a.mp4"]}, r"labels\[1\]: 'video' must be a non-empty path"),
                         ({"image": ""}, r"labels\[1\]: 'image' must be a non-empty path")]:
        status, body = server.post({"query": [CAPTION] * 2, "labels": [{"image": "i0.png"}, bad]})
        assert status == 400
        assert re.search(message, body["error"]), body["error"]


def test_without_a_root_every_path_is_refused_unless_allowed(reward, tree):
    payload = {"query": [CAPTION], "labels": [{"image": str(tree["secret"])}]}
    refused = RewardService(reward, fallback=-1).handle(payload)
    assert refused["errors"] == [f"image: {NO_ROOT}"] and refused["rewards"] == [-1.0]
    anywhere = RewardService(reward, fallback=-1, allow_any_path=True).handle(payload)
    assert anywhere["errors"] == [None]
    assert anywhere["rewards"][0] == pytest.approx(reward(None, [CAPTION], image=[str(tree["secret"])])[0], abs=1e-6)
    with pytest.raises(ValueError, match="not a directory"):
        RewardService(reward, media_root=str(tree["root"] / "i0.png"))


def test_verl_extra_info_is_confined_when_a_root_is_set(reward, tree, caplog):
    compute_score = make_compute_score(reward, fallback=-1.0, media_root=str(tree["root"]))
    assert compute_score("d", CAPTION, None, {"image": "../secret.png"}) == -1.0
    assert compute_score("d", CAPTION, None, {"image": str(tree["secret"])}) == -1.0
    assert REFUSED in caplog.text
    inside = compute_score("d", CAPTION, None, {"image": "inside_link.png"})
    assert inside == pytest.approx(reward(None, [CAPTION], image=[str(tree["root"] / "i0.png")])[0], abs=1e-6)
    # no root configured: the operator's own dataset paths are used as given
    assert make_compute_score(reward, fallback=-1.0)("d", CAPTION, None, {"image": str(tree["secret"])}) != -1.0


# --- the HTTP front, over raw sockets -------------------------------------------------------------

def exchange(srv: Server, data: bytes, timeout: float = 60.0) -> tuple[int, dict, bytes]:
    """Send ``data`` on a fresh connection; (status, headers, body) of the answer, and the bytes
    after it (b"" when the server closed the connection)."""
    with srv.connect(timeout) as sock:
        sock.sendall(data)
        status, headers, body = read_answer(sock)
        if headers.get("connection") == "close":
            assert sock.recv(1) == b""  # closed: nothing of an unread body is waited for
        return status, headers, body


def post_head(*headers: str) -> bytes:
    return ("POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


@pytest.mark.parametrize("headers, status", [
    ((), 411),
    (("Content-Length: -1",), 400),
    (("Content-Length: abc",), 400),
    (("Content-Length: 1e3",), 400),
    (("Content-Length: +5",), 400),
    (("Content-Length: 5", "Content-Length: 6"), 400),
    (("Transfer-Encoding: chunked",), 411),
    (("Content-Length: 1000000000000",), 413),
])
def test_body_length_is_checked_before_reading(server, headers, status):
    """No body is sent: an answer at all shows the server did not wait for one."""
    got, head, body = exchange(server, post_head(*headers))
    assert got == status, body
    assert head["connection"] == "close"


def test_deeply_nested_json_gets_400(server):
    deep = b"[" * 100_000 + b"]" * 100_000
    status, _, body = exchange(server, post_head(f"Content-Length: {len(deep)}") + deep)
    assert status == 400 and "nested too deeply" in body["error"]
    label = "[" * 100_000 + "]" * 100_000
    status, body = server.post({"query": [CAPTION], "labels": [label]})
    assert status == 400 and re.search(r"^labels\[0\]\S* is nested too deeply", body["error"]), body


def test_stalled_clients_are_dropped(server):
    """--read-timeout 2: a client stalled inside its headers or its body, an idle one and one that
    trickles bytes are disconnected (generous bounds: 60 s), and the server goes on serving."""
    with server.connect(60) as sock:
        sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        start = time.monotonic()
        assert sock.recv(65536) == b""
        assert time.monotonic() - start < 60
    with server.connect(60) as sock:
        sock.sendall(post_head("Content-Length: 100") + b'{"query": ')  # body never finished
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408")
    with server.connect(60) as sock:  # a connection that never sends anything is closed too
        assert sock.recv(65536) == b""
    # a client trickling its headers a byte at a time (each byte well within the timeout) is cut off
    # at the request's deadline; the loop is bounded, and ends at once when the server closes
    closed = False
    with server.connect(60) as sock:
        for byte in itertools.islice(itertools.cycle(b"POST /get_reward HTTP/1.1\r\nX-Slow: aaaa"), 120):
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if select.select([sock], [], [], 0.5)[0]:
                try:
                    closed = sock.recv(65536) == b""
                except OSError:
                    closed = True
                break
    assert closed
    status, body = server.post({"query": [CAPTION], "labels": [{"image": "i0.png"}]})
    assert status == 200 and body["errors"] == [None]


def test_connections_are_bounded(tiny_clip_path, tree):
    """--max-connections 2 (both for one address, none reserved): with two connections open, a third
    is answered 503 and closed; once one of the two is finished, new connections are served again."""
    srv = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(tree["root"]),
                  "--max-connections", "2", "--max-connections-per-peer", "2", "--reserved-connections", "0",
                  "--read-timeout", "300", "--header-timeout", "300"])
    try:
        first, second = srv.connect(), srv.connect()
        status, head, body = exchange(srv, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status == 503 and "too many connections" in body["error"] and head["connection"] == "close"
        first.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := first.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        first.close()
        status, _, body = exchange(srv, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert status == 200 and body["status"] == "ok"
        second.close()
    finally:
        assert srv.stop() == 0
