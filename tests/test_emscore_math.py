"""EMScore and CLIP-S formulas on hand-built embeddings (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from capreward.metrics.clipscore import clip_s, ref_clip_s, reference_similarity
from capreward.metrics.emscore import coarse_score, f_measure, greedy_match, pad_stack, video_embedding
from capreward.metrics.idf import idf_from_mapping, idf_from_rows
from capreward.scorers.emscore import group_max
from capreward.scorers.results import MatchScores


def unit(*xs):
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.norm()


def test_greedy_match_by_hand():
    # 3 candidate tokens, 2 frames, 2-d embeddings.
    e0, e1 = unit(1, 0), unit(0, 1)
    d = unit(1, 1)
    cand = torch.stack([e0, d, e1])[None]
    frames = torch.stack([e0, e1])[None]
    w = torch.tensor([[1.0, 2.0, 3.0]])
    fine = greedy_match(cand, torch.ones(1, 3, dtype=torch.bool), w, frames, torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 2))
    s = 1 / math.sqrt(2)
    # token maxima: e0 -> 1 (frame 0), d -> s (tie, frame 0), e1 -> 1 (frame 1)
    p = (1 * 1 + 2 * s + 3 * 1) / 6
    r = (1 + 1) / 2  # each frame's best token is an exact match
    assert fine.p.item() == pytest.approx(p, abs=1e-6)
    assert fine.r.item() == pytest.approx(r, abs=1e-6)
    assert fine.f.item() == pytest.approx(2 * p * r / (p + r), abs=1e-6)
    assert fine.best_target.tolist() == [[0, 0, 1]]


def test_padding_never_enters_a_max_even_when_all_similarities_are_negative():
    # Every real similarity is negative: a zero-multiplied pad would clamp the maxima to 0.
    a, b = unit(1, 0), unit(-1, 0.2)
    cand = torch.stack([a, a, torch.zeros(2)])[None]
    cand_mask = torch.tensor([[True, True, False]])
    frames = torch.stack([b, torch.zeros(2)])[None]
    frame_mask = torch.tensor([[True, False]])
    fine = greedy_match(cand, cand_mask, torch.ones(1, 3), frames, frame_mask, frame_mask.float())
    cos = float(a @ b)
    assert cos < 0
    assert fine.p.item() == pytest.approx(cos, abs=1e-6)
    assert fine.r.item() == pytest.approx(cos, abs=1e-6)
    assert fine.best_target.tolist() == [[0, 0, -1]]


def test_padding_width_does_not_change_scores():
    torch.manual_seed(0)
    cand = torch.nn.functional.normalize(torch.randn(1, 4, 8), dim=-1)
    frames = torch.nn.functional.normalize(torch.randn(1, 3, 8), dim=-1)
    w = torch.rand(1, 4)
    base = greedy_match(cand, torch.ones(1, 4, dtype=torch.bool), w, frames, torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 3))
    cand_p = torch.cat([cand, torch.randn(1, 5, 8)], 1)
    frames_p = torch.cat([frames, torch.randn(1, 2, 8)], 1)
    cm = torch.tensor([[True] * 4 + [False] * 5])
    fm = torch.tensor([[True] * 3 + [False] * 2])
    padded = greedy_match(cand_p, cm, torch.cat([w, torch.rand(1, 5)], 1), frames_p, fm, fm.float())
    for x, y in ((base.p, padded.p), (base.r, padded.r), (base.f, padded.f)):
        assert torch.allclose(x, y, atol=1e-6)


def test_idf_weighting_of_precision_and_recall():
    e0, e1 = unit(1, 0), unit(0, 1)
    cand = torch.stack([e0, e1])[None]
    target = torch.stack([e0, unit(1, 1)])[None]
    ones = torch.ones(1, 2, dtype=torch.bool)
    fine = greedy_match(cand, ones, torch.tensor([[3.0, 1.0]]), target, ones, torch.tensor([[1.0, 4.0]]))
    s = 1 / math.sqrt(2)
    assert fine.p.item() == pytest.approx((3 * 1 + 1 * s) / 4, abs=1e-6)
    assert fine.r.item() == pytest.approx((1 * 1 + 4 * s) / 5, abs=1e-6)


def test_video_embedding_and_coarse():
    frames = torch.stack([unit(1, 0), unit(0, 1), torch.zeros(2)])[None]
    mask = torch.tensor([[True, True, False]])
    fv = video_embedding(frames, mask)
    assert torch.allclose(fv, unit(1, 1)[None], atol=1e-6)
    assert coarse_score(unit(1, 0)[None], fv).item() == pytest.approx(1 / math.sqrt(2), abs=1e-6)


def test_f_measure_zero_guard():
    assert f_measure(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    assert f_measure(torch.tensor([0.5]), torch.tensor([0.25])).item() == pytest.approx(2 * 0.125 / 0.75)


def test_match_scores_full_and_combined():
    a = MatchScores.from_parts(torch.tensor([0.2]), torch.tensor([0.4]), torch.tensor([0.6]), torch.tensor([0.48]))
    assert a.full_p.item() == pytest.approx(0.3) and a.full_r.item() == pytest.approx(0.4)
    b = MatchScores.from_parts(torch.tensor([0.6]), torch.tensor([0.8]), torch.tensor([0.2]), torch.tensor([0.32]))
    c = MatchScores.average(a, b)
    assert c.coarse.item() == pytest.approx(0.4)
    assert c.fine_f.item() == pytest.approx(0.40)
    assert c.full_f.item() == pytest.approx((0.40 + 0.4) / 2)


def test_group_max_over_references():
    values = torch.tensor([0.1, 0.7, -0.2, -0.5, 0.3])
    owner = torch.tensor([0, 0, 1, 1, 2])
    assert group_max(values, owner, 3).tolist() == pytest.approx([0.7, -0.2, 0.3])


def test_idf_reproduces_released_procedure():
    eos = 9
    # three padded rows (pad id 0), SOS = 8, EOS = 9
    rows = [[8, 1, 2, 9, 0, 0], [8, 1, 3, 9, 0, 0], [8, 4, 4, 4, 4, 9]]
    table = idf_from_rows(rows, eos_id=eos)
    n = 3
    df = {8: 3, 1: 2, 2: 1, 9: 3, 0: 2, 3: 1, 4: 1}
    expected = {t: math.log((n + 1) / (c + 1)) for t, c in df.items()}
    expected[eos] = sum(expected.values()) / len(expected)  # EOS's own pre-fix value (0) included
    assert table.weights == pytest.approx(expected)
    assert table.default == pytest.approx(math.log(n + 1))
    vec = table.vector(12)
    assert vec[5].item() == pytest.approx(math.log(4))
    assert vec[2].item() == pytest.approx(math.log(2))


def test_idf_from_mapping_default():
    t = idf_from_mapping({1: 0.5, 2: 2.0})
    assert t.default == 2.0
    assert idf_from_mapping({1: 0.5}, default=0.1).vector(3).tolist() == pytest.approx([0.1, 0.5, 0.1])
    with pytest.raises(ValueError):
        idf_from_mapping({})


def test_clip_s_and_ref_clip_s_by_hand():
    img = torch.stack([unit(1, 0), unit(1, 0)])
    txt = torch.stack([unit(1, 1), unit(-1, 0.1)])
    s = clip_s(img, txt, w=2.5)
    assert s.tolist() == pytest.approx([2.5 / math.sqrt(2), 0.0])
    refs, mask = pad_stack([torch.stack([unit(1, 1), unit(0, 1)]), torch.stack([unit(-1, 0.1)])])
    sim = reference_similarity(txt, refs, mask)
    assert sim.tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    h = ref_clip_s(s, sim)
    a = 2.5 / math.sqrt(2)
    assert h.tolist() == pytest.approx([2 * a / (a + 1), 0.0], abs=1e-6)


def test_idf_from_mapping_honours_a_defaultdicts_default():
    from collections import defaultdict

    released = defaultdict(lambda: math.log(5), {1: 0.2, 2: 1.5})
    assert idf_from_mapping(released).default == pytest.approx(math.log(5))
    assert idf_from_mapping(released, default=0.3).default == pytest.approx(0.3)
    assert idf_from_mapping(defaultdict(None, {1: 0.2, 2: 1.5})).default == 1.5


# ------------------------------------------------------------------ backbone helpers (pure logic)
def test_lru_cache_bounds_entries_and_bytes():
    from capreward.backbones import LRUCache

    c = LRUCache(3, max_bytes=100)
    for k in "abc":
        c.put(k, k, cost=30)
    assert len(c) == 3 and c.bytes == 90
    c.get("a")
    c.put("d", "d", cost=30)  # over 100 bytes: the least recently used ("b") goes
    assert "b" not in c and "a" in c and c.bytes == 90
    c.put("a", "A", cost=60)  # replacing an entry re-counts its cost
    assert c.get("a") == "A" and c.bytes <= 100
    c.put("huge", "x", cost=101)
    assert "huge" not in c
    c.clear()
    assert c.bytes == 0 and len(c) == 0


def test_plan_text_batches_trades_padding_against_per_batch_overhead():
    from capreward.backbones.clip import plan_text_batches

    assert plan_text_batches([5, 5, 5, 5], max_batch=2, overhead_tokens=0) == [[0, 1], [2, 3]]
    # without overhead, equal lengths stay together and a long row is split off
    assert plan_text_batches([4, 4, 40], max_batch=8, overhead_tokens=0) == [[0, 1], [2]]
    # a large overhead merges everything up to max_batch
    assert plan_text_batches([4, 4, 40], max_batch=8, overhead_tokens=1000) == [[0, 1, 2]]
    assert plan_text_batches([], max_batch=4) == []
    with pytest.raises(ValueError):
        plan_text_batches([3, 2], max_batch=4)


def test_plan_packed_passes_bounds_rows_and_tokens():
    from capreward.backbones.clip import plan_packed_passes

    assert plan_packed_passes([3, 3, 3, 3, 3], max_rows=2, max_tokens=100) == [[0, 1], [2, 3], [4]]
    assert plan_packed_passes([3, 4, 5, 90], max_rows=10, max_tokens=10) == [[0, 1], [2], [3]]


def test_idf_weights_must_be_finite_and_non_negative():
    """Round 3: idf weights of nan, inf or below 0 were accepted."""
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="idf weights must be finite and >= 0"):
            idf_from_mapping({1: 0.5, 2: bad})
        with pytest.raises(ValueError, match="default weight"):
            idf_from_mapping({1: 0.5}, default=bad)
    assert idf_from_mapping({1: 0.0}, default=0.0).vector(2).tolist() == [0.0, 0.0]
