"""open_clip CustomTextCLIP towers (SigLIP: non-causal, last-position pooling, HFTokenizer; EVA-CLIP:
causal tower in model.text, SimpleTokenizer) and Long-CLIP checkpoints in their released layout, on
tiny random models built offline: CLIP-S and EMScore through capreward equal an independent computation
from the model's own encode_image / encode_text (and, for Long-CLIP, its released encode_text formula
written out from the checkpoint's tensors) to 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capreward.backbones import CLIPBackbone
from capreward.backbones.open_clip_text import CustomTextBackbone
from capreward.scorers.clipscore import CLIPS_PREFIX, CLIPScore
from capreward.scorers.emscore import EMScore
from capreward.testing.tiny_clip import save_tiny_long_clip, tiny_clip_factory
from capreward.testing.tiny_custom_clip import CUSTOM_KINDS, tiny_custom_clip_factory

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

CAPTIONS = ["A red dog runs on the grass.", "a cat", "the image of a blue car, with a tree"]
ATOL = 1e-4


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(11)
    return [Image.fromarray((rng.random((30 + 7 * i, 40 + 3 * i, 3)) * 255).astype(np.uint8)) for i in range(n)]


@pytest.fixture(scope="module", params=CUSTOM_KINDS)
def custom(request):
    model, preprocess, tokenizer = tiny_custom_clip_factory(request.param)()
    return request.param, model, preprocess, tokenizer


def _own_text(kind, model, tokenizer, texts):
    """(token embeddings at the caption's positions, caption embeddings) from the model's own tokenizer
    and text tower (``output_tokens`` gives the ln_final'd positions), projected and normalised."""
    ids = tokenizer(texts)
    if kind == "siglip":
        cleaned = [tokenizer.clean_fn(t) for t in texts]
        real = tokenizer.tokenizer(cleaned, padding="max_length", max_length=ids.shape[1], truncation=True,
                                   return_attention_mask=True, return_tensors="pt")["attention_mask"].bool()
    else:
        real = torch.zeros_like(ids, dtype=torch.bool)
        for i, row in enumerate(ids):
            real[i, : int(row.argmax()) + 1] = True  # SOS..EOS (EOT is the highest id)
    model.text.output_tokens = True
    try:
        with torch.no_grad():
            pooled, tokens = model.text(ids)
    finally:
        model.text.output_tokens = False
    proj = model.text.text_projection
    tokens = proj(tokens) if isinstance(proj, torch.nn.Linear) else tokens @ proj
    with torch.no_grad():
        encoded = F.normalize(model.encode_text(ids), dim=-1)
    assert torch.allclose(F.normalize(pooled, dim=-1), encoded, atol=1e-6)
    tokens = F.normalize(tokens.detach(), dim=-1)
    return [tokens[i][real[i]] for i in range(len(texts))], encoded


def _own_images(model, preprocess, images):
    with torch.no_grad():
        return F.normalize(model.encode_image(torch.stack([preprocess(im) for im in images])), dim=-1)


def test_custom_text_clip_becomes_a_custom_text_backbone(custom):
    kind, model, preprocess, tokenizer = custom
    backbone = CLIPBackbone(lambda: (model, preprocess, tokenizer))
    assert isinstance(backbone, CustomTextBackbone)
    assert (backbone.context_length, backbone.causal) == ((64, False) if kind == "siglip" else (77, True))
    assert type(CLIPBackbone(tiny_clip_factory())) is CLIPBackbone  # open_clip's CLIP is untouched


def test_clip_s_equals_encode_image_and_encode_text(custom):
    kind, model, preprocess, tokenizer = custom
    images = _images(3)
    got = CLIPScore(model=lambda: (model, preprocess, tokenizer)).score(CAPTIONS, images=images)
    _, text = _own_text(kind, model, tokenizer, [CLIPS_PREFIX + c for c in CAPTIONS])
    expected = 2.5 * torch.clamp((text * _own_images(model, preprocess, images)).sum(-1), min=0)
    assert torch.allclose(got.clip_s, expected, atol=ATOL), (got.clip_s, expected)


def test_emscore_equals_the_towers_own_token_and_pooled_embeddings(custom):
    kind, model, preprocess, tokenizer = custom
    images = _images(3)
    got = EMScore(model=lambda: (model, preprocess, tokenizer)).score(CAPTIONS, images=images)
    tokens, pooled = _own_text(kind, model, tokenizer, CAPTIONS)
    image = _own_images(model, preprocess, images)
    for i in range(len(CAPTIONS)):
        sims = tokens[i] @ image[i]
        assert got.video.coarse[i].item() == pytest.approx(float(pooled[i] @ image[i]), abs=ATOL)
        assert got.video.fine_p[i].item() == pytest.approx(sims.mean().item(), abs=ATOL)
        assert got.video.fine_r[i].item() == pytest.approx(sims.max().item(), abs=ATOL)


def test_custom_text_long_captions_are_read_in_windows(custom):
    kind, model, preprocess, tokenizer = custom
    backbone = CLIPBackbone(lambda: (model, preprocess, tokenizer))
    long = " ".join(["a red dog runs on the grass."] * 30)
    res = CLIPScore(backbone=backbone).score([long], images=_images(1))
    assert res.windows[0] > 1 and res.truncated == [False]
    assert all(len(backbone.full_ids(CLIPS_PREFIX + w)) <= backbone.context_length
               for w in backbone.caption_windows(long, CLIPS_PREFIX))


# ---------------------------------------------------------------------------------------- Long-CLIP
def _long_clip_text(state, tokenizer, texts):
    """Long-CLIP's released encode_text, written out from the checkpoint's tensors: token embeddings +
    positional_embedding * mask1 + positional_embedding_res * mask2, the causal transformer (run with
    open_clip's blocks loaded from the same tensors), ln_final, EOT position @ text_projection."""
    from open_clip.model import build_model_from_openai_state_dict

    plain = {k: v for k, v in state.items() if k not in ("positional_embedding_res", "mask1", "mask2")}
    model = build_model_from_openai_state_dict(dict(plain)).float().eval()
    positions = (state["positional_embedding"].float() * state["mask1"] + state["positional_embedding_res"].float() * state["mask2"])
    rows = [[tokenizer.sot_token_id, *tokenizer.encode(t), tokenizer.eot_token_id] for t in texts]
    ids = torch.zeros(len(rows), 248, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    with torch.no_grad():
        x = model.token_embedding(ids) + positions
        x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask))
        tokens = F.normalize(x @ model.text_projection, dim=-1)
        pooled = tokens[torch.arange(len(rows)), ids.argmax(-1)]
    return [tokens[i, : len(r)] for i, r in enumerate(rows)], pooled, model


def test_long_clip_released_layout_loads_with_248_positions(tmp_path):
    import open_clip

    path = save_tiny_long_clip(tmp_path / "longclip-tiny.pt")
    state = torch.load(path, weights_only=True)
    assert {"positional_embedding_res", "mask1", "mask2"} <= set(state)
    backbone = CLIPBackbone(str(path))
    assert type(backbone) is CLIPBackbone and backbone.context_length == 248
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=248)
    caption = " ".join(["a red dog runs on the grass, and a cat sleeps."] * 12)  # about 150 tokens
    assert 77 < len(backbone.full_ids(caption)) <= 248
    images = _images(2)
    tokens, pooled, model = _long_clip_text(state, tokenizer, [caption, CAPTIONS[0]])
    preprocess = open_clip.image_transform(model.visual.image_size, is_train=False)
    image = _own_images(model, preprocess, images)
    em = EMScore(backbone=backbone).score([caption, CAPTIONS[0]], images=images)
    assert em.windows == [1, 1]  # within Long-CLIP's context: one window
    for i in range(2):
        sims = tokens[i] @ image[i]
        assert em.video.coarse[i].item() == pytest.approx(float(pooled[i] @ image[i]), abs=ATOL)
        assert em.video.fine_p[i].item() == pytest.approx(sims.mean().item(), abs=ATOL)
        assert em.video.fine_r[i].item() == pytest.approx(sims.max().item(), abs=ATOL)
    _, prefixed, _ = _long_clip_text(state, tokenizer, [CLIPS_PREFIX + caption])
    clip_s = CLIPScore(backbone=backbone).score([caption], images=images[:1]).clip_s
    assert clip_s.item() == pytest.approx(2.5 * max(float(prefixed[0] @ image[0]), 0.0), abs=ATOL)
    # past 248 tokens the caption is read in windows of 248
    longer = " ".join([caption] * 3)
    assert CLIPScore(backbone=backbone).score([longer], images=images[:1]).windows[0] > 1
