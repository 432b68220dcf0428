"""``run(args)``: ``subprocess.run([sys.executable, "-m", "capreward.cli.main", *args])`` without paying the
interpreter's imports each time.

A CLI test's child process spends most of its CPU importing torch, torchvision, transformers and
open_clip (about ten CPU-seconds on an idle core, twice that on a busy CI machine) before capreward does
anything. Here each call is still its own OS process running the CLI module as ``__main__``, with its
own descriptors, directory, environment, exit code and signals, but forked from a zygote
(``cli_zygote.py``, one a test process) that imported those libraries once. capreward is imported afresh
in every child.

A call goes to a plain subprocess instead when the zygote cannot reproduce a fresh interpreter: an
environment that differs from the session's in a variable the libraries read at import time (only
:data:`RUNTIME_ENV` may differ), or
``CAPREWARD_TEST_PLAIN_CLI=1``. Tests of start-up itself (what the CLI imports, how long ``--help``
takes), of peak memory and of signals sent from outside use plain subprocesses.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODULE = "capreward.cli.main"
#: the session's environment when the tests were collected (before any test changed it): the zygote's
BASE_ENV = dict(os.environ)
#: variables a child may set differently from the zygote: read when used, not when a library is imported
RUNTIME_ENV = re.compile(r"^(CAPREWARD_\w*|PYTEST_\w*|OMP_NUM_THREADS|MKL_NUM_THREADS|COLUMNS|LINES|PATH|NO_COLOR"
                         r"|TOKENIZERS_PARALLELISM|TORCHINDUCTOR_CACHE_DIR)$")


class _Zygote:
    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="capreward-zygote-")
        self.path = os.path.join(self.folder, "socket")
        env = dict(BASE_ENV)
        self.env = dict(env)
        env.pop("OMP_NUM_THREADS", None)  # the zygote learns torch's default thread count
        env.pop("MKL_NUM_THREADS", None)
        self.process = subprocess.Popen([sys.executable, str(HERE / "cli_zygote.py"), self.path], stdout=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, env=env, cwd=HERE, start_new_session=True)
        line = self.process.stdout.readline() if self.process.stdout else b""
        if line.strip() != b"ready":
            self.process.kill()
            raise RuntimeError(f"the CLI zygote did not start (said {line!r})")

    def accepts(self, env: dict[str, str]) -> bool:
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys if not RUNTIME_ENV.match(k))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for name in (self.path, self.folder):
            try:
                os.unlink(name) if name == self.path else os.rmdir(name)
            except OSError:
                pass


_zygote: _Zygote | None = None


def _get_zygote() -> _Zygote | None:
    global _zygote
    if os.environ.get("CAPREWARD_TEST_PLAIN_CLI") == "1":
        return None
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = _Zygote()
        atexit.register(_zygote.close)
    return _zygote


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _read_line(conn: socket.socket, buffer: bytearray) -> dict:
    while b"\n" not in buffer:
        more = conn.recv(4096)
        if not more:
            raise ConnectionError("the CLI zygote closed the connection")
        buffer += more
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


def run(args: list[Any] | tuple[Any, ...], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
        timeout: float | None = None, input: str | None = None, text: bool = True,
        module: str = MODULE) -> subprocess.CompletedProcess:
    """Runs ``python -m MODULE ARGS`` as a child process with stdout and stderr captured.

    Args:
        args: the command-line arguments (``str()`` of each).
        env: the child's whole environment (None: this process's).
        cwd: its working directory (None: this process's).
        timeout: seconds before the child is killed and :class:`subprocess.TimeoutExpired` raised.
        input: text for its stdin (None: an empty stdin).
        text: decode stdout and stderr as ``subprocess.run(text=True)`` does (else bytes).
        module: the module run as ``__main__``.

    Returns:
        A :class:`subprocess.CompletedProcess`, as ``subprocess.run(..., capture_output=True)`` gives.

    Raises:
        subprocess.TimeoutExpired: the child outlived ``timeout`` (it is killed first).
    """
    argv = [str(a) for a in args]
    environ = dict(os.environ if env is None else env)
    directory = os.fspath(cwd) if cwd is not None else os.getcwd()
    zygote = _get_zygote()
    if zygote is None or not zygote.accepts(environ):
        return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=text, env=environ,
                              cwd=directory, timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        conn.connect(zygote.path)
        body = json.dumps({"module": module, "argv": argv, "cwd": directory, "env": environ}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body))], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
        conn.sendall(body)
        buffer = bytearray()
        pid = _read_line(conn, buffer)["pid"]
        conn.settimeout(timeout)
        try:
            returncode = _read_line(conn, buffer)["returncode"]
        except socket.timeout:
            os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            _read_line(conn, buffer)
            stdout.seek(0)
            stderr.seek(0)
            raise subprocess.TimeoutExpired([sys.executable, "-m", module, *argv], timeout or 0,  # noqa: B904
                                            output=stdout.read(), stderr=stderr.read())
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    decode = _text if text else (lambda b: b)
    return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], returncode, decode(out), decode(err))
