"""The cache of trained test fixtures (``$CAPREWARD_CACHE``, default ``~/.cache/capreward``): where it is,
the lock a process holds while it trains a fixture into it, and how a finished directory is put in place.

Concurrent processes (parallel test sessions, the version matrix beside the suite) share the cache: the
first to need a fixture trains it while holding ``.<name>.lock`` beside it, and the others wait for it
(:func:`locked`). A waiter says whom it waits for (PID, host, since when, what it trains: the holder file
of :mod:`capreward.locks`) every minute, and gives up after :func:`lock_timeout` seconds
(``$CAPREWARD_CACHE_LOCK_TIMEOUT``, default 3600) with an error naming the holder, rather than hanging a
test run without a word. The locks are ``filelock``'s, so the cache works on Windows too.

Each version key has its own directory: environments with other torch versions keep their
fixtures side by side, and a key's directory is deleted only when unused for :data:`STALE_AFTER_DAYS`
days and not being built (:func:`remove_stale_versions`). No key holds the transformers version: a
judge is written in a layout every supported version reads (:mod:`capreward.testing.portable`), so the
version matrix's oldest end reads the judges the suite trained.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

from ..locks import holding, try_holding

#: A cached fixture of another key is deleted once unused for this many days (another environment, with
#: another torch version, may still use it: two venvs on one machine must not keep deleting
#: and retraining each other's fixtures).
STALE_AFTER_DAYS = 30
USED_MARKER = ".last_used"
#: The variable that sets how long a process waits for another's training (seconds).
LOCK_TIMEOUT_ENV = "CAPREWARD_CACHE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 3600.0


def cache_root() -> Path:
    """Where trained fixtures live: ``$CAPREWARD_CACHE`` or ``~/.cache/capreward``."""
    return Path(os.environ.get("CAPREWARD_CACHE") or Path.home() / ".cache" / "capreward")


def lock_timeout() -> float:
    """Seconds a process waits for a fixture another process is training: ``$CAPREWARD_CACHE_LOCK_TIMEOUT``
    (default 3600; a negative number waits for as long as it takes)."""
    value = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_LOCK_TIMEOUT
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{LOCK_TIMEOUT_ENV}={value!r} is not a number of seconds") from None


@contextmanager
def locked(path: Path, what: str = "training a test fixture", timeout: float | None = None) -> Iterator[Path]:
    """Hold the cache lock ``path`` for the block, waiting for another holder at most ``timeout``
    seconds (None: :func:`lock_timeout`) and saying whom it waits for; raises
    :class:`~capreward.locks.LockBusy` naming the holder when the wait runs out."""
    with holding(path, lock_timeout() if timeout is None else timeout, what=what) as held:
        yield held


def mark_used(target: Path) -> None:
    """Record that ``target`` was just used (the modification time of its :data:`USED_MARKER`)."""
    try:
        (target / USED_MARKER).touch()
    except OSError:
        pass  # a read-only cache is still usable; it is then never pruned as unused either way


def last_used(path: Path) -> float:
    marker = path / USED_MARKER
    try:
        return (marker if marker.exists() else path).stat().st_mtime
    except OSError:
        return 0.0


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    call or the file system does not offer it."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no CDLL(None)
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def install_directory(new: Path, target: Path) -> None:
    """Put the finished directory ``new`` at ``target`` (same parent): a rename when ``target`` does not
    exist; else an atomic swap, the old contents then deleted, so a reader never finds ``target`` missing
    or half written (without the swap, where the file system lacks it: the old directory is renamed aside
    first, a window of two renames)."""
    if not target.exists():
        os.replace(new, target)
        return
    if not _exchange(new, target):
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        os.replace(target, aside / "old")
        os.replace(new, target)
        new = aside
    shutil.rmtree(new, ignore_errors=True)  # now the old contents


def remove_stale_versions(target: Path, name: str) -> None:
    """Delete the fixtures called ``name`` under other keys than ``target``'s (an edit of a recipe,
    other library versions) that have not been used for :data:`STALE_AFTER_DAYS` days and are not being
    built (their lock is free), so the cache does not grow forever while a fixture another environment
    still uses stays."""
    pattern = re.compile(rf"{re.escape(name)}-[0-9a-f]{{16}}")
    cutoff = time.time() - STALE_AFTER_DAYS * 86400
    for sibling in target.parent.iterdir():
        if sibling.name == target.name or not pattern.fullmatch(sibling.name) or not sibling.is_dir():
            continue
        if last_used(sibling) > cutoff:
            continue
        lock = target.parent / f".{sibling.name}.lock"
        with try_holding(lock, what=f"deleting the stale {sibling.name}") as held:
            if held and last_used(sibling) <= cutoff:
                shutil.rmtree(sibling, ignore_errors=True)
                lock.unlink(missing_ok=True)


__all__ = ["STALE_AFTER_DAYS", "USED_MARKER", "cache_root", "install_directory", "last_used", "lock_timeout",
           "locked", "mark_used", "remove_stale_versions"]
