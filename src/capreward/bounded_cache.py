"""A memo of a function of text bounded in characters, not only in entries.

``functools.lru_cache(maxsize=16384)`` on a function of captions keeps up to 16,384 whole captions and
results however long each is: 16,384 readings of 16 Ki-character captions are half a gigabyte of
strings. :func:`text_memo` bounds the characters it holds (each entry costs its key's length plus its
result's text length), evicts the least recently used entries past either bound, and never keeps an
entry that alone would take more than a sixteenth of the character bound (it is computed, not cached).

Example::

    @text_memo(max_entries=16384, max_chars=1 << 25)
    def read_caption(text: str) -> Reading: ...
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, TypeVar
from collections.abc import Callable

T = TypeVar("T")


def entry_cost(key: str, value: Any) -> int:
    """Characters an entry holds: its key, and its result's ``text`` when that is another string."""
    text = getattr(value, "text", None)
    return len(key) + (len(text) if isinstance(text, str) and text is not key else 0)


def text_memo(max_entries: int, max_chars: int, cost: Callable[[str, Any], int] = entry_cost):
    """Memoise a function of one str argument, keeping at most ``max_entries`` results and
    ``max_chars`` characters (:func:`entry_cost`) in all, least recently used evicted first.

    Args:
        max_entries: results kept at most.
        max_chars: characters kept at most, keys and results together.
        cost: the characters of one entry (key, result).

    Returns:
        A decorator; the wrapped function has ``cache_clear()`` and ``cache_info()`` (entries, chars).
    """
    if max_entries < 1 or max_chars < 1:
        raise ValueError(f"max_entries and max_chars must be positive, got {max_entries}, {max_chars}")
    largest = max(1, max_chars // 16)

    def decorate(func: Callable[[str], T]) -> Callable[[str], T]:
        memo: OrderedDict[str, tuple[T, int]] = OrderedDict()
        held = [0]
        lock = threading.Lock()

        @functools.wraps(func)
        def wrapper(text: str) -> T:
            if isinstance(text, str):
                with lock:
                    hit = memo.get(text)
                    if hit is not None:
                        memo.move_to_end(text)
                        return hit[0]
            value = func(text)
            if not isinstance(text, str):
                return value
            size = cost(text, value)
            if size > largest:
                return value
            with lock:
                if text not in memo:
                    memo[text] = (value, size)
                    held[0] += size
                    while len(memo) > max_entries or held[0] > max_chars:
                        _, (_, gone) = memo.popitem(last=False)
                        held[0] -= gone
            return value

        def cache_clear() -> None:
            with lock:
                memo.clear()
                held[0] = 0

        def cache_info() -> dict[str, int]:
            with lock:
                return {"entries": len(memo), "chars": held[0], "max_entries": max_entries, "max_chars": max_chars}

        wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
        wrapper.cache_info = cache_info  # type: ignore[attr-defined]
        return wrapper

    return decorate
