"""The zygote behind :mod:`cli_process`: a Python process that imported the heavy third-party libraries
once (torch, torchvision, transformers, open_clip, PIL, numpy: about ten CPU-seconds an interpreter) and
ran no torch operation, so forking it is safe (no OpenMP pool exists yet). For each request on its Unix
socket it forks a child that becomes what ``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) would: the caller's stdin/stdout/stderr
(passed as file descriptors), working directory, environment, thread count and ``sys.path[0]``, then the
module run as ``__main__``, its exit code or fatal signal, and the interpreter's exit handlers. capreward
itself is imported afresh in each child, so module-level reads of the environment see the caller's.

Protocol (one connection a request): the client sends a 4-byte length, a JSON request (module or script,
argv, cwd, env) and the three descriptors; the zygote answers one JSON line with the child's pid and, when the child
ends, one line with its exit code (negative: the signal that ended it, as :mod:`subprocess` reports it)
and its peak resident set size (``maxrss_kb``, from ``wait4``; it counts the pages inherited from the
zygote, as a plain interpreter's counts its own imports).

Usage: python cli_zygote.py SOCKET_PATH (prints "ready" on stdout once it listens).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback


def _import_heavy_libraries() -> bytes:
    """Imports the libraries every capreward CLI run would import, with what they print to stderr while
    importing (warnings) captured: each child writes it first, as its own imports would have."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import numpy  # noqa: F401
            import PIL.Image  # noqa: F401
            import torch  # noqa: F401
            import torchvision  # noqa: F401
            import transformers  # noqa: F401
            from transformers import (AutoModelForImageTextToText, AutoProcessor, AutoTokenizer,  # noqa: F401
                                      LlavaForConditionalGeneration)

            try:
                import open_clip  # noqa: F401
            except ImportError:
                pass
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        return captured.read()


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for an uncaught ``SystemExit`` (its message goes to stderr)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _become(request: dict, fds: list[int], import_output: bytes, default_threads: int) -> None:
    """In the forked child: take the caller's descriptors, directory and environment, run the module as
    ``__main__`` and exit as the interpreter would. Never returns."""
    import runpy

    import torch

    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        watched = request.get("watch")
        if watched:  # a launcher (zygote_exec.py) stands for this child: it and its children go with it
            os.setsid()
            threading.Thread(target=_follow, args=(int(watched),), daemon=True).start()
        threads = request["env"].get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else default_threads)
        script = request.get("script")
        if script:  # ``python SCRIPT ARGS``: the script's folder first on the path
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            sys.argv = [script, *request["argv"]]
        else:
            sys.path[0] = os.getcwd()  # what ``python -m`` puts first
            sys.argv = ["-m", *request["argv"]]
        os.write(2, import_output)
        try:
            if script:
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            sys.stderr.flush()
            atexit._run_exitfuncs()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)  # the interpreter dies of the signal, as CPython does
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    finally:
        os._exit(code)


def _follow(pid: int) -> None:
    """In a child started for a launcher: when the launcher process ``pid`` is gone (killed at a time
    limit), kill this child's process group (it, and the processes it started)."""
    import time

    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os.killpg(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)


def _reap(pid: int, conn: socket.socket) -> None:
    _, status, usage = os.wait4(pid, 0)
    answer = {"returncode": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}
    try:
        conn.sendall((json.dumps(answer) + "\n").encode())
    except OSError:  # the caller is gone (a launcher killed at a time limit): nobody to tell
        pass
    finally:
        conn.close()


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise ConnectionError("the client went away")
        head += more
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("the client went away")
        body += more
    return json.loads(body), list(fds)


def main(path: str) -> None:
    import_output = _import_heavy_libraries()
    import torch

    default_threads = torch.get_num_threads()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    server.settimeout(2.0)
    print("ready", flush=True)
    while True:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the test session is gone
                return
            continue
        conn.settimeout(None)
        try:
            request, fds = _read_request(conn)
        except (ConnectionError, ValueError, OSError):
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            server.close()
            conn.close()
            _become(request, fds, import_output, default_threads)
        for fd in fds:
            os.close(fd)
        conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
        threading.Thread(target=_reap, args=(pid, conn), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1])
