"""One writer per results file: an exclusive lock on ``<out>.lock`` for the whole job.

The lock is :func:`capreward.locks.holding` (``filelock``: ``flock`` on Linux and macOS, ``msvcrt`` on
Windows), taken without waiting: a second run on the same ``--out`` is refused at once, its message
naming the holder (PID, host, since when) from ``<out>.lock.holder``. The operating system releases the
lock when its holder dies (even by SIGKILL), so a lock file or holder file left behind by a killed run
never blocks a rerun.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

from ..locks import LockBusy, describe_holder, holding
from .errors import JobError
from .safe_files import check_job_file


class OutputLocked(JobError):
    """Another live run holds the lock of the same results file."""


def lock_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".lock")


@contextmanager
def exclusive_output(out: str | Path) -> Iterator[Path]:
    """Hold the exclusive lock of results file ``out`` for the ``with`` block (yields the lock file's
    path); raises :class:`OutputLocked` naming ``out`` and the holder (PID, host, since when) when
    another run holds it."""
    path = lock_path(out)
    check_job_file(path, "the lock file")  # a planted link is refused (filelock opens it without following)
    try:
        with holding(path, timeout=0, what=f"writing {Path(out).name}") as held:
            yield held
    except LockBusy as busy:
        if busy.path != path:  # pragma: no cover - a lock taken inside the block is not ours to explain
            raise
        raise OutputLocked(
            f"{out} is being written by another run ({describe_holder(busy.holder)}; lock {path}); "
            "wait for it to finish or choose another --out"
        ) from None
