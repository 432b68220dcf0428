"""transformers CLIP-family backbones (CLIPModel, SiglipModel, Siglip2Model) on tiny random models built
offline: CLIP-S and EMScore through capreward equal an independent computation from the model's own
processor, ``get_image_features`` / ``get_text_features`` and text tower, to 1e-4; a directory and a
``(model, processor)`` pair load the same model; long captions are read in windows of its context."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capreward.backbones import CLIPBackbone
from capreward.backbones.hf_clip import TransformersBackbone, is_transformers_spec
from capreward.scorers.clipscore import CLIPS_PREFIX, CLIPScore
from capreward.scorers.emscore import EMScore
from capreward.testing.tiny_hf_clip import HF_FAMILIES, save_tiny_hf_clip, tiny_hf_clip

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

CAPTIONS = ["A red dog runs on the grass.", "a cat", "the image of a blue car, with a tree"]
ATOL = 1e-4


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [Image.fromarray((rng.random((30 + 7 * i, 40 + 3 * i, 3)) * 255).astype(np.uint8)) for i in range(n)]


def _features(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@pytest.fixture(scope="module", params=HF_FAMILIES)
def pair(request):
    return request.param, tiny_hf_clip(request.param)


def _independent_text(model, processor, family, texts):
    """Token embeddings (per caption, its real positions) and caption embeddings straight from the
    processor and the model's own modules."""
    context = model.config.text_config.max_position_embeddings
    inputs = processor(text=texts, padding="max_length", max_length=context, return_tensors="pt")
    real = processor.tokenizer(texts, padding="max_length", max_length=context, return_attention_mask=True,
                               return_tensors="pt")["attention_mask"].bool()
    with torch.no_grad():
        pooled = F.normalize(_features(model.get_text_features(**inputs)), dim=-1)
        hidden = model.text_model(**inputs).last_hidden_state
        proj = model.text_projection if family == "clip" else model.text_model.head
        tokens = F.normalize(proj(hidden), dim=-1)
    return [tokens[i][real[i]] for i in range(len(texts))], pooled


def _independent_images(model, processor, images):
    with torch.no_grad():
        return torch.cat([F.normalize(_features(model.get_image_features(**processor(images=[im], return_tensors="pt"))), dim=-1)
                          for im in images])


def test_the_pair_builds_a_transformers_backbone_with_the_models_context(pair):
    family, (model, processor) = pair
    backbone = CLIPBackbone((model, processor))
    assert isinstance(backbone, TransformersBackbone) and backbone.family == family
    assert backbone.context_length == (77 if family == "clip" else 64)
    assert backbone.causal == (family == "clip")


def test_clip_s_equals_get_image_and_text_features(pair):
    family, (model, processor) = pair
    images = _images(3)
    got = CLIPScore(model=(model, processor)).score(CAPTIONS, images=images)
    _, text = _independent_text(model, processor, family, [CLIPS_PREFIX + c for c in CAPTIONS])
    image = _independent_images(model, processor, images)
    expected = 2.5 * torch.clamp((text * image).sum(-1), min=0)
    assert torch.allclose(got.clip_s, expected, atol=ATOL), (got.clip_s, expected)
    assert got.windows == [1, 1, 1] and got.truncated == [False] * 3


def test_emscore_equals_the_models_own_token_and_pooled_embeddings(pair):
    family, (model, processor) = pair
    images = _images(3)
    got = EMScore(model=(model, processor)).score(CAPTIONS, images=images)
    tokens, pooled = _independent_text(model, processor, family, CAPTIONS)
    image = _independent_images(model, processor, images)
    for i in range(len(CAPTIONS)):
        sims = tokens[i] @ image[i]
        p, r, coarse = sims.mean().item(), sims.max().item(), float(pooled[i] @ image[i])
        assert got.video.coarse[i].item() == pytest.approx(coarse, abs=ATOL)
        assert got.video.fine_p[i].item() == pytest.approx(p, abs=ATOL)
        assert got.video.fine_r[i].item() == pytest.approx(r, abs=ATOL)
        assert len(got.alignment[i].tokens) == tokens[i].shape[0]
    # EMScore_ref: the references' embeddings come from the same path
    ref = EMScore(model=(model, processor)).score(CAPTIONS[:1], references=[[CAPTIONS[2]]])
    assert ref.reference.coarse.item() == pytest.approx(float(pooled[0] @ pooled[2]), abs=ATOL)


