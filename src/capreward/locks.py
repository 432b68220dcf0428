"""Cross-process locks that say who holds them: an exclusive lock on a file (``filelock``: ``flock`` on
Linux and macOS, ``msvcrt`` on Windows, a lock file where neither exists) with a timeout, and a sidecar
file naming the holder, so that a process that cannot have the lock says whom it waits for.

The holder file ``<lock>.holder`` holds one JSON object, ``{"pid", "host", "since", "what"}``, written
(by a rename, never through a link) right after the lock is taken and removed before it is released. A
holder killed before it could remove it leaves it behind; the next holder replaces it, and a waiter that
finds the PID gone on its own host says so.

Used by the results-file lock of the scoring jobs (:mod:`capreward.jobs.output_lock`: a second writer is
refused at once) and by the cache of trained test fixtures (:mod:`capreward.testing.cache`: a second
process waits, saying for whom, up to a timeout).

Examples:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> from capreward.locks import LockBusy, holding, try_holding
    >>> lock = Path(tempfile.mkdtemp()) / "job.lock"
    >>> with holding(lock, what="an example"):
    ...     try:
    ...         with holding(lock, timeout=0):
    ...             pass
    ...     except LockBusy as busy:
    ...         print(busy.holder["what"], busy.holder["pid"] == os.getpid())
    ...     with try_holding(lock) as free:
    ...         print(free)
    an example True
    False
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from .errors import CaprewardError

logger = logging.getLogger(__name__)

#: The holder file's name beside the lock file: ``<lock>`` + this suffix.
HOLDER_SUFFIX = ".holder"
#: The most bytes of a holder file read (it holds one short JSON object).
MAX_HOLDER_BYTES = 4096


class LockBusy(CaprewardError, TimeoutError):
    """The lock was not free within the timeout. ``holder``: what its holder file says (``pid``, ``host``,
    ``since``, ``what``; empty when there is none), ``path``: the lock file."""

    def __init__(self, path: Path, holder: dict[str, Any], waited: float):
        self.path, self.holder, self.waited = path, holder, waited
        super().__init__(f"{path} is held by {describe_holder(holder)}"
                         + (f"; waited {waited:.0f} s" if waited >= 1 else ""))


def holder_path(lock: str | os.PathLike) -> Path:
    lock = Path(lock)
    return lock.with_name(lock.name + HOLDER_SUFFIX)


def read_holder(lock: str | os.PathLike) -> dict[str, Any]:
    """What the holder file of ``lock`` says (an empty dict when there is none or it is unreadable: a
    link, not a regular file, not a JSON object)."""
    path = holder_path(lock)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return {}
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_HOLDER_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: Any) -> bool | None:
    """Whether process ``pid`` of this host runs (None where that cannot be asked without risk: on
    Windows ``os.kill`` would end it)."""
    if not isinstance(pid, int) or pid <= 0 or sys.platform == "win32":
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def describe_holder(holder: dict[str, Any]) -> str:
    """``PID 123 on host "node1" since 2026-01-02 10:11:12 (training the FLEUR judge)``, from a holder
    record; says when the record is missing or names a process of this host that is gone."""
    if not holder:
        return "another process (it has not written its holder file yet, or was killed before it could)"
    pid, host, since, what = holder.get("pid"), holder.get("host"), holder.get("since"), holder.get("what")
    text = f"PID {pid}"
    if host:
        text += f" on host {str(host)[:100]!r}"
    if isinstance(since, (int, float)):
        text += " since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    if what:
        text += f" ({str(what)[:200]})"
    if host == socket.gethostname() and _alive(pid) is False:
        text += "; that process is no longer running, so the holder file is stale"
    return text


def _write_holder(lock: Path, what: str) -> None:
    """Write the holder record beside ``lock`` by a rename (a link planted at its name is replaced,
    never written through)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "what": what}
    fd, tmp = tempfile.mkstemp(prefix=f".{lock.name}-", suffix=".tmp", dir=lock.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, holder_path(lock))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _file_lock(path: Path):
    from filelock import FileLock

    return FileLock(str(path))


@contextmanager
def holding(lock: str | os.PathLike, timeout: float = -1, what: str = "", *,
            report_every: float = 60.0, on_wait: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the exclusive lock ``lock`` for the ``with`` block; yields its path.

    Args:
        lock: the lock file (its folder is created).
        timeout: seconds to wait for it; 0: do not wait; a negative number: wait for as long as it takes.
        what: what the holder does, written in its holder file for waiters to read.
        report_every: while waiting, say every this many seconds whom for (``on_wait``, and a log warning).
        on_wait: called with that message (default: printed to standard error).

    Returns:
        A context manager yielding the lock file's path.

    Raises:
        LockBusy: the lock was not free within ``timeout``; its message names the holder.
    """
    from filelock import Timeout

    path = Path(lock)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = _file_lock(path)
    start = time.monotonic()
    say = on_wait or (lambda text: print(text, file=sys.stderr, flush=True))
    while True:
        waited = time.monotonic() - start
        left = float("inf") if timeout < 0 else max(0.0, timeout - waited)
        try:
            handle.acquire(timeout=min(left, report_every), poll_interval=0.05 if left < 1 else 0.5)
            break
        except Timeout:
            waited = time.monotonic() - start
            if timeout >= 0 and waited >= timeout:
                raise LockBusy(path, read_holder(path), waited) from None
            message = (f"[capreward] waiting for the lock {path}, held by {describe_holder(read_holder(path))} "
                       f"({waited:.0f} s so far" + (f", at most {timeout:.0f} s)" if timeout >= 0 else ")"))
            logger.warning("%s", message)
            say(message)
    try:
        _write_holder(path, what)
        yield path
    finally:
        try:
            holder_path(path).unlink(missing_ok=True)
        finally:
            handle.release()


@contextmanager
def try_holding(lock: str | os.PathLike, what: str = "") -> Iterator[bool]:
    """Take ``lock`` if it is free, without waiting; yields whether it was (and is then held for the
    ``with`` block)."""
    with ExitStack() as stack:
        try:
            stack.enter_context(holding(lock, timeout=0, what=what))
        except LockBusy:
            yield False
            return
        yield True


__all__ = ["LockBusy", "describe_holder", "holder_path", "holding", "read_holder", "try_holding"]
