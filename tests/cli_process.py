"""``run(args)``: ``subprocess.run([sys.executable, "-m", "capreward.cli.main", *args])`` without paying the
interpreter's imports each time.

A CLI test's child process spends most of its CPU importing torch, torchvision, transformers and
open_clip (about ten CPU-seconds on an idle core, twice that on a busy CI machine) before capreward does
anything. Here each call is still its own OS process running the CLI module as ``__main__``, with its
own descriptors, directory, environment, exit code and signals, but forked from a zygote
(``cli_zygote.py``, one a test process) that imported those libraries once. capreward is imported afresh
in every child.

A zygote serves children whose environment equals its own but for :data:`RUNTIME_ENV` (variables read
when used, not when a library is imported). An environment that differs elsewhere (a test's
``HF_HUB_OFFLINE``, or a variable an earlier test left set) gets a plain subprocess the first time and its
own zygote from the second (at most :data:`MAX_ZYGOTES`); ``CAPREWARD_TEST_PLAIN_CLI=1`` makes every call
plain. Tests of start-up itself (what the CLI imports, how long ``--help``
takes) and of signals sent from outside use plain subprocesses. Either way the result carries the
child's peak resident set size (``peak_rss``); a plain child's counts this process's pages it held before
its exec (Linux), so a test of peak memory compares forked children.
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
import threading
from collections import Counter, OrderedDict
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
    def __init__(self, env: dict[str, str]) -> None:
        self.folder = tempfile.mkdtemp(prefix="capreward-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.key = import_time_env(env)
        start = dict(env)
        start.pop("OMP_NUM_THREADS", None)  # the zygote learns torch's default thread count
        start.pop("MKL_NUM_THREADS", None)
        self.process = subprocess.Popen([sys.executable, str(HERE / "cli_zygote.py"), self.path], stdout=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, env=start, cwd=HERE, start_new_session=True)
        line = self.process.stdout.readline() if self.process.stdout else b""
        if line.strip() != b"ready":
            self.process.kill()
            raise RuntimeError(f"the CLI zygote did not start (said {line!r})")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for name in (self.path, self.folder):
            try:
                os.unlink(name) if name == self.path else os.rmdir(name)
            except OSError:
                pass


def import_time_env(env: dict[str, str]) -> tuple:
    """The part of an environment a zygote must share with a child: every variable but :data:`RUNTIME_ENV`."""
    return tuple(sorted((k, v) for k, v in env.items() if not RUNTIME_ENV.match(k)))


#: at most this many zygotes a process (one per environment seen twice; the least recently used goes)
MAX_ZYGOTES = 3
_zygotes: OrderedDict[tuple, _Zygote] = OrderedDict()
_seen: Counter = Counter()
#: how the last :func:`run` ran its child: "zygote" or "plain" (for the tests of this module)
last_run = ""


def _zygote_for(env: dict[str, str]) -> _Zygote | None:
    """The zygote for ``env``: the session's own environment gets one at once; another (a test's variable,
    or one an earlier test left set) gets one the second time it is seen, a plain subprocess before."""
    if os.environ.get("CAPREWARD_TEST_PLAIN_CLI") == "1":
        return None
    key = import_time_env(env)
    zygote = _zygotes.get(key)
    if zygote is not None and zygote.process.poll() is None:
        _zygotes.move_to_end(key)
        return zygote
    _seen[key] += 1
    if key != import_time_env(BASE_ENV) and _seen[key] < 2:
        return None
    zygote = _Zygote(env)
    _zygotes[key] = zygote
    atexit.register(zygote.close)
    while len(_zygotes) > MAX_ZYGOTES:
        _zygotes.popitem(last=False)[1].close()
    return zygote


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
        module: str = MODULE, script: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m MODULE ARGS`` as a child process with stdout and stderr captured.

    Args:
        args: the command-line arguments (``str()`` of each).
        env: the child's whole environment (None: this process's).
        cwd: its working directory (None: this process's).
        timeout: seconds before the child is killed and :class:`subprocess.TimeoutExpired` raised.
        input: text for its stdin (None: an empty stdin).
        text: decode stdout and stderr as ``subprocess.run(text=True)`` does (else bytes).
        module: the module run as ``__main__``.
        script: a script file to run instead (``python SCRIPT ARGS``; its folder first on ``sys.path``).

    Returns:
        A :class:`subprocess.CompletedProcess`, as ``subprocess.run(..., capture_output=True)`` gives, with
        ``peak_rss``: the child's peak resident set size in bytes (``wait4``'s ``ru_maxrss``; a forked
        child counts the zygote's pages it inherited, a plain one the pages of this process it held between
        fork and exec: compare forked children).

    Raises:
        subprocess.TimeoutExpired: the child outlived ``timeout`` (it is killed first).
    """
    argv = [str(a) for a in args]
    environ = dict(os.environ if env is None else env)
    directory = os.fspath(cwd) if cwd is not None else os.getcwd()
    global last_run
    zygote = _zygote_for(environ)
    last_run = "plain" if zygote is None else "zygote"
    command = [sys.executable, os.fspath(script), *argv] if script is not None else [sys.executable, "-m", module, *argv]
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        if zygote is None:
            returncode, peak = _plain(command, stdin, stdout, stderr, environ, directory, timeout)
            stdout.seek(0)
            stderr.seek(0)
            out, err = stdout.read(), stderr.read()
            return _completed(command, returncode, out, err, text, peak)
        conn.connect(zygote.path)
        body = json.dumps({"module": module, "script": None if script is None else os.fspath(script), "argv": argv,
                           "cwd": directory, "env": environ}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body))], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
        conn.sendall(body)
        buffer = bytearray()
        pid = _read_line(conn, buffer)["pid"]
        conn.settimeout(timeout)
        try:
            ended = _read_line(conn, buffer)
        except socket.timeout:
            os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            _read_line(conn, buffer)
            stdout.seek(0)
            stderr.seek(0)
            raise subprocess.TimeoutExpired(command, timeout or 0, output=stdout.read(), stderr=stderr.read())  # noqa: B904
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    return _completed(command, ended["returncode"], out, err, text, ended["maxrss_kb"] * 1024)


