"""Slow clients cannot starve a ``capreward serve`` subprocess: real slow and legitimate clients on
loopback addresses (127.0.0.2, 127.0.0.3 ... are distinct peers to the server; the whole 127/8 is
loopback on Linux).

No test waits on a clock. The server admits or refuses connections one at a time in the order they
were made, and answers a refused one (503) before it accepts the next; so once the last of a row of
connections has been read as refused, every earlier one is decided, and a refused one already has its
answer in its socket (``answered``) while an admitted one has nothing to read. Deadlines are set long
(300-600 s) wherever the test must not depend on them, and short only where the outcome is that a
connection gets closed, which the test reads as an event (a blocking read returning end-of-file).
"""

from __future__ import annotations

import json
import select
import socket

import pytest
from PIL import Image

from conftest import random_video
from serve_process import Server

CAPTION = "two people dance"
SLOW_LINE = b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-0: 0\r\n"  # headers begun, never finished


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow_media")
    Image.fromarray(random_video(61, frames=1)[0]).save(root / "i0.png")
    return root


def start(tiny_clip_path, media, *flags: str) -> Server:
    return Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(media), *flags])


def answered(sock: socket.socket) -> bool:
    """Whether the server has already written something (or closed): readable without waiting."""
    return bool(select.select([sock], [], [], 0)[0])


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (the socket's timeout bounds each read)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def open_row(srv: Server, peer: str, count: int) -> tuple[list[socket.socket], list[bytes]]:
    """``count`` connections from ``peer``, the last of which the server must refuse. Returns the ones
    it admitted (each then sends the first line of headers it never finishes) and the 503 answers of
    the ones it refused."""
    socks = [srv.connect(60, peer) for _ in range(count)]
    last = read_all(socks[-1])  # blocks until the server has decided every connection of the row
    assert last.startswith(b"HTTP/1.1 503"), f"the last connection of {count} from {peer} was admitted: {last!r}"
    held, refusals = [], [last]
    for sock in socks[:-1]:
        if answered(sock):
            refusals.append(read_all(sock))
            sock.close()
        else:
            sock.sendall(SLOW_LINE)
            held.append(sock)
    socks[-1].close()
    return held, refusals


def error_of(answer: bytes) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    return json.loads(body)["error"]


def post(srv: Server, peer: str, sock: socket.socket | None = None) -> tuple[int, dict]:
    """A legitimate reward request from ``peer`` (on ``sock`` when given), read to its answer."""
    body = json.dumps({"query": [CAPTION], "labels": [{"image": "i0.png"}]}).encode()
    sock = sock or srv.connect(120, peer)
    with sock:
        sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = read_all(sock)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer
    return int(head.split()[1]), json.loads(payload)


def close_all(socks) -> None:
    for sock in socks:
        sock.close()


def hang_up(socks) -> None:
    """Close each connection and wait until the server has closed its end too (its slot is free by
    then: the server releases a slot before it closes the connection)."""
    for sock in socks:
        sock.shutdown(socket.SHUT_WR)
        read_all(sock)
        sock.close()


def test_one_peer_cannot_take_the_slots_of_others(tiny_clip_path, media):
    """8 connections, at most 4 per address, the last 2 kept for addresses holding none: a slow peer
    keeps 4, a second busy peer 2 (then it is at the reserve), two new peers one each, and a request
    from each peer that got in is scored."""
    srv = start(tiny_clip_path, media, "--max-connections", "8", "--max-connections-per-peer", "4",
                "--reserved-connections", "2", "--header-timeout", "300", "--read-timeout", "600")
    opened = []
    try:
        slow, refusals = open_row(srv, "127.0.0.2", 7)
        opened += slow
        assert len(slow) == 4 and len(refusals) == 3
        assert all("from your address (at most 4 at once)" in error_of(r) for r in refusals)
        health = srv.health("127.0.0.9")  # its own connection is open while it answers
        assert health["connections"] == {"open": 5, "peers": 2, "largest": 4, "refused": 3,
                                         "header_timeouts": 0, "body_timeouts": 0, "headers_too_large": 0}

        busy, refusals = open_row(srv, "127.0.0.3", 3)  # 4 + 2 = 8 - 2 reserved: its third is refused
        opened += busy
        assert len(busy) == 2 and "the last 2 are kept for other clients" in error_of(refusals[0])
        c, d = srv.connect(60, "127.0.0.4"), srv.connect(60, "127.0.0.5")  # the reserve: one each
        opened += [c, d]
        _, refusals = open_row(srv, "127.0.0.6", 1)  # all 8 taken now
        assert "too many connections (8 open)" in error_of(refusals[0])
        assert not any(answered(s) for s in slow + busy + [c, d])  # every admitted one still held
        for peer, sock in (("127.0.0.4", c), ("127.0.0.5", d)):
            status, body = post(srv, peer, sock)
            assert status == 200 and body["errors"] == [None] and body["rewards"][0] > 0
        hang_up(busy)
        status, body = post(srv, "127.0.0.3")  # the busy peer's own requests are served again
        assert status == 200 and body["errors"] == [None]
    finally:
        close_all(opened)
        assert srv.stop() == 0


def test_a_trickling_peer_does_not_starve_a_legitimate_one(tiny_clip_path, media):
    """The issue's attack, default connection limits: one address opens connections until refused and
    trickles a header line on each (the header deadline set long so that only the connection limits
    act), reconnecting after every refusal; another address's 10 requests are all scored."""
    srv = start(tiny_clip_path, media, "--header-timeout", "300", "--read-timeout", "600")
    held = []
    try:
        held, refusals = open_row(srv, "127.0.0.2", 72)
        assert len(held) == 64 and all("from your address" in error_of(r) for r in refusals)  # 128 // 2
        for round_ in range(1, 11):
            for sock in held:  # one more header line each, as a slow client sends them
                sock.sendall(f"X-Slow-{round_}: {round_}\r\n".encode())
            more, refused = open_row(srv, "127.0.0.2", 3)  # the attacker reconnects: refused at once
            assert more == [] and len(refused) == 3
            status, body = post(srv, "127.0.0.3")
            assert status == 200 and body["errors"] == [None], body
        assert not any(answered(s) for s in held)
        health = srv.health("127.0.0.3")
        assert health["connections"]["largest"] == 64 and health["connections"]["refused"] == 8 + 30
    finally:
        close_all(held)
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def deadline_server(tiny_clip_path, media):
    srv = start(tiny_clip_path, media, "--header-timeout", "5", "--read-timeout", "600", "--max-header-bytes", "16384")
    yield srv
    assert srv.stop() == 0


def test_headers_have_a_deadline_well_before_the_body(deadline_server):
    """--header-timeout 5, --read-timeout 600: a connection that never finishes its headers and one
    that sends nothing are closed without an answer at the header deadline, while a client whose
    headers arrived may take longer over its body and is answered; once answered, its idle
    keep-alive connection is closed at the next header deadline."""
    srv = deadline_server
    before = srv.health("127.0.0.5")["connections"]
    with srv.connect(120, "127.0.0.2") as slow, srv.connect(120, "127.0.0.3") as idle, \
            srv.connect(120, "127.0.0.4") as body_client:
        slow.sendall(SLOW_LINE)
        payload = json.dumps({"query": [CAPTION], "labels": [{"image": "i0.png"}]}).encode()
        body_client.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                            + str(len(payload)).encode() + b"\r\n\r\n" + payload[:10])
        assert read_all(slow) == b""  # closed at its header deadline, nothing answered
        assert read_all(idle) == b""
        health = srv.health("127.0.0.5")["connections"]
        assert health["header_timeouts"] - before["header_timeouts"] == 2
        assert health["body_timeouts"] == before["body_timeouts"]
        assert not answered(body_client)  # past the header deadline, within the body's
        body_client.sendall(payload[10:])
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = body_client.recv(65536)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200")
        read_all(body_client)  # the kept-alive connection is closed at its next header deadline
    assert srv.health("127.0.0.5")["connections"]["header_timeouts"] - before["header_timeouts"] == 3


def test_request_headers_are_bounded_in_size(deadline_server):
    """A request whose line and headers exceed --max-header-bytes gets 431 and is closed; a normal one
    on the next connection is served."""
    srv = deadline_server
    before = srv.health()["connections"]["headers_too_large"]
    with srv.connect(120) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     + b"".join(f"X-Pad-{i}: {'a' * 1000}\r\n".encode() for i in range(40)) + b"\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431") and b"exceed 16384 bytes" in answer
    assert srv.health()["connections"]["headers_too_large"] == before + 1
    status, body = post(srv, "127.0.0.1")
    assert status == 200 and body["errors"] == [None]


def test_inconsistent_connection_limits_are_one_line(tiny_clip_path, media):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "serve", "--clip-model", str(tiny_clip_path),
                           "--media-root", str(media), "--max-connections", "4", "--max-connections-per-peer", "5"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "capreward serve: connection limits need 1 <= max_connections_per_peer (5) <= max_connections (4) and "
        "0 <= reserved_connections (0) < max_connections"]
