"""Every way of naming a CLIP: OpenAI-format state dicts, wrapped checkpoints, factories, and
clear errors when weights are missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from capreward.backbones import CLIPBackbone, ModelLoadError, load_clip
from capreward.testing import build_tiny_clip, openai_state_dict, tiny_clip_factory


def embeddings(backbone):
    batch = backbone.tokenize(["a dog runs", "a man cooks"])
    img = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return backbone.encode_text(batch.ids, batch.lengths).tokens, backbone.encode_pixels(img)


def test_openai_state_dict_file_infers_the_architecture(tiny_clip_path):
    from_file = CLIPBackbone(tiny_clip_path)
    from_factory = CLIPBackbone(tiny_clip_factory(0))
    assert from_file.model.visual.image_size == (32, 32) or from_file.model.visual.image_size == 32
    for a, b in zip(embeddings(from_file), embeddings(from_factory)):
        assert torch.allclose(a, b, atol=1e-6)


def test_pac_s_style_wrapped_checkpoint(tmp_path):
    sd = {"module." + k: v for k, v in openai_state_dict(build_tiny_clip(1)).items()}
    path = tmp_path / "clip_ViT-B-32.pth"
    torch.save({"state_dict": sd, "epoch": 3}, path)
    wrapped = CLIPBackbone(path)
    plain = CLIPBackbone(tiny_clip_factory(1))
    for a, b in zip(embeddings(wrapped), embeddings(plain)):
        assert torch.allclose(a, b, atol=1e-6)


def test_open_clip_checkpoint_with_architecture(tmp_path):
    # An open_clip training checkpoint of a registered architecture, loaded as 'ARCH/path'.
    import open_clip

    model = open_clip.create_model("RN50", pretrained=None)
    path = tmp_path / "epoch_1.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in model.state_dict().items()}}, path)
    loaded, preprocess, tokenizer = load_clip(f"RN50/{path}")
    assert torch.equal(loaded.state_dict()["text_projection"], model.state_dict()["text_projection"])


def test_missing_files_and_bare_names_explain_how_to_point_at_local_weights(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist.*local file"):
        load_clip(str(tmp_path / "ViT-B-32.pt"))
    with pytest.raises(ModelLoadError, match="without weights"):
        load_clip("ViT-B-32")
    not_clip = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2)}, not_clip)
    with pytest.raises(ModelLoadError, match="not an OpenAI-format CLIP"):
        load_clip(not_clip)


def test_pretrained_tag_offline_fails_with_a_hint(tmp_path):
    code = (
        "from capreward.backbones import load_clip, ModelLoadError\n"
        "try:\n    load_clip('ViT-B-32/openai')\nexcept ModelLoadError as e:\n    print('ERR', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERR" in out.stdout and "local file" in out.stdout, out.stdout + out.stderr


def test_factory_must_return_a_triple():
    with pytest.raises(ModelLoadError, match="factory"):
        load_clip(lambda: build_tiny_clip(0))


def test_fp16_on_cpu_is_refused():
    with pytest.raises(ValueError, match="fp16"):
        load_clip(tiny_clip_factory(0), device="cpu", precision="fp16")
