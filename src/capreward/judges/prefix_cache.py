"""A key/value cache whose shared prefix is held once per image, and the attention that reads it.

A GRPO group's prompts share their beginning: the system text, the image (hundreds of image tokens) and
the prompt text before the caption. :meth:`~capreward.judges.local.LocalJudge.start` runs that prefix once
per distinct image; this module keeps its keys and values **once per image** for the whole batch, instead
of a copy in every row (32 captions x 700 prefix tokens x 32 layers is 13 GiB at 7B in float16), and
gives each row only its own tokens: the rest of its prompt and its answer.

- :class:`SharedPrefixCache`: a transformers ``DynamicCache`` whose layers (:class:`SharedPrefixLayer`)
  hold the prefix (U, kv heads, P, head dim) of the U images and a **static** buffer (N, kv heads, C,
  head dim) of the N rows' own tokens, written at a device-side cursor: a decode step has fixed shapes
  and no host value in it, so it can be captured in a CUDA graph (:mod:`capreward.judges.decode_graphs`).
- :func:`shared_prefix_attention`: the attention over [prefix of the row's image, the row's own tokens].
  Queries of the rows of one image are stacked, so each image's prefix is read **once per step for all
  its rows** (one batched matrix product per image group), and the softmax runs over the prefix and the
  row's columns together (exactly the softmax of plain attention over the concatenation).
- :func:`shared_attention`: the context in which a model's forward uses that attention. It switches the
  text model's ``attn_implementation`` to this module's registered function for the duration of the
  forward only (the model's own implementation, SDPA by default, runs everything else: the prefix
  prefill, teacher forcing, a user's ``generate``), and checks that every layer read the shared prefix.

Rows of an image are laid out in *slots*: image u owns slots ``u * G .. u * G + G - 1`` (G the largest
number of rows of one image); a batch whose rows come grouped by image in equal groups (a GRPO batch)
is its own slot layout and needs no gather at all.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, cast
from collections.abc import Iterator, Sequence

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer

#: The keyword under which the forward carries the cache to :func:`shared_prefix_attention`.
ATTENTION_KWARG = "capreward_shared_prefix"
#: The ``attn_implementation`` name registered with transformers for the shared-prefix forwards.
IMPLEMENTATION = "capreward_shared_prefix"


class SlotLayout:
    """Where each row's queries sit among the images' slots (see the module docstring).

    Args:
        row_image: the image of each row (ints in ``[0, num_images)``).
        num_images: U, the images whose prefixes the cache holds.
        device: where the index tensors live.
    """

    def __init__(self, row_image: Sequence[int], num_images: int, device: torch.device):
        rows = [int(u) for u in row_image]
        if any(u < 0 or u >= num_images for u in rows):
            raise ValueError(f"row images {sorted(set(rows))} outside the {num_images} prefixes")
        counts = [0] * num_images
        for u in rows:
            counts[u] += 1
        self.row_image = rows
        self.num_images = int(num_images)
        self.group = max(1, max(counts, default=1))
        slots = self.num_images * self.group
        self.identity = len(rows) == slots and rows == [n // self.group for n in range(len(rows))]
        self.slot_row: torch.Tensor | None = None
        self.row_slot: torch.Tensor | None = None
        if not self.identity:
            filler = 0
            slot_row = [filler] * slots
            row_slot = []
            seen = [0] * num_images
            for n, u in enumerate(rows):
                slot = u * self.group + seen[u]
                seen[u] += 1
                slot_row[slot] = n
                row_slot.append(slot)
            self.slot_row = torch.tensor(slot_row, dtype=torch.long, device=device)
            self.row_slot = torch.tensor(row_slot, dtype=torch.long, device=device)

    def to_slots(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) per row -> (U, G, ...) per slot (empty slots repeat some row: their results are never read)."""
        if not self.identity:
            x = x.index_select(0, self.slot_row)
        return x.view(self.num_images, self.group, *x.shape[1:])

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """(U * G, ...) per slot -> (N, ...) per row."""
        return x if self.identity else x.index_select(0, self.row_slot)


