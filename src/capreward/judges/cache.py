"""A key/value cache that grows in place, for batched decoding from a shared prefix.

transformers' ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache at every
decode step. With a prefix expanded to every row of a batch (32 captions x 700 prefix tokens) that copy
dominates the cost of a step. :class:`GrowingLayer` keeps a buffer with spare room along the sequence
axis, writes new keys/values into it and hands out views (attention kernels read strided views at the
same speed); when the room runs out it doubles.
"""

from __future__ import annotations

import inspect
from typing import Any
from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """One layer's keys and values in a buffer (batch, heads, capacity, head_dim) filled up to ``length``.

    ``reserve`` is the spare room allocated beyond the current length when the buffer is (re)allocated.
    """

    def __init__(self, reserve: int = 16):
        super().__init__()
        self.reserve = max(1, int(reserve))
        self.length = 0
        self._keys_buffer: Any = None  # tensors once filled (torch is read as Any)
        self._values_buffer: Any = None

    def _allocate(self, like: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        return like.new_empty(shape), like.new_empty(shape)

    def fill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start the layer from ``keys``/``values`` (batch, heads, length, head_dim), copying them."""
        length = keys.shape[-2]
        self._keys_buffer, self._values_buffer = self._allocate(keys, length + self.reserve)
        self._keys_buffer[..., :length, :].copy_(keys)
        self._values_buffer[..., :length, :].copy_(values)
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._set_length(length)

    def fill_rows(self, keys: torch.Tensor, values: torch.Tensor, rows: Sequence[int]) -> None:
        """Start the layer with row n = ``keys[rows[n]]`` (prefix sharing), copying row by row so that no
        expanded temporary is made."""
        length = keys.shape[-2]
        shape = (len(rows), *keys.shape[1:-2], length + self.reserve, keys.shape[-1])
        self._keys_buffer, self._values_buffer = keys.new_empty(shape), values.new_empty(shape)
        for n, r in enumerate(rows):
            self._keys_buffer[n, ..., :length, :].copy_(keys[r])
            self._values_buffer[n, ..., :length, :].copy_(values[r])
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._keys_buffer[..., :length, :]
        self.values = self._values_buffer[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new states after the current ones; returns views of all keys and values so far."""
        if self._keys_buffer is None:
            self.fill(key_states, value_states)
            return self.keys, self.values
        end = self.length + key_states.shape[-2]
        capacity = self._keys_buffer.shape[-2]
        if end > capacity:
            keys, values = self._allocate(self._keys_buffer, max(end + self.reserve, 2 * capacity))
            keys[..., : self.length, :].copy_(self.keys)
            values[..., : self.length, :].copy_(self.values)
            self._keys_buffer, self._values_buffer = keys, values
        self._keys_buffer[..., self.length : end, :].copy_(key_states)
        self._values_buffer[..., self.length : end, :].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        self._keys_buffer = self._values_buffer = None
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove and self._keys_buffer is not None:
            self._set_length(max(0, self.length + tokens_to_remove))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._keys_buffer is not None:
            keys, values = self.keys.index_select(0, indices.to(self.device)), self.values.index_select(0, indices.to(self.device))
            self.fill(keys, values)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._keys_buffer is not None:
            self.fill(self.keys.repeat_interleave(repeats, dim=0), self.values.repeat_interleave(repeats, dim=0))


def growing_cache(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None,
    num_layers: int,
    reserve: int,
    rows: Sequence[int] | None = None,
) -> Any:
    """A ``DynamicCache`` of :class:`GrowingLayer` s, started from ``layers`` [(keys, values), ...] when
    given (each (batch, heads, length, head_dim), copied; with ``rows``, row n of the new cache is row
    ``rows[n]`` of the given one), else empty for ``num_layers`` layers."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer(reserve) for _ in range(num_layers if layers is None else len(layers))]
    cache.layer_class_to_replicate = None
    if layers is not None:
        for layer, (keys, values) in zip(cache.layers, layers):
            if rows is None:
                layer.fill(keys, values)
            else:
                layer.fill_rows(keys, values, rows)
    return cache


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model.forward`` takes its key/value cache, read from the installed
    transformers' own signature: ``"cache"`` where the forward declares it (transformers 5.24 renamed
    ``past_key_values`` to ``cache`` and deprecated the old name for removal in 5.40), else
    ``"past_key_values"`` (transformers 4.57 - 5.23). The same name is the output's field holding the
    updated cache (:func:`output_cache`).

    ``inspect.signature`` follows the ``functools.wraps`` of transformers' ``deprecate_kwarg`` decorator
    to the real parameters. A forward that takes neither by name (only ``**kwargs``) gets
    ``"past_key_values"``, the name every transformers release before 5.24 reads from its kwargs.
    """
    forward = getattr(model, "forward", model)
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any, keyword: str) -> Any:
    """The updated cache a forward returned, read under ``keyword`` (:func:`cache_keyword`): reading
    ``output.past_key_values`` on transformers >= 5.24 goes through a deprecated alias that logs."""
    return getattr(output, keyword)
