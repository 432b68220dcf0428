"""``python zygote_exec.py PYTHON SCRIPT ARGS...``: runs ``PYTHON SCRIPT ARGS`` as a child of the test zygote
(``cli_zygote.py``) whose socket is ``$CAPREWARD_TEST_ZYGOTE``, without paying the heavy imports again; a
launcher for commands the tests start through another program (``benchmarks/gpu_all.py``'s steps, with
``CAPREWARD_BENCH_LAUNCH``).

The child gets this process's stdin, stdout, stderr, directory and environment; this process exits with
the child's exit code (or dies of its signal), forwards SIGTERM and SIGINT to it, and when this process is
killed (a runner's time limit), the child and the processes it started are killed too. Standard library
only: it starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: zygote_exec.py PYTHON SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script, args = argv[1], argv[2:]
    request = {"module": None, "script": script, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ),
               "watch": os.getpid()}
    body = json.dumps(request).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.environ["CAPREWARD_TEST_ZYGOTE"])
        socket.send_fds(conn, [struct.pack("!I", len(body))], [0, 1, 2])
        conn.sendall(body)
        lines = conn.makefile("rb")
        pid = json.loads(lines.readline())["pid"]
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda number, _frame: os.kill(pid, number))
        code = json.loads(lines.readline())["returncode"]
    if code < 0:  # the child died of a signal: so does this process, as a plain interpreter would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
