"""The CUDA pitfalls of the hot path, checked where they show on a CPU: the packed text tower asks the
device nothing back (no boolean-mask indexing, no ``.item()``), padding is a fixed number of device
operations whatever the number of rows, and the preprocessing thread pool gives the same pixels and the
same errors as one frame at a time. Every change keeps the outputs bit-identical to the code it replaced
(kept below as the reference)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from capreward.backbones.clip import preprocess_pool
from capreward.media import MediaError
from capreward.metrics.emscore import pad_stack, pad_stack_indexed

from conftest import random_video, write_mp4

# ops whose result the host must wait for (data-dependent sizes or a scalar read back)
SYNCING = {"aten.nonzero", "aten.masked_select", "aten._local_scalar_dense", "aten.item", "aten.is_nonzero",
           "aten.unique", "aten._unique2", "aten.masked_scatter"}


class OpLog(TorchDispatchMode):
    """Every aten op dispatched inside the block; ``syncs`` those that make the host wait on a device."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.ops.append(name)
        # indexing with a boolean mask counts its True entries on the device first
        boolean_index = name in ("aten.index", "aten.index_put_", "aten.index_put") and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] if len(args) > 1 else ()) or ()
            if t is not None)
        if name in SYNCING or boolean_index:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def old_text_tower_packed(bb, rows):
    """The packed text tower before: boolean-mask indexing twice per layer, a clone per row."""
    m = bb.model
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    n, longest = len(rows), int(lengths.max())
    real = torch.arange(longest)[None, :] < lengths[:, None]
    flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    positions = torch.cat([torch.arange(len(r)) for r in rows])
    cast = m.transformer.get_cast_dtype()
    x = m.token_embedding(flat).to(cast) + m.positional_embedding[positions].to(cast)
    causal = m.attn_mask is not None
    key_mask = None if causal else real[:, None, None, :]
    for block in m.transformer.resblocks:
        attn = block.attn
        heads, width = attn.num_heads, x.shape[-1]
        qkv = F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias)
        padded = qkv.new_zeros(n, longest, 3 * width)
        padded[real] = qkv
        q, k, v = padded.view(n, longest, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=causal)
        a = a.transpose(1, 2).reshape(n, longest, width)[real]
        x = x + block.ls_1(attn.out_proj(a))
        x = x + block.ls_2(block.mlp(block.ln_2(x)))
    x = m.ln_final(x)
    x = m.text_projection(x) if isinstance(m.text_projection, torch.nn.Linear) else x @ m.text_projection
    x = F.normalize(x.float(), dim=-1)
    return [(t.clone(), t[-1].clone()) for t in torch.split(x, lengths.tolist())]


def old_pad_stack(rows):
    width = max(r.shape[0] for r in rows)
    out = rows[0].new_zeros(len(rows), width, rows[0].shape[-1])
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
        mask[i, : r.shape[0]] = True
    return out, mask


CAPTIONS = ["a dog", "a man is cooking food in a kitchen", "two people talk on a bench near the river", "snow",
            "a red car drives down a long empty road at night"]


def rows_of(bb, captions):
    return [tuple(bb.token_ids(c)[0]) for c in captions]


def test_the_op_log_sees_boolean_mask_indexing():
    """The check below can fail: the old tower's boolean indexing is seen (twice per layer)."""
    x, mask = torch.randn(3, 4), torch.tensor([True, False, True])
    with OpLog() as log:
        x[mask]
    assert log.syncs == ["aten.index"]


def test_packed_text_tower_asks_the_device_nothing_back_and_gives_the_same_embeddings(tiny_backbone):
    bb = tiny_backbone
    rows = rows_of(bb, CAPTIONS)
    with torch.no_grad(), OpLog() as old_log:
        want = old_text_tower_packed(bb, rows)
    assert old_log.syncs.count("aten.index") + old_log.syncs.count("aten.index_put_") == 2 * len(bb.model.transformer.resblocks)
    with torch.no_grad(), OpLog() as log:
        got = bb._text_tower_packed(rows)
    assert log.syncs == []
    for (t, p), (wt, wp) in zip(got, want):
        assert torch.equal(t, wt) and torch.equal(p, wp)
    # the per-row results are views of one tensor per pass, not one copy per row
    assert len({t.untyped_storage().data_ptr() for t, _ in got}) == 1
    assert len({p.untyped_storage().data_ptr() for _, p in got}) == 1


