"""A ``capreward serve`` subprocess for the server tests (real process, real sockets on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading

import cli_process
from capreward.server.http import post_json


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """One HTTP answer read from ``sock`` (kept open): status, headers (names lower-cased) and the
    body decoded as JSON ({} when empty)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without an answer: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest[:length]) if length else {}


def serve_command() -> list[str]:
    """The server command the tests start: ``capreward serve``, or the command in
    ``CAPREWARD_TEST_SERVE_COMMAND`` (taking the same flags; ``python`` there is this interpreter), to run
    the subprocess server tests against another front (``experiments/asgi_front.py``)."""
    other = os.environ.get("CAPREWARD_TEST_SERVE_COMMAND")
    if not other:
        return [sys.executable, "-m", "capreward.cli.main", "serve"]
    words = shlex.split(other)
    return [sys.executable if w == "python" else w for w in words]


class Server:
    """A ``capreward serve`` subprocess; ``url`` is read from its readiness line on stderr.
    ``command``: the server command (default :func:`serve_command`)."""

    def __init__(self, args: list[str], timeout: float = 180.0, command: list[str] | None = None):
        flags = ["--host", "127.0.0.1", "--port", "0", *args]
        if command is None and not os.environ.get("CAPREWARD_TEST_SERVE_COMMAND"):
            # a child of the test zygote (cli_process): its own process, without paying the imports again
            self.proc: subprocess.Popen | cli_process.Child = cli_process.start(["serve", *flags])
        else:
            self.proc = subprocess.Popen([*(command or serve_command()), *flags], stderr=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        ready = threading.Event()
        self.url = None

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"ready on (http://127\.0\.0\.1:\d+)/get_reward", line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(timeout) or self.url is None:
            self.proc.kill()
            raise RuntimeError("server did not become ready:\n" + "".join(self.lines))

    def post(self, payload, path="/get_reward"):
        return post_json(self.url + path, payload, timeout=120)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.reader.join(timeout=10)
        return code

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def connect(self, timeout: float = 60.0, peer: str = "127.0.0.1") -> socket.socket:
        """A connection from the loopback address ``peer`` (127.0.0.2, 127.0.0.3 ... are distinct client
        addresses on Linux: the server sees distinct peers)."""
        assert peer.startswith("127."), "tests connect from loopback addresses only"
        return socket.create_connection(self.address, timeout=timeout, source_address=(peer, 0))

    def health(self, peer: str = "127.0.0.1") -> dict:
        """``GET /health`` on a new connection from ``peer``."""
        with self.connect(60, peer) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            status, _, body = read_answer(sock)
            assert sock.recv(1) == b""  # closed: the server has released the connection's slot
        assert status == 200, body
        return body