def test_a_directory_and_the_transformers_prefix_load_the_same_model(pair, tmp_path):
    family, (model, processor) = pair
    folder = save_tiny_hf_clip(tmp_path / family, family)
    assert is_transformers_spec(str(folder)) and is_transformers_spec(f"transformers:{folder}")
    assert not is_transformers_spec("ViT-B-32/openai")
    images = _images(2)
    a = CLIPScore(model=(model, processor)).score(CAPTIONS[:2], images=images).clip_s
    b = CLIPScore(model=str(folder)).score(CAPTIONS[:2], images=images).clip_s
    c = CLIPScore(model=f"transformers:{folder}").score(CAPTIONS[:2], images=images).clip_s
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(a, c, atol=1e-6)


def test_long_captions_are_read_in_windows_of_the_models_context(pair):
    family, (model, processor) = pair
    backbone = CLIPBackbone((model, processor))
    long = " ".join(["a red dog runs on the grass."] * 20)
    assert len(backbone.full_ids(CLIPS_PREFIX + long)) > backbone.context_length
    windows = backbone.caption_windows(long, CLIPS_PREFIX)
    assert len(windows) > 1 and all(len(backbone.full_ids(CLIPS_PREFIX + w)) <= backbone.context_length for w in windows)
    image = _images(1)
    whole = CLIPScore(backbone=backbone).score([long], images=image)
    cut = CLIPScore(backbone=backbone, long_captions="truncate").score([long], images=image)
    assert whole.windows == [len(windows)] and cut.truncated == [True]
    # the windowed caption embedding is the length-weighted mean of the windows' get_text_features
    _, text = _independent_text(model, processor, family, [CLIPS_PREFIX + w for w in windows])
    prefix = len(backbone.full_ids(CLIPS_PREFIX))
    weights = torch.tensor([len(backbone.full_ids(CLIPS_PREFIX + w)) - prefix for w in windows], dtype=torch.float32)
    mixed = F.normalize((text * weights[:, None]).sum(0), dim=-1)
    expected = 2.5 * max(float(mixed @ _independent_images(model, processor, image)[0]), 0.0)
    assert whole.clip_s.item() == pytest.approx(expected, abs=ATOL)


def test_caption_text_never_becomes_a_special_token():
    model, processor = tiny_hf_clip("clip")
    backbone = CLIPBackbone((model, processor))
    ids = backbone.full_ids("a dog <|endoftext|> a cat")
    assert ids.count(backbone.eot_id) == 1 and ids[-1] == backbone.eot_id


def test_an_unknown_family_is_refused_by_name():
    from transformers import BertConfig, BertModel

    from capreward.backbones import ModelLoadError

    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not a CLIP family"):
        CLIPBackbone((bert, tiny_hf_clip("clip")[1]))


def test_a_hub_name_is_read_from_the_local_cache_and_a_missing_one_fails_at_once(monkeypatch, tmp_path):
    from capreward.backbones import ModelLoadError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never a download in tests
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match="not in the local cache"):
        CLIPBackbone("transformers:nobody/no-such-clip")


def test_the_command_line_scores_with_a_transformers_directory(tmp_path):
    import json
    import subprocess
    import sys

    from capreward.jobs.results_file import read_results

    folder = save_tiny_hf_clip(tmp_path / "siglip", "siglip")
    image = tmp_path / "img.png"
    _images(1)[0].save(image)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "caption": CAPTIONS[0], "image": str(image)}) + "\n")
    out = tmp_path / "scores.jsonl"
    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out", str(out),
                           "--metrics", "clip-s", "--clip-model", f"transformers:{folder}", "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    direct = CLIPScore(model=str(folder)).score(CAPTIONS[:1], images=[str(image)]).clip_s.item()
    assert read_results(out)[0]["clip_s"] == pytest.approx(direct, abs=1e-6)
