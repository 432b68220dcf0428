"""One writer per results file: an exclusive ``flock`` on ``<out>.lock`` for the whole job.

The lock file holds the PID of the run that holds the lock, so a second run can name it. The kernel
releases a ``flock`` when its holder dies (even by SIGKILL), so a lock file left behind by a killed
run never blocks a rerun; the file itself is left in place (removing it would let two runs lock two
different files of the same name).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import JobError
from .safe_files import open_job_file


class OutputLocked(JobError):
    """Another live run holds the lock of the same results file."""


def lock_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".lock")


@contextmanager
def exclusive_output(out: str | Path) -> Iterator[Path]:
    """Hold the exclusive lock of results file ``out`` for the ``with`` block (yields the lock file's
    path); raises :class:`OutputLocked` naming ``out`` and the holder's PID when another run holds it."""
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_job_file(path, os.O_RDWR | os.O_CREAT, "the lock file")  # never through a planted link
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise OutputLocked(
                f"{out} is being written by another run (PID {holder}, lock {path}); "
                "wait for it to finish or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock
