"""EMScore through the full pipeline on the tiny CLIP: forms, caching, invariances, references,
idf, truncation and differentiable soft captions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from capreward import EMScore
from capreward.media import MediaError, load_video, media_key
from capreward.metrics.idf import idf_from_rows

from conftest import random_video, write_mp4

CAPTIONS = [
    "a man is cooking food in a kitchen",
    "a dog runs across the grass",
    "two people are dancing on a stage",
    "a red car drives down a wet road at night",
    "someone slices an onion",
    "a cat",
]
REFS = [["a person cooks dinner", "a chef prepares a meal"], ["a dog playing outside"], ["people dance"],
        ["a car on a road", "traffic at night", "a red vehicle"], ["a cook cuts vegetables"], ["a small cat sits"]]
CORPUS = [r for rs in REFS for r in rs] + ["a man", "a woman walks a dog in the park"]


@pytest.fixture(scope="module")
def videos():
    return [random_video(seed, frames=8 + seed) for seed in range(3)]


@pytest.fixture(scope="module")
def em(tiny_backbone):
    return EMScore(backbone=tiny_backbone, idf=CORPUS)


def assert_scores_close(a, b, atol=1e-5):
    for part in ("video", "reference", "combined"):
        pa, pb = getattr(a, part), getattr(b, part)
        assert (pa is None) == (pb is None), part
        if pa is not None:
            for name, t in pa.as_dict().items():
                assert torch.allclose(t, getattr(pb, name), atol=atol), f"{part}.{name}: {t} vs {getattr(pb, name)}"
    assert torch.allclose(a.score, b.score, atol=atol)


def test_path_array_pil_and_tensor_give_identical_scores(em, tmp_path):
    clip = random_video(7, frames=20)
    path = write_mp4(tmp_path / "c.mp4", clip)
    decoded = load_video(path, frames=None)  # what the file really holds after lossy encoding
    forms = [str(path), decoded, torch.from_numpy(decoded), [Image.fromarray(f) for f in decoded]]
    results = [em.score(CAPTIONS[:3], videos=[form] * 3) for form in forms]
    for r in results[1:]:
        assert_scores_close(results[0], r, atol=0)


def test_group_encodes_its_video_once_and_cache_hits_are_identical(tiny_backbone, videos):
    em = EMScore(backbone=tiny_backbone, idf=False)
    tiny_backbone.cache.clear()
    calls = []
    original = tiny_backbone.encode_pixels
    tiny_backbone.encode_pixels = lambda pixels: calls.append(pixels.shape[0]) or original(pixels)
    try:
        first = em.score(CAPTIONS, videos=[videos[0]] * 6)
        assert calls == [10]  # one batch: the 10 sampled frames of the one distinct video
        second = em.score(CAPTIONS, videos=[videos[0]] * 6)
        assert calls == [10]  # nothing re-encoded
        assert tiny_backbone.cache.hits >= 1
    finally:
        del tiny_backbone.encode_pixels
    assert_scores_close(first, second, atol=0)
    cold = EMScore(backbone=tiny_backbone, idf=False)
    tiny_backbone.cache.clear()
    assert_scores_close(first, cold.score(CAPTIONS, videos=[videos[0]] * 6), atol=0)


def test_explicit_video_ids_key_the_cache(tiny_backbone, videos):
    em = EMScore(backbone=tiny_backbone)
    tiny_backbone.cache.clear()
    em.score(CAPTIONS[:2], videos=[videos[0], videos[1]], video_ids=["v0", "v1"])
    assert ("video", 10, media_key(videos[0], "v0")) in tiny_backbone.cache  # the id narrows the content key


def test_real_clips_score(em, real_clips):
    caps = ["a man is cooking", "a person is talking to the camera"]
    res = em.score([c for _ in real_clips for c in caps], videos=[str(p) for p in real_clips for _ in caps])
    assert torch.isfinite(res.score).all()
    for part in res.video.as_dict().values():
        assert ((part >= -1) & (part <= 1)).all()
    align = res.alignment[0]
    assert align.tokens[0] == "<sos>" and align.tokens[-1] == "<eos>" and "cooking" in align.tokens
    assert all(0 <= f < 10 for f in align.best_frame)


def sample_pool(videos):
    return [(CAPTIONS[i], videos[i % 3], REFS[i]) for i in range(len(CAPTIONS))]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_batch_size_order_and_composition_do_not_change_scores(em, videos, data):
    pool = sample_pool(videos)
    idx = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=8))
    batch_size = data.draw(st.sampled_from([1, 2, 3, 64]))
    caps = [pool[i][0] for i in idx]
    vids = [pool[i][1] for i in idx]
    refs = [pool[i][2] for i in idx]
    scorer = EMScore(backbone=em.backbone, idf=CORPUS, batch_size=batch_size)
    batched = scorer.score(caps, videos=vids, references=refs)
    for j, i in enumerate(idx):
        single = em.score([caps[j]], videos=[vids[j]], references=[refs[j]])
        for part in ("video", "reference", "combined"):
            for name, t in getattr(single, part).as_dict().items():
                assert getattr(batched, part).as_dict()[name][j].item() == pytest.approx(t.item(), abs=1e-5)


def test_deterministic_across_fresh_models(videos):
    from capreward.testing import tiny_clip_factory

    a = EMScore(model=tiny_clip_factory(3), idf=CORPUS).score(CAPTIONS, videos=[videos[0]] * 6)
    b = EMScore(model=tiny_clip_factory(3), idf=CORPUS).score(CAPTIONS, videos=[videos[0]] * 6)
    assert_scores_close(a, b, atol=0)


def test_trimmed_text_equals_full_context(tiny_backbone, videos):
    from capreward.backbones import CLIPBackbone

    full = CLIPBackbone.__new__(CLIPBackbone)
    full.__dict__.update(tiny_backbone.__dict__)
    full.trim_text = False
    a = EMScore(backbone=tiny_backbone, idf=CORPUS).score(CAPTIONS, videos=[videos[1]] * 6, references=REFS)
    b = EMScore(backbone=full, idf=CORPUS).score(CAPTIONS, videos=[videos[1]] * 6, references=REFS)
    assert_scores_close(a, b, atol=1e-5)


def test_multi_reference_takes_each_component_max(em):
    refs = REFS[3]
    multi = em.score([CAPTIONS[3]], references=[refs])
    singles = [em.score([CAPTIONS[3]], references=[[r]]).reference for r in refs]
    for name in ("coarse", "fine_p", "fine_r", "fine_f"):
        expected = max(getattr(s, name).item() for s in singles)
        assert getattr(multi.reference, name).item() == pytest.approx(expected, abs=1e-6)
    assert multi.video is None and multi.combined is None
    assert multi.score.item() == pytest.approx(multi.reference.full_f.item())


def test_combined_is_the_average_of_video_and_reference_parts(em, videos):
    both = em.score(CAPTIONS[:3], videos=videos, references=REFS[:3])
    v = em.score(CAPTIONS[:3], videos=videos).video
    r = em.score(CAPTIONS[:3], references=REFS[:3]).reference
    for name, t in v.as_dict().items():
        assert torch.allclose(getattr(both.video, name), t, atol=1e-6)
    for name, t in r.as_dict().items():
        assert torch.allclose(getattr(both.reference, name), t, atol=1e-6)
    for name in ("coarse", "fine_p", "fine_r", "fine_f"):
        assert torch.allclose(getattr(both.combined, name), (getattr(v, name) + getattr(r, name)) / 2, atol=1e-6)
    assert torch.allclose(both.score, (both.combined.fine_f + both.combined.coarse) / 2, atol=1e-6)


def test_video_precision_uses_idf_and_recall_is_a_plain_mean_over_frames(em, tiny_backbone, videos):
    res = em.score([CAPTIONS[0]], videos=[videos[0]])
    align = res.alignment[0]
    table = idf_from_rows(tiny_backbone.context_rows(CORPUS), tiny_backbone.eot_id)
    weights = [table.weights.get(t, table.default) for t in align.token_ids]
    assert align.weight == pytest.approx(weights)
    p = sum(w * s for w, s in zip(weights, align.similarity)) / sum(weights)
    assert res.video.fine_p.item() == pytest.approx(p, abs=1e-5)
    # recall: mean over the 10 frames of the best token similarity, from the raw embeddings
    text = tiny_backbone.tokenize([CAPTIONS[0]])
    tokens = tiny_backbone.encode_text(text.ids, text.lengths).tokens[0]
    frames = tiny_backbone.visual_embeddings([videos[0]])[0]
    r = (frames @ tokens.T).max(dim=1).values.mean().item()
    assert res.video.fine_r.item() == pytest.approx(r, abs=1e-5)


def test_batch_idf_is_explicit_and_depends_on_the_batch(tiny_backbone):
    with pytest.raises(ValueError, match="batch"):
        EMScore(backbone=tiny_backbone, idf=True)
    em_batch = EMScore(backbone=tiny_backbone, idf="batch")
    em_fixed = EMScore(backbone=tiny_backbone, idf=[r for r in REFS[0]])
    a = em_batch.score([CAPTIONS[0]], references=[REFS[0]])
    b = em_fixed.score([CAPTIONS[0]], references=[REFS[0]])
    assert torch.allclose(a.reference.fine_f, b.reference.fine_f, atol=1e-6)  # corpus == the batch's references
    c = em_batch.score([CAPTIONS[0], CAPTIONS[1]], references=[REFS[0], REFS[1]])
    assert abs(c.reference.fine_f[0].item() - a.reference.fine_f[0].item()) > 1e-6


def test_idf_dict_is_used_as_given(tiny_backbone, videos):
    ids = tiny_backbone.token_ids(CAPTIONS[1])[0]
    table = {t: float(k + 1) for k, t in enumerate(ids[:-1])}  # EOS missing -> default
    res = EMScore(backbone=tiny_backbone, idf=table, idf_default=0.5).score([CAPTIONS[1]], videos=[videos[0]])
    assert res.alignment[0].weight == pytest.approx([float(k + 1) for k in range(len(ids) - 1)] + [0.5])


def test_long_captions_are_truncated_keeping_eos_and_reported(em, videos, caplog):
    long = " ".join(["word"] * 120)
    cut = EMScore(backbone=em.backbone, long_captions="truncate")
    res = cut.score([long, CAPTIONS[0]], videos=[videos[0]] * 2)
    assert res.truncated == [True, False]
    assert len(res.alignment[0].tokens) == 77 and res.alignment[0].tokens[-1] == "<eos>"
    assert "truncated" in caplog.text
    assert torch.isfinite(res.score).all()


def test_bad_inputs_name_the_item(em, videos, tmp_path):
    with pytest.raises(ValueError, match=r"candidates\[1\] is an empty caption"):
        em.score(["a dog", "  "], videos=videos[:2])
    with pytest.raises(ValueError, match="2 videos for 3 candidates"):
        em.score(CAPTIONS[:3], videos=videos[:2])
    with pytest.raises(MediaError, match="item 1.*does not exist"):
        em.score(CAPTIONS[:2], videos=[videos[0], tmp_path / "gone.mp4"])
    with pytest.raises(ValueError, match=r"references\[0\] is empty"):
        em.score(CAPTIONS[:1], references=[[]])
    with pytest.raises(ValueError, match="needs videos"):
        em.score(CAPTIONS[:1])


def test_images_are_one_frame_videos(em, videos):
    frame = videos[0][3]
    a = em.score(CAPTIONS[:2], images=[frame, frame])
    b = em.score(CAPTIONS[:2], videos=[frame[None], frame[None]])
    assert_scores_close(a, b, atol=1e-6)
    assert a.alignment[0].best_frame == [0] * len(a.alignment[0].tokens)


def one_hot_probs(backbone, captions):
    batch = backbone.tokenize(captions)
    probs = torch.zeros(len(captions), batch.ids.shape[1], backbone.vocab_size)
    probs.scatter_(2, batch.ids[..., None], 1.0)
    return probs, batch.lengths


def test_soft_one_hot_captions_equal_hard_scores(em, videos):
    probs, lengths = one_hot_probs(em.backbone, CAPTIONS[:3])
    soft = em.score_soft(probs, lengths, videos=videos, references=REFS[:3])
    hard = em.score(CAPTIONS[:3], videos=videos, references=REFS[:3])
    for part in ("video", "reference", "combined"):
        for name, t in getattr(hard, part).as_dict().items():
            assert torch.allclose(getattr(soft, part).as_dict()[name], t, atol=1e-5), (part, name)


def test_soft_caption_gradient_matches_finite_differences(em, videos):
    probs, lengths = one_hot_probs(em.backbone, CAPTIONS[:2])
    gen = torch.Generator().manual_seed(0)
    # interior point: mix the one-hot rows with a few random alternatives so every entry is free to move
    noise = torch.zeros_like(probs)
    alt = torch.randint(0, 49000, (2, probs.shape[1], 4), generator=gen)
    noise.scatter_(2, alt, 0.25)
    base = (0.7 * probs + 0.3 * noise).requires_grad_(True)

    def objective(p):
        return em.score_soft(p, lengths, videos=videos[:2], references=REFS[:2]).score.sum()

    value = objective(base)
    value.backward()
    assert base.grad is not None and base.grad.abs().sum() > 0
    direction = torch.zeros_like(probs)
    direction.scatter_(2, alt, torch.randn(2, probs.shape[1], 4, generator=gen))
    direction = direction / direction.norm()
    eps = 1e-3
    with torch.no_grad():
        numeric = (objective(base + eps * direction) - objective(base - eps * direction)) / (2 * eps)
    analytic = (base.grad * direction).sum()
    assert abs(numeric.item()) > 1e-3  # the direction really moves the score
    assert analytic.item() == pytest.approx(numeric.item(), rel=5e-2, abs=1e-4)


# ------------------------------------------------ text cache, dedup, packed passes: scores never move
DUPLICATED = [CAPTIONS[0], CAPTIONS[1], CAPTIONS[0], CAPTIONS[3], CAPTIONS[0], CAPTIONS[1]]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_caption_alone_scores_as_in_any_batch_with_cold_caches(tiny_backbone, videos, data):
    pool = sample_pool(videos)
    idx = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=2, max_size=10))
    batch_size = data.draw(st.sampled_from([1, 3, 256]))
    caps, vids, refs = ([pool[i][k] for i in idx] for k in range(3))
    scorer = EMScore(backbone=tiny_backbone, idf=CORPUS, batch_size=batch_size)
    tiny_backbone.text_cache.clear()
    batched = scorer.score(caps, videos=vids, references=refs)
    for j in range(len(idx)):
        tiny_backbone.text_cache.clear()
        single = scorer.score([caps[j]], videos=[vids[j]], references=[refs[j]])
        for part in ("video", "reference", "combined"):
            for name, t in getattr(single, part).as_dict().items():
                assert getattr(batched, part).as_dict()[name][j].item() == pytest.approx(t.item(), abs=1e-5)


def test_dedup_on_and_off_give_the_same_embeddings_and_scores(videos):
    from capreward.backbones import CLIPBackbone
    from capreward.backbones.clip import embed_captions
    from capreward.testing import tiny_clip_factory

    bb = CLIPBackbone(tiny_clip_factory(seed=0), text_cache_size=0)
    passes = []
    original = bb._text_tower_packed
    bb._text_tower_packed = lambda rows: passes.append(len(rows)) or original(rows)
    on = embed_captions(bb, DUPLICATED, dedup=True)
    assert passes == [3]  # three distinct captions, one pass
    off = embed_captions(bb, DUPLICATED, dedup=False)
    assert passes == [3, 6]
    for a, b in zip(on.tokens, off.tokens):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(on.pooled, off.pooled, atol=1e-6)
    em = EMScore(backbone=bb, idf=CORPUS)
    together = em.score(DUPLICATED, videos=[videos[0]] * 6)
    for j, caption in enumerate(DUPLICATED):
        alone = em.score([caption], videos=[videos[0]])
        assert together.score[j].item() == pytest.approx(alone.score.item(), abs=1e-6)


def test_text_cache_warm_equals_cold_and_skips_the_encoder(videos):
    from capreward.backbones import CLIPBackbone
    from capreward.testing import tiny_clip_factory

    bb = CLIPBackbone(tiny_clip_factory(seed=0))
    em = EMScore(backbone=bb, idf=CORPUS)
    encoded = []
    original = bb._text_tower_packed
    bb._text_tower_packed = lambda rows: encoded.extend(rows) or original(rows)
    cold = em.score(CAPTIONS, videos=[videos[0]] * 6, references=REFS)
    assert len(encoded) == len(CAPTIONS) + sum(len(r) for r in REFS)
    assert all(key[0] == bb.model_key for key in bb.text_cache._data)
    warm = em.score(CAPTIONS, videos=[videos[0]] * 6, references=REFS)
    assert len(encoded) == len(CAPTIONS) + sum(len(r) for r in REFS)  # nothing re-encoded
    assert_scores_close(cold, warm, atol=0)
    em.score(["a brand new caption"], references=[REFS[0]])
    assert len(encoded) == len(CAPTIONS) + sum(len(r) for r in REFS) + 1  # only the new candidate


def test_text_cache_is_bounded_in_bytes():
    from capreward.backbones import CLIPBackbone
    from capreward.testing import tiny_clip_factory

    bb = CLIPBackbone(tiny_clip_factory(seed=0), text_cache_bytes=20_000)
    EMScore(backbone=bb).score(CAPTIONS * 3 + [c + " again" for c in CAPTIONS], references=[["a ref"]] * 24)
    assert 0 < bb.text_cache.bytes <= 20_000 and len(bb.text_cache) < 13


def test_packed_text_tower_equals_the_padded_and_full_context_towers(tiny_backbone):
    rows = [tuple(tiny_backbone.token_ids(c)[0]) for c in CAPTIONS + ["a " * 90]]
    assert tiny_backbone._packable()
    with torch.no_grad():
        packed = tiny_backbone._text_tower_packed(rows)
        padded = tiny_backbone._encode_padded(rows)
        ids = torch.zeros(len(rows), tiny_backbone.context_length, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        full = tiny_backbone.encode_text(ids, torch.tensor([len(r) for r in rows]))
    for i, ((pt, pp), (qt, qp)) in enumerate(zip(packed, padded)):
        assert pt.shape == (len(rows[i]), full.tokens.shape[-1])
        assert torch.allclose(pt, qt, atol=1e-6) and torch.allclose(pp, qp, atol=1e-6)
        assert torch.allclose(pt, full.tokens[i, : len(rows[i])], atol=1e-6)
        assert torch.allclose(pp, full.pooled[i], atol=1e-6)


def test_alignment_is_built_only_when_read(tiny_backbone, videos):
    em = EMScore(backbone=tiny_backbone, idf=CORPUS)
    decoded = []
    original = tiny_backbone.decode_token
    tiny_backbone.decode_token = lambda t: decoded.append(t) or original(t)
    try:
        res = em.score(CAPTIONS, videos=[videos[0]] * 6)
        assert decoded == [] and len(res.alignment) == 6
        last = res.alignment[-1]
        assert decoded and last.tokens[-1] == "<eos>" and last.tokens == res.alignment[5].tokens
        assert [a.token_ids for a in res.alignment[:2]] == [res.alignment[0].token_ids, res.alignment[1].token_ids]
        with pytest.raises(IndexError):
            res.alignment[6]
    finally:
        del tiny_backbone.decode_token


def test_a_released_idf_defaultdict_gives_unseen_tokens_its_default(tiny_backbone, videos):
    from collections import defaultdict

    # the released get_idf_dict: df over the set of ids of each padded row, unseen ids ln(N+1), EOS = mean
    rows = tiny_backbone.context_rows(CORPUS)
    n = len(rows)
    df: dict[int, int] = {}
    for row in rows:
        for t in set(row):
            df[t] = df.get(t, 0) + 1
    released = defaultdict(lambda: math.log(n + 1))
    released.update({t: math.log((n + 1) / (c + 1)) for t, c in df.items()})
    released[max(released)] = sum(released.values()) / len(released)
    unseen = "zebras juggle xylophones"
    from_dict = EMScore(backbone=tiny_backbone, idf=released).score([unseen], videos=[videos[0]])
    from_corpus = EMScore(backbone=tiny_backbone, idf=CORPUS).score([unseen], videos=[videos[0]])
    weights = from_dict.alignment[0].weight
    assert math.log(n + 1) in [pytest.approx(w) for w in weights]
    assert weights == pytest.approx(from_corpus.alignment[0].weight)
    assert_scores_close(from_dict, from_corpus, atol=1e-6)


def test_bf16_on_cpu_runs_the_towers_in_bf16_and_stays_close_to_fp32(videos):
    from capreward.testing import tiny_clip_factory

    fp32 = EMScore(model=tiny_clip_factory(0), idf=CORPUS)
    bf16 = EMScore(model=tiny_clip_factory(0), idf=CORPUS, precision="bf16")
    assert bf16.backbone.model.token_embedding.weight.dtype == torch.bfloat16
    a = fp32.score(CAPTIONS, videos=[videos[0]] * 6, references=REFS)
    b = bf16.score(CAPTIONS, videos=[videos[0]] * 6, references=REFS)
    assert b.score.dtype == torch.float32 and torch.isfinite(b.score).all()
    assert (a.score - b.score).abs().max() < 2e-2


def test_open_clip_mixed_bf16_runs_the_image_tower_on_its_layers_dtype(videos):
    # open_clip's precision="bf16" keeps the class and position embeddings in fp32 and the layers in bf16:
    # the pixels must take the patch embedding's dtype, not the first parameter's
    torch.manual_seed(0)
    fp32 = EMScore(model="ViT-S-32/random", idf=CORPUS)
    torch.manual_seed(0)
    bf16 = EMScore(model="ViT-S-32/random", idf=CORPUS, precision="bf16")
    visual = bf16.backbone.model.visual
    assert visual.class_embedding.dtype == torch.float32 and visual.conv1.weight.dtype == torch.bfloat16
    a = fp32.score(CAPTIONS[:2], videos=[videos[0]] * 2, references=REFS[:2])
    b = bf16.score(CAPTIONS[:2], videos=[videos[0]] * 2, references=REFS[:2])
    assert torch.isfinite(b.score).all()
    assert (a.score - b.score).abs().max() < 3e-2
    assert (a.video.coarse - b.video.coarse).abs().max() < 3e-2
