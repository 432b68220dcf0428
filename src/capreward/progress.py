"""Status bars on stderr for slow steps that have no natural count (loading a model).

Off by default so that library users see nothing; the ``capreward`` command turns them on (unless
``--no-progress``) with :func:`enable`. tqdm's ``TQDM_DISABLE`` silences them too.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_enabled = False


def enable(on: bool = True) -> None:
    """Show (or stop showing) the status bars of :func:`status` in this process."""
    global _enabled
    _enabled = on


def is_enabled() -> bool:
    """Whether :func:`status` shows its bars."""
    return _enabled


@contextlib.contextmanager
def status(what: str) -> Iterator[None]:
    """While the block runs, a line ``what: <elapsed>`` on stderr, updated every second and left
    showing the time it took; nothing unless :func:`enable` was called."""
    if not _enabled:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=1, desc=what, bar_format="{desc}: {elapsed}", file=sys.stderr)
    stop = threading.Event()

    def tick():
        while not stop.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True, name="status-bar")
    ticker.start()
    try:
        yield
        bar.update(1)
    except BaseException:
        bar.leave = False  # the error says what happened; the bar's line is cleared
        raise
    finally:
        stop.set()
        ticker.join()
        bar.close()