class SharedPrefixLayer(DynamicLayer):
    """One layer: the shared prefix ``prefix_keys``/``prefix_values`` (U, kv heads, P, head dim; None for
    no prefix) and the rows' own keys/values in a buffer (N, kv heads, capacity, head dim) written at
    the cache's device-side cursor. :meth:`update` returns the whole buffers (static shapes); which
    columns are real is the cache's ``valid`` mask."""

    def __init__(self, cache: SharedPrefixCache, prefix_keys: torch.Tensor | None, prefix_values: torch.Tensor | None):
        super().__init__()
        self.cache = cache
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        self.keys_buffer: Any = None  # a tensor once allocated (torch is read as Any)
        self.values_buffer: Any = None
        self.is_initialized = True
        self.reads = 0  # forwards whose attention read this layer (checked by shared_attention)

    @property
    def prefix_length(self) -> int:
        return 0 if self.prefix_keys is None else int(self.prefix_keys.shape[-2])

    def allocate(self, like: torch.Tensor, capacity: int) -> None:
        """Empty buffers shaped as ``like`` (N, kv heads, *, head dim) with ``capacity`` columns."""
        shape = (*like.shape[:-2], int(capacity), like.shape[-1])
        self.keys_buffer, self.values_buffer = like.new_zeros(shape), like.new_zeros(shape)
        self.dtype, self.device = like.dtype, like.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new tokens' keys/values at the cursor; returns the whole row buffers."""
        cache = self.cache
        if self.keys_buffer is None:
            self.allocate(key_states, cache.capacity)
        index = cache.write_index(key_states.shape[-2])
        self.keys_buffer.index_copy_(2, index, key_states.to(self.keys_buffer.dtype))
        self.values_buffer.index_copy_(2, index, value_states.to(self.values_buffer.dtype))
        self.keys, self.values = self.keys_buffer, self.values_buffer
        return self.keys_buffer, self.values_buffer

    def get_seq_length(self) -> int:
        return self.prefix_length + self.cache.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_length + self.cache.length + query_length, 0

    def get_max_cache_shape(self) -> int:
        return self.prefix_length + self.cache.capacity

    def nbytes(self) -> tuple[int, int]:
        """(bytes of the shared prefix, bytes of the row buffers)."""
        prefix = sum(t.numel() * t.element_size() for t in (self.prefix_keys, self.prefix_values) if t is not None)
        rows = sum(t.numel() * t.element_size() for t in (self.keys_buffer, self.values_buffer) if t is not None)
        return prefix, rows