@pytest.mark.parametrize("n", [1, 5, 40])
def test_pad_stack_is_a_fixed_number_of_ops_and_equals_the_row_loop(n):
    """The accelerator path (pad_stack_indexed, what pad_stack runs on a GPU) and the CPU path both equal
    the row loop; the accelerator path dispatches the same ops whatever the number of rows."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(int(torch.randint(1, 12, (1,), generator=g)), 6, generator=g) for _ in range(n)]
    with OpLog() as log:
        out, mask = pad_stack_indexed(rows)
    want_out, want_mask = old_pad_stack(rows)
    assert torch.equal(out, want_out) and torch.equal(mask, want_mask)
    cpu_out, cpu_mask = pad_stack(rows)
    assert torch.equal(cpu_out, want_out) and torch.equal(cpu_mask, want_mask)
    assert log.syncs == []
    two = [torch.randn(1, 6), torch.randn(3, 6)]
    with OpLog() as small:
        pad_stack_indexed(two)
    # the same ops whatever the number of rows (the row loop dispatched 2 per row)
    assert len(log.ops) == len(small.ops) or n == 1 or all(r.shape[0] == rows[0].shape[0] for r in rows)
    with OpLog() as loop:
        old_pad_stack(rows)
    assert len(loop.ops) >= 2 * n


def test_pad_stack_of_equal_lengths_and_of_weights():
    rows = [torch.randn(4, 3) for _ in range(3)]
    weights = [torch.rand(k, 1, dtype=torch.float64) for k in (2, 5, 1)]
    for fn in (pad_stack, pad_stack_indexed):
        for got, want in zip(fn(rows), old_pad_stack(rows)):
            assert torch.equal(got, want)
        for got, want in zip(fn(weights), old_pad_stack(weights)):
            assert torch.equal(got, want) and got.dtype == want.dtype


@pytest.fixture()
def workers(tiny_backbone):
    saved = tiny_backbone.preprocess_workers
    yield tiny_backbone
    tiny_backbone.preprocess_workers = saved


def test_preprocessing_pool_gives_the_same_pixels_and_embeddings(workers, tmp_path):
    """Frames of arrays and of a decoded file (decoded ahead in chunks of 4 while the pool preprocesses) and
    images: the same embeddings with 3 threads as with none."""
    bb = workers
    video = random_video(5, frames=9, height=50, width=70)
    clip = str(write_mp4(tmp_path / "clip.mp4", random_video(6, frames=10, height=48, width=64)))
    images = [random_video(s, frames=1, height=40 + s, width=60)[0] for s in range(6)]
    batch = bb.image_batch_size
    out = {}
    try:
        bb.image_batch_size = 4
        for k in (1, 3):
            bb.preprocess_workers = k
            bb.cache.clear()
            out[k] = (bb.pixels_of(video), bb.visual_embeddings([video, clip, video], kind="video", frames=6),
                      bb.visual_embeddings(images, kind="image"))
    finally:
        bb.image_batch_size = batch
        bb.cache.clear()
    assert torch.equal(out[1][0], out[3][0])
    for a, b in zip(out[1][1] + out[1][2], out[3][1] + out[3][2]):
        assert torch.equal(a, b)


def test_preprocessing_pool_names_the_first_unusable_image(workers, tmp_path):
    bb = workers
    bb.preprocess_workers = 3
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image at all")
    images = [random_video(1, frames=1)[0], str(bad), random_video(2, frames=1)[0], str(bad)]
    with pytest.raises(MediaError) as err:
        bb.visual_embeddings(images, kind="image")
    assert "broken.png" in str(err.value) and "[1]" in str(err.value) or "1" in str(err.value)
    bb.preprocess_workers = 1
    with pytest.raises(MediaError) as alone:
        bb.visual_embeddings(images, kind="image")
    assert str(err.value) == str(alone.value)


def test_preprocessing_pool_is_per_process(monkeypatch):
    pool = preprocess_pool(2)
    assert preprocess_pool(2) is pool
    pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: pid + 1)  # as in a forked child: its own pool
    assert preprocess_pool(2) is not pool
