"""A small least-recently-used cache with hit/miss counters, bounded by entries and optionally by bytes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any
from collections.abc import Hashable


class LRUCache:
    """Keeps at most ``maxsize`` entries (and, when ``max_bytes`` is set, at most that many bytes of the
    costs given to :meth:`put`), evicting the least recently used; ``maxsize=0`` disables it."""

    def __init__(self, maxsize: int = 512, max_bytes: int | None = None):
        if maxsize < 0:
            raise ValueError(f"cache size must be >= 0, got {maxsize}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._cost: dict[Hashable, int] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any | None:
        """The cached value (marked most recently used) or None."""
        if key is not None and key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def put(self, key: Hashable, value: Any, cost: int = 0) -> None:
        """Store ``value``; ``cost`` (bytes) counts against ``max_bytes``. A value costlier than the whole
        budget is not stored."""
        if self.maxsize == 0 or key is None or (self.max_bytes is not None and cost > self.max_bytes):
            return
        if key in self._data:
            self.bytes -= self._cost.pop(key)
        self._data[key] = value
        self._data.move_to_end(key)
        self._cost[key] = cost
        self.bytes += cost
        while len(self._data) > self.maxsize or (self.max_bytes is not None and self.bytes > self.max_bytes):
            old, _ = self._data.popitem(last=False)
            self.bytes -= self._cost.pop(old)

    def clear(self) -> None:
        self._data.clear()
        self._cost.clear()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data