class SharedPrefixCache(DynamicCache):
    """The key/value cache of a batch of N rows on U shared prefixes (see the module docstring).

    Args:
        prefix: per layer ``(keys, values)`` of the prefixes (U, kv heads, P, head dim), or None (no
            shared prefix; then ``num_layers`` must be given).
        row_image: the image (prefix) of each row.
        capacity: columns of each row's own buffer (the rest of its prompt plus its answer); it grows
            (doubling) when a forward needs more.
        device: where the row state lives.
        num_layers: layers of the model (needed without a prefix).

    ``valid`` (N, capacity) marks the columns that hold a row's real tokens; ``cursor`` (1,) is the next
    column to write, on the device (a decode step reads it there: no host value in the step); ``length``
    is the same number on the host, for bookkeeping only.
    """

    def __init__(
        self,
        prefix: Sequence[tuple[torch.Tensor, torch.Tensor]] | None,
        row_image: Sequence[int],
        capacity: int,
        device: torch.device,
        num_layers: int | None = None,
    ):
        super().__init__()
        if prefix is None and num_layers is None:
            raise ValueError("a cache without a prefix needs num_layers")
        if prefix is not None and len(prefix) == 0:
            raise ValueError("an empty prefix list")
        layers: list[tuple[Any, Any]] = list(prefix) if prefix is not None else [(None, None)] * int(cast(int, num_layers))
        self.layers = [SharedPrefixLayer(self, k, v) for k, v in layers]
        self.layer_class_to_replicate = None
        self.device = torch.device(device)
        num_images = int(layers[0][0].shape[0]) if prefix is not None else 1
        if prefix is None:
            row_image = [0] * len(row_image)
        self.slots = SlotLayout(row_image, num_images, self.device)
        self.batch = len(self.slots.row_image)
        self.capacity = max(1, int(capacity))
        self.length = 0
        self.cursor = torch.zeros(1, dtype=torch.long, device=self.device)
        self.valid = torch.zeros((self.batch, self.capacity), dtype=torch.bool, device=self.device)
        self.query_mask: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------ facts
    @property
    def prefix_length(self) -> int:
        return self.layers[0].prefix_length

    @property
    def has_prefix(self) -> bool:
        return self.layers[0].prefix_keys is not None

    @property
    def row_image(self) -> list[int]:
        return list(self.slots.row_image)

    def nbytes(self) -> dict[str, int]:
        """Bytes held: ``prefix`` (the shared prefixes, once per image), ``rows`` (the rows' own buffers
        at their capacity) and ``total``."""
        prefix = rows = 0
        for layer in self.layers:
            p, r = layer.nbytes()
            prefix, rows = prefix + p, rows + r
        return {"prefix": prefix, "rows": rows, "total": prefix + rows}

    # ------------------------------------------------------------------------------- writing
    def write_index(self, count: int) -> torch.Tensor:
        """Device column indices of ``count`` new tokens: the cursor, then the next ones."""
        if count == 1:
            return self.cursor
        return self.cursor + torch.arange(count, device=self.device)

    def reserve(self, count: int, spare: int = 16) -> bool:
        """Make room for ``count`` more columns (reallocating with ``spare`` extra, at least doubling);
        returns whether the buffers moved (a captured decode graph is then stale)."""
        if self.length + count <= self.capacity:
            return False
        capacity = max(self.length + count + spare, 2 * self.capacity)
        valid = self.valid.new_zeros((self.batch, capacity))
        valid[:, : self.capacity].copy_(self.valid)
        self.valid = valid
        for layer in self.layers:
            if layer.keys_buffer is not None:
                old_k, old_v = layer.keys_buffer, layer.values_buffer
                layer.allocate(old_k, capacity)
                layer.keys_buffer[..., : self.length, :].copy_(old_k[..., : self.length, :])
                layer.values_buffer[..., : self.length, :].copy_(old_v[..., : self.length, :])
                layer.keys, layer.values = layer.keys_buffer, layer.values_buffer
        self.capacity = capacity
        return True

    def open_rows(self, real: torch.Tensor) -> torch.Tensor:
        """Before a forward of L = ``real.shape[1]`` tokens at the cursor: mark the columns of the real
        ones (``real`` (N, L) bool: False for left padding) and return the query mask (N, 1, L,
        capacity): a query sees the real columns up to its own (causal)."""
        count = int(real.shape[1])
        cols = torch.arange(self.capacity, device=self.device)
        new = (cols >= self.length) & (cols < self.length + count)
        real_cols = torch.zeros_like(self.valid)
        real_cols[:, self.length : self.length + count] = real.to(self.device)
        self.valid = self.valid | (real_cols & new)
        query_cols = self.length + torch.arange(count, device=self.device)
        mask = self.valid[:, None, None, :] & (cols[None, None, None, :] <= query_cols[None, None, :, None])
        self.query_mask = mask
        return mask

    def open_step(self) -> torch.Tensor:
        """Before a one-token forward (every row): mark the cursor's column real, on the device (no host
        value: capturable), and return the query mask (N, 1, 1, capacity), a view of ``valid``."""
        self.valid.index_fill_(1, self.cursor, True)
        self.query_mask = self.valid[:, None, None, :]
        return self.query_mask

    def advance(self, count: int, device_side: bool = True) -> None:
        """After a forward of ``count`` tokens: move the cursor (on the device unless a captured graph
        moves it itself) and the host length."""
        if device_side:
            self.cursor.add_(count)
        self.length += count

    # ------------------------------------------------------------------------------- rows
    def select_rows(self, rows: Sequence[int], spare: int) -> SharedPrefixCache:
        """A new cache of the given rows (repeats allowed): their own buffers copied (only their used
        columns, plus ``spare``), the prefixes shared (not copied)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        prefix = [(layer.prefix_keys, layer.prefix_values) for layer in self.layers] if self.has_prefix else None
        row_image = [self.slots.row_image[int(r)] for r in rows]
        out = SharedPrefixCache(prefix, row_image, self.length + max(1, int(spare)), self.device,
                                num_layers=len(self.layers))
        out.length = self.length
        out.cursor.fill_(self.length)
        out.valid[:, : self.length].copy_(self.valid.index_select(0, index)[:, : self.length])
        for new, old in zip(out.layers, self.layers):
            if old.keys_buffer is None:
                continue
            keys = old.keys_buffer.index_select(0, index)[..., : self.length, :]
            values = old.values_buffer.index_select(0, index)[..., : self.length, :]
            new.allocate(keys, out.capacity)
            new.keys_buffer[..., : self.length, :].copy_(keys)
            new.values_buffer[..., : self.length, :].copy_(values)
            new.keys, new.values = new.keys_buffer, new.values_buffer
        return out

    # ---------------------------------------------------------------------- the transformers Cache API
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix_length + self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.layers[layer_idx].get_mask_sizes(query_length)

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_max_cache_shape()

    @property
    def is_compileable(self) -> bool:
        return False

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a shared-prefix cache is not cropped: select rows instead")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("a shared-prefix cache is not reordered in place: select rows instead")


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` (N, heads, L, head dim) over [the row's image prefix, the row's own
    ``key``/``value`` (N, kv heads, C, head dim)] as transformers' attention interface calls it.

    Scores are computed as plain (eager) attention computes them, ``q @ k^T * scaling`` in the model's
    dtype, masked with the dtype's minimum and soft-maxed in float32 over the prefix and the row's
    columns together; each image's prefix is multiplied with the stacked queries of all its rows.
    Called without the shared cache (another thread using the model meanwhile), it runs the model's
    own implementation."""
    cache = kwargs.get(ATTENTION_KWARG)
    if cache is None:
        return _original_attention(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                           **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("sliding-window attention layers cannot read a shared prefix")
    layer: SharedPrefixLayer = cache.layers[module.layer_idx]
    layer.reads += 1
    n, heads, length, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    m = rep * length
    # head h reads kv head h // rep (transformers' repeat_kv): (N, kv, rep, L, d) -> (N, kv, rep * L, d)
    q = query.reshape(n, kv_heads, m, dim)
    own = torch.matmul(q, key.transpose(-1, -2)) * scaling  # (N, kv, M, C)
    mask = cache.query_mask  # (N, 1, L, C) bool
    minimum = torch.finfo(own.dtype).min
    own = own.view(n, kv_heads, rep, length, columns).masked_fill(~mask[:, :, None], minimum).view(n, kv_heads, m, columns)
    slots = cache.slots
    if layer.prefix_keys is None:
        weights = torch.softmax(own, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(weights, value)
    else:
        pk, pv = layer.prefix_keys, layer.prefix_values
        u, g, p = slots.num_images, slots.group, pk.shape[-2]
        qs = slots.to_slots(q).transpose(1, 2).reshape(u, kv_heads, g * m, dim)  # each image's rows stacked
        shared = torch.matmul(qs, pk.transpose(-1, -2)) * scaling  # (U, kv, G * M, P)
        shared = slots.to_rows(shared.view(u, kv_heads, g, m, p).transpose(1, 2).reshape(u * g, kv_heads, m, p))
        weights = torch.softmax(torch.cat([shared, own], dim=-1), dim=-1, dtype=torch.float32).to(query.dtype)
        w_shared, w_own = weights.split([p, columns], dim=-1)
        out = torch.matmul(w_own, value)  # (N, kv, M, d)
        ws = slots.to_slots(w_shared).transpose(1, 2).reshape(u, kv_heads, g * m, p)
        from_prefix = torch.matmul(ws, pv).view(u, kv_heads, g, m, dim).transpose(1, 2).reshape(u * g, kv_heads, m, dim)
        out = out + slots.to_rows(from_prefix)
    out = out.view(n, heads, length, dim).transpose(1, 2).contiguous()
    return out, None


AttentionInterface.register(IMPLEMENTATION, shared_prefix_attention)

_ORIGINAL: dict[int, str] = {}  # id(text config) -> its own implementation while a shared forward runs
_SWITCH_LOCK = threading.Lock()
_DEPTH: dict[int, int] = {}


def _original_attention(module: torch.nn.Module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = _ORIGINAL.get(id(module.config), "sdpa")
    if name in (None, "eager") or name not in ALL_ATTENTION_FUNCTIONS:
        from transformers.models.llama.modeling_llama import eager_attention_forward

        return eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def text_configs(model: Any) -> list[Any]:
    """The configuration objects the text model's attention layers read their implementation from."""
    seen: dict[int, Any] = {}
    root = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    seen[id(root)] = root
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(module, "layer_idx") and hasattr(module, "is_causal"):
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextlib.contextmanager
def shared_attention(model: Any, cache: SharedPrefixCache) -> Iterator[dict]:
    """A forward of ``model`` inside this context reads ``cache``'s shared prefix: yields the keyword
    arguments to pass to the forward. The text model's attention implementation is switched to
    :func:`shared_prefix_attention` for the duration (and restored); on exit, every layer must have
    read the cache once (else the model does not route attention through transformers' interface, and
    a RuntimeError says so rather than a silently wrong result)."""
    configs = text_configs(model)
    with _SWITCH_LOCK:
        for config in configs:
            key = id(config)
            if _DEPTH.get(key, 0) == 0:
                _ORIGINAL[key] = config._attn_implementation
                config._attn_implementation_internal = IMPLEMENTATION
            _DEPTH[key] = _DEPTH.get(key, 0) + 1
    before = [layer.reads for layer in cache.layers]
    try:
        yield {ATTENTION_KWARG: cache}
    finally:
        with _SWITCH_LOCK:
            for config in configs:
                key = id(config)
                _DEPTH[key] -= 1
                if _DEPTH[key] == 0:
                    config._attn_implementation_internal = _ORIGINAL.pop(key)
                    del _DEPTH[key]
    missed = [i for i, (layer, b) in enumerate(zip(cache.layers, before)) if layer.reads != b + 1]
    if missed:
        raise RuntimeError(
            f"layers {missed[:8]} of the judge did not read the shared prefix through transformers' attention interface; "
            "this model cannot share its prefix (run the judge with share_prefix=False)"
        )
