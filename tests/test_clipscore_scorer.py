"""CLIP-S / RefCLIP-S / PAC-S on the tiny CLIP, checked against open_clip's own encoders."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capreward import CLIPScore, PACScore
from capreward.testing import build_tiny_clip

from conftest import TEST_DEVICE, random_video

# the library runs on CAPREWARD_TEST_DEVICE (tiny_backbone is built there); open_clip's reference on the CPU
pytestmark = pytest.mark.device_parity

CAPTIONS = ["a dog on a beach", "a red car", "two people talking", "a bowl of fruit on a table", "a cat", "snow"]


@pytest.fixture(scope="module")
def images():
    return [random_video(s, frames=1, height=48, width=64)[0] for s in range(len(CAPTIONS))]


def open_clip_cosines(captions, images, prefix="A photo depicts "):
    """cos(image, prefix + caption) straight from open_clip's encode_image/encode_text (77-token rows)."""
    model = build_tiny_clip(0)
    preprocess = open_clip.image_transform(model.visual.image_size, is_train=False)
    tokenizer = open_clip.tokenizer.SimpleTokenizer()
    with torch.no_grad():
        img = F.normalize(model.encode_image(torch.stack([preprocess(Image.fromarray(i)) for i in images])), dim=-1)
        txt = F.normalize(model.encode_text(tokenizer([prefix + c for c in captions])), dim=-1)
    return img, txt


def test_clip_s_matches_open_clip_encoders(tiny_backbone, images):
    img, txt = open_clip_cosines(CAPTIONS, images)
    cos = (img * txt).sum(-1)
    assert (cos > 0).any() and (cos < 0).any()  # both branches of the clip at 0 are exercised
    res = CLIPScore(backbone=tiny_backbone).score(CAPTIONS, images=images)
    assert torch.allclose(res.clip_s.cpu(), 2.5 * cos.clamp_min(0), atol=1e-5)
    assert res.ref_clip_s is None and torch.equal(res.score, res.clip_s)


def test_ref_clip_s_is_the_harmonic_mean_with_the_best_reference(tiny_backbone, images):
    refs = [["a dog", "a puppy on sand"], ["a car"], ["people chat", "a conversation", "two men"], ["fruit"], ["a kitten"], ["winter"]]
    res = CLIPScore(backbone=tiny_backbone).score(CAPTIONS, images=images, references=refs)
    _, txt = open_clip_cosines(CAPTIONS, images)
    for i, rs in enumerate(refs):
        _, ref_txt = open_clip_cosines(rs, images[: len(rs)])
        best = (ref_txt @ txt[i]).max().item()
        assert res.ref_similarity[i].item() == pytest.approx(best, abs=1e-5)
        c = res.clip_s[i].item()
        expected = 0.0 if c + best == 0 else 2 * c * best / (c + best)
        assert res.ref_clip_s[i].item() == pytest.approx(expected, abs=1e-5)


def test_pac_s_uses_w_2(tiny_clip_path, images):
    clip = CLIPScore(model=tiny_clip_path, device=TEST_DEVICE).score(CAPTIONS, images=images)
    pac = PACScore(model=tiny_clip_path, device=TEST_DEVICE).score(CAPTIONS, images=images)
    assert torch.allclose(pac.clip_s, clip.clip_s * 2.0 / 2.5, atol=1e-6)


def test_video_clip_s_uses_the_mean_frame_embedding(tiny_backbone):
    clip = random_video(3, frames=12)
    res = CLIPScore(backbone=tiny_backbone, frames=4).score(["a scene"], videos=[clip])
    frames = tiny_backbone.visual_embeddings([clip], frames=4)[0]
    fv = F.normalize(frames.mean(0), dim=-1)
    text = tiny_backbone.tokenize(["A photo depicts a scene"])
    pooled = tiny_backbone.encode_text(text.ids, text.lengths).pooled[0]
    assert res.clip_s.item() == pytest.approx(2.5 * max(float(fv @ pooled), 0.0), abs=1e-6)


def test_scores_independent_of_batch_order(tiny_backbone, images):
    scorer = CLIPScore(backbone=tiny_backbone, batch_size=2)
    perm = np.random.default_rng(0).permutation(len(CAPTIONS))
    a = scorer.score(CAPTIONS, images=images).clip_s
    b = scorer.score([CAPTIONS[i] for i in perm], images=[images[i] for i in perm]).clip_s
    assert torch.allclose(a[perm], b, atol=1e-6)


def test_clip_s_argument_errors(tiny_backbone, images):
    scorer = CLIPScore(backbone=tiny_backbone)
    with pytest.raises(ValueError, match="exactly one of images or videos"):
        scorer.score(CAPTIONS[:1])
    with pytest.raises(ValueError, match="1 images for 2 candidates"):
        scorer.score(CAPTIONS[:2], images=images[:1])