def _plain(command: list[str], stdin: Any, stdout: Any, stderr: Any, env: dict[str, str], cwd: str,
           timeout: float | None) -> tuple[int, int]:
    """Runs ``command`` as a plain subprocess; its exit code and peak RSS in bytes (``wait4``).

    Raises:
        subprocess.TimeoutExpired: it outlived ``timeout`` (it is killed first)."""
    proc = subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout, kill) if timeout is not None else None
    if timer is not None:
        timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        if timer is not None:
            timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if killed.is_set():
        stdout.seek(0)
        stderr.seek(0)
        raise subprocess.TimeoutExpired(command, timeout or 0, output=stdout.read(), stderr=stderr.read())
    return proc.returncode, usage.ru_maxrss * 1024


def _completed(command: list[str], returncode: int, out: bytes, err: bytes, text: bool, peak: int) -> subprocess.CompletedProcess:
    decode = _text if text else (lambda b: b)
    done = subprocess.CompletedProcess(command, returncode, decode(out), decode(err))
    done.peak_rss = peak  # type: ignore[attr-defined]
    return done


class Child:
    """A zygote's child started by :func:`start`, with the parts of :class:`subprocess.Popen` the tests use:
    ``pid``, ``stderr`` (the read end of its stderr pipe), ``args``, ``returncode``, :meth:`poll`,
    :meth:`wait`, :meth:`send_signal`, :meth:`terminate` and :meth:`kill`; ``peak_rss`` once it ended."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, stderr: Any, buffer: bytearray) -> None:
        self.args, self.pid, self.stderr = args, pid, stderr
        self.returncode: int | None = None
        self.peak_rss: int | None = None
        self._conn, self._buffer = conn, buffer
        self._ended = threading.Event()
        threading.Thread(target=self._await_end, daemon=True).start()

    def _await_end(self) -> None:
        try:
            ended = _read_line(self._conn, self._buffer)
        except (ConnectionError, OSError, ValueError):  # the zygote itself is gone: so is its child
            ended = {"returncode": -signal.SIGKILL, "maxrss_kb": 0}
        self.peak_rss = ended["maxrss_kb"] * 1024
        self.returncode = ended["returncode"]
        self._conn.close()
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if not self._ended.is_set():
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args: list[Any] | tuple[Any, ...], *, module: str = MODULE) -> subprocess.Popen | Child:
    """Starts ``python -m MODULE ARGS`` in the background (a long-running server), stdin and stdout on
    ``/dev/null`` and stderr on a text pipe (``.stderr``), in this process's environment and directory.

    Args:
        args: the command-line arguments (``str()`` of each).
        module: the module run as ``__main__``.

    Returns:
        A :class:`Child` of the zygote, or a plain :class:`subprocess.Popen` where :func:`run` would run a
        plain process.
    """
    argv = [str(a) for a in args]
    command = [sys.executable, "-m", module, *argv]
    environ = dict(os.environ)
    zygote = _zygote_for(environ)
    global last_run
    last_run = "plain" if zygote is None else "zygote"
    if zygote is None:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    read_end, write_end = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as stdout:
            conn.connect(zygote.path)
            body = json.dumps({"module": module, "argv": argv, "cwd": os.getcwd(), "env": environ}).encode()
            socket.send_fds(conn, [struct.pack("!I", len(body))], [stdin.fileno(), stdout.fileno(), write_end])
            conn.sendall(body)
    except BaseException:
        conn.close()
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    buffer = bytearray()
    pid = _read_line(conn, buffer)["pid"]
    return Child(command, conn, pid, os.fdopen(read_end, "r", encoding=locale.getpreferredencoding(False)), buffer)


def zygote_socket() -> str | None:
    """The socket of this process's zygote for its own environment (started if need be), for a launcher
    (``zygote_exec.py``) a test hands to another program; None where :func:`run` would run a plain process."""
    zygote = _zygote_for(dict(os.environ))
    return None if zygote is None else zygote.path
